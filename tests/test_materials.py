"""Checks for materials/: the generated story sample and the offline tiktoken cache."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MATERIALS = ROOT / "materials"
SAMPLE = MATERIALS / "tinystories_sample"
CACHE = MATERIALS / "tiktoken_cache"
SPLITS = ["train", "validation"]
BOGUS_PROXY = "http://127.0.0.1:9"  # nothing listens on port 9: any download fails at once


def read_texts(split: str) -> list[str]:
    with open(SAMPLE / f"{split}.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def gpt2_files() -> list[tuple[str, str]]:
    """(url, sha256) pairs exactly as tiktoken_ext.openai_public.gpt2() passes them on."""
    from tiktoken_ext import openai_public

    seen: dict[str, str] = {}

    def record(vocab_bpe_file, encoder_json_file, vocab_bpe_hash, encoder_json_hash, **_):
        seen.update({vocab_bpe_file: vocab_bpe_hash, encoder_json_file: encoder_json_hash})
        return {}

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", record)
        openai_public.gpt2()
    return sorted(seen.items())


def assert_cache_files_ok() -> list[tuple[str, str]]:
    """Check hashes before tiktoken reads the cache: on a mismatch tiktoken deletes the file."""
    files = gpt2_files()
    assert len(files) == 2
    for url, expected in files:
        path = CACHE / hashlib.sha1(url.encode()).hexdigest()
        assert path.is_file(), f"missing cache file for {url}"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == expected, url
    return files


def offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "all_proxy")}
    env.update(
        TIKTOKEN_CACHE_DIR=str(CACHE),
        HTTPS_PROXY=BOGUS_PROXY,
        https_proxy=BOGUS_PROXY,
        HTTP_PROXY=BOGUS_PROXY,
        http_proxy=BOGUS_PROXY,
    )
    return env


# (a) the generator reproduces the committed files byte for byte
def test_make_sample_is_reproducible(tmp_path):
    subprocess.run(
        [sys.executable, str(MATERIALS / "make_sample.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    for split in SPLITS:
        committed = (SAMPLE / f"{split}.jsonl").read_bytes()
        assert (tmp_path / f"{split}.jsonl").read_bytes() == committed, split


# (b) schema: one object per line with a single non-empty str "text"
@pytest.mark.parametrize("split", SPLITS)
def test_sample_schema(split):
    lines = (SAMPLE / f"{split}.jsonl").read_text(encoding="utf-8").split("\n")
    assert lines[-1] == ""  # file ends with a newline
    rows = [json.loads(line) for line in lines[:-1]]
    assert len(rows) >= 100
    for row in rows:
        assert list(row) == ["text"]
        assert isinstance(row["text"], str) and row["text"].strip()


def test_splits_do_not_overlap():
    assert not set(read_texts("train")) & set(read_texts("validation"))


# (c) the cache files are the ones tiktoken expects, and gpt2 loads offline
def test_cache_files_match_tiktoken_hashes(monkeypatch):
    files = assert_cache_files_ok()

    # tiktoken's own loader must take the cache hit without touching the network
    import tiktoken.load

    def no_network(url):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(CACHE))
    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    for url, expected in files:
        assert (
            tiktoken.load.read_file_cached(url, expected)
            == (CACHE / hashlib.sha1(url.encode()).hexdigest()).read_bytes()
        )


def test_get_encoding_gpt2_offline():
    assert_cache_files_ok()
    before = sorted(p.name for p in CACHE.iterdir())
    code = (
        "import json, tiktoken; e = tiktoken.get_encoding('gpt2'); "
        "print(json.dumps([e.n_vocab, e.encode_ordinary('Hello world')]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=offline_env(),
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert json.loads(out) == [50257, [15496, 995]]
    assert sorted(p.name for p in CACHE.iterdir()) == before  # nothing written on a hit


# (d) enough tokens to train on; special-token text stays ordinary text
def test_train_token_count(monkeypatch):
    import tiktoken
    from tiktoken_ext import openai_public

    assert_cache_files_ok()
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(CACHE))
    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(k, BOGUS_PROXY)
    enc = tiktoken.Encoding(**openai_public.gpt2())  # fresh, not tiktoken's in-process registry

    texts = read_texts("train")
    tokens = [enc.encode_ordinary(t) for t in texts]
    assert sum(map(len, tokens)) >= 300_000
    eot = [ids for t, ids in zip(texts, tokens) if "<|endoftext|>" in t]
    assert eot and all(enc.eot_token not in ids for ids in eot)


def test_environment_yml_and_requirements_pin_the_same_versions():
    def pins(text):
        return sorted(re.findall(r"^\s*(?:-\s+)?([A-Za-z0-9_.-]+==[^\s#]+)", text, flags=re.M))

    req = pins((ROOT / "requirements.txt").read_text())
    env = pins((ROOT / "environment.yml").read_text())
    assert req == env and "torch==2.13.0" in req and len(req) >= 10
