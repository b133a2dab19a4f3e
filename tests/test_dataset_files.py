"""NpyTokensDataset over files: many files in one index space, memory maps and open files (the
map cap, its least recently used map, a real EMFILE), pickling for workers, and files changed
after they were opened.

Each file holds its own range of arange ids (conftest.PARTS), so a window that crossed a file or a
row would show a jump. Catalogue items 37, 41, 47, 49, 89 and 95 (tests/bad_inputs.md).
"""

import errno
import json
import os
import pickle
import re
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
    run_process,
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
    files = [(f.path, f.shape) for f in ds.files]
    assert files == [(str(paths[0]), (100,)), (str(paths[1]), (5,)), (str(paths[2]), (61,))]
    assert len(ds) == 12 + 0 + 7  # 99 // 8, none in 5 tokens, 60 // 8
    keys = np.random.default_rng(1).integers(-len(ds), len(ds), 50)
    for epoch in range(3):
        x, y = ds[epoch, keys]  # the batched path finds the same files
        assert torch.equal(x, torch.cat([ds[epoch, [int(k)]][0] for k in keys]))
        assert torch.equal(y, torch.cat([ds[epoch, [int(k)]][1] for k in keys]))
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
        x, y = ds[0, list(range(len(ds)))]
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
            assert (ds.files[1].shape, len(ds)) == ((3, 20), 12 + 6)


def test_random_starts_spread_over_files_by_their_starts(tmp_path):
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=4000, seed=5)
    x, y = ds[0, list(range(len(ds)))]
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
    with pytest.raises(nd.TokenFileError) as info:
        nd.NpyTokensDataset([paths[0], narrow], SEQ)
    for named in (repr(str(narrow)), "uint16", repr(str(paths[0])), "uint32"):
        assert named in str(info.value)
    pattern = str(tmp_path / "nothing_*.npy")
    with pytest.raises(FileNotFoundError, match=re.escape(repr(pattern))):
        nd.NpyTokensDataset(pattern, SEQ)
    with pytest.raises(TypeError, match="non-empty list"):
        nd.NpyTokensDataset([], SEQ)
    with pytest.raises(ValueError) as info:
        nd.NpyTokensDataset([paths[1], paths[2]], 61)  # 5 and 61 tokens: a window needs 62
    assert f"{str(paths[1])!r} and the rest hold no window" in str(info.value)
    assert "61 tokens" in str(info.value) and "needs 62" in str(info.value)


def test_a_dataset_has_one_dtype_and_one_tokenizer(tmp_path):
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
    for named in (repr(str(wide)), "uint32", repr(str(gpt2)), "uint16"):
        assert named in str(info.value)
    with pytest.raises(nd.TokenFileError) as info:
        nd.NpyTokensDataset([gpt2, bare, other], 8)  # same dtype, ids from another tokenizer
    for named in ("'test:other'", repr(str(other)), "'tiktoken:gpt2'", repr(str(gpt2))):
        assert named in str(info.value)
    assert repr(str(bare)) not in str(info.value)  # nothing recorded for d.npy: not compared
    assert len(nd.NpyTokensDataset([gpt2, bare], 8)) == 2 * 12


def test_huge_epochs_are_refused_clearly(arange_file):
    huge = nd.NpyTokensDataset(arange_file(1000), 9, mode="random", num_samples=10**10)
    with pytest.raises(ValueError) as info:
        nd.make_dataloaders(huge, huge, batch_size=4, pin_memory=False)
    assert "10,000,000,000" in str(info.value) and "2**31" in str(info.value)


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
    assert [f.sidecar["sha256"] for f in ds.files] == [nd.read_sidecar(p)["sha256"] for p in paths]


# --- memory maps and open files -----------------------------------------------------------------


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="counts open files through Linux's /proc"
)
def test_windows_open_no_file_and_map_each_file_once(tmp_path):
    path = write_tokens(tmp_path / "fds.npy", np.arange(20_000, dtype=np.uint16))
    ds = nd.NpyTokensDataset(path, 8)
    ds[0]
    fds = _open_fds()
    for i in range(len(ds)):
        ds[i]
    for start in range(0, len(ds) - 64, 64):
        ds[0, list(range(start, start + 64))]
    # none opened (an earlier test's may close meanwhile, when garbage is collected)
    assert _open_fds() <= fds
    maps = Path("/proc/self/maps").read_text().splitlines()
    assert len([line for line in maps if line.endswith(str(path))]) == 1  # one map, made once


SHARD_EPOCH = """
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd
from torch.utils.data import DataLoader

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[3]))]  # in use already
ds = nd.NpyTokensDataset(sys.argv[2], 8)
mapped = lambda: len({line.split()[-1] for line in open("/proc/self/maps") if "shard_" in line})
train, _ = nd.make_dataloaders(ds, ds, batch_size=32, num_workers=0, pin_memory=False)
free = 64 - len(os.listdir("/dev/fd"))  # as the dataset counts them when it first maps a file
seen, most = [], 0
for x, _ in train:
    seen += x[:, 0].tolist()
    most = max(most, mapped())
workers = DataLoader(ds, sampler=nd.EpochSampler(ds, batch_size=32), batch_size=None, num_workers=2)
in_workers = [v for x, _ in workers for v in x[:, 0].tolist()]
print(json.dumps({"windows": len(ds), "seen": seen, "workers": in_workers, "most_mapped": most,
                  "free": free}))
"""


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(),
    reason="sets RLIMIT_NOFILE and counts maps through Linux's /proc",
)
@pytest.mark.parametrize("taken", [0, 24])
def test_an_epoch_over_many_shards_keeps_half_the_free_descriptors_for_others(shard_folder, taken):
    """200 shards under a limit of 64: the maps never take more than half of the descriptors
    free after DataLoader's own (LOADER_DESCRIPTORS), and the epoch is whole, with or without
    workers."""
    first_200 = str(shard_folder / "shard_[01]*.npy")  # shard i: ids 100*i .. 100*i + 49
    proc = run_process(
        [sys.executable, "-c", SHARD_EPOCH, str(ROOT / "python_files"), first_200, str(taken)]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    every = sorted(100 * i + 8 * k for i in range(200) for k in range(6))
    assert got["windows"] == 1200
    assert len(set(got["seen"])) == len(got["seen"]) == 1184  # drop_last: 37 batches of 32
    assert set(got["seen"]) <= set(every)
    assert sorted(got["workers"]) == every  # two workers under the same limit: the whole epoch
    cap = (got["free"] - nd.LOADER_DESCRIPTORS) // 2
    assert 1 <= cap < 200 and got["most_mapped"] == cap  # the cap filled, and never passed


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
        # a batch from every shard: closing maps would reopen them batch after batch
        ds[0, np.arange(len(ds))]
        assert len(ds._maps) == 200
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_file_that_cannot_be_mapped_is_named_with_the_reason(arange_file, monkeypatch):
    ds = nd.NpyTokensDataset([arange_file(400, name="a.npy"), arange_file(300, name="b.npy")], 8)
    ds[0]  # file 0 mapped

    def no_device(*args, **kwargs):
        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))

    monkeypatch.setattr(nd.np, "memmap", no_device)  # a file system that cannot map files
    with pytest.raises(nd.TokenFileError) as info:
        ds[len(ds) - 1]
    message = str(info.value)
    assert repr(str(ds.paths[1])) in message and os.strerror(errno.ENODEV) in message
    assert "ulimit" not in message  # descriptors did not run out: no advice about them
    monkeypatch.undo()
    assert ds[len(ds) - 1][0].shape == (8,)


OUT_OF_DESCRIPTORS = """
import json, os, resource, sys
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
ds = nd.NpyTokensDataset(sys.argv[2:4], 8)
ds[0]  # file 0 mapped, the cap set while descriptors were free
held = []
while True:  # then something else takes every descriptor but `left`
    try:
        held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
for _ in range(int(sys.argv[4])):
    os.close(held.pop())
try:
    ds[len(ds) - 1]
    print(json.dumps({"type": None}))
except Exception as error:
    print(json.dumps({"type": type(error).__name__, "message": str(error)}))
"""


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="sets RLIMIT_NOFILE")
@pytest.mark.parametrize(
    "left",
    [
        0,
        1,
    ],
)
def test_running_out_of_descriptors_while_mapping_names_the_limit_and_ulimit(tmp_path, left):
    """A real EMFILE (a low RLIMIT_NOFILE, no fake memmap): open() of the token file fails with
    no descriptor left, mmap's dup of it with one left. Either way the error names the file,
    the limit of 64 and `ulimit -n`."""
    paths = [write_tokens(tmp_path / f"{n}.npy", np.arange(400, dtype=np.uint16)) for n in "ab"]
    script = [OUT_OF_DESCRIPTORS, str(ROOT / "python_files"), *map(str, paths), str(left)]
    proc = subprocess.run(
        [sys.executable, "-c", *script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["type"] == "TokenFileError", got
    message = got["message"]
    assert repr(str(paths[1])) in message and os.strerror(errno.EMFILE) in message
    assert re.search(r"limit\D{0,20}\b64\b", message) and "ulimit -n" in message, message


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
def test_private_memory_stays_flat_over_epochs(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.arange(16 * 2**20, dtype=np.uint32).astype(np.uint16))  # 32 MB
    ds = nd.NpyTokensDataset(path, 1024)
    batches = [list(range(i, min(i + 64, len(ds)))) for i in range(0, len(ds), 64)]

    def epoch():
        for keys in batches:
            x, y = ds[0, keys]

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


def test_pickles_small_without_the_data_and_workers_give_the_same_batches(tmp_path):
    one = nd.NpyTokensDataset(
        write_tokens(tmp_path / "one.npy", np.arange(200_000, dtype=np.uint32)), 64
    )  # 800 KB of ids
    one[0]  # map the file first, as the main process would have
    blob = pickle.dumps(one)
    assert len(blob) < 2048  # its path, shape and sidecar, never the mapped data
    clone = pickle.loads(blob)
    assert clone._maps == {} and torch.equal(clone[5][0], one[5][0])
    paths = write_parts(tmp_path)
    ds = nd.NpyTokensDataset(paths, SEQ, mode="random", num_samples=60, seed=2)
    ds[0]
    ds.__getitems__([1, 2])
    blob = pickle.dumps(ds)
    assert len(blob) < 1024 * len(paths)  # paths, shapes and sidecars, never the mapped data
    clone = pickle.loads(blob)
    assert clone._maps == {} and torch.equal(clone[4, [7]][0], ds[4, [7]][0])

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
    with pytest.raises(nd.TokenFileError, match="changed since the dataset opened it") as info:
        clone[0]
    assert repr(str(path)) in str(info.value)
    judged = "(its size, modification time or inode is not the same)"
    assert str(info.value).endswith(f"{judged}: make the NpyTokensDataset again")


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
    with pytest.raises(nd.TokenFileError, match="changed since the dataset opened it") as info:
        ds[0]
    assert repr(str(path)) in str(info.value)


# --- issue 19: what an attack found ---------------------------------------------------------------


def _four_files_and_hot_batches(folder: Path) -> tuple[nd.NpyTokensDataset, list[list[int]]]:
    """Four files (file i holds ids 100*i ..), and nine batches that each read file 0 and then
    one of the others in turn."""
    paths = [
        write_tokens(folder / f"s{i}.npy", np.arange(100 * i, 100 * i + 100, dtype=np.uint16))
        for i in range(4)
    ]
    ds = nd.NpyTokensDataset(paths, 8)
    per_file = len(ds) // 4
    return ds, [[0, other * per_file] for other in [1, 2, 3] * 3]


def test_a_hot_file_stays_mapped_while_cold_ones_take_turns(tmp_path, monkeypatch):
    """The least recently used map is closed, never the one in use: with a cap of 2 and batches
    that all read file 0, file 0 is mapped once however many times the others come and go."""
    ds, batches = _four_files_and_hot_batches(tmp_path)
    monkeypatch.setattr(nd, "MAX_OPEN_FILES", 2)
    opened = []
    real = np.memmap
    monkeypatch.setattr(
        nd.np, "memmap", lambda f, *a, **k: opened.append(Path(f.name).name) or real(f, *a, **k)
    )
    for batch in batches:
        ds[0, batch]
    assert opened.count("s0.npy") == 1 and len(opened) == 1 + 9


def test_a_worker_whose_maps_fill_the_cap_closes_the_least_recently_used(tmp_path, monkeypatch):
    """The same in a forked DataLoader worker, which sets its own cap when it first maps a file
    (here MAX_OPEN_FILES = 2) and logs each map it makes: file 0 is mapped once, by the worker."""
    ds, batches = _four_files_and_hot_batches(tmp_path)
    ds[0, [0]]  # the main process maps file 0 too: the worker must not count on that map
    log = tmp_path / "maps.log"
    real = np.memmap

    def logged(file, *args, **kwargs):  # the open file the module checked
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {Path(file.name).name}\n")
        return real(file, *args, **kwargs)

    monkeypatch.setattr(nd, "MAX_OPEN_FILES", 2)
    monkeypatch.setattr(nd.np, "memmap", logged)
    log.write_text("")
    loader = DataLoader(
        ds,
        sampler=[(0, batch) for batch in batches],
        batch_size=None,
        num_workers=1,
        multiprocessing_context="fork",
        timeout=WORKER_TIMEOUT,
    )
    assert [x[:, 0].tolist() for x, _ in loader] == [[0, 100 * k] for k in [1, 2, 3] * 3]
    opened = [line.split() for line in log.read_text().splitlines()]
    assert {pid for pid, _ in opened} - {str(os.getpid())}, "no map was made in the worker"
    assert [name for _, name in opened].count("s0.npy") == 1 and len(opened) == 1 + 9


DESCRIPTORS = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd
resource.setrlimit(resource.RLIMIT_NOFILE, (40, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = [open(sys.argv[1] + "/npy_datasets.py") for _ in range(20)]  # descriptors already in use
ds = nd.NpyTokensDataset(sys.argv[2], 8)
try:
    nd.make_dataloaders(ds, batch_size=32, num_workers=2, pin_memory=False)
    print(json.dumps({"refused": None}))
except ValueError as error:
    train, _ = nd.make_dataloaders(ds, batch_size=32, pin_memory=False)  # no workers: it serves
    print(json.dumps({"refused": str(error), "batches": sum(1 for _ in train)}))
"""


@pytest.mark.skipif(
    not Path("/proc/self/fd").exists(), reason="sets RLIMIT_NOFILE, counts /proc/self/fd"
)
def test_workers_under_a_low_open_file_limit_are_refused_at_once_naming_it(shard_folder):
    """300 shards, two workers, a limit of 40 with 20 descriptors taken: torch's workers would hang
    or die handing batches over; make_dataloaders refuses at once and names the limit."""
    every = str(shard_folder / "shard_*.npy")
    proc = run_process([sys.executable, "-c", DESCRIPTORS, str(ROOT / "python_files"), every])
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    refusal = got["refused"]
    assert refusal and re.search(r"\b40\b", refusal), refusal  # the limit
    assert "ulimit -n" in refusal and "num_workers=0" in refusal  # both ways out
    assert got["batches"] == 1800 // 32
