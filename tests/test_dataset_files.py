"""NpyTokensDataset over files: many files in one index space, shard sets, memory maps and open
files, pickling for workers, and files changed after they were opened.

Each file holds its own range of arange ids (conftest.PARTS), so a window that crossed a file or a
row would show a jump. Catalogue items 37, 41, 47 and 49 (tests/bad_inputs.md).
"""

import json
import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import npy_datasets as nd
from conftest import (
    PARTS,
    RANGES,
    ROOT,
    SEQ,
    WORKER_TIMEOUT,
    assert_window_inside,
    write_parts,
    write_tokens,
)

# --- many files, one index space ----------------------------------------------------------------


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
    files = [(f.path, f.rows, f.row_len) for f in ds.files]
    assert files == [(str(paths[0]), 1, 100), (str(paths[1]), 1, 5), (str(paths[2]), 1, 61)]
    assert len(ds) == 12 + 0 + 7  # 99 // 8, none in 5 tokens, 60 // 8
    keys = np.random.default_rng(1).integers(-len(ds), len(ds), 50)
    for epoch in range(3):
        x, y = ds[epoch, keys]  # the batched path finds the same files
        assert torch.equal(x, torch.stack([ds[epoch, int(k)][0] for k in keys]))
        assert torch.equal(y, torch.stack([ds[epoch, int(k)][1] for k in keys]))
    backwards = nd.NpyTokensDataset(
        [paths[2], paths[1], paths[0]], SEQ
    )  # the list's order, not the names'
    assert [backwards[i][0][0].item() for i in range(len(backwards))] == starts[12:] + starts[:12]


def test_two_d_rows_never_cross_a_boundary(tmp_path):
    paths = write_parts(tmp_path)
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
            assert (ds.files[1].rows, ds.files[1].row_len, len(ds)) == (3, 20, 12 + 6)


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


def test_item_37_one_dtype_and_one_tokenizer_per_dataset(tmp_path):
    gpt2 = write_tokens(
        tmp_path / "a.npy", np.arange(100, dtype=np.uint16), tokenizer="tiktoken:gpt2"
    )
    wide = write_tokens(
        tmp_path / "b.npy", np.arange(100, dtype=np.uint32), tokenizer="tiktoken:gpt2"
    )
    other = write_tokens(
        tmp_path / "c.npy", np.arange(100, dtype=np.uint16), tokenizer="test:other"
    )
    bare = write_tokens(tmp_path / "d.npy", np.arange(100, dtype=np.uint16), sidecar=False)
    with pytest.raises(nd.TokenFileError) as info:
        nd.NpyTokensDataset([gpt2, wide], 8)
    assert f"{str(wide)!r} holds uint32 but {str(gpt2)!r} holds uint16" in str(info.value)
    with pytest.raises(nd.TokenFileError) as info:
        nd.NpyTokensDataset([gpt2, bare, other], 8)  # same dtype, ids from another tokenizer
    assert (
        f"{str(other)!r} was tokenized with 'test:other' but {str(gpt2)!r} with 'tiktoken:gpt2'; "
        "the files of one dataset need one tokenizer"
    ) in str(info.value)
    assert (
        len(nd.NpyTokensDataset([gpt2, bare], 8)) == 2 * 12
    )  # nothing recorded for d.npy: nothing to compare


def test_a_file_given_twice_warns_and_huge_epochs_are_refused_clearly(arange_file):
    path = arange_file(1000)
    with pytest.warns(UserWarning, match="is given more than once"):
        nd.NpyTokensDataset([path, str(path)], 9)
    huge = nd.NpyTokensDataset(path, 9, mode="random", num_samples=10**10)
    with pytest.raises(
        ValueError, match=r"EpochSampler needs 1 to 2\*\*31 windows an epoch, got 10,000,000,000"
    ):
        nd.make_dataloaders(huge, huge, batch_size=4)


def test_shards_without_a_settings_fingerprint_are_not_taken_for_one_set(tmp_path, recwarn):
    a = write_tokens(
        tmp_path / "a_000000.npy", np.arange(100, dtype=np.uint16), shard={"index": 0, "count": 2}
    )
    b = write_tokens(
        tmp_path / "b_000000.npy", np.arange(100, dtype=np.uint16), shard={"index": 0, "count": 2}
    )
    nd.NpyTokensDataset([a, b], 8)
    assert not [w for w in recwarn if "shards written together" in str(w.message)]


def test_a_dataset_reads_each_sidecar_once(arange_file, monkeypatch):
    paths = [arange_file(100, name=f"part_{i}.npy") for i in range(3)]
    read = []
    monkeypatch.setattr(
        nd, "read_sidecar", lambda p, real=nd.read_sidecar: read.append(Path(p).name) or real(p)
    )
    ds = nd.NpyTokensDataset(paths, 8)
    assert sorted(read) == [
        "part_0.npy",
        "part_1.npy",
        "part_2.npy",
    ]  # the one it checked the file against
    assert [f.sha256 for f in ds.files] == [nd.read_sidecar(p)["sha256"] for p in paths]


# --- memory maps and open files -----------------------------------------------------------------


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="counts open files through Linux's /proc"
)
def test_item_47_no_file_opened_per_window(tmp_path):
    path = write_tokens(tmp_path / "fds.npy", np.arange(20_000, dtype=np.uint16))
    ds = nd.NpyTokensDataset(path, 8)
    ds[0]
    fds = _open_fds()
    for i in range(len(ds)):
        ds[i]
    for start in range(0, len(ds) - 64, 64):
        ds[list(range(start, start + 64))]
    assert (
        _open_fds() <= fds
    )  # none opened (an earlier test's may close meanwhile, when garbage is collected)
    mappings = [
        line
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(str(path))
    ]
    assert len(mappings) == 1  # one mapping, made once


SHARD_EPOCH = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd
from torch.utils.data import DataLoader

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = [open(sys.argv[1] + "/npy_datasets.py") for _ in range(int(sys.argv[3]))]  # descriptors already in use
ds = nd.NpyTokensDataset(sys.argv[2], 8)
mapped = lambda: len({line.split()[-1] for line in open("/proc/self/maps") if "shard_" in line})
train, _ = nd.make_dataloaders(ds, ds, batch_size=32, num_workers=0)
seen, most = [], 0
for x, _ in train:
    seen += x[:, 0].tolist()
    most = max(most, mapped())
workers = DataLoader(ds, sampler=nd.EpochSampler(ds, batch_size=32), batch_size=None, num_workers=2)
in_workers = [v for x, _ in workers for v in x[:, 0].tolist()]
print(json.dumps({"windows": len(ds), "seen": seen, "workers": in_workers, "most_mapped": most,
                  "cap": ds._max_maps}))
"""


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(),
    reason="sets RLIMIT_NOFILE and counts maps through Linux's /proc",
)
@pytest.mark.parametrize("taken", [0, 24])
def test_item_47_many_shards_under_a_low_open_file_limit(tmp_path, taken):
    for i in range(200):  # shard i holds ids 100*i .. 100*i + 49: six windows of 8
        write_tokens(
            tmp_path / f"shard_{i:03d}.npy", np.arange(100 * i, 100 * i + 50, dtype=np.uint16)
        )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SHARD_EPOCH,
            str(ROOT / "python_files"),
            str(tmp_path / "shard_*.npy"),
            str(taken),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    every = sorted(100 * i + 8 * k for i in range(200) for k in range(6))
    assert got["windows"] == 1200 and got["cap"] == 16  # 64 descriptors: a quarter for maps
    assert (
        sorted(got["seen"]) == every[: len(got["seen"])] or len(got["seen"]) == 1184
    )  # drop_last: 37 batches
    assert len(set(got["seen"])) == len(got["seen"]) == 1184 and set(got["seen"]) <= set(every)
    assert sorted(got["workers"]) == every  # two workers under the same limit: the whole epoch
    assert 1 <= got["most_mapped"] <= 16  # an epoch over 200 files never held more than the cap


def test_two_hundred_shards_stay_mapped_under_an_ordinary_open_file_limit(tmp_path):
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard open-file limit is {hard}, below a common 1024")
    paths = [
        write_tokens(tmp_path / f"s_{i:06d}.npy", np.arange(20, dtype=np.uint16))
        for i in range(200)
    ]
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))  # a common default: room for 200 maps
    try:
        ds = nd.NpyTokensDataset(paths, 8)
        ds[
            0, np.arange(len(ds))
        ]  # a batch from every shard: closing maps would reopen them batch after batch
        assert len(ds._maps) == 200
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_map_failure_says_open_file_limit_only_when_descriptors_ran_out(arange_file, monkeypatch):
    ds = nd.NpyTokensDataset([arange_file(400, name="a.npy"), arange_file(300, name="b.npy")], 8)
    ds[0]  # file 0 mapped
    real = np.memmap

    def failing(code):
        def memmap(*args, **kwargs):
            raise OSError(code, os.strerror(code))

        return memmap

    monkeypatch.setattr(nd.np, "memmap", failing(19))  # ENODEV: a file that cannot be mapped
    with pytest.raises(nd.TokenFileError) as info:
        ds[len(ds) - 1]
    assert "cannot be mapped (No such device)" in str(info.value) and "open-file limit" not in str(
        info.value
    )
    monkeypatch.setattr(
        nd.np, "memmap", failing(24)
    )  # EMFILE, on the retry too: named, not a raw OSError
    with pytest.raises(
        nd.TokenFileError,
        match=r"cannot be mapped \(Too many open files\); raise the open-file limit",
    ):
        ds[len(ds) - 1]
    monkeypatch.setattr(nd.np, "memmap", real)
    assert ds[len(ds) - 1][0].shape == (8,)


def _memory_kb(field: str) -> int:
    for line in (
        Path("/proc/self/status" if field == "RssFile" else "/proc/self/smaps_rollup")
        .read_text()
        .splitlines()
    ):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc")


@pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists(), reason="reads Linux's per-process memory counters"
)
def test_item_49_private_memory_stays_flat(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.arange(16 * 2**20, dtype=np.uint32).astype(np.uint16))  # 32 MB
    ds = nd.NpyTokensDataset(path, 1024)
    batches = [list(range(i, min(i + 64, len(ds)))) for i in range(0, len(ds), 64)]

    def epoch():
        for keys in batches:
            x, y = ds[keys]

    file_before = _memory_kb("RssFile")
    epoch()
    anonymous = _memory_kb("Anonymous")
    epoch()
    epoch()
    assert (
        _memory_kb("Anonymous") - anonymous < 8 * 1024
    )  # kB: private memory does not grow with reading
    assert (
        _memory_kb("RssFile") - file_before > 16 * 1024
    )  # the mapped file's pages show up as RSS, separately


# --- pickling, and files changed after they were opened -----------------------------------------


def test_pickles_small_without_the_data(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200_000), 64)
    ds[0]  # open the memmap first, as the main process would have
    blob = pickle.dumps(ds)
    assert len(blob) < 1024
    clone = pickle.loads(blob)
    assert clone._maps == {} and torch.equal(clone[5][0], ds[5][0])
    assert pickle.loads(blob).memmap().flags.writeable is False


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
        loader = DataLoader(
            ds,
            sampler=sampler,
            batch_size=None,
            num_workers=workers,
            timeout=WORKER_TIMEOUT if workers else 0,
        )
        return [[x.tolist() for x, _ in loader] for _ in range(2)]

    reference = batches(0)
    assert len(reference[0]) == 9 and reference[0] != reference[1]
    assert batches(2) == reference


def test_file_replaced_after_open_is_refused_in_a_worker(arange_file):
    path = arange_file(1000)
    ds = nd.NpyTokensDataset(path, 9)
    clone = pickle.loads(pickle.dumps(ds))  # what a spawned worker gets
    np.save(path, np.arange(500, dtype=np.uint32))
    with pytest.raises(nd.TokenFileError, match="changed since the dataset was opened"):
        clone[0]


def test_a_same_size_rewrite_in_place_is_refused_by_its_mtime(arange_file):
    path = arange_file(1000)
    ds = nd.NpyTokensDataset(path, 9)
    ds[0]  # mapped
    before = os.stat(path)
    with open(path, "r+b") as f:  # same inode, same size: only the modification time tells
        f.seek(-8, os.SEEK_END)
        f.write(np.array([7, 7], dtype=np.uint32).tobytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    after = os.stat(path)
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    with pytest.raises(nd.TokenFileError, match="changed since the dataset was opened"):
        ds[0]


# --- issue 19: what an attack found ---------------------------------------------------------------


def test_a_hot_file_stays_mapped_while_cold_ones_take_turns(tmp_path, monkeypatch):
    """The least recently used map is closed, never the one in use: with a cap of 2 and batches
    that all read file 0, file 0 is mapped once however many times the others come and go."""
    paths = [
        write_tokens(tmp_path / f"s{i}.npy", np.arange(100, dtype=np.uint16)) for i in range(4)
    ]
    ds = nd.NpyTokensDataset(paths, 8)
    ds._max_maps = 2
    opened = []
    real = np.memmap
    monkeypatch.setattr(
        nd.np, "memmap", lambda p, *a, **k: opened.append(Path(p).name) or real(p, *a, **k)
    )
    per_file = len(ds) // 4
    for other in [1, 2, 3] * 3:
        ds[[0, other * per_file]]  # file 0, then another file
    assert opened.count("s0.npy") == 1 and len(opened) == 1 + 9


DESCRIPTORS = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd
resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = [open(sys.argv[1] + "/npy_datasets.py") for _ in range(20)]  # descriptors already in use
ds = nd.NpyTokensDataset(sys.argv[2], 8)
try:
    nd.make_dataloaders(ds, batch_size=32, num_workers=2)
    print(json.dumps({"refused": None}))
except ValueError as error:
    train, _ = nd.make_dataloaders(ds, batch_size=32)  # no workers: the same limits serve
    print(json.dumps({"refused": str(error), "batches": sum(1 for _ in train)}))
"""


@pytest.mark.skipif(
    not Path("/proc/self/fd").exists(), reason="sets RLIMIT_NOFILE, counts /proc/self/fd"
)
def test_workers_under_a_low_open_file_limit_are_refused_at_once_naming_it(tmp_path):
    """300 shards, two workers, a limit of 40 with 20 descriptors taken: torch's workers would hang
    or die handing batches over; make_dataloaders refuses at once and names the limit."""
    for i in range(300):
        write_tokens(
            tmp_path / f"shard_{i:03d}.npy", np.arange(100 * i, 100 * i + 50, dtype=np.uint16)
        )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            DESCRIPTORS,
            str(ROOT / "python_files"),
            str(tmp_path / "shard_*.npy"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["refused"] and "num_workers=2 needs" in got["refused"]
    assert "the open-file limit is 40" in got["refused"] and "ulimit -n" in got["refused"]
    assert got["batches"] == 1800 // 32
