"""DataLoader workers under open-file budgets that pass make_dataloaders' up-front check, and
pinning that fails for want of descriptors: every case serves the epoch or ends with one error
naming the open-file limit and the fix, never a hang (issues 26 and 27)."""

from __future__ import annotations

import errno
import json
import os
import pickle
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import npy_datasets as nd
from conftest import ROOT, SUBPROCESS_TIMEOUT

HERE = Path(__file__).resolve().parent

# (open-file limit, descriptors held before make_dataloaders, workers, prefetch_factor, held after)
# Each passed the up-front check of a20e65e's module, whose workers then hung or died of a bare
# EOFError; the last takes its descriptors after make_dataloaders, where no check sees them.
BUDGETS = [
    (128, 70, 4, 1, 0),
    (512, 440, 4, 2, 0),
    (1024, 900, 2, 2, 0),
    (96, 50, 2, 2, 0),
    (128, 80, 2, 2, 0),
    (160, 100, 2, 2, 0),
    (128, 40, 2, 2, 70),  # descriptors taken after make_dataloaders
    (128, 40, 2, 2, 73),
    (128, 20, 2, 2, 95),  # a bare OSError from DataLoader's worker pipes before the loader checked
]
# Measured once on a quiet run: 4 to 7 s from the start to the loader made (torch's import and
# 300 shards opened), then 0.7 s at most to any next batch. A hang shows as no line at all.
STARTUP_TIMEOUT = 120  # seconds
NO_PROGRESS_TIMEOUT = 20  # seconds


def watched(cmd: list[str], stderr_file: Path) -> list[dict]:
    """The JSON lines cmd prints; its process group is killed and the test fails when it prints
    nothing for NO_PROGRESS_TIMEOUT seconds (STARTUP_TIMEOUT before the first line)."""
    with open(stderr_file, "w") as stderr:  # a file: a flood of worker tracebacks cannot block
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True
        )
    lines = queue.Queue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)  # the end of its output

    threading.Thread(target=read, daemon=True).start()
    seen = []
    while True:
        waited = NO_PROGRESS_TIMEOUT if seen else STARTUP_TIMEOUT
        try:
            line = lines.get(timeout=waited)
        except queue.Empty:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            last = seen[-1] if seen else "nothing"
            tail = stderr_file.read_text()[-1500:]
            pytest.fail(f"no batch and no error for {waited} s after {last}:\n{tail}")
        if line is None:
            break
        seen.append(json.loads(line))
    assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 0, stderr_file.read_text()[-3000:]
    return seen


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="counts maps through /proc")
@pytest.mark.parametrize(("limit", "held", "workers", "prefetch", "later"), BUDGETS)
def test_workers_under_a_descriptor_budget_serve_the_epoch_or_name_the_limit(
    shard_folder, tmp_path, limit, held, workers, prefetch, later
):
    """An epoch over 300 shards under RLIMIT_NOFILE, N descriptors taken: the batches come, each
    worker keeping its maps within half of what it had free, or one error names the limit and
    `ulimit -n`. Never a hang, never a bare EOFError."""
    resource = pytest.importorskip("resource")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < limit:
        pytest.skip(f"the hard open-file limit is {hard}, below {limit}")
    budget = [limit, held, workers, prefetch, later]
    cmd = [sys.executable, str(HERE / "reader_harness.py"), "descriptors", str(shard_folder)]
    *progress, result = watched([*cmd, *map(str, budget)], tmp_path / "stderr.txt")
    stderr = (tmp_path / "stderr.txt").read_text()
    if result["outcome"] == "error":
        assert result["type"] in ("ValueError", "TokenFileError", "RuntimeError"), result
        assert re.search(rf"\b{limit}\b", result["message"]), result  # the limit, by its value
        advised = re.search(r"ulimit -n (\d+)", result["message"])  # and a fix that works
        assert advised and int(advised[1]) > limit, result
        assert "Traceback" not in stderr, stderr[-3000:]  # one line, not torch's worker tracebacks
        return
    every = {100 * i + 8 * k for i in range(300) for k in range(6)}
    starts = result["starts"]
    assert len(starts) == len(set(starts)) == 56 * 32 and set(starts) <= every  # drop_last
    free = limit - result["in_use_at_fork"] - nd.LOADER_DESCRIPTORS  # at least this many taken
    assert result["most_maps"] and max(result["most_maps"]) <= max(1, free // 2), result
    assert "Too many open files" not in stderr, stderr[-3000:]


@pytest.fixture
def failing_pin(monkeypatch):
    """A GPU machine whose CUDA cannot start: the first pin_memory() raises CUDA's error. Returns
    the shapes pinned (make_dataloaders pins one element first) and the error's text."""
    busy = "CUDA error: CUDA-capable device(s) is/are busy or unavailable"
    pinned = []

    def pin_memory(self, *args, **kwargs):
        pinned.append(tuple(self.shape))
        raise RuntimeError(busy)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return pinned, busy


def test_pinning_that_fails_is_refused_naming_the_limit_and_both_ways_out(arange_file, failing_pin):
    """A GPU machine with a low open-file limit: pinning starts CUDA, which fails. make_dataloaders
    pins one element first and refuses, naming the limit, `ulimit -n` and pin_memory=False."""
    resource = pytest.importorskip("resource")
    ds = nd.NpyTokensDataset(arange_file(1000), 8)
    pinned, busy = failing_pin
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/dev/fd"))
    limit = in_use + 8  # fewer free than CUDA_DESCRIPTORS: the limit is to blame
    assert limit - in_use < nd.CUDA_DESCRIPTORS and soft >= limit
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        messages = []
        for pin in (None, True):  # None: pinned wherever CUDA is
            with pytest.raises(RuntimeError) as info:
                nd.make_dataloaders(ds, ds, batch_size=4, pin_memory=pin)
            messages.append(str(info.value))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    for message in messages:
        assert busy in message and "ulimit -n" in message and "pin_memory=False" in message
        assert re.search(rf"the limit is {limit}\b", message), message
    assert pinned == [(1,), (1,)]  # one element, before any loader was made
    train, val = nd.make_dataloaders(ds, ds, batch_size=4, pin_memory=False)
    assert not train.dataloader.pin_memory and not val.dataloader.pin_memory
    assert pinned == [(1,), (1,)]


def test_pinning_that_fails_with_descriptors_to_spare_blames_cuda_not_the_limit(
    arange_file, failing_pin
):
    """The same failure with descriptors to spare: the advice is to fix CUDA or pass
    pin_memory=False; a larger `ulimit -n` would not help, so the message does not advise it."""
    resource = pytest.importorskip("resource")
    ds = nd.NpyTokensDataset(arange_file(1000), 8)
    pinned, busy = failing_pin
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    in_use = len(os.listdir("/dev/fd"))
    if soft != resource.RLIM_INFINITY and soft - in_use < 4 * nd.CUDA_DESCRIPTORS:
        pytest.skip(f"only {soft - in_use} descriptors free under this limit")
    with pytest.raises(RuntimeError) as info:
        nd.make_dataloaders(ds, ds, batch_size=4, pin_memory=True)
    message = str(info.value)
    expected = f"pinning memory starts CUDA, which failed ({busy}): fix CUDA, or pass pin_memory"
    assert message.startswith(expected) and "ulimit" not in message, message
    assert pinned == [(1,)]


def test_each_descriptor_refusal_advises_a_limit_above_the_count_in_use(arange_file, monkeypatch):
    """8,190 of 8,192 descriptors in use: a map that runs out, a worker with too few free and
    make_dataloaders' check each advise `ulimit -n` of more than is in use (a map said 4096)."""
    ds = nd.NpyTokensDataset(arange_file(1000), 8)
    monkeypatch.setattr(nd, "_descriptors", lambda: (8192, 8190))

    def out_of_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    messages = []
    with monkeypatch.context() as patch:  # a DataLoader worker's first map, first: it checks once
        patch.setattr(torch.utils.data, "get_worker_info", lambda: object())
        with pytest.raises(nd.TokenFileError) as info:
            pickle.loads(pickle.dumps(ds))[0]
        messages.append(str(info.value))
    with monkeypatch.context() as patch:
        patch.setattr(nd.np, "memmap", out_of_descriptors)
        with pytest.raises(nd.TokenFileError) as info:
            ds[0]
        messages.append(str(info.value))
    with pytest.raises(ValueError) as info:
        nd.make_dataloaders(ds, batch_size=4, num_workers=2, pin_memory=False)
    messages.append(str(info.value))
    for message in messages:
        advised = re.search(r"ulimit -n (\d+)", message)
        assert "8192" in message and advised and int(advised[1]) > 8190 + 16, message
