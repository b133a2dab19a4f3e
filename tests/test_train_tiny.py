"""python_files/train_tiny.py, notebook 06's training loop from the command line: killed part of the
way and resumed, it ends with the same losses and the same weights, bit for bit, on a CPU."""

import math
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import prepare_tokens as pt
import train_tiny
from conftest import ROOT, SUBPROCESS_TIMEOUT, run_process

SCRIPT = [sys.executable, str(ROOT / "python_files" / "train_tiny.py")]
STEPS = 16
# Epochs of 8 random windows, 4 batches of 2: the 16 steps cross 3 epoch boundaries.
COMMON = ["--device", "cpu", "--steps", str(STEPS), "--epoch-windows", "8", "--log-every", "1"]
COMMON += ["--checkpoint-every", "2", "--eval-every", "10", "--eval-batches", "2"]
LOSS_LINE = re.compile(r"^step (\d+): loss (\d+\.\d+), perplexity ([\d,]+\.\d)", flags=re.M)


def losses(stdout: str) -> dict[int, str]:
    """Step -> the loss as printed, from the script's output."""
    return {int(step): loss for step, loss, _ in LOSS_LINE.findall(stdout)}


def killed_at(step: int, cmd: list[str]) -> str:
    """Run cmd until it prints the loss of `step`, then SIGKILL it, as a machine that dies; its
    output until then."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # as run_process
    proc = subprocess.Popen(cmd, env=env, text=True, start_new_session=True, stdout=subprocess.PIPE)
    hang = threading.Timer(SUBPROCESS_TIMEOUT, os.killpg, (proc.pid, signal.SIGKILL))
    hang.start()  # a run that never gets there is killed all the same, and fails below
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {step}: loss "):
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    hang.cancel()
    assert proc.returncode == -signal.SIGKILL, "".join(lines)[-2000:]
    return "".join(lines)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory) -> Path:
    """The quick start's token files of the bundled sample, in a folder of these tests' own: the
    repository's data/ is the notebooks', which may be running beside them (tests/conftest.py)."""
    folder = tmp_path_factory.mktemp("tinystories_sample")
    pt.prepare(out=folder, progress=False)
    return folder


@pytest.fixture(scope="module")
def unbroken(tokens, tmp_path_factory) -> tuple[str, Path]:
    """A run of STEPS steps, never stopped: its output and its last checkpoint."""
    checkpoint = tmp_path_factory.mktemp("unbroken") / "tiny.pt"
    run = run_process([*SCRIPT, *COMMON, "--data", str(tokens), "--checkpoint", str(checkpoint)])
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, checkpoint


def test_a_killed_run_resumes_into_the_same_losses_and_weights(tokens, unbroken, tmp_path):
    whole, stopped = unbroken[0], tmp_path / "stopped.pt"
    cmd = [*SCRIPT, *COMMON, "--data", str(tokens), "--checkpoint", str(stopped)]
    first = killed_at(5, cmd)
    saved = torch.load(stopped, weights_only=True)["step"]  # 4, or later if the kill came late
    resumed = run_process([*cmd, "--resume", str(stopped)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    expected = losses(whole)
    assert sorted(expected) == list(range(1, STEPS + 1))
    assert 4 <= saved < STEPS and saved % 2 == 0 and f"resumed at step {saved}:" in resumed.stdout
    assert losses(first).items() <= expected.items()
    assert losses(resumed.stdout) == {s: expected[s] for s in range(saved + 1, STEPS + 1)}
    a, b = (torch.load(path, weights_only=True) for path in (unbroken[1], stopped))
    assert a["step"] == b["step"] == STEPS and a["sampler"] == b["sampler"]
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    moments = [t for s in a["optimizer"]["state"].values() for t in s.values()]
    again = [t for s in b["optimizer"]["state"].values() for t in s.values()]
    assert len(moments) == len(again) and all(map(torch.equal, moments, again))


def test_it_prints_the_perplexity_and_a_greedy_and_a_sampled_text(unbroken):
    stdout = unbroken[0]
    for _, loss, perplexity in LOSS_LINE.findall(stdout):
        printed, of_loss = float(perplexity.replace(",", "")), math.exp(float(loss))
        assert math.isclose(printed, of_loss, rel_tol=1e-4, abs_tol=0.05)  # loss has 4 decimals
    validation = rf"^step {STEPS}: validation loss \d+\.\d+, perplexity [\d,]+\.\d$"
    assert re.search(validation, stdout, flags=re.M)
    assert re.search(r"^greedy: 'Once upon a time.+'$", stdout, flags=re.M)
    assert re.search(r"^top-40, temperature 0.8: 'Once upon a time.+'$", stdout, flags=re.M)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be at least 1, got -1"),
        (["--lr", "0"], "--lr must be a finite number above 0, got 0.0"),
        (["--width", "64", "--heads", "5"], "--heads must divide --width"),
        (["--epoch-windows", "1"], "--epoch-windows must be at least --batch-size, got 1"),
        (["--lr", "inf"], "--lr must be a finite number above 0, got inf"),
        (["--resume", "/no/such.pt"], "--resume must be a checkpoint file, got '/no/such.pt'"),
        (["--checkpoint", "/"], "--checkpoint must be a file's path, got the folder '/'"),
        (["--device", "tpu"], "--device must be cpu"),
    ],
)
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        train_tiny.parse_args(argv)
    assert message in capsys.readouterr().err


def test_top_k_of_one_is_greedy_decoding():
    torch.manual_seed(1)
    model = train_tiny.TinyGPT(seq_len=8, width=16, layers=1, heads=2)
    ids = train_tiny.generate(model, [50256, 7454], 10)  # top_k=1
    with torch.no_grad():  # the likeliest token, each time, with the longer ids fed back
        seen = [ids[max(0, n - 8) : n] for n in range(2, 12)]
        expected = [int(model(torch.tensor([s]))[0, -1].argmax()) for s in seen]
    assert ids[2:] == expected and len(ids) == 12  # past seq_len: the last 8 tokens are seen


def test_without_data_it_trains_on_the_quick_starts_files_made_first(tmp_path, monkeypatch, capsys):
    """No --data: the quick start's folder, written first when it is missing, as quickstart.py
    writes it; the checkpoint goes beside it."""
    default = tmp_path / "data" / "tinystories_sample"
    monkeypatch.setattr(train_tiny, "DEFAULT_DATA", default)
    deterministic = torch.are_deterministic_algorithms_enabled()  # main() sets it for a CPU
    try:
        train_tiny.main(["--device", "cpu", "--steps", "2", "--epoch-windows", "8"])
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert (default / "train.npy").is_file() and (default / "validation.npy").is_file()
    assert (tmp_path / "data" / "checkpoints" / "tiny_gpt.pt").is_file()
    assert re.search(r"^step 2: validation loss \d+\.\d+", capsys.readouterr().out, flags=re.M)


@pytest.mark.parametrize("kind", ["not a checkpoint", "other sizes"])
def test_a_checkpoint_it_cannot_load_is_refused_naming_resume(tokens, unbroken, tmp_path, kind):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    path, extra = (junk, []) if kind == "not a checkpoint" else (unbroken[1], ["--seq-len", "32"])
    argv = [*COMMON, "--steps", "20", "--data", str(tokens), "--resume", str(path), *extra]
    deterministic = torch.are_deterministic_algorithms_enabled()  # main() sets it for a CPU
    try:
        with pytest.raises(SystemExit) as exit:
            train_tiny.main([*argv, "--checkpoint", str(tmp_path / "new.pt")])
    finally:
        torch.use_deterministic_algorithms(deterministic)
    said = f"--resume {path}: not a checkpoint train_tiny wrote, or one of other sizes"
    assert str(exit.value).startswith(said)
    assert ("size mismatch for positions.weight" in str(exit.value)) == (kind == "other sizes")
