"""Tokenize a text dataset with GPT-2's BPE and write one token file per split, plus a JSON sidecar.

    python python_files/prepare_tokens.py                                   # -> data/tinystories_sample/
    python python_files/prepare_tokens.py --dataset roneneldan/TinyStories  # -> data/tinystories/

Output, per split: <out>/<split>.npy, a real .npy file (np.load and np.load(mmap_mode="r") read it),
or with --format bin a raw headerless <split>.bin (nanoGPT's layout); then <out>/<split>.npy.json
(or <split>.bin.json), the sidecar that describes it. npy_datasets.open_tokens reads both.
With --shard-tokens N a split becomes shards of exactly N tokens each, the last holding the rest:
<split>_000000.npy, <split>_000001.npy, ..., each with its own sidecar; a document may continue from
one shard into the next (as in llm.c's shards). NpyTokensDataset reads them by the glob the
command prints, <out>/<split>_[0-9][0-9][0-9][0-9][0-9][0-9].npy.

Every document is written as [EOT, *tokens]: one end-of-text token (50256 for GPT-2) BEFORE each
document, so the file starts with 50256 and n_docs == number of EOTs. The text is encoded with
encode_ordinary, so a literal "<|endoftext|>" typed inside a story is ordinary text, never 50256.

--dataset (default: the bundled sample materials/tinystories_sample) is either
  * a Hub name such as roneneldan/TinyStories. When huggingface.co cannot be reached (or
    HF_HUB_OFFLINE=1) only the local Hugging Face cache is tried, then a clear error is raised;
  * a folder written by Dataset.save_to_disk / DatasetDict.save_to_disk;
  * a folder of .parquet / .json / .jsonl / .txt / .csv files (optionally .gz compressed), split
    by file name the way `datasets` does it (train.jsonl, validation.jsonl, ...);
  * one such file, which becomes the train split.
In .txt files every line is one document (the `datasets` "text" builder); use .jsonl when a
document spans several lines. Every row is a document, empty ones included.

When the dataset has no validation split, validation is carved from train by a seeded
permutation (--val-fraction, --seed) and train is what remains, whether or not validation was
requested, so two runs can never produce overlapping train and validation files.

Files are written atomically (temp file in the same folder, fsync, rename), the sidecar last.
A split whose sidecar records the same settings fingerprint is skipped ("up to date").
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, Sequence
from urllib.parse import urlsplit

REPO_ROOT = Path(__file__).resolve().parents[1]
_TIKTOKEN_CACHE = REPO_ROOT / "materials" / "tiktoken_cache"
if _TIKTOKEN_CACHE.is_dir():  # committed GPT-2 files: tiktoken.get_encoding("gpt2") then needs no network
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_TIKTOKEN_CACHE))  # setdefault: your own setting wins

import datasets  # noqa: E402
import huggingface_hub.constants  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import tiktoken  # noqa: E402
from datasets.table import ConcatenationTable, MemoryMappedTable  # noqa: E402
from tqdm import tqdm  # noqa: E402

if str(Path(__file__).resolve().parent) not in sys.path:  # npy_datasets.py sits beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from npy_datasets import (  # noqa: E402
    FORMAT_VERSION, TokenFileError, _check_dtype, _sha256, read_sidecar, sidecar_path, token_dtype,
)

__all__ = [
    "TextSplit",
    "PreparedSplit",
    "HubUnreachableError",
    "hub_reachable",
    "load_text_splits",
    "carve_validation",
    "tokenize_documents",
    "npy_header",
    "write_token_file",
    "write_sidecar",
    "clean_stale_temp_files",
    "settings_fingerprint",
    "prepare_split",
    "prepare",
    "main",
]

SAMPLE_DATASET = "materials/tinystories_sample"  # bundled offline sample, relative to the repo root: the default input
DEFAULT_SPLITS = ("train", "validation")  # TinyStories' two splits
VALIDATION_SPLIT = "validation"  # the split carved from CARVE_SOURCE when a dataset has none
CARVE_SOURCE = "train"  # documents for a missing validation split come from here
VAL_FRACTION = 0.005  # share of train documents carved off as validation (at least one)
SEED = 1337  # seeds the carve permutation, so every run carves the same documents
ENCODING = "gpt2"  # tiktoken encoding: GPT-2's 50,257-token BPE
EOT_PLACEMENT = "prepend"  # EOT opens each document: a window starting at one sees a story from its start (llm.c)
CHUNK_DOCS = 1024  # documents per thread-pool task: amortises task overhead, bounds memory to a few chunks
LAYOUTS = ("npy", "bin")  # .npy with a header (np.load works), or raw headerless .bin (nanoGPT)
NPY_HEADER_SIZE = 128  # bytes before the data: a multiple of 64 as numpy wants, with room for any 64-bit length
HUB_PROBE_TIMEOUT_S = 3.0  # seconds to wait for huggingface.co before falling back to the local cache
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text", ".csv": "csv"}  # -> builder
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")  # datasets decompresses these by suffix
CREATED_BY = "prepare_tokens.py"  # recorded in every sidecar
SHARD_DIGITS = 6  # train_000000.npy: names sort in shard order, up to 999,999 shards
_TEMP_NAME = re.compile(r"\.(?P<target>.+)\.tmp\.(?P<pid>\d+)\.[0-9a-f]{8}")  # .train.npy.tmp.<pid>.<random>
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "owner/name" or "name", as the Hub spells them
_SPLIT_NAME = re.compile(r"\w[\w.-]*")  # becomes a file name: no '/', '\\', ':', NUL or leading '.'
_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}  # no space, file-size limit, quota: write() fails


class HubUnreachableError(ConnectionError):
    """A Hub dataset was asked for, the Hub cannot be reached, and the local cache does not have it."""


@dataclass(frozen=True)
class TextSplit:
    """The documents of one output split, and where they came from (the sidecar's "source")."""

    name: str  # split name written, e.g. "validation"
    documents: datasets.Dataset  # one row per document
    column: str  # the column holding the text
    source: dict[str, Any]  # dataset, split, from_split, column, input_fingerprint (+ val_fraction, seed if carved)


@dataclass(frozen=True)
class PreparedSplit:
    """One split's token file (or shards), its sidecar contents, and whether this run wrote it.

    For a sharded split, path is the glob pattern of its shards (NpyTokensDataset takes it as is),
    shards lists them in order and meta holds the totals (n_tokens, n_docs, max_token_id, n_shards).
    """

    split: str
    path: Path
    meta: dict[str, Any]
    written: bool  # False when an up-to-date file was kept
    shards: tuple[Path, ...] = ()  # empty for one file

    def summary(self) -> str:
        """One line for the terminal: split, documents, tokens, dtype, path and what happened."""
        status = "written" if self.written else "up to date"
        if self.shards:
            status = f"{len(self.shards):,} shard{'s' if len(self.shards) != 1 else ''}, {status}"
        return (
            f"{self.split}: {self.meta['n_docs']:,} docs, {self.meta['n_tokens']:,} tokens, "
            f"{self.meta['dtype']} -> {_display_path(self.path)} ({status})"
        )


# ---------------------------------------------------------------------------------------------
# Parameter checks: everything is validated before any slow work starts.


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return int(value)


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # respects taskset and container CPU limits
    except AttributeError:  # macOS and Windows
        return os.cpu_count() or 1


def _check_num_threads(num_threads: int | None) -> int:
    return _usable_cores() if num_threads is None else _check_positive_int("num_threads", num_threads)


def _check_carve(val_fraction: float, seed: int) -> None:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)):
        raise TypeError(f"val_fraction must be a number, got {val_fraction!r}")
    if not (math.isfinite(val_fraction) and 0 < val_fraction < 1):
        raise ValueError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_split_names(splits: Sequence[str] | str) -> tuple[str, ...]:
    names = (splits,) if isinstance(splits, str) else tuple(splits)
    if not names or not all(isinstance(s, str) and s for s in names):
        raise ValueError(f"splits must be one or more non-empty names, got {splits!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"splits must be distinct, got {list(names)}")
    for name in names:
        if not _SPLIT_NAME.fullmatch(name):  # "../x" or "/abs" would write outside the output folder
            raise ValueError(
                f"split name {name!r} cannot be a file name: use letters, digits, '_', '.' and '-', "
                "starting with a letter, digit or '_'"
            )
    return names


def _display_path(path: Path) -> str:
    """path relative to the current folder when it lies inside it, else absolute."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(Path(path).resolve())


# ---------------------------------------------------------------------------------------------
# Loading: Hub names and local files become one datasets.Dataset per output split.


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """Whether the Hub accepts a TCP connection within timeout seconds; False when offline mode is set."""
    if _env_flag("HF_HUB_OFFLINE") or _env_flag("HF_DATASETS_OFFLINE") or datasets.config.HF_HUB_OFFLINE:
        return False
    url = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    address = (url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443))
    answered = threading.Event()

    def probe() -> None:
        with contextlib.suppress(OSError):
            socket.create_connection(address, timeout=timeout).close()
            answered.set()

    threading.Thread(target=probe, daemon=True).start()
    return answered.wait(timeout)  # the wait also bounds the DNS lookup, which the socket timeout does not


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    """Make datasets and huggingface_hub use only the local cache, as HF_HUB_OFFLINE=1 at start-up would."""
    flags = [(datasets.config, "HF_HUB_OFFLINE"), (datasets.config, "HF_DATASETS_OFFLINE"),
             (huggingface_hub.constants, "HF_HUB_OFFLINE")]  # read by the libraries at call time
    saved = [getattr(module, name) for module, name in flags]
    for module, name in flags:
        setattr(module, name, True)
    try:
        yield
    finally:
        for (module, name), value in zip(flags, saved):
            setattr(module, name, value)


def _builder_for(name: str) -> str | None:
    """The datasets builder for a data file name (compression suffixes ignored), or None."""
    path = Path(name)
    if path.suffix in COMPRESSIONS:
        path = path.with_suffix("")
    return FILE_BUILDERS.get(path.suffix.lower())


def _resolve_dataset(dataset: str | os.PathLike | None) -> tuple[str, Path | None]:
    """(name recorded in the sidecar, local path) for a local dataset, (name, None) for a Hub name."""
    if dataset is None:
        return SAMPLE_DATASET, REPO_ROOT / SAMPLE_DATASET
    name = os.fspath(dataset)
    path = Path(name).expanduser()
    if path.exists():
        return name, path
    if isinstance(dataset, os.PathLike) or not _HUB_NAME.fullmatch(name) or _builder_for(name):
        raise FileNotFoundError(f"dataset {name!r}: no such file or folder (a Hub name looks like 'owner/name')")
    return name, None


def _sample_hint() -> str:
    sample = _display_path(REPO_ROOT / SAMPLE_DATASET)
    return f"Use the bundled sample instead: omit --dataset, or pass --dataset {sample}"


def _load_hub(name: str) -> tuple[dict[str, datasets.Dataset], dict[str, str]]:
    """All splits of a Hub dataset, from the cache alone when the Hub is unreachable."""
    if hub_reachable():
        loaded = datasets.load_dataset(name)
    else:
        try:
            with _hub_offline():
                loaded = datasets.load_dataset(name)
        except OSError as e:  # ConnectionError / FileNotFoundError: not in the local cache either
            raise HubUnreachableError(
                f"cannot load {name!r}: the Hugging Face Hub is unreachable (no network, or "
                f"HF_HUB_OFFLINE=1) and the dataset is not in the local cache; no local file or "
                f"folder named {name!r} exists either. {_sample_hint()}"
            ) from e
    return dict(loaded), {split: f"datasets:{ds._fingerprint}" for split, ds in loaded.items()}


def _sha256_files(paths: Iterable[str]) -> str:
    """sha256 over the files' own sha256 values, in order: identical bytes give identical ids."""
    return hashlib.sha256(" ".join(_sha256(Path(path)) for path in paths).encode()).hexdigest()


def _load_local(path: Path) -> tuple[dict[str, datasets.Dataset], dict[str, str]]:
    """All splits of a local dataset, and an identity per split that changes when its input does."""
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        loaded = datasets.load_from_disk(str(path))  # a save_to_disk folder
        if isinstance(loaded, datasets.Dataset):
            loaded = {CARVE_SOURCE: loaded}
        return dict(loaded), {split: f"datasets:{ds._fingerprint}" for split, ds in loaded.items()}
    if path.is_file():
        builder_name = _builder_for(path.name)
        if builder_name is None:
            raise ValueError(f"{path}: unsupported file type; expected one of {sorted(FILE_BUILDERS)} (optionally .gz)")
        builder = datasets.load_dataset_builder(builder_name, data_files={CARVE_SOURCE: str(path)})
    else:
        builder = datasets.load_dataset_builder(str(path))  # datasets finds the files and their splits
    files = {str(split): list(paths) for split, paths in builder.config.data_files.items()}
    with ThreadPoolExecutor(1, thread_name_prefix="sha256") as pool:  # hash the input files while datasets converts them
        identities = pool.submit(lambda: {split: f"sha256:{_sha256_files(paths)}" for split, paths in files.items()})
        builder.download_and_prepare()
    return dict(builder.as_dataset()), identities.result()


def _check_text_column(documents: datasets.Dataset, column: str, where: str) -> None:
    """Refuse a missing or non-text column, an empty split, or a None cell, naming the place."""
    if column not in documents.column_names:
        raise ValueError(f"column {column!r} not found in {where}; available: {documents.column_names}")
    feature = documents.features[column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise ValueError(f"column {column!r} in {where} holds {feature}, not text")
    if len(documents) == 0:
        raise ValueError(f"{where} has no documents")
    cells = documents.data.column(column)
    if cells.null_count:
        row = pc.index(pc.is_null(cells), True).as_py()
        raise ValueError(f"{where} row {row}: column {column!r} is None; every document must be a string")


def carve_validation(
    train: datasets.Dataset, val_fraction: float = VAL_FRACTION, seed: int = SEED
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Split train's documents into (rest, validation) by a seeded permutation; each keeps its order."""
    _check_carve(val_fraction, seed)
    n = len(train)
    n_val = max(1, round(n * val_fraction))
    if n_val >= n:
        raise ValueError(f"cannot carve validation from {n} train document(s): both splits need at least one")
    order = np.random.default_rng(seed).permutation(n)
    return train.select(np.sort(order[n_val:])), train.select(np.sort(order[:n_val]))


def load_text_splits(
    dataset: str | os.PathLike | None = None,
    column: str = "text",
    splits: Sequence[str] = DEFAULT_SPLITS,
    val_fraction: float = VAL_FRACTION,
    seed: int = SEED,
) -> dict[str, TextSplit]:
    """Load the requested splits of a Hub or local dataset (None: the bundled sample), carving validation if missing."""
    _check_carve(val_fraction, seed)
    names = _check_split_names(splits)
    name, path = _resolve_dataset(dataset)
    loaded, identities = _load_hub(name) if path is None else _load_local(path)
    carve = VALIDATION_SPLIT not in loaded and CARVE_SOURCE in loaded
    from_split = {s: CARVE_SOURCE if carve and s in (CARVE_SOURCE, VALIDATION_SPLIT) else s for s in names}
    for source in dict.fromkeys(from_split.values()):
        if source not in loaded:
            raise ValueError(f"split {source!r} not found in {name}; available: {sorted(loaded)}")
        _check_text_column(loaded[source], column, f"{name} split {source}")
    if carve:
        loaded[CARVE_SOURCE], loaded[VALIDATION_SPLIT] = carve_validation(loaded[CARVE_SOURCE], val_fraction, seed)
    result = {}
    for s in names:
        source = {"dataset": name, "split": s, "from_split": from_split[s], "column": column,
                  "input_fingerprint": identities[from_split[s]]}  # fmt: skip
        if carve and from_split[s] == CARVE_SOURCE:
            source.update(val_fraction=float(val_fraction), seed=int(seed))
        result[s] = TextSplit(s, loaded[s], column, source)
    return result


def _arrow_files(documents: datasets.Dataset) -> list[tuple[str, int]] | None:
    """(path, rows) of the Arrow files that hold documents' table unchanged, in order; None if it is anything else.

    None for a table in memory, one with columns joined side by side, and one with a recorded change
    other than its schema metadata (a slice, a rename, a cast): their rows are not the files' rows.
    """
    table = documents.data
    blocks = table.blocks if isinstance(table, ConcatenationTable) else [[table]]
    files = []
    for row in blocks:
        if len(row) != 1 or not isinstance(row[0], MemoryMappedTable):
            return None
        if any(replay[0] != "replace_schema_metadata" for replay in row[0].replays):
            return None
        files.append((row[0].path, row[0].num_rows))
    return files


def _iter_texts(documents: datasets.Dataset, column: str, batch_size: int = CHUNK_DOCS) -> Iterator[str]:
    """Every document's text, in order, read so that memory does not grow with the corpus.

    Iterating a Dataset reads its Arrow files through a memory map, and every page read stays
    resident: the process grows by the size of the corpus. When documents is its files as written
    (or a sorted selection of their rows, as carve_validation makes), the files are read as a stream
    instead, one record batch at a time. Anything else (in memory, sliced, shuffled) goes through the Dataset.
    """
    files = _arrow_files(documents)
    indices = getattr(documents, "_indices", None)  # the rows a select() kept, None for all of them
    rows = None if files is None or indices is None else indices.column(0).to_numpy()
    if files is None or (rows is not None and np.any(rows[1:] <= rows[:-1])):
        for batch in documents.select_columns([column]).iter(batch_size=batch_size):
            yield from batch[column]
        return
    first = 0  # index of the next record batch's first row, counted over all files
    for path, n_rows in files:
        begin = first
        with pa.OSFile(path) as f:  # read(), not a memory map: a batch's memory is freed once its texts are out
            for batch in pa.ipc.open_stream(f):
                texts = batch.column(column)
                if rows is not None:  # only this batch's selected rows, in order
                    lo, hi = np.searchsorted(rows, [first, first + batch.num_rows])
                    texts = texts.take(pa.array(rows[lo:hi] - first))
                first += batch.num_rows
                yield from texts.to_pylist()
        if first - begin != n_rows:
            raise RuntimeError(f"{path} holds {first - begin} rows, the dataset {n_rows}; did the file change?")
    if rows is not None and len(rows) and rows[-1] >= first:
        raise RuntimeError(f"row {rows[-1]} was selected, but the dataset's files hold {first} rows")


# ---------------------------------------------------------------------------------------------
# Tokenizing: chunks of documents on a thread pool, results always in input order.


def _encode_ordinary_array(enc: tiktoken.Encoding, text: str) -> np.ndarray:
    """encode_ordinary's ids as a uint32 array, made in Rust without a Python list of ints."""
    try:
        return enc.encode_to_numpy(text, disallowed_special=())  # nothing allowed, nothing refused: = encode_ordinary
    except UnicodeEncodeError:  # a lone surrogate: encode_ordinary replaces it with U+FFFD (tiktoken's own fix)
        return np.array(enc.encode_ordinary(text), dtype=np.uint32)


def _encode_chunk(enc: tiktoken.Encoding, texts: list[str]) -> np.ndarray:
    """[EOT, *ids] for each text, concatenated into one uint32 array; no special token is ever emitted."""
    eot = np.array([enc.eot_token], dtype=np.uint32)
    parts = []
    for text in texts:
        parts += (eot, _encode_ordinary_array(enc, text))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)


def _tokenize_in_order(
    texts: Iterator[str], enc: tiktoken.Encoding, num_threads: int, chunk_docs: int
) -> Iterator[np.ndarray]:
    pool = ThreadPoolExecutor(num_threads, thread_name_prefix="tokenize")
    pending: deque[Future[np.ndarray]] = deque()  # oldest first: yielding from the left keeps input order
    try:
        while batch := list(islice(texts, chunk_docs)):
            pending.append(pool.submit(_encode_chunk, enc, batch))
            if len(pending) > 2 * num_threads:  # enough queued to keep every thread busy: wait for the oldest
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def tokenize_documents(
    texts: Iterable[str], enc: tiktoken.Encoding, *, num_threads: int | None = None, chunk_docs: int = CHUNK_DOCS
) -> Iterator[np.ndarray]:
    """Yield one uint32 id array per chunk of chunk_docs documents, in input order; each document is [EOT, *ids]."""
    num_threads = _check_num_threads(num_threads)  # checked now, not at the first next()
    chunk_docs = _check_positive_int("chunk_docs", chunk_docs)
    return _tokenize_in_order(iter(texts), enc, num_threads, chunk_docs)


# ---------------------------------------------------------------------------------------------
# Writing: stream to a temp file, fsync, rename; the sidecar last.


def npy_header(dtype: Any, n_tokens: int) -> bytes:
    """A .npy format 1.0 header for a 1-D array of n_tokens, always NPY_HEADER_SIZE bytes long."""
    descr = _check_dtype(dtype, "token dtype").str  # e.g. '<u2'
    fields = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': ({int(n_tokens)},), }}"
    text_len = NPY_HEADER_SIZE - 10  # after magic (6 bytes), version (2) and the length field (2)
    if len(fields) >= text_len:
        raise ValueError(f"n_tokens {n_tokens} is too large for a {NPY_HEADER_SIZE}-byte header")
    text = fields.ljust(text_len - 1) + "\n"  # numpy accepts spaces before the final newline
    return b"\x93NUMPY\x01\x00" + text_len.to_bytes(2, "little") + text.encode("latin1")


def _as_token_array(chunk: Any, dtype: np.dtype) -> np.ndarray:
    """chunk cast to dtype, after checking every id fits: a plain astype would wrap 70000 to 4464."""
    ids = np.asarray(chunk)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise TypeError(f"a chunk must be a 1-D array of integer ids, got {ids.dtype} with shape {ids.shape}")
    if ids.size:
        top = np.iinfo(dtype).max
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi > top:
            bad = lo if lo < 0 else hi
            wider = "; uint32 holds ids up to 4,294,967,295" if dtype.itemsize < 4 else ""
            raise ValueError(f"token id {bad} does not fit {dtype.name} (valid ids: 0 to {top:,}){wider}")
    return ids.astype(dtype, copy=False)


def _fsync_dir(folder: Path) -> None:
    """Make renames and deletions in folder durable (POSIX only: Windows cannot fsync a folder)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(path: Path) -> Path:
    """.<name>.tmp.<pid>.<random> beside path: the form clean_stale_temp_files recognises."""
    return path.with_name(f".{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")


def _create_temp(path: Path) -> tuple[int, Path]:
    """Open a new, empty temp file beside path; O_EXCL never reuses an existing file."""
    while True:
        tmp = _temp_name(path)
        try:
            return os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), tmp
        except FileExistsError:
            continue


def _create_temp_dir(path: Path) -> Path:
    """Make a new, empty folder beside path, named like the temp files, so killed runs' leftovers are cleaned."""
    while True:
        tmp = _temp_name(path)
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def _atomic_output(path: Path, *, drop_first: Path | None = None) -> Iterator[BinaryIO]:
    """Yield a temp file beside path; on success fsync it and rename it over path, on any error delete it.

    drop_first (the old sidecar) is deleted just before the rename, so a crash between the two
    leaves a token file without a sidecar (incomplete), never a new file with a stale sidecar.
    """
    fd, tmp = _create_temp(path)
    renamed = False
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if drop_first is not None and drop_first.exists():
            drop_first.unlink(missing_ok=True)  # missing_ok: a concurrent run may have just deleted it
            _fsync_dir(path.parent)
        os.replace(tmp, path)
        renamed = True
        _fsync_dir(path.parent)
    except OSError as e:
        if e.filename is None and e.errno in _DISK_FULL:  # write() names no file: name the one being written
            raise OSError(e.errno, f"{e.strerror} while writing", str(path)) from e
        raise
    finally:
        if not renamed:
            tmp.unlink(missing_ok=True)


def _sha256_of(f: BinaryIO) -> str:
    f.seek(0)
    h = hashlib.sha256()
    while block := f.read(1 << 20):
        h.update(block)
    return h.hexdigest()


def write_token_file(
    chunks: Iterable[Any], path: str | os.PathLike, dtype: Any = np.uint16, layout: str = "npy"
) -> dict[str, Any]:
    """Stream id chunks into path atomically (its old sidecar is deleted); return counts, size and sha256."""
    path = Path(path)
    dtype = _check_dtype(dtype, "token dtype")
    _check_layout(layout)
    if path.suffix != f".{layout}":
        raise ValueError(f"a {layout} token file must end in .{layout}, got {path.name!r}")
    n_tokens, max_token_id = 0, -1
    with _atomic_output(path, drop_first=sidecar_path(path)) as f:
        if layout == "npy":
            f.write(npy_header(dtype, 0))  # placeholder: same length as the real header written below
        for chunk in chunks:
            ids = _as_token_array(chunk, dtype)
            if ids.size:
                f.write(ids.tobytes())
                n_tokens += ids.size
                max_token_id = max(max_token_id, int(ids.max()))
        if n_tokens == 0:
            raise ValueError(f"no tokens to write to {path}")
        if layout == "npy":
            f.seek(0)
            f.write(npy_header(dtype, n_tokens))  # the true length, over the placeholder
        f.flush()
        file_size = os.fstat(f.fileno()).st_size
        sha256 = _sha256_of(f)  # one read of the finished file, in 1 MiB blocks
    return {"n_tokens": n_tokens, "max_token_id": max_token_id, "file_size": file_size, "sha256": sha256}


def write_sidecar(token_path: str | os.PathLike, meta: dict[str, Any]) -> Path:
    """Write meta as token_path's JSON sidecar (sorted keys, indent 2), atomically; call it after the token file."""
    side = sidecar_path(token_path)
    with _atomic_output(side) as f:
        f.write((json.dumps(meta, sort_keys=True, indent=2) + "\n").encode("utf-8"))
    return side


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill would terminate it; Windows refuses to delete an open file anyway
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def clean_stale_temp_files(out_dir: str | os.PathLike) -> list[Path]:
    """Delete temp files (and shard staging folders) that killed runs left in out_dir, not those of a
    run still alive; return them."""
    removed = []
    folder = Path(out_dir)
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        match = _TEMP_NAME.fullmatch(entry.name)
        if match is None or entry.is_symlink() or not (entry.is_file() or entry.is_dir()):
            continue
        pid = int(match["pid"])
        if pid != os.getpid() and _pid_alive(pid):
            continue  # another run is writing it right now
        with contextlib.suppress(OSError):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
    return removed


# ---------------------------------------------------------------------------------------------
# Putting it together.


def settings_fingerprint(settings: dict[str, Any]) -> str:
    """sha256 hex of settings as canonical JSON: equal fingerprints mean byte-identical token files."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _up_to_date(path: Path, fingerprint: str) -> dict[str, Any] | None:
    """The sidecar of path if it records fingerprint and the file still has its recorded size."""
    try:
        meta = read_sidecar(path)
    except TokenFileError:
        return None  # unreadable sidecar: rebuild
    if meta is None or meta.get("settings_fingerprint") != fingerprint or not path.is_file():
        return None
    return meta if path.stat().st_size == meta["file_size"] else None


def shard_path(out: str | os.PathLike, split: str, index: int, layout: str = "npy") -> Path:
    """<out>/<split>_<index, 6 digits>.<layout>: shard names sort in shard order."""
    if not 0 <= index < 10**SHARD_DIGITS:
        raise ValueError(f"shard index {index} needs more than {SHARD_DIGITS} digits; choose a larger shard_tokens")
    return Path(out) / f"{split}_{index:0{SHARD_DIGITS}d}.{layout}"


def _existing_shards(out: Path, split: str, layout: str) -> dict[int, Path]:
    """The shard files of split in out, by index (only exact <split>_dddddd.<layout> names)."""
    name = re.compile(rf"{re.escape(split)}_(\d{{{SHARD_DIGITS}}})\.{layout}")
    found = {}
    if out.is_dir():
        for entry in out.iterdir():
            if (match := name.fullmatch(entry.name)) is not None:
                found[int(match[1])] = entry
    return found


def _shard_streams(chunks: Iterable[np.ndarray], shard_tokens: int) -> Iterator[Iterator[np.ndarray]]:
    """Cut a stream of id chunks into shards: one iterator per shard, exactly shard_tokens ids each
    but the last, which holds the rest (never empty). Consume each shard before asking for the next."""
    chunks = iter(chunks)
    carry: list[np.ndarray] = []  # at most one array: ids read but not yet handed out

    def pending() -> bool:
        while not carry:
            chunk = next(chunks, None)
            if chunk is None:
                return False
            if len(chunk):
                carry.append(chunk)
        return True

    def shard() -> Iterator[np.ndarray]:
        need = shard_tokens
        while need and pending():
            chunk = carry.pop()
            if len(chunk) > need:
                chunk, rest = chunk[:need], chunk[need:]
                carry.append(rest)
            need -= len(chunk)
            yield chunk

    while pending():
        yield shard()


def _with_progress(
    chunks: Iterable[np.ndarray], bar: tqdm, eot_id: int, docs: list[int] | None = None
) -> Iterator[np.ndarray]:
    """Pass chunks through, advancing bar by the documents starting in them (one EOT each), and
    adding them to docs[0] when docs is given."""
    for chunk in chunks:
        starts = int(np.count_nonzero(chunk == eot_id))
        bar.update(starts)
        if docs is not None:
            docs[0] += starts
        yield chunk


def _sidecar_meta(
    path: Path, stats: dict[str, Any], n_docs: int, source: dict[str, Any], enc: tiktoken.Encoding,
    settings: dict[str, Any], fingerprint: str,
) -> dict[str, Any]:  # fmt: skip
    """The sidecar of a token file write_token_file wrote (stats) with these settings."""
    return {
        "format": "npy-tokens", "format_version": FORMAT_VERSION, "file": path.name, "layout": settings["layout"],
        "dtype": settings["dtype"], "shape": [stats["n_tokens"]], "n_tokens": stats["n_tokens"],
        "file_size": stats["file_size"], "sha256": stats["sha256"], "tokenizer": settings["tokenizer"],
        "n_vocab": enc.n_vocab, "eot_id": enc.eot_token, "eot_placement": EOT_PLACEMENT,
        "max_token_id": stats["max_token_id"], "n_docs": n_docs, "source": source,
        "settings_fingerprint": fingerprint, "created_by": CREATED_BY,
    }  # fmt: skip


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
) -> PreparedSplit:
    """Tokenize one split into <out>/<split>.<layout> and its sidecar, unless an up-to-date copy exists.

    With shard_tokens, into <out>/<split>_000000.<layout>, ... of shard_tokens ids each (the last: the
    rest), each with its sidecar; shards a previous run left beyond the new last one are deleted.
    """
    _check_layout(layout)
    _check_split_names(split.name)
    num_threads = _check_num_threads(num_threads)
    chunk_docs = _check_positive_int("chunk_docs", chunk_docs)
    if shard_tokens is not None:
        shard_tokens = _check_positive_int("shard_tokens", shard_tokens)
    dtype = token_dtype(enc.n_vocab)
    path = Path(out) / f"{split.name}.{layout}"
    tokenizer = f"tiktoken:{enc.name}"
    settings = {  # everything that decides the bytes; not the dataset's spelling, threads or chunk size
        **{key: value for key, value in split.source.items() if key != "dataset"},
        "tokenizer": tokenizer, "n_vocab": enc.n_vocab, "eot_id": enc.eot_token, "eot_placement": EOT_PLACEMENT,
        "dtype": dtype.name, "layout": layout, "format_version": FORMAT_VERSION,
    }  # fmt: skip
    if shard_tokens is not None:
        settings["shard_tokens"] = shard_tokens  # only when sharded: one-file fingerprints stay as they were
        return _prepare_shards(split, Path(out), enc, settings, layout, num_threads, chunk_docs, force, progress)
    fingerprint = settings_fingerprint(settings)
    if not force and (meta := _up_to_date(path, fingerprint)) is not None:
        return PreparedSplit(split.name, path, meta, written=False)

    path.parent.mkdir(parents=True, exist_ok=True)
    texts = _iter_texts(split.documents, split.column, chunk_docs)
    chunks = tokenize_documents(texts, enc, num_threads=num_threads, chunk_docs=chunk_docs)
    bar = tqdm(total=len(split.documents), desc=split.name, unit="doc", file=sys.stderr, disable=not progress)
    with bar, contextlib.closing(chunks):  # closing: stop the worker threads if writing fails
        stats = write_token_file(_with_progress(chunks, bar, enc.eot_token), path, dtype, layout)
    meta = _sidecar_meta(path, stats, len(split.documents), split.source, enc, settings, fingerprint)
    write_sidecar(path, meta)
    return PreparedSplit(split.name, path, meta, written=True)


def _shard_totals(metas: list[dict[str, Any]]) -> dict[str, Any]:
    """One meta for a sharded split: the shards' common fields, with n_tokens, n_docs and max_token_id over all."""
    per_file = ("file", "file_size", "sha256", "shape", "shard")
    return {
        **{key: value for key, value in metas[0].items() if key not in per_file},
        "n_tokens": sum(m["n_tokens"] for m in metas), "n_docs": sum(m["n_docs"] for m in metas),
        "max_token_id": max(m["max_token_id"] for m in metas), "n_shards": len(metas),
    }  # fmt: skip


def _shards_up_to_date(out: Path, name: str, layout: str, fingerprint: str) -> list[dict[str, Any]] | None:
    """The sidecars of split name's shards if all of them, and no others, are up to date with fingerprint."""
    found = _existing_shards(out, name, layout)
    metas = [_up_to_date(found[i], fingerprint) if i in found else None for i in range(len(found))]
    counts = [m["shard"].get("count") if m is not None and isinstance(m.get("shard"), dict) else None for m in metas]
    if not metas or any(count != len(found) for count in counts):
        return None
    return metas  # type: ignore[return-value]


def _check_no_foreign_shard_names(out: Path, name: str, layout: str) -> None:
    """Refuse to shard split name over files that have shard names but are not its shards (another
    split called e.g. train_000001 has written train_000001.npy): they would be replaced or deleted."""
    for path in _existing_shards(out, name, layout).values():
        try:
            meta = read_sidecar(path)
        except TokenFileError:
            meta = None  # unreadable: an unfinished shard at worst, rebuilt like one
        if meta is not None and not (isinstance(meta.get("shard"), dict) and
                                     isinstance(meta.get("source"), dict) and meta["source"].get("split") == name):  # fmt: skip
            raise ValueError(
                f"{str(path)!r} is not a shard of split {name!r} (its sidecar says otherwise), but has a shard's "
                f"name; sharding {name!r} would replace or delete it. Move it, or choose another --out"
            )


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while a few renames must not be cut in half, then deliver them.

    Only the main thread can change signal handlers; elsewhere signals never interrupt this thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])  # now, to the handler that was in place


def _prepare_shards(
    split: TextSplit, out: Path, enc: tiktoken.Encoding, settings: dict[str, Any], layout: str,
    num_threads: int, chunk_docs: int, force: bool, progress: bool,
) -> PreparedSplit:  # fmt: skip
    """prepare_split's sharded path: the shards written into a staging folder beside them, then swapped
    in (the old shards' sidecars deleted first), then every sidecar (each records the count).

    Until the swap, which takes a few renames, the previous shards stay whole and finished: a run
    that fails or is killed while tokenizing never leaves a glob that mixes two runs."""
    shard_tokens, dtype = settings["shard_tokens"], np.dtype(settings["dtype"])
    fingerprint = settings_fingerprint(settings)
    pattern = out / f"{split.name}_{'[0-9]' * SHARD_DIGITS}.{layout}"  # a glob NpyTokensDataset takes
    if not force and (metas := _shards_up_to_date(out, split.name, layout, fingerprint)) is not None:
        paths = tuple(out / m["file"] for m in metas)
        return PreparedSplit(split.name, pattern, _shard_totals(metas), written=False, shards=paths)

    _check_no_foreign_shard_names(out, split.name, layout)
    out.mkdir(parents=True, exist_ok=True)
    staging = _create_temp_dir(out / f"{split.name}_shards")  # .train_shards.tmp.<pid>.<random>/
    written = []  # (final path, stats, documents starting in the shard)
    try:
        texts = _iter_texts(split.documents, split.column, chunk_docs)
        chunks = tokenize_documents(texts, enc, num_threads=num_threads, chunk_docs=chunk_docs)
        bar = tqdm(total=len(split.documents), desc=split.name, unit="doc", file=sys.stderr, disable=not progress)
        with bar, contextlib.closing(chunks):
            for index, shard in enumerate(_shard_streams(chunks, shard_tokens)):
                path, docs = shard_path(out, split.name, index, layout), [0]  # docs: documents starting in it
                stats = write_token_file(_with_progress(shard, bar, enc.eot_token, docs), staging / path.name, dtype, layout)
                written.append((path, stats, docs[0]))
        with _signals_deferred():  # the swap and the sidecars: a Ctrl-C now waits until they are done
            metas = _swap_in_shards(out, split, staging, written, enc, settings, layout, fingerprint)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PreparedSplit(split.name, pattern, _shard_totals(metas), written=True, shards=tuple(p for p, _, _ in written))


def _swap_in_shards(
    out: Path, split: TextSplit, staging: Path, written: list[tuple[Path, dict[str, Any], int]],
    enc: tiktoken.Encoding, settings: dict[str, Any], layout: str, fingerprint: str,
) -> list[dict[str, Any]]:  # fmt: skip
    """Replace split's shards in out by the staged ones, then write their sidecars; return those."""
    old = _existing_shards(out, split.name, layout)
    for stale in old.values():  # from here until the new sidecars exist, no shard of this split looks finished
        sidecar_path(stale).unlink(missing_ok=True)
    for index, stale in old.items():
        if index >= len(written):  # left by an earlier run with smaller shards or more text
            stale.unlink(missing_ok=True)
    _fsync_dir(out)
    for path, _, _ in written:
        os.replace(staging / path.name, path)
    _fsync_dir(out)
    metas, first_token = [], 0
    for index, (path, stats, n_docs) in enumerate(written):
        meta = _sidecar_meta(path, stats, n_docs, split.source, enc, settings, fingerprint)
        meta["shard"] = {"index": index, "count": len(written), "shard_tokens": settings["shard_tokens"],
                         "first_token": first_token}  # fmt: skip
        write_sidecar(path, meta)
        metas.append(meta)
        first_token += stats["n_tokens"]
    return metas


def _default_out_dir(name: str, path: Path | None) -> Path:
    """data/<short dataset name> under the repo root: data/tinystories_sample, data/tinystories, ..."""
    stem = path.resolve().name if path is not None else name.rstrip("/").split("/")[-1]
    while Path(stem).suffix in (*FILE_BUILDERS, *COMPRESSIONS):
        stem = Path(stem).stem
    return REPO_ROOT / "data" / (re.sub(r"[^a-z0-9._-]+", "_", stem.lower()).strip("._") or "dataset")


def _check_out_dir(out: Path, input_path: Path | None) -> None:
    """Refuse an output folder that is a file, lies inside the input, or cannot be created or written."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"output folder {str(out)!r} is an existing file")
    if input_path is not None:
        src, dst = input_path.resolve(), out.resolve()
        if dst == src or src in dst.parents:
            raise ValueError(
                f"output folder {str(out)!r} is inside the input dataset {str(input_path)!r}; choose another --out"
            )
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"cannot create output folder {str(out)!r}: {str(existing)!r} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write to output folder {str(out)!r}: {str(existing)!r} is not writable")


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
) -> list[PreparedSplit]:
    """Tokenize every requested split of dataset (None: the bundled sample) into out (None: data/<name>).

    shard_tokens: write each split as shards of that many tokens (see prepare_split); None: one file.
    """
    num_threads = _check_num_threads(num_threads)
    _check_positive_int("chunk_docs", chunk_docs)
    if shard_tokens is not None:
        _check_positive_int("shard_tokens", shard_tokens)
    _check_carve(val_fraction, seed)
    _check_layout(layout)
    names = _check_split_names(splits)
    name, path = _resolve_dataset(dataset)
    out = Path(out) if out is not None else _default_out_dir(name, path)
    _check_out_dir(out, path)
    enc = tiktoken.get_encoding(encoding)
    bars_were_on = datasets.is_progress_bar_enabled()
    if not progress:  # also silence datasets' own "Generating split" bars
        datasets.disable_progress_bars()
    try:
        text_splits = load_text_splits(dataset, column, names, val_fraction, seed)
    finally:
        if bars_were_on:
            datasets.enable_progress_bars()
    out.mkdir(parents=True, exist_ok=True)
    clean_stale_temp_files(out)
    return [
        prepare_split(text_splits[s], out, enc, layout=layout, num_threads=num_threads,
                      chunk_docs=chunk_docs, force=force, progress=progress, shard_tokens=shard_tokens)
        for s in names
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Command line.


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _open_fraction(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and 0 < value < 1):
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prepare_tokens.py",
        description="Tokenize a text dataset with tiktoken and write one token file (or shards) + JSON sidecar per split.",
    )
    p.add_argument("--dataset", default=None,
                   help=f"Hub name (roneneldan/TinyStories) or local folder/file; default: {SAMPLE_DATASET}")
    p.add_argument("--out", default=None, help="output folder; default: data/<dataset name> under the repo root")
    p.add_argument("--column", default="text", help="column holding the text (default: text)")
    p.add_argument("--splits", nargs="+", default=list(DEFAULT_SPLITS),
                   help="splits to write (default: train validation)")
    p.add_argument("--val-fraction", type=_open_fraction, default=VAL_FRACTION,
                   help=f"share of train carved off as validation when the dataset has none (default: {VAL_FRACTION})")
    p.add_argument("--seed", type=int, default=SEED, help=f"seed of that carve (default: {SEED})")
    p.add_argument("--encoding", default=ENCODING, help=f"tiktoken encoding (default: {ENCODING})")
    p.add_argument("--format", dest="layout", choices=LAYOUTS, default="npy",
                   help="npy: .npy with header (default); bin: raw headerless .bin like nanoGPT")
    p.add_argument("--num-threads", type=_positive_int, default=None,
                   help=f"tokenizer threads (default: usable cores, here {_usable_cores()})")
    p.add_argument("--chunk-docs", type=_positive_int, default=CHUNK_DOCS,
                   help=f"documents per thread task (default: {CHUNK_DOCS})")
    p.add_argument("--shard-tokens", type=_positive_int, default=None, metavar="N",
                   help="write each split as shards of N tokens (<split>_000000.npy, ...; the last holds the rest); "
                        "default: one file per split")
    p.add_argument("--force", action="store_true", help="rebuild even when the outputs are up to date")
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: prepare every split and print one summary line per split."""
    args = _parser().parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():  # `kill` then unwinds like Ctrl-C: temp files removed
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        results = prepare(
            args.dataset, args.out, column=args.column, splits=args.splits, val_fraction=args.val_fraction,
            seed=args.seed, encoding=args.encoding, layout=args.layout, num_threads=args.num_threads,
            chunk_docs=args.chunk_docs, force=args.force, shard_tokens=args.shard_tokens,
        )  # fmt: skip
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
