"""EpochSampler: each epoch's order, which epoch a pass is (set_epoch, loops that stop early,
DataLoader workers that fetch ahead), every rank's share of an epoch, and the arguments it refuses.
Resuming (state_dict, load_state_dict) is in test_resume.py.

Catalogue items 50, 51, 52, 55 and 56 (tests/bad_inputs.md).
"""

import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import npy_datasets as nd
from conftest import SEQ, WORKER_TIMEOUT, write_parts

BATCH = 8  # the batch size of the loaders below
SEED = 3  # make_dataloaders' seed in the loaders below


def train_loader(ds: nd.NpyTokensDataset, workers: int) -> DataLoader:
    """make_dataloaders' training loader (persistent workers, prefetch_factor 2), with a timeout
    that fails a hung worker instead of waiting for ever."""
    loader, _ = nd.make_dataloaders(ds, batch_size=BATCH, num_workers=workers, seed=SEED)
    loader.dataloader.timeout = WORKER_TIMEOUT if workers else 0
    return loader


def expected_batches(ds: nd.NpyTokensDataset, epoch: int) -> list[list[int]]:
    """The first token of each window of each batch the training loader gives in `epoch`: its
    order (a permutation drawn from (seed, epoch)) cut into whole batches."""
    order = np.random.default_rng([SEED, epoch]).permutation(len(ds))
    firsts = ds[epoch, order][0][:, 0].tolist()
    whole = len(firsts) // BATCH * BATCH  # drop_last: the short batch is left out
    return [firsts[i : i + BATCH] for i in range(0, whole, BATCH)]


def firsts(x: torch.Tensor) -> list[int]:
    """The first token of each window of a batch: in an arange file, where the window starts."""
    return x[:, 0].tolist()


# --- orders and epochs --------------------------------------------------------------------------


def test_each_epoch_is_a_permutation_drawn_from_seed_and_epoch():
    sampler = nd.EpochSampler(range(10), seed=5, batch_size=3)
    first, second = list(sampler), list(sampler)
    assert [e for e, _ in first] == [0] * 4 and [e for e, _ in second] == [1] * 4
    assert [len(i) for _, i in first] == [3, 3, 3, 1]  # without drop_last the last batch is short
    assert all(isinstance(i, np.ndarray) and i.dtype == np.int64 for _, i in first)
    orders = [np.concatenate([i for _, i in p]).tolist() for p in (first, second)]
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(10)) and orders[0] != orders[1]
    expected = np.random.default_rng([5, 0]).permutation(10).tolist()  # numpy draws the order
    assert orders[0] == expected
    sampler.set_epoch(0)
    assert [i.tolist() for _, i in sampler] == [i.tolist() for _, i in first]
    in_order = nd.EpochSampler(range(4), shuffle=False, batch_size=3)
    assert [i.tolist() for _, i in in_order] == [[0, 1, 2], [3]]


def test_global_random_state_changes_no_window_and_no_order(arange_file):
    path = arange_file(5000)
    rand = nd.NpyTokensDataset(path, 7, mode="random", num_samples=50, seed=3)

    def draw():
        sampler = nd.EpochSampler(rand, seed=3, batch_size=7)
        return (
            [rand[e, [i]][0][0, 0].item() for e in (0, 1) for i in range(50)],
            [rand[e, [0]][0][0, 0].item() for e in range(6)],
            [(e, i.tolist()) for e, i in sampler],
            [(e, i.tolist()) for e, i in sampler],
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
        batch_size=None,
        sampler=nd.EpochSampler(windows, seed=5, batch_size=16),
        num_workers=2,
        timeout=WORKER_TIMEOUT,
        multiprocessing_context="fork",
    )
    starts = sorted(v for x, _ in loader for v in firsts(x))
    assert starts == [7 * i for i in range(len(windows))]  # two workers, every window exactly once


def test_each_pass_is_the_next_epoch_without_set_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 49 windows
    train = train_loader(ds, 0)
    epochs = [[v for x, _ in train for v in firsts(x)] for _ in range(3)]  # no set_epoch anywhere
    assert all(len(set(e)) == len(e) == 48 for e in epochs)  # 6 batches of 8, one window dropped
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    train.sampler.set_epoch(1)  # choosing an epoch replays it
    assert [v for x, _ in train for v in firsts(x)] == epochs[1]


@pytest.mark.parametrize("persistent", [False, True])
def test_iterators_made_and_dropped_do_not_skip_epochs(tmp_path, persistent):
    sampler = nd.EpochSampler(range(10), seed=1, batch_size=3)
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


# --- which epoch a pass is: loops that stop early, set_epoch, workers that fetch ahead ----------


def full_for(loader):
    return [firsts(x) for x, _ in loader]


def zip_range_len(loader):
    return [firsts(x) for _, (x, _) in zip(range(len(loader)), loader)]


def islice_len(loader):
    return [firsts(x) for x, _ in itertools.islice(loader, len(loader))]


def break_at_the_last_step(loader):
    taken = []
    for step, (x, _) in enumerate(loader, 1):
        taken.append(firsts(x))
        if step == len(loader):
            break
    return taken


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_loop_that_takes_exactly_len_batches_moves_on_to_the_next_epoch(arange_file, workers):
    """Issue 26: with 0 workers these loops never ran a pass to its end and replayed epoch 0 for
    ever; with workers they moved on. Every loop form now sees epochs 0, 1, 2 with any workers."""
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 49 windows: 6 batches of 8 an epoch
    epochs = [expected_batches(ds, e) for e in range(4)]
    for loop in (full_for, zip_range_len, islice_len, break_at_the_last_step):
        loader = train_loader(ds, workers)
        seen = []
        for done in range(1, 4):
            batches = loop(loader)
            seen.append(epochs.index(batches) if batches in epochs else batches)
            state = loader.sampler.state_dict(consumed=len(loader))
            assert loader.sampler.epoch == state["epoch"] == done, (loop.__name__, seen)
        assert seen == [0, 1, 2], loop.__name__  # the same batches for 0, 1 and 2 workers


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_during_a_pass_chooses_the_pass_after_it(arange_file, workers):
    """Issue 26: set_epoch(7) in the middle of epoch 0 made the pass after it epoch 1 once epoch 0
    ran to its end. The running pass ends as it began; the next one is epoch 7."""
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 6 batches of 8 an epoch
    loader = train_loader(ds, workers)
    running = []
    for step, (x, _) in enumerate(loader, 1):
        running.append(firsts(x))
        if step == 2:
            loader.sampler.set_epoch(7)
    assert running == expected_batches(ds, 0)
    state = loader.sampler.state_dict()
    assert loader.sampler.epoch == 7 and (state["epoch"], state["position"]) == (7, 0)
    assert full_for(loader) == expected_batches(ds, 7)
    assert full_for(loader) == expected_batches(ds, 8)  # and on from there
    for step, _ in enumerate(loader, 1):  # a loop that chooses an epoch, then leaves
        if step == 1:
            loader.sampler.set_epoch(3)
            break
    assert loader.sampler.epoch == 3 and full_for(loader) == expected_batches(ds, 3)


def peek(loader):
    next(iter(loader))


def break_at_step_4(loader):
    for step, _ in enumerate(loader, 1):
        if step == 4:
            break


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_loop_that_calls_set_epoch_gets_its_epochs_whatever_workers_fetched(arange_file, workers):
    """Workers fetch num_workers * prefetch_factor batches ahead: a peek at an epoch of 3 batches,
    or a break at step 4 of 6, had the workers fetch the whole epoch, which then counted as done
    with workers and not without (issue 32). The loader counts what the loop received: the epoch
    is not done with any worker count, and a loop that calls set_epoch(epoch) gets epochs 0, 1, 2."""
    short = nd.NpyTokensDataset(arange_file(200, name="short.npy"), 8)  # 3 batches of 8 an epoch
    longer = nd.NpyTokensDataset(arange_file(400, name="longer.npy"), 8)  # 6 batches of 8
    for ds, interrupt in ((short, peek), (longer, break_at_step_4)):
        loader = train_loader(ds, workers)
        interrupt(loader)
        assert loader.sampler.epoch == 0, interrupt.__name__
        seen = []
        for epoch in range(3):
            loader.sampler.set_epoch(epoch)
            seen.append(full_for(loader))
        assert seen == [expected_batches(ds, e) for e in range(3)], interrupt.__name__


# --- ranks' shares ------------------------------------------------------------------------------


REMAINDERS = ("drop", "pad")  # what a rank does when world_size does not divide an epoch


def share_of(n: int, world: int, remainder: str) -> int:
    """The windows of an epoch of n that each of `world` ranks takes."""
    return n // world if remainder == "drop" else -(-n // world)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("remainder", REMAINDERS)
@pytest.mark.parametrize("shuffle", [False, True])
def test_ranks_split_each_epoch_disjoint_and_complete(shuffle, remainder, batch_size, drop_last):
    settings = {"shuffle": shuffle, "seed": 11, "batch_size": batch_size, "drop_last": drop_last}
    for n in (1, 2, 5, 8, 13, 37):
        whole = nd.EpochSampler(range(n), shuffle=shuffle, seed=11, batch_size=1)
        orders = [whole.order(e).tolist() for e in range(2)]  # one rank: the epoch's order
        if n >= 5 and shuffle:
            assert orders[0] != orders[1] and sorted(orders[0]) == list(range(n))
        elif not shuffle:
            assert orders == [list(range(n))] * 2
        for world in range(1, 9):
            share = share_of(n, world, remainder)
            kept = share - share % batch_size if drop_last else share
            if kept == 0:  # no rank would get a batch: refused, not an empty epoch
                with pytest.raises(ValueError, match=rf"batch_size={batch_size}\b.*\b{share}\b"):
                    nd.EpochSampler(
                        range(n), world_size=world, rank=0, remainder=remainder, **settings
                    )
                continue
            ranks = [
                nd.EpochSampler(range(n), world_size=world, rank=r, remainder=remainder, **settings)
                for r in range(world)
            ]
            for epoch in range(2):
                passes = [list(s) for s in ranks]
                assert {e for p in passes for e, _ in p} == {epoch}
                assert {len(p) for p in passes} == {len(ranks[0])}  # every rank as many steps
                assert all(len(i) == batch_size for p in passes for _, i in p[:-1])
                items = [[int(i) for _, b in p for i in b] for p in passes]
                assert [len(mine) for mine in items] == [kept] * world
                # rank r took items r, r + W, ... of the epoch's order; pad repeats its first ones
                merged = [items[r][j] for j in range(kept) for r in range(world)]
                assert merged == (orders[epoch] * world)[: len(merged)]
                if remainder == "drop":  # the order's last n % W windows are left out
                    assert len(set(merged)) == len(merged)
                    assert drop_last or len(merged) == n - n % world
                elif not drop_last:  # every window, and -n % W of them twice
                    assert set(merged) == set(range(n)) and len(merged) == n + -n % world


def test_every_rank_takes_the_same_number_of_steps(arange_file):
    ds = nd.NpyTokensDataset(arange_file(25), 8)  # 3 windows
    with pytest.raises(ValueError, match=r"batch_size=2\b.*\b0\b"):  # training drops 3 % 4:
        nd.make_dataloaders(ds, ds, batch_size=2, num_workers=0, world_size=4, rank=0)  # 0 each
    settings = {"shuffle": False, "remainder": "pad", "batch_size": 2}
    padded = [nd.EpochSampler(ds, world_size=4, rank=r, **settings) for r in range(4)]
    batches = [[i.tolist() for _, i in s] for s in padded]
    assert batches == [[[0]], [[1]], [[2]], [[0]]]  # one step each; window 0 twice
    for n, world in itertools.product(range(1, 25), range(1, 9)):
        for batch_size, drop_last, remainder in itertools.product(
            (1, 2, 5), (False, True), REMAINDERS
        ):
            settings = {"batch_size": batch_size, "drop_last": drop_last, "remainder": remainder}
            share = share_of(n, world, remainder)
            if share == 0 or drop_last and share < batch_size:
                with pytest.raises(ValueError, match=rf"batch_size={batch_size}\b"):
                    nd.EpochSampler(range(n), world_size=world, rank=0, **settings)
                continue
            ranks = [
                nd.EpochSampler(range(n), world_size=world, rank=r, **settings)
                for r in range(world)
            ]
            steps = {(len(s), len(list(s))) for s in ranks}  # len() before a pass, and its batches
            assert len(steps) == 1 and len({a for a, b in steps if a == b}) == 1, (
                n,
                world,
                settings,
            )


def test_an_invalid_rank_or_world_size_is_refused_by_name(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)
    cases = [  # the arguments, the error, and what its message must name: the argument, the value
        ({"world_size": 2, "rank": 2}, ValueError, "rank", "2"),
        ({"world_size": 2, "rank": -1}, ValueError, "rank", "-1"),
        ({"world_size": 0, "rank": 0}, ValueError, "world_size", "0"),
        ({"world_size": 2.0, "rank": 0}, TypeError, "world_size", "2.0"),
        ({"world_size": 2, "rank": True}, TypeError, "rank", "True"),
        ({"world_size": 2}, ValueError, "pass both world_size and rank, or neither", "None"),
    ]
    for kwargs, error, name, value in cases:
        for build in (
            lambda: nd.EpochSampler(ds, batch_size=4, **kwargs),
            lambda: nd.make_dataloaders(ds, ds, batch_size=4, num_workers=0, **kwargs),
        ):
            with pytest.raises(error) as info:
                build()
            message = str(info.value)
            assert type(info.value) is error and name in message and value in message, message


def test_sampler_arguments_that_would_be_misread_are_refused_by_name():
    with pytest.raises(TypeError, match="batch_size"):  # no item mode: a batch of indices or none
        nd.EpochSampler(range(10))
    cases = [  # the arguments, the error, and what its message must name
        ({"batch_size": 0}, ValueError, "batch_size", "0"),
        ({"batch_size": 2.0}, TypeError, "batch_size", "2.0"),
        ({"batch_size": True}, TypeError, "batch_size", "True"),
        ({"batch_size": 2, "seed": -1}, ValueError, "seed", "-1"),
        ({"batch_size": 2, "shuffle": "yes"}, TypeError, "shuffle", "'yes'"),
        ({"batch_size": 2, "drop_last": 1}, TypeError, "drop_last", "1"),
        ({"batch_size": 2, "remainder": "wrap"}, ValueError, "remainder", "'wrap'"),
    ]
    for kwargs, error, name, value in cases:
        with pytest.raises(error) as info:
            nd.EpochSampler(range(10), **kwargs)
        message = str(info.value)
        assert type(info.value) is error and name in message and value in message, message
    sampler = nd.EpochSampler(range(10), batch_size=2)
    for epoch, error in ((-1, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(error, match="epoch"):
            sampler.set_epoch(epoch)
    assert sampler.epoch == 0  # a refused epoch changes nothing


@pytest.mark.parametrize("start", [-3, 101])
def test_an_order_start_outside_the_epoch_is_refused(arange_file, start):
    sampler = nd.EpochSampler(nd.NpyTokensDataset(arange_file(401), 4), batch_size=5)
    with pytest.raises(ValueError, match=f"start must be from 0 to 100, got {start}"):
        sampler.order(0, start)


# --- issue 32: the loader counts what the loop received -----------------------------------------


def break_after(loader, steps: int) -> list[list[int]]:
    taken = []
    for step, (x, _) in enumerate(loader, 1):
        taken.append(firsts(x))
        if step == steps:
            break
    return taken


def test_the_pass_after_a_break_is_the_same_with_any_worker_count(arange_file):
    """A 15-batch epoch, a break after batch 13: with workers, which had fetched batches 14 and 15,
    the next pass used to be epoch 1 (14 and 15 never trained); with none, epoch 0 again. The loader
    counts the batches the loop received, so every worker count serves epoch 0 again, then 1."""
    ds = nd.NpyTokensDataset(arange_file(15 * BATCH * 4 + 1), 4)  # 120 windows: 15 batches of 8
    epochs = [expected_batches(ds, e) for e in range(2)]
    assert len(epochs[0]) == 15
    for workers in (0, 1, 2):
        loader = train_loader(ds, workers)
        assert break_after(loader, 13) == epochs[0][:13]
        assert loader.sampler.epoch == 0 and loader.state_dict()["position"] == 13 * BATCH
        assert full_for(loader) == epochs[0], workers
        assert full_for(loader) == epochs[1], workers


def test_a_resumed_epoch_served_to_its_end_leaves_set_epoch_free(arange_file):
    """After load_state_dict only the loaded epoch may be set, until a pass of it is served to its
    end: then any epoch may be set again, also in the middle of the pass after it."""
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 6 batches of 8 an epoch
    first = train_loader(ds, 0)
    break_after(first, 2)
    resumed = train_loader(ds, 0)
    resumed.load_state_dict(first.state_dict())  # epoch 0 after 2 batches
    assert len(resumed) == 6 and full_for(resumed) == expected_batches(ds, 0)[2:]
    assert break_after(resumed, 1) == expected_batches(ds, 1)[:1]  # epoch 1, left early
    resumed.sampler.set_epoch(5)
    assert full_for(resumed) == expected_batches(ds, 5)


def test_len_is_a_whole_epoch_and_zip_range_len_takes_a_resumed_pass_exactly(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)
    first = train_loader(ds, 2)
    break_after(first, 4)
    resumed = train_loader(ds, 2)
    resumed.load_state_dict(first.state_dict())
    assert len(resumed) == len(first) == 6  # Lightning sizes every epoch with len()
    assert zip_range_len(resumed) == expected_batches(ds, 0)[4:]  # the rest: the pass ends first
    assert resumed.sampler.epoch == 1 and zip_range_len(resumed) == expected_batches(ds, 1)


def test_a_sampler_made_before_the_process_group_is_refused_when_a_pass_begins(
    arange_file, monkeypatch
):
    """Loaders made before torch.distributed starts serve every rank the whole epoch: under
    WORLD_SIZE > 1 they are refused when made, and if the group starts later (Lightning's first
    rank), when a pass begins, naming the fix."""
    ds = nd.NpyTokensDataset(arange_file(400), 8)
    loader = train_loader(ds, 0)
    monkeypatch.setattr(nd, "_distributed_world", lambda: (2, 1))  # the group started since
    with pytest.raises(RuntimeError, match=r"rank 0 of 1, now rank 1 of 2.*init_process_group"):
        next(iter(loader))
    monkeypatch.undo()
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun started it, nothing initialised the group
    with pytest.raises(RuntimeError, match=r"WORLD_SIZE=2.*init_process_group"):
        nd.make_dataloaders(ds, batch_size=8)
    explicit, _ = nd.make_dataloaders(ds, batch_size=8, world_size=2, rank=1)  # given: no check
    assert len(list(explicit)) == 3


def test_an_epoch_sampler_works_as_batch_sampler(arange_file):
    """EpochSampler is a batch sampler by name and by output: DataLoader(ds, batch_sampler=...)
    gives the batches sampler=..., batch_size=None gives, also in mode="random"."""
    ds = nd.NpyTokensDataset(arange_file(400), 8, mode="random", num_samples=40, seed=2)
    as_sampler = DataLoader(ds, sampler=nd.EpochSampler(ds, batch_size=8), batch_size=None)
    as_batch_sampler = DataLoader(ds, batch_sampler=nd.EpochSampler(ds, batch_size=8))
    for _ in range(2):  # two epochs: the epoch reaches the dataset either way
        expected = [x.tolist() for x, _ in as_sampler]
        assert [x.tolist() for x, _ in as_batch_sampler] == expected


def test_an_epoch_size_out_of_range_is_refused_before_the_dataset_is_fingerprinted():
    """The epoch's size is the sampler's first fact about its data: checked before any work."""

    class Empty:
        def __len__(self):
            return 0

        def fingerprint(self):
            pytest.fail("fingerprint() was called before the epoch's size was checked")

    with pytest.raises(ValueError, match="an epoch takes 1 to 2\\*\\*31 windows, not 0"):
        nd.EpochSampler(Empty(), batch_size=4, world_size=1, rank=0)
