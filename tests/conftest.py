"""Shared test setup: import the modules from python_files/ and build tiny arange token files."""

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python_files"))
sys.path.insert(0, str(ROOT / "tools"))  # code_hazards, the linter the catalogue runs
# The committed GPT-2 files, so tiktoken.get_encoding("gpt2") never needs the network here.
os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(ROOT / "materials" / "tiktoken_cache"))


def write_tokens(path: Path, tokens: np.ndarray, *, sidecar: bool = True, **overrides) -> Path:
    """Write tokens as .npy (np.save) or raw .bin by suffix, with a sidecar like the prep step's."""
    path = Path(path)
    if path.suffix == ".npy":
        np.save(path, tokens)
    else:
        tokens.tofile(path)
    if sidecar:
        meta = {
            "format": "npy-tokens",
            "format_version": 1,
            "file": path.name,
            "layout": "npy" if path.suffix == ".npy" else "bin",
            "dtype": tokens.dtype.name,
            "shape": list(tokens.shape),
            "n_tokens": int(tokens.size),
            "file_size": path.stat().st_size,
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "tokenizer": "test:arange",
            "n_vocab": int(tokens.max()) + 1,
            "eot_id": 0,
            "eot_placement": "prepend",
            "max_token_id": int(tokens.max()),
            "n_docs": 1,
        }
        meta.update(overrides)
        path.with_name(path.name + ".json").write_text(json.dumps(meta))
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


@pytest.fixture(scope="module")
def pt(tmp_path_factory):
    """prepare_tokens, with datasets' Arrow cache in a temporary folder; imported only by the tests that use it,
    so the loader's tests never import datasets."""
    import datasets

    import prepare_tokens

    saved = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = str(tmp_path_factory.mktemp("hf_cache"))
    yield prepare_tokens
    datasets.config.HF_DATASETS_CACHE = saved
