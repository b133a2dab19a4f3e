"""NpyTokensDataset on one file: its windows and random starts, the index forms, the batched
gather, and its parameters.

Token files hold arange tokens (token i at position i), so every window proves its place.
Catalogue items 24-28, 39, 92 and 97 (tests/bad_inputs.md).
"""

import itertools
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import npy_datasets as nd
from conftest import WORKER_TIMEOUT, dataset_error, header_for, npy_bytes, write_tokens

FAST = settings(max_examples=60, deadline=None)


# --- windows ------------------------------------------------------------------------------------


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
        indices = list(range(min(len(ds), 20)))
        xs, ys = ds[epoch, indices]
        for x, y in zip(xs, ys):
            assert 0 <= x[0].item() <= n - seq_len - 1
            assert x.tolist() == list(range(x[0].item(), x[0].item() + seq_len))
            assert y.tolist() == (x + 1).tolist()
        assert torch.equal(again[epoch, indices][0], xs)


def test_random_mode_covers_all_starts_and_changes_with_seed_and_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(50), 9, mode="random", num_samples=4000)
    starts = {ds[i][0][0].item() for i in range(len(ds))}
    assert starts == set(range(50 - 9))  # every valid start, the last one (40) included
    first = ds[0, list(range(30))][0][:, 0].tolist()
    assert first != ds[1, list(range(30))][0][:, 0].tolist()
    other = nd.NpyTokensDataset(arange_file(50), 9, mode="random", num_samples=4000, seed=1)
    assert first != other[0, list(range(30))][0][:, 0].tolist()


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


def test_offsets_past_2_31_tokens_do_not_wrap(tmp_path):
    n = 2**31 + 1000  # 8 GiB of uint32 ids, stored sparsely: only the last 1000 are written
    header = npy_bytes(header_for("'<u4'", shape=f"({n},)").ljust(117, b" ") + b"\n")
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + 4 * n)
        f.seek(len(header) + 4 * (n - 1000))
        f.write(np.arange(n - 1000, n, dtype=np.uint32).tobytes())
    assert path.stat().st_blocks * 512 < 1 << 20, "the filesystem did not keep the file sparse"
    ds = nd.NpyTokensDataset(path, 100)
    assert len(ds) == (n - 1) // 100
    start = (len(ds) - 1) * 100  # above 2**31 - 1: an int32 offset would wrap negative
    assert start > 2**31
    x, y = ds[-1]
    assert x.tolist() == list(range(start, start + 100)) and y[-1].item() == start + 100
    bx, _ = ds[0, [len(ds) - 1, 0]]
    assert bx[0, 0].item() == start and bx[1].tolist() == [0] * 100
    files, firsts = ds.locate(0, np.array([len(ds) - 1]))
    assert firsts.dtype == np.int64 and int(firsts[0]) == start and files.tolist() == [0]


# --- index forms --------------------------------------------------------------------------------


def test_one_window_takes_an_int_of_any_integer_type_and_refuses_the_rest(arange_file):
    ds = nd.NpyTokensDataset(arange_file(100), 9)
    assert ds[np.int64(3)][0][0].item() == 27
    assert ds[torch.tensor(3)][0][0].item() == 27
    assert ds[-1][0][0].item() == ds[len(ds) - 1][0][0].item() == 90
    for bad, err, named in [
        (len(ds), IndexError, "index 11 is out of range for 11 windows"),
        (-len(ds) - 1, IndexError, "index -12 is out of range"),
        (1.0, TypeError, "1.0"),
        (slice(0, 2), TypeError, "slice(0, 2, None)"),
        (True, TypeError, "True"),  # a bool is an int to Python, never an index here
        ([1, 2], TypeError, "[1, 2]"),  # a batch needs its epoch: ds[0, [1, 2]]
        ((0, 1, 2), TypeError, "(0, 1, 2)"),
        ((0, 1), TypeError, "(1-D ints), not int64 1"),  # ds[0, [1]] is the batch form
        ((-1, [0]), ValueError, "epoch must be at least 0, got -1"),
    ]:
        with pytest.raises(err) as info:
            ds[bad]
        assert type(info.value) is err and named in str(info.value), (bad, info.value)


def test_a_batch_of_bad_indices_names_the_bad_one(arange_file):
    path = arange_file(100)
    ds = nd.NpyTokensDataset(path, 9)
    for bad, err, named in [
        ([0, len(ds)], IndexError, f"index 11 is out of range for 11 windows of {str(path)!r}"),
        ([-len(ds) - 1, 0], IndexError, "index -12 is out of range"),
        ([1.5, 2], TypeError, "1.5"),
        ([(0, 1), (0, 2)], TypeError, "(0, 1)"),  # (epoch, index) pairs are gone: a list of ints
        ([2**70], TypeError, str(2**70)),
        (np.array([1.0, 2.0]), TypeError, "float64"),
        (np.zeros((2, 2), dtype=np.int64), TypeError, "array"),
    ]:
        with pytest.raises(err) as info:
            ds.__getitems__(bad)
        assert type(info.value) is err and named in str(info.value), (bad, info.value)
    samples = ds.__getitems__([np.int64(2), -1, 0])
    assert [x[0].item() for x, _ in samples] == [18, 90, 0]


def test_a_bool_among_int_indices_is_refused_as_a_bool_alone_is(arange_file):
    ds = nd.NpyTokensDataset(arange_file(100), 9)
    with pytest.raises(TypeError, match="True"):
        ds.__getitems__([True, 1])


def test_epoch_and_indices_index_a_batch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(5000), 17, mode="random", seed=3)
    indices = np.array([4, 0, 7, -1])
    x, y = ds[2, indices]  # what EpochSampler hands a DataLoader
    assert torch.equal(x, torch.stack([ds[2, [int(i)]][0][0] for i in indices]))
    assert torch.equal(y, torch.stack([ds[2, [int(i)]][1][0] for i in indices]))
    assert torch.equal(ds[2, indices.tolist()][0], x)  # a list is the same batch
    assert torch.equal(ds[2, tuple(indices.tolist())][0], x)  # and so is a tuple
    assert torch.equal(ds[2, torch.from_numpy(indices)][0], x)  # and a tensor
    assert torch.equal(x[3], ds[2, [len(ds) - 1]][0][0])  # a negative index counts from the end
    assert not torch.equal(x, ds[3, indices][0])  # another epoch, other random starts
    for bad, err in [
        ((2, np.array([len(ds)])), IndexError),
        ((2, [0, len(ds)]), IndexError),
        ((-1, indices), ValueError),
        ((2**63, indices), ValueError),
        ((True, indices), TypeError),
        ((2, [(0, 1)]), TypeError),  # an epoch and a pair: refused, never read as epoch 0
        ((2, np.array([1.5])), TypeError),
        ((2, np.array(3)), TypeError),  # a 0-d array is not a batch
        ((2, (1, True)), TypeError),  # a bool among the indices, in a tuple as in a list
        ((2, torch.tensor([True, False])), TypeError),
        ((2, torch.zeros(2)), TypeError),  # a float tensor
    ]:
        with pytest.raises(err) as info:
            ds[bad]
        assert type(info.value) is err, (bad, info.value)


def test_negative_indices_in_a_batch_are_the_windows_they_name(arange_file):
    ds = nd.NpyTokensDataset(arange_file(1000), 8)  # 124 windows: window -1 starts at 8 * 123
    for keys in ([-1, -124, 3], np.array([-1, -124, 3])):
        x, _ = ds[0, keys]
        assert x[:, 0].tolist() == [984, 0, 24], keys
    samples = ds.__getitems__([-1, -124, 3])
    assert [x[0].item() for x, _ in samples] == [984, 0, 24]
    assert [x[:, 0].tolist() for x, _ in DataLoader(ds, batch_size=3, sampler=[-1, -124, 3])] == [
        [984, 0, 24]
    ]


def test_an_epoch_sampler_feeds_a_dataloader_whole_batches_of_its_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8, mode="random", num_samples=40)
    sampler = nd.EpochSampler(ds, batch_size=4, seed=1)
    expected = [ds[epoch, indices][0] for epoch, indices in sampler]  # epoch 0
    got = [x for x, _ in DataLoader(ds, sampler=sampler, batch_size=None)]  # epoch 1: moves on
    sampler.set_epoch(1)
    assert [torch.equal(a, b) for a, b in zip(got, [ds[e, i][0] for e, i in sampler])] == [
        True
    ] * len(got)
    assert len(got) == len(expected) == 10
    assert not all(torch.equal(a, b) for a, b in zip(got, expected))


# --- the batched gather -------------------------------------------------------------------------


def test_batched_gather_equals_item_by_item(arange_file):
    cases = [
        nd.NpyTokensDataset(arange_file(5000), 17),
        nd.NpyTokensDataset(
            arange_file(5000, name="r.npy", dtype=np.uint16), 17, mode="random", seed=9
        ),
        nd.NpyTokensDataset(arange_file(4800, name="2d.npy", shape=(12, 400)), 33, mode="random"),
        nd.NpyTokensDataset(arange_file(4800, name="2w.npy", shape=(12, 400)), 33),
    ]
    rng = np.random.default_rng(0)
    for ds, epoch in itertools.product(cases, range(3)):
        keys = rng.integers(-len(ds), len(ds), 40)
        x, y = ds[epoch, keys]
        assert x.dtype == y.dtype == torch.int64 and x.is_contiguous() and y.is_contiguous()
        assert torch.equal(x, torch.cat([ds[epoch, [int(k)]][0] for k in keys]))
        assert torch.equal(y, torch.cat([ds[epoch, [int(k)]][1] for k in keys]))
        x[0, 0] = -1
        assert y.min().item() >= 0  # y is its own tensor: editing x cannot change it


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_batches_widen_ids_with_the_top_bit_set_exactly(tmp_path, dtype):
    top = np.iinfo(dtype).max  # ids with the sign bit set would turn negative in a signed widening
    tokens = (top - np.arange(3000, dtype=np.int64)).astype(dtype)
    ds = nd.NpyTokensDataset(write_tokens(tmp_path / "hi.npy", tokens), 16)
    x, y = ds[0, [0, 5, 100]]
    assert x.shape == y.shape == (3, 16) and x.dtype == y.dtype == torch.int64
    assert x[0, 0].item() == top and x[1, 0].item() == top - 80 and torch.equal(y[:, :-1], x[:, 1:])
    assert all(torch.equal(a, b) for a, b in zip(nd.to_device((x, y), "cpu"), (x, y)))


def test_windows_are_int64_copies(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(200, dtype=np.uint16))
    ds = nd.NpyTokensDataset(path, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning about non-writable arrays
        x, y = ds[3]
        bx, by = ds[0, [3, 4]]
        dx, dy = torch.utils.data.default_collate(
            ds.__getitems__([3, 4])
        )  # what a plain DataLoader does
    for t, shape in [
        (x, (16,)),
        (y, (16,)),
        (bx, (2, 16)),
        (by, (2, 16)),
        (dx, (2, 16)),
        (dy, (2, 16)),
    ]:
        assert t.dtype == torch.int64 and t.is_contiguous() and tuple(t.shape) == shape
    x.add_(1000)
    bx.add_(1000)
    assert y[0].item() == 49 and by[0, 0].item() == 49  # y never shares memory with x
    assert ds[3][0][0].item() == 48 and nd.open_tokens(path)[48] == 48  # nor with the file


def test_samples_read_one_by_one_are_the_items(arange_file):
    ds = nd.NpyTokensDataset(arange_file(3000), 31)
    samples = ds.__getitems__([4, 0, 7])
    assert len(samples) == 3
    for (x, y), i in zip(
        samples, [4, 0, 7]
    ):  # what a custom collate function that loops over samples sees
        assert torch.equal(x, ds[i][0]) and torch.equal(y, ds[i][1]) and x.shape == (31,)


@pytest.mark.parametrize("workers", [0, 2])
def test_plain_dataloader_batches_equal_the_item_path(arange_file, workers):
    path = arange_file(3000, dtype=np.uint16)
    timeout = WORKER_TIMEOUT if workers else 0
    in_order = nd.NpyTokensDataset(path, 31)
    x, y = next(iter(DataLoader(in_order, batch_size=5, num_workers=workers, timeout=timeout)))
    assert x[:, 0].tolist() == [0, 31, 62, 93, 124]
    assert torch.equal(y[:, :-1], x[:, 1:])
    ds = nd.NpyTokensDataset(path, 31, mode="random", num_samples=40, seed=2)
    plain = list(
        DataLoader(ds, batch_size=8, num_workers=workers, timeout=timeout)
    )  # default_collate, as copied code writes it
    per_item = [
        torch.utils.data.default_collate([ds[i] for i in range(k, k + 8)]) for k in range(0, 40, 8)
    ]
    assert len(plain) == len(per_item) == 5
    for (x, y), reference in zip(plain, per_item):
        assert (
            torch.equal(x, reference[0]) and torch.equal(y, reference[1]) and x.dtype == torch.int64
        )


# --- parameters ---------------------------------------------------------------------------------


def test_seq_len_of_the_wrong_type_or_value_is_refused_by_name(arange_file):
    path = arange_file(100)
    for bad, error, expected in [
        (0, ValueError, "seq_len must be at least 1, got 0"),
        (-1, ValueError, "got -1"),
        (2**70, ValueError, f"got {2**70}"),
        (True, TypeError, "seq_len must be an int, got bool True"),
        (2.0, TypeError, "got float 2.0"),
        ("8", TypeError, "got str '8'"),
        (None, TypeError, "got NoneType None"),
    ]:
        with pytest.raises(error) as info:
            nd.NpyTokensDataset(path, bad)
        assert type(info.value) is error and expected in str(info.value)
    for good in (np.int64(9), np.uint8(9), np.int32(9), 9):
        assert len(nd.NpyTokensDataset(path, good)) == 11


def test_too_few_tokens_for_one_window_are_refused_naming_the_counts(arange_file):
    four = arange_file(4, name="four.npy")
    message = dataset_error(four, seq_len=4)
    assert message.startswith(f"{str(four)!r} holds no window"), message  # one file: no "rest"
    assert "4 tokens" in message and "needs 5" in message
    assert len(nd.NpyTokensDataset(arange_file(5, name="five.npy"), 4)) == 1
    message = dataset_error(arange_file(8, name="rows.npy", shape=(2, 4)), seq_len=4)
    assert "4 tokens" in message and "needs 5" in message  # each row is a sequence of its own
    random_mode = nd.NpyTokensDataset(
        arange_file(5, name="r.npy"), 4, mode="random", num_samples=10
    )
    assert {random_mode[i][0].tolist()[0] for i in range(10)} == {0}  # the single valid start


def test_other_parameters(arange_file):
    path = arange_file(100)
    assert "'sliding'" in dataset_error(path, mode="sliding")
    assert 'num_samples applies to mode="random" only' in dataset_error(path, num_samples=5)
    assert "seed must be at least 0, got -1" in dataset_error(path, seed=-1)
    assert "num_samples must be at least 1, got 0" in dataset_error(
        path, mode="random", num_samples=0
    )


# --- issue 19: what an attack found ---------------------------------------------------------------


def test_random_windows_of_one_epoch_are_not_the_next_epochs_shifted_by_one(arange_file):
    """The epoch and the index are mixed in separate steps: hashing epoch + index in one would make
    epoch e + 1's window i epoch e's window i + 1."""
    ds = nd.NpyTokensDataset(arange_file(100_000), 8, mode="random", num_samples=1000)
    for epoch in range(3):
        now = ds[epoch, np.arange(1, 1000)][0][:, 0]
        following = ds[epoch + 1, np.arange(0, 999)][0][:, 0]
        assert (now == following).float().mean().item() < 0.01


def test_huge_numbers_and_a_bool_index_are_refused_by_name(arange_file):
    path = arange_file(100)
    assert f"seq_len must be below 2**63, got {2**70}" in dataset_error(path, seq_len=2**70)
    rand = nd.NpyTokensDataset(path, 9, mode="random", num_samples=5)
    for bad in ((2**63, [1]), (2**64, np.array([1]))):
        with pytest.raises(ValueError, match=r"epoch must be below 2\*\*63, got"):
            rand[bad]
    for bad in (True, np.bool_(True)):
        with pytest.raises(TypeError, match="bool"):
            rand[bad]
        with pytest.raises(TypeError, match="bool"):
            rand[0, [bad]]


def test_locate_takes_a_list_as_it_takes_an_array(arange_file):
    ds = nd.NpyTokensDataset(arange_file(100), seq_len=10)
    files, firsts = ds.locate(0, [1, 2])
    assert files.tolist() == [0, 0] and firsts.tolist() == [10, 20]
    assert [a.tolist() for a in ds.locate(0, np.array([1, 2]))] == [[0, 0], [10, 20]]


def test_num_samples_is_checked_before_any_file_is_opened(tmp_path):
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        nd.NpyTokensDataset(tmp_path / "missing.npy", 4, mode="random", num_samples=0)


def test_an_index_past_the_end_of_many_files_counts_them_all(arange_file):
    """The message says the windows are of all the files, not of the first one alone."""
    paths = [arange_file(100, name=f"part_{i}.npy") for i in range(3)]
    ds = nd.NpyTokensDataset(paths, seq_len=10)
    with pytest.raises(IndexError) as info:
        ds[len(ds)]
    assert (
        str(info.value)
        == f"index 27 is out of range for 27 windows of {str(paths[0])!r} and 2 more files"
    )


def test_locate_checks_its_epoch_and_indices_as_a_batch_does(arange_file):
    """locate is public: it refuses what ds[epoch, indices] refuses, and reads -1 as the last."""
    path = arange_file(100)
    ds = nd.NpyTokensDataset(path, seq_len=10)
    last = ds.locate(0, [len(ds) - 1])
    assert [a.tolist() for a in ds.locate(0, [-1])] == [a.tolist() for a in last]
    for epoch, indices, err, named in [
        (-1, [0], ValueError, "epoch must be at least 0, got -1"),
        ("0", [0], TypeError, "epoch must be an int"),
        (True, [0], TypeError, "epoch must be an int"),
        (0, [len(ds)], IndexError, f"index 9 is out of range for 9 windows of {str(path)!r}"),
        (0, [-len(ds) - 1], IndexError, "index -10 is out of range"),
        (0, [[1, 2]], TypeError, "[[1, 2]]"),
        (0, [1.5], TypeError, "1.5"),
        (0, [True], TypeError, "bool"),
        (0, (np.True_, 1), TypeError, "True"),  # numpy's bool, which np.asarray reads as 1
    ]:
        with pytest.raises(err) as info:
            ds.locate(epoch, indices)
        assert type(info.value) is err and named in str(info.value), (epoch, indices, info.value)
