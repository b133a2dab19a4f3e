"""Writing and publishing: token files streamed to a temp file and renamed into place, shards
staged in a folder and swapped in together, and each file's sidecar written last.

A run that writes into a folder holds the folder's lock (output_lock): runs that share the folder,
in any container, wait for each other, and a temp file found under the lock is a dead run's.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from npy_datasets import (  # beside this file; importing it imports numpy only, never torch
    LLMC_DTYPES,
    LLMC_HEADER_BYTES,
    LLMC_VERSIONS,
    TokenFileError,
    atomic_write,
    check_token_dtype,
    fsync_folder,
    probe_sha256,
    read_sidecar,
    sidecar_for,
    sidecar_path,
    write_sidecar,
)
from prep_settings import check_prep_arguments

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there neither wait for each other nor clean up
    fcntl = None


NPY_HEADER_SIZE = 128  # bytes before the data: a multiple of 64, room for any 64-bit length
SUFFIXES = {"npy": ".npy", "bin": ".bin", "llmc": ".bin"}  # an llm.c shard's header tells it apart
SHARD_DIGITS = 6  # train_000000.npy: names sort in shard order, up to 999,999 shards
CREATED_BY = "prepare_tokens.py"  # recorded in every sidecar
LOCK_NAME = ".prepare_tokens.lock"  # held while a run writes into its folder (output_lock)
TEMP_NAME = re.compile(r"\..+\.tmp\.\d+\.[0-9a-f]{8}")  # atomic_write's and the staging folders'
PER_FILE = ("file", "file_size", "sha256", "probe_sha256", "shape", "shard")  # not in totals


# ---- One token file: a header, then the ids, streamed --------------------------------------
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
    """llm.c's shard header: 256 int32 words, magic and version (which give the dtype), token
    count, then zeros."""
    dtype = check_token_dtype(dtype, "token dtype")
    magic = next(m for m, d in LLMC_DTYPES.items() if d == dtype)
    version = LLMC_VERSIONS[magic]
    if n_tokens >= 2**31:  # the count is an int32
        most = f"an llm.c shard holds at most {2**31 - 1:,} tokens, got {n_tokens:,}"
        raise ValueError(f"{most}; pass a smaller shard_tokens")
    words = np.array([magic, version, n_tokens], dtype="<i4")
    return words.tobytes().ljust(LLMC_HEADER_BYTES, b"\0")


def _no_header(dtype: Any, n_tokens: int) -> bytes:
    return b""  # nanoGPT's .bin: raw ids


HEADERS = {"npy": npy_header, "bin": _no_header, "llmc": _llmc_header}


def _as_token_array(chunk: Any, dtype: np.dtype) -> np.ndarray:
    """chunk cast to dtype, once every id is known to fit: astype alone wraps 70000 to 4464."""
    ids = np.asarray(chunk)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        found = f"{ids.dtype} with shape {ids.shape}"
        raise TypeError(f"a chunk must be a 1-D array of integer ids, got {found}")
    top = np.iinfo(dtype).max
    lo = int(ids.min(initial=0))
    hi = int(ids.max(initial=0))
    if lo < 0 or hi > top:
        bad = lo if lo < 0 else hi
        wider = "; uint32 holds ids up to 4,294,967,295" if dtype.itemsize < 4 else ""
        raise ValueError(
            f"token id {bad} does not fit {dtype.name} (valid ids: 0 to {top:,}){wider}"
        )
    return ids.astype(dtype, copy=False)


def write_token_file(
    chunks: Iterable[Any], path: str | os.PathLike, dtype: Any = np.uint16, layout: str = "npy"
) -> dict[str, int]:
    """Stream id chunks into path with atomic_write (its old sidecar is deleted); return what only
    the writer knows: n_tokens and max_token_id. sidecar_for reads the rest from the file."""
    path = Path(path)
    dtype = check_token_dtype(dtype, "token dtype")
    check_prep_arguments(layout=layout)
    if path.suffix != SUFFIXES[layout]:
        raise ValueError(f"a {layout} token file must end in {SUFFIXES[layout]}, got {path.name!r}")
    header = HEADERS[layout]
    n_tokens = 0
    max_token_id = -1
    with atomic_write(path, stale=sidecar_path(path)) as f:
        f.write(header(dtype, 0))  # a placeholder of the real header's length
        for chunk in chunks:
            ids = _as_token_array(chunk, dtype)
            if ids.size:
                f.write(ids.tobytes())
                n_tokens += ids.size
                max_token_id = max(max_token_id, int(ids.max()))
        if n_tokens == 0:
            raise ValueError(f"no tokens to write to {path}")
        f.seek(0)
        f.write(header(dtype, n_tokens))  # the true length, over the placeholder
    return {"n_tokens": n_tokens, "max_token_id": max_token_id}


# ---- Names, settings, and what a rerun may keep --------------------------------------------
def settings_fingerprint(settings: dict[str, Any]) -> str:
    """sha256 hex of settings as canonical JSON: equal fingerprints mean byte-identical files."""
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def shard_path(out: str | os.PathLike, split: str, index: int, layout: str = "npy") -> Path:
    """<out>/<split>_<index, 6 digits>.<layout>: shard names sort in shard order."""
    if not 0 <= index < 10**SHARD_DIGITS:
        more = f"needs more than {SHARD_DIGITS} digits; choose a larger shard_tokens"
        raise ValueError(f"shard index {index} {more}")
    return Path(out) / f"{split}_{index:0{SHARD_DIGITS}d}{SUFFIXES[layout]}"


@dataclass(frozen=True)
class SplitOutput:
    """Where one split's tokens go, and the settings that decide their bytes."""

    folder: Path
    split: str
    layout: str
    shard_tokens: int | None  # None: one file
    settings: dict[str, Any]  # everything that decides the bytes: its fingerprint is recorded

    @property
    def sharded(self) -> bool:
        return self.shard_tokens is not None

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.settings["dtype"])

    @property
    def fingerprint(self) -> str:
        return settings_fingerprint(self.settings)

    @property
    def path(self) -> Path:
        """The token file, or the glob of the shards, its folder escaped: a folder called
        run[1] is a name, and the pattern run[1] would match a folder run1."""
        if not self.sharded:
            return self.folder / f"{self.split}{SUFFIXES[self.layout]}"
        digits = "[0-9]" * SHARD_DIGITS
        return Path(glob.escape(str(self.folder))) / f"{self.split}_{digits}{SUFFIXES[self.layout]}"

    def files(self) -> list[Path]:
        """The files there now: the one token file, or the shards in index order."""
        if not self.sharded:
            return [self.path]
        return [path for _, path in sorted(existing_shards(self).items())]


def existing_shards(output: SplitOutput) -> dict[int, Path]:
    """The shard files of output's split in its folder, by index (exact names only)."""
    suffix = re.escape(SUFFIXES[output.layout])
    name = re.compile(rf"{re.escape(output.split)}_(\d{{{SHARD_DIGITS}}}){suffix}")
    entries = output.folder.iterdir() if output.folder.is_dir() else ()
    matches = [name.fullmatch(entry.name) for entry in entries]
    return {int(m[1]): output.folder / m[0] for m in matches if m is not None}


def check_shard_names(output: SplitOutput) -> None:
    """Refuse to shard a split where another file has a shard's name: sharding would replace or
    delete it."""
    for path in existing_shards(output).values():
        meta = _sidecar_or_none(path)
        if meta is not None and not _is_shard_of(meta, output.split):
            says = f"is not a shard of split {output.split!r} (its sidecar says otherwise)"
            risk = f"sharding {output.split!r} would replace or delete it"
            advice = "Move it, or choose another --out"
            raise ValueError(f"{str(path)!r} {says}, but has a shard's name; {risk}. {advice}")


def _is_shard_of(meta: dict[str, Any], split: str) -> bool:
    source = meta.get("source")
    is_shard = isinstance(meta.get("shard"), dict) and isinstance(source, dict)
    return is_shard and source.get("split") == split


def kept_sidecars(output: SplitOutput) -> list[dict[str, Any]] | None:
    """The sidecars of output's files if a rerun may keep them all: each file is there, and its
    sidecar records these settings, its size and its probe (shards: and their count). Else None."""
    paths = output.files()
    metas = [_kept_sidecar(path, output.fingerprint) for path in paths]
    if not paths or any(meta is None for meta in metas):
        return None
    if output.sharded and any(meta["shard"].get("count") != len(paths) for meta in metas):
        return None
    return metas


def _kept_sidecar(path: Path, fingerprint: str) -> dict[str, Any] | None:
    meta = _sidecar_or_none(path)
    if meta is None or meta.get("settings_fingerprint") != fingerprint:
        return None
    if not path.is_file() or path.stat().st_size != meta["file_size"]:
        return None
    if meta.get("probe_sha256") != probe_sha256(path):  # damaged in its first or last 64 KiB
        return None
    return meta


def _sidecar_or_none(path: Path) -> dict[str, Any] | None:
    try:
        return read_sidecar(path)
    except TokenFileError:  # unreadable: rebuild (a shard: an unfinished one at worst)
        return None


# ---- Writing: one file, or shards into a staging folder ------------------------------------
class WrittenFile(NamedTuple):
    """A token file just written, and what only its writer knows."""

    path: Path  # where it lies now: its final path, or (a shard) in the staging folder
    max_token_id: int
    n_docs: int  # the documents that start in it: one EOT each


class ShardPiece(NamedTuple):
    """Ids that all belong to one shard."""

    shard: int
    ids: np.ndarray


@dataclass
class DocumentCount:
    """Documents written so far, one EOT each; each is also reported to progress."""

    eot_id: int
    progress: Callable[[int], object]  # a progress bar's update
    n_docs: int = 0

    def passing(self, pieces: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """pieces, unchanged, counted on the way through."""
        for ids in pieces:
            found = int(np.count_nonzero(ids == self.eot_id))
            self.n_docs += found
            self.progress(found)
            yield ids


def make_staging_folder(folder: Path, split: str) -> Path:
    """A new hidden folder for shards beside them: .<split>_shards.tmp.<pid>.<random>."""
    while True:
        staging = folder / f".{split}_shards.tmp.{os.getpid()}.{secrets.token_hex(4)}"
        with contextlib.suppress(FileExistsError):  # the name is taken: draw another
            staging.mkdir()
            return staging


def write_files(
    output: SplitOutput, chunks: Iterable[np.ndarray], count: DocumentCount, staging: Path | None
) -> list[WrittenFile]:
    """The ids of chunks as output's one file, or as shards of shard_tokens ids each (the last:
    the rest, never empty) into staging."""
    if not output.sharded:
        return [_write_file(output.path, chunks, output, count)]
    written = []
    pieces = _cut_into_shards(chunks, output.shard_tokens)
    for index, shard in groupby(pieces, key=attrgetter("shard")):
        name = shard_path(output.folder, output.split, index, output.layout).name
        ids = (piece.ids for piece in shard)
        written.append(_write_file(staging / name, ids, output, count))
    return written


def _write_file(
    path: Path, chunks: Iterable[np.ndarray], output: SplitOutput, count: DocumentCount
) -> WrittenFile:
    before = count.n_docs
    stats = write_token_file(count.passing(chunks), path, output.dtype, output.layout)
    return WrittenFile(path, stats["max_token_id"], count.n_docs - before)


def _cut_into_shards(chunks: Iterable[np.ndarray], shard_tokens: int) -> Iterator[ShardPiece]:
    """The ids of chunks, cut where a shard ends, each piece with the index of its shard."""
    handed_out = 0  # ids in the pieces so far
    for chunk in chunks:
        start = 0
        while start < len(chunk):
            room = shard_tokens - handed_out % shard_tokens  # left in the current shard
            piece = chunk[start : start + room]
            yield ShardPiece(handed_out // shard_tokens, piece)
            handed_out += len(piece)
            start += len(piece)


# ---- Publishing: the sidecars, and the swap of a set of shards -----------------------------
def describe(
    output: SplitOutput, written: list[WrittenFile], source: dict[str, Any]
) -> list[dict[str, Any]]:
    """Each written file's sidecar: sidecar_for reads its size, sha256, probe, layout and dtype
    from the file, and is given what only the prep step knows."""
    settings = output.settings
    metas = []
    first_token = 0
    for index, file in enumerate(written):
        meta = sidecar_for(
            file.path,
            layout=output.layout,
            dtype=output.dtype,
            tokenizer=settings["tokenizer"],
            n_vocab=settings["n_vocab"],
            eot_id=settings["eot_id"],
            eot_placement=settings["eot_placement"],
            max_token_id=file.max_token_id,
            n_docs=file.n_docs,
            source=source,
            settings_fingerprint=output.fingerprint,
            created_by=CREATED_BY,
            **_shard_field(output, index, len(written), first_token),
        )
        metas.append(meta)
        first_token += meta["n_tokens"]
    return metas


def _shard_field(output: SplitOutput, index: int, count: int, first_token: int) -> dict:
    """A shard's place in its set (its sidecar's "shard"); nothing for one file."""
    if not output.sharded:
        return {}
    place = {"index": index, "count": count, "shard_tokens": output.shard_tokens}
    return {"shard": {**place, "first_token": first_token}}


def publish(output: SplitOutput, staging: Path | None, metas: list[dict[str, Any]]) -> None:
    """Swap the staged shards in, if any, then write each file's sidecar; a Ctrl-C or SIGTERM
    meanwhile waits until they are done."""
    with signals_deferred():
        if staging is not None:
            _swap_in(output, staging, [meta["file"] for meta in metas])
        for meta in metas:
            write_sidecar(output.folder / meta["file"], meta)


def _swap_in(output: SplitOutput, staging: Path, names: list[str]) -> None:
    """Rename the staged shards over the old ones: the old sidecars go first, and old shards past
    the new count (an earlier run's, with more text) with them."""
    old = existing_shards(output)
    stale = [sidecar_path(path) for path in old.values()]
    stale += [path for index, path in old.items() if index >= len(names)]
    for path in stale:
        path.unlink(missing_ok=True)
    fsync_folder(output.folder)
    for name in names:
        os.replace(staging / name, output.folder / name)
    fsync_folder(output.folder)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM back while renames must not be cut in half, then deliver them
    (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signals = (signal.SIGINT, signal.SIGTERM)
    else:
        signals = ()
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])  # now, to the handler that was in place


# ---- The output folder: its lock, and what dead runs left ----------------------------------
@contextlib.contextmanager
def output_lock(folder: Path) -> Iterator[bool]:
    """Hold folder's lock (flock on LOCK_NAME) while writing into folder; yield whether it is
    held. The kernel holds it for the process, across containers that share the filesystem, and
    drops it when the process dies. Without flock (Windows, some network filesystems) or in a
    read-only folder, yield False: then nothing waits and nothing is cleaned."""
    fd = _open_lock_file(folder)
    if fd is None:
        yield False
        return
    try:
        yield _lock(fd, folder)
    finally:
        os.close(fd)  # and the lock with it


def _open_lock_file(folder: Path) -> int | None:
    if fcntl is None:
        return None
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # never a planted link's target
    try:
        return os.open(folder / LOCK_NAME, flags, 0o666)
    except OSError:  # a read-only folder: a run that writes nothing there needs no lock
        return None


def _lock(fd: int, folder: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # another run writes into this folder: wait until it is done
        print(f"waiting for another prep run writing into {folder}", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # this filesystem has no flock
        return False
    return True


def remove_temp_files(folder: Path) -> list[Path]:
    """Delete the temp files and shard staging folders in folder, and return them. Call it holding
    the folder's lock: every run that writes holds it, so what is found is a dead run's."""
    removed = []
    for entry in sorted(folder.iterdir()):
        if not TEMP_NAME.fullmatch(entry.name) or entry.is_symlink():
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to delete
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
    return removed


def clean_stale_temp_files(out_dir: str | os.PathLike) -> list[Path]:
    """Delete what killed runs left in out_dir (temp files, shard staging folders), after a run
    writing there now has finished; return what was deleted."""
    folder = Path(out_dir)
    if not folder.is_dir():
        return []
    with output_lock(folder) as held:
        if not held:
            return []
        return remove_temp_files(folder)


def check_writable(folder: Path) -> None:
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"cannot write to output folder {str(folder)!r}: it is not writable")
