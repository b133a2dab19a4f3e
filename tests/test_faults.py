"""Faults injected into real runs: prep killed, interrupted or out of disk; files changing under
readers; dying workers; workers under few descriptors, and pinning that fails.

The prep step runs in subprocesses through tests/prep_harness.py, which replaces one function of
prepare_tokens with a wrapper that kills the process at an exact point (prepare_tokens has no test
hooks). Reader scenarios that could crash run through tests/reader_harness.py. Every subprocess has
a timeout. Each test here is named by at least one entry of the table in test_catalogue.py.
"""

from __future__ import annotations

import errno
import gc
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
import psutil
import pytest
from torch.utils.data import DataLoader

import npy_datasets as nd
import prep_outputs
import prep_tokenize
from conftest import ROOT, WORKER_TIMEOUT, write_tokens

HERE = Path(__file__).resolve().parent
DOCS = [f"Story {i}: " + "The dog ran to the park. " * (i % 6) + f"The end {i}." for i in range(60)]
CHUNK_DOCS = (
    4  # 60 train documents: 15 chunks (calls 1..15), 9 validation documents: 3 more (16..18)
)
TIMEOUT = 120  # seconds for any subprocess


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A small dataset: train.jsonl (60 documents) and validation.jsonl (9), columns text and story."""
    folder = tmp_path_factory.mktemp("input")
    for split, texts in (("train", DOCS), ("validation", DOCS[:9])):
        rows = "".join(json.dumps({"text": t, "story": t.upper()}) + "\n" for t in texts)
        (folder / f"{split}.jsonl").write_text(rows, encoding="utf-8")
    return folder


def prepare(pt, data, out, **kwargs):
    """prepare_tokens.prepare with the settings the subprocesses use on the command line."""
    return {
        r.split: r
        for r in pt.prepare(
            str(data), out, chunk_docs=CHUNK_DOCS, num_threads=1, progress=False, **kwargs
        )
    }


def cli_args(data, out=None, *extra) -> list[str]:
    where = ["--out", str(out)] if out is not None else []
    return [
        "--dataset",
        str(data),
        *where,
        "--chunk-docs",
        str(CHUNK_DOCS),
        "--num-threads",
        "1",
        *extra,
    ]


@pytest.fixture(scope="module")
def reference(pt, data, tmp_path_factory) -> dict[str, bytes]:
    """The files of one uninterrupted run: every rerun after a fault must reproduce them byte for byte."""
    out = tmp_path_factory.mktemp("reference")
    prepare(pt, data, out)
    return finals(out)


def finals(folder: Path) -> dict[str, bytes]:
    """Files at final paths (not temp files, nor the folder's lock file), by name."""
    return {
        p.name: p.read_bytes()
        for p in sorted(folder.iterdir())
        if ".tmp." not in p.name and p.name != prep_outputs.LOCK_NAME
    }


def temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp." in p.name)


def start(args: list[str], tmp_path: Path, tag: str) -> subprocess.Popen:
    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / f"hf_{tag}"), HF_HUB_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"subprocess hung:\n{err[-2000:]}")
    return proc.returncode, out, err


def harness(*args: str) -> list[str]:
    return [str(HERE / "prep_harness.py"), *args]


def assert_nothing_half_done(folder: Path, allowed: list[dict[str, bytes]]) -> None:
    """No file at a final path looks finished unless it is: a token file with a sidecar passes
    open_tokens(verify=True) and equals one of the allowed runs' files; one without a sidecar is
    refused by verify=True (prep rebuilds it); no sidecar is left without its token file."""
    for name, raw in finals(folder).items():
        path = folder / name
        if name.endswith(".json"):
            assert (folder / name[: -len(".json")]).is_file(), (
                f"sidecar {name} without its token file"
            )
            continue
        if nd.sidecar_path(path).exists():
            nd.open_tokens(path, verify=True)
            side = nd.sidecar_path(path).name
            pair = (raw, (folder / side).read_bytes())
            assert any(pair == (run.get(name), run.get(side)) for run in allowed), (
                f"{name}: finished but unknown bytes"
            )
        else:
            with pytest.raises(nd.TokenFileError) as info:
                nd.open_tokens(path, verify=True)
            assert repr(str(path)) in str(info.value) and "sidecar" in str(info.value)


# =================================================================================================
# Prep: killed, interrupted, out of space, concurrent.

# Each split is written by write_tokens into a staging folder of the run's own, then swapped in:
# the old sidecar deleted, the token file renamed into the output folder, then its sidecar.
KILLS_FRESH = {  # kill point -> the final files that must exist right after the kill
    "chunk:1": set(),  # before any id is written
    "chunk:8": set(),  # seven chunks into train
    "replace:1": set(),  # train finished and fsynced in staging, not yet renamed there
    "sidecar:1": {"train.npy"},  # train swapped into place, its sidecar not yet
    "chunk:17": {"train.npy", "train.npy.json"},  # one chunk into validation
}
KILLS_REBUILD = [
    "chunk:5",
    "replace:1",
    "sidecar:1",
]  # over an earlier output made with other settings


def test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done(tmp_path, pt, data, reference):
    runs = {
        f"fresh {kill}": (kill, tmp_path / f"fresh_{kill.replace(':', '_')}")
        for kill in KILLS_FRESH
    }
    previous = {}
    for kill in KILLS_REBUILD:
        out = tmp_path / f"rebuild_{kill.replace(':', '_')}"
        prepare(pt, data, out, column="story")
        previous[out] = finals(out)
        runs[f"rebuild {kill}"] = (kill, out)
    specs = [f"{kill}={out}" for kill, out in runs.values()]
    code, stdout, err = finish(
        start(harness("--kill-each", *specs, "--", *cli_args(data)), tmp_path, "kills")
    )
    assert code == 0, err[-2000:]
    statuses = json.loads(stdout.splitlines()[-1])
    for name, (kill, out) in runs.items():
        assert statuses[f"{kill}={out}"] == -signal.SIGKILL, f"{name}: the run was not killed there"
        if name.startswith("fresh"):
            assert set(finals(out)) == KILLS_FRESH[kill], (name, sorted(finals(out)))
            assert_nothing_half_done(out, [reference])
            if kill.startswith("chunk"):
                assert temps(out), f"{name}: the kill should have caught a temp file being written"
        else:
            old = previous[out]
            assert_nothing_half_done(out, [reference, old])
            without_sidecar = {k: v for k, v in old.items() if k != "train.npy.json"}
            expected = {
                "chunk:5": old,  # nothing renamed yet: untouched
                "replace:1": old,  # still in staging: the old files and sidecar untouched
                "sidecar:1": {
                    **without_sidecar,
                    "train.npy": reference["train.npy"],
                },  # new ids, no sidecar yet
            }[kill]
            assert finals(out) == expected, f"{name}: the output is not what a kill there leaves"
        prepare(pt, data, out)  # the rerun: leftovers cleaned, unfinished files rebuilt
        assert finals(out) == reference, f"{name}: the rerun differs from an uninterrupted run"
        assert temps(out) == []


def interrupt_at_chunk(k: int):
    """A DocumentCount.passing that raises KeyboardInterrupt as the k-th chunk (from 1) goes to
    write_tokens, as Ctrl-C there would."""
    real = prep_outputs.DocumentCount.passing
    chunks = itertools.count(1)

    def passing(self, pieces):
        for ids in real(self, pieces):
            if next(chunks) == k:
                raise KeyboardInterrupt
            yield ids

    return passing


def test_ctrl_c_at_chunk_k_removes_the_temp_and_keeps_the_old_output(
    tmp_path, pt, data, reference, monkeypatch, capsys
):
    for k in (1, 6, 15, 17):  # first chunk, mid train, train's last chunk, mid validation
        out = tmp_path / f"k{k}"
        prepare(pt, data, out, column="story")
        old = finals(out)
        with monkeypatch.context() as patch:
            patch.setattr(prep_outputs.DocumentCount, "passing", interrupt_at_chunk(k))
            with pytest.raises(KeyboardInterrupt):
                prepare(pt, data, out)
        assert temps(out) == [], f"k={k}: a temp file or staging folder was left"
        now = finals(out)
        if k <= 15:
            assert now == old
        else:  # train was finished before the interrupt: new and complete; validation untouched
            assert now == {
                **old,
                "train.npy": reference["train.npy"],
                "train.npy.json": reference["train.npy.json"],
            }
        assert_nothing_half_done(out, [reference, old])
        prepare(pt, data, out)
        assert finals(out) == reference
    monkeypatch.setattr(prep_outputs.DocumentCount, "passing", interrupt_at_chunk(3))
    # the command line: exit 130, a one-line message
    assert pt.main(cli_args(data, tmp_path / "cli")) == 130
    err = capsys.readouterr().err
    assert "interrupted: unfinished files removed, earlier outputs untouched" in err
    assert finals(tmp_path / "cli") == {} and temps(tmp_path / "cli") == []


def test_file_size_limit_fails_clearly_and_keeps_the_old_output(tmp_path, pt, data, reference):
    out = tmp_path / "out"
    prepare(pt, data, out)
    assert len(reference["train.npy"]) > 600
    code, _, err = finish(
        start(
            harness("--file-size-limit", "600", "--", *cli_args(data, out, "--force")),
            tmp_path,
            "fsize",
        )
    )
    error = f"prepare_tokens.py: error: [Errno {errno.EFBIG}] {os.strerror(errno.EFBIG)}"
    line = next((line for line in err.splitlines() if line.startswith(error)), None)
    assert code == 1 and line, err[-2000:]
    assert f"{out / 'train.npy'}" in line and ".prepare_tokens" not in line  # not its staging copy
    assert line == f"{error} while writing: {str(out / 'train.npy')!r}", line  # said once
    assert "Traceback" not in err
    # untouched, and the partial temp file and the staging folder removed
    assert finals(out) == reference and temps(out) == []


def test_two_runs_on_one_output_leave_one_valid_output(tmp_path, pt, data, reference):
    out = tmp_path / "out"
    prepare(pt, data, out, column="story")  # both runs replace an earlier output
    code, stdout, err = finish(
        start(harness("--concurrent", "2", "--", *cli_args(data, out)), tmp_path, "two")
    )
    assert code == 0 and json.loads(stdout.splitlines()[-1]) == [0, 0], err[-2000:]
    assert stdout.count("(written)") + stdout.count("(up to date)") == 4
    assert finals(out) == reference and temps(out) == []
    for split in ("train", "validation"):
        nd.open_tokens(out / f"{split}.npy", verify=True)


def test_a_sidecar_deleted_by_another_run_in_between_is_not_an_error(tmp_path):
    path = tmp_path / "train.npy"
    write_tokens(path, np.arange(10, dtype=np.uint16))
    side = nd.sidecar_path(path)

    def chunks():  # another run deletes the old sidecar while this one writes
        yield np.arange(10)
        side.unlink()
        yield np.arange(10, 20)

    # write_tokens deletes the old sidecar just before its rename: gone already is no error
    nd.write_tokens(path, chunks(), n_vocab=100, tokenizer="test:arange", eot_id=0)
    assert nd.open_tokens(path, verify=True).tolist() == list(range(20))  # the new sidecar
    assert temps(tmp_path) == []


@pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="names open files through Linux's /proc"
)
def test_fsync_rename_fsync_order_with_temp_files_beside_the_target(
    tmp_path, pt, data, monkeypatch
):
    import tiktoken

    out = tmp_path / "out"
    prepare(
        pt, data, out, splits=["train"]
    )  # an earlier output: its sidecar must go before the new file lands
    split = pt.load_text_splits(str(data), splits=["train"])["train"]
    events = []
    real_fsync, real_replace, real_unlink = os.fsync, os.replace, os.unlink

    def fsync(fd):
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        real_fsync(fd)

    def replace(src, dst, **kwargs):
        events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
        real_replace(src, dst, **kwargs)

    def unlink(path, **kwargs):
        events.append(("unlink", os.path.realpath(path)))
        real_unlink(path, **kwargs)

    with monkeypatch.context() as patch:
        for name, fake in (("fsync", fsync), ("replace", replace), ("unlink", unlink)):
            patch.setattr(os, name, fake)
        pt.prepare_split(
            split,
            out,
            tiktoken.get_encoding("gpt2"),
            force=True,
            num_threads=1,
            chunk_docs=CHUNK_DOCS,
            progress=False,
        )
    folder = os.path.realpath(out)

    def tidy(value: str) -> str:  # temporary names carry a pid and random letters
        value = value.replace(folder, "out")
        value = re.sub(r"/\.prepare_tokens\.tmp\.\d+\.[0-9a-f]{8}\.train", "/<staging>", value)
        return re.sub(r"/\.(\S+?)\.tmp\.\d+\.[0-9a-f]{8}$", r"/<temp of \1>", value)

    # write_tokens writes into the run's staging folder inside out (renames never cross a
    # filesystem: no EXDEV), then publish swaps the files in: data durable before any rename,
    # the old sidecar's deletion durable before the new token file lands, sidecars last.
    assert [tuple(map(tidy, event)) for event in events] == [
        ("fsync", "out/<staging>/<temp of train.npy>"),  # the ids reach the disk first
        ("fsync", "out/<staging>/<temp of train.npy.json>"),  # then write_tokens' sidecar
        ("unlink", "out/<staging>/train.npy.json"),  # no old sidecar in staging: a no-op
        ("replace", "out/<staging>/<temp of train.npy>", "out/<staging>/train.npy"),
        ("replace", "out/<staging>/<temp of train.npy.json>", "out/<staging>/train.npy.json"),
        ("fsync", "out/<staging>"),  # the renames are durable
        ("unlink", "out/<staging>/<temp of train.npy>"),  # gone already: write_tokens' cleanup
        ("unlink", "out/<staging>/<temp of train.npy.json>"),
        ("fsync", "out/<staging>/train.npy.json"),  # the sidecar completed with the source
        ("unlink", "out/train.npy.json"),  # the swap: the old sidecar goes first
        ("fsync", "out"),  # and its deletion is durable: no stale pair after a power cut
        ("replace", "out/<staging>/train.npy", "out/train.npy"),  # within out: no EXDEV
        ("fsync", "out"),  # the token file is in place before its sidecar
        ("replace", "out/<staging>/train.npy.json", "out/train.npy.json"),
        ("fsync", "out"),
    ]


def test_a_failing_tokenizer_thread_stops_prep_with_its_error(tmp_path, pt, data, monkeypatch):
    real = prep_tokenize._encode_chunk
    calls = itertools.count(1)

    def crash_on_third(enc, texts, *placement):
        if next(calls) == 3:
            raise RuntimeError("tokenizer thread crashed on chunk 3")
        return real(enc, texts, *placement)

    monkeypatch.setattr(prep_tokenize, "_encode_chunk", crash_on_third)
    out = tmp_path / "out"
    outcome = {}

    def run():
        try:
            pt.prepare(str(data), out, chunk_docs=CHUNK_DOCS, num_threads=2, progress=False)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "prep hung after a tokenizer thread failed"
    error = outcome.get("error")
    assert isinstance(error, RuntimeError) and "crashed on chunk 3" in str(error)
    assert finals(out) == {} and temps(out) == []
    assert not [
        t.name for t in threading.enumerate() if t.name.startswith("tokenize")
    ]  # the pool was shut down


def test_a_zero_filled_file_without_sidecar_is_rebuilt(tmp_path, pt, data, reference):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.npy").write_bytes(
        reference["train.npy"][:128] + b"\0" * (len(reference["train.npy"]) - 128)
    )
    dead = out / ".prepare_tokens.tmp.999999999.deadbeef.train"  # a long-dead run's staging
    dead.mkdir()
    (dead / ".train.npy.tmp.999999999.0badc0de").write_bytes(b"\0" * 100)
    other = out / ".train.npy.tmp.999999999.deadbeef"  # write_tokens' own: maybe a live writer's
    other.write_bytes(b"\0" * 100)
    results = prepare(pt, data, out)
    assert results["train"].written  # right size and header, but no sidecar: never reused
    assert finals(out) == reference and temps(out) == [other.name]  # the staging folder went


# =================================================================================================
# Readers: the file changes under a running loader; workers fail, die or stall.


@pytest.fixture(scope="module")
def reader_outcomes(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("reader")
    proc = subprocess.run(
        [sys.executable, str(HERE / "reader_harness.py"), "loaders", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return {r["scenario"]: r for r in map(json.loads, proc.stdout.splitlines())}


@pytest.mark.parametrize(
    "scenario",
    [
        "main_truncate",
        "main_rewrite",
        "workers_truncate",
        "workers_rewrite",
        "workers_replace",
        "workers_remove",
    ],
)
def test_file_changed_under_a_running_loader_is_a_clear_error(reader_outcomes, scenario):
    result = reader_outcomes[scenario]
    assert result["first_batch_starts"] == [0, 10, 20, 30]  # the loader really was running
    assert (result["outcome"], result["type"]) == ("error", "TokenFileError"), result
    message = result["message"]
    assert f"{result['path']!r} changed since the dataset opened it" in message
    assert "Bus error" not in message
    if scenario.startswith("workers"):
        assert re.search(r"Caught TokenFileError in DataLoader worker process \d", message)
    assert result["children_left"] == []  # no worker hangs on


def test_holding_the_array_across_a_truncation_still_dies_of_sigbus(tmp_path):
    """The documented limit (item 19): the check runs when the dataset is used, not on every byte read."""
    proc = subprocess.run(
        [sys.executable, str(HERE / "reader_harness.py"), "hold", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert proc.stdout.splitlines() == ['{"before": 199999}'], proc.stdout + proc.stderr[-2000:]
    assert proc.returncode == -signal.SIGBUS


def test_a_killed_worker_is_reported_and_nothing_is_left(reader_outcomes):
    result = reader_outcomes["killed_worker"]
    assert (result["outcome"], result["type"]) == ("error", "RuntimeError"), result
    assert re.search(
        r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly|killed by signal",
        result["message"],
    )
    assert result["children_left"] == []


def test_a_stalled_read_hits_the_dataloader_timeout(reader_outcomes):
    result = reader_outcomes["hung_read"]
    expected = ("error", "RuntimeError", "DataLoader timed out after 1 seconds")
    assert (result["outcome"], result["type"], result["message"]) == expected
    assert result["children_left"] == []


def test_a_worker_error_names_the_worker_the_index_and_the_file(tmp_path):
    path = write_tokens(tmp_path / "tokens.npy", np.arange(1000, dtype=np.uint16))
    ds = nd.NpyTokensDataset(path, 10)  # 99 windows
    loader = DataLoader(
        ds,
        batch_size=2,
        sampler=[0, 1, 2, 500, 3, 4],
        num_workers=2,
        multiprocessing_context="fork",
        timeout=WORKER_TIMEOUT,
    )
    with pytest.raises(IndexError) as info:
        list(loader)
    message = str(info.value)
    traceback.clear_frames(
        info.value.__traceback__
    )  # let the iterator go now: its workers exit at once
    assert (
        "Caught IndexError in DataLoader worker process 1" in message
    )  # the second batch went to worker 1
    assert f"index 500 is out of range for 99 windows of {str(path)!r}" in message


def _worker_pids() -> set[int]:
    return {
        c.pid
        for c in psutil.Process().children(recursive=True)
        if c.status() != psutil.STATUS_ZOMBIE
    }


def _gone(pids: set[int], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while pids & _worker_pids():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_breaking_early_and_deleting_the_loader_stop_the_workers(tmp_path):
    ds = nd.NpyTokensDataset(
        write_tokens(tmp_path / "t.npy", np.arange(20_000, dtype=np.uint16)), 16
    )
    before = _worker_pids()
    loader = DataLoader(ds, batch_size=8, num_workers=2, timeout=WORKER_TIMEOUT)
    for _ in loader:
        break  # a plain loader: leaving the loop drops the iterator, and with it the workers
    gc.collect()
    assert _gone(_worker_pids() - before) and _worker_pids() == before
    train, val = nd.make_dataloaders(ds, ds, batch_size=8, num_workers=2)  # persistent workers
    train.timeout = WORKER_TIMEOUT  # make_dataloaders takes none; an iterator reads this attribute
    next(iter(train))
    workers = _worker_pids() - before
    assert len(workers) == 2  # they stay for the next epoch...
    del train, val
    gc.collect()
    assert _gone(workers)  # ...until the loader itself goes


# =================================================================================================
# Descriptors: workers under a low open-file limit (issue 26), pinning under one (issue 27).
