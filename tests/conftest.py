"""Shared test setup: import the modules from python_files/, build tiny token files and .npy bytes,
run subprocesses with a timeout, and the prep step's fixtures (datasets' cache, GPT-2, input folders).

Helpers used by one test file live in that file; the ones here are used by several.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python_files"))
sys.path.insert(0, str(ROOT / "tools"))  # code_hazards, the linter test_style.py runs
# The committed GPT-2 files, so tiktoken.get_encoding("gpt2") never needs the network here.
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT / "materials" / "tiktoken_cache"))
# pytest-xdist runs one worker a core (pytest.ini: -n auto). Each worker's torch, and the notebook
# kernels and processes it starts, use that worker's share of the cores: two workers each running
# torch's default of a thread a core made notebook 06's training 4 times slower. -n 0 changes nothing.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if WORKERS > 1:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (cores or 1) // WORKERS)))

# Timeouts catch hangs, not slowness: each is at least 10 times the quiet time of what it guards.
# Measured on the 2-core machine: a run_process call (torchrun with two ranks, a resume or train_tiny
# run) 3-7 s beside two CPU-bound processes, 17 s at a load of 10; a worker's first batch 0.1 s when
# forked, 4 s when spawned (it imports torch).
SUBPROCESS_TIMEOUT = 120  # seconds; a hung torchrun or resume process fails the test instead
WORKER_TIMEOUT = 60  # seconds a DataLoader worker may take for one batch before the test fails


def pytest_configure(config):
    """Hypothesis without timers: no deadline per example (its default is 200 ms) and no too_slow
    health check, so a loaded machine makes property tests slower, never failing."""
    from hypothesis import HealthCheck, settings

    profile = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("no_timers", **profile)
    settings.load_profile("no_timers")


# =================================================================================================
# Token files and .npy bytes.


def write_tokens(path: Path, tokens: np.ndarray, *, sidecar: bool = True, **overrides) -> Path:
    """Write tokens with the module's write_tokens (a .npy, or raw ids for a .bin path), in their own
    dtype. overrides then replace sidecar fields as given, to make a sidecar wrong on purpose."""
    import npy_datasets as nd

    path = Path(path)
    n_vocab = int(tokens.max()) + 1
    fields = {"tokenizer": "test:arange", "eot_id": 0, "n_docs": 1}
    nd.write_tokens(path, tokens, n_vocab=n_vocab, dtype=tokens.dtype, **fields)
    side = nd.sidecar_path(path)
    if not sidecar:
        side.unlink()
    elif overrides:
        side.write_text(json.dumps({**json.loads(side.read_text()), **overrides}))
    return path


@pytest.fixture
def arange_file(tmp_path):
    """Factory: a token file where token i sits at position i, so every window proves its place."""

    def make(
        n: int, *, dtype=np.uint32, name: str = "tokens.npy", shape=None, sidecar: bool = True
    ):
        tokens = np.arange(n, dtype=dtype)
        if shape is not None:
            tokens = tokens.reshape(shape)
        return write_tokens(tmp_path / name, tokens, sidecar=sidecar)

    return make


@pytest.fixture(scope="session")
def shard_folder(tmp_path_factory) -> Path:
    """300 small shards, shard_000.npy to shard_299.npy: shard i holds ids 100*i .. 100*i + 49, six
    windows of 8. Read only: shard_[01]*.npy are the first 200."""
    folder = tmp_path_factory.mktemp("shards")
    for i in range(300):
        write_tokens(
            folder / f"shard_{i:03d}.npy", np.arange(100 * i, 100 * i + 50, dtype=np.uint16)
        )
    return folder


def npy_bytes(header: bytes | str, version: bytes = b"\x01\x00", data: bytes = b"") -> bytes:
    """A .npy file from its parts; the length field is 2 bytes for version 1, 4 for versions 2 and 3."""
    header = header.encode("latin1") if isinstance(header, str) else header
    width = 2 if version[0] == 1 else 4
    return b"\x93NUMPY" + version + len(header).to_bytes(width, "little") + header + data


def header_for(descr: str = "'<u2'", fortran: str = "False", shape: str = "(4,)") -> bytes:
    return f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()


def refused(path, expected: type[BaseException], *fragments: str, seq_len=4, **kwargs) -> str:
    """The message of the error NpyTokensDataset raises: exactly `expected`, naming the path and each fragment."""
    import npy_datasets as nd

    with pytest.raises(BaseException) as info:
        nd.NpyTokensDataset(path, seq_len, **kwargs)
    message = str(info.value)
    assert type(info.value) is expected, f"{type(info.value).__name__}: {message}"
    assert repr(str(path)) in message or repr(str(nd.sidecar_path(path))) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def dataset_error(path, seq_len=4, **kwargs) -> str:
    """The message of the ValueError, TypeError or FileNotFoundError NpyTokensDataset raises."""
    import npy_datasets as nd

    with pytest.raises((ValueError, TypeError, FileNotFoundError)) as info:
        nd.NpyTokensDataset(path, seq_len, **kwargs)
    return str(info.value)


# =================================================================================================
# Many files: each holds its own range of ids, so a window that crossed a file would show.

SEQ = 8
# name, first token, length: each file holds its own range of ids, so a crossing would show.
# part_b is too short for any window (5 < SEQ + 1) and sits between the others.
PARTS = [("part_a.npy", 0, 100), ("part_b.npy", 10_000, 5), ("part_c.npy", 20_000, 61)]
RANGES = [(base, base + n) for _, base, n in PARTS]


def write_parts(folder: Path, parts=PARTS, dtype=np.uint32) -> list[Path]:
    return [
        write_tokens(folder / name, np.arange(base, base + n, dtype=dtype))
        for name, base, n in parts
    ]


def assert_window_inside(
    x: torch.Tensor, y: torch.Tensor, sequences: list[tuple[int, int]]
) -> None:
    """x is seq_len consecutive tokens, y is x shifted by one, and both lie in one sequence [lo, hi)."""
    first = x[0].item()
    assert x.tolist() == list(range(first, first + len(x))) and y.tolist() == (x + 1).tolist()
    assert any(lo <= first and y[-1].item() < hi for lo, hi in sequences), (
        f"window at {first} crosses a boundary"
    )


def run_process(
    cmd: list[str], *, stdin: str | None = None, cwd=None
) -> subprocess.CompletedProcess:
    """Run cmd in its own process group; on a timeout kill the whole group (torchrun and its ranks)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        text=True,
        start_new_session=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(stdin, timeout=SUBPROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[:4]} did not finish in {SUBPROCESS_TIMEOUT} s (a hang?)\n{err[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# =================================================================================================
# The prep step: datasets' cache, GPT-2, input folders. prepare_tokens (and with it datasets) is
# imported only where a test asks for it, so the loader's tests never import datasets.

SAMPLE = ROOT / "materials" / "tinystories_sample"
TIKTOKEN_CACHE = ROOT / "materials" / "tiktoken_cache"
NO_NETWORK = {
    k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
}  # port 9: refused
EOT = 50256
DOCS = [
    "Once upon a time, there was a little cat named Tom.",
    "Zoë said: \u201cHello!\u201d \u2014 and José smiled at her.",
    "",
    "  leading and trailing spaces  ",
    "Line one.\nLine two.\n\nLine four.",
    'Tom typed "<|endoftext|>" into the story and laughed.',
    "emoji 🐱 and 中文 text",
]
MANY = [f"Story {i}: " + "The dog ran to the park. " * (i % 6) + f"The end {i}." for i in range(60)]
STORIES = [
    f"Story {i}: " + "The dog ran to the park. " * (i % 5) + f"The end {i}." for i in range(24)
]


@pytest.fixture(scope="session")
def framework_tokens(tmp_path_factory) -> Path:
    """The framework tests' token folder (frameworks_harness.write_folder)."""
    from frameworks_harness import write_folder

    return write_folder(tmp_path_factory.mktemp("framework_tokens"))


@pytest.fixture(scope="session")
def datasets_cache(tmp_path_factory):
    """Keep datasets' Arrow copies of the fixtures out of the user's ~/.cache/huggingface: one
    temporary folder for the session. The prep test files use it for every test (pytestmark)."""
    import datasets

    saved = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = str(tmp_path_factory.mktemp("hf_datasets_cache"))
    yield datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = saved


@pytest.fixture(scope="session")
def pt(datasets_cache):
    """prepare_tokens, with datasets' cache in datasets_cache, for the tests outside the prep files."""
    import prepare_tokens

    return prepare_tokens


@pytest.fixture(scope="session")
def enc():
    """tiktoken's own GPT-2, as tiktoken_ext.openai_public builds it from its cache: the reference prep must match."""
    import tiktoken
    import tiktoken_ext.openai_public

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
        for name, value in NO_NETWORK.items():
            patch.setenv(name, value)
        return tiktoken.Encoding(**tiktoken_ext.openai_public.gpt2())


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_dataset(folder: Path, train: list[str], validation: list[str] | None = None) -> Path:
    """A folder with train.jsonl (and validation.jsonl), TinyStories schema."""
    write_jsonl(folder / "train.jsonl", [{"text": t} for t in train])
    if validation is not None:
        write_jsonl(folder / "validation.jsonl", [{"text": t} for t in validation])
    return folder


def prep_input(folder: Path, texts: list[str], validation: list[str] | None = None) -> Path:
    """A folder with train.jsonl (and validation.jsonl), columns text and story (the text in capitals)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", texts), ("validation", validation)):
        if rows is not None:
            (folder / f"{split}.jsonl").write_text(
                "".join(json.dumps({"text": t, "story": t.upper()}) + "\n" for t in rows)
            )
    return folder


def documents(tokens: np.ndarray) -> list[np.ndarray]:
    """Cut a token file at its EOTs: each document is the ids after one EOT, up to the next."""
    starts = np.flatnonzero(tokens == EOT)
    assert starts.size and starts[0] == 0, "a token file must start with EOT"
    ends = [*starts[1:], len(tokens)]
    return [tokens[a + 1 : b] for a, b in zip(starts, ends)]


def decoded(path: Path, enc) -> list[str]:
    return [enc.decode(doc.tolist()) for doc in documents(np.load(path))]


def reference_tokens(texts: list[str], enc) -> np.ndarray:
    """The expected file content, computed the slow obvious way."""
    ids = []
    for text in texts:
        ids += [EOT, *enc.encode_ordinary(text)]
    return np.array(ids, dtype=np.uint16)


def prepare(dataset, out, **kwargs):
    """prepare_tokens.prepare without a progress bar: its results by split."""
    import prepare_tokens as pt

    kwargs.setdefault("progress", False)
    return {r.split: r for r in pt.prepare(dataset, out, **kwargs)}


def prepare_on_one_thread(dataset, out, **kwargs):
    """prepare, on one tokenizer thread and with the dataset given as a string."""
    import prepare_tokens as pt

    kwargs.setdefault("progress", False)
    kwargs.setdefault("num_threads", 1)
    return {r.split: r for r in pt.prepare(str(dataset), out, **kwargs)}


def text_split(name: str, texts: list[str]):
    """A TextSplit of in-memory texts, as prepare_split takes it."""
    import datasets

    import prepare_tokens as pt

    return pt.TextSplit(
        name,
        datasets.Dataset.from_dict({"text": texts}),
        "text",
        {"dataset": "inline", "split": name},
    )
