"""Tests for "scale out": token file formats, many files per dataset, ranks, torchrun and resume.

Token files hold arange tokens (token i at position i, plus a different base per file), so every
window proves where it came from and a window that crossed a file or a row would show a jump.
"""

import json
import os
import pickle
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import npy_datasets as nd
import resume_worker
from conftest import ROOT, write_tokens

SUBPROCESS_TIMEOUT = 120  # seconds; a hung torchrun or resume process fails the test instead


def write_llmc(
    path: Path, tokens: np.ndarray, *, magic=None, version=None, count=None, extra=b""
) -> Path:
    """An llm.c / modded-nanogpt shard: 256 little-endian int32 words (magic, version, token count)
    then the tokens; v1 (magic 20240520) holds uint16, v7 (magic 20240801) uint32."""
    wide = tokens.dtype == np.uint32
    header = np.zeros(256, dtype="<i4")
    header[0] = (20240801 if wide else 20240520) if magic is None else magic
    header[1] = (7 if wide else 1) if version is None else version
    header[2] = len(tokens) if count is None else count
    path.write_bytes(
        header.tobytes() + tokens.astype(tokens.dtype.newbyteorder("<")).tobytes() + extra
    )
    return path


def test_an_unknown_llmc_magic_is_refused_even_with_a_dtype(tmp_path):
    eval_file = write_llmc(
        tmp_path / "hellaswag_val.bin", np.arange(100, dtype=np.uint16), magic=20240522
    )  # llm.c's eval files
    for dtype in (None, np.uint16):
        with pytest.raises(
            nd.TokenFileError, match="llm.c-like magic 20240522, which this loader does not read"
        ):
            nd.open_tokens(eval_file, dtype=dtype)


def test_a_raw_file_whose_sidecar_says_bin_is_never_read_as_llmc(tmp_path):
    magic = np.array([20240520], dtype="<i4").view("<u2")  # ids 55016 and 308 spell llm.c's magic
    tokens = np.concatenate(
        [magic, np.array([1, 0], dtype=np.uint16), np.arange(200, dtype=np.uint16)]
    )
    path = write_tokens(tmp_path / "train.bin", tokens)  # a sidecar with layout "bin", dtype uint16
    assert nd.open_tokens(path).tolist() == tokens.tolist()
    assert nd.NpyTokensDataset(path, 8)[0][0].tolist() == tokens[:8].tolist()


def assert_window_inside(
    x: torch.Tensor, y: torch.Tensor, sequences: list[tuple[int, int]]
) -> None:
    """x is seq_len consecutive tokens, y is x shifted by one, and both lie in one sequence [lo, hi)."""
    first = x[0].item()
    assert x.tolist() == list(range(first, first + len(x))) and y.tolist() == (x + 1).tolist()
    assert any(lo <= first and y[-1].item() < hi for lo, hi in sequences), (
        f"window at {first} crosses a boundary"
    )


def run_process(
    cmd: list[str], *, stdin: str | None = None, cwd=None
) -> subprocess.CompletedProcess:
    """Run cmd in its own process group; on a timeout kill the whole group (torchrun and its ranks)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(stdin, timeout=SUBPROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[:4]} did not finish in {SUBPROCESS_TIMEOUT} s (a hang?)\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# --- 1. formats --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_every_format_reads_back_the_same_tokens_and_windows(tmp_path, dtype):
    # ids near the top of the dtype: a signed or narrower read would change them
    tokens = (np.iinfo(dtype).max - 999 + np.arange(1000)).astype(dtype)
    llmc_name = "v1.bin" if dtype == np.uint16 else "v7.bin"
    files = {
        "npy + sidecar": (write_tokens(tmp_path / "side.npy", tokens), None),
        "npy alone": (write_tokens(tmp_path / "alone.npy", tokens, sidecar=False), None),
        "raw bin + dtype": (write_tokens(tmp_path / "train.bin", tokens, sidecar=False), dtype),
        "raw bin + sidecar": (write_tokens(tmp_path / "side.bin", tokens), None),
        "llm.c": (write_llmc(tmp_path / llmc_name, tokens), None),
        "llm.c + matching dtype": (tmp_path / llmc_name, dtype),
    }
    seq_len = 7
    expected = [
        tokens[i * seq_len : i * seq_len + seq_len + 1].astype(np.int64)
        for i in range(999 // seq_len)
    ]
    for name, (path, dt) in files.items():
        arr = nd.open_tokens(path, dt)
        assert arr.dtype == dtype and arr.shape == tokens.shape and np.array_equal(arr, tokens), (
            name
        )
        ds = nd.NpyTokensDataset(path, seq_len, dtype=dt)
        assert len(ds) == len(expected), name
        for i in (0, 1, len(ds) // 2, len(ds) - 1):
            x, y = ds[i]
            assert (
                x.tolist() == expected[i][:-1].tolist() and y.tolist() == expected[i][1:].tolist()
            ), (name, i)
        x, y = ds[list(range(len(ds)))]
        assert torch.equal(
            torch.cat([x, y[:, -1:]], dim=1), torch.from_numpy(np.stack(expected))
        ), name


def _refusal(path, dtype=None) -> str:
    with pytest.raises(nd.TokenFileError) as info:
        nd.open_tokens(path, dtype)
    with pytest.raises(nd.TokenFileError) as again:  # the dataset refuses it the same way
        nd.NpyTokensDataset(path, 4, dtype=dtype)
    assert str(again.value) == str(info.value) and Path(path).name in str(info.value)
    return str(info.value)


def test_bad_llmc_and_raw_files_are_refused_with_clear_messages(tmp_path):
    u16, u32 = np.arange(100, dtype=np.uint16), np.arange(100, dtype=np.uint32)
    assert "magic 20240520 goes with version 1, found 7" in _refusal(
        write_llmc(tmp_path / "a.bin", u16, version=7)
    )
    assert "magic 20240801 goes with version 7, found 1" in _refusal(
        write_llmc(tmp_path / "b.bin", u32, version=1)
    )
    short = write_llmc(tmp_path / "short.bin", u16)
    short.write_bytes(short.read_bytes()[:-2])  # one token missing
    assert (
        "declares 100 tokens of uint16 (1224 bytes with the header), but the file has 1222 bytes"
        in _refusal(short)
    )
    trailing = write_llmc(tmp_path / "trailing.bin", u32, extra=b"\0" * 4)
    assert (
        "declares 100 tokens of uint32 (1424 bytes with the header), but the file has 1428 bytes"
        in _refusal(trailing)
    )
    assert "declares 101 tokens" in _refusal(write_llmc(tmp_path / "count.bin", u16, count=101))
    assert "declares -5 tokens; a shard holds at least one" in _refusal(
        write_llmc(tmp_path / "negative.bin", u16, count=-5)
    )
    assert "declares 0 tokens; a shard holds at least one" in _refusal(
        write_llmc(tmp_path / "empty.bin", u16[:0])
    )
    head = write_llmc(tmp_path / "head.bin", u16)
    head.write_bytes(head.read_bytes()[:500])  # the header itself is cut short
    assert "truncated llm.c header: need 1024 bytes, file has 500" in _refusal(head)
    llmc = write_llmc(tmp_path / "ok.bin", u16)
    assert "is an llm.c shard of uint16 but dtype=uint32 was passed" in _refusal(llmc, np.uint32)
    npy = write_tokens(tmp_path / "ok.npy", u32, sidecar=False)
    assert "holds uint32 but dtype=uint16 was passed" in _refusal(npy, np.uint16)
    u16.tofile(tmp_path / "train.bin")
    assert "raw token file with no sidecar 'train.bin.json': pass dtype=np.uint16" in _refusal(
        tmp_path / "train.bin"
    )


# --- 2. many files ---------------------------------------------------------------------------

SEQ = 8
# name, first token, length: each file holds its own range of ids, so a crossing would show.
# part_b is too short for any window (5 < SEQ + 1) and sits between the others.
PARTS = [("part_a.npy", 0, 100), ("part_b.npy", 10_000, 5), ("part_c.npy", 20_000, 61)]
RANGES = [(base, base + n) for _, base, n in PARTS]


def write_parts(folder: Path, parts=PARTS, dtype=np.uint32) -> list[Path]:
    return [
        write_tokens(folder / name, np.arange(base, base + n, dtype=dtype))
        for name, base, n in parts
    ]


@pytest.mark.parametrize("how", ["list", "glob"])
def test_files_share_one_index_space_in_order(tmp_path, how):
    paths = write_parts(tmp_path)
    # "part_*" matches the sidecars too; they must be skipped
    ds = nd.NpyTokensDataset(paths if how == "list" else str(tmp_path / "part_*"), SEQ)
    assert ds.paths == [str(p) for p in paths]
    starts = [ds[i][0][0].item() for i in range(len(ds))]
    assert starts == [SEQ * i for i in range(12)] + [
        20_000 + SEQ * i for i in range(7)
    ]  # 99 // 8, 60 // 8
    for i in range(len(ds)):
        assert_window_inside(*ds[i], RANGES)
    summary = ds.file_summary()
    assert [
        (s["path"], s["tokens"], s["rows"], s["windows"], s["unused_tokens"]) for s in summary
    ] == [
        (str(paths[0]), 100, 1, 12, 3),  # 100 - (12 * 8 + 1)
        (str(paths[1]), 5, 1, 0, 5),  # too short: every token unused
        (str(paths[2]), 61, 1, 7, 4),  # 61 - (7 * 8 + 1)
    ]
    assert len(ds) == sum(s["windows"] for s in summary)
    rng = np.random.default_rng(1)
    keys = [
        (int(e), int(i))
        for e, i in zip(rng.integers(0, 3, 50), rng.integers(-len(ds), len(ds), 50))
    ]
    x, y = ds[keys]  # the batched path finds the same files
    assert torch.equal(x, torch.stack([ds[k][0] for k in keys])) and torch.equal(
        y, torch.stack([ds[k][1] for k in keys])
    )
    backwards = nd.NpyTokensDataset(
        [paths[2], paths[1], paths[0]], SEQ
    )  # the list's order, not the names'
    assert [backwards[i][0][0].item() for i in range(len(backwards))] == starts[12:] + starts[:12]


def test_epoch_offsets_and_two_d_rows_never_cross_a_boundary(tmp_path):
    paths = write_parts(tmp_path)
    ds = nd.NpyTokensDataset(paths, SEQ, epoch_offset=True, seed=3)
    assert len(ds) == (100 - SEQ) // SEQ + (61 - SEQ) // SEQ
    offsets = set()
    for epoch in range(12):
        x, y = ds[[(epoch, i) for i in range(len(ds))]]
        offsets.add(x[0, 0].item())
        for i in range(len(ds)):
            assert_window_inside(x[i], y[i], RANGES)
    assert len(offsets) > 1  # the epochs did move the windows
    rows = write_tokens(
        tmp_path / "rows.npy", np.arange(30_000, 30_060, dtype=np.uint32).reshape(3, 20)
    )
    row_ranges = [(30_000 + 20 * r, 30_020 + 20 * r) for r in range(3)]
    for mode, extra in (("windows", {}), ("random", {"num_samples": 400})):
        ds = nd.NpyTokensDataset([paths[0], rows], SEQ, mode=mode, **extra)
        x, y = ds[list(range(len(ds)))]
        for i in range(len(ds)):
            assert_window_inside(x[i], y[i], RANGES[:1] + row_ranges)
        if mode == "windows":
            assert x[12:, 0].tolist() == [
                30_000,
                30_008,
                30_020,
                30_028,
                30_040,
                30_048,
            ]  # 2 windows per row
            assert ds.file_summary()[1] == {
                "path": str(rows),
                "tokens": 60,
                "rows": 3,
                "windows": 6,
                "unused_tokens": 9,
            }


def test_bad_file_sets_are_refused(tmp_path):
    paths = write_parts(tmp_path)
    narrow = write_tokens(tmp_path / "narrow.npy", np.arange(50, dtype=np.uint16))
    with pytest.raises(
        nd.TokenFileError, match=r"'.*narrow\.npy' holds uint16 but '.*part_a\.npy' holds uint32"
    ):
        nd.NpyTokensDataset([paths[0], narrow], SEQ)
    with pytest.raises(
        FileNotFoundError, match=r"no token file matches the pattern '.*nothing_\*\.npy'"
    ):
        nd.NpyTokensDataset(str(tmp_path / "nothing_*.npy"), SEQ)
    with pytest.raises(TypeError, match="non-empty list"):
        nd.NpyTokensDataset([], SEQ)
    with pytest.raises(
        ValueError, match="none of the 2 files holds a window: the longest sequence has 61 tokens"
    ):
        nd.NpyTokensDataset([paths[1], paths[2]], 61)


def test_random_starts_spread_over_files_by_their_starts(tmp_path):
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=4000, seed=5)
    x, y = ds[list(range(len(ds)))]
    for i in range(len(ds)):
        assert_window_inside(x[i], y[i], RANGES)
    starts = x[:, 0].numpy()
    per_file = Counter((starts // 10_000).tolist())
    valid = [max(0, n - SEQ) for _, _, n in PARTS]  # starts per file: 92, 0, 53
    expected = len(ds) * valid[0] / sum(valid)
    sigma = (len(ds) * valid[0] / sum(valid) * valid[2] / sum(valid)) ** 0.5
    assert per_file[1] == 0 and abs(per_file[0] - expected) < 5 * sigma
    every_start = set(range(valid[0])) | set(range(20_000, 20_000 + valid[2]))
    assert set(starts.tolist()) == every_start  # each valid start, the last of each file included


def test_pickles_small_and_workers_give_the_same_batches(tmp_path):
    one = nd.NpyTokensDataset(
        write_tokens(tmp_path / "one.npy", np.arange(100_000, dtype=np.uint32)), SEQ
    )
    one[[0, 1]]  # open the memmap and build the tables first
    assert len(pickle.dumps(one)) < 1024
    paths = write_parts(tmp_path)
    ds = nd.NpyTokensDataset(paths, SEQ, mode="random", num_samples=60, seed=2)
    ds[0]
    ds.__getitems__([1, 2])
    blob = pickle.dumps(ds)
    assert len(blob) < 1024 + 300 * len(paths)  # paths and shapes, never the mapped data
    clone = pickle.loads(blob)
    assert clone._maps == {} and torch.equal(clone[(4, 7)][0], ds[(4, 7)][0])

    def batches(workers):
        sampler = nd.EpochSampler(ds, seed=1, batch_size=7)
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=workers)
        return [[x.tolist() for x, _ in loader] for _ in range(2)]

    reference = batches(0)
    assert len(reference[0]) == 9 and reference[0] != reference[1]
    assert batches(2) == reference


# --- 3. ranks, in one process ----------------------------------------------------------------


def one_epoch(sampler: nd.EpochSampler) -> tuple[list[tuple[int, int]], int]:
    """The (epoch, index) items a sampler yields for one epoch, and how many batches carried them."""
    items, batches = [], 0
    for got in sampler:
        if sampler.batch_size is None:
            items.append(got)
        else:
            batches += 1
            items.extend((got[0], int(i)) for i in got[1])
    return items, batches


@pytest.mark.parametrize(
    "batching", [None, (3, False), (3, True)], ids=["items", "batches", "drop_last"]
)
@pytest.mark.parametrize("remainder", ["drop", "pad"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_split_each_epoch_disjoint_and_complete(shuffle, remainder, batching):
    batch_size, drop_last = batching or (None, False)
    for n in (1, 2, 5, 8, 13, 37):
        whole = nd.EpochSampler(range(n), shuffle=shuffle, seed=11)
        orders = [
            [i for _, i in one_epoch(whole)[0]] for _ in range(2)
        ]  # world size 1: the epoch's order
        for world in range(1, 9):
            if (
                remainder == "drop" and n < world
            ):  # no rank would get a window: refused, not an empty epoch
                with pytest.raises(
                    ValueError, match=f'{n} windows for world_size={world}: with remainder="drop"'
                ):
                    nd.EpochSampler(range(n), world_size=world, rank=0, remainder=remainder)
                continue
            share = -(-n // world) if remainder == "pad" else n // world
            if (
                drop_last and share < batch_size
            ):  # not one whole batch per rank: refused, not an empty epoch
                with pytest.raises(
                    ValueError,
                    match=f"batch_size={batch_size} with drop_last=True leaves no batch: "
                    f"each of the {world} rank\\(s\\) gets {share} of the {n} windows",
                ):
                    nd.EpochSampler(
                        range(n),
                        batch_size=batch_size,
                        drop_last=True,
                        world_size=world,
                        rank=0,
                        remainder=remainder,
                    )
                continue
            ranks = [
                nd.EpochSampler(
                    range(n),
                    shuffle=shuffle,
                    seed=11,
                    batch_size=batch_size,
                    drop_last=drop_last,
                    world_size=world,
                    rank=r,
                    remainder=remainder,
                )
                for r in range(world)
            ]
            for epoch in range(2):
                got = [one_epoch(s) for s in ranks]
                items = [[i for _, i in g] for g, _ in got]
                assert {e for g, _ in got for e, _ in g} <= {epoch}
                assert (
                    len({len(mine) for mine in items}) == 1
                )  # every rank the same number of items
                assert len({b for _, b in got}) == 1 and (
                    batch_size is None or got[0][1] == len(ranks[0])
                )
                if batch_size is None:
                    assert len(items[0]) == len(ranks[0])
                share = -(-n // world) if remainder == "pad" else n // world
                if drop_last:
                    share -= share % batch_size
                assert len(items[0]) == share
                # rank r took items r, r + W, ... of the epoch's order, the same order as world size 1
                merged = [items[r][j] for j in range(share) for r in range(world)]
                expected = (orders[epoch] * world)[
                    : len(merged)
                ]  # pad repeats the epoch's first items
                assert merged == expected
                counts = Counter(merged)
                if remainder == "drop":
                    assert max(counts.values(), default=1) == 1
                    if not drop_last:
                        assert n - len(merged) == ranks[0].dropped == n % world
                else:
                    assert ranks[0].padded == -n % world
                    if not drop_last:
                        assert (
                            set(merged) == set(range(n))
                            and sum(c - 1 for c in counts.values()) == ranks[0].padded
                        )
        if n >= 5 and shuffle:
            assert orders[0] != orders[1] and sorted(orders[0]) == list(range(n))
        elif not shuffle:
            assert orders == [list(range(n))] * 2


def test_rank_batches_do_not_depend_on_workers(tmp_path):
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=50, seed=8)

    def rank_windows(rank, workers):
        sampler = nd.EpochSampler(
            ds, seed=4, batch_size=4, world_size=3, rank=rank, remainder="pad"
        )
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=workers)
        return [x[:, 0].tolist() for x, _ in loader]

    per_rank = [rank_windows(r, 0) for r in range(3)]
    assert [len(b) for b in per_rank] == [5, 5, 5]  # 17 items each: 4 batches of 4 and one of 1
    sampler = nd.EpochSampler(ds, seed=4, world_size=3, rank=1, remainder="pad")
    assert sum(per_rank[1], []) == [ds[key][0][0].item() for key in sampler]
    assert rank_windows(1, 2) == per_rank[1]


def test_make_dataloaders_with_explicit_ranks_split_train_and_pad_val(tmp_path):
    paths = write_parts(tmp_path)
    train, val = (
        nd.NpyTokensDataset(paths, SEQ),
        nd.NpyTokensDataset(paths[2], SEQ),
    )  # 19 and 7 windows
    seen = {"train": [], "val": []}
    for rank in range(3):
        loaders = nd.make_dataloaders(
            train, val, batch_size=2, num_workers=0, seed=1, world_size=3, rank=rank
        )
        for name, loader in zip(("train", "val"), loaders):
            seen[name].append([v for x, _ in loader for v in x[:, 0].tolist()])
    assert [len(t) for t in seen["train"]] == [6, 6, 6]  # 19 // 3 = 6 each, one window dropped
    assert len(set(sum(seen["train"], []))) == 18 and set(sum(seen["train"], [])) < {
        train[i][0][0].item() for i in range(19)
    }
    assert seen["val"] == [
        [20_000, 20_024, 20_048],
        [20_008, 20_032, 20_000],
        [20_016, 20_040, 20_008],
    ]


def test_distributed_sampler_indices_are_windows_of_epoch_zero(tmp_path):
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=40, seed=3)
    seen = []
    for rank in range(3):
        sampler = DistributedSampler(ds, num_replicas=3, rank=rank, shuffle=True, seed=0)
        sampler.set_epoch(
            1
        )  # a new order of the indices; each plain index is still epoch 0's window
        indices = list(sampler)
        x = torch.cat([x for x, _ in DataLoader(ds, batch_size=4, sampler=sampler)])
        epoch0, _ = ds[[(0, i) for i in indices]]
        epoch1, _ = ds[[(1, i) for i in indices]]
        assert torch.equal(x, epoch0) and not torch.equal(x, epoch1)
        seen += indices
    assert (
        sorted(set(seen)) == list(range(len(ds))) and len(seen) == 42
    )  # 40 windows, 2 repeated to fill 3 ranks


# --- 4. torchrun ------------------------------------------------------------------------------


def torchrun(
    tmp_path: Path, train: Path, val: Path, *extra: str
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "out"
    out.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(ROOT / "tests" / "ddp_worker.py"),
        "--out",
        str(out),
        "--train",
        str(train),
        "--val",
        str(val),
        "--seq-len",
        "8",
        "--batch-size",
        "5",
        "--seed",
        "3",
        *extra,
    ]
    proc = run_process(cmd, cwd=tmp_path)
    reports = [
        json.loads((out / f"rank{r}.json").read_text())
        for r in range(2)
        if (out / f"rank{r}.json").exists()
    ]
    return proc, reports


def test_torchrun_ranks_cover_the_epoch_disjointly(tmp_path):
    train = write_tokens(
        tmp_path / "train.npy", np.arange(205, dtype=np.uint16)
    )  # 204 // 8 = 25 windows
    val = write_tokens(tmp_path / "val.npy", np.arange(60, dtype=np.uint16))  # 59 // 8 = 7 windows
    proc, reports = torchrun(tmp_path, train, val)
    assert proc.returncode == 0 and len(reports) == 2, proc.stderr[-3000:]
    assert [r["rank"] for r in reports] == [0, 1] and {r["world_size"] for r in reports} == {2}
    ds = nd.NpyTokensDataset(train, 8)
    for report in reports:
        for key in ("train", "val", "distributed_sampler"):
            for row in report[key]:
                assert (
                    row == list(range(row[0], row[0] + 8)) and row[0] % 8 == 0
                )  # a whole window, in place
    train_seen = [[row[0] // 8 for row in r["train"]] for r in reports]
    assert [len(t) for t in train_seen] == [10, 10] and not set(train_seen[0]) & set(train_seen[1])
    # The documented drop: 25 windows, the epoch's last (25 % 2) dropped, then each rank's 12 cut
    # to whole batches of 5; rank r took items r, r + 2, ... of the epoch's order.
    order = [i for _, i in nd.EpochSampler(ds, seed=3)]
    assert set(train_seen[0]) | set(train_seen[1]) == set(order[:20])
    assert [train_seen[r][j] for j in range(10) for r in range(2)] == order[:20]
    assert (
        reports[0]["train_state"] == reports[1]["train_state"]
        and reports[0]["train_state"]["epoch"] == 1
    )
    val_seen = [[row[0] // 8 for row in r["val"]] for r in reports]
    assert val_seen == [[0, 2, 4, 6], [1, 3, 5, 0]]  # in order; the 8th slot repeats window 0
    plain = [[row[0] // 8 for row in r["distributed_sampler"]] for r in reports]
    assert (
        sorted(set(plain[0] + plain[1])) == list(range(25)) and len(plain[0]) == len(plain[1]) == 13
    )


@pytest.mark.parametrize("mismatch", ["seq_len", "file", "seed", "too_small"])
def test_torchrun_ranks_that_disagree_all_fail_naming_rank_and_field(tmp_path, mismatch):
    train = write_tokens(tmp_path / "train.npy", np.arange(205, dtype=np.uint16))
    val = write_tokens(tmp_path / "val.npy", np.arange(60, dtype=np.uint16))
    other = write_tokens(tmp_path / "other.npy", np.arange(300, dtype=np.uint16))
    tiny = write_tokens(
        tmp_path / "tiny.npy", np.arange(30, dtype=np.uint16)
    )  # 3 windows: no batch of 5 for a rank
    extra, expected = {
        "too_small": (
            ["--rank1-train", str(tiny)],
            "train.files[0].name is 'train.npy' on rank 0, 'tiny.npy' on rank 1",
        ),
        "seq_len": (["--rank1-seq-len", "16"], "train.seq_len is 8 on rank 0, 16 on rank 1"),
        "file": (
            ["--rank1-train", str(other)],
            "train.files[0].name is 'train.npy' on rank 0, 'other.npy' on rank 1",
        ),
        "seed": (["--rank1-seed", "4"], "seed is 3 on rank 0, 4 on rank 1"),
    }[mismatch]
    proc, reports = torchrun(tmp_path, train, val, *extra)
    assert proc.returncode != 0 and len(reports) == 2, proc.stderr[-3000:]
    for report in reports:
        assert (
            report["error"].startswith("RuntimeError: rank 1 ") and expected in report["error"]
        ), report


# --- 5. exact resume --------------------------------------------------------------------------

EPOCHS = 3


@pytest.fixture
def resume_job(tmp_path):
    """A loader setting whose epoch (22 windows, batches of 4) ends with a short batch: 6 per epoch."""
    path = write_tokens(
        tmp_path / "resume.npy", np.arange(115, dtype=np.uint16)
    )  # (115 - 5) // 5 = 22 windows
    return {
        "paths": [str(path)],
        "seq_len": 5,
        "dataset": {"epoch_offset": True, "seed": 4},
        "sampler": {"shuffle": True, "seed": 9, "batch_size": 4},
        "epochs": EPOCHS,
    }


def resume_in_fresh_process(jobs: list[dict]) -> list[dict]:
    proc = run_process(
        [sys.executable, str(ROOT / "tests" / "resume_worker.py")], stdin=json.dumps(jobs)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_resume_in_a_fresh_process_continues_exactly(resume_job):
    reference = resume_worker.record(resume_worker.build_loader(resume_job), EPOCHS)[0]
    assert len(reference) == 6 * EPOCHS and [len(b) for b in reference[:6]] == [4, 4, 4, 4, 4, 2]
    assert (
        len({b[0][0] % 5 for b in reference}) > 1
    )  # each epoch has its own offset: the epoch matters
    stops = [
        1,
        5,
        6,
        7,
        13,
        17,
    ]  # 5 | 6: just before | after the end of epoch 0, 7: first of epoch 1
    jobs, second = [], []
    for workers in (0, 2):
        job = {**resume_job, "num_workers": workers}
        if workers:
            assert resume_worker.record(resume_worker.build_loader(job), EPOCHS)[0] == reference
        for k in stops:
            loader = resume_worker.build_loader(job)
            batches, state = resume_worker.record(loader, EPOCHS, stop_after=k)
            assert batches == reference[:k]
            assert json.loads(json.dumps(state)) == state and len(json.dumps(state)) < 2048
            assert (state["epoch"], state["position"]) == (k // 6, 4 * (k % 6))  # 4 windows a batch
            jobs.append({**job, "state": json.dumps(state), "k": k})
        before_boundary = next(j for j in jobs if j["k"] == 5 and j["num_workers"] == workers)
        second.append({**before_boundary, "stop_after": 3})  # resume at 5, stop at 8 (in epoch 1)
    results = resume_in_fresh_process(jobs + second)
    for job, result in zip(jobs, results):
        assert result["batches"] == reference[job["k"] :], (job["k"], job["num_workers"])
    for job, result in zip(second, results[len(jobs) :]):  # resume, stop again, resume again (here)
        k = job["k"]
        assert result["batches"] == reference[k : k + 3]
        loader = resume_worker.build_loader(job)
        loader.sampler.load_state_dict(json.loads(result["state"]))
        assert resume_worker.record(loader, EPOCHS)[0] == reference[k + 3 :]


def flat_epochs(batches: list[list[list[int]]], per_epoch: list[int]) -> list[list[int]]:
    """Window starts per epoch, batches joined, given how many batches each epoch had."""
    out, at = [], 0
    for count in per_epoch:
        out.append([row[0] for b in batches[at : at + count] for row in b])
        at += count
    return out


def test_resume_with_another_batch_or_world_size_continues_at_the_same_position(resume_job):
    """The state is a global position p in the epoch's order: the windows all ranks took so far.
    A loader with another batch size or world size starts at item p of the same epoch, its ranks
    split the rest of the epoch as usual, and later epochs are the same windows regrouped."""
    reference = resume_worker.record(resume_worker.build_loader(resume_job), EPOCHS)[0]
    windows = flat_epochs(reference, [6] * EPOCHS)  # epoch e: its 22 windows in order
    loader = resume_worker.build_loader(resume_job)
    state = resume_worker.record(loader, EPOCHS, stop_after=2)[1]
    assert (state["epoch"], state["position"]) == (0, 8)
    smaller = resume_worker.build_loader(
        {**resume_job, "sampler": {**resume_job["sampler"], "batch_size": 3}}
    )
    smaller.sampler.load_state_dict(state)
    rest = resume_worker.record(smaller, EPOCHS)[0]
    assert [len(b) for b in rest[:5]] == [3, 3, 3, 3, 2]  # 14 windows left in epoch 0
    assert flat_epochs(rest, [5, 8, 8]) == [windows[0][8:], windows[1], windows[2]]
    # two ranks stop after one batch each: 8 windows taken, the same state on both
    pair = [
        resume_worker.build_loader(
            {**resume_job, "sampler": {**resume_job["sampler"], "world_size": 2, "rank": r}}
        )
        for r in range(2)
    ]
    taken, states = zip(*(resume_worker.record(loader, EPOCHS, stop_after=1) for loader in pair))
    taken = [b[0] for b in taken]
    assert (
        states[0] == states[1] == state == pair[0].sampler.state_dict()
    )  # 0 workers: handed out = received
    assert sorted(row[0] for b in taken for row in b) == sorted(windows[0][:8])
    three = []  # resume on three ranks: together they take the rest of epoch 0, less 14 % 3 dropped
    for r in range(3):
        loader = resume_worker.build_loader(
            {**resume_job, "sampler": {**resume_job["sampler"], "world_size": 3, "rank": r}}
        )
        loader.sampler.load_state_dict(state)
        three.append([row[0] for x, _ in loader for row in x.tolist()])  # the rest of epoch 0
    assert [len(t) for t in three] == [4, 4, 4]
    assert [three[r][j] for j in range(4) for r in range(3)] == windows[0][8:20]


def test_resume_refuses_a_state_from_other_windows(tmp_path, resume_job):
    loader = resume_worker.build_loader(resume_job)
    state = json.loads(json.dumps(resume_worker.record(loader, EPOCHS, stop_after=2)[1]))
    other_file = write_tokens(tmp_path / "other.npy", np.arange(115, dtype=np.uint16))
    second_file = write_tokens(tmp_path / "second.npy", np.arange(50, dtype=np.uint16))
    cases = [
        ({"seq_len": 6}, "dataset.seq_len is 5 in the saved state, 6 here"),
        (
            {"sampler": {**resume_job["sampler"], "seed": 10}},
            "EpochSampler state: seed is 9 in the saved state, 10 here",
        ),
        (
            {"sampler": {**resume_job["sampler"], "shuffle": False}},
            "shuffle is True in the saved state, False here",
        ),
        (
            {"dataset": {"epoch_offset": True, "seed": 5}},
            "dataset.seed is 4 in the saved state, 5 here",
        ),
        (
            {"paths": [str(other_file)]},
            "dataset.files[0].name is 'resume.npy' in the saved state, 'other.npy' here",
        ),
        (
            {"paths": resume_job["paths"] + [str(second_file)]},
            "len(dataset.files) is 1 in the saved state, 2 here",
        ),
    ]
    for change, expected in cases:
        other = resume_worker.build_loader({**resume_job, **change})
        with pytest.raises(ValueError) as info:
            other.sampler.load_state_dict(state)
        assert expected in str(info.value), (change, str(info.value))
    random = {**resume_job, "dataset": {"mode": "random", "num_samples": 40}}
    loader = resume_worker.build_loader(random)
    with pytest.raises(ValueError, match="dataset.num_samples is 40 in the saved state, 41 here"):
        resume_worker.build_loader(
            {**random, "dataset": {"mode": "random", "num_samples": 41}}
        ).sampler.load_state_dict(loader.sampler.state_dict())
    for bad in ({**state, "position": 22}, {**state, "epoch": -1}, {**state, "format": "other"}):
        with pytest.raises((ValueError, TypeError)):
            resume_worker.build_loader(resume_job).sampler.load_state_dict(bad)


def test_make_dataloaders_resume_across_the_epoch_end(tmp_path):
    def loaders():
        train = nd.NpyTokensDataset(
            write_tokens(tmp_path / "train.npy", np.arange(120, dtype=np.uint16)), 5
        )
        val = nd.NpyTokensDataset(
            write_tokens(tmp_path / "val.npy", np.arange(40, dtype=np.uint16)), 5
        )
        return nd.make_dataloaders(train, val, batch_size=5, num_workers=0, seed=6)

    reference = resume_worker.record(loaders()[0], 2)[0]
    assert (
        len(reference) == 8 and reference[:4] != reference[4:]
    )  # 23 windows: 4 batches of 5, 3 dropped
    for k in (3, 4, 5):  # before the end of epoch 0, at it (its dropped windows are skipped), after
        train, _ = loaders()
        batches, state = resume_worker.record(train, 2, stop_after=k)
        assert (
            batches == reference[:k]
            and json.loads(json.dumps(state)) == state == train.sampler.state_dict()
        )
        assert (state["epoch"], state["position"]) == divmod(5 * k, 20)
        again, _ = loaders()
        again.sampler.load_state_dict(state)
        assert again.sampler.state_dict() == state  # nothing moves before the next iteration
        assert resume_worker.record(again, 2)[0] == reference[k:]


def test_a_state_counts_what_the_loop_received_not_what_workers_fetched(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)  # 24 windows
    loader = DataLoader(
        ds, sampler=nd.EpochSampler(ds, batch_size=4, shuffle=False), batch_size=None, num_workers=2
    )
    batches = iter(loader)
    next(
        batches
    )  # the workers have fetched ahead by now: the sampler handed out more than one batch
    assert loader.sampler.state_dict(consumed=1)["position"] == 4
    assert loader.sampler.state_dict()["position"] > 4
    with pytest.raises(
        ValueError,
        match=r"consumed=7, but the latest pass has handed out only \d of its 6 batches; count the "
        r"batches of the current pass \(enumerate\(loader, 1\)\), not a global step",
    ):
        loader.sampler.state_dict(consumed=7)
    del batches
    fresh = nd.EpochSampler(ds, batch_size=4)
    with pytest.raises(ValueError, match="consumed=1, but no pass over this sampler has started"):
        fresh.state_dict(consumed=1)


# --- 6. laziness ------------------------------------------------------------------------------


@pytest.mark.parametrize("persistent", [False, True])
def test_iterators_made_and_dropped_do_not_skip_epochs(tmp_path, persistent):
    sampler = nd.EpochSampler(range(10), seed=1)
    for _ in range(3):
        iter(sampler)  # made and dropped unused, as DataLoader's multiprocessing iterator does
    assert {epoch for epoch, _ in sampler} == {0}
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=30, seed=6)

    def two_epochs(workers):
        sampler = nd.EpochSampler(ds, seed=2, batch_size=6)
        extra = {"persistent_workers": persistent} if workers else {}
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=workers, **extra)
        batches = [[x.tolist() for x, _ in loader] for _ in range(2)]
        return batches, sampler.epoch

    reference, epochs = two_epochs(0)
    assert epochs == 2 and reference[0] != reference[1]
    assert two_epochs(2) == (reference, 2)


# --- state arithmetic, property-tested --------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 60), world=st.integers(1, 6), batch_size=st.integers(1, 7), data=st.data())
def test_any_stop_point_is_a_global_position_the_next_run_starts_from(n, world, batch_size, data):
    assume(
        n >= world
    )  # fewer windows than ranks is refused (see test_ranks_split_each_epoch_disjoint_and_complete)
    ranks = [
        nd.EpochSampler(range(n), seed=3, batch_size=batch_size, world_size=world, rank=r)
        for r in range(world)
    ]
    k = data.draw(st.integers(0, len(ranks[0])), label="batches taken on each rank")
    iters = [iter(s) for s in ranks]
    took = sorted(int(i) for it in iters for _ in range(k) for i in next(it)[1])
    states = [s.state_dict() for s in ranks]
    assert all(s == states[0] for s in states)
    state = states[0]
    order = [i for _, i in nd.EpochSampler(range(n), seed=3)]  # epoch 0's order
    if k == len(ranks[0]) > 0:  # the epoch is done: the next one starts at its beginning
        assert (state["epoch"], state["position"]) == (1, 0) and took == sorted(
            order[: n - n % world]
        )
    else:
        position = k * batch_size * world
        assert (state["epoch"], state["position"]) == (0, position) and took == sorted(
            order[:position]
        )
        resumed = nd.EpochSampler(range(n), seed=3)  # one rank now: it takes the whole rest
        resumed.load_state_dict(state)
        assert [(e, i) for e, i in resumed] == [(0, i) for i in order[position:]]


# --- 7. the example's backend on machines with fewer GPUs than ranks -----------------------------


@pytest.mark.parametrize(
    ("local_ranks", "gpus", "backend"),
    [
        (1, 0, "gloo"),
        (2, 0, "gloo"),
        (2, 1, "gloo"),
        (1, 1, "nccl"),
        (2, 2, "nccl"),
        (8, 4, "gloo"),
        (4, 8, "nccl"),
    ],
)
def test_ddp_example_uses_nccl_only_with_a_gpu_per_local_rank(local_ranks, gpus, backend):
    sys.path.insert(0, str(ROOT / "python_files"))
    import ddp_example

    assert (
        ddp_example.choose_backend(local_ranks, gpus) == backend
    )  # a one-GPU machine with 2 ranks: gloo
