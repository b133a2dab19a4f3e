"""Resuming: EpochSampler.state_dict and load_state_dict, in this process and in a fresh one,
with other batch sizes, world sizes and worker counts.

Catalogue items 57, 58 and 78 (tests/bad_inputs.md).
"""

import itertools
import json
import sys

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
    """A loader setting whose epoch (22 windows, batches of 4) ends with a short batch: 6 per epoch."""
    path = write_tokens(
        tmp_path / "resume.npy", np.arange(115, dtype=np.uint16)
    )  # (115 - 5) // 5 = 22 windows
    return {
        "paths": [str(path)],
        "seq_len": 5,
        "dataset": {"mode": "random", "num_samples": 22, "seed": 4},
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
            {"dataset": {"mode": "random", "num_samples": 22, "seed": 5}},
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


def test_item_78_resume_state_is_validated(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)  # 24 windows
    sampler = nd.EpochSampler(ds, seed=1, batch_size=4)
    next(iter(sampler))
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (0, 4)
    other = nd.NpyTokensDataset(arange_file(200, name="other.npy"), 6)
    bad = [
        ([], "not an EpochSampler state"),
        ({**state, "format": "torchdata"}, "not an EpochSampler state"),
        ({**state, "version": 2}, "not an EpochSampler state of version 1"),
        ({**state, "extra": 1}, "EpochSampler state: expected the keys"),
        (
            {k: v for k, v in state.items() if k != "position"},
            "EpochSampler state: expected the keys",
        ),
        ({**state, "epoch": -1}, "epoch must be an int >= 0, got -1"),
        ({**state, "epoch": "1"}, "epoch must be an int >= 0, got '1'"),
        ({**state, "epoch": True}, "epoch must be an int >= 0, got True"),
        ({**state, "position": 24}, "position must be an int in [0, 24), got 24"),
        ({**state, "position": -1}, "position must be an int in [0, 24), got -1"),
        ({**state, "position": 4.0}, "position must be an int in [0, 24), got 4.0"),
        ({**state, "seed": 2}, "seed is 2 in the saved state, 1 here"),
        ({**state, "num_samples": 25}, "num_samples is 25 in the saved state, 24 here"),
        (
            {**state, "dataset": other.fingerprint()},
            "dataset.files[0].name is 'other.npy' in the saved state, 'tokens.npy' here",
        ),
    ]
    fresh = nd.EpochSampler(ds, seed=1, batch_size=4)
    before = fresh.state_dict()
    for value, message in bad:
        with pytest.raises(ValueError) as info:
            fresh.load_state_dict(value)
        assert message in str(info.value), (value, str(info.value))
        assert fresh.state_dict() == before  # a refused state changes nothing
    fresh.load_state_dict(json.loads(json.dumps(state)))
    epoch, indices = next(iter(fresh))
    assert epoch == 0 and indices.tolist() == nd.EpochSampler(ds, seed=1).order(0)[4:8].tolist()


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


# --- what a state counts ------------------------------------------------------------------------


def test_a_state_counts_what_the_loop_received_not_what_workers_fetched(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)  # 24 windows
    loader = DataLoader(
        ds,
        sampler=nd.EpochSampler(ds, batch_size=4, shuffle=False),
        batch_size=None,
        num_workers=2,
        timeout=WORKER_TIMEOUT,
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
