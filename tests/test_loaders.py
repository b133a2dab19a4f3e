"""make_dataloaders, to_device, DataLoader workers, and ranks: explicit, under torch's
DistributedSampler and under a real torchrun (gloo on the CPU).

Catalogue items 40, 42, 46, 51, 53, 54, 89 and 91 (tests/bad_inputs.md).
"""

import itertools
import json
import os
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
    seen = [v for x, _ in batches for v in x[:, 0].tolist()]
    assert seen != sorted(seen) and len(set(seen)) == len(seen)  # shuffled, each window once
    val_starts = [v for x, _ in val_loader for v in x[:, 0].tolist()]
    assert val_starts == [10 * i for i in range(len(val))]  # in order, last short batch kept
    assert train_loader.dataloader.pin_memory == torch.cuda.is_available()
    with pytest.raises(ValueError, match=r"batch_size\b.*\b0\b"):
        nd.make_dataloaders(train, val, batch_size=0)
    with pytest.raises(ValueError, match=r"batch_size=100\b.*\b99\b"):  # 99 windows, no batch:
        nd.make_dataloaders(train, val, batch_size=100)  # training would be silently empty
    with pytest.raises(TypeError, match=r"\btrain\b.*\blist\b"):  # names the argument, the type
        nd.make_dataloaders([1, 2, 3], val, batch_size=4)
    train_loader, val_loader = nd.make_dataloaders(train, batch_size=4)  # no validation set
    assert val_loader is None and len(train_loader) == len(train) // 4
    assert [x.shape for x, _ in itertools.islice(train_loader, 2)] == [(4, 10), (4, 10)]


def test_random_validation_repeats_its_windows_when_each_evaluation_sets_epoch_zero(arange_file):
    """make_dataloaders' docstring: in mode="random" validation draws new windows each pass, and
    val_loader.sampler.set_epoch(0) before each evaluation serves the same windows every time."""
    ds = nd.NpyTokensDataset(arange_file(10_000), 8, mode="random", num_samples=40)
    _, val_loader = nd.make_dataloaders(ds, ds, batch_size=8, pin_memory=False)

    def evaluate() -> list[list[int]]:
        return [row for x, _ in val_loader for row in x[:, 0].tolist()]

    first = evaluate()
    assert evaluate() != first  # the next pass is epoch 1: other random windows
    for _ in range(2):
        val_loader.sampler.set_epoch(0)
        assert evaluate() == first


def test_an_epoch_loader_refuses_a_sampler_made_for_other_windows(arange_file):
    """A sampler of another dataset would serve its indices here: the wrong count, silently."""
    ds = nd.NpyTokensDataset(arange_file(1000, name="a.npy"), 10)
    shifted = nd.NpyTokensDataset(arange_file(1001, name="b.npy"), 10)  # 99 windows too
    for other in (nd.NpyTokensDataset(arange_file(500, name="c.npy"), 10), shifted, range(40)):
        with pytest.raises(ValueError, match=r"other windows.*EpochSampler\(dataset"):
            nd.EpochLoader(ds, nd.EpochSampler(other, batch_size=4))
    same = nd.NpyTokensDataset(ds.paths[0], 10)  # the same files and settings: accepted
    loader = nd.EpochLoader(ds, nd.EpochSampler(same, batch_size=4))
    assert len(list(loader)) == len(loader) == 25
    assert len(list(nd.EpochLoader(ds, nd.EpochSampler(range(99), batch_size=4)))) == 25


def test_an_epoch_loader_names_a_sampler_of_another_kind_and_takes_a_dataset_of_its_own(
    arange_file,
):
    """A sampler that is no EpochSampler is named (it was an AttributeError); a dataset of your own,
    with no fingerprint(), still reads batches of an EpochSampler made of it."""
    ds = nd.NpyTokensDataset(arange_file(1000), 10)
    with pytest.raises(TypeError, match="sampler must be an EpochSampler, got object"):
        nd.EpochLoader(ds, object())

    class Mine:  # ds[epoch, indices] of the NpyTokensDataset, without its other methods
        def __len__(self):
            return len(ds)

        def __getitem__(self, key):
            return ds[key]

    mine = Mine()
    loader = nd.EpochLoader(mine, nd.EpochSampler(mine, batch_size=4, shuffle=False))
    assert [x[0, 0].item() for x, _ in loader][:3] == [0, 40, 80] and len(loader) == 25
    with pytest.raises(ValueError, match="other windows"):  # made of ds, which has a fingerprint
        nd.EpochLoader(mine, nd.EpochSampler(ds, batch_size=4))


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
def test_no_pinning_and_no_warning_without_a_gpu(arange_file):
    ds = nd.NpyTokensDataset(arange_file(2000, dtype=np.uint16), 16)
    train, val = nd.make_dataloaders(ds, ds, batch_size=4, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DataLoader(pin_memory=True) warns on a CPU-only machine
        batch = next(iter(train))
        next(iter(val))
    assert not train.dataloader.pin_memory and not val.dataloader.pin_memory
    assert not batch[0].is_pinned()


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
        sampler = nd.EpochSampler(ds, seed=3, batch_size=8)
        return DataLoader(ds, batch_size=None, sampler=sampler, num_workers=workers, **extra)

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
    sampler = nd.EpochSampler(ds, seed=4, batch_size=4, world_size=3, rank=1, remainder="pad")
    assert sum(per_rank[1], []) == ds[0, sampler.order(0)][0][:, 0].tolist()
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


def test_a_plain_dataloader_of_random_windows_warns_that_each_epoch_repeats(tmp_path):
    """DataLoader(ds, batch_size=B) passes no epoch: mode="random" would draw the same windows
    every epoch. It says so once; windows mode, and an EpochSampler's batches, do not (issue 34)."""
    paths = write_parts(tmp_path)
    ds = nd.NpyTokensDataset(paths, SEQ, mode="random", num_samples=40, seed=3)
    with pytest.warns(UserWarning, match="the same windows each epoch") as caught:
        epochs = [torch.cat([x for x, _ in DataLoader(ds, batch_size=8)]) for _ in range(2)]
    assert torch.equal(*epochs) and "EpochSampler" in str(caught[0].message)
    windows = nd.NpyTokensDataset(paths, SEQ)
    sampler = nd.EpochSampler(ds, batch_size=8, world_size=1, rank=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(DataLoader(windows, batch_size=8, shuffle=True))
        list(DataLoader(ds, batch_sampler=sampler, collate_fn=tuple))


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


def test_a_file_being_written_is_never_read(tmp_path):
    path = tmp_path / "train_000.npy"
    pattern = str(tmp_path / "train_*.npy")
    fields = {"n_vocab": 200, "tokenizer": "test:arange", "eot_id": 0}
    refused = []

    def chunks(ids):
        yield ids[:40]
        for attempt in (
            lambda: nd.NpyTokensDataset(path, 8),
            lambda: nd.NpyTokensDataset(pattern, 8),
        ):
            with pytest.raises(FileNotFoundError) as info:  # a rank starting now, mid-write
                attempt()
            refused.append(str(info.value))
        yield ids[40:]

    nd.write_tokens(path, chunks(np.arange(100)), **fields)
    assert repr(str(path)) in refused[0] and repr(pattern) in refused[1], refused
    early = []

    def rerun():  # the same size and dtype, other ids: only the bytes tell the versions apart
        yield np.arange(100, 150)
        early.append(nd.NpyTokensDataset(path, 8))  # this rank opens the previous, complete file
        yield np.arange(150, 200)

    nd.write_tokens(path, rerun(), **fields)  # renamed over the old file once all is written
    late = nd.NpyTokensDataset(path, 8)
    before, after = early[0].fingerprint(), late.fingerprint()  # what verify_across_ranks compares
    assert before != after and before["files"][0]["sha256"] != after["files"][0]["sha256"]
    with pytest.raises(nd.TokenFileError) as info:  # the early rank never reads the new bytes
        early[0][0]
    assert repr(str(path)) in str(info.value)
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
    order = np.random.default_rng([3, 0]).permutation(len(ds)).tolist()  # epoch 0's order
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


def test_torchrun_ranks_that_disagree_all_fail_naming_the_rank(tmp_path):
    """Rank 1 differs from rank 0 in one setting, or in its train file (another name; too small for
    a batch, which rank 1 alone would refuse, leaving rank 0 waiting; the same name, size, dtype and
    shape with other ids and no sidecar). One torchrun job tries each case in turn: make_dataloaders'
    agreement check fails on every rank, naming rank 1, before any rank builds its sampler. (A rank
    that raised before that check would leave the ranks out of step: gloo then ends the job.)"""
    train = write_tokens(tmp_path / "train.npy", np.arange(205, dtype=np.uint16))
    (tmp_path / "plain").mkdir()
    (tmp_path / "other_plain").mkdir()
    plain = write_tokens(
        tmp_path / "plain/train.npy", np.arange(205, dtype=np.uint16), sidecar=False
    )
    same_size = write_tokens(
        tmp_path / "other_plain/train.npy", np.arange(1, 206, dtype=np.uint16), sidecar=False
    )
    val = write_tokens(tmp_path / "val.npy", np.arange(60, dtype=np.uint16))
    other = write_tokens(tmp_path / "other.npy", np.arange(300, dtype=np.uint16))
    tiny = write_tokens(tmp_path / "tiny.npy", np.arange(30, dtype=np.uint16))  # 3 windows
    cases = {  # the train file ranks 0 and 1 open, and what rank 1 does otherwise
        "seq_len": {"train": str(train), "rank1": {"seq_len": 16}},
        "file": {"train": str(train), "rank1": {"train": str(other)}},
        "seed": {"train": str(train), "rank1": {"seed": 4}},
        "too_small": {"train": str(train), "rank1": {"train": str(tiny)}},
        "same_size": {"train": str(plain), "rank1": {"train": str(same_size)}},
    }
    proc, reports = torchrun(tmp_path, train, val, "--disagreements", json.dumps(cases))
    assert proc.returncode == 0 and len(reports) == 2, proc.stderr[-3000:]
    differs = {  # the first setting, or file, each case changes (issue 34)
        "seq_len": "train.seq_len",
        "file": "train.files[0] ('",
        "seed": "seed (",
        "too_small": "train.files[0] ('",
        "same_size": "train.files[0] ('train.npy'",
    }
    for report in reports:
        assert list(report["errors"]) == list(cases), report
        for case, error in report["errors"].items():
            assert error.startswith("RuntimeError: rank 1 "), (report["rank"], case, error)
            named = f"differs from rank 0 in {differs[case]}"
            assert named in error and len(error) < 200, (report["rank"], case, error)


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


@pytest.mark.parametrize("workers", [0, 2])
def test_a_peek_uses_up_no_epoch(arange_file, workers):
    """next(iter(loader)), the usual first check, leaves the sampler on epoch 0 when the workers
    have not fetched the whole epoch (24 batches, 4 fetched): the training loop that follows gets
    all of epoch 0 from its first batch, then epoch 1."""
    train = nd.NpyTokensDataset(arange_file(2000), 10)  # 199 windows: 24 batches of 8
    loader, _ = nd.make_dataloaders(train, batch_size=8, num_workers=workers)
    loader.dataloader.timeout = WORKER_TIMEOUT if workers else 0
    order = np.random.default_rng([0, 0]).permutation(len(train))  # epoch 0's, seed 0
    epoch0 = train[0, order][0][:, 0].tolist()
    peek, _ = next(iter(loader))
    assert loader.sampler.epoch == 0 and peek[:, 0].tolist() == epoch0[:8]
    first = [v for x, _ in loader for v in x[:, 0].tolist()]
    assert first == epoch0[: 24 * 8] and loader.sampler.epoch == 1
    second = [v for x, _ in loader for v in x[:, 0].tolist()]
    assert len(second) == len(first) and second != first and loader.sampler.epoch == 2


def test_the_descriptor_check_counts_the_batches_each_worker_prefetches(arange_file):
    """Each batch in flight from a worker holds descriptors, so 2 workers that prefetch 8 batches
    each need more free descriptors than 2 that prefetch 1: under a limit that fits the one and not
    the other, make_dataloaders refuses the second at once, with the numbers, instead of hanging."""
    resource = pytest.importorskip("resource")  # Unix: an open-file limit to lower
    ds = nd.NpyTokensDataset(arange_file(1000), 10)

    def needed(prefetch_factor):
        return nd.LOADER_DESCRIPTORS + nd.BATCH_DESCRIPTORS * 2 * prefetch_factor

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/dev/fd")) + (needed(1) + needed(8)) // 2  # fits 1, not 8
    options = {"batch_size": 4, "num_workers": 2, "pin_memory": False}  # pinning starts CUDA
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        nd.make_dataloaders(ds, prefetch_factor=1, **options)
        with pytest.raises(ValueError) as info:
            nd.make_dataloaders(ds, prefetch_factor=8, **options)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    message = str(info.value)
    assert f"{needed(8)} free descriptors" in message and str(limit) in message, message
    assert "ulimit -n" in message, message  # what to do about it


def _verify_as_rank(rank: int, store_path: str, result_path: str) -> None:
    """One of two gloo ranks: 300 shards' fingerprints, rank 1's shard 217 other bytes."""
    import torch.distributed as dist

    store = dist.FileStore(store_path, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    files = [
        {"name": f"train_{i:06d}.npy", "bytes": 1000 + i, "probe": "ab" * 32} for i in range(300)
    ]
    if rank == 1:
        files[217] = {**files[217], "bytes": 5}
    try:
        nd.verify_across_ranks({"train": {"files": files, "seq_len": 8}, "seed": 0})
        message = "no error"
    except RuntimeError as error:
        message = str(error)
    finally:
        dist.destroy_process_group()
    Path(result_path).write_text(message)


def test_ranks_that_differ_in_one_of_300_shards_name_it_in_one_short_line(tmp_path):
    """Issue 34: 300 shards, one differing, raised 70,387 characters naming no file. Now each rank
    names the shard in one line, from 32-byte digests gathered as tensors."""
    context = torch.multiprocessing.get_context("fork")
    results = [tmp_path / f"rank{rank}.txt" for rank in range(2)]
    ranks = [
        context.Process(target=_verify_as_rank, args=(r, str(tmp_path / "store"), str(results[r])))
        for r in range(2)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    assert [p.exitcode for p in ranks] == [0, 0]
    for rank, path in enumerate(results):
        message = path.read_text()
        name = "train.files[217] ('train_000217.npy' on this rank)"
        assert message.startswith(f"rank 1 differs from rank 0 in {name}"), (rank, message)
        assert len(message) < 150, (rank, len(message))
