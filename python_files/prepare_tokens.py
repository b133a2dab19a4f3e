"""Tokenize a text dataset with GPT-2's BPE and write one token file per split, plus a JSON sidecar.

    python python_files/prepare_tokens.py                                   # -> data/tinystories_sample/
    python python_files/prepare_tokens.py --dataset roneneldan/TinyStories  # -> data/tinystories/

    prepare(out="data/tinystories_sample")  # from Python: one PreparedSplit per split, .summary() the line printed

Per split: <out>/<split>.npy (or --format bin, llmc) and its JSON sidecar, written atomically, the sidecar last; a split
whose sidecar records the same settings is skipped. The README's "The full TinyStories" lists the inputs --dataset
takes, "Shards and other formats" the formats and --shard-tokens.
"""

from __future__ import annotations

import argparse
import bz2
import contextlib
import errno
import functools
import gzip
import hashlib
import json
import lzma
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import datasets
import numpy as np
import pyarrow as pa
import tiktoken
from tiktoken_ext.openai_public import (  # GPT-2's special token and split pattern
    ENDOFTEXT,
    r50k_pat_str,
)
from tqdm import tqdm

from npy_datasets import (  # beside this file; importing it imports numpy only, never torch
    FORMAT_VERSION,
    LLMC_DTYPES,
    LLMC_HEADER_BYTES,
    LLMC_VERSIONS,
    TokenFileError,
    check_token_dtype,
    probe_sha256,
    read_sidecar,
    sidecar_path,
    token_dtype,
)

__all__ = [
    "TextSplit",
    "PreparedSplit",
    "HubUnreachableError",
    "gpt2_encoding",
    "hub_reachable",
    "load_text_splits",
    "carve_validation",
    "tokenize_documents",
    "npy_header",
    "write_token_file",
    "write_sidecar",
    "clean_stale_temp_files",
    "settings_fingerprint",
    "shard_path",
    "prepare_split",
    "prepare",
    "main",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_DATASET = "materials/tinystories_sample"  # bundled offline sample, relative to the repo root: the default input
TIKTOKEN_FILES = (
    REPO_ROOT / "materials" / "tiktoken_cache"
)  # GPT-2's BPE files, committed: no download
GPT2_ENCODER_JSON = "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"  # encoder.json, by tiktoken's cache name (sha1 of its url)
GPT2_ENCODER_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"  # tiktoken_ext.openai_public.gpt2
DEFAULT_SPLITS = ("train", "validation")  # TinyStories' two splits
VALIDATION_SPLIT = "validation"  # the split carved from CARVE_SOURCE when a dataset has none
CARVE_SOURCE = "train"  # documents for a missing validation split come from here
VAL_FRACTION = 0.005  # share of train documents carved off as validation (at least one)
SEED = 1337  # seeds the carve permutation, so every run carves the same documents
ENCODING = "gpt2"  # tiktoken encoding: GPT-2's 50,257-token BPE (from TIKTOKEN_FILES)
EOT_PLACEMENT = "prepend"  # EOT opens each document: a window starting at one sees a story from its start (llm.c)
EOT_PLACEMENTS = (
    EOT_PLACEMENT,
    "append",
)  # or EOT ends each document, as nanoGPT's prepare.py writes it (--eot)
CHUNK_DOCS = (
    1024  # documents per thread-pool task (and per read): amortises overhead, bounds memory
)
LAYOUTS = (
    "npy",
    "bin",
    "llmc",
)  # .npy with a header (np.load works), raw headerless .bin (nanoGPT), llm.c's .bin shards
SUFFIXES = {
    "npy": ".npy",
    "bin": ".bin",
    "llmc": ".bin",
}  # llm.c's shards are .bin files too: their header tells them apart
NPY_HEADER_SIZE = (
    128  # bytes before the data: a multiple of 64 as numpy wants, with room for any 64-bit length
)
HUB_PROBE_TIMEOUT_S = 3.0  # seconds to wait for huggingface.co before giving up on the Hub
FILE_BUILDERS = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".txt": "text",
    ".csv": "csv",
}  # -> builder
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # datasets decompresses these by suffix
OWN_READER = {
    ".txt": "text",
    ".jsonl": "json",
}  # read here, streamed, so that an error names the file and line
TEXT_SEPARATOR = (
    ENDOFTEXT.encode()
)  # a .txt line holding only this ends a document (TinyStoriesV2-GPT4-train.txt)
OPENERS = {
    ".gz": gzip.open,
    ".bz2": bz2.open,
    ".xz": lzma.open,
}  # what the own reader decompresses (not .zst)
CREATED_BY = "prepare_tokens.py"  # recorded in every sidecar
SHARD_DIGITS = 6  # train_000000.npy: names sort in shard order, up to 999,999 shards
_TEMP_NAME = re.compile(
    r"\.(?P<target>.+)\.tmp\.(?P<pid>\d+)\.[0-9a-f]{8}"
)  # .train.npy.tmp.<pid>.<random>
_HUB_NAME = re.compile(
    r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?"
)  # "owner/name" or "name", as the Hub spells them
_LINE_END = re.compile(
    r"\r?\n\Z"
)  # cut off each document read: "\r\n" or "\n" (a lone "\r" is text)
_SPLIT_NAME = re.compile(r"\w[\w.-]*")  # becomes a file name: no '/', '\\', ':', NUL or leading '.'
_DISK_FULL = {
    errno.ENOSPC,
    errno.EFBIG,
    errno.EDQUOT,
}  # no space, file-size limit, quota: write() fails


class HubUnreachableError(ConnectionError):
    """A Hub dataset was asked for, and neither the Hub nor (with HF_HUB_OFFLINE=1) the local cache has it."""


@dataclass(frozen=True)
class TextSplit:
    """The documents of one output split, and where they came from (the sidecar's "source")."""

    name: str  # split name written, e.g. "validation"
    documents: (
        datasets.Dataset | datasets.IterableDataset
    )  # one row per document; local files are streamed
    column: str  # the column holding the text
    source: dict[
        str, Any
    ]  # dataset, split, from_split, column, input_fingerprint (+ val_fraction, seed if carved)
    rows: np.ndarray | None = (
        None  # the rows of documents this split keeps, ascending (a carve); None: all
    )


@dataclass(frozen=True)
class PreparedSplit:
    """One split's token file, its sidecar contents, and whether this run wrote it. For a sharded split, path
    is the glob of its shards (NpyTokensDataset takes it), shards lists them, meta holds the totals and n_shards."""

    split: str
    path: Path
    meta: dict[str, Any]
    written: bool  # False when an up-to-date file was kept
    shards: tuple[Path, ...] = ()  # empty for one file

    def summary(self) -> str:
        """One line for the terminal: split, documents, tokens, dtype, path and what happened."""
        status = "written" if self.written else "up to date"
        if n := len(self.shards):
            status = f"{n:,} shard{'s' if n != 1 else ''}, {status}"
        return (
            f"{self.split}: {self.meta['n_docs']:,} docs, {self.meta['n_tokens']:,} tokens, "
            f"{self.meta['dtype']} -> {_display_path(self.path)} ({status})"
        )


# ---- Arguments: every rule in one place, checked before any slow work starts. --------------------------------
def _whole(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def _usable_cores() -> (
    int
):  # sched_getaffinity respects taskset and container limits; macOS and Windows lack it
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _check_arguments(
    *,
    splits: Sequence[str] | str = DEFAULT_SPLITS,
    val_fraction: Any = VAL_FRACTION,
    seed: Any = SEED,
    layout: str = "npy",
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    shard_tokens: int | None = None,
    eot_placement: str = EOT_PLACEMENT,
) -> tuple[tuple[str, ...], int]:
    """Refuse a bad argument with a ValueError or TypeError naming it; return (split names, threads). Defaults are valid."""
    names = (splits,) if isinstance(splits, str) else tuple(splits)
    if not names or not all(isinstance(s, str) and s for s in names):
        raise ValueError(f"splits must be one or more non-empty names, got {splits!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"splits must be distinct, got {list(names)}")
    if bad := [
        name for name in names if not _SPLIT_NAME.fullmatch(name)
    ]:  # "../x" or "/x" would leave the folder
        raise ValueError(
            f"split name {bad[0]!r} cannot be a file name: use letters, digits, '_', '.' and '-', not first '.'"
        )
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)):
        raise TypeError(f"val_fraction must be a number, got {val_fraction!r}")
    if not 0 < val_fraction < 1:  # nan and inf fail it too
        raise ValueError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    for name, value, valid in (
        ("layout", layout, LAYOUTS),
        ("eot_placement", eot_placement, EOT_PLACEMENTS),
    ):
        if value not in valid:
            raise ValueError(f"{name} must be one of {valid}, got {value!r}")
    _whole("chunk_docs", chunk_docs)
    if shard_tokens is not None:
        _whole("shard_tokens", shard_tokens)
    return names, _usable_cores() if num_threads is None else _whole("num_threads", num_threads)


def _display_path(path: Path) -> str:
    path, here = Path(path).resolve(), Path.cwd().resolve()
    return str(path.relative_to(here) if path.is_relative_to(here) else path)


# ---- Loading: Hub names and local files become one (Iterable)Dataset per output split. -----------------------
def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hub accepts a TCP connection within timeout seconds; False when offline mode is set."""
    if datasets.config.HF_HUB_OFFLINE or any(
        os.environ.get(flag, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    ):
        return False
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443))
    answered = threading.Event()

    def probe() -> None:
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=timeout).close()
            answered.set()

    threading.Thread(target=probe, daemon=True).start()
    return answered.wait(
        timeout
    )  # the wait also bounds the DNS lookup, which the socket timeout does not


def _builder_for(name: str) -> str | None:
    """The datasets builder for a data file name (compression suffixes ignored), or None."""
    path = Path(name).with_suffix("") if Path(name).suffix in COMPRESSIONS else Path(name)
    return FILE_BUILDERS.get(path.suffix.lower())


def _resolve_dataset(dataset: str | os.PathLike | None) -> tuple[str, Path | None]:
    """(name recorded in the sidecar, local path) for a local dataset, (name, None) for a Hub name."""
    if dataset is None:
        return SAMPLE_DATASET, REPO_ROOT / SAMPLE_DATASET
    name = os.fspath(dataset)
    if (path := Path(name).expanduser()).exists():
        return name, path
    if isinstance(dataset, os.PathLike) or not _HUB_NAME.fullmatch(name) or _builder_for(name):
        raise FileNotFoundError(
            f"dataset {name!r}: no such file or folder (a Hub name looks like 'owner/name')"
        )
    return name, None


def _input_fingerprint(paths: Iterable[str]) -> str:
    """sha256 over the files' own sha256 values, in order: identical bytes give identical ids."""
    digests = []
    for path in paths:
        with open(path, "rb") as f:
            digests.append(hashlib.file_digest(f, "sha256").hexdigest())
    return "sha256:" + hashlib.sha256(" ".join(digests).encode()).hexdigest()


def _load_hub(name: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """All splits of a Hub dataset and their files; unreachable: stop now (datasets would retry for half a minute)."""
    offline, sample = datasets.config.HF_HUB_OFFLINE, _display_path(REPO_ROOT / SAMPLE_DATASET)
    why = (
        "the Hugging Face Hub is unreachable (HF_HUB_OFFLINE=1) and the dataset is not in the local cache"
        if offline
        else "the Hugging Face Hub is unreachable; if the dataset is in your local cache, set HF_HUB_OFFLINE=1 to read it"
    )
    error = HubUnreachableError(
        f"cannot load {name!r}: {why}; no local file or folder named {name!r} exists either. "
        f"Use the bundled sample instead: omit --dataset, or pass --dataset {sample}"
    )
    if not offline and not hub_reachable():
        raise error
    try:
        loaded = dict(datasets.load_dataset(name))
    except (
        OSError
    ) as e:  # ConnectionError / FileNotFoundError: offline, and not in the local cache either
        if offline:
            raise error from e
        raise
    return loaded, {split: [f["filename"] for f in ds.cache_files] for split, ds in loaded.items()}


def _load_local(path: Path, column: str) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """All splits of a local dataset and their files; data files are streamed, never converted into a cache."""
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        loaded = datasets.load_from_disk(
            str(path)
        )  # a save_to_disk folder: its Arrow files are the data
        loaded = {CARVE_SOURCE: loaded} if isinstance(loaded, datasets.Dataset) else dict(loaded)
        return loaded, {
            split: [f["filename"] for f in ds.cache_files] for split, ds in loaded.items()
        }
    if path.is_file() and (builder_name := _builder_for(path.name)) is None:
        raise ValueError(
            f"{path}: unsupported file type; expected one of {sorted(FILE_BUILDERS)} (optionally .gz)"
        )
    builder = (
        datasets.load_dataset_builder(builder_name, data_files={CARVE_SOURCE: str(path)})
        if path.is_file()
        else datasets.load_dataset_builder(str(path))
    )  # a folder: datasets finds the files and their splits
    files = {str(split): list(paths) for split, paths in builder.config.data_files.items()}
    if all(
        Path(Path(f).stem if Path(f).suffix in OPENERS else f).suffix in OWN_READER
        for fs in files.values()
        for f in fs
    ):
        return {s: functools.partial(_read_documents, fs, column) for s, fs in files.items()}, files
    try:  # datasets reads the first rows now: an empty, truncated or malformed file fails here
        return dict(builder.as_streaming_dataset()), files
    except (StopIteration, OSError, ValueError, EOFError, RuntimeError) as e:
        raise ValueError(f"cannot read {path}: {str(e) or 'it holds no documents'}") from e


def _read_documents(paths: list[str], column: str) -> Iterator[pa.Table]:
    """The documents of .jsonl or .txt files (optionally .gz, .bz2, .xz), streamed in tables of CHUNK_DOCS rows; a fault is
    a ValueError naming the file and line. A .jsonl line is a document; a .txt is cut at its lines of only <|endoftext|>
    if it has any (TinyStoriesV2-GPT4-*.txt), else at every line end (\\n alone: a lone \\r is text)."""
    for path in paths:
        texts = _file_documents(path, column)
        if not (batch := list(islice(texts, CHUNK_DOCS))):
            raise ValueError(f"cannot read {path}: it holds no documents")
        while batch:
            yield pa.table({column: batch})
            batch = list(islice(texts, CHUNK_DOCS))


def _file_documents(path: str, column: str) -> Iterator[str]:
    number, jsonl, story = 0, _builder_for(path) == "json", []
    try:
        with OPENERS.get(Path(path).suffix, open)(path, "rb") as f:
            separated = not jsonl and any(
                line.strip() == TEXT_SEPARATOR for line in f
            )  # a first pass, until one
            f.seek(0)
            for number, line in enumerate(f, 1):
                if jsonl:
                    if line.strip():
                        yield _json_text(line, column)
                elif not separated:
                    yield _LINE_END.sub("", line.decode("utf-8"))
                elif (
                    line.strip() == TEXT_SEPARATOR
                ):  # the story's last line break belongs to the separator
                    yield _LINE_END.sub("", "".join(story))
                    story = []
                else:
                    story.append(line.decode("utf-8"))
            if "".join(
                story
            ).strip():  # text after the last separator line: a story unless only spaces
                yield _LINE_END.sub("", "".join(story))
    except (
        OSError,
        EOFError,
        ValueError,
        zlib.error,
        lzma.LZMAError,
    ) as e:  # ValueError: bad JSON or UTF-8, ...
        where = (
            f" line {number}"
            if isinstance(e, ValueError)
            else f" after line {number}"
            if number
            else ""
        )
        raise ValueError(f"cannot read {path}{where}: {e}") from e


def _json_text(line: bytes, column: str) -> str:
    """The text in column of one JSON line, or a ValueError that says what is there instead."""
    try:
        row = json.loads(line)
    except (
        json.JSONDecodeError
    ) as e:  # its own "line 1 column 9" would contradict the file's line number
        raise ValueError(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict) or column not in row:
        raise ValueError(
            f"column {column!r} not found; available: {sorted(row) if isinstance(row, dict) else row!r:.60}"
        )
    if not isinstance(text := row[column], str):
        raise ValueError(
            f"column {column!r} is {text!r:.40}, not text; every document must be a string"
        )
    if not text.isascii() and (
        surrogate := re.search("[\ud800-\udfff]", text)
    ):  # from an escape such as "\ud800"
        raise ValueError(
            f"column {column!r} holds a lone surrogate ({ascii(surrogate[0])}), which is not text"
        )
    return text


def _batches(documents: Any, where: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """documents as Arrow tables of up to CHUNK_DOCS rows; an input that cannot be read is a ValueError naming where."""
    if callable(documents):  # this module's own reader: its errors name the file and line
        yield from documents()
        return
    try:  # the reader's errors only: a consumer's own exceptions are raised in its frame, not here
        yield from (
            (documents if columns is None else documents.select_columns(columns))
            .with_format("arrow")
            .iter(CHUNK_DOCS)
        )
    except (
        OSError,
        ValueError,
        EOFError,
        RuntimeError,
    ) as e:  # bad JSON or UTF-8, a truncated .gz, ...
        raise ValueError(f"cannot read {where}: {e}") from e


def carve_validation(
    n_docs: int, val_fraction: float = VAL_FRACTION, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Split rows 0..n_docs-1 into (rest, validation) by a seeded permutation; each ascending, so order is kept."""
    _check_arguments(val_fraction=val_fraction, seed=seed)
    n_val = max(1, round(n_docs * val_fraction))
    if n_val >= n_docs:
        raise ValueError(
            f"cannot carve validation from {n_docs} train document(s): both splits need at least one"
        )
    order = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def load_text_splits(
    dataset: str | os.PathLike | None = None,
    column: str = "text",
    splits: Sequence[str] = DEFAULT_SPLITS,
    val_fraction: float = VAL_FRACTION,
    seed: int = SEED,
) -> dict[str, TextSplit]:
    """Load the requested splits of a Hub or local dataset (None: the bundled sample), carving validation if missing."""
    names, _ = _check_arguments(splits=splits, val_fraction=val_fraction, seed=seed)
    name, path = _resolve_dataset(dataset)
    loaded, files = _load_hub(name) if path is None else _load_local(path, column)
    carve = VALIDATION_SPLIT not in loaded and CARVE_SOURCE in loaded
    from_split = {
        s: CARVE_SOURCE if carve and s in (CARVE_SOURCE, VALIDATION_SPLIT) else s for s in names
    }
    for source in dict.fromkeys(
        from_split.values()
    ):  # each from its first rows, before any slow work
        if source not in loaded:
            raise ValueError(f"split {source!r} not found in {name}; available: {sorted(loaded)}")
        where = f"{name} split {source}"
        if (first := next(_batches(loaded[source], where), None)) is None or first.num_rows == 0:
            raise ValueError(f"{where} has no documents")
        if column not in first.column_names:
            raise ValueError(
                f"column {column!r} not found in {where}; available: {first.column_names}"
            )
        if not pa.types.is_string(
            kind := first.schema.field(column).type
        ) and not pa.types.is_large_string(kind):
            raise ValueError(f"column {column!r} in {where} holds {kind}, not text")
    rows = {}
    if (
        carve and CARVE_SOURCE in from_split.values()
    ):  # count train's documents (a pass over a streamed file), then carve
        train = loaded[CARVE_SOURCE]
        n = (
            len(train)
            if isinstance(train, datasets.Dataset)
            else sum(b.num_rows for b in _batches(train, f"{name} split {CARVE_SOURCE}", [column]))
        )
        rows[CARVE_SOURCE], rows[VALIDATION_SPLIT] = carve_validation(n, val_fraction, seed)
    identity = {
        source: _input_fingerprint(files[source]) for source in set(from_split.values())
    }  # each hashed once
    carving = {
        "val_fraction": float(val_fraction),
        "seed": int(seed),
    }  # recorded by the carved splits only
    sources = {
        s: {
            "dataset": name,
            "split": s,
            "from_split": from_split[s],
            "column": column,
            "input_fingerprint": identity[from_split[s]],
            **(carving if s in rows else {}),
        }
        for s in names
    }
    return {s: TextSplit(s, loaded[from_split[s]], column, sources[s], rows.get(s)) for s in names}


def _iter_texts(split: TextSplit) -> Iterator[str]:
    """Every document's text in order (only split.rows when set), read a batch at a time (a local file: streamed)."""
    where = f"{split.source['dataset']} split {split.source.get('from_split', split.name)}"
    first, rows = 0, split.rows  # first: the row number of the batch's first row
    for batch in _batches(split.documents, where, [split.column]):
        cells = batch.column(split.column)
        if cells.null_count:
            row = first + cells.is_null().index(True).as_py()
            raise ValueError(
                f"{where} row {row}: column {split.column!r} is None; every document must be a string"
            )
        if rows is not None:  # only this batch's kept rows, in order
            lo, hi = np.searchsorted(rows, [first, first + len(cells)])
            cells = cells.take(pa.array(rows[lo:hi] - first))
        first += batch.num_rows
        yield from cells.to_pylist()
    if rows is not None and len(rows) and rows[-1] >= first:
        raise ValueError(
            f"{where} now holds {first} rows, fewer than when it was carved; did it change?"
        )


# ---- Tokenizing: GPT-2's BPE from the bundled files; chunks of documents on a thread pool, in input order. ---
@functools.cache
def gpt2_encoding(folder: str | os.PathLike = TIKTOKEN_FILES) -> tiktoken.Encoding:
    """GPT-2's encoding, as tiktoken.get_encoding("gpt2"), from folder's sha256-checked encoder.json: no download."""
    path = Path(folder) / GPT2_ENCODER_JSON
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != GPT2_ENCODER_SHA256:
        raise ValueError(
            f"{str(path)!r}: sha256 differs from GPT-2's encoder.json ({GPT2_ENCODER_SHA256}); restore it"
        )
    printable = [
        b for b in range(256) if chr(b).isprintable() and b != 32
    ]  # GPT-2 spells byte b as chr(b) if printable,
    others = [
        b for b in range(256) if b not in printable
    ]  # and the others as chr(256), chr(257), ... in order
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
    """[EOT, *ids] (append: [*ids, EOT]) for each text, concatenated into one uint32 array; no special token is emitted."""
    eot, parts = np.array([enc.eot_token], dtype=np.uint32), []
    for text in texts:
        try:  # encode_ordinary's ids, made in Rust as an array; nothing allowed, nothing refused
            ids = enc.encode_to_numpy(text, disallowed_special=())
        except (
            UnicodeEncodeError
        ):  # a lone surrogate: encode_ordinary replaces it with U+FFFD (tiktoken's own fix)
            ids = np.array(enc.encode_ordinary(text), dtype=np.uint32)
        parts += (ids, eot) if append else (eot, ids)
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)


def tokenize_documents(
    texts: Iterable[str],
    enc: tiktoken.Encoding,
    *,
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    eot_placement: str = EOT_PLACEMENT,
) -> Iterator[np.ndarray]:
    """Yield one uint32 id array per chunk of chunk_docs documents, in input order; a document is [EOT, *ids] ("append": [*ids, EOT])."""
    _, num_threads = _check_arguments(
        num_threads=num_threads, chunk_docs=chunk_docs, eot_placement=eot_placement
    )

    def in_order(texts: Iterator[str]) -> Iterator[np.ndarray]:
        pool = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenize")
        pending: deque[Future[np.ndarray]] = (
            deque()
        )  # oldest first: yielding from the left keeps input order
        try:
            while batch := list(islice(texts, chunk_docs)):
                pending.append(pool.submit(_encode_chunk, enc, batch, eot_placement == "append"))
                if (
                    len(pending) > 2 * num_threads
                ):  # enough queued to keep every thread busy: wait for the oldest
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    return in_order(iter(texts))


# ---- Writing: stream to a temp file, fsync, rename; the sidecar last. ----------------------------------------
def npy_header(dtype: Any, n_tokens: int) -> bytes:
    """A .npy format 1.0 header for a 1-D array of n_tokens, always NPY_HEADER_SIZE bytes long."""
    descr = check_token_dtype(dtype, "token dtype").str  # e.g. '<u2'
    fields = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({int(n_tokens)},), }}"
    text_len = NPY_HEADER_SIZE - 10  # after magic (6 bytes), version (2) and the length field (2)
    if len(fields) >= text_len:
        raise ValueError(f"n_tokens {n_tokens} is too large for a {NPY_HEADER_SIZE}-byte header")
    text = fields.ljust(text_len - 1) + "\n"  # numpy accepts spaces before the final newline
    return b"\x93NUMPY\x01\x00" + text_len.to_bytes(2, "little") + text.encode("latin1")


def _llmc_header(dtype: Any, n_tokens: int) -> bytes:
    """llm.c's shard header: 256 int32 words, magic and version (which give the dtype), token count, then zeros."""
    dtype = check_token_dtype(dtype, "token dtype")
    magic = next(m for m, d in LLMC_DTYPES.items() if d == dtype)
    version = LLMC_VERSIONS[magic]
    if n_tokens >= 2**31:  # the count is an int32
        raise ValueError(
            f"an llm.c shard holds at most {2**31 - 1:,} tokens, got {n_tokens:,}; pass a smaller shard_tokens"
        )
    return (
        np.array([magic, version, n_tokens], dtype="<i4").tobytes().ljust(LLMC_HEADER_BYTES, b"\0")
    )


def _as_token_array(chunk: Any, dtype: np.dtype) -> np.ndarray:
    """chunk cast to dtype, after checking every id fits: a plain astype would wrap 70000 to 4464."""
    ids = np.asarray(chunk)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(
            f"a chunk must be a 1-D array of integer ids, got {ids.dtype} with shape {ids.shape}"
        )
    top, lo, hi = np.iinfo(dtype).max, int(ids.min(initial=0)), int(ids.max(initial=0))
    if lo < 0 or hi > top:
        wider = "; uint32 holds ids up to 4,294,967,295" if dtype.itemsize < 4 else ""
        raise ValueError(
            f"token id {lo if lo < 0 else hi} does not fit {dtype.name} (valid ids: 0 to {top:,}){wider}"
        )
    return ids.astype(dtype, copy=False)


def _fsync_dir(folder: Path) -> None:
    """Make renames and deletions in folder durable (POSIX only: Windows cannot fsync a folder)."""
    if os.name != "nt":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _new_temp(path: Path, folder: bool = False) -> tuple[Path, int | None]:
    """A new temp file, open (or a new folder), beside path: .<name>.tmp.<pid>.<random>; O_EXCL never opens a planted link."""
    while True:
        tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
        with contextlib.suppress(FileExistsError):  # the name is taken: draw another
            return tmp, tmp.mkdir() if folder else os.open(
                tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666
            )


@contextlib.contextmanager
def _atomic_output(path: Path, *, drop_first: Path | None = None) -> Iterator[BinaryIO]:
    """Yield a temp file beside path; on success fsync it and rename it over path, on any error delete it. drop_first
    (the old sidecar) goes just before the rename: a crash leaves a file without sidecar, never one with a stale one."""
    (tmp, fd), renamed = _new_temp(path), False
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if drop_first is not None and drop_first.exists():
            drop_first.unlink(
                missing_ok=True
            )  # missing_ok: a concurrent run may have just deleted it
            _fsync_dir(path.parent)
        os.replace(tmp, path)
        renamed = True
        _fsync_dir(path.parent)
    except OSError as e:
        if (
            e.filename is None and e.errno in _DISK_FULL
        ):  # write() names no file: name the one being written
            raise OSError(e.errno, f"{e.strerror} while writing", str(path)) from e
        raise
    finally:
        if not renamed:
            tmp.unlink(missing_ok=True)


def write_token_file(
    chunks: Iterable[Any], path: str | os.PathLike, dtype: Any = np.uint16, layout: str = "npy"
) -> dict[str, Any]:
    """Stream id chunks into path atomically (its old sidecar is deleted); return counts, size and sha256."""
    path, dtype = Path(path), check_token_dtype(dtype, "token dtype")
    _check_arguments(layout=layout)
    if path.suffix != SUFFIXES[layout]:
        raise ValueError(f"a {layout} token file must end in {SUFFIXES[layout]}, got {path.name!r}")
    n_tokens, max_token_id, header = (
        0,
        -1,
        {"npy": npy_header, "llmc": _llmc_header}.get(layout, lambda *_: b""),
    )
    with _atomic_output(path, drop_first=sidecar_path(path)) as f:
        f.write(
            header(dtype, 0)
        )  # placeholder: same length as the real header written below (bin: no header)
        for chunk in chunks:
            if (ids := _as_token_array(chunk, dtype)).size:
                f.write(ids.tobytes())
                n_tokens, max_token_id = n_tokens + ids.size, max(max_token_id, int(ids.max()))
        if n_tokens == 0:
            raise ValueError(f"no tokens to write to {path}")
        f.seek(0)
        f.write(header(dtype, n_tokens))  # the true length, over the placeholder
        f.seek(0)
        sha256 = hashlib.file_digest(
            f, "sha256"
        ).hexdigest()  # one read of the finished file, which ends at its size
        file_size = f.tell()
    return {
        "n_tokens": n_tokens,
        "max_token_id": max_token_id,
        "file_size": file_size,
        "sha256": sha256,
    }


def write_sidecar(token_path: str | os.PathLike, meta: dict[str, Any]) -> Path:
    """Write meta as token_path's JSON sidecar (sorted keys, indent 2), atomically; call it after the token file."""
    with _atomic_output(side := sidecar_path(token_path)) as f:
        f.write((json.dumps(meta, sort_keys=True, indent=2) + "\n").encode("utf-8"))
    return side


def _pid_alive(pid: int) -> bool:
    if (
        pid == os.getpid() or os.name == "nt"
    ):  # on Windows os.kill would end it, and an open file cannot be deleted
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except OSError as e:  # PermissionError: it exists, owned by someone else
        return isinstance(e, PermissionError)
    return True


def clean_stale_temp_files(out_dir: str | os.PathLike) -> list[Path]:
    """Delete the temp files and shard staging folders that killed runs left in out_dir (a live run's stay); return them."""
    removed = []
    for entry in Path(out_dir).iterdir() if Path(out_dir).is_dir() else ():
        match = _TEMP_NAME.fullmatch(entry.name)
        if (
            match is None
            or entry.is_symlink()
            or not (entry.is_file() or entry.is_dir())
            or _pid_alive(int(match["pid"]))
        ):
            continue  # not ours, or another run is writing it right now
        with contextlib.suppress(OSError):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            removed.append(entry)
    return removed


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while a few renames must not be cut in half, then deliver them (main thread only)."""
    signals = (
        (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is threading.main_thread()
        else ()
    )
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])  # now, to the handler that was in place


# ---- Putting it together: one tokenize path, into one file or into shards. -----------------------------------
def settings_fingerprint(settings: dict[str, Any]) -> str:
    """sha256 hex of settings as canonical JSON: equal fingerprints mean byte-identical token files."""
    return hashlib.sha256(
        json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def shard_path(out: str | os.PathLike, split: str, index: int, layout: str = "npy") -> Path:
    """<out>/<split>_<index, 6 digits>.<layout>: shard names sort in shard order."""
    if not 0 <= index < 10**SHARD_DIGITS:
        raise ValueError(
            f"shard index {index} needs more than {SHARD_DIGITS} digits; choose a larger shard_tokens"
        )
    return Path(out) / f"{split}_{index:0{SHARD_DIGITS}d}{SUFFIXES[layout]}"


def _existing_shards(out: Path, split: str, layout: str) -> dict[int, Path]:
    """The shard files of split in out, by index (only exact <split>_dddddd.<layout> names)."""
    name = re.compile(rf"{re.escape(split)}_(\d{{{SHARD_DIGITS}}}){re.escape(SUFFIXES[layout])}")
    matches = (name.fullmatch(entry.name) for entry in (out.iterdir() if out.is_dir() else ()))
    return {int(m[1]): out / m[0] for m in matches if m is not None}


def _up_to_date(
    paths: list[Path], fingerprint: str, split: str | None
) -> list[dict[str, Any]] | None:
    """The sidecars of paths if each records fingerprint and its file's size (shards: and their count), else None.
    split (sharding only): refuse a file with a shard's name whose sidecar says it is not a shard of that split."""
    metas = []
    for path in paths:
        with contextlib.suppress(
            TokenFileError
        ):  # an unreadable sidecar: rebuild (a shard: an unfinished one at worst)
            meta = read_sidecar(path) or {}  # none: not up to date
            if (
                meta
                and split is not None
                and not (
                    isinstance(meta.get("shard"), dict)
                    and isinstance(meta.get("source"), dict)
                    and meta["source"].get("split") == split
                )
            ):
                raise ValueError(
                    f"{str(path)!r} is not a shard of split {split!r} (its sidecar says otherwise), but has a shard's "
                    f"name; sharding {split!r} would replace or delete it. Move it, or choose another --out"
                )
            if (
                meta.get("settings_fingerprint") == fingerprint
                and path.is_file()
                and path.stat().st_size == meta["file_size"]
                and (split is None or meta["shard"].get("count") == len(paths))
            ):
                metas.append(meta)
    return metas if paths and len(metas) == len(paths) else None


def _shard_streams(
    chunks: Iterable[np.ndarray], shard_tokens: int
) -> Iterator[Iterator[np.ndarray]]:
    """One iterator per shard: exactly shard_tokens ids each but the last (the rest, never empty). Consume in order."""
    chunks = (chunk for chunk in chunks if len(chunk))
    head = next(chunks, None)  # ids read but not yet handed out

    def shard() -> Iterator[np.ndarray]:
        nonlocal head
        need = shard_tokens
        while need and head is not None:
            piece, head = head[:need], head[need:] if len(head) > need else next(chunks, None)
            need -= len(piece)
            yield piece

    while head is not None:
        yield shard()


def _counting_documents(
    chunks: Iterable[np.ndarray], eot_id: int, bar: tqdm, starts: list[int]
) -> Iterator[np.ndarray]:
    """chunks, passed through; each adds the documents starting in it (one EOT each) to starts and to bar."""
    for chunk in chunks:
        starts.append(int(np.count_nonzero(chunk == eot_id)))
        bar.update(starts[-1])
        yield chunk


def _publish(
    out: Path,
    split: TextSplit,
    staging: Path | None,
    written: list[tuple[Path, dict[str, Any], int]],
    settings: dict[str, Any],
) -> list[dict[str, Any]]:
    """Swap staged shards in, if any (old sidecars first, then old extra shards), then write each file's sidecar."""
    if staging is not None:
        old = _existing_shards(
            out, split.name, settings["layout"]
        )  # extra shards: an earlier run's, with more text
        for stale in [sidecar_path(p) for p in old.values()] + [
            p for index, p in old.items() if index >= len(written)
        ]:
            stale.unlink(missing_ok=True)
        _fsync_dir(out)
        for path, _, _ in written:
            os.replace(staging / path.name, path)
        _fsync_dir(out)
    metas, first_token = [], 0
    for index, (path, stats, n_docs) in enumerate(written):
        meta = {
            "format": "npy-tokens",
            "format_version": FORMAT_VERSION,
            "file": path.name,
            "shape": [stats["n_tokens"]],
            **stats,
            **{
                key: settings[key]
                for key in ("layout", "dtype", "tokenizer", "n_vocab", "eot_id", "eot_placement")
            },
            "probe_sha256": probe_sha256(path),
            "n_docs": n_docs,
            "source": split.source,
            "settings_fingerprint": settings_fingerprint(settings),
            "created_by": CREATED_BY,
        }
        if staging is not None:
            meta["shard"] = {
                "index": index,
                "count": len(written),
                "shard_tokens": settings["shard_tokens"],
                "first_token": first_token,
            }
        write_sidecar(path, meta)
        metas.append(meta)
        first_token += stats["n_tokens"]
    return metas


def _result(
    name: str, path: Path, metas: list[dict[str, Any]], written: bool, sharded: bool
) -> PreparedSplit:
    """The PreparedSplit of one file, or of shards: their common sidecar fields with totals over all of them."""
    if not sharded:
        return PreparedSplit(name, path, metas[0], written)
    totals = {
        k: v
        for k, v in metas[0].items()
        if k not in ("file", "file_size", "sha256", "probe_sha256", "shape", "shard")
    }
    totals.update(
        n_tokens=sum(m["n_tokens"] for m in metas),
        n_docs=sum(m["n_docs"] for m in metas),
        max_token_id=max(m["max_token_id"] for m in metas),
        n_shards=len(metas),
    )
    return PreparedSplit(name, path, totals, written, tuple(path.parent / m["file"] for m in metas))


def prepare_split(
    split: TextSplit,
    out: str | os.PathLike,
    enc: tiktoken.Encoding,
    *,
    layout: str = "npy",
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    force: bool = False,
    progress: bool = True,
    shard_tokens: int | None = None,
    eot_placement: str = EOT_PLACEMENT,
) -> PreparedSplit:
    """Tokenize one split into <out>/<split>.<layout> and its sidecar, unless an up-to-date copy exists. With shard_tokens,
    into shard_path()s of shard_tokens ids each (the last: the rest), staged and swapped in only when all are written."""
    _, num_threads = _check_arguments(
        splits=split.name,
        layout=layout,
        num_threads=num_threads,
        chunk_docs=chunk_docs,
        shard_tokens=shard_tokens,
        eot_placement=eot_placement,
    )
    out, dtype, sharded = Path(out), token_dtype(enc.n_vocab), shard_tokens is not None
    settings = {  # everything that decides the bytes; not the dataset's spelling, threads or chunk size
        **{key: value for key, value in split.source.items() if key != "dataset"},
        "tokenizer": f"tiktoken:{enc.name}",
        "n_vocab": enc.n_vocab,
        "eot_id": enc.eot_token,
        "eot_placement": eot_placement,
        "dtype": dtype.name,
        "layout": layout,
        "format_version": FORMAT_VERSION,
        **(
            {"shard_tokens": int(shard_tokens)} if sharded else {}
        ),  # only when sharded: one-file fingerprints stay
    }
    path = out / (
        (f"{split.name}_{'[0-9]' * SHARD_DIGITS}" if sharded else split.name) + SUFFIXES[layout]
    )
    existing = (
        [p for _, p in sorted(_existing_shards(out, split.name, layout).items())]
        if sharded
        else [path]
    )
    if (
        sharded or not force
    ):  # sharded: even with force, another split's file with a shard's name is refused
        metas = _up_to_date(
            existing, settings_fingerprint(settings), split.name if sharded else None
        )
        if metas is not None and not force:
            return _result(split.name, path, metas, False, sharded)
    out.mkdir(parents=True, exist_ok=True)
    staging = (
        _new_temp(out / f"{split.name}_shards", folder=True)[0] if sharded else None
    )  # .train_shards.tmp.<pid>.<hex>
    written: list[
        tuple[Path, dict[str, Any], int]
    ] = []  # final path, stats, documents starting in it
    try:
        chunks = tokenize_documents(
            _iter_texts(split),
            enc,
            num_threads=num_threads,
            chunk_docs=chunk_docs,
            eot_placement=eot_placement,
        )
        total = (
            len(split.rows)
            if split.rows is not None
            else getattr(split.documents, "num_rows", None)
        )
        bar = tqdm(total=total, desc=split.name, unit="doc", file=sys.stderr, disable=not progress)
        with bar, contextlib.closing(chunks):  # closing: stop the worker threads if writing fails
            for index, piece in enumerate(
                _shard_streams(chunks, shard_tokens) if sharded else [chunks]
            ):
                final, starts = shard_path(out, split.name, index, layout) if sharded else path, []
                stats = write_token_file(
                    _counting_documents(piece, enc.eot_token, bar, starts),
                    (staging or out) / final.name,
                    dtype,
                    layout,
                )
                written.append((final, stats, sum(starts)))
        with (
            _signals_deferred()
        ):  # the swap and the sidecars: a Ctrl-C now waits until they are done
            metas = _publish(out, split, staging, written, settings)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return _result(split.name, path, metas, True, sharded)


def _default_out_dir(name: str, path: Path | None) -> Path:
    """data/<short dataset name> under the repo root: data/tinystories_sample, data/tinystories, ..."""
    stem = path.resolve().name if path is not None else name.rstrip("/").split("/")[-1]
    while Path(stem).suffix in (*FILE_BUILDERS, *COMPRESSIONS):
        stem = Path(stem).stem
    return (
        REPO_ROOT / "data" / (re.sub(r"[^a-z0-9._-]+", "_", stem.lower()).strip("._") or "dataset")
    )


def _check_out_dir(out: Path, input_path: Path | None) -> None:
    """Refuse an output folder that lies inside the input, is a file, or cannot be created or written."""
    if input_path is not None and out.resolve().is_relative_to(input_path.resolve()):
        raise ValueError(
            f"output folder {str(out)!r} is inside the input dataset {str(input_path)!r}; choose another --out"
        )
    existing = out
    while not existing.exists():
        if (
            existing.is_symlink()
        ):  # mkdir would fail only after the dataset loaded, with "File exists"
            raise ValueError(
                f"output folder {str(out)!r}: {str(existing)!r} is a link to {os.readlink(existing)!r}, "
                "which does not exist; create its target or remove the link"
            )
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"cannot create output folder {str(out)!r}: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"cannot write to output folder {str(out)!r}: {str(existing)!r} is not writable"
        )


def prepare(
    dataset: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    column: str = "text",
    splits: Sequence[str] = DEFAULT_SPLITS,
    val_fraction: float = VAL_FRACTION,
    seed: int = SEED,
    encoding: str = ENCODING,
    layout: str = "npy",
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    force: bool = False,
    progress: bool = True,
    shard_tokens: int | None = None,
    eot_placement: str = EOT_PLACEMENT,
) -> list[PreparedSplit]:
    """Tokenize every requested split of dataset (None: the bundled sample) into out (None: data/<name>). shard_tokens:
    shards of that many tokens (see prepare_split). encoding "gpt2" is gpt2_encoding(); another, tiktoken.get_encoding."""
    names, num_threads = _check_arguments(
        splits=splits,
        val_fraction=val_fraction,
        seed=seed,
        layout=layout,
        num_threads=num_threads,
        chunk_docs=chunk_docs,
        shard_tokens=shard_tokens,
        eot_placement=eot_placement,
    )
    name, path = _resolve_dataset(dataset)
    out = Path(out) if out is not None else _default_out_dir(name, path)
    _check_out_dir(out, path)
    enc = gpt2_encoding() if encoding == ENCODING else tiktoken.get_encoding(encoding)
    text_splits = load_text_splits(dataset, column, names, val_fraction, seed)
    clean_stale_temp_files(out)  # prepare_split creates out
    return [
        prepare_split(
            text_splits[s],
            out,
            enc,
            layout=layout,
            num_threads=num_threads,
            chunk_docs=chunk_docs,
            force=force,
            progress=progress,
            shard_tokens=shard_tokens,
            eot_placement=eot_placement,
        )
        for s in names
    ]


# ---- Command line: argparse's dests are prepare()'s keyword arguments. ---------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="prepare_tokens.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--dataset",
        help=f"Hub name or local folder/file; default: {SAMPLE_DATASET}. A .txt with lines of only "
        "<|endoftext|> (TinyStoriesV2-GPT4-train.txt) holds the stories between them; without one, a document per line",
    )
    p.add_argument("--out", help="output folder; default: data/<dataset name> under the repo root")
    p.add_argument("--column", default="text", help="column holding the text (default: text)")
    p.add_argument(
        "--splits",
        nargs="+",
        default=list(DEFAULT_SPLITS),
        help="splits to write (default: train validation)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=VAL_FRACTION,
        help=f"validation carved from train if none (default: {VAL_FRACTION})",
    )
    p.add_argument("--seed", type=int, default=SEED, help=f"seed of that carve (default: {SEED})")
    p.add_argument(
        "--encoding",
        default=ENCODING,
        help=f"tiktoken encoding (default: {ENCODING}, from the bundled files)",
    )
    p.add_argument(
        "--format",
        dest="layout",
        choices=LAYOUTS,
        default="npy",
        help="npy (default), nanoGPT's raw .bin, or llm.c's .bin",
    )
    p.add_argument(
        "--num-threads",
        type=int,
        help=f"tokenizer threads (default: usable cores, here {_usable_cores()})",
    )
    p.add_argument(
        "--chunk-docs",
        type=int,
        default=CHUNK_DOCS,
        help=f"documents per thread task (default: {CHUNK_DOCS})",
    )
    p.add_argument(
        "--shard-tokens",
        type=int,
        metavar="N",
        help="write each split as shards of N tokens (the last: the rest)",
    )
    p.add_argument(
        "--eot",
        dest="eot_placement",
        choices=EOT_PLACEMENTS,
        default=EOT_PLACEMENT,
        help="end-of-text token before each document (default, as llm.c) or after it (as nanoGPT)",
    )
    p.add_argument(
        "--force", action="store_true", help="rebuild even when the outputs are up to date"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: prepare every split and print one summary line per split."""
    parser = _parser()
    args = vars(parser.parse_args(argv))
    try:  # prepare() checks them too: here a bad one is a usage error (exit status 2), before anything loads
        _check_arguments(**{k: v for k, v in args.items() if k in _check_arguments.__kwdefaults__})
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    previous = (
        signal.signal(
            signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum)
        )  # `kill` unwinds like Ctrl-C
        if threading.current_thread() is threading.main_thread()
        else None
    )
    try:
        results = prepare(**args)
    except KeyboardInterrupt:
        print("interrupted: unfinished files removed, earlier outputs untouched", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:  # includes HubUnreachableError and missing files
        raise SystemExit(f"prepare_tokens.py: error: {e}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for result in results:
        print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
