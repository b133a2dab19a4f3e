"""Tokenizing: GPT-2's BPE from the bundled files (or another tiktoken encoding), and documents
in chunks on a thread pool, in input order, each as [EOT, *ids] or [*ids, EOT].
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from pathlib import Path

import numpy as np
import tiktoken
from tiktoken_ext.openai_public import ENDOFTEXT, r50k_pat_str  # GPT-2's special token, pattern

from prep_settings import (
    CHUNK_DOCS,
    ENCODING,
    EOT_PLACEMENT,
    REPO_ROOT,
    check_prep_arguments,
    usable_cores,
)

TIKTOKEN_FILES = REPO_ROOT / "materials" / "tiktoken_cache"  # GPT-2's BPE files, committed
GPT2_ENCODER_JSON = "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"  # encoder.json, by tiktoken's name
GPT2_ENCODER_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


def load_encoding(name: str = ENCODING) -> tiktoken.Encoding:
    """The tiktoken encoding called name: "gpt2" from the bundled files (gpt2_encoding), any
    other from tiktoken's cache, or a download where there is a network."""
    if name == ENCODING:
        return gpt2_encoding()
    try:
        return tiktoken.get_encoding(name)
    except OSError as error:  # requests' ConnectionError is an OSError: offline, and not cached
        raise ValueError(_cannot_download(name)) from error


def _cannot_download(name: str) -> str:
    default = os.path.join(tempfile.gettempdir(), "data-gym-cache")  # tiktoken's own default
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR", default))
    there = f"its files are not in tiktoken's cache ({cache}) and cannot be downloaded here"
    how = (
        f"on a machine with a network, run tiktoken.get_encoding({name!r}) with "
        "TIKTOKEN_CACHE_DIR set to an empty folder, copy that folder here and set "
        "TIKTOKEN_CACHE_DIR to it"
    )
    return f"encoding {name!r}: {there}; {how}"


@functools.cache
def gpt2_encoding(folder: str | os.PathLike = TIKTOKEN_FILES) -> tiktoken.Encoding:
    """GPT-2's encoding, as tiktoken.get_encoding("gpt2"), from folder's sha256-checked
    encoder.json: no download."""
    path = Path(folder) / GPT2_ENCODER_JSON
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != GPT2_ENCODER_SHA256:
        expected = f"GPT-2's encoder.json ({GPT2_ENCODER_SHA256})"
        raise ValueError(f"{str(path)!r}: sha256 differs from {expected}; restore it")
    printable = [b for b in range(256) if chr(b).isprintable() and b != 32]  # spelled chr(b)
    others = [b for b in range(256) if b not in printable]  # spelled chr(256), chr(257), ...
    byte_of = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}
    ranks = {
        bytes(map(byte_of.get, token)): rank
        for token, rank in json.loads(raw).items()
        if token != ENDOFTEXT
    }
    return tiktoken.Encoding(
        "gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: 50256},
        explicit_n_vocab=50257,
    )


def _encode_chunk(enc: tiktoken.Encoding, texts: list[str], append: bool = False) -> np.ndarray:
    """[EOT, *ids] (append: [*ids, EOT]) for each text, concatenated into one uint32 array; no
    special token is emitted."""
    eot = np.array([enc.eot_token], dtype=np.uint32)
    parts = []
    for text in texts:
        try:  # encode_ordinary's ids, made in Rust as an array; nothing allowed, nothing refused
            ids = enc.encode_to_numpy(text, disallowed_special=())
        except UnicodeEncodeError:  # a lone surrogate: encode_ordinary makes it U+FFFD (tiktoken)
            ids = np.array(enc.encode_ordinary(text), dtype=np.uint32)
        parts += [ids, eot] if append else [eot, ids]
    if not parts:
        return np.empty(0, dtype=np.uint32)
    return np.concatenate(parts)


def tokenize_documents(
    texts: Iterable[str],
    enc: tiktoken.Encoding,
    *,
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    eot_placement: str = EOT_PLACEMENT,
) -> Iterator[np.ndarray]:
    """Yield one uint32 id array per chunk of chunk_docs documents, in input order; a document is
    [EOT, *ids] ("append": [*ids, EOT])."""
    check_prep_arguments(
        num_threads=num_threads, chunk_docs=chunk_docs, eot_placement=eot_placement
    )  # now, not at the first next(): the checks come before any work
    threads = usable_cores() if num_threads is None else num_threads
    append = eot_placement == "append"

    def in_order(texts: Iterator[str]) -> Iterator[np.ndarray]:
        pool = ThreadPoolExecutor(threads, thread_name_prefix="tokenize")
        pending: deque[Future[np.ndarray]] = deque()  # oldest first: yielding keeps input order
        try:
            batch = list(islice(texts, chunk_docs))
            while batch:
                pending.append(pool.submit(_encode_chunk, enc, batch, append))
                if len(pending) > 2 * threads:  # every thread busy: wait for the oldest chunk
                    yield pending.popleft().result()
                batch = list(islice(texts, chunk_docs))
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return in_order(iter(texts))
