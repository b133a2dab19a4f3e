"""Reader-side fault scenarios, run as a subprocess by tests/test_faults.py (a crash must not take pytest down).

    python tests/reader_harness.py loaders FOLDER   # every DataLoader scenario; one JSON line each
    python tests/reader_harness.py hold FOLDER      # keeps the array across a truncation: dies of SIGBUS
    python tests/reader_harness.py descriptors FOLDER LIMIT HELD WORKERS PREFETCH [LATER]
                                                    # an epoch over FOLDER/shard_*.npy, few descriptors

Each scenario writes its own arange token file in FOLDER (token i at position i), so every batch
proves where it came from, and prints {"scenario": ..., "outcome": ..., ...} on one line.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python_files"))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402 (imported after the sys.path line above)
import psutil  # noqa: E402 (imported after the sys.path line above)
from torch.utils.data import DataLoader  # noqa: E402 (imported after the sys.path line above)

import npy_datasets as nd  # noqa: E402 (imported after the sys.path line above)
from conftest import write_tokens  # noqa: E402 (imported after the sys.path line above)

BATCH = 4
SEQ_LEN = 10


class GatedDataset(nd.NpyTokensDataset):
    """Every batch after the first waits for a gate file, so a test can change the file in between."""

    gate: str = ""

    def __getitems__(self, indices):
        if min(indices) >= BATCH:
            deadline = time.monotonic() + 60
            while not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().__getitems__(indices)


class KillsItsWorker(nd.NpyTokensDataset):
    """The worker that fetches window `victim` dies of SIGKILL, as under the kernel's OOM killer.
    It is in worker 1's first batch: a worker killed after handing a batch over would race the
    main process for that batch's shared memory, which torch reports as a bare connection error."""

    victim = BATCH

    def __getitems__(self, indices):
        if self.victim in indices:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitems__(indices)


class HangsOnce(nd.NpyTokensDataset):
    """The batch holding window `slow` takes 3 s, like a read from stalled network storage."""

    slow = 2 * BATCH

    def __getitems__(self, indices):
        if self.slow in indices:
            time.sleep(3)
        return super().__getitems__(indices)


def _children_left(timeout: float = 10.0) -> list[int]:
    """Pids of this process's children still alive after up to timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        children = psutil.Process().children(recursive=True)
        alive = [c.pid for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _outcome(read_batches) -> dict:
    """{"outcome": "finished", "batches": n} or the error's type and message."""
    try:
        return {"outcome": "finished", "batches": read_batches()}
    except Exception as error:  # the test inspects the type and the message
        # PyTorch re-raises a worker's error from a frame that refers to the error: without this, that
        # cycle keeps the iterator and its workers alive until a later gc pass, and a shutdown run by
        # the gc waits 5 s per worker.
        traceback.clear_frames(error.__traceback__)
        return {"outcome": "error", "type": type(error).__name__, "message": str(error)}


def _change(path: Path, how: str) -> None:
    if how == "truncate":  # in place, same inode: what `truncate -s` or a crashed writer leaves
        os.truncate(path, 4096)
    elif how == "rewrite":  # in place, same inode: np.save opens the existing file with "wb"
        np.save(path, np.arange(50, dtype=np.uint32))
    elif how == "replace":  # a new inode renamed over the old one, as prepare_tokens does
        fresh = path.with_name("fresh.npy")
        np.save(fresh, np.arange(50, dtype=np.uint32))
        os.replace(fresh, path)
    elif how == "remove":
        path.unlink()
    else:
        raise ValueError(how)


def changed_file(folder: Path, workers: int, how: str) -> dict:
    """Take one batch, change the file, read on: the error must name the file, and nobody may crash."""
    path = write_tokens(
        folder / f"{how}_{workers}.npy", np.arange(200_000, dtype=np.uint32), sidecar=False
    )
    ds = GatedDataset(path, SEQ_LEN)
    ds.gate = str(folder / f"gate_{how}_{workers}")
    extra = {"multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(ds, batch_size=BATCH, num_workers=workers, **extra)
    it = iter(loader)
    first = next(it)
    _change(path, how)
    Path(ds.gate).touch()
    result = {"first_batch_starts": first[0][:, 0].tolist(), "path": str(path)}
    result.update(_outcome(lambda: sum(1 for _ in it)))
    it = loader = None  # drop the iterator and its workers
    gc.collect()
    result["children_left"] = _children_left()
    return result


def killed_worker(folder: Path) -> dict:
    path = write_tokens(folder / "killed.npy", np.arange(20_000, dtype=np.uint32), sidecar=False)
    loader = DataLoader(
        KillsItsWorker(path, SEQ_LEN),
        batch_size=BATCH,
        num_workers=2,
        multiprocessing_context="fork",
    )
    result = _outcome(lambda: sum(1 for _ in loader))
    loader = None  # drop the loader and its workers
    gc.collect()
    result["children_left"] = _children_left()
    return result


def hung_read(folder: Path) -> dict:
    path = write_tokens(folder / "hung.npy", np.arange(20_000, dtype=np.uint32), sidecar=False)
    loader = DataLoader(
        HangsOnce(path, SEQ_LEN),
        batch_size=BATCH,
        num_workers=2,
        timeout=1,
        multiprocessing_context="fork",
    )
    result = _outcome(lambda: sum(1 for _ in loader))
    loader = None  # drop the loader and its workers
    gc.collect()
    result["children_left"] = _children_left()
    return result


def loaders(folder: Path) -> None:
    scenarios = {
        "main_truncate": lambda: changed_file(folder, 0, "truncate"),
        "main_rewrite": lambda: changed_file(folder, 0, "rewrite"),
        "workers_truncate": lambda: changed_file(folder, 2, "truncate"),
        "workers_rewrite": lambda: changed_file(folder, 2, "rewrite"),
        "workers_replace": lambda: changed_file(folder, 2, "replace"),
        "workers_remove": lambda: changed_file(folder, 2, "remove"),
        "killed_worker": lambda: killed_worker(folder),
        "hung_read": lambda: hung_read(folder),
    }
    for name, run in scenarios.items():
        print(json.dumps({"scenario": name, **run()}), flush=True)


def hold(folder: Path) -> None:
    """The one case the module cannot catch: code that keeps the array while the file shrinks."""
    path = write_tokens(folder / "held.npy", np.arange(200_000, dtype=np.uint32), sidecar=False)
    tokens = nd.open_tokens(path)  # checked now; every later read through this array bypasses it
    print(json.dumps({"before": int(tokens[-1])}), flush=True)
    os.truncate(path, 0)
    print(json.dumps({"after": int(tokens[-1])}), flush=True)  # the kernel answers with SIGBUS


def _maps_of_children() -> dict[int, int]:
    """How many shard files each child process (a worker) has mapped now, from /proc."""
    maps = {}
    for child in psutil.Process().children():
        with open(f"/proc/{child.pid}/maps") as f:
            maps[child.pid] = len({line.split()[-1] for line in f if "shard_" in line})
    return maps


def descriptors(folder: Path, limit: int, held: int, workers: int, prefetch: int, later=0) -> None:
    """One epoch of make_dataloaders over folder's shards under an open-file limit, with `held`
    descriptors taken before and `later` more after make_dataloaders. Prints one JSON line: the
    windows served and each worker's most maps, or the error. Before it, a line {"progress": ...}
    once the loader is made and after each batch: the caller's watchdog catches a hang."""
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
    taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(held)]
    result = {}
    try:
        ds = nd.NpyTokensDataset(str(folder / "shard_*.npy"), 8)
        train, _ = nd.make_dataloaders(
            ds, batch_size=32, num_workers=workers, prefetch_factor=prefetch, pin_memory=False
        )
        taken += [os.open(os.devnull, os.O_RDONLY) for _ in range(later)]
        result["in_use_at_fork"] = len(os.listdir("/proc/self/fd")) - 1  # not listdir's own
        print(json.dumps({"progress": "loader made"}), flush=True)
        starts, most_maps = [], {}
        for x, _ in train:
            starts += x[:, 0].tolist()
            print(json.dumps({"progress": len(starts)}), flush=True)
            try:  # reading /proc takes a descriptor: skipped where none is free
                now = _maps_of_children()
            except (OSError, psutil.Error):
                continue
            most_maps = {pid: max(n, most_maps.get(pid, 0)) for pid, n in now.items()}
        result.update(outcome="finished", starts=starts, most_maps=list(most_maps.values()))
    except Exception as error:  # the test inspects the type and the message
        traceback.clear_frames(error.__traceback__)
        result.update(outcome="error", type=type(error).__name__, message=str(error))
    print(json.dumps(result), flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # torch's handler raises when a worker dies
    with contextlib.suppress(psutil.Error, OSError):  # an exited worker; no descriptor for /proc
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, RuntimeError):
                child.kill()  # workers left in any state: no shutdown to wait for
    os._exit(0)


if __name__ == "__main__":
    command, folder, *numbers = sys.argv[1:]
    scenarios = {"loaders": loaders, "hold": hold, "descriptors": descriptors}
    scenarios[command](Path(folder), *map(int, numbers))
