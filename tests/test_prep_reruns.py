"""prepare_tokens.py run again, interrupted or sharded: what a rerun keeps, rebuilds or swaps, one
file or a set of shards, what an interruption leaves, and a run that waits for another.

The subprocess fault runs (kills, disk full, two runs at once) are in test_faults.py. Catalogue
items 30, 60, 61, 66, 68, 83, 84 and 88 (tests/bad_inputs.md).
"""

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import npy_datasets as nd
import prep_outputs
import prepare_tokens as pt
from conftest import (
    DOCS,
    EOT,
    MANY,
    ROOT,
    STORIES,
    make_dataset,
    prep_input,
    prepare,
    prepare_on_one_thread,
    write_jsonl,
)
from npy_datasets import TokenFileError, open_tokens, read_sidecar
from prep_outputs import sidecar_path

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")


def temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp." in p.name]


def staging_name(pid: int, random: str, split: str = "train") -> str:
    """A prep run's staging folder, as make_staging_folder names it."""
    return f".prepare_tokens.tmp.{pid}.{random}.{split}"


# --- reruns -------------------------------------------------------------------------------------


def test_rerun_skips_and_changed_settings_rebuild(tmp_path):
    rows = [{"text": t, "story": t.upper()} for t in MANY[:20]]
    write_jsonl(tmp_path / "in" / "train.jsonl", rows)
    write_jsonl(tmp_path / "in" / "validation.jsonl", rows[:3])
    data, out = tmp_path / "in", tmp_path / "out"
    train, side = out / "train.npy", out / "train.npy.json"

    assert all(r.written for r in prepare(data, out).values())
    stamps = (train.stat().st_mtime_ns, side.stat().st_mtime_ns)
    time.sleep(0.01)
    again = prepare(data, out, num_threads=1, chunk_docs=3)  # neither changes the bytes
    assert not any(r.written for r in again.values())
    assert "(up to date)" in again["train"].summary()
    assert (train.stat().st_mtime_ns, side.stat().st_mtime_ns) == stamps

    before = train.read_bytes()
    by_story = prepare(data, out, column="story")
    assert by_story["train"].written and train.read_bytes() != before
    assert prepare(data, out, column="story")["train"].written is False
    assert prepare(data, out, column="story", force=True)["train"].written

    assert prepare(data, out, column="story", layout="bin")["train"].written
    assert (out / "train.bin").is_file() and (out / "train.bin.json").is_file()

    with open(train, "ab") as f:  # damaged file: its size no longer matches the sidecar
        f.write(b"\0\0")
    assert prepare(data, out, column="story")["train"].written
    assert open_tokens(train, verify=True).size == read_sidecar(train)["n_tokens"]


def test_an_unreadable_sidecar_means_rebuild_without_force(tmp_path):
    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    first = prepare(data, out)["train"].meta
    side = sidecar_path(out / "train.npy")
    side.write_text(
        re.sub(r'"n_tokens": \d+', '"n_tokens": ' + "9" * 5000, side.read_text())
    )  # past int() digit limit
    with pytest.raises(TokenFileError, match=re.escape(str(side))):
        read_sidecar(out / "train.npy")
    again = prepare(data, out)["train"]
    assert again.written and read_sidecar(out / "train.npy") == again.meta
    assert {k: v for k, v in again.meta.items() if k != "created_by"} == {
        k: v for k, v in first.items() if k != "created_by"
    }


def test_existing_output_is_swapped_not_deleted(tmp_path):
    data, out = prep_input(tmp_path / "in", STORIES, STORIES[:5]), tmp_path / "out"
    prepare_on_one_thread(data, out, column="story")
    (out / "notes.txt").write_text("mine")
    (out / "keep").mkdir()
    (out / "keep" / "x.npy").write_bytes(b"not tokens")
    previous = np.load(out / "train.npy")
    reader = np.load(out / "train.npy", mmap_mode="r")  # someone still reading the old file
    inode = (out / "train.npy").stat().st_ino
    assert (
        prepare_on_one_thread(data, out, column="story")["train"].written is False
    )  # same settings: kept
    assert prepare_on_one_thread(data, out)["train"].written  # other settings: rebuilt
    assert (out / "train.npy").stat().st_ino != inode  # a new file renamed over the old one
    np.testing.assert_array_equal(reader, previous)  # the old reader still sees the old bytes
    assert (out / "notes.txt").read_text() == "mine" and (
        out / "keep" / "x.npy"
    ).read_bytes() == b"not tokens"
    assert (
        nd.open_tokens(out / "train.npy", verify=True).size
        == nd.read_sidecar(out / "train.npy")["n_tokens"]
    )


# --- shards -------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["npy", "bin"])
def test_shards_hold_exactly_shard_tokens_and_concatenate_to_the_one_file(tmp_path, enc, layout):
    from npy_datasets import NpyTokensDataset

    data = make_dataset(tmp_path / "in", MANY, MANY[:3])
    whole = np.asarray(open_tokens(prepare(data, tmp_path / "one")["train"].path))
    n = 97  # not a divisor of the split's length, and smaller than most documents: documents span shards
    result = prepare(data, tmp_path / "shards", shard_tokens=n, layout=layout)["train"]
    k = -(-len(whole) // n)
    assert len(whole) % n and result.written and len(result.shards) == k
    assert [p.name for p in result.shards] == [f"train_{i:06d}.{layout}" for i in range(k)]
    assert result.path == tmp_path / "shards" / f"train_{'[0-9]' * 6}.{layout}"
    assert result.summary().endswith(f"({k} shards, written)")
    parts = [np.asarray(open_tokens(p, verify=True)) for p in result.shards]
    assert [len(part) for part in parts] == [n] * (k - 1) + [len(whole) - n * (k - 1)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    metas = [read_sidecar(p) for p in result.shards]
    assert [m["shard"] for m in metas] == [
        {"index": i, "count": k, "shard_tokens": n, "first_token": i * n} for i in range(k)
    ]
    assert [m["n_docs"] for m in metas] == [int(np.count_nonzero(part == EOT)) for part in parts]
    assert (result.meta["n_docs"], result.meta["n_tokens"], len(result.shards)) == (
        len(MANY),
        len(whole),
        k,
    )
    assert len({m["settings_fingerprint"] for m in metas}) == 1
    assert (
        metas[0]["settings_fingerprint"]
        != read_sidecar(tmp_path / "one" / "train.npy")["settings_fingerprint"]
    )
    ds = NpyTokensDataset(result.path, 8)  # the glob as returned
    assert len(ds) == sum((len(part) - 1) // 8 for part in parts)
    assert prepare(data, tmp_path / "shards", shard_tokens=len(whole) + 5, layout=layout)[
        "train"
    ].shards == (
        tmp_path / "shards" / f"train_000000.{layout}",
    )  # one shard holds all; the others of the previous run are gone with their sidecars
    assert sorted(q.name for q in (tmp_path / "shards").glob("train_*")) == [
        f"train_000000.{layout}",
        f"train_000000.{layout}.json",
    ]


def test_max_token_id_is_the_largest_id_of_every_chunk_not_the_first(tmp_path):
    data = make_dataset(
        tmp_path / "in", MANY[:20], ["v"]
    )  # shards of 7 ids: some hold no EOT, the largest id
    result = prepare(data, tmp_path / "out", shard_tokens=7, chunk_docs=1)["train"]
    tops = [read_sidecar(shard)["max_token_id"] for shard in result.shards]
    assert tops == [int(np.load(shard).max()) for shard in result.shards] and min(tops) < EOT
    assert result.meta["max_token_id"] == max(tops) == EOT


def test_sharded_rerun_skips_rebuilds_on_change_and_is_byte_identical(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    first = prepare(data, out, shard_tokens=300)["train"]
    snapshot = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    time.sleep(0.01)
    again = prepare(data, out, shard_tokens=300, num_threads=1, chunk_docs=5)
    assert not any(r.written for r in again.values()) and again["train"].shards == first.shards
    assert "shards, up to date)" in again["train"].summary()
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == snapshot

    forced = prepare(data, out, shard_tokens=300, force=True)["train"]
    assert forced.written and {p.name: p.read_bytes() for p in out.iterdir()} == {
        k: v[0] for k, v in snapshot.items()
    }

    stray = (
        out / f"train_{len(first.shards):06d}.npy"
    )  # a shard from some other run: not up to date any more
    stray.write_bytes(first.shards[0].read_bytes())
    assert prepare(data, out, shard_tokens=300)["train"].written and not stray.exists()

    first.shards[1].unlink()  # a missing shard is rebuilt
    assert prepare(data, out, shard_tokens=300)["train"].written and first.shards[1].is_file()

    smaller = prepare(data, out, shard_tokens=100)["train"]
    assert smaller.written and len(smaller.shards) > len(first.shards)
    assert (out / "train.npy").exists() is False  # sharded output never writes the one-file name


def test_sharding_refuses_to_touch_another_splits_file_with_a_shard_name(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    prepare(data, out, splits=["validation"])
    for suffix in ("", ".json"):  # as if a split named train_000001 had been written here
        (out / f"validation.npy{suffix}").rename(out / f"train_000001.npy{suffix}")
    before = (out / "train_000001.npy").read_bytes()
    with pytest.raises(
        ValueError, match=r"train_000001.npy' is not a shard of split 'train'.*choose another --out"
    ):
        prepare(data, out, shard_tokens=10_000, splits=["train"])
    assert (out / "train_000001.npy").read_bytes() == before and (
        out / "train_000001.npy.json"
    ).is_file()
    names = sorted(p.name for p in out.iterdir() if p.name != prep_outputs.LOCK_NAME)
    assert names == ["train_000001.npy", "train_000001.npy.json"]


def test_cli_shard_tokens_writes_shards_the_dataset_reads_by_glob(tmp_path):
    from npy_datasets import NpyTokensDataset

    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / "hf_datasets"))
    command = [
        sys.executable,
        "python_files/prepare_tokens.py",
        "--out",
        str(tmp_path),
        "--shard-tokens",
        "100000",
    ]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pattern = (tmp_path / f"train_{'[0-9]' * 6}.npy").resolve()
    assert proc.stdout.splitlines() == [
        f"train: 1,800 docs, 342,147 tokens, uint16 -> {pattern} (4 shards, written)",
        f"validation: 180 docs, 35,098 tokens, uint16 -> {pattern.with_name('validation_' + '[0-9]' * 6 + '.npy')} (1 shard, written)",
    ]
    ds = NpyTokensDataset(str(pattern), 256)
    assert [f.shape for f in ds.files] == [(100_000,), (100_000,), (100_000,), (42_147,)]
    assert len(ds) == 3 * (99_999 // 256) + 42_146 // 256


# --- interruptions and leftovers ----------------------------------------------------------------


def test_interrupted_write_leaves_nothing_and_keeps_earlier_output(tmp_path, monkeypatch):
    def two_chunks_then_ctrl_c(*args, **kwargs):
        yield np.array([EOT, 1, 2])
        yield np.array([EOT, 3])
        raise KeyboardInterrupt

    data, out = make_dataset(tmp_path / "in", MANY, ["v"]), tmp_path / "out"
    prepare(data, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(pt, "tokenize_documents", two_chunks_then_ctrl_c)
    for shard_tokens in (None, 2):  # one file; shards, the second one half written
        with pytest.raises(KeyboardInterrupt):
            prepare(data, out, force=True, shard_tokens=shard_tokens)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched, no temp files


def test_crash_between_data_and_sidecar_leaves_no_sidecar(tmp_path, monkeypatch):
    data, out = make_dataset(tmp_path / "in", MANY, ["v"]), tmp_path / "out"
    prepare(data, out)
    real_replace = os.replace

    def crash_before_a_sidecar_moves_in(src, dst):
        if Path(dst).parent == out and str(dst).endswith(".json"):
            raise OSError("simulated power cut before the sidecar")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_before_a_sidecar_moves_in)
    with pytest.raises(OSError, match="simulated"):
        prepare(data, out, force=True)
    assert (out / "train.npy").is_file() and not (out / "train.npy.json").exists()
    assert temp_files(out) == []
    monkeypatch.undo()
    assert prepare(data, out)["train"].written  # no sidecar means incomplete: rebuilt
    assert open_tokens(out / "train.npy", verify=True).size > 0


def test_a_failed_sharded_rebuild_keeps_the_previous_shards_whole(tmp_path, monkeypatch):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    before = prepare(data, out, shard_tokens=300)["train"]
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}
    tokens = np.concatenate([np.load(p) for p in before.shards])
    real = prep_outputs.write_tokens
    calls = []

    def interrupted_on_the_third_shard(path, ids, **kwargs):
        calls.append(Path(path))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(path, ids, **kwargs)

    monkeypatch.setattr(prep_outputs, "write_tokens", interrupted_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        prepare(data, out, shard_tokens=200, splits=["train"])  # other settings: a rebuild
    assert all(
        p.parent != out for p in calls
    )  # shards are written beside, never over, the finished ones
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot  # staging folder gone too
    assert all(
        open_tokens(p, verify=True).size == read_sidecar(p)["n_tokens"] for p in before.shards
    )
    monkeypatch.undo()
    after = prepare(data, out, shard_tokens=200, splits=["train"])["train"]
    assert after.written and np.array_equal(
        np.concatenate([np.load(p) for p in after.shards]), tokens
    )
    assert len(after.shards) == -(-len(tokens) // 200) and sorted(
        p.name for p in out.glob("train*")
    ) == sorted([p.name for p in after.shards] + [p.name + ".json" for p in after.shards])


@pytest.fixture
def sigint_raises_keyboard_interrupt():
    """SIGINT raises KeyboardInterrupt in this process during the test, whatever pytest inherited.

    A shell starts a background job (`pytest &`) with SIGINT ignored, and so do some CI runners:
    Python then installs no handler, and a test's own SIGINT would do nothing. A test that sends
    SIGINT sets its disposition here; the previous one comes back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("sigint_raises_keyboard_interrupt")
def test_ctrl_c_during_the_swap_waits_until_the_new_shards_are_whole(tmp_path, monkeypatch):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    prepare(data, out, shard_tokens=100, splits=["train"])
    real_replace = os.replace
    renames = []

    def ctrl_c_after_the_first_rename(src, dst):
        real_replace(src, dst)
        if Path(dst).parent != out or str(dst).endswith(".json"):  # in staging, or a sidecar
            return
        renames.append(Path(dst))
        if len(renames) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, half way through the renames

    monkeypatch.setattr(os, "replace", ctrl_c_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        prepare(data, out, shard_tokens=300, splits=["train"])
    monkeypatch.undo()
    assert len(renames) > 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    shards = sorted(
        out.glob("train_*.npy")
    )  # all of the new run, finished, none of the old one left
    assert [p.name for p in shards] == [p.name for p in renames]
    assert all(
        read_sidecar(p)["shard"]["shard_tokens"] == 300 and open_tokens(p, verify=True).size
        for p in shards
    )
    assert not prepare(data, out, shard_tokens=300, splits=["train"])["train"].written


def test_stale_temp_files_of_dead_runs_are_removed(tmp_path):
    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    out.mkdir()
    dead = out / staging_name(999999999, "deadbeef")  # far above any possible pid
    reused = out / staging_name(os.getppid(), "cafef00d")  # a live pid, not a live run: no lock
    for folder in (dead, reused):
        folder.mkdir()
        (folder / "train.npy").write_bytes(b"half a file")
    kept = [out / "notes.tmp.txt", out / ".prepare_tokens.tmp.1.deadbeef"]  # not staging folders
    for path in kept:
        path.write_bytes(b"x")
    prepare(data, out)
    assert not dead.exists() and not reused.exists() and all(path.exists() for path in kept)


def test_a_killed_runs_shard_staging_folder_is_removed(tmp_path):
    staging = tmp_path / staging_name(1, "0badc0de")  # pid 1 lives, but holds no lock here
    staging.mkdir()
    (staging / "train_000000.npy").write_bytes(b"half a shard")
    victim = tmp_path / "victim"
    victim.mkdir()
    planted = tmp_path / staging_name(2, "0badc0de", "validation")
    planted.symlink_to(victim)  # a link with a staging folder's name: never followed
    assert prep_outputs.clean_stale_temp_files(tmp_path) == [staging]
    assert not staging.exists() and planted.is_symlink() and victim.is_dir()
    assert prep_outputs.clean_stale_temp_files(tmp_path / "missing") == []


# --- issue 19: reruns after damage, shared folders, shard arithmetic ----------------------------


def test_damage_of_the_same_size_is_rebuilt_without_force(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, ["v"]), tmp_path / "out"
    prepare(data, out)
    path = out / "train.npy"
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[200] ^= 0xFF  # in the first 64 KiB, after the header: the probe covers it
    path.write_bytes(bytes(damaged))
    with pytest.raises(TokenFileError, match="probe_sha256"):
        open_tokens(path)  # the loader refuses it and sends the user here
    again = prepare(data, out)["train"]
    assert again.written and path.read_bytes() == good  # rebuilt, without --force
    assert not prepare(data, out)["train"].written


LOCK = ".prepare_tokens.lock"  # prep_outputs.LOCK_NAME, spelled out: the test names the file


def test_a_live_run_that_this_run_cannot_see_keeps_its_temp_files(tmp_path, capsys):
    import threading

    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    out.mkdir()
    staging = out / staging_name(999999999, "0badc0de")  # a pid from another PID namespace
    staging.mkdir()
    (staging / "train.npy").write_bytes(b"half a file")
    temp = out / ".train.npy.tmp.999999999.deadbeef"  # write_tokens' own: never prep's to remove
    temp.write_bytes(b"half a file")
    holder = subprocess.Popen(  # the other run: it holds the folder's lock until its stdin closes
        [
            sys.executable,
            "-c",
            "import fcntl, sys\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\nsys.stdin.read()",
            str(out / LOCK),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        started = select.select([holder.stdout], [], [], 60)[0]  # it prints at once: 60 s is a hang
        assert started and holder.stdout.readline() == "locked\n", "the lock holder did not start"
        outcome = {}
        run = threading.Thread(target=lambda: outcome.update(prepare(data, out)), daemon=True)
        run.start()
        run.join(3)
        assert run.is_alive(), "the run did not wait for the live run's lock"
        assert temp.exists() and staging.is_dir()  # the live run's files are untouched
        assert not (out / "train.npy").exists()
    finally:
        holder.communicate("", timeout=60)  # the other run ends, and its lock with it
    run.join(60)
    assert not run.is_alive() and outcome["train"].written
    assert not staging.exists() and temp.exists()  # now a dead run's: removed; the other kept
    assert "waiting for another prep run" in capsys.readouterr().err
    assert prep_outputs.LOCK_NAME == LOCK


def test_a_prep_run_leaves_a_live_write_tokens_temp_file_alone(tmp_path):
    """Issue 26.7: write_tokens takes no prep lock, so its temp file is never a dead run's."""
    import threading

    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    out.mkdir()
    halfway, resume = threading.Event(), threading.Event()

    def ids():
        yield np.arange(10)
        halfway.set()
        resume.wait(60)  # a prep run writes into the same folder meanwhile
        yield np.arange(10, 20)

    outcome = {}

    def write():
        try:
            nd.write_tokens(out / "mine.npy", ids(), n_vocab=100, tokenizer="test:arange", eot_id=0)
        except Exception as error:  # handed to the test's thread
            outcome["error"] = error

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert halfway.wait(60)
    assert [name.startswith(".mine.npy.tmp.") for name in temp_files(out)] == [True]
    assert prepare(data, out)["train"].written  # under the folder's lock: dead runs' files go
    resume.set()
    writer.join(60)
    assert not writer.is_alive() and "error" not in outcome, outcome
    assert open_tokens(out / "mine.npy", verify=True).tolist() == list(range(20))


@pytest.mark.parametrize("kind", ["symbolic link", "folder", "FIFO"])
def test_a_lock_file_that_cannot_lock_is_an_error_naming_it(tmp_path, kind):
    """Issue 26.7: a link, a folder or a FIFO at the lock's name turned the lock off silently."""
    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    out.mkdir()
    lock = out / LOCK
    if kind == "symbolic link":
        (tmp_path / "elsewhere").write_bytes(b"")
        lock.symlink_to(tmp_path / "elsewhere")
    elif kind == "folder":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    message = f"{str(lock)!r} is a {kind}, not a lock file: .*; remove it, and run again"
    with pytest.raises(ValueError, match=message):
        prepare(data, out)
    with pytest.raises(SystemExit, match=message):  # the command line: one line, exit status 1
        pt.main(["--dataset", str(data), "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [LOCK]  # nothing written


def test_shard_tokens_that_divide_the_count_or_are_one(tmp_path):
    data = make_dataset(tmp_path / "in", ["A cat.", "It sat on a mat today."], ["v"])
    whole = np.load(prepare(data, tmp_path / "one", splits=["train"])["train"].path)
    divisors = [k for k in range(2, len(whole)) if len(whole) % k == 0]
    assert divisors, len(whole)  # the texts are chosen so that the count has a divisor
    for shard_tokens in (divisors[0], 1, len(whole)):
        out = tmp_path / f"shards_{shard_tokens}"
        result = prepare(data, out, splits=["train"], shard_tokens=shard_tokens)["train"]
        assert len(result.shards) == len(whole) // shard_tokens  # no empty last shard
        parts = [np.load(p) for p in result.shards]
        assert all(len(part) == shard_tokens for part in parts)
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        assert result.meta["n_tokens"] == len(whole) and result.meta["n_docs"] == 2


def test_a_sharded_splits_totals_come_from_every_shard(tmp_path):
    data = make_dataset(tmp_path / "in", MANY[5:15], ["v"])
    result = prepare(
        data, tmp_path / "out", splits=["train"], shard_tokens=7, eot_placement="append"
    )["train"]
    metas = [read_sidecar(p) for p in result.shards]
    assert metas[0]["max_token_id"] < EOT  # the first shard holds no EOT: part of a story
    expected = {
        "n_tokens": sum(m["n_tokens"] for m in metas),
        "n_docs": sum(m["n_docs"] for m in metas),
        "max_token_id": max(m["max_token_id"] for m in metas),
    }
    assert expected == {"n_tokens": expected["n_tokens"], "n_docs": 10, "max_token_id": EOT}
    assert {k: result.meta[k] for k in expected} == expected
    assert "n_shards" not in result.meta and len(result.shards) == metas[0]["shard"]["count"]
    kept = prepare(
        data, tmp_path / "out", splits=["train"], shard_tokens=7, eot_placement="append"
    )["train"]
    assert not kept.written and kept.meta == result.meta  # the same totals, read back
