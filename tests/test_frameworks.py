"""The README's "With Lightning, accelerate or torchdata": its commands, word for word, on a small
token folder, in 1 and 2 processes. Every rank trains the batches make_dataloaders' loader gives on
its own, the ranks' shares of each epoch are disjoint and whole, and a run resumed from a checkpoint
trains the unbroken run's batches step for step, across epoch ends (issue 32)."""

import itertools
import json
import re
import shlex
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import npy_datasets as nd
from conftest import ROOT, run_process

pytest.importorskip("lightning")
pytest.importorskip("accelerate")

SEQ, BATCH, STEPS = 8, 4, 30  # 80 windows: 20 batches an epoch in 1 process, 10 a rank in 2
SMALL = ["--seq-len", str(SEQ), "--batch-size", str(BATCH)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """train.npy (80 windows of 8) and validation.npy (10) of random ids below 1000."""
    out = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(0)
    for name, windows in (("train", 80), ("validation", 10)):
        ids = rng.integers(0, 1000, windows * SEQ + 1).astype(np.uint16)
        nd.write_tokens(out / f"{name}.npy", ids, n_vocab=1000, tokenizer="random", eot_id=999)
    return out


def readme_commands(tool: str) -> list[list[str]]:
    """The README section's bash lines that run python_files/{tool}_example.py."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split("## With Lightning, accelerate or torchdata\n", 1)[1].split("\n## ", 1)[0]
    lines = [
        line for b in re.findall(r"```bash\n(.*?)```", body, flags=re.S) for line in b.split("\n")
    ]
    return [shlex.split(line) for line in lines if f"{tool}_example.py" in line]


def run(command: list[str], cwd: Path, data: Path, trace: Path) -> str:
    """One README command in cwd, on data, tracing every step; what it printed."""
    launcher = {".venv/bin/python": [sys.executable]}
    launcher[".venv/bin/torchrun"] = [sys.executable, "-m", "torch.distributed.run"]
    script = [
        str(ROOT / word) if word.startswith("python_files/") else word for word in command[1:]
    ]
    extra = ["--data", str(data), *SMALL, "--trace", str(trace)]
    proc = run_process(launcher[command[0]] + script + extra, cwd=cwd)
    assert proc.returncode == 0, (command, proc.stderr[-4000:])
    return proc.stdout


def steps_of(trace: Path) -> dict[tuple[int, int], list[int]]:
    """(rank, step) -> the CRC-32 of each window trained on at that step."""
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    found = {(line["rank"], line["step"]): line["windows"] for line in lines}
    assert len(found) == len(lines), "a step trained twice"
    return found


def alone(data: Path, world: int) -> dict[tuple[int, int], list[int]]:
    """(rank, step) -> windows, as make_dataloaders' loader serves them with set_epoch, no framework."""
    train = nd.NpyTokensDataset(data / "train.npy", SEQ)
    steps = {}
    for rank in range(world):
        loader, _ = nd.make_dataloaders(train, batch_size=BATCH, world_size=world, rank=rank)
        batches = (
            x for e in itertools.count() if not loader.sampler.set_epoch(e) for x, _ in loader
        )
        for step, x in zip(range(1, STEPS + 1), batches):
            steps[rank, step] = [zlib.crc32(row.numpy().tobytes()) for row in x]
    return steps


def check_runs(data: Path, world: int, whole: Path, resumed: Path, from_step: int) -> None:
    expected = alone(data, world)
    assert steps_of(whole) == expected  # every rank, every step: the loader's own batches
    train = nd.NpyTokensDataset(data / "train.npy", SEQ)
    every = sorted(
        zlib.crc32(x.numpy().tobytes()) for x in (train[i][0] for i in range(len(train)))
    )
    per_epoch = len(train) // BATCH // world
    for epoch in range(STEPS // per_epoch):  # the ranks' shares: disjoint, the whole epoch
        steps = range(epoch * per_epoch + 1, (epoch + 1) * per_epoch + 1)
        assert sorted(w for r in range(world) for s in steps for w in expected[r, s]) == every
    later = {key: w for key, w in expected.items() if key[1] > from_step}
    assert steps_of(resumed) == later  # step for step after the checkpoint


def test_lightning_commands_one_process(folder, tmp_path):
    commands = readme_commands("lightning")
    one = [c for c in commands if "--devices" not in c]
    assert len(one) == 2 and "--resume" in one[1]
    first = run(one[0], tmp_path, folder, tmp_path / "whole.jsonl")
    second = run(one[1], tmp_path, folder, tmp_path / "resumed.jsonl")  # from step 15 of 20
    assert first.splitlines()[-1] == second.splitlines()[-1]  # the same loss, to the last digit
    check_runs(folder, 1, tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", 15)
    at_the_end = [*one[0], "--resume", "data/lightning/step=20.ckpt"]  # epoch 0's last batch
    run(at_the_end, tmp_path, folder, tmp_path / "end.jsonl")
    check_runs(folder, 1, tmp_path / "whole.jsonl", tmp_path / "end.jsonl", 20)


def test_lightning_commands_two_processes(folder, tmp_path):
    two = [c for c in readme_commands("lightning") if "--devices" in c]
    assert len(two) == 2 and "--resume" in two[1]
    run(two[0], tmp_path, folder, tmp_path / "whole.jsonl")
    run(two[1], tmp_path, folder, tmp_path / "resumed.jsonl")  # from step 5 of 10 a rank
    check_runs(folder, 2, tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", 5)


@pytest.mark.parametrize("world", [1, 2])
def test_accelerate_commands(folder, tmp_path, world):
    commands = readme_commands("accelerate")
    mine = [c for c in commands if ("torchrun" in c[0]) == (world == 2)]
    assert len(mine) == 2 and "--resume" in mine[1]
    first = run(mine[0], tmp_path, folder, tmp_path / "whole.jsonl")
    second = run(mine[1], tmp_path, folder, tmp_path / "resumed.jsonl")
    assert first.splitlines()[-1] == second.splitlines()[-1]  # the same loss, to the last digit
    resumed_at = 15 if world == 1 else 5  # the README's --resume folder
    check_runs(folder, world, tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", resumed_at)


def test_accelerate_prepare_gives_the_loader_back(folder):
    from accelerate import Accelerator

    train = nd.NpyTokensDataset(folder / "train.npy", SEQ)
    loader, _ = nd.make_dataloaders(train, batch_size=BATCH)
    assert Accelerator(cpu=True).prepare(loader) is loader  # not rebuilt into single windows


def readme_block(heading: str) -> str:
    """The python block after the README paragraph that starts with heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(re.escape(heading) + r".*?```python\n(.*?)```", text, flags=re.S).group(1)


def test_the_readme_shows_the_examples_own_code():
    lightning = (ROOT / "python_files" / "lightning_example.py").read_text(encoding="utf-8")
    block = readme_block("**PyTorch Lightning**")
    assert block in lightning  # the data module, as the example defines it
    accelerate = (ROOT / "python_files" / "accelerate_example.py").read_text(encoding="utf-8")
    lines = {line.strip() for line in accelerate.splitlines()}
    assert all(line in lines for line in readme_block("**accelerate**").splitlines())


@pytest.mark.parametrize("workers", [0, 2])
def test_torchdata_stateful_dataloader_resumes_exactly(folder, workers):
    """The README's StatefulDataLoader loop over an EpochSampler, stopped mid-epoch, at an epoch's
    last batch and in epoch 1, and resumed from its state_dict(): the unbroken run's batches."""
    pytest.importorskip("torchdata")
    train = nd.NpyTokensDataset(folder / "train.npy", SEQ)  # 20 batches of 4 an epoch
    code = readme_block("**torchdata's `StatefulDataLoader`**")
    code = code.replace("num_workers=2", f"num_workers={workers}")
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


def test_a_lightning_checkpoint_saved_after_max_steps_is_refused_naming_the_fix(folder, tmp_path):
    """trainer.save_checkpoint after fit(max_steps=12) counts the stopped epoch as done, while the
    loader's state continues it: the resumed fit stops at once, naming ModelCheckpoint, instead of
    skipping the rest of the epoch or serving it as the next one."""
    import lightning as L

    sys.path.insert(0, str(ROOT / "python_files"))
    from lightning_example import TinyModel, TokenData

    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    options = {"accelerator": "cpu", "devices": 1, "enable_checkpointing": False, **quiet}
    trainer = L.Trainer(max_steps=12, **options)  # 12 of epoch 0's 20 batches
    trainer.fit(TinyModel(1000), datamodule=TokenData(folder, SEQ, BATCH))
    trainer.save_checkpoint(tmp_path / "after_12.ckpt")
    resumed = L.Trainer(max_steps=30, **options)
    with pytest.raises(ValueError, match=r"set_epoch\(1\), but .* epoch 0 at 48.*ModelCheckpoint"):
        resumed.fit(
            TinyModel(1000),
            datamodule=TokenData(folder, SEQ, BATCH),
            ckpt_path=tmp_path / "after_12.ckpt",
        )
