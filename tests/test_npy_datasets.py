"""Tests for python_files/npy_datasets.py on tiny arange token files (token i at position i)."""

import ast
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import npy_datasets as nd
from conftest import ROOT, write_tokens

FAST = settings(max_examples=60, deadline=None)


# --- window arithmetic ----------------------------------------------------------------------


@FAST
@given(n=st.integers(2, 3000), seq_len=st.integers(1, 600))
def test_windows_cover_every_token_once(n, seq_len):
    if n < seq_len + 1:
        return
    with tempfile.TemporaryDirectory() as tmp:
        ds = nd.NpyTokensDataset(
            write_tokens(Path(tmp) / "t.npy", np.arange(n, dtype=np.uint32)), seq_len
        )
        assert len(ds) == (n - 1) // seq_len
        xs = []
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.tolist() == list(range(i * seq_len, (i + 1) * seq_len))
            assert y.tolist() == (x + 1).tolist()
            xs.extend(x.tolist())
        assert xs == list(range(len(ds) * seq_len))  # disjoint, in order, nothing skipped
        assert n - 1 - len(ds) * seq_len < seq_len  # the dropped tail is shorter than a window


@FAST
@given(
    n=st.integers(2, 3000),
    seq_len=st.integers(1, 300),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 50),
)
def test_epoch_offset_shifts_every_window_by_one_offset(n, seq_len, seed, epoch):
    if n < 2 * seq_len:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tokens(Path(tmp) / "t.npy", np.arange(n, dtype=np.uint32))
        ds = nd.NpyTokensDataset(path, seq_len, epoch_offset=True, seed=seed)
        assert len(ds) == (n - seq_len) // seq_len
        offset = ds[(epoch, 0)][0][0].item()
        assert 0 <= offset < seq_len
        for i in range(len(ds)):
            x, y = ds[(epoch, i)]
            assert x[0].item() == offset + i * seq_len
            assert y[-1].item() < n


@FAST
@given(
    n=st.integers(2, 2000),
    seq_len=st.integers(1, 200),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 9),
)
def test_random_starts_stay_in_range_and_repeat_for_the_same_key(n, seq_len, seed, epoch):
    if n < seq_len + 1:
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tokens(Path(tmp) / "t.npy", np.arange(n, dtype=np.uint32))
        ds = nd.NpyTokensDataset(path, seq_len, mode="random", seed=seed)
        again = nd.NpyTokensDataset(path, seq_len, mode="random", seed=seed)
        for i in range(min(len(ds), 20)):
            x, y = ds[(epoch, i)]
            assert 0 <= x[0].item() <= n - seq_len - 1
            assert x.tolist() == list(range(x[0].item(), x[0].item() + seq_len))
            assert y.tolist() == (x + 1).tolist()
            assert torch.equal(again[(epoch, i)][0], x)


def test_random_mode_covers_all_starts_and_changes_with_seed_and_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(50), 9, mode="random", num_samples=4000)
    starts = {ds[i][0][0].item() for i in range(len(ds))}
    assert starts == set(range(50 - 9))  # every valid start, the last one (40) included
    first = [ds[(0, i)][0][0].item() for i in range(30)]
    assert first != [ds[(1, i)][0][0].item() for i in range(30)]
    other = nd.NpyTokensDataset(arange_file(50), 9, mode="random", num_samples=4000, seed=1)
    assert first != [other[(0, i)][0][0].item() for i in range(30)]


def test_two_d_rows_are_separate_sequences(arange_file):
    ds = nd.NpyTokensDataset(arange_file(60, shape=(3, 20)), 6)
    assert len(ds) == 3 * ((20 - 1) // 6)
    starts = [ds[i][0][0].item() for i in range(len(ds))]
    assert starts == [0, 6, 12, 20, 26, 32, 40, 46, 52]
    rnd = nd.NpyTokensDataset(
        arange_file(60, shape=(3, 20), name="r.npy"), 6, mode="random", num_samples=500
    )
    for i in range(len(rnd)):
        x, y = rnd[i]
        assert x[0].item() // 20 == y[-1].item() // 20  # never crosses into the next row


def test_batched_gather_equals_item_by_item(arange_file):
    cases = [
        nd.NpyTokensDataset(arange_file(5000), 17),
        nd.NpyTokensDataset(arange_file(5000, name="o.npy"), 17, epoch_offset=True, seed=4),
        nd.NpyTokensDataset(
            arange_file(5000, name="r.npy", dtype=np.uint16), 17, mode="random", seed=9
        ),
        nd.NpyTokensDataset(arange_file(4800, name="2d.npy", shape=(12, 400)), 33, mode="random"),
        nd.NpyTokensDataset(arange_file(4800, name="2w.npy", shape=(12, 400)), 33),
    ]
    rng = np.random.default_rng(0)
    for ds in cases:
        keys = [
            (int(e), int(i))
            for e, i in zip(rng.integers(0, 5, 40), rng.integers(-len(ds), len(ds), 40))
        ]
        x, y = ds[keys]
        assert x.dtype == y.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x, torch.stack([ds[k][0] for k in keys]))
        assert torch.equal(y, torch.stack([ds[k][1] for k in keys]))
        x[0, 0] = -1
        assert y.min().item() >= 0  # y is its own tensor: editing x cannot change it


def test_a_batch_of_bad_indices_names_the_bad_one(arange_file):
    ds = nd.NpyTokensDataset(arange_file(100), 9)
    for bad, err in [
        ([0, len(ds)], IndexError),
        ([(0, 1), (-1, 2)], ValueError),
        ([1.5, 2], TypeError),
        ([True, 1], TypeError),
        ([(0, 1, 2)], TypeError),
        ([2**70], IndexError),
    ]:
        with pytest.raises(err):
            ds.__getitems__(bad)
    x, _ = ds[[np.int64(2), -1, torch.tensor(0)]]
    assert x[:, 0].tolist() == [18, 90, 0]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_batches_widen_ids_with_the_top_bit_set_exactly(tmp_path, dtype):
    top = np.iinfo(dtype).max  # ids with the sign bit set would turn negative in a signed widening
    tokens = (top - np.arange(3000, dtype=np.int64)).astype(dtype)
    ds = nd.NpyTokensDataset(write_tokens(tmp_path / "hi.npy", tokens), 16)
    x, y = ds[[0, 5, 100]]
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.int64
    assert x[0, 0].item() == top and x[1, 0].item() == top - 80 and torch.equal(y[:, :-1], x[:, 1:])
    assert all(torch.equal(a, b) for a, b in zip(nd.to_device((x, y), "cpu"), (x, y)))


def test_epoch_and_indices_index_a_batch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(5000), 17, mode="random", seed=3)
    indices = np.array([4, 0, 7, -1])
    x, y = ds[2, indices]  # what EpochSampler(batch_size=...) hands a DataLoader
    pairs = ds[[(2, int(i)) for i in indices]]
    assert torch.equal(x, pairs[0]) and torch.equal(y, pairs[1])
    assert torch.equal(x[3], ds[2, len(ds) - 1][0])  # a negative index counts from the end
    assert not torch.equal(x, ds[3, indices][0])  # another epoch, other random starts
    for bad, err in [
        ((2, np.array([len(ds)])), IndexError),
        ((2, [0, len(ds)]), IndexError),
        ((-1, indices), ValueError),
        ((2, [(0, 1)]), TypeError),
        ((2, np.array([1.5])), TypeError),
    ]:
        with pytest.raises(err):
            ds[bad]


def test_negative_indices_in_a_batch_are_the_windows_they_name(arange_file):
    ds = nd.NpyTokensDataset(arange_file(1000), 8)  # 124 windows: window -1 starts at 8 * 123
    for keys in ([-1, -124, 3], np.array([-1, -124, 3]), [(0, -1), (0, -124), (0, 3)]):
        x, _ = ds[keys]
        assert x[:, 0].tolist() == [984, 0, 24], keys
    assert [x[:, 0].tolist() for x, _ in DataLoader(ds, batch_size=3, sampler=[-1, -124, 3])] == [
        [984, 0, 24]
    ]


def test_plain_dataloader_uses_the_batched_path_and_matches(arange_file):
    ds = nd.NpyTokensDataset(arange_file(3000, dtype=np.uint16), 31)
    x, y = next(iter(DataLoader(ds, batch_size=5)))
    assert x[:, 0].tolist() == [0, 31, 62, 93, 124]
    assert torch.equal(y[:, :-1], x[:, 1:])


@pytest.mark.parametrize("workers", [0, 2])
def test_plain_dataloader_batches_equal_the_item_path(arange_file, workers):
    ds = nd.NpyTokensDataset(
        arange_file(3000, dtype=np.uint16), 31, mode="random", num_samples=40, seed=2
    )
    plain = list(
        DataLoader(ds, batch_size=8, num_workers=workers)
    )  # default_collate, as copied code writes it
    per_item = [
        torch.utils.data.default_collate([ds[i] for i in range(k, k + 8)]) for k in range(0, 40, 8)
    ]
    assert len(plain) == len(per_item) == 5
    for (x, y), reference in zip(plain, per_item):
        assert (
            torch.equal(x, reference[0]) and torch.equal(y, reference[1]) and x.dtype == torch.int64
        )


def test_samples_read_one_by_one_are_the_items(arange_file):
    ds = nd.NpyTokensDataset(arange_file(3000), 31)
    samples = ds.__getitems__([4, 0, 7])
    assert len(samples) == 3
    for (x, y), i in zip(
        samples, [4, 0, 7]
    ):  # what a custom collate function that loops over samples sees
        assert torch.equal(x, ds[i][0]) and torch.equal(y, ds[i][1]) and x.shape == (31,)


def test_index_types(arange_file):
    ds = nd.NpyTokensDataset(arange_file(100), 9)
    assert ds[np.int64(3)][0][0].item() == 27
    assert ds[torch.tensor(3)][0][0].item() == 27
    assert ds[-1][0][0].item() == ds[len(ds) - 1][0][0].item()
    for bad, err in [
        (len(ds), IndexError),
        (-len(ds) - 1, IndexError),
        (1.0, TypeError),
        (slice(0, 2), TypeError),
        (True, TypeError),
        ((0, 1, 2), TypeError),
        ((-1, 0), ValueError),
    ]:
        with pytest.raises(err):
            ds[bad]


# --- workers, pickling, sampler -------------------------------------------------------------


def test_pickles_small_without_the_data(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200_000), 64)
    ds[0]  # open the memmap first, as the main process would have
    blob = pickle.dumps(ds)
    assert len(blob) < 1024
    clone = pickle.loads(blob)
    assert clone._maps == {} and torch.equal(clone[5][0], ds[5][0])
    assert pickle.loads(blob).memmap().flags.writeable is False


def _batches(loader, epochs=2):
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(epochs)]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_count_and_start_method_do_not_change_batches(arange_file, context):
    ds = nd.NpyTokensDataset(
        arange_file(20_000, dtype=np.uint16), 50, mode="random", num_samples=96, seed=7
    )

    def loader(workers):
        extra = {"multiprocessing_context": context, "persistent_workers": True} if workers else {}
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


def test_epoch_sampler_permutations(arange_file):
    sampler = nd.EpochSampler(range(10), seed=5)
    first, second = list(sampler), list(sampler)
    assert [e for e, _ in first] == [0] * 10 and [e for e, _ in second] == [1] * 10
    assert sorted(i for _, i in first) == list(range(10)) and first != second
    sampler.set_epoch(0)
    assert list(sampler) == first
    assert [i for _, i in nd.EpochSampler(range(4), shuffle=False)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        sampler.set_epoch(-1)


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


# --- bad input --------------------------------------------------------------------------------


def _error(path, seq_len=4, **kwargs):
    with pytest.raises((ValueError, TypeError, FileNotFoundError)) as info:
        nd.NpyTokensDataset(path, seq_len, **kwargs)
    return str(info.value)


def test_missing_directory_and_empty_files(tmp_path):
    assert "does not exist" in _error(tmp_path / "nope.npy")
    assert "is a directory" in _error(tmp_path)
    (tmp_path / "empty.npy").touch()
    assert "empty (0 bytes)" in _error(tmp_path / "empty.npy")
    os.mkfifo(tmp_path / "fifo.npy")
    assert "not a regular file" in _error(tmp_path / "fifo.npy")  # and it did not block reading


def test_pickle_disguised_as_npy_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "evil.npy").write_bytes(pickle.dumps(Payload()))
    assert "not a .npy file" in _error(tmp_path / "evil.npy")
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,)}"
    (tmp_path / "obj.npy").write_bytes(_npy_bytes(header) + pickle.dumps([Payload()]))
    msg = _error(tmp_path / "obj.npy")
    assert "'|O' is not supported" in msg and not marker.exists()


@pytest.mark.parametrize(
    "array, expected",
    [
        (np.arange(10, dtype=np.float32), "'<f4' is not supported"),
        (np.arange(10, dtype=np.int64), "'<i8' is not supported"),
        (np.arange(10, dtype=">u2"), "'>u2' is not supported"),
        (
            np.arange(27, dtype=np.uint16).reshape(3, 3, 3),
            "1-D or 2-D token array, got shape (3, 3, 3)",
        ),
        (np.arange(4, dtype=np.uint16), "the file has 4 tokens; seq_len=4 needs at least 5"),
        (np.arange(8, dtype=np.uint16).reshape(2, 4), "each row has 4 tokens"),
        (np.zeros(0, dtype=np.uint16), "holds no tokens"),
        (np.asfortranarray(np.arange(20, dtype=np.uint16).reshape(4, 5)), "fortran_order=True"),
    ],
)
def test_bad_npy_contents(tmp_path, array, expected):
    np.save(tmp_path / "bad.npy", array)
    msg = _error(tmp_path / "bad.npy")
    assert expected in msg and "bad.npy" in msg


def _npy_bytes(header: bytes, version=b"\x01\x00") -> bytes:
    return b"\x93NUMPY" + version + len(header).to_bytes(2, "little") + header


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"hello world, not numpy", "not a .npy file"),
        (b"\x93NUMPY\x04\x00\x10\x00", "unsupported .npy version 4.0"),
        (b"\x93NUMPY\x02\x00\xff\xff\xff\xff" + b" " * 6, "larger than the 10000 allowed"),
        (
            _npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (4,)}")[:-10],
            "truncated header",
        ),
        (_npy_bytes(b"__import__('os').system('true')") + b"\0" * 8, "not a Python literal"),
        (_npy_bytes(b"{'descr': '<u2', 'shape': (4,)}") + b"\0" * 8, "must have keys"),
        (
            _npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (-5,)}"),
            "got shape (-5,)",
        ),
        (
            _npy_bytes(
                b"{'descr': '<u2', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904)}"
            ),
            "is truncated",
        ),
        (
            _npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (1000000,)}")
            + b"\0" * 228,
            "is truncated",
        ),
        (
            _npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (6,)}") + b"\0" * 14,
            "has trailing bytes",
        ),
        (
            _npy_bytes(b"{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (6,)}")
            + b"\0" * 12,
            "structured",
        ),
    ],
)
def test_bad_npy_headers(tmp_path, raw, expected):
    (tmp_path / "bad.npy").write_bytes(raw)
    assert expected in _error(tmp_path / "bad.npy")


def test_seq_len_must_be_a_positive_int(arange_file):
    path = arange_file(100)
    for bad, expected in [
        (0, "at least 1, got 0"),
        (-3, "at least 1, got -3"),
        (True, "got bool"),
        (2.0, "got float"),
        ("8", "got str"),
        (None, "got NoneType"),
    ]:
        assert expected in _error(path, seq_len=bad)
    assert len(nd.NpyTokensDataset(path, np.int32(9))) == 11


def test_other_parameters(arange_file):
    path = arange_file(100)
    assert "mode must be one of" in _error(path, mode="sliding")
    assert 'num_samples applies to mode="random" only' in _error(path, num_samples=5)
    assert "epoch_offset applies" in _error(path, mode="random", epoch_offset=True)
    assert "seed must be at least 0" in _error(path, seed=-1)


def test_raw_bin_files(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")  # nanoGPT's layout: no header, no sidecar
    assert "pass dtype=np.uint16" in _error(tmp_path / "train.bin")
    ds = nd.NpyTokensDataset(tmp_path / "train.bin", 8, dtype=np.uint16)
    assert ds[3][0].tolist() == list(range(24, 32))
    (tmp_path / "odd.bin").write_bytes(b"\0" * 2001)
    assert "size 2001 bytes is not a multiple of 2 (uint16)" in _error(
        tmp_path / "odd.bin", dtype="uint16"
    )
    write_tokens(tmp_path / "wide.bin", np.arange(1000, dtype=np.uint32))
    assert (
        nd.NpyTokensDataset(tmp_path / "wide.bin", 8)[1][0][0].item() == 8
    )  # dtype from the sidecar
    assert "sidecar" in _error(tmp_path / "wide.bin", dtype=np.uint16) and "says uint32" in _error(
        tmp_path / "wide.bin", dtype=np.uint16
    )


def test_sidecar_must_agree_with_the_file(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    for field, value in [
        ("dtype", "uint32"),
        ("n_tokens", 999),
        ("file_size", 7),
        ("shape", [999]),
        ("layout", "bin"),
    ]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, **{field: value})
        msg = _error(path)
        assert f"{field} is {value!r} in the sidecar" in msg and f"{field}.npy" in msg
    path = write_tokens(tmp_path / "vocab.npy", tokens, max_token_id=70000, n_vocab=50257)
    assert "max_token_id 70000 is outside the vocabulary" in _error(path)
    path = write_tokens(tmp_path / "type.npy", tokens, n_tokens="1000")
    assert "field 'n_tokens' should be int" in _error(path)
    path = write_tokens(tmp_path / "hash.npy", tokens, sha256="0" * 64)
    assert len(nd.NpyTokensDataset(path, 4)) == 249  # the hash is read only on request
    assert "sha256 differs" in _error(path, verify=True)
    (tmp_path / "junk.npy.json").write_text("{not json")
    np.save(tmp_path / "junk.npy", tokens)
    assert "is not valid JSON" in _error(tmp_path / "junk.npy")


def test_vocab_size_check(arange_file):
    path = arange_file(1000)
    assert len(nd.NpyTokensDataset(path, 4, vocab_size=1000)) == 249
    assert "ids up to 999 may not fit vocab_size=999" in _error(path, vocab_size=999)


def test_read_only_file_and_memmap(arange_file):
    path = arange_file(100)
    os.chmod(path, 0o444)
    ds = nd.NpyTokensDataset(path, 9)
    assert ds.memmap().flags.writeable is False and ds.memmap().mode == "r"
    with pytest.raises(ValueError):
        ds.memmap()[0] = 1


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


def test_a_file_given_twice_warns_and_huge_epochs_are_refused_clearly(arange_file):
    path = arange_file(1000)
    with pytest.warns(UserWarning, match="is given more than once"):
        nd.NpyTokensDataset([path, str(path)], 9)
    huge = nd.NpyTokensDataset(path, 9, mode="random", num_samples=10**10)
    with pytest.raises(
        ValueError, match=r"EpochSampler needs 1 to 2\*\*31 windows an epoch, got 10,000,000,000"
    ):
        nd.make_dataloaders(huge, huge, batch_size=4)


@pytest.mark.skipif(
    not Path("/sys/devices/system/cpu/online").exists(), reason="maps a Linux /sys file"
)
def test_a_file_that_cannot_be_mapped_is_named(tmp_path):
    link = tmp_path / "tokens.bin"
    link.symlink_to(
        "/sys/devices/system/cpu/online"
    )  # a regular file of 4096 bytes to stat, but not one to map
    with pytest.raises(nd.TokenFileError, match=r"token file '.*tokens.bin' cannot be mapped"):
        nd.open_tokens(link, dtype=np.uint16)


def test_token_dtype_and_sidecar_path():
    assert nd.token_dtype(50257) == np.uint16 and nd.token_dtype(2**16) == np.uint16
    assert nd.token_dtype(2**16 + 1) == np.uint32 and nd.token_dtype(100277) == np.uint32
    for bad, err in [(0, ValueError), (2**32 + 1, ValueError), (True, TypeError), (5.0, TypeError)]:
        with pytest.raises(err):
            nd.token_dtype(bad)
    assert nd.sidecar_path("data/x/train.npy") == Path("data/x/train.npy.json")


def test_module_needs_only_numpy_torch_and_the_standard_library():
    tree = ast.parse((ROOT / "python_files" / "npy_datasets.py").read_text())
    roots = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    roots |= {
        n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0
    }
    assert roots - set(sys.stdlib_module_names) == {"numpy", "torch"}


def test_module_imports_in_a_fresh_interpreter_without_the_prep_packages():
    code = "import sys; sys.modules.update(tiktoken=None, datasets=None, tqdm=None); import npy_datasets; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "python_files",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_swapped_shards_of_one_size_are_refused_on_open(tmp_path):
    paths = [
        write_tokens(
            tmp_path / f"train_{i:06d}.npy", np.arange(1000 * i, 1000 * i + 1000, dtype=np.uint16)
        )
        for i in range(2)
    ]
    for p in paths:  # what the prep step records in each sidecar
        side = nd.sidecar_path(p)
        side.write_text(
            json.dumps({**json.loads(side.read_text()), "probe_sha256": nd.probe_sha256(p)})
        )
    assert nd.NpyTokensDataset(paths, 8)[0][0][0].item() == 0
    a, b = (p.read_bytes() for p in paths)  # swap the data files, leave the sidecars in place
    paths[0].write_bytes(b)
    paths[1].write_bytes(a)
    with pytest.raises(
        nd.TokenFileError,
        match=r"train_000000.npy': its first and last 64 KiB differ from what the sidecar",
    ):
        nd.NpyTokensDataset(paths, 8)
    big = write_tokens(
        tmp_path / "big.npy", np.arange(200_000, dtype=np.uint32)
    )  # head and tail probed apart
    assert nd.probe_sha256(big) != nd.probe_sha256(
        write_tokens(tmp_path / "other.npy", np.arange(1, 200_001, dtype=np.uint32))
    )


# --- found by a copier's review of the module ------------------------------------------------


def test_a_raw_bin_whose_first_ids_spell_an_llmc_date_opens_with_its_dtype(tmp_path):
    tokens = np.array(
        [100, 309, 13, 0, *range(1, 600)], dtype=np.uint16
    )  # as int32: 20250724, then version 13
    tokens.tofile(tmp_path / "train.bin")  # nanoGPT's layout (EOT appended): no header, no sidecar
    assert nd.open_tokens(tmp_path / "train.bin", dtype=np.uint16).tolist() == tokens.tolist()
    assert (
        nd.NpyTokensDataset(tmp_path / "train.bin", 8, dtype=np.uint16)[0][0].tolist()
        == tokens[:8].tolist()
    )


def test_index_arrays_must_be_1d_integers_and_a_list_of_pairs_holds_epoch_int_pairs(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)
    for bad in (np.array([1.0, 2.0]), np.zeros((2, 2), dtype=np.int64), np.array(3)):
        with pytest.raises(TypeError, match="an index array must be 1-D of integers"):
            ds[bad]
    assert torch.equal(ds[np.array([1, 2], dtype=np.uint64)][0], ds[[1, 2]][0])
    for pairs, bad in (([(0, 1), (0, [1, 2])], r"\(0, \[1, 2\]\)"), ([(0, 1), 5], "5")):
        with pytest.raises(
            TypeError,
            match=rf"a list of \(epoch, index\) pairs holds \(epoch, int\) pairs only, got {bad}$",
        ):
            ds[pairs]
    with pytest.raises(
        TypeError, match=r"index must be an int or an \(epoch, index\) pair, got tuple \(1, 2\)"
    ):
        ds[0, [(1, 2)]]  # an epoch and pairs with epochs of their own: refused, not read as epoch 1


def test_getitems_reads_a_tuple_of_ints_as_indices_and_takes_an_epoch_sampler_as_batch_sampler(
    arange_file,
):
    ds = nd.NpyTokensDataset(arange_file(400), 8, epoch_offset=True)
    assert [x[0].item() for x, _ in ds.__getitems__((5, 7))] == [
        ds[5][0][0].item(),
        ds[7][0][0].item(),
    ]
    sampler = nd.EpochSampler(ds, batch_size=4, seed=1)
    expected = [ds[epoch, indices][0] for epoch, indices in sampler]  # epoch 0
    got = [x for x, _ in DataLoader(ds, batch_sampler=sampler)]  # epoch 1: the sampler moves on
    sampler.set_epoch(1)
    assert [torch.equal(a, b) for a, b in zip(got, [ds[e, i][0] for e, i in sampler])] == [
        True
    ] * len(got)
    assert len(got) == len(expected) and not all(torch.equal(a, b) for a, b in zip(got, expected))


def test_set_epoch_after_a_resume_keeps_the_loaded_position_and_refuses_another_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 49 windows, 13 batches of 4
    first = nd.EpochSampler(ds, batch_size=4, seed=3)
    full = [i.tolist() for _, i in first]
    resumed = nd.EpochSampler(ds, batch_size=4, seed=3)
    resumed.load_state_dict(
        first.state_dict(consumed=5)
    )  # epoch 0 was cut after 5 of its 13 batches
    assert len(resumed) == 8
    resumed.set_epoch(0)  # what a DistributedSampler-style loop does at the top of the epoch
    rest = [i.tolist() for _, i in resumed]
    assert rest == full[5:] and len(rest) == 8 and len(resumed) == 13
    resumed.set_epoch(0)  # a pass has run since: set_epoch(0) is epoch 0 from its start
    assert [i.tolist() for _, i in resumed] == full
    again = nd.EpochSampler(ds, batch_size=4, seed=3)
    again.load_state_dict(
        resumed.state_dict(consumed=13)
    )  # saved on epoch 0's last step: epoch 1, position 0
    with pytest.raises(
        ValueError,
        match=r"set_epoch\(0\) right after load_state_dict\(\), whose state continues epoch 1 at "
        r"position 0: that would replay data",
    ):
        again.set_epoch(0)  # a loop that kept its own epoch count, one behind
    with pytest.raises(ValueError, match="that would skip data"):
        again.set_epoch(2)
    again.set_epoch(again.epoch)
    assert [e for e, _ in again] == [1] * 13
    again.set_epoch(0)  # a pass has run since: any epoch may be chosen again


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


def test_shards_without_a_settings_fingerprint_are_not_taken_for_one_set(tmp_path, recwarn):
    a = write_tokens(
        tmp_path / "a_000000.npy", np.arange(100, dtype=np.uint16), shard={"index": 0, "count": 2}
    )
    b = write_tokens(
        tmp_path / "b_000000.npy", np.arange(100, dtype=np.uint16), shard={"index": 0, "count": 2}
    )
    nd.NpyTokensDataset([a, b], 8)
    assert not [w for w in recwarn if "shards written together" in str(w.message)]


def test_consumed_cannot_exceed_the_batches_handed_out(arange_file):
    sampler = nd.EpochSampler(
        nd.NpyTokensDataset(arange_file(200), 8), batch_size=4, shuffle=False
    )  # 6 batches
    batches = iter(sampler)
    [next(batches) for _ in range(3)]
    assert sampler.state_dict(consumed=3)["position"] == 12
    assert json.dumps(sampler.state_dict(consumed=np.int64(3))) == json.dumps(
        sampler.state_dict(consumed=3)
    )  # a numpy step
    with pytest.raises(
        ValueError, match=r"consumed=4, but the latest pass has handed out only 3 of its 6 batches"
    ):
        sampler.state_dict(
            consumed=4
        )  # a global step after a resume, say: it would skip a batch silently


def test_sampler_and_sidecar_arguments_that_would_be_ignored_are_refused(arange_file, tmp_path):
    with pytest.raises(ValueError, match="drop_last=True needs a batch_size"):
        nd.EpochSampler(range(10), drop_last=True)
    path = write_tokens(tmp_path / "old.npy", np.arange(100, dtype=np.uint16), format_version=-5)
    with pytest.raises(
        nd.TokenFileError, match=r"format_version -5 is not a version \(1, 2, ...\)"
    ):
        nd.open_tokens(path)
    raw = arange_file(100, name="raw.npy", sidecar=False)
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        nd.open_tokens(raw, vocab_size=50257.0)
    ds = nd.NpyTokensDataset(raw, 8)
    with pytest.raises(IndexError, match="file -1 is out of range for a dataset of 1 files"):
        ds.memmap(-1)
    assert ds.memmap(0)[5] == 5


def test_a_npy_with_trailing_bytes_says_so_in_plain_words(tmp_path):
    path = tmp_path / "tail.npy"
    np.save(path, np.arange(6, dtype=np.uint16))
    path.write_bytes(path.read_bytes() + b"\0" * 4)
    with pytest.raises(
        nd.TokenFileError,
        match=r"tail.npy' has trailing bytes: shape \(6,\) of uint16 needs 140 bytes, file has 144",
    ):
        nd.read_npy_header(path)


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


@given(st.sets(st.integers(0, 60)))
def test_shard_ranges_name_every_index_once_in_runs(indices):
    """The shard warning's '1, 3-9' text: read back, it is the sorted indices (all of them up to 10 runs)."""
    text = nd._ranges(sorted(indices))
    runs = [part.split("-") for part in text.split(", ") if part and part != "..."]
    named = [i for run in runs for i in range(int(run[0]), int(run[-1]) + 1)]
    assert all(
        len(run) == 1 or int(run[0]) < int(run[1]) for run in runs
    )  # a run of one index is written once
    assert all(
        int(b[0]) > int(a[-1]) + 1 for a, b in zip(runs, runs[1:])
    )  # runs are maximal, in order
    assert named == sorted(indices)[: len(named)] and len(runs) <= 10
    assert text.endswith(", ...") == (len(named) < len(indices))


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
