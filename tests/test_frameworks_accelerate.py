"""The README's "With Lightning, accelerate or torchdata", accelerate's and torchdata's parts: the
accelerate commands word for word in 1 and 2 processes (as test_frameworks.py checks Lightning's), the
loader given back by prepare, and torchdata's StatefulDataLoader resumed at any point (issue 32)."""

import pytest

import npy_datasets as nd
from conftest import WORKER_TIMEOUT
from frameworks_harness import (
    BATCH,
    SEQ,
    check_runs,
    readme_block,
    readme_commands,
    run,
)

pytest.importorskip("accelerate")


@pytest.mark.parametrize("world", [1, 2])
def test_accelerate_commands(framework_tokens, tmp_path, world):
    commands = readme_commands("accelerate")
    mine = [c for c in commands if ("torchrun" in c[0]) == (world == 2)]
    assert len(mine) == 2 and "--resume" in mine[1]
    first = run(mine[0], tmp_path, framework_tokens, tmp_path / "whole.jsonl")
    second = run(mine[1], tmp_path, framework_tokens, tmp_path / "resumed.jsonl")
    assert first.splitlines()[-1] == second.splitlines()[-1]  # the same loss, to the last digit
    resumed_at = 15 if world == 1 else 5  # the README's --resume folder
    check_runs(
        framework_tokens, world, tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", resumed_at
    )


def test_accelerate_prepare_gives_the_loader_back(framework_tokens):
    from accelerate import Accelerator

    train = nd.NpyTokensDataset(framework_tokens / "train.npy", SEQ)
    loader, _ = nd.make_dataloaders(train, batch_size=BATCH)
    assert Accelerator(cpu=True).prepare(loader) is loader  # not rebuilt into single windows


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_exactly(framework_tokens, workers):
    """The README's StatefulDataLoader loop over an EpochSampler, stopped mid-epoch, at an epoch's
    last batch and in epoch 1, and resumed from its state_dict(): the unbroken run's batches."""
    pytest.importorskip("torchdata")
    train = nd.NpyTokensDataset(framework_tokens / "train.npy", SEQ)  # 20 batches of 4 an epoch
    code = readme_block("**torchdata's `StatefulDataLoader`**")
    timeout = WORKER_TIMEOUT if workers else 0  # a hung worker fails the test, never hangs it
    code = code.replace("num_workers=2", f"num_workers={workers}, timeout={timeout}")
    code = code.replace("batch_size=8", f"batch_size={BATCH}")

    class Stop(Exception):
        pass

    def run(state=None, stop=None):
        seen = []

        def train_step(x, y):  # records the batch; at `stop` batches, the state a save would hold
            seen.append(x[:, 0].tolist())
            if len(seen) == stop:
                raise Stop(names["loader"].state_dict())

        names = {"train": train, "EpochSampler": nd.EpochSampler, "state": state, "epochs": 3}
        names["train_step"] = train_step
        try:
            exec(code, names)
        except Stop as saved:
            return seen, saved.args[0]
        return seen, None

    whole, _ = run()
    assert len(whole) == 60
    for stop in (7, 20, 33):
        head, state = run(stop=stop)
        assert head + run(state)[0] == whole, stop
