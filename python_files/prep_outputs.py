"""Writing and publishing: a split's new files (its token file, or its shards) written by the
module's write_tokens into a staging folder of the run's own, their sidecars completed once the
whole split is known, then swapped in together.

A run that writes into a folder holds the folder's lock (output_lock): runs that share the folder,
in any container, wait for each other, and a staging folder found under the lock is a dead run's.
Nothing else in the folder is cleaned: write_tokens' temporary files may be a live writer's.
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
import stat
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
    TokenFileError,
    open_tokens,
    read_sidecar,
    sidecar_path,
    write_tokens,
)
from prep_settings import check_prep_arguments

try:
    import fcntl
except ImportError:  # Windows: no flock; runs there neither wait for each other nor clean up
    fcntl = None


SUFFIXES = {"npy": ".npy", "bin": ".bin", "llmc": ".bin"}  # an llm.c shard's header tells it apart
SHARD_DIGITS = 6  # train_000000.npy: names sort in shard order, up to 999,999 shards
CREATED_BY = "prepare_tokens.py"  # recorded in every sidecar
LOCK_NAME = ".prepare_tokens.lock"  # held while a run writes into its folder (output_lock)
STAGING_NAME = re.compile(r"\.prepare_tokens\.tmp\.\d+\.[0-9a-f]{8}\..+")  # make_staging_folder's
PER_FILE = ("file", "file_size", "sha256", "probe_sha256", "shape", "shard")  # not in totals
NOT_A_LOCK = {stat.S_IFLNK: "a symbolic link", stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO"}


# ---- Token files: their dtype ------------------------------------------------------------------
def token_dtype(n_vocab: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a vocabulary of n_vocab tokens."""
    check_prep_arguments(n_vocab=n_vocab)
    return np.dtype("<u2" if n_vocab <= 2**16 else "<u4")  # GPT-2's largest id, 50256, fits uint16


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

    def file_name(self, index: int) -> str:
        """The name of the one token file, or of shard index."""
        if not self.sharded:
            return self.path.name
        return shard_path(self.folder, self.split, index, self.layout).name

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
    try:  # open_tokens compares the file's size, and its first and last 64 KiB, with the sidecar
        open_tokens(path)
    except (TokenFileError, OSError):  # gone, cut short or damaged: rebuild
        return None
    return meta


def _sidecar_or_none(path: Path) -> dict[str, Any] | None:
    try:
        return read_sidecar(path)
    except TokenFileError:  # unreadable: rebuild (a shard: an unfinished one at worst)
        return None


# ---- Writing: a split's files into its staging folder -----------------------------------------
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
    """A new hidden folder in folder for split's new files: .prepare_tokens.tmp.<pid>.<random>.
    <split>. Only the prep step makes such names, so its cleanup takes no other writer's files."""
    while True:
        staging = folder / f".prepare_tokens.tmp.{os.getpid()}.{secrets.token_hex(4)}.{split}"
        with contextlib.suppress(FileExistsError):  # the name is taken: draw another
            staging.mkdir()
            return staging


def write_files(
    output: SplitOutput, chunks: Iterable[np.ndarray], count: DocumentCount, staging: Path
) -> list[dict[str, Any]]:
    """The ids of chunks as output's one file, or as shards of shard_tokens ids each (the last:
    the rest, never empty), each written by write_tokens into staging. Return their sidecars,
    each with the documents that start in its file (n_docs)."""
    size = output.shard_tokens or 2**63  # one file: a single shard that never fills
    metas = []
    for index, pieces in groupby(_cut_into_shards(chunks, size), key=attrgetter("shard")):
        before = count.n_docs
        name = output.file_name(index)
        try:
            meta = _write_staged(staging / name, output, count, pieces)
        except OSError as error:  # a full disk: name the file being made, not its staging copy
            where = str(output.folder / name)
            reason = (error.strerror or "").removesuffix(" while writing")  # write_tokens says it
            raise OSError(error.errno, f"{reason} while writing", where) from error
        metas.append({**meta, "n_docs": count.n_docs - before})
    return metas


def _write_staged(
    path: Path, output: SplitOutput, count: DocumentCount, pieces: Iterable[ShardPiece]
) -> dict[str, Any]:
    """One token file of output written by write_tokens into its staging folder."""
    settings = output.settings
    return write_tokens(
        path,
        count.passing(piece.ids for piece in pieces),
        n_vocab=settings["n_vocab"],
        tokenizer=settings["tokenizer"],
        eot_id=settings["eot_id"],
        dtype=output.dtype,
        layout=output.layout,
        eot_placement=settings["eot_placement"],
        settings_fingerprint=output.fingerprint,
        created_by=CREATED_BY,
    )


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


# ---- Publishing: the whole split's sidecars, and the swap ----------------------------------------
def complete_sidecars(
    output: SplitOutput, metas: list[dict[str, Any]], source: dict[str, Any], staging: Path
) -> list[dict[str, Any]]:
    """Add to each staged file's sidecar what is known only once the whole split is written: its
    source (with the empty documents skipped) and, for a shard, its place in the set (the count
    too). write_tokens took the fields known before the ids; these sidecars replace its own in
    staging, each on disk before the swap renames it."""
    complete = []
    first_token = 0
    for index, meta in enumerate(metas):
        meta = {**meta, "source": source, **_shard_field(output, index, len(metas), first_token)}
        text = json.dumps(meta, sort_keys=True, indent=2) + "\n"  # laid out as write_tokens does
        with open(sidecar_path(staging / meta["file"]), "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        complete.append(meta)
        first_token += meta["n_tokens"]
    return complete


def _shard_field(output: SplitOutput, index: int, count: int, first_token: int) -> dict:
    """A shard's place in its set (its sidecar's "shard"); nothing for one file."""
    if not output.sharded:
        return {}
    place = {"index": index, "count": count, "shard_tokens": output.shard_tokens}
    return {"shard": {**place, "first_token": first_token}}


def publish(output: SplitOutput, staging: Path, metas: list[dict[str, Any]]) -> None:
    """Swap the staged files in: the old sidecars go first (with old shards past the new count,
    an earlier run's with more text), then the token files, then their sidecars. A Ctrl-C or
    SIGTERM meanwhile waits until they are done."""
    names = [meta["file"] for meta in metas]
    with signals_deferred():
        old = existing_shards(output) if output.sharded else {0: output.path}
        stale = [sidecar_path(path) for path in old.values()]
        stale += [path for index, path in old.items() if index >= len(names)]
        for path in stale:
            path.unlink(missing_ok=True)
        _fsync_folder(output.folder)  # no old sidecar can come back to describe a new file
        for name in names:
            os.replace(staging / name, output.folder / name)
        _fsync_folder(output.folder)  # the token files are in place before any sidecar
        for name in names:
            os.replace(sidecar_path(staging / name), sidecar_path(output.folder / name))
        _fsync_folder(output.folder)


def _fsync_folder(folder: Path) -> None:
    """Make the renames and deletions in folder durable (Windows cannot open a folder to fsync)."""
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    path = folder / LOCK_NAME
    with contextlib.suppress(FileNotFoundError):  # none yet: the first run creates it
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):  # opening it would fail, or lock nothing, without a word
            kind = NOT_A_LOCK.get(stat.S_IFMT(mode), "not a regular file")
            why = "prep runs that write into this folder lock it with a regular file of that name"
            fix = "remove it, and run again (the run creates the file)"
            raise ValueError(f"{str(path)!r} is {kind}, not a lock file: {why}; {fix}")
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # never a planted link's target
    try:
        return os.open(path, flags, 0o666)
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
    """Delete the staging folders of dead prep runs in folder, and return them. Call it holding
    the folder's lock: every run makes and removes its staging folder under the lock, so one found
    then is a dead run's. Any other file stays: write_tokens' temporary files (.<name>.tmp.<pid>.
    <random>) may be a live writer's, one that does not take this lock."""
    removed = []
    for entry in sorted(folder.iterdir()):
        if not STAGING_NAME.fullmatch(entry.name) or entry.is_symlink() or not entry.is_dir():
            continue
        with contextlib.suppress(OSError):  # gone already, or not ours to delete
            shutil.rmtree(entry)
            removed.append(entry)
    return removed


def clean_stale_temp_files(out_dir: str | os.PathLike) -> list[Path]:
    """Delete the staging folders that killed prep runs left in out_dir, after a run writing
    there now has finished; return what was deleted."""
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
