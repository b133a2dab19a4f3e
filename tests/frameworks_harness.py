"""What tests/test_frameworks*.py share: a small token folder, the README's framework commands run
word for word on it, the windows each rank trained at each step, and what make_dataloaders' loader
serves on its own."""

import itertools
import json
import re
import shlex
import sys
import zlib
from pathlib import Path

import numpy as np

import npy_datasets as nd
from conftest import ROOT, run_process

SEQ, BATCH, STEPS = 8, 4, 30  # 80 windows: 20 batches an epoch in 1 process, 10 a rank in 2
SMALL = ["--seq-len", str(SEQ), "--batch-size", str(BATCH)]


def write_folder(out: Path) -> Path:
    """train.npy (80 windows of 8) and validation.npy (10) of random ids below 1000, in out."""
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


def readme_block(heading: str) -> str:
    """The python block after the README paragraph that starts with heading."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(re.escape(heading) + r".*?```python\n(.*?)```", text, flags=re.S).group(1)
