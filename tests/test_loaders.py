"""make_dataloaders, to_device, DataLoader workers, and ranks: explicit, under torch's
DistributedSampler and under a real torchrun (gloo on the CPU).

Catalogue items 40, 42, 46, 51, 53 and 54 (tests/bad_inputs.md).
"""

import itertools
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

import npy_datasets as nd
from conftest import ROOT, SEQ, WORKER_TIMEOUT, run_process, write_parts, write_tokens

# --- make_dataloaders and to_device -------------------------------------------------------------


def test_make_dataloaders(arange_file):
    train = nd.NpyTokensDataset(arange_file(1000, name="train.npy"), 10)
    val = nd.NpyTokensDataset(arange_file(95, name="val.npy"), 10)
    train_loader, val_loader = nd.make_dataloaders(train, val, batch_size=4, num_workers=0)
    batches = list(train_loader)
    assert len(batches) == len(train) // 4 and all(x.shape == (4, 10) for x, _ in batches)
    seen = sorted(v for x, _ in batches for v in x[:, 0].tolist())
    assert seen != [x[:, 0].tolist() for x, _ in batches] and len(set(seen)) == len(seen)
    val_starts = [v for x, _ in val_loader for v in x[:, 0].tolist()]
    assert val_starts == [10 * i for i in range(len(val))]  # in order, last short batch kept
    assert train_loader.pin_memory == torch.cuda.is_available()
    with pytest.raises(ValueError, match="batch_size must be at least 1, got 0"):
        nd.make_dataloaders(train, val, batch_size=0)
    with pytest.raises(
        ValueError,
        match=r"batch_size=100 with drop_last=True leaves no batch: each of the 1 rank\(s\) "
        "gets 99 of the 99 windows",
    ):
        nd.make_dataloaders(train, val, batch_size=100)  # training would be silently empty
    with pytest.raises(TypeError, match="train must be an NpyTokensDataset, got list"):
        nd.make_dataloaders([1, 2, 3], val, batch_size=4)


def test_to_device_on_cpu():
    x, y = nd.to_device((torch.arange(4), torch.arange(4) + 1), "cpu")
    assert x.device.type == "cpu" and y.tolist() == [1, 2, 3, 4]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
def test_pinned_batches_reach_the_gpu(arange_file):
    ds = nd.NpyTokensDataset(arange_file(5000, dtype=np.uint16), 32)
    train, _ = nd.make_dataloaders(ds, ds, batch_size=4, num_workers=0)
    x, y = next(iter(train))
    assert x.is_pinned() and y.is_pinned() and x.dtype == torch.int64
    xg, yg = nd.to_device((x, y), "cuda")
    torch.cuda.synchronize()
    assert xg.is_cuda and torch.equal(xg.cpu(), x) and torch.equal(yg[:, :-1].cpu(), x[:, 1:])


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="on a CUDA machine test_pinned_batches_reach_the_gpu checks pinning",
)
def test_item_46_no_pinning_and_no_warning_without_a_gpu(arange_file):
    ds = nd.NpyTokensDataset(arange_file(2000, dtype=np.uint16), 16)
    train, val = nd.make_dataloaders(ds, ds, batch_size=4, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DataLoader(pin_memory=True) warns on a CPU-only machine
        batch = next(iter(train))
        next(iter(val))
    assert train.pin_memory is False and val.pin_memory is False and not batch[0].is_pinned()


# --- workers ------------------------------------------------------------------------------------


def _batches(loader, epochs=2):
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(epochs)]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_count_and_start_method_do_not_change_batches(arange_file, context):
    ds = nd.NpyTokensDataset(
        arange_file(20_000, dtype=np.uint16), 50, mode="random", num_samples=96, seed=7
    )

    def loader(workers):
        extra = {"multiprocessing_context": context, "persistent_workers": True}
        extra = {**extra, "timeout": WORKER_TIMEOUT} if workers else {}
        return DataLoader(
            ds, batch_size=8, sampler=nd.EpochSampler(ds, seed=3), num_workers=workers, **extra
        )

    reference = _batches(loader(0))
    assert len(reference[0]) == 12
    assert not torch.equal(reference[0][0][0], reference[1][0][0])  # a new epoch draws new windows
    for workers in (1, 2):
        got = _batches(loader(workers))
        assert all(
            torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
            for ea, eb in zip(reference, got)
            for a, b in zip(ea, eb)
        )


def test_rank_batches_do_not_depend_on_workers(tmp_path):
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=50, seed=8)

    def rank_windows(rank, workers):
        sampler = nd.EpochSampler(
            ds, seed=4, batch_size=4, world_size=3, rank=rank, remainder="pad"
        )
        loader = DataLoader(
            ds,
            sampler=sampler,
            batch_size=None,
            num_workers=workers,
            timeout=WORKER_TIMEOUT if workers else 0,
        )
        return [x[:, 0].tolist() for x, _ in loader]

    per_rank = [rank_windows(r, 0) for r in range(3)]
    assert [len(b) for b in per_rank] == [5, 5, 5]  # 17 items each: 4 batches of 4 and one of 1
    sampler = nd.EpochSampler(ds, seed=4, world_size=3, rank=1, remainder="pad")
    assert sum(per_rank[1], []) == [ds[key][0][0].item() for key in sampler]
    assert rank_windows(1, 2) == per_rank[1]


# --- ranks --------------------------------------------------------------------------------------


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
        epoch0, _ = ds[0, indices]
        epoch1, _ = ds[1, indices]
        assert torch.equal(x, epoch0) and not torch.equal(x, epoch1)
        seen += indices
    assert (
        sorted(set(seen)) == list(range(len(ds))) and len(seen) == 42
    )  # 40 windows, 2 repeated to fill 3 ranks


def test_item_54_a_file_being_written_is_never_read(tmp_path, pt):
    path = tmp_path / "train_000.npy"
    seen = []

    def chunks(ids):
        yield ids[:40]
        for attempt in (
            lambda: nd.NpyTokensDataset(path, 8),
            lambda: nd.NpyTokensDataset(str(tmp_path / "train_*.npy"), 8),
        ):
            try:  # a rank starting now, while the first chunk sits in the temporary file
                seen.append(attempt())
            except FileNotFoundError as e:
                seen.append(str(e))
        yield ids[40:]

    pt.write_token_file(chunks(np.arange(100)), path)
    assert seen == [
        f"{str(path)!r} does not exist",
        f"no token file matches the pattern {str(tmp_path / 'train_*.npy')!r} (sidecars, *.json, are skipped)",
    ]
    write_tokens(path, np.arange(100, dtype=np.uint16))  # a finished file with its sidecar
    early = []

    def rerun():  # the same size and dtype, other ids: only the checksum tells the versions apart
        yield np.arange(100, 150)
        early.append(nd.NpyTokensDataset(path, 8))  # this rank opens the previous, complete file
        yield np.arange(150, 200)

    pt.write_token_file(rerun(), path)  # renamed into place; its sidecar is not written yet
    late = nd.NpyTokensDataset(path, 8)
    path_, before, after = nd._first_difference(
        early[0].fingerprint(), late.fingerprint()
    )  # what verify_across_ranks reports
    assert path_ == "files[0].sha256" and len(before) == 64 and after is None
    with pytest.raises(nd.TokenFileError, match="changed since the dataset was opened"):
        early[0][0]  # and the early rank itself never reads the new bytes as the old file
    assert late[0][0][:3].tolist() == [100, 101, 102]


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


@pytest.mark.parametrize("mismatch", ["seq_len", "file", "seed", "too_small", "same_size"])
def test_torchrun_ranks_that_disagree_all_fail_naming_rank_and_field(tmp_path, mismatch):
    train = write_tokens(tmp_path / "train.npy", np.arange(205, dtype=np.uint16))
    (tmp_path / "plain").mkdir()
    (tmp_path / "other_plain").mkdir()  # same name, size, dtype and shape; other ids; no sidecars
    plain = write_tokens(
        tmp_path / "plain/train.npy", np.arange(205, dtype=np.uint16), sidecar=False
    )
    same_size = write_tokens(
        tmp_path / "other_plain/train.npy", np.arange(1, 206, dtype=np.uint16), sidecar=False
    )
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
        "same_size": (["--rank1-train", str(same_size)], "train.files[0].probe is '"),
    }[mismatch]
    proc, reports = torchrun(tmp_path, plain if mismatch == "same_size" else train, val, *extra)
    assert proc.returncode != 0 and len(reports) == 2, proc.stderr[-3000:]
    for report in reports:
        assert (
            report["error"].startswith("RuntimeError: rank 1 ") and expected in report["error"]
        ), report


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


def test_make_dataloaders_without_validation_returns_none(arange_file):
    train = nd.NpyTokensDataset(arange_file(1000), 10)
    train_loader, val_loader = nd.make_dataloaders(train, batch_size=4)
    assert val_loader is None and len(train_loader) == len(train) // 4
    assert [x.shape for x, _ in itertools.islice(train_loader, 2)] == [(4, 10), (4, 10)]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_peek_uses_up_no_epoch(arange_file, workers):
    """next(iter(loader)), the usual first check, leaves the sampler on epoch 0: the training loop
    that follows gets all of epoch 0 from its first batch, then epoch 1."""
    train = nd.NpyTokensDataset(arange_file(2000), 10)  # 199 windows: 24 batches of 8
    loader, _ = nd.make_dataloaders(train, batch_size=8, num_workers=workers)
    loader.timeout = WORKER_TIMEOUT if workers else 0
    epoch0 = [train[0, i][0][0].item() for i in nd.EpochSampler(train, batch_size=8).order(0)]
    peek, _ = next(iter(loader))
    assert loader.sampler.epoch == 0 and peek[:, 0].tolist() == epoch0[:8]
    first = [v for x, _ in loader for v in x[:, 0].tolist()]
    assert first == epoch0[: 24 * 8] and loader.sampler.epoch == 1
    second = [v for x, _ in loader for v in x[:, 0].tolist()]
    assert len(second) == len(first) and second != first and loader.sampler.epoch == 2
