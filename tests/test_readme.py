"""The README's code runs as written: "Use the module in your project" in a fresh process, the
Resume section's loop stopped part of the way and restarted, and "Your own tokenizer" end to end."""

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import npy_datasets as nd
from conftest import ROOT, run_process


def readme_section(section: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]


def readme_snippet(section: str, language: str = "python") -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", readme_section(section), flags=re.S)
    assert blocks, f"no {language} block under '## {section}'"
    return blocks[0]


def test_the_use_the_module_snippet_runs_as_written(tmp_path):
    code = readme_snippet("Use the module in your project")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python_files"),
    }  # the copied module sits beside the script
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(
        r"16 batches of \(12, 1024\) on (cpu|cuda:\d+); next epoch 1\n", proc.stdout
    ), proc.stdout
    assert {p.name for p in tmp_path.iterdir()} == {
        "train.npy",
        "val.bin",
    }  # it writes only its own files


# --- the Resume section's loop --------------------------------------------------------------------

EPOCHS, CHECKPOINT_EVERY = 3, 5  # the sample's 1,336 windows of 256 make 20 batches of 64 an epoch


class Crash(Exception):
    """How the stand-in model stops a run part of the way, as a killed process stops."""


class BatchRecorder(torch.nn.Module):
    """A stand-in for a GPT: model(x, y) is a loss of its one weight and the batch; it records each
    batch's first ids, and raises Crash instead of training on its call number crash_at."""

    def __init__(self, crash_at: int | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.batches: list[list[int]] = []
        self.crash_at = crash_at

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if len(self.batches) + 1 == self.crash_at:
            raise Crash
        self.batches.append(x[:, 0].tolist())
        return (self.weight - y.double().mean() / 50257) ** 2


@pytest.fixture(scope="module")
def sample_train(pt, tmp_path_factory) -> Path:
    """The quick start's training file of the bundled sample, in a folder of these tests' own: the
    repository's data/ is the notebooks', which may be running beside them (tests/conftest.py)."""
    out = tmp_path_factory.mktemp("tinystories_sample")
    pt.prepare(out=out, progress=False)
    return out / "train.npy"


def run_resume_block(sample_train: Path, crash_at: int | None = None, workers: int = 0) -> dict:
    """The README's Resume block as written, in the current folder, with a fresh model, optimizer
    and loader, as a new process would start: the names it leaves when it ends or crashes."""
    train = nd.NpyTokensDataset(sample_train, seq_len=256)
    train_loader, _ = nd.make_dataloaders(train, batch_size=64, seed=0, num_workers=workers)
    assert len(train_loader) == 20  # so the checkpoint at step 20 falls on epoch 0's last batch
    model = BatchRecorder(crash_at)
    names = {
        "model": model,
        "optimizer": torch.optim.Adam(model.parameters(), lr=0.01),  # its state matters: moments
        "train_loader": train_loader,
        "epochs": EPOCHS,
        "checkpoint_every": CHECKPOINT_EVERY,
        "device": "cpu",
    }
    try:
        exec(readme_snippet("Resume"), names)
    except Crash:
        pass
    return names


@pytest.mark.parametrize(
    "crash_at, workers",
    [(23, 0), (34, 0), (58, 0), (34, 2)],
    ids=["crash at step 23", "crash at step 34", "crash at step 58", "2 workers, crash at 34"],
)
def test_the_resume_loop_restarts_into_the_same_run(
    sample_train, tmp_path, monkeypatch, crash_at, workers
):
    """Checkpoints at steps 20 (epoch 0's last batch: the state says epoch 1), 30 (the middle of
    epoch 1) and 55 (epoch 2): stopped after it, restarted, the run ends as an unbroken one does.
    With workers, which fetch ahead of the loop, `consumed` makes the difference."""
    (tmp_path / "unbroken").mkdir()
    monkeypatch.chdir(tmp_path / "unbroken")  # its checkpoints apart from the stopped run's
    whole = run_resume_block(sample_train)
    monkeypatch.chdir(tmp_path)
    stopped = run_resume_block(sample_train, crash_at, workers)
    saved = (crash_at - 1) // CHECKPOINT_EVERY * CHECKPOINT_EVERY  # the last checkpoint's step
    assert torch.load("ckpt.pt", weights_only=True)["step"] == saved
    restarted = run_resume_block(sample_train, workers=workers)

    steps = EPOCHS * 20
    assert whole["step"] == restarted["step"] == steps  # not more: no epoch run again
    assert len(whole["model"].batches) == steps
    assert stopped["model"].batches == whole["model"].batches[: crash_at - 1]
    assert restarted["model"].batches == whole["model"].batches[saved:]
    assert torch.equal(restarted["model"].weight, whole["model"].weight)  # optimizer loaded too


# --- "Your own tokenizer": character ids written by write_tokens, trained by train_tiny.py --------


def test_the_own_tokenizer_section_runs_as_written_and_prints_what_it_says(tmp_path):
    """chars.py as the section gives it and its two commands, in a folder that holds the
    repository's materials/ and python_files/ (the repository's data/ is the notebooks')."""
    for name in ("materials", "python_files"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "chars.py").write_text(readme_snippet("Your own tokenizer"), encoding="utf-8")
    commands = readme_snippet("Your own tokenizer", "bash").strip().splitlines()
    assert len(commands) == 2 and all(c.startswith(".venv/bin/python ") for c in commands)
    runs = []
    for command in commands:  # the interpreter running these tests stands in for .venv's
        run = run_process(
            ["bash", "-c", command.replace(".venv/bin/python", sys.executable, 1)], cwd=tmp_path
        )
        assert run.returncode == 0, run.stderr[-3000:]
        runs.append(run)
    body = " ".join(readme_section("Your own tokenizer").split())
    prep, train = runs
    for line in prep.stdout.splitlines():  # "train: 1,318,105 ids below 68", as the text says
        assert f"`{line}`" in body, line
    first = train.stdout.splitlines()[0]
    said = re.search(r"`\.\.\., (.+?)`", body)[1]  # "68 ids of chars; 100 batches an epoch"
    assert first.endswith(said), first
    assert "60/60 [" in train.stderr and "step/s, loss=" in train.stderr  # the progress bar
    pieces = json.loads((tmp_path / "data" / "chars" / "vocab.json").read_text(encoding="utf-8"))
    for name in ("greedy", "top-40, temperature 0.8"):
        sample = re.search(rf"^{name}: ('.*')$", train.stdout, flags=re.M)
        text = ast.literal_eval(sample[1])  # as printed by repr(): text, not ids
        assert text.startswith("Once upon a time, there was a") and set(text) <= set(pieces)


def test_the_hand_written_three_field_sidecar_serves_a_nanogpt_bin(tmp_path):
    """The README's sidecar for nanoGPT's train.bin, written as shown, gives its dtype: the dataset
    opens it without dtype= (issue 34). Without it, the same file is refused."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split("## Shards and other formats\n", 1)[1].split("\n## ", 1)[0]
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", body, flags=re.S) if "npy-tokens" in b]
    bin_path = tmp_path / "data" / "openwebtext" / "train.bin"
    bin_path.parent.mkdir(parents=True)
    np.arange(1000, dtype=np.uint16).tofile(bin_path)  # nanoGPT's layout: raw uint16 ids
    with pytest.raises(nd.TokenFileError, match="no sidecar gives their dtype"):
        nd.NpyTokensDataset(bin_path, seq_len=8)
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True, timeout=60)
    ds = nd.NpyTokensDataset(bin_path, seq_len=8)
    assert len(ds) == 124 and ds[2][1].tolist() == list(range(17, 25))
