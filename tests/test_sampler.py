"""EpochSampler: each epoch's order, every rank's share of it, set_epoch, and the arguments it
refuses. Resuming (state_dict, load_state_dict) is in test_resume.py.

Catalogue items 50-52, 55 and 56 (tests/bad_inputs.md).
"""

import itertools
import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import npy_datasets as nd
from conftest import SEQ, WORKER_TIMEOUT, write_parts, write_tokens

# --- orders and epochs --------------------------------------------------------------------------


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


def test_item_50_no_global_random_state(arange_file):
    path = arange_file(5000)
    rand = nd.NpyTokensDataset(path, 7, mode="random", num_samples=50, seed=3)

    def draw():
        sampler = nd.EpochSampler(rand, seed=3)
        return (
            [rand[(e, i)][0][0].item() for e in (0, 1) for i in range(50)],
            [rand[(e, 0)][0][0].item() for e in range(6)],
            list(sampler),
            list(sampler),
        )

    for seed in (1, 2):  # the global generators, seeded and advanced differently, change nothing
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        np.random.random(seed), torch.rand(seed), random.random()
        if seed == 1:
            first = draw()
    assert draw() == first
    assert len(set(first[1])) > 1  # the epochs do draw other windows
    generators = (np.random.Generator, np.random.RandomState, torch.Generator, random.Random)
    assert not any(isinstance(v, generators) for v in vars(rand).values())
    windows = nd.NpyTokensDataset(path, 7)
    loader = DataLoader(
        windows,
        batch_size=16,
        sampler=nd.EpochSampler(windows, seed=5),
        num_workers=2,
        timeout=WORKER_TIMEOUT,
        multiprocessing_context="fork",
    )
    starts = sorted(v for x, _ in loader for v in x[:, 0].tolist())
    assert starts == [7 * i for i in range(len(windows))]  # two workers, every window exactly once


def test_item_52_every_iteration_is_the_next_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 49 windows
    train, _ = nd.make_dataloaders(ds, ds, batch_size=6, num_workers=0, seed=3)
    epochs = [
        [v for x, _ in train for v in x[:, 0].tolist()] for _ in range(3)
    ]  # no set_epoch anywhere
    assert all(len(set(e)) == len(e) == 48 for e in epochs)  # 8 batches of 6, one window dropped
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    train.sampler.set_epoch(1)  # choosing an epoch replays it
    assert [v for x, _ in train for v in x[:, 0].tolist()] == epochs[1]


@pytest.mark.parametrize("persistent", [False, True])
def test_iterators_made_and_dropped_do_not_skip_epochs(tmp_path, persistent):
    sampler = nd.EpochSampler(range(10), seed=1)
    for _ in range(3):
        iter(sampler)  # made and dropped unused, as DataLoader's multiprocessing iterator does
    assert {epoch for epoch, _ in sampler} == {0}
    ds = nd.NpyTokensDataset(write_parts(tmp_path), SEQ, mode="random", num_samples=30, seed=6)

    def two_epochs(workers):
        sampler = nd.EpochSampler(ds, seed=2, batch_size=6)
        extra = {"persistent_workers": persistent, "timeout": WORKER_TIMEOUT} if workers else {}
        loader = DataLoader(ds, sampler=sampler, batch_size=None, num_workers=workers, **extra)
        batches = [[x.tolist() for x, _ in loader] for _ in range(2)]
        return batches, sampler.epoch

    reference, epochs = two_epochs(0)
    assert epochs == 2 and reference[0] != reference[1]
    assert two_epochs(2) == (reference, 2)


def test_sampler_and_sidecar_arguments_that_would_be_ignored_are_refused(arange_file, tmp_path):
    with pytest.raises(ValueError, match="drop_last=True needs a batch_size"):
        nd.EpochSampler(range(10), drop_last=True)
    path = write_tokens(tmp_path / "old.npy", np.arange(100, dtype=np.uint16), format_version=-5)
    with pytest.raises(nd.TokenFileError, match=r"format_version -5, not a version \(1, 2, ...\)"):
        nd.open_tokens(path)
    raw = arange_file(100, name="raw.npy", sidecar=False)
    with pytest.raises(TypeError, match="vocab_size must be an int"):
        nd.open_tokens(raw, vocab_size=50257.0)
    ds = nd.NpyTokensDataset(raw, 8)
    with pytest.raises(IndexError, match="file -1 is out of range for a dataset of 1 files"):
        ds.memmap(-1)
    assert ds.memmap(0)[5] == 5


# --- ranks' shares ------------------------------------------------------------------------------


REMAINDERS = ("drop", "pad")  # what a rank does when world_size does not divide an epoch


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


def test_item_55_fewer_windows_than_ranks_and_equal_steps(arange_file):
    ds = nd.NpyTokensDataset(arange_file(25), 8)  # 3 windows
    with pytest.raises(
        ValueError,
        match=r'3 windows for world_size=4: with remainder="drop" no rank would get one; use remainder="pad"',
    ):
        nd.make_dataloaders(
            ds, ds, batch_size=2, num_workers=0, world_size=4, rank=0
        )  # training drops
    padded = [nd.EpochSampler(ds, world_size=4, rank=r, remainder="pad") for r in range(4)]
    assert [len(list(s)) for s in padded] == [1] * 4 and padded[0].padded == 1
    for n in range(
        1, 25
    ):  # every rank takes the same number of steps, whatever n, W, B and the options
        for world in range(1, 9):
            for batch_size, drop_last, remainder in itertools.product(
                (1, 2, 5), (False, True), REMAINDERS
            ):
                share = n // world if remainder == "drop" else -(-n // world)
                if remainder == "drop" and n < world or drop_last and share < batch_size:
                    with pytest.raises(ValueError, match="no rank would get one|leaves no batch"):
                        nd.EpochSampler(
                            range(n),
                            world_size=world,
                            rank=0,
                            batch_size=batch_size,
                            drop_last=drop_last,
                            remainder=remainder,
                        )
                    continue
                ranks = [
                    nd.EpochSampler(
                        range(n),
                        world_size=world,
                        rank=r,
                        batch_size=batch_size,
                        drop_last=drop_last,
                        remainder=remainder,
                    )
                    for r in range(world)
                ]
                steps = {(len(s), len(list(s))) for s in ranks}
                assert len(steps) == 1 and len({a for a, b in steps if a == b}) == 1, (
                    n,
                    world,
                    batch_size,
                    drop_last,
                    remainder,
                )


def test_item_56_invalid_rank_or_world_size(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)
    cases = [
        (
            {"world_size": 2, "rank": 2},
            ValueError,
            "rank must be in [0, 2) for world_size=2, got 2",
        ),
        ({"world_size": 2, "rank": -1}, ValueError, "rank must be at least 0, got -1"),
        ({"world_size": 0, "rank": 0}, ValueError, "world_size must be at least 1, got 0"),
        ({"world_size": 2.0, "rank": 0}, TypeError, "world_size must be an int, got float 2.0"),
        ({"world_size": 2, "rank": True}, TypeError, "rank must be an int, got bool True"),
        (
            {"world_size": 2},
            ValueError,
            "pass both world_size and rank, or neither; got world_size=2, rank=None",
        ),
    ]
    for kwargs, error, message in cases:
        for build in (
            lambda: nd.EpochSampler(ds, **kwargs),
            lambda: nd.make_dataloaders(ds, ds, batch_size=4, num_workers=0, **kwargs),
        ):
            with pytest.raises(error) as info:
                build()
            assert message in str(info.value), (kwargs, str(info.value))
