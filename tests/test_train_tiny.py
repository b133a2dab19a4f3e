"""python_files/train_tiny.py, notebook 06's training loop from the command line: killed part of the
way and resumed, it ends with the same losses and the same weights, bit for bit, on a CPU; it trains
on any tokenizer's files (the model's vocabulary from their sidecar), and refuses in one line."""

import ast
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import npy_datasets as nd
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
def unbroken(tokens, tmp_path_factory) -> tuple[str, Path, str]:
    """A run of STEPS steps, never stopped: its output, its last checkpoint, and its stderr."""
    checkpoint = tmp_path_factory.mktemp("unbroken") / "tiny.pt"
    run = run_process([*SCRIPT, *COMMON, "--data", str(tokens), "--checkpoint", str(checkpoint)])
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout, checkpoint, run.stderr


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
    assert "50,257 ids of tiktoken:gpt2" in stdout  # the model's vocabulary, from the sidecar


def test_a_progress_bar_on_stderr_shows_the_rate_time_left_loss_and_perplexity(unbroken):
    bars = unbroken[2].split("\r")  # tqdm redraws its line; the stdout lines stay whole
    last = next(bar for bar in reversed(bars) if f"{STEPS}/{STEPS}" in bar)
    assert re.search(
        r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+step/s, loss=\d+\.\d+, perplexity=[\d,.]+\]", last
    )
    assert "step/s" not in unbroken[0]  # the bar never mixes into the lines on stdout


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
    model = train_tiny.TinyGPT(n_vocab=50257, seq_len=8, width=16, layers=1, heads=2)
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


def refusal(argv: list[str], tmp_path: Path) -> str:
    """train_tiny.main(argv) in this process, which must stop with one line: that line."""
    deterministic = torch.are_deterministic_algorithms_enabled()  # main() sets it for a CPU
    try:
        with pytest.raises(SystemExit) as exit:
            train_tiny.main([*argv, "--checkpoint", str(tmp_path / "new.pt")])
    finally:
        torch.use_deterministic_algorithms(deterministic)
    message = str(exit.value)
    assert "\n" not in message and not (tmp_path / "new.pt").exists()  # nothing trained
    return message


@pytest.mark.parametrize(
    "extra, said",
    [
        ([], "not a checkpoint train_tiny wrote (UnpicklingError"),
        (["--seq-len", "32"], "saved by a model of other sizes ("),
    ],
    ids=["not a checkpoint", "other sizes"],
)
def test_a_checkpoint_it_cannot_load_is_refused_naming_resume(
    tokens, unbroken, tmp_path, extra, said
):
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    path = unbroken[1] if extra else junk
    argv = [*COMMON, "--steps", "20", "--data", str(tokens), "--resume", str(path), *extra]
    message = refusal(argv, tmp_path)
    assert message.startswith(f"--resume {path}: {said}")
    assert ("size mismatch for positions.weight" in message) == bool(extra)


@pytest.fixture(scope="module")
def other_tokens(tokens, tmp_path_factory) -> Path:
    """GPT-2 token files of the same tokenizer as `tokens`, but other ids: train is half of it."""
    folder = tmp_path_factory.mktemp("other_tokens")
    half = np.array(nd.open_tokens(tokens / "train.npy")[:171_000])
    nd.write_tokens(
        folder / "train.npy", half, n_vocab=50257, tokenizer="tiktoken:gpt2", eot_id=50256
    )
    (folder / "validation.npy").symlink_to(tokens / "validation.npy")
    (folder / "validation.npy.json").symlink_to(tokens / "validation.npy.json")
    return folder


@pytest.mark.parametrize(
    "change, said",
    [
        ("data", "dataset.files"),
        (["--epoch-windows", "16"], "dataset.num_samples is 8 in the state, 16 here"),
        (["--batch-size", "4"], "a run of batch size 2, not 4: resume with the same batch size"),
    ],
    ids=["other data", "other epoch windows", "other batch size"],
)
def test_a_resume_with_other_settings_is_refused_naming_the_one_that_differs(
    tokens, other_tokens, unbroken, tmp_path, change, said
):
    data = other_tokens if change == "data" else tokens
    argv = [*COMMON, "--steps", "20", "--data", str(data), "--resume", str(unbroken[1])]
    message = refusal([*argv, *([] if change == "data" else change)], tmp_path)
    assert message.startswith(f"--resume {unbroken[1]}: ") and said in message, message
    assert f"--data {data} --epoch-windows" in message  # what this run was given


def test_an_empty_resume_file_is_one_line(tokens, tmp_path):
    empty = tmp_path / "empty.pt"
    empty.touch()
    message = refusal([*COMMON, "--data", str(tokens), "--resume", str(empty)], tmp_path)
    assert message == f"--resume {empty}: not a checkpoint train_tiny wrote (EOFError: empty)"


@pytest.mark.parametrize(
    "setting, said",
    [
        (["--batch-size", "1000000"], "batch_size=1000000 leaves no whole batch"),
        (["--seq-len", "1000000"], "seq_len=1000000 needs 1000001"),
    ],
    ids=["batch size", "seq len"],
)
def test_a_batch_or_window_too_large_for_the_files_is_one_line(tokens, tmp_path, setting, said):
    message = refusal(["--device", "cpu", "--data", str(tokens), *setting], tmp_path)
    assert message.startswith(f"train_tiny.py --data {tokens} --seq-len ") and said in message
    assert " ".join(setting) in message


# ---- any tokenizer: a character-level one, written by write_tokens -----------------------------


@pytest.fixture(scope="module")
def chars(tmp_path_factory) -> Path:
    """The sample's stories as character ids (one id a character, then one for end-of-text),
    written by write_tokens with their own n_vocab and tokenizer name; vocab.json: id i's text."""
    folder = tmp_path_factory.mktemp("chars")
    texts = {}
    for split in ("train", "validation"):
        lines = (ROOT / "materials" / "tinystories_sample" / f"{split}.jsonl").read_text("utf-8")
        texts[split] = [json.loads(line)["text"] for line in lines.splitlines()[:100]]
    alphabet = sorted(set("".join(texts["train"] + texts["validation"])))
    eot = len(alphabet)
    for split, stories in texts.items():
        ids = (np.array([eot, *map(alphabet.index, story)]) for story in stories)
        nd.write_tokens(
            folder / f"{split}.npy", ids, n_vocab=eot + 1, tokenizer="chars", eot_id=eot
        )
    (folder / "vocab.json").write_text(json.dumps([*alphabet, "\n"]), encoding="utf-8")
    return folder


def train_chars(chars: Path, tmp_path: Path, *extra: str) -> str:
    """A short run of train_tiny.main on the character files, in this process: what it printed."""
    argv = ["--device", "cpu", "--data", str(chars), "--steps", "6", "--seq-len", "32"]
    argv += ["--epoch-windows", "16", "--checkpoint", str(tmp_path / "chars.pt"), *extra]
    deterministic = torch.are_deterministic_algorithms_enabled()  # main() sets it for a CPU
    try:
        train_tiny.main(argv)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    return argv


def test_it_trains_on_character_ids_and_shows_the_samples_as_text(chars, tmp_path, capsys):
    train_chars(chars, tmp_path, "--vocab", str(chars / "vocab.json"))
    out, err = capsys.readouterr()
    pieces = json.loads((chars / "vocab.json").read_text("utf-8"))  # the characters, then "\n"
    assert re.search(rf"^[\d,]+ weights on cpu for {len(pieces)} ids of chars; ", out, flags=re.M)
    assert re.search(r"^step 6: validation loss \d+\.\d+", out, flags=re.M) and "6/6 [" in err
    samples = re.findall(r"^(?:greedy|top-40, temperature 0\.8): ('.*')$", out, flags=re.M)
    texts = [ast.literal_eval(sample) for sample in samples]  # repr() as printed, read back
    assert len(texts) == 2 and all(text.startswith(train_tiny.PROMPT) for text in texts)
    assert all(set(text) <= set(pieces) and len(text) == 29 + 32 for text in texts)  # 32 more
    model = torch.load(tmp_path / "chars.pt", weights_only=True)["model"]
    assert model["tokens.weight"].shape[0] == len(pieces)  # a row an id of the files' n_vocab


def test_without_a_vocabulary_the_samples_are_ids_and_a_line_on_reading_them(
    chars, tmp_path, capsys
):
    train_chars(chars, tmp_path)
    out = capsys.readouterr().out
    n_vocab = nd.read_sidecar(chars / "train.npy")["n_vocab"]
    greedy = re.search(r"^greedy \(ids\): (\[.*\])$", out, flags=re.M)
    assert greedy and all(0 <= i < n_vocab for i in ast.literal_eval(greedy[1]))
    assert re.search(r"^top-\d+, temperature 0\.8 \(ids\): \[", out, flags=re.M)
    how = "the files' tokenizer, 'chars', is not tiktoken's; decode them with it, or pass --vocab"
    assert how in out.splitlines()[-1]


def edit_sidecar(path: Path, **changes) -> None:
    """Change fields of path's sidecar (None: remove the field), as a hand edit would."""
    side = nd.sidecar_path(path)
    meta = json.loads(side.read_text("utf-8"))
    meta.update(changes)
    side.write_text(json.dumps({k: v for k, v in meta.items() if v is not None}), "utf-8")


@pytest.mark.parametrize(
    "damage, said",
    [
        ("no sidecar", "train.npy has no sidecar (train.npy.json) to give its n_vocab: write it"),
        ("no n_vocab", "train.npy.json': 'n_vocab' is missing"),
        ("ids past n_vocab", "train.npy' holds ids up to"),
        ("validation's tokenizer", "validation.npy has tokenizer 'bytes', train.npy 'chars'"),
        ("a short --vocab", "vocab.json holds 3 strings; the files' n_vocab is "),
    ],
    ids=["no sidecar", "no n_vocab", "ids past n_vocab", "validation's tokenizer", "short vocab"],
)
def test_files_the_model_cannot_size_or_read_are_refused_naming_the_file(
    chars, tmp_path, damage, said
):
    folder = tmp_path / "copy"
    shutil.copytree(chars, folder)
    argv = ["--device", "cpu", "--data", str(folder)]
    if damage == "no sidecar":
        nd.sidecar_path(folder / "train.npy").unlink()
    elif damage == "no n_vocab":
        edit_sidecar(folder / "train.npy", n_vocab=None)
    elif damage == "ids past n_vocab":  # the model would have fewer rows than the ids need
        edit_sidecar(folder / "train.npy", n_vocab=20)
        edit_sidecar(folder / "validation.npy", n_vocab=20)
    elif damage == "validation's tokenizer":
        edit_sidecar(folder / "validation.npy", tokenizer="bytes")
    else:
        (folder / "vocab.json").write_text('["a", "b", "c"]')
        argv += ["--vocab", str(folder / "vocab.json")]
    message = refusal(argv, tmp_path)
    assert said in message and str(folder) in message, message
