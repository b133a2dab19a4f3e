"""Where the text comes from: a Hub dataset, a save_to_disk folder or local files (prep_files),
as one TextSplit per output split, validation carved from train when the dataset has none.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import re
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import datasets
import numpy as np
import pyarrow as pa

from prep_files import (
    BOM,
    FILE_FORMATS,
    OPENERS,
    SEPARATORS,
    check_text_column,
    file_format,
    folder_files,
    read_documents,
    txt_separators,
)
from prep_settings import (
    CARVE_SOURCE,
    CHUNK_DOCS,
    DEFAULT_SPLITS,
    REPO_ROOT,
    SEED,
    VAL_FRACTION,
    VALIDATION_NAMES,
    check_prep_arguments,
    display_path,
    split_names,
)

SAMPLE_DATASET = "materials/tinystories_sample"  # the bundled offline sample, from the repo root
HUB_PROBE_TIMEOUT_S = 3.0  # seconds to wait for huggingface.co before giving up on the Hub
HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "owner/name" or "name", as on the Hub
SAVED_MARKERS = ("dataset_dict.json", "state.json")  # what datasets.save_to_disk writes


class HubUnreachableError(ConnectionError):
    """A Hub dataset was asked for, and neither the Hub nor (with HF_HUB_OFFLINE=1) the local
    cache has it."""


@dataclass(frozen=True)
class TextSplit:
    """The documents of one output split, and where they came from (the sidecar's "source")."""

    name: str  # the split written, e.g. "validation": its file is <name>.npy
    documents: Any  # a datasets.Dataset, or (local files) a function that streams tables
    column: str  # the column holding the text
    source: dict[str, Any]  # dataset, split, from_split, column, input_fingerprint (+ the carve)
    rows: np.ndarray | None = None  # the rows this split keeps, ascending (a carve); None: all


@dataclass
class SkipCount:
    """Documents that skip_empty_documents read, and those it left out: no text, or only
    whitespace."""

    empty_docs: int = 0
    read_docs: int = 0  # the empty ones included


class Loaded(NamedTuple):
    """A dataset's splits: their documents, the files they are read from, and each .txt file's
    separator (prep_files.txt_separators; empty when there is none)."""

    documents: dict[str, Any]
    files: dict[str, list[str]]
    separators: dict[str, str]


# ---- The splits: each from its own split, or carved from train -------------------------------
def load_text_splits(
    dataset: str | os.PathLike | None = None,
    column: str = "text",
    splits: Sequence[str] = DEFAULT_SPLITS,
    val_fraction: float = VAL_FRACTION,
    seed: int = SEED,
    separator: str = "auto",
    keep_line_endings: bool = False,
) -> dict[str, TextSplit]:
    """Load the requested splits of a Hub or local dataset (None: the bundled sample), carving
    validation from train when the dataset has none. "val" is the validation split too.
    separator: how a .txt is cut into documents (prep_files.SEPARATORS); other inputs: "auto".
    keep_line_endings: keep "\\r\\n" and a lone "\\r" in the text (False: each is read as "\\n")."""
    check_prep_arguments(
        splits=splits, val_fraction=val_fraction, seed=seed, keep_line_endings=keep_line_endings
    )
    if separator not in SEPARATORS:
        raise ValueError(f"separator must be one of {', '.join(SEPARATORS)}; got {separator!r}")
    names = split_names(splits)
    name, path = resolve_dataset(dataset)
    if path is None:
        _check_separator_applies(separator, name, {})  # before the Hub's slow load
    local = (path, column, separator, keep_line_endings)
    loaded = _load_hub(name) if path is None else _load_local(*local)
    _check_separator_applies(separator, name, loaded.separators)
    from_split = _source_splits(names, loaded.documents, name)
    for source in dict.fromkeys(from_split.values()):  # each from its first rows, before slow work
        _check_first_rows(loaded.documents[source], column, f"{name} split {source}")
    carve_from = f"{name} split {CARVE_SOURCE}"
    rows = _carved_rows(from_split, loaded.documents, column, carve_from, val_fraction, seed)
    fingerprints = {
        split: _input_fingerprint(loaded.files[split]) for split in set(from_split.values())
    }
    text_splits = {}
    for split in names:
        source = {
            "dataset": name,
            "split": split,
            "from_split": from_split[split],
            "column": column,
            "input_fingerprint": fingerprints[from_split[split]],
            "line_endings": "kept" if keep_line_endings else "lf",  # lf: "\r\n", "\r" read as "\n"
        }
        if loaded.separators:  # it decides a .txt's documents, so their bytes
            source["separator"] = separator
        if split in rows:  # the carve's settings: recorded by the carved splits only
            source.update(val_fraction=float(val_fraction), seed=int(seed))
        documents = loaded.documents[from_split[split]]
        text_splits[split] = TextSplit(split, documents, column, source, rows.get(split))
    return text_splits


def _check_separator_applies(separator: str, name: str, separators: dict[str, str]) -> None:
    """Refuse a separator other than "auto" for an input without .txt files: it cuts nothing."""
    if separator != "auto" and not separators:
        why = f"it cuts .txt files, and {name} holds none"
        raise ValueError(f"--separator {separator}: {why}; leave the option out for this input")


def _source_splits(names: Sequence[str], documents: dict[str, Any], dataset: str) -> dict:
    """The dataset split each output split is read from: its own name; for validation or val,
    the dataset's validation split, or else train (then carved)."""
    validation = next((name for name in VALIDATION_NAMES if name in documents), None)
    from_split = {}
    for name in names:
        if name in documents:
            from_split[name] = name
        elif name in VALIDATION_NAMES and validation is not None:
            from_split[name] = validation
        elif name in VALIDATION_NAMES and CARVE_SOURCE in documents:
            from_split[name] = CARVE_SOURCE
        else:
            available = sorted(documents)
            raise ValueError(f"split {name!r} not found in {dataset}; available: {available}")
    return from_split


def _check_first_rows(documents: Any, column: str, where: str) -> None:
    """A split must hold documents, its column text, and a document that is not empty: read
    its rows up to the first such one (the first, in any dataset worth tokenizing)."""
    batches = _batches(documents, where)
    first = next(batches, None)
    if first is None or first.num_rows == 0:
        raise ValueError(f"{where} has no documents")
    try:
        check_text_column(first.schema, column)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    n_read = 0
    for batch in itertools.chain([first], batches):
        cells = batch.column(column)
        if cells.null_count:  # not text: iter_texts names the row
            return
        if any(_has_text(_document(text)) for text in cells.to_pylist()):
            return
        n_read += batch.num_rows
    raise ValueError(f"{where}: {_all_empty(n_read)}")


def _all_empty(n_read: int) -> str:
    return f"its documents are all empty ({n_read:,} read, {n_read:,} empty); nothing to tokenize"


def _carved_rows(
    from_split: dict[str, str],
    documents: dict[str, Any],
    column: str,
    where: str,
    val_fraction: float,
    seed: int,
) -> dict[str, np.ndarray]:
    """The rows of train that each carved split keeps, when the dataset has no validation split:
    validation (or val) the carved ones, train the rest. Empty when nothing is carved."""
    has_validation = any(name in documents for name in VALIDATION_NAMES)
    carved = [split for split, source in from_split.items() if source == CARVE_SOURCE]
    if has_validation or not carved:
        return {}
    n_docs = _count_documents(documents[CARVE_SOURCE], column, where)
    rest, validation = carve_validation(n_docs, val_fraction, seed)
    return {split: validation if split in VALIDATION_NAMES else rest for split in carved}


def _count_documents(documents: Any, column: str, where: str) -> int:
    """The rows of a split: a Dataset knows them, local files take one pass."""
    if isinstance(documents, datasets.Dataset):
        return len(documents)
    return sum(batch.num_rows for batch in _batches(documents, where, [column]))


def carve_validation(
    n_docs: int, val_fraction: float = VAL_FRACTION, seed: int = SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Split rows 0..n_docs-1 into (rest, validation) by a seeded permutation; each ascending,
    so order is kept."""
    check_prep_arguments(val_fraction=val_fraction, seed=seed)
    n_val = max(1, round(n_docs * val_fraction))
    if n_val >= n_docs:
        need = "both splits need at least one"
        raise ValueError(f"cannot carve validation from {n_docs} train document(s): {need}")
    order = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def _input_fingerprint(paths: Iterable[str]) -> str:
    """sha256 over the files' own sha256 values, in order: identical bytes give identical ids."""
    digests = []
    for path in paths:
        with open(path, "rb") as f:
            digests.append(hashlib.file_digest(f, "sha256").hexdigest())
    return "sha256:" + hashlib.sha256(" ".join(digests).encode()).hexdigest()


# ---- Loading: a Hub name, a save_to_disk folder, or local data files --------------------------
def resolve_dataset(dataset: str | os.PathLike | None) -> tuple[str, Path | None]:
    """(name recorded in the sidecar, local path) for a local dataset, (name, None) for a Hub
    name; None is the bundled sample."""
    if dataset is None:
        return SAMPLE_DATASET, REPO_ROOT / SAMPLE_DATASET
    name = os.fspath(dataset)
    path = Path(name).expanduser()
    if path.exists():
        return name, path
    if isinstance(dataset, os.PathLike) or not HUB_NAME.fullmatch(name) or file_format(name):
        looks = "a Hub name looks like 'owner/name'"
        raise FileNotFoundError(f"dataset {name!r}: no such file or folder ({looks})")
    return name, None


def _load_local(
    path: Path, column: str, separator: str = "auto", keep_line_endings: bool = False
) -> Loaded:
    """A save_to_disk folder, or data files streamed by prep_files on every run: never
    converted into a cache, so the input's hash always describes the text tokenized."""
    if any((path / marker).is_file() for marker in SAVED_MARKERS):
        return _load_saved(path)
    if path.is_dir():
        files = folder_files(path)
    elif file_format(path.name) is not None:
        files = {CARVE_SOURCE: [str(path)]}  # one file is the train split
    else:
        expected = f"expected one of {sorted(FILE_FORMATS)} (or {', '.join(OPENERS)})"
        raise ValueError(f"{path}: unsupported file type; {expected}")
    every_file = [file for paths in files.values() for file in paths]
    folder = path if path.is_dir() else path.parent
    separators = txt_separators(every_file, separator, folder, keep_line_endings)  # one note
    documents = {
        split: functools.partial(read_documents, paths, column, separators, keep_line_endings)
        for split, paths in files.items()
    }
    return Loaded(documents, files, separators)


def _load_saved(path: Path) -> Loaded:
    """The splits of a save_to_disk folder: its Arrow files are the data."""
    saved = datasets.load_from_disk(str(path))
    if isinstance(saved, datasets.Dataset):
        documents = {CARVE_SOURCE: saved}
    else:
        documents = dict(saved)
    files = {split: [f["filename"] for f in ds.cache_files] for split, ds in documents.items()}
    return Loaded(documents, files, {})


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hub accepts a TCP connection within timeout seconds; False when offline mode
    is set."""
    flags = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    set_by_user = [os.environ.get(flag, "").strip().upper() for flag in flags]
    if datasets.config.HF_HUB_OFFLINE or any(v in {"1", "ON", "YES", "TRUE"} for v in set_by_user):
        return False
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    port = url.port or (80 if url.scheme == "http" else 443)
    address = (url.hostname or "huggingface.co", port)
    answered = threading.Event()

    def probe() -> None:
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=timeout).close()
            answered.set()

    threading.Thread(target=probe, daemon=True).start()
    return answered.wait(timeout)  # the wait also bounds the DNS lookup, the socket's does not


def _load_hub(name: str) -> Loaded:
    """All splits of a Hub dataset and their files; unreachable: stop now (datasets would retry
    for half a minute)."""
    offline = datasets.config.HF_HUB_OFFLINE
    error = HubUnreachableError(_hub_unreachable(name, offline))
    if not offline and not hub_reachable():
        raise error
    try:
        documents = dict(datasets.load_dataset(name))
    except OSError as e:  # ConnectionError, FileNotFoundError: offline, and not in the cache either
        if offline:
            raise error from e
        raise
    files = {split: [f["filename"] for f in ds.cache_files] for split, ds in documents.items()}
    return Loaded(documents, files, {})


def _hub_unreachable(name: str, offline: bool) -> str:
    why = "the Hugging Face Hub is unreachable"
    if offline:
        why += " (HF_HUB_OFFLINE=1) and the dataset is not in the local cache"
    else:
        why += "; if the dataset is in your local cache, set HF_HUB_OFFLINE=1 to read it"
    sample = display_path(REPO_ROOT / SAMPLE_DATASET)
    return (
        f"cannot load {name!r}: {why}; no local file or folder named {name!r} exists either. "
        f"Use the bundled sample instead: omit --dataset, or pass --dataset {sample}"
    )


# ---- The texts, in order ----------------------------------------------------------------------
def iter_texts(split: TextSplit) -> Iterator[str]:
    """Every document's text in order (only split.rows when set), a batch at a time, without
    a byte order mark at its start (`cat a.txt b.txt` leaves b's in the middle of the stream),
    and with "\\r\\n" and a lone "\\r" read as "\\n" unless the split keeps line endings."""
    where = _where(split)
    keep_line_endings = split.source.get("line_endings") == "kept"
    rows = split.rows
    first = 0  # the row number of the batch's first row
    for batch in _batches(split.documents, where, [split.column]):
        cells = batch.column(split.column)
        if cells.null_count:
            row = first + cells.is_null().index(True).as_py()
            every = "every document must be a string"
            raise ValueError(f"{where} row {row}: column {split.column!r} is None; {every}")
        if rows is not None:  # only this batch's kept rows, in order
            lo = np.searchsorted(rows, first)
            hi = np.searchsorted(rows, first + len(cells))
            cells = cells.take(pa.array(rows[lo:hi] - first))
        first += batch.num_rows
        for text in cells.to_pylist():
            yield _document(text, keep_line_endings)
    if rows is not None and len(rows) and rows[-1] >= first:
        changed = "fewer than when it was carved; did it change?"
        raise ValueError(f"{where} now holds {first} rows, {changed}")


def skip_empty_documents(texts: Iterable[str], skipped: SkipCount) -> Iterator[str]:
    """texts without the empty ones (no text, or only whitespace), counted in skipped: such a
    document would be its end-of-text token alone, which teaches a model nothing."""
    for text in texts:
        skipped.read_docs += 1
        if _has_text(text):
            yield text
        else:
            skipped.empty_docs += 1


def document_texts(split: TextSplit, skipped: SkipCount) -> Iterator[str]:
    """iter_texts(split) without its empty documents, counted in skipped; a split with none left
    is a ValueError naming it (a carve may draw only empty ones), not an empty token file."""
    yield from skip_empty_documents(iter_texts(split), skipped)
    if skipped.read_docs == skipped.empty_docs:
        where = _where(split)
        if split.rows is not None:
            where += (
                f" (the documents carved as {split.name}: try another --seed or --val-fraction)"
            )
        raise ValueError(f"{where}: {_all_empty(skipped.read_docs)}")


def _has_text(text: str) -> bool:
    return bool(text) and not text.isspace()


def _document(text: str, keep_line_endings: bool = False) -> str:
    """A document's text without a byte order mark at its start, the one place it is not text;
    "\\r\\n" and a lone "\\r" as "\\n" (a JSON, CSV, Parquet or Hub text; a .txt's lines are read
    so already), unless keep_line_endings."""
    text = text.removeprefix(BOM)
    if keep_line_endings:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _where(split: TextSplit) -> str:
    """The dataset and split a TextSplit reads, for an error message."""
    return f"{split.source['dataset']} split {split.source.get('from_split', split.name)}"


def _batches(documents: Any, where: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
    """documents as Arrow tables of up to CHUNK_DOCS rows; an input that cannot be read is a
    ValueError naming where."""
    if callable(documents):  # local files: their reader's errors name the file and line
        yield from documents()
        return
    if columns is not None:
        documents = documents.select_columns(columns)
    try:  # the reader's errors only: a consumer's own are raised in its frame, not here
        yield from documents.with_format("arrow").iter(CHUNK_DOCS)
    except (OSError, ValueError, EOFError, RuntimeError) as e:  # a damaged Arrow file, ...
        raise ValueError(f"cannot read {where}: {e}") from e
