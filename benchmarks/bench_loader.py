#!/usr/bin/env python
"""Batches per second of the ways to serve (x, y) next-token batches from one memmapped token file,
this module's recommended path beside the module as it was before issue 25's rewrite (commit
a20e65e).

Every entry makes int64 x and y of shape (B, T), y being x shifted by one token, on the CPU, from one
uint16 .npy file of random GPT-2 ids under data/bench/ (made once, then reused). The old module is
read from git (`git show a20e65e:python_files/npy_datasets.py`) into a temporary folder and imported
under another name, so both run in one process on the same file. Entries take turns, repeat by
repeat, so that a busy moment of the machine falls on all of them; each result is the median.

    python benchmarks/bench_loader.py            # about 5 minutes on 2 cores
    python benchmarks/bench_loader.py --quick    # under a minute, a 10M-token file
    python benchmarks/bench_loader.py --gpu      # also host-to-device copies and GPT steps on a CUDA GPU
    python benchmarks/bench_loader.py --shards   # also 200 shuffled shards, MAX_OPEN_FILES 64 against the default
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch.utils.data import DataLoader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python_files"))
import npy_datasets as nd  # noqa: E402 (after the sys.path line above: the module under test)

OLD_COMMIT = "a20e65e"  # the module before issue 25's rewrite (numpy reads .npy, one writer)
CONFIGS = ((12, 512), (12, 1024), (64, 2048))


def token_file(n_tokens: int) -> Path:
    """A .npy of n_tokens random uint16 ids below 50,257, written once and reused."""
    path = ROOT / "data" / "bench" / f"random_{n_tokens}.npy"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, np.random.default_rng(0).integers(0, 50257, n_tokens, dtype=np.uint16))
    np.load(path, mmap_mode="r").sum()  # warm the page cache: every entry reads from memory
    return path


def old_module(commit: str = OLD_COMMIT) -> Any | None:
    """npy_datasets.py as of commit, imported as old_npy_datasets; None where git cannot give it."""
    try:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{commit}:python_files/npy_datasets.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"old module: not available ({e}); its rows are left out")
        return None
    path = Path(tempfile.mkdtemp()) / "old_npy_datasets.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_npy_datasets", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["old_npy_datasets"] = module  # a @dataclass looks its module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def endless(make_loader: Callable[[], Any], finish: Callable = lambda b: b) -> Callable[[], Any]:
    """next() over a loader, starting the next epoch when one ends."""
    loader = make_loader()
    it = iter(loader)

    def next_batch():
        nonlocal it
        try:
            return finish(next(it))
        except StopIteration:
            it = iter(loader)
            return finish(next(it))

    return next_batch


def entries(path: Path, B: int, T: int, old: Any | None) -> dict[str, Callable[[], Any]]:
    """name -> a function that returns the next (x, y) batch."""
    data = np.asarray(np.load(path, mmap_mode="r"))
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    buf = np.empty((B, T + 1), dtype=np.uint16)

    def nanogpt():  # nanoGPT's get_batch (train.py), less the device copy; the memmap is remade per batch
        mm = np.memmap(path, dtype=np.uint16, mode="r", offset=128)
        ix = torch.randint(len(mm) - T, (B,), generator=gen)
        x = torch.stack([torch.from_numpy(mm[i : i + T].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(mm[i + 1 : i + 1 + T].astype(np.int64)) for i in ix])
        return x, y

    def floor():  # the least work for the same batch: B slice copies into one buffer, one widening
        for b, s in enumerate(rng.integers(0, len(data) - T, size=B).tolist()):
            buf[b] = data[s : s + T + 1]
        wide = buf.astype(np.int64)
        return torch.from_numpy(wide[:, :-1]), torch.from_numpy(wide[:, 1:])

    new = nd.NpyTokensDataset(path, T)
    rand = nd.NpyTokensDataset(path, T, mode="random")
    found = {
        "nanogpt_get_batch": nanogpt,
        "floor": floor,
        "new make_dataloaders w0": endless(
            lambda: nd.make_dataloaders(new, new, batch_size=B)[0], lambda b: nd.to_device(b, "cpu")
        ),
        "new dataset, no DataLoader": endless(
            lambda: nd.EpochSampler(new, batch_size=B, drop_last=True), new.__getitem__
        ),
        "new make_dataloaders w2": endless(
            lambda: nd.make_dataloaders(new, new, batch_size=B, num_workers=2)[0]
        ),
        "new random mode w0": endless(lambda: nd.make_dataloaders(rand, rand, batch_size=B)[0]),
        "new plain DataLoader w0": endless(
            lambda: DataLoader(new, batch_size=B, shuffle=True, drop_last=True)
        ),
    }
    if old is not None:
        before = old.NpyTokensDataset(path, T)
        found["old make_dataloaders w0"] = endless(
            lambda: old.make_dataloaders(before, before, batch_size=B)[0],
            lambda b: old.to_device(b, "cpu"),
        )
        found["old dataset, no DataLoader"] = endless(
            lambda: old.EpochSampler(before, batch_size=B, drop_last=True), before.__getitem__
        )
    return found


def per_batch(next_batch: Callable[[], Any], B: int, T: int, seconds: float) -> float:
    """Microseconds per batch over a time box, after a warm-up; checks every batch's shape."""
    for _ in range(20):
        x, y = next_batch()
    assert (
        x.shape == y.shape == (B, T) and x.dtype == torch.int64 and torch.equal(x[:, 1:], y[:, :-1])
    )
    count, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        x, y = next_batch()
        count += 1
    return elapsed / count * 1e6


def gpu_transfer(B: int, T: int, iters: int = 200) -> None:
    """Per batch: int64 x, y pinned and copied non_blocking, against uint16 ids copied then widened there."""
    compact = torch.randint(0, 50257, (B, T + 1), dtype=torch.int32).to(torch.uint16).pin_memory()
    wide = compact.to(torch.int64)
    x64, y64 = wide[:, :-1].contiguous().pin_memory(), wide[:, 1:].contiguous().pin_memory()
    paths = {
        "int64 pinned, non_blocking": lambda: (
            x64.to("cuda", non_blocking=True),
            y64.to("cuda", non_blocking=True),
        ),
        "uint16 copied, widened on the GPU": lambda: compact.to("cuda", non_blocking=True).to(
            torch.int64
        ),
    }
    for name, move in paths.items():
        for _ in range(10):
            move()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            move()
        torch.cuda.synchronize()
        print(f"  ({B}, {T}) {name}: {(time.perf_counter() - start) / iters * 1e6:.1f} us/batch")


GPT_SIZES = ((2, 128), (6, 384), (12, 768))  # (layers, width): a tiny GPT up to GPT-2 small


class GPT(torch.nn.Module):
    """A GPT from torch's own layers (as notebook 06 builds it): embeddings, causal pre-norm encoder
    layers with heads of 64, a final LayerNorm and an output layer tied to the token embedding."""

    def __init__(self, layers: int, width: int, T: int) -> None:
        super().__init__()
        self.tokens = torch.nn.Embedding(50257, width)
        self.positions = torch.nn.Embedding(T, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, width // 64, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(width)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(T)
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions.weight[: x.shape[1]]
        h = self.blocks(h, mask=self.causal, is_causal=True)
        return self.norm(h) @ self.tokens.weight.T


def gpu_step_rate(path: Path, layers: int, width: int, B: int = 12, T: int = 1024) -> None:
    """A GPT training step (bf16 autocast, AdamW) fed by make_dataloaders + to_device, against the
    same step on batches already on the GPU. Blocks of 10 steps take turns, with one synchronize at
    the end of each block, as a loop that reads the loss every few steps lets the CPU run ahead."""
    torch.manual_seed(0)
    model = GPT(layers, width, T).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ds = nd.NpyTokensDataset(path, T)
    loader = endless(lambda: nd.make_dataloaders(ds, batch_size=B)[0])
    staged = [nd.to_device(loader(), "cuda") for _ in range(10)]

    def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
        x, y = nd.to_device(batch, "cuda")  # a no-op for the staged batches
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def block(batches: Iterable[Any]) -> float:
        """Seconds a step over 10 steps; the batches are made inside the timed loop."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / 10

    times: dict[str, list[float]] = {"loader": [], "on the GPU": []}
    for turn in range(10):  # the first two turns warm up kernels and the loader
        fed = block(loader() for _ in range(10))
        held = block(staged)
        if turn >= 2:
            times["loader"].append(fed)
            times["on the GPU"].append(held)
    fed, held = (statistics.median(t) * 1e3 for t in times.values())
    weights = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"  {layers} x {width} ({weights:.0f}M weights), batch {B} x {T}: {fed:.2f} ms a step fed "
        f"by the loader, {held:.2f} ms on batches already there: {held / fed:.3f} of that rate"
    )


def shard_cap(repeats: int, seconds: float) -> None:
    """Per batch of 32 x 1024 from 50 or 200 shuffled 100k-token shards (no DataLoader): MAX_OPEN_FILES at 64
    against the default. Below the shard count, maps are closed and reopened batch after batch."""
    paths = [ROOT / "data" / "bench" / "shards" / f"shard_{i:06d}.npy" for i in range(200)]
    for i, path in enumerate(paths):
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, np.random.default_rng(i).integers(0, 50257, 100_000, dtype=np.uint16))
    default, times = nd.MAX_OPEN_FILES, {}
    for _ in range(repeats):
        for n in (50, 200):
            for cap in (64, default):
                nd.MAX_OPEN_FILES, ds = cap, nd.NpyTokensDataset(paths[:n], 1024)
                sampler = nd.EpochSampler(ds, batch_size=32, drop_last=True)
                times.setdefault((n, cap), []).append(
                    per_batch(endless(lambda: sampler, ds.__getitem__), 32, 1024, seconds)
                )
    nd.MAX_OPEN_FILES = default
    for (n, cap), t in times.items():
        print(f"  {n} shards, MAX_OPEN_FILES={cap}: {statistics.median(t):.1f} us/batch")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="a 10M-token file and short time boxes"
    )
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="also the two host-to-device copies and a GPT step with and without the loader",
    )
    parser.add_argument(
        "--shards",
        action="store_true",
        help="also time 200 shuffled shards, MAX_OPEN_FILES 64 vs default",
    )
    parser.add_argument("--old", default=OLD_COMMIT, help=f"the old module's commit ({OLD_COMMIT})")
    parser.add_argument(
        "--repeats", type=int, default=None, help="turns per entry (default 5, quick 2)"
    )
    args = parser.parse_args()
    path = token_file(10_000_000 if args.quick else 100_000_000)
    repeats, seconds = args.repeats or (2 if args.quick else 5), 0.5 if args.quick else 2.0
    old = old_module(args.old)
    print(
        f"torch {torch.__version__}, numpy {np.__version__}, {path.name}, {repeats} turns of {seconds} s each"
    )
    print(
        f"{'entry':<26} {'B':>3} {'T':>5} {'us/batch':>9} {'Mtok/s':>7} {'x nanogpt':>9} {'x floor':>8}"
    )
    for B, T in CONFIGS:
        found = entries(path, B, T, old)
        times: dict[str, list[float]] = {name: [] for name in found}
        for _ in range(repeats):
            for name, next_batch in found.items():
                times[name].append(per_batch(next_batch, B, T, seconds))
        median = {name: statistics.median(t) for name, t in times.items()}
        for name, us in median.items():
            print(
                f"{name:<26} {B:>3} {T:>5} {us:>9.1f} {B * T / us:>7.1f} {median['nanogpt_get_batch'] / us:>9.2f} "
                f"{median['floor'] / us:>8.2f}"
            )
        if old is not None:
            pairs = {
                "make_dataloaders, 0 workers": (
                    "old make_dataloaders w0",
                    "new make_dataloaders w0",
                ),
                "the dataset without a DataLoader": (
                    "old dataset, no DataLoader",
                    "new dataset, no DataLoader",
                ),
            }
            for what, (before, after) in pairs.items():
                ratio = median[before] / median[after]
                spread = [o / n for o, n in zip(times[before], times[after])]
                print(
                    f"  new / old speed, {what}: {ratio:.2f}x "
                    f"(turn by turn {min(spread):.2f}x to {max(spread):.2f}x)"
                )
            print()
    if args.shards:
        print("Shards (batches of 32 x 1024, shuffled, no DataLoader):")
        shard_cap(repeats, seconds)
    if args.gpu:
        if not torch.cuda.is_available():
            print("--gpu: no CUDA device on this machine")
        else:
            print(f"Host to device on {torch.cuda.get_device_name()}:")
            for B, T in CONFIGS:
                gpu_transfer(B, T)
            print("A GPT training step fed by the loader, against batches already on the GPU:")
            for layers, width in GPT_SIZES:
                gpu_step_rate(path, layers, width)


if __name__ == "__main__":
    main()
