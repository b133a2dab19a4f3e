"""Resuming: EpochSampler.state_dict and load_state_dict, in this process and after a kill, with
other batch sizes, world sizes and worker counts; the states it refuses.

Catalogue items 57, 58, 78 and 96 (tests/bad_inputs.md).
"""

import itertools
import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import npy_datasets as nd
import resume_worker
from conftest import ROOT, WORKER_TIMEOUT, run_process, write_tokens

EPOCHS = 3


@pytest.fixture
def resume_job(tmp_path):
    """A loader setting whose epoch (22 windows, batches of 4) ends with a short batch: 6 batches."""
    tokens = np.arange(115, dtype=np.uint16)  # (115 - 5) // 5 = 22 windows
    return {
        "paths": [str(write_tokens(tmp_path / "resume.npy", tokens))],
        "seq_len": 5,
        "dataset": {"mode": "random", "num_samples": 22, "seed": 4},
        "sampler": {"shuffle": True, "seed": 9, "batch_size": 4},
        "epochs": EPOCHS,
    }


def train_in_a_process(job: dict, kill_at: int | None) -> None:
    """resume_worker.py's training run, killed with SIGKILL once step kill_at is saved (or to
    the end when kill_at is None)."""
    worker = str(ROOT / "tests" / "resume_worker.py")
    proc = run_process([sys.executable, worker, json.dumps({**job, "kill_at": kill_at})])
    expected = -signal.SIGKILL if kill_at else 0
    assert proc.returncode == expected, (kill_at, proc.returncode, proc.stderr[-3000:])


def test_a_run_killed_and_resumed_trains_the_batches_of_one_uninterrupted_run(tmp_path, resume_job):
    reference = resume_worker.record(resume_worker.build_loader(resume_job), EPOCHS)[0]
    assert len(reference) == 6 * EPOCHS and [len(b) for b in reference[:6]] == [4, 4, 4, 4, 4, 2]
    assert len({b[0][0] % 5 for b in reference}) > 1  # each epoch its own offsets: epochs matter
    job = {
        **resume_job,
        "checkpoint": str(tmp_path / "ck.json"),
        "log": str(tmp_path / "log.jsonl"),
    }
    # Killed at 5, 6: before, at the end of epoch 0 (at 5 two workers had fetched all of it); at 7:
    # epoch 1's first batch; at 13: epoch 2's first. Each run has the other worker count.
    for workers, kill_at in ((2, 5), (0, 6), (2, 7), (0, 13)):
        train_in_a_process({**job, "num_workers": workers}, kill_at)
        saved = json.loads(Path(job["checkpoint"]).read_text())
        state = saved["sampler"]
        assert saved["step"] == kill_at
        assert (state["epoch"], state["position"]) == (kill_at // 6, 4 * (kill_at % 6))
    train_in_a_process({**job, "num_workers": 2}, None)  # the last run goes to epoch 2's end
    lines = [json.loads(line) for line in Path(job["log"]).read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, 6 * EPOCHS + 1))
    assert [line["x"] for line in lines] == reference  # bit for bit, every epoch boundary crossed


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


def refused(sampler: nd.EpochSampler, state, error: type = ValueError) -> str:
    """The message of the error load_state_dict raises for state: exactly `error`, and the
    sampler as it was before."""
    before = sampler.state_dict()
    with pytest.raises(error) as info:
        sampler.load_state_dict(state)
    assert type(info.value) is error, f"{type(info.value).__name__}: {info.value}"
    assert sampler.state_dict() == before  # a refused state changes nothing
    return str(info.value)


def test_resume_refuses_a_state_from_other_windows(tmp_path, resume_job):
    loader = resume_worker.build_loader(resume_job)
    state = json.loads(json.dumps(resume_worker.record(loader, EPOCHS, stop_after=2)[1]))
    other_file = write_tokens(tmp_path / "other.npy", np.arange(115, dtype=np.uint16))
    second_file = write_tokens(tmp_path / "second.npy", np.arange(50, dtype=np.uint16))
    sampler = resume_job["sampler"]
    cases = [  # a loader built otherwise, and the field of the state it names
        ({"seq_len": 6}, "dataset.seq_len"),
        ({"dataset": {"mode": "random", "num_samples": 22, "seed": 5}}, "dataset.seed"),
        ({"dataset": {"mode": "random", "num_samples": 23, "seed": 4}}, "dataset.num_samples"),
        ({"paths": [str(other_file)]}, "dataset.files[0].name"),
        ({"paths": resume_job["paths"] + [str(second_file)]}, "len(dataset.files)"),
        ({"sampler": {**sampler, "seed": 10}}, "seed"),
        ({"sampler": {**sampler, "shuffle": False}}, "shuffle"),
    ]
    for change, field in cases:
        other = resume_worker.build_loader({**resume_job, **change})
        message = refused(other.sampler, state)
        assert f"{field} is " in message, (change, message)
    for bad in ({**state, "position": 22}, {**state, "epoch": -1}, {**state, "format": "other"}):
        refused(resume_worker.build_loader(resume_job).sampler, bad)


def test_a_state_of_another_format_or_order_is_refused_naming_the_field(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)  # 24 windows
    sampler = nd.EpochSampler(ds, seed=1, batch_size=4)
    next(iter(sampler))
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (0, 4)
    other = nd.NpyTokensDataset(arange_file(200, name="other.npy"), 6)
    keys = "not an EpochSampler state"  # a message that says what a state is
    without_position = {k: v for k, v in state.items() if k != "position"}
    cases = [  # a state, the error, what the message must name (JSON types count: true is not 1)
        ([], ValueError, keys),
        ({**state, "extra": 1}, ValueError, keys),
        (without_position, ValueError, keys),
        ({**state, "format": "torchdata"}, ValueError, "format is 'torchdata'"),
        ({**state, "version": 2}, ValueError, "version is 2"),
        ({**state, "seed": 2}, ValueError, "seed is 2"),
        ({**state, "seed": 1.0}, ValueError, "seed is 1.0"),
        ({**state, "shuffle": 1}, ValueError, "shuffle is 1"),
        ({**state, "num_samples": 25}, ValueError, "num_samples is 25"),
        ({**state, "num_samples": 24.0}, ValueError, "num_samples is 24.0"),
        ({**state, "dataset": other.fingerprint()}, ValueError, "dataset.files"),
        ({**state, "dataset": None}, ValueError, "dataset is None"),
        ({**state, "epoch": -1}, ValueError, "epoch"),
        ({**state, "epoch": "1"}, TypeError, "epoch"),
        ({**state, "epoch": True}, TypeError, "epoch"),
        ({**state, "epoch": 1.0}, TypeError, "epoch"),
        ({**state, "position": 24}, ValueError, "position"),
        ({**state, "position": -1}, ValueError, "position"),
        ({**state, "position": 4.0}, TypeError, "position"),
    ]
    fresh = nd.EpochSampler(ds, seed=1, batch_size=4)
    for value, error, named in cases:
        message = refused(fresh, value, error)
        assert named in message, (value, message)
        if named in ("epoch", "position"):  # the bad value too
            assert repr(value[named]) in message, message
    fresh.load_state_dict(json.loads(json.dumps(state)))
    epoch, indices = next(iter(fresh))
    assert epoch == 0 and indices.tolist() == sampler.order(0)[4:8].tolist()


def test_a_state_stored_as_json_with_sorted_keys_resumes(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)
    sampler = nd.EpochSampler(ds, seed=1, batch_size=4)
    next(iter(sampler))
    state = sampler.state_dict()
    stored = json.loads(json.dumps(state, sort_keys=True, indent=2))  # a JSON object is unordered
    resumed = nd.EpochSampler(ds, seed=1, batch_size=4)
    resumed.load_state_dict(stored)
    assert resumed.state_dict() == state


def test_make_dataloaders_resume_across_the_epoch_end(tmp_path):
    def loaders():
        train = write_tokens(tmp_path / "train.npy", np.arange(120, dtype=np.uint16))
        val = write_tokens(tmp_path / "val.npy", np.arange(40, dtype=np.uint16))
        train, val = nd.NpyTokensDataset(train, 5), nd.NpyTokensDataset(val, 5)
        return nd.make_dataloaders(train, val, batch_size=5, num_workers=0, seed=6)

    reference = resume_worker.record(loaders()[0], 2)[0]
    assert len(reference) == 8 and reference[:4] != reference[4:]  # 23 windows: 4 batches of 5
    for k in (3, 4, 5):  # before the end of epoch 0, at it (its dropped windows are skipped), after
        train, _ = loaders()
        batches, state = resume_worker.record(train, 2, stop_after=k)
        assert batches == reference[:k]
        assert json.loads(json.dumps(state)) == state == train.sampler.state_dict()
        assert (state["epoch"], state["position"]) == divmod(5 * k, 20)
        again, _ = loaders()
        again.sampler.load_state_dict(state)
        assert again.sampler.state_dict() == state  # nothing moves before the next iteration
        assert resume_worker.record(again, 2)[0] == reference[k:]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_at_a_break_is_exact_whatever_workers_fetched(arange_file, workers):
    """Two workers fetch 4 batches ahead, even past a break near an epoch's end (or a peek at an
    epoch of 3); state_dict(consumed=k), and the loader's own state_dict(), is where batch k + 1
    comes from: a resume trains what an uninterrupted run trains after batch k."""
    for tokens, batches in ((400, 6), (200, 3)):  # 49 and 24 windows: 6 and 3 batches of 8
        ds = nd.NpyTokensDataset(arange_file(tokens, name=f"tokens_{tokens}.npy"), 8)

        def loader(workers):
            train, _ = nd.make_dataloaders(ds, batch_size=8, num_workers=workers, seed=3)
            train.dataloader.timeout = WORKER_TIMEOUT if workers else 0
            return train

        reference = resume_worker.record(loader(0), EPOCHS)[0]
        assert len(reference) == batches * EPOCHS
        for k in range(1, batches + 1):
            broken = loader(workers)
            taken, state = resume_worker.record(broken, EPOCHS, stop_after=k)  # a break at step k
            assert broken.sampler.epoch == (1 if k == batches else 0), k  # whatever was fetched
            assert (state["epoch"], state["position"]) == divmod(8 * k, 8 * batches)
            assert broken.state_dict() == state  # the loader's own count: no consumed= needed
            resumed = loader(workers)
            resumed.load_state_dict(json.loads(json.dumps(state)))
            assert taken + resume_worker.record(resumed, EPOCHS)[0] == reference, (tokens, k)


# --- what a state counts ------------------------------------------------------------------------


def test_a_state_counts_what_the_loop_received_not_what_workers_fetched(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)  # 24 windows
    loader = DataLoader(
        ds,
        sampler=nd.EpochSampler(ds, batch_size=4, shuffle=False),  # 6 batches
        batch_size=None,
        num_workers=2,
        timeout=WORKER_TIMEOUT,
    )
    batches = iter(loader)
    next(batches)  # the workers have fetched ahead: the sampler handed out more than one batch
    assert loader.sampler.state_dict(consumed=1)["position"] == 4
    assert loader.sampler.state_dict()["position"] > 4
    with pytest.raises(ValueError) as info:  # more than the pass handed out: a global step
        loader.sampler.state_dict(consumed=7)
    assert "consumed=7" in str(info.value) and "enumerate(loader, 1)" in str(info.value)
    del batches
    fresh = nd.EpochSampler(ds, batch_size=4)
    with pytest.raises(ValueError, match="consumed=1"):  # no pass has begun
        fresh.state_dict(consumed=1)


def test_consumed_cannot_exceed_the_batches_handed_out(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)
    sampler = nd.EpochSampler(ds, batch_size=4, shuffle=False)  # 6 batches
    batches = iter(sampler)
    [next(batches) for _ in range(3)]
    assert sampler.state_dict(consumed=3)["position"] == 12
    with pytest.raises(ValueError, match="consumed=4"):  # a global step after a resume, say:
        sampler.state_dict(consumed=4)  # it would skip a batch silently
    for consumed in (-1, 1.0, True):
        with pytest.raises((ValueError, TypeError), match="consumed"):
            sampler.state_dict(consumed=consumed)


def test_a_numpy_step_gives_a_json_state(arange_file):
    sampler = nd.EpochSampler(nd.NpyTokensDataset(arange_file(200), 8), batch_size=4)
    batches = iter(sampler)
    [next(batches) for _ in range(3)]
    step = np.int64(3)  # a step counted by numpy, say np.arange's
    assert json.dumps(sampler.state_dict(consumed=step)) == json.dumps(
        sampler.state_dict(consumed=3)
    )


def test_set_epoch_after_a_resume_keeps_the_loaded_position_and_refuses_another_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 49 windows, 13 batches of 4
    first = nd.EpochSampler(ds, batch_size=4, seed=3)
    full = [i.tolist() for _, i in first]
    resumed = nd.EpochSampler(ds, batch_size=4, seed=3)
    resumed.load_state_dict(first.state_dict(consumed=5))  # epoch 0 cut after 5 of 13 batches
    assert len(resumed) == 13  # a whole epoch, as Lightning counts it: the pass holds 8
    resumed.set_epoch(0)  # what a DistributedSampler-style loop does at the top of the epoch
    rest = [i.tolist() for _, i in resumed]
    assert rest == full[5:] and len(rest) == 8 and len(resumed) == 13
    resumed.set_epoch(0)  # a pass has run since: set_epoch(0) is epoch 0 from its start
    assert [i.tolist() for _, i in resumed] == full
    again = nd.EpochSampler(ds, batch_size=4, seed=3)
    again.load_state_dict(resumed.state_dict(consumed=13))  # epoch 0's last step: epoch 1 next
    for behind_or_ahead in (0, 2):  # a loop that kept its own epoch count
        with pytest.raises(ValueError) as info:
            again.set_epoch(behind_or_ahead)
        message = str(info.value)  # it names the call, the loaded epoch, and what to call instead
        assert f"set_epoch({behind_or_ahead})" in message and "sampler.epoch" in message, message
        assert again.epoch == 1
    again.set_epoch(again.epoch)
    assert [e for e, _ in again] == [1] * 13
    again.set_epoch(0)  # a pass has run since: any epoch may be chosen again
    assert again.epoch == 0


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 60), world=st.integers(1, 6), batch_size=st.integers(1, 7), data=st.data())
def test_any_stop_point_is_a_global_position_the_next_run_starts_from(n, world, batch_size, data):
    assume(n >= world)  # fewer windows than ranks is refused (test_sampler.py)
    ranks = [
        nd.EpochSampler(range(n), seed=3, batch_size=batch_size, world_size=world, rank=r)
        for r in range(world)
    ]
    full = len(ranks[0])  # batches of an epoch on each rank
    k = data.draw(st.integers(0, full), label="batches taken on each rank")
    iters = [iter(s) for s in ranks]
    took = sorted(int(i) for it in iters for _ in range(k) for i in next(it)[1])
    states = [s.state_dict() for s in ranks]
    assert all(s == states[0] for s in states)
    state = states[0]
    order = np.random.default_rng([3, 0]).permutation(n).tolist()  # epoch 0's order
    if k == full:  # the epoch is done: the next one starts at its beginning
        assert (state["epoch"], state["position"]) == (1, 0)
        assert took == sorted(order[: n - n % world])
    else:
        position = k * batch_size * world
        assert (state["epoch"], state["position"]) == (0, position)
        assert took == sorted(order[:position])
        resumed = nd.EpochSampler(range(n), seed=3, batch_size=1)  # one rank: the whole rest
        resumed.load_state_dict(state)
        assert [(e, int(i)) for e, batch in resumed for i in batch] == [
            (0, i) for i in order[position:]
        ]


# --- issue 19: mutations the tests let pass before ---------------------------------------------


@pytest.mark.parametrize("world", [1, 3])
def test_a_padded_sampler_resumed_mid_epoch_repeats_the_windows_a_whole_pass_would(world):
    """Validation pads each epoch with its first windows; a pass resumed part-way must pad with
    those same windows, not with others."""
    n, batch = 20, 2  # 20 windows over 3 ranks: 1 padded, 4 batches a rank (the last of 1)
    for stop in range(1, 4):  # stopped after 1, 2 or 3 of the 4 batches
        for rank in range(world):

            def sampler():
                return nd.EpochSampler(
                    range(n),
                    shuffle=False,
                    batch_size=batch,
                    world_size=world,
                    rank=rank,
                    remainder="pad",
                )

            whole = [i.tolist() for _, i in sampler()]
            first = sampler()
            head = [i.tolist() for _, i in itertools.islice(first, stop)]
            resumed = sampler()
            resumed.load_state_dict(first.state_dict(consumed=stop))
            assert head + [i.tolist() for _, i in resumed] == whole


def test_a_state_saved_between_set_epoch_and_the_first_batch_counts_nothing_stale():
    """After set_epoch, a state describes the pass to come: the items the previous pass handed out
    are not counted again (which would skip that many windows of the new epoch)."""
    sampler = nd.EpochSampler(range(20), batch_size=4, seed=1)
    list(itertools.islice(iter(sampler), 3))  # epoch 0, 3 of its 5 batches handed out
    sampler.set_epoch(1)
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    resumed = nd.EpochSampler(range(20), batch_size=4, seed=1)
    resumed.load_state_dict(state)
    assert [i.tolist() for _, i in resumed] == [i.tolist() for _, i in sampler]
