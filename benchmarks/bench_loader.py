#!/usr/bin/env python
"""Throughput of the ways to serve (x, y) next-token batches from a memmapped GPT-2 token file.

Every entry produces int64 x and y of shape (B, T) with y = x shifted by one token, from random
window starts in one >= 100M-token uint16 .npy file under data/bench/ (generated once, reused).
Only steady-state batches are timed: each entry gets a fresh DataLoader iterator, worker start-up
and a warm-up are excluded, then batches are pulled for a fixed time box.

    python benchmarks/bench_loader.py            # full run, a few minutes on 2 cores
    python benchmarks/bench_loader.py --quick    # < 30 s smoke run on a 10M-token file
    python benchmarks/bench_loader.py --gpu      # also host->device transfer, where CUDA exists

Writes benchmarks/results/loader.json (or --json PATH). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import pickle
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python_files"))
import npy_datasets  # noqa: E402  (the module under test, imported from python_files/)

BENCH_DIR = ROOT / "data" / "bench"
RESULTS_DIR = ROOT / "benchmarks" / "results"
VOCAB = 50257  # GPT-2
CONFIGS = ((12, 512), (12, 1024), (64, 2048))


# ------------------------------------------------------------------------------ token file


def npy_offset(path: Path) -> int:
    """Byte offset of the data in a .npy file (what nanoGPT's np.memmap needs for a .npy)."""
    return int(np.load(path, mmap_mode="r").offset)


def ensure_token_file(path: Path, n_tokens: int, seed: int = 0, chunk: int = 1 << 24) -> dict[str, Any]:
    """A real .npy of n_tokens random uint16 ids below 50257, written in chunks; reused if it fits."""
    if path.exists():
        try:
            arr = np.load(path, mmap_mode="r")
            if arr.dtype == np.uint16 and arr.shape == (n_tokens,):
                return {"generated": False, "generate_s": 0.0}
        except (ValueError, OSError):
            pass
        print(f"{path.name}: wrong size or unreadable, regenerating")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    t0 = time.perf_counter()
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint16, shape=(n_tokens,))
    rng = np.random.default_rng(seed)
    for i in range(0, n_tokens, chunk):
        m = min(chunk, n_tokens - i)
        out[i : i + m] = rng.integers(0, VOCAB, size=m, dtype=np.uint16)
    out.flush()
    del out
    os.replace(tmp, path)
    return {"generated": True, "generate_s": round(time.perf_counter() - t0, 2)}


def warm_page_cache(path: Path) -> float:
    """Read the whole file once so every entry starts from a warm page cache."""
    t0 = time.perf_counter()
    buf = bytearray(1 << 26)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------ entries
# Each builder returns (next_batch, cleanup). next_batch() -> (x, y); it raises StopIteration at
# the end of a DataLoader epoch.


def build_nanogpt(path: Path, B: int, T: int, seed: int):
    """nanoGPT's get_batch, verbatim apart from the .npy header offset and no device transfer."""
    offset = npy_offset(path)
    torch.manual_seed(seed)

    def get_batch():
        # We recreate np.memmap every batch to avoid a memory leak, as per
        # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122#61472122
        data = np.memmap(path, dtype=np.uint16, mode="r", offset=offset)
        ix = torch.randint(len(data) - T, (B,))
        x = torch.stack([torch.from_numpy((data[i : i + T]).astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy((data[i + 1 : i + 1 + T]).astype(np.int64)) for i in ix])
        return x, y

    return get_batch, None


class OriginalTutorialDataset(Dataset):
    """The original tutorial's Dataset: np.load(mmap_mode='r'), a virtual length, random starts."""

    def __init__(self, path, seq_len, length=10_000_000):
        self.path = str(path)
        self.seq_len = seq_len
        self.length = length
        self.arr = np.load(self.path, mmap_mode="r")

    def __getstate__(self):
        state = self.__dict__.copy()
        state["arr"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.arr = np.load(self.path, mmap_mode="r")

    def __len__(self):
        return self.length

    def __getitem__(self, idx):
        T = self.seq_len
        s = np.random.randint(0, len(self.arr) - T - 1)
        x = torch.from_numpy(self.arr[s : s + T].astype(np.int64))
        y = torch.from_numpy(self.arr[s + 1 : s + 1 + T].astype(np.int64))
        return x, y


class _Epochs:
    """next() over a DataLoader that starts the next epoch when one ends, as a training loop does.

    A new epoch is a new iter(loader): EpochSampler draws its next permutation and persistent
    workers are reused, so the per-epoch cost is part of the timed steady state.
    """

    def __init__(self, loader: DataLoader, finish: Callable | None = None) -> None:
        self.loader = loader
        self.it = iter(loader)
        self.epochs = 1
        self.finish = finish  # applied to every batch inside the timed call (e.g. to_device)

    def __call__(self):
        try:
            batch = next(self.it)
        except StopIteration:
            self.it = iter(self.loader)
            self.epochs += 1
            batch = next(self.it)
        return batch if self.finish is None else self.finish(batch)

    def cleanup(self) -> None:
        shutdown = getattr(self.it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        self.it = None


def _loader_iter(loader: DataLoader, finish: Callable | None = None):
    epochs = _Epochs(loader, finish)
    return epochs, epochs.cleanup


def build_original(path: Path, B: int, T: int, seed: int, workers: int):
    np.random.seed(seed)  # workers are seeded by DataLoader itself (numpy too, since torch 1.9)
    ds = OriginalTutorialDataset(path, T)
    loader = DataLoader(ds, batch_size=B, num_workers=workers, persistent_workers=workers > 0)
    return _loader_iter(loader)


def build_floor(path: Path, B: int, T: int, seed: int, convert: str):
    """The least work for the same batch: B slice copies into a reused uint16 buffer, one widening."""
    data = np.asarray(np.load(path, mmap_mode="r"))  # plain ndarray view of one open memmap
    n = len(data)
    rng = np.random.default_rng(seed)
    buf = np.empty((B, T + 1), dtype=np.uint16)
    tbuf = torch.from_numpy(buf)

    def get_batch():
        for b, s in enumerate(rng.integers(0, n - T, size=B).tolist()):  # starts 0 .. n - T - 1
            buf[b] = data[s : s + T + 1]
        if convert == "torch":
            t = tbuf.to(torch.int64)
        else:
            t = torch.from_numpy(buf.astype(np.int64))
        return t[:, :-1], t[:, 1:]

    return get_batch, None


def build_npy_plain(path: Path, B: int, T: int, seed: int, workers: int):
    """The module's Dataset through a plain DataLoader, as someone who copied the class writes it."""
    ds = npy_datasets.NpyTokensDataset(path, T, mode="random", num_samples=10_000_000, seed=seed)
    loader = DataLoader(ds, batch_size=B, num_workers=workers)
    return _loader_iter(loader)


def build_npy_helper(path: Path, B: int, T: int, seed: int, workers: int, mode: str):
    """The module's own helper: make_dataloaders (EpochSampler + collate_windows), train loader,
    each batch then made int64 x, y by to_device(batch, "cpu") inside the timed call, as a training
    loop does (the loader yields compact TokenBatch objects; widening happens in to_device)."""
    ds = npy_datasets.NpyTokensDataset(path, T, mode=mode, seed=seed)
    ds_val = npy_datasets.NpyTokensDataset(path, T, mode="windows")
    train_loader, _ = npy_datasets.make_dataloaders(ds, ds_val, batch_size=B, num_workers=workers, seed=seed)
    return _loader_iter(train_loader, lambda batch: npy_datasets.to_device(batch, "cpu"))


def build_npy_batch_sampler(path: Path, B: int, T: int, seed: int, workers: int):
    """For comparison: a plain torch DataLoader over the module's batch sampler (the same keys,
    __getitems__ and collate as the helper, but torch's own per-batch iterator)."""
    ds = npy_datasets.NpyTokensDataset(path, T, seed=seed)
    sampler = npy_datasets.EpochSampler(ds, seed=seed, batch_size=B, drop_last=True)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=workers, collate_fn=npy_datasets.collate_windows)
    return _loader_iter(loader, lambda batch: npy_datasets.to_device(batch, "cpu"))


class _ZeroWorkBatches(Dataset):
    """Next to no work: two fresh zero int64 (B, T) tensors per batch (a transport floor)."""

    def __init__(self, B: int, T: int) -> None:
        self.B, self.T = B, T

    def __len__(self) -> int:
        return 10_000_000

    def __getitem__(self, idx):  # never called: DataLoader uses __getitems__
        raise NotImplementedError

    def __getitems__(self, indices):
        return torch.zeros((self.B, self.T), dtype=torch.int64), torch.zeros((self.B, self.T), dtype=torch.int64)


def build_ipc_floor(path: Path, B: int, T: int, seed: int, workers: int):
    """What a DataLoader with workers costs per batch when the dataset itself costs nothing."""
    loader = DataLoader(_ZeroWorkBatches(B, T), batch_size=B, num_workers=workers, persistent_workers=True,
                        collate_fn=lambda batch: batch)  # fmt: skip
    return _loader_iter(loader)


ENTRIES: dict[str, tuple[Callable, str]] = {
    "nanogpt_get_batch": (build_nanogpt, "np.memmap reopened per call, torch.randint, stack of per-row astype"),
    "original_dataset_w0": (lambda p, B, T, s: build_original(p, B, T, s, 0), "tutorial Dataset, DataLoader workers=0"),
    "original_dataset_w2": (lambda p, B, T, s: build_original(p, B, T, s, 2), "tutorial Dataset, DataLoader workers=2 (persistent)"),
    "floor": (lambda p, B, T, s: build_floor(p, B, T, s, "torch"), "B slice copies into a (B,T+1) uint16 buffer + torch .to(int64)"),
    "floor_np_astype": (lambda p, B, T, s: build_floor(p, B, T, s, "numpy"), "same, widened with numpy astype; x floor = the faster of the two"),
    "npy_dataset_plain_w0": (lambda p, B, T, s: build_npy_plain(p, B, T, s, 0), 'NpyTokensDataset(mode="random") + DataLoader(ds, batch_size=B)'),
    "npy_dataset_plain_w2": (lambda p, B, T, s: build_npy_plain(p, B, T, s, 2), "same, num_workers=2"),
    "npy_dataset_helper_w0": (lambda p, B, T, s: build_npy_helper(p, B, T, s, 0, "windows"), 'make_dataloaders, mode="windows" (default usage), workers=0'),
    "npy_dataset_helper_w2": (lambda p, B, T, s: build_npy_helper(p, B, T, s, 2, "windows"), 'make_dataloaders, mode="windows", workers=2'),
    "npy_dataset_batch_sampler_w0": (lambda p, B, T, s: build_npy_batch_sampler(p, B, T, s, 0), 'torch DataLoader(batch_sampler=EpochSampler(batch_size=B)), collate_windows, workers=0'),
    "npy_dataset_helper_random_w0": (lambda p, B, T, s: build_npy_helper(p, B, T, s, 0, "random"), 'make_dataloaders, mode="random", workers=0'),
    "npy_dataset_helper_random_w2": (lambda p, B, T, s: build_npy_helper(p, B, T, s, 2, "random"), 'make_dataloaders, mode="random", workers=2'),
    "ipc_floor_w2": (lambda p, B, T, s: build_ipc_floor(p, B, T, s, 2), "reference: a dataset that only returns two fresh zero int64 (B,T) tensors, workers=2"),
}


def check_batch(name: str, batch: Any, B: int, T: int) -> None:
    x, y = batch
    for t in (x, y):
        if t.dtype != torch.int64 or tuple(t.shape) != (B, T):
            raise AssertionError(f"{name}: got {t.dtype} {tuple(t.shape)}, expected int64 ({B}, {T})")
    if not torch.equal(x[:, 1:], y[:, :-1]):
        raise AssertionError(f"{name}: y is not x shifted by one")
    if int(x.min()) < 0 or int(x.max()) >= VOCAB:
        raise AssertionError(f"{name}: ids outside [0, {VOCAB})")


# ------------------------------------------------------------------------------ other load
# The machine may be shared (tests, notebooks): measure how much CPU others used during each timed
# window, wait for a quiet machine before each entry, and re-run an entry that was disturbed.

_TICK = os.sysconf("SC_CLK_TCK")


def _system_busy_ticks() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4]  # everything but idle and iowait


def _process_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total


def _our_pids(next_batch: Any) -> list[int]:
    """This process and the DataLoader workers behind next_batch, if any."""
    workers = getattr(getattr(next_batch, "it", None), "_workers", None) or []
    return [os.getpid()] + [w.pid for w in workers if w.pid is not None]


def wait_quiet(max_wait: float, threshold: float = 0.15, sample: float = 0.5) -> float:
    """Wait (up to max_wait s) until other processes use < threshold cores; returns seconds waited."""
    if max_wait <= 0:
        return 0.0
    t0 = time.perf_counter()
    while True:
        b0, o0 = _system_busy_ticks(), _process_ticks([os.getpid()])
        time.sleep(sample)
        other = (_system_busy_ticks() - b0 - (_process_ticks([os.getpid()]) - o0)) / _TICK / sample
        if other < threshold or time.perf_counter() - t0 >= max_wait:
            return time.perf_counter() - t0


def measure(name: str, builder: Callable, path: Path, B: int, T: int, seconds: float, warmup: float, seed: int) -> dict[str, Any]:
    """Steady-state tokens/s of one entry, consumed like `for x, y in loader`: each batch stays
    referenced until the next one has been produced (this matters for malloc's reuse of memory)."""
    gc.collect()
    t_build = time.perf_counter()
    next_batch, cleanup = builder(path, B, T, seed)
    try:
        batch = next_batch()  # worker start-up (if any) happens here: not timed
        startup_s = time.perf_counter() - t_build
        check_batch(name, batch, B, T)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < warmup:
            batch = next_batch()
        epochs_before = getattr(next_batch, "epochs", 1)
        faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        pids = _our_pids(next_batch)
        busy0, ours0 = _system_busy_ticks(), _process_ticks(pids)
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            batch = next_batch()
            n += 1
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
        other = (_system_busy_ticks() - busy0 - (_process_ticks(pids) - ours0)) / _TICK / elapsed
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults_before
        new_epochs = getattr(next_batch, "epochs", 1) - epochs_before
        del batch
    finally:
        if cleanup is not None:
            cleanup()
        del next_batch
        gc.collect()
    return {
        "entry": name, "B": B, "T": T, "tokens_per_s": n * B * T / elapsed, "batches": n,
        "seconds": round(elapsed, 3), "us_per_batch": round(1e6 * elapsed / max(n, 1), 2),
        "startup_s": round(startup_s, 3), "epochs_started_while_timed": new_epochs,
        "minor_faults_per_batch": round(faults / max(n, 1), 1),  # this process only (not workers)
        "other_cores_busy": round(max(other, 0.0), 2),  # CPU used by other processes while timed
    }  # fmt: skip


def measure_isolated(name: str, path: Path, B: int, T: int, seconds: float, warmup: float, seed: int) -> dict[str, Any]:
    """measure() in a fresh interpreter, so no entry inherits another's heap or mappings."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_one", name, str(B), str(T), "--_path", str(path),
           "--seconds", str(seconds), "--warmup", str(warmup), "--seed", str(seed)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} B={B} T={T} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ memory


def private_memory(exclude: Path | None = None) -> dict[str, float]:
    """Private (unique) memory of this process in MB from /proc/self/smaps.

    uss_mb counts Private_Clean + Private_Dirty of every mapping except the token file's: a page of
    the file mapped by this process alone shows up as Private_Clean, yet it is the shared page
    cache, which the kernel can drop at any time; it is reported on its own as token_file_rss_mb.
    """
    exclude_s = str(exclude.resolve()) if exclude is not None else None
    total = excluded = file_rss = anon = 0
    current = ""
    with open("/proc/self/smaps") as f:
        for line in f:
            key, _, rest = line.partition(" ")
            if not key.endswith(":"):  # a mapping header: address perms offset dev inode [path]
                parts = line.split(None, 5)
                current = parts[5].strip() if len(parts) == 6 else ""
                continue
            if key in ("Private_Clean:", "Private_Dirty:"):
                kb = int(rest.split()[0])
                total += kb
                if current == exclude_s:
                    excluded += kb
            elif key == "Rss:" and current == exclude_s:
                file_rss += int(rest.split()[0])
            elif key == "Anonymous:":
                anon += int(rest.split()[0])
    return {
        "uss_mb": round((total - excluded) / 1024, 2),
        "uss_incl_token_file_mb": round(total / 1024, 2),
        "token_file_rss_mb": round(file_rss / 1024, 2),
        "anonymous_mb": round(anon / 1024, 2),
    }


def memory_check(path: Path, batches: int, B: int = 12, T: int = 512, mode: str = "windows") -> dict[str, Any]:
    """Private memory before and after `batches` batches of the helper path with num_workers=0."""
    gc.collect()
    before_loader = private_memory(path)
    ds = npy_datasets.NpyTokensDataset(path, T, mode=mode, seed=0)
    ds_val = npy_datasets.NpyTokensDataset(path, T, mode="windows")
    train_loader, _ = npy_datasets.make_dataloaders(ds, ds_val, batch_size=B, num_workers=0)
    it = iter(train_loader)
    for _ in range(100):
        next(it)
    done, epochs = 100, 1
    gc.collect()
    before = private_memory(path)
    checkpoints = {done: before["uss_mb"]}
    every = max(batches // 4, 1)
    t0 = time.perf_counter()
    batch = None
    while done < batches:
        try:
            batch = next(it)  # held until the next one, like a for loop
        except StopIteration:
            it = iter(train_loader)  # next epoch, as a training loop would
            epochs += 1
            continue
        done += 1
        if done % every == 0:
            checkpoints[done] = private_memory(path)["uss_mb"]
    elapsed = time.perf_counter() - t0
    del batch
    gc.collect()
    after = private_memory(path)
    del it
    return {
        "path": f"make_dataloaders(num_workers=0), mode={mode!r}", "B": B, "T": T, "batches": done,
        "epochs_started": epochs, "seconds": round(elapsed, 2),
        "before_loader": before_loader, "before": before, "after": after,
        "uss_growth_mb": round(after["uss_mb"] - before["uss_mb"], 2), "uss_mb_at_batch": checkpoints,
        "pickle_bytes_module_dataset": len(pickle.dumps(ds)),
        "pickle_bytes_original_dataset": len(pickle.dumps(OriginalTutorialDataset(path, T))),
    }  # fmt: skip


# ------------------------------------------------------------------------------ GPU transfer


def gpu_transfer(path: Path, configs, iters: int = 200, device: str = "cuda") -> dict[str, Any]:
    """Host-to-device bytes and time per batch: int64 x and y vs one compact uint16 (B, T+1) block.

    (device="cpu" only exercises the code path; pinned memory is tried on CUDA only.)
    """
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("\n--gpu: skipped (torch.cuda.is_available() is False on this machine)")
        return {"skipped": "torch.cuda.is_available() is False"}
    is_cuda = dev.type == "cuda"

    def sync():
        if is_cuda:
            torch.cuda.synchronize()

    data = np.asarray(np.load(path, mmap_mode="r"))
    rng = np.random.default_rng(0)
    rows = []

    def widen(d: torch.Tensor) -> torch.Tensor:
        try:
            return d.to(torch.int64)  # uint16 -> int64 on the device
        except (RuntimeError, TypeError):  # a torch without uint16 kernels: reinterpret and mask
            return d.view(torch.int16).to(torch.int64) & 0xFFFF

    for B, T in configs:
        buf = np.empty((B, T + 1), dtype=np.uint16)
        for b, s in enumerate(rng.integers(0, len(data) - T, size=B).tolist()):
            buf[b] = data[s : s + T + 1]
        wide = torch.from_numpy(buf).to(torch.int64)
        x64, y64 = wide[:, :-1].contiguous(), wide[:, 1:].contiguous()  # what the loaders hand over
        compact = torch.from_numpy(buf)
        for pinned in (False, True) if is_cuda else (False,):
            hx, hy, hc = (t.pin_memory() if pinned else t for t in (x64, y64, compact))

            def int64_path():
                return hx.to(dev, non_blocking=pinned), hy.to(dev, non_blocking=pinned)

            def uint16_path():
                w = widen(hc.to(dev, non_blocking=pinned))
                return w[:, :-1], w[:, 1:]

            ref = int64_path()
            got = uint16_path()
            sync()
            assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1]), "uint16 path differs"
            for name, fn, nbytes in (
                ("int64_on_host", int64_path, x64.nbytes + y64.nbytes),
                ("uint16_widened_on_device", uint16_path, compact.nbytes),
            ):
                for _ in range(10):
                    fn()
                sync()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                sync()
                per = (time.perf_counter() - t0) / iters
                rows.append({"B": B, "T": T, "pinned": pinned, "path": name, "bytes_per_batch": nbytes,
                             "us_per_batch": round(per * 1e6, 2), "GB_per_s": round(nbytes / per / 1e9, 2)})
    name = torch.cuda.get_device_name(dev) if is_cuda else str(dev)
    print(f"\nHost->device per batch on {name} ({iters} iterations each):")
    print(f"{'B':>4} {'T':>5} {'pinned':>6}  {'path':<26} {'bytes/batch':>12} {'us/batch':>9} {'GB/s':>6}")
    for r in rows:
        print(f"{r['B']:>4} {r['T']:>5} {str(r['pinned']):>6}  {r['path']:<26} {r['bytes_per_batch']:>12,} "
              f"{r['us_per_batch']:>9.1f} {r['GB_per_s']:>6.2f}")
    return {"device": name, "iters": iters, "rows": rows}


# ------------------------------------------------------------------------------ report


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    module = ROOT / "python_files" / "npy_datasets.py"
    return {
        "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu, "platform": platform.platform(), "python": platform.python_version(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "numpy": np.__version__,
        "npy_datasets_sha256": hashlib.sha256(module.read_bytes()).hexdigest()[:16],
    }  # fmt: skip


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {(r["B"], r["T"]): r["tokens_per_s"] for r in rows if r["entry"] == "nanogpt_get_batch"}
    floor: dict[tuple[int, int], float] = {}  # the faster of the two widenings, per config
    for r in rows:
        if r["entry"] in ("floor", "floor_np_astype"):
            key = (r["B"], r["T"])
            floor[key] = max(floor.get(key, 0.0), r["tokens_per_s"])
    for r in rows:
        key = (r["B"], r["T"])
        r["ratio_nanogpt"] = round(r["tokens_per_s"] / base[key], 3) if key in base else None
        r["ratio_floor"] = round(r["tokens_per_s"] / floor[key], 3) if key in floor else None


def check_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The project's throughput targets, evaluated per config."""
    by = {(r["entry"], r["B"], r["T"]): r for r in rows}
    out = []

    def target(what, entry, key, threshold, against=None):
        for B, T in sorted({(r["B"], r["T"]) for r in rows}):
            r = by.get((entry, B, T))
            if r is None:
                continue
            if against is None:
                value = r[key]
            else:
                other = by.get((against, B, T))
                if other is None:
                    continue
                value = round(r["tokens_per_s"] / other["tokens_per_s"], 3)
            if value is not None:
                out.append({"target": what, "entry": entry, "B": B, "T": T, "value": value,
                            "threshold": threshold, "met": value >= threshold})

    for mode in ("", "_random"):
        target(">= 8x nanogpt", f"npy_dataset_helper{mode}_w0", "ratio_nanogpt", 8.0)
        target(">= 0.6x floor", f"npy_dataset_helper{mode}_w0", "ratio_floor", 0.6)
        target(">= 2x original_dataset_w2", f"npy_dataset_helper{mode}_w2", None, 2.0, "original_dataset_w2")
    target(">= 2.5x nanogpt", "npy_dataset_plain_w0", "ratio_nanogpt", 2.5)
    target(">= 2x original_dataset_w2", "npy_dataset_plain_w2", None, 2.0, "original_dataset_w2")
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'entry':<30} {'B':>3} {'T':>5} {'tokens/s':>13} {'us/batch':>9} {'batches':>7} "
          f"{'x nanogpt':>9} {'x floor':>7} {'faults/b':>8} {'other':>5}")
    for r in rows:
        rn = f"{r['ratio_nanogpt']:.2f}" if r["ratio_nanogpt"] is not None else "-"
        rf = f"{r['ratio_floor']:.2f}" if r["ratio_floor"] is not None else "-"
        mark = f" (+{r['epochs_started_while_timed']} epoch)" if r["epochs_started_while_timed"] else ""
        print(f"{r['entry']:<30} {r['B']:>3} {r['T']:>5} {r['tokens_per_s']:>13,.0f} {r['us_per_batch']:>9.1f} "
              f"{r['batches']:>7} {rn:>9} {rf:>7} {r['minor_faults_per_batch']:>8.1f} {r['other_cores_busy']:>5.2f}{mark}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 10M-token file, short time boxes (< 30 s)")
    ap.add_argument("--tokens", type=int, help="tokens in the generated file (default 100,000,000; quick 10,000,000)")
    ap.add_argument("--seconds", type=float, help="timed seconds per entry and round (default 2; quick 0.25)")
    ap.add_argument("--warmup", type=float, help="untimed seconds per entry after the first batch (default 0.5; quick 0.1)")
    ap.add_argument("--entries", nargs="*", choices=list(ENTRIES), help="only these entries (nanogpt_get_batch and floor are always run for the ratios)")
    ap.add_argument("--mem-batches", type=int, help="batches for the memory check (default 20,000; quick 2,000; 0 skips)")
    ap.add_argument("--gpu", action="store_true", help="also time host->device transfer (needs CUDA; skipped otherwise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=RESULTS_DIR / "loader.json", help="output JSON (default: benchmarks/results/loader.json)")
    ap.add_argument("--max-wait", type=float, help="seconds to wait for a quiet machine before each entry (default 60; quick 0)")
    ap.add_argument("--max-other", type=float, default=0.2,
                    help="re-run an entry if other processes used more cores than this while it was timed")
    ap.add_argument("--tries", type=int, help="most runs per entry when disturbed (default 3; quick 1)")
    ap.add_argument("--rounds", type=int, help="interleaved rounds over all entries; the best is reported (default 2; quick 1)")
    ap.add_argument("--in-process", action="store_true",
                    help="run every entry in this process (the default for --quick) instead of one fresh process each")
    ap.add_argument("--_one", nargs=3, metavar=("ENTRY", "B", "T"), help=argparse.SUPPRESS)
    ap.add_argument("--_path", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._one:  # child of measure_isolated(): one entry, one JSON line
        name, B, T = args._one[0], int(args._one[1]), int(args._one[2])
        r = measure(name, ENTRIES[name][0], args._path, B, T, args.seconds, args.warmup, args.seed)
        print(json.dumps(r))
        return
    n_tokens = args.tokens or (10_000_000 if args.quick else 100_000_000)
    seconds = args.seconds if args.seconds is not None else (0.25 if args.quick else 2.0)
    warmup = args.warmup if args.warmup is not None else (0.1 if args.quick else 0.5)
    args.max_wait = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 60.0)
    args.tries = args.tries if args.tries is not None else (1 if args.quick else 3)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 2)
    mem_batches = args.mem_batches if args.mem_batches is not None else (2_000 if args.quick else 20_000)
    always = ("nanogpt_get_batch", "floor", "floor_np_astype")
    names = list(ENTRIES) if not args.entries else [n for n in ENTRIES if n in args.entries or n in always]

    t_start = time.perf_counter()
    info = machine_info()
    print(f"machine: {info['cores_usable']} cores ({info['cpu']}), torch {info['torch']} "
          f"({info['torch_threads']} threads), numpy {info['numpy']}, {info['date']}")
    isolate = not (args.quick or args.in_process)
    size = f"{n_tokens // 1_000_000}M" if n_tokens % 1_000_000 == 0 else str(n_tokens)
    path = BENCH_DIR / f"tokens_{size}_uint16.npy"
    gen = ensure_token_file(path, n_tokens, seed=args.seed)
    warm_s = warm_page_cache(path)
    print(f"token file: data/bench/{path.name} ({n_tokens:,} tokens, {path.stat().st_size / 2**20:.0f} MiB, "
          f"{'generated in %.1f s' % gen['generate_s'] if gen['generated'] else 'reused'}; page cache warmed in {warm_s:.2f} s)")
    print(f"timing: {args.rounds} interleaved round(s), best kept; fresh iterator per entry; first batch (worker start-up) and {warmup} s warm-up untimed; "
          f"then {seconds} s of steady-state batches, each held until the next arrives (like a for loop); "
          f"tokens counted as B*T per batch (x only); "
          f"{'each entry in a fresh process' if isolate else 'all entries in this process'}")

    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for round_ in range(1, args.rounds + 1):  # interleaved rounds: slow drifts of the machine hit every entry
        for B, T in CONFIGS:
            for name in names:
                waited, tries = 0.0, []
                for _ in range(args.tries):  # re-run an entry that other processes disturbed
                    waited += wait_quiet(args.max_wait)
                    if isolate:
                        tries.append(measure_isolated(name, path, B, T, seconds, warmup, args.seed))
                    else:
                        tries.append(measure(name, ENTRIES[name][0], path, B, T, seconds, warmup, args.seed))
                    if tries[-1]["other_cores_busy"] <= args.max_other:
                        break
                r = min(tries, key=lambda t: t["other_cores_busy"])
                r["attempts"], r["waited_for_quiet_s"], r["round"] = len(tries), round(waited, 1), round_
                runs.setdefault((name, B, T), []).append(r)
                print(f"  round {round_} {name:<30} B={B:<3} T={T:<5} {r['tokens_per_s']:>13,.0f} tokens/s "
                      f"({r['batches']} batches, start-up {r['startup_s']:.2f} s, other load {r['other_cores_busy']:.2f} "
                      f"cores, {r['attempts']} tr{'y' if r['attempts'] == 1 else 'ies'})", flush=True)
    rows = []
    for done in runs.values():  # the best round of each entry, with every round's figure kept
        best = dict(max(done, key=lambda r: r["tokens_per_s"]))
        best["tokens_per_s_all_rounds"] = [round(r["tokens_per_s"]) for r in done]
        rows.append(best)
    add_ratios(rows)
    print_table(rows)
    print("x floor: ratio to the faster of floor / floor_np_astype at the same (B, T); "
          "faults/b: minor page faults per batch in the consuming process (workers not counted); "
          "other: cores used by other processes while the entry was timed")
    targets = check_targets(rows)
    print("\nTargets:")
    for t in targets:
        print(f"  {'MET   ' if t['met'] else 'MISSED'} {t['entry']:<30} B={t['B']:<3} T={t['T']:<5} "
              f"{t['value']:>6.2f} (target {t['target']})")

    memory = None
    if mem_batches > 0:
        memory = memory_check(path, mem_batches)
        print(f"\nMemory, {memory['path']}, B={memory['B']} T={memory['T']}, {memory['batches']:,} batches "
              f"({memory['epochs_started']} epoch(s), {memory['seconds']} s):")
        print(f"  private memory (USS, token file excluded): {memory['before']['uss_mb']:.1f} MB after 100 "
              f"warm-up batches -> {memory['after']['uss_mb']:.1f} MB after {memory['batches']:,}: "
              f"growth {memory['uss_growth_mb']:+.2f} MB")
        print("  USS (MB) at batch: " + ", ".join(f"{k:,}: {v:.1f}" for k, v in memory["uss_mb_at_batch"].items()))
        print(f"  token file mapping resident (shared page cache, not counted): "
              f"{memory['before']['token_file_rss_mb']:.1f} -> {memory['after']['token_file_rss_mb']:.1f} MB")
        print(f"  USS before the loader was built: {memory['before_loader']['uss_mb']:.1f} MB")
        print(f"  len(pickle.dumps(ds)): {memory['pickle_bytes_module_dataset']} bytes "
              f"(original tutorial Dataset: {memory['pickle_bytes_original_dataset']} bytes)")

    gpu = gpu_transfer(path, CONFIGS) if args.gpu else None
    total = time.perf_counter() - t_start
    print(f"\ntotal run time {total:.0f} s")
    report = {
        "machine": info,
        "token_file": {"file": f"data/bench/{path.name}", "n_tokens": n_tokens, "dtype": "uint16",
                       "size_bytes": path.stat().st_size, **gen, "page_cache_warm_s": round(warm_s, 2)},
        "settings": {"quick": args.quick, "rounds": args.rounds, "seconds_per_entry": seconds, "warmup_s": warmup, "seed": args.seed,
                     "configs": [list(c) for c in CONFIGS],
                     "isolated": isolate,
                     "timing": "fresh iterator per entry; worker start-up (first batch) and warm-up excluded; "
                               "each batch held until the next arrives; tokens = B*T per batch (x only)",
                     "helper_modes": "npy_dataset_helper_* use mode='windows' (EpochSampler shuffles windows); "
                                     "npy_dataset_helper_random_* use mode='random' (num_samples default)"},
        "entries": {n: ENTRIES[n][1] for n in names},
        "results": rows, "targets": targets, "memory": memory, "gpu": gpu, "total_run_s": round(total, 1),
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    try:
        shown = args.json.resolve().relative_to(ROOT)
    except ValueError:
        shown = args.json
    print(f"wrote {shown}")


if __name__ == "__main__":
    main()
