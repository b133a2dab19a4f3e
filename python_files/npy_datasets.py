"""Serve (x, y) next-token windows from token files on disk, without loading them into RAM.

Copy this one file into your project: it needs Python 3.11+, numpy, torch and the standard library.

    import torch
    from npy_datasets import NpyTokensDataset, make_dataloaders, to_device

    train = NpyTokensDataset("data/tinystories/train.npy", seq_len=256)  # or a list, or a glob
    val = NpyTokensDataset("data/tinystories/validation.npy", seq_len=256)
    train_loader, val_loader = make_dataloaders(train, val, batch_size=32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for step, batch in enumerate(train_loader, 1):
        x, y = to_device(batch, device)  # int64, (32, 256) each: y is x shifted by one token
        ...  # loss = model(x, y); save train_loader.sampler.state_dict(consumed=step) with it

The sections follow the data:
    1. The file format   open_tokens() checks a token file and maps it; write_tokens() writes one
    2. The dataset       NpyTokensDataset: the (x, y) windows of one file or many
    3. The sampler       EpochSampler: a new order each epoch, one share per rank, state to resume
    4. Loaders           make_dataloaders() and to_device()
    5. Checks            every refusal, one checker per kind of input
Importing the file imports numpy only (torch where it is used): a prep step can use section 1
without torch.
"""

from __future__ import annotations

import ast
import contextlib
import errno
import glob
import hashlib
import json
import operator
import os
import secrets
import stat
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

__all__ = [
    "FORMAT_VERSION",
    "TokenFileError",
    "token_dtype",
    "sidecar_path",
    "probe_sha256",
    "read_npy_header",
    "read_sidecar",
    "open_tokens",
    "atomic_write",
    "fsync_folder",
    "sidecar_for",
    "write_sidecar",
    "write_tokens",
    "NpyTokensDataset",
    "EpochSampler",
    "make_dataloaders",
    "verify_across_ranks",
    "to_device",
    "ARGUMENT_RULES",
    "check_arguments",
    "check_token_dtype",
]

# ---- 1. The file format ------------------------------------------------------------------------

FORMAT_VERSION = 1  # of the JSON sidecar written beside each token file
NPY_MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER = 10_000  # bytes: numpy's own limit, checked before anything is parsed
LLMC_HEADER_BYTES = 256 * 4  # llm.c shards: 256 int32 words (magic, version, token count, unused)
LLMC_VERSIONS = {20240520: 1, 20240801: 7}  # llm.c's token shards: magic -> version
LLMC_DTYPES = {20240520: np.dtype("<u2"), 20240801: np.dtype("<u4")}  # GPT-2 ids, Llama 3 ids
LLMC_OTHER_FILES = {20240326: "model", 20240327: "state", 20240328: "tokenizer", 20240522: "eval"}
PROBE_BYTES = 1 << 16  # probe_sha256 hashes a file's first and last 64 KiB: cheap on every open
MAX_OPEN_FILES = 1024  # files one process keeps mapped at most (each map holds a descriptor)
# make_dataloaders wants 16 free file descriptors for its workers, and 4 for each batch in flight
# (x and y, doubled). 2 workers with prefetch_factor 2 hung under 24 free: 16 + 2 a batch, measured.
LOADER_DESCRIPTORS = 16
BATCH_DESCRIPTORS = 4


class TokenFileError(ValueError):
    """A token file, or its sidecar, is not what the loader can read safely."""


class FileLayout(NamedTuple):
    """Where a token file keeps its ids."""

    layout: str  # "npy" or "llmc" (both told by their first bytes), or "bin" (raw ids)
    dtype: np.dtype
    shape: tuple[int, ...]  # (tokens,), or (sequences, tokens of each) for a 2-D .npy
    offset: int  # bytes before the first id


class FileIdentity(NamedTuple):
    """What tells a file from its replacement: where it lives, its size and its last change."""

    device: int
    inode: int
    size: int
    mtime_ns: int


class OpenedFile(NamedTuple):
    """A token file, checked, and what tells it apart from another file later."""

    layout: FileLayout
    sidecar: dict[str, Any]  # {} for a file without one
    identity: FileIdentity
    probe: str  # probe_sha256 of the file as it was opened


def token_dtype(n_vocab: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a vocabulary of n_vocab tokens."""
    check_arguments(n_vocab=n_vocab)
    return np.dtype("<u2" if n_vocab <= 2**16 else "<u4")  # ids 0 .. n_vocab - 1


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where the JSON sidecar of a token file lives: the file's name with '.json' appended."""
    return Path(path).with_name(Path(path).name + ".json")


def probe_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's first and last PROBE_BYTES (of all of a smaller file): it tells apart
    two files of one size, two swapped shards say, without reading them whole."""
    with open(path, "rb") as f:
        return _probe(f, f.read(PROBE_BYTES), os.fstat(f.fileno()).st_size)


def _probe(f: BinaryIO, head: bytes, size: int) -> str:
    f.seek(max(len(head), size - PROBE_BYTES))  # the tail, never the head twice
    return hashlib.sha256(head + f.read(PROBE_BYTES)).hexdigest()


def read_npy_header(path: str | os.PathLike) -> FileLayout:
    """A .npy file's dtype, shape and data offset. The header is parsed here, as a literal: its
    sizes are checked before anything is parsed, the data must fill the file exactly, and every
    refusal names the file."""
    size = _check_token_file(path).st_size
    with open(path, "rb") as f:
        return _check_npy_header(path, f.read(12 + MAX_NPY_HEADER), size)  # magic to header


def read_sidecar(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON sidecar of a token file, each field type-checked; None when there is none."""
    side = sidecar_path(path)
    meta = _load_sidecar(side)
    if meta is not None:
        _check_sidecar(side, meta)
    return meta


def open_tokens(
    path: str | os.PathLike,
    dtype: Any = None,
    *,
    vocab_size: int | None = None,
    verify: bool = False,
) -> np.memmap:
    """A token file as a read-only memmap, after checking it and its sidecar.

    The format comes from the first bytes: .npy, an llm.c shard, or else raw ids such as nanoGPT's
    train.bin (pass dtype= where no sidecar says it). vocab_size refuses ids at or past it, from
    the sidecar's max_token_id or else one scan of the file. verify=True also compares the file's
    sha256 with the sidecar's, a read of every byte.
    """
    _check_open_arguments(dtype, vocab_size, verify)
    path = os.fspath(path)
    return _map(path, _open_file(path, dtype, vocab_size, verify).layout)


def _open_file(path: str, dtype: Any, vocab_size: int | None, verify: bool) -> OpenedFile:
    """A token file and its sidecar checked: one stat, one read of the head and of the tail."""
    st = _check_token_file(path)
    meta = read_sidecar(path) or {}
    with open(path, "rb") as f:
        head = f.read(PROBE_BYTES)
        probe = _probe(f, head, st.st_size)
        layout = _file_layout(path, head, st.st_size, dtype, meta)
        _check_sidecar_matches(path, meta, layout, st.st_size, probe)
        if verify:
            _check_sha256(path, f, meta)
    if vocab_size is not None:  # the sidecar's max_token_id, or else one scan of the file
        top = meta["max_token_id"] if meta else int(_map(path, layout).max())
        _check_vocab_size(path, top, vocab_size)
    identity = FileIdentity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return OpenedFile(layout, meta, identity, probe)


def _file_layout(path: str, head: bytes, size: int, dtype: Any, meta: dict) -> FileLayout:
    """The format, from the first bytes: the .npy magic, an llm.c magic, or else raw ids. A
    sidecar that says "bin" is final: raw ids that happen to spell a magic stay raw ids."""
    magic = int.from_bytes(head[:4], "little")
    raw = meta.get("layout") == "bin"
    if not raw and (head.startswith(NPY_MAGIC) or path.endswith(".npy")):
        found = _check_npy_header(path, head, size)
    elif not raw and (magic in LLMC_VERSIONS or magic in LLMC_OTHER_FILES):
        found = _check_llmc_header(path, head, size)
    else:  # the sidecar's dtype, or else the argument's
        found = _check_raw_file(path, size, meta.get("dtype", dtype))
    if dtype is not None:
        _check_dtype_argument(path, dtype, found)
    return found


def _map(path: str, layout: FileLayout) -> np.memmap:
    try:
        return np.memmap(path, layout.dtype, "r", offset=layout.offset, shape=layout.shape)
    except OSError as error:  # a /sys file behind a link, a device that cannot be mapped, ...
        raise _bad(path, f"cannot be mapped ({error.strerror or error})") from None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, *, stale: Path | None = None) -> Iterator[BinaryIO]:
    """A new file beside path to write: on success it is flushed to disk and renamed over path, on
    an error deleted. stale, the old sidecar, goes just before the rename: a crash then leaves a
    token file without a sidecar, never one whose sidecar describes another file."""
    path = Path(path)
    while True:  # .train.npy.tmp.<pid>.<random>: O_EXCL never opens a link planted at that name
        name = f".{path.name[:200]}.tmp.{os.getpid()}.{secrets.token_hex(4)}"  # within NAME_MAX
        tmp = path.with_name(name)
        with contextlib.suppress(FileExistsError):
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
            fd = os.open(tmp, flags, 0o666)  # 0o666: the umask decides, as for any new file
            break
    try:
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if stale is not None:
            stale.unlink(missing_ok=True)  # missing_ok: another run may have just deleted it
            fsync_folder(path.parent)  # the deletion reaches the disk before the rename can
        os.replace(tmp, path)
        fsync_folder(path.parent)  # the rename survives a power cut
    except OSError as error:  # a full disk: write() names no file, so name the one being written
        if error.filename is None and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise OSError(error.errno, f"{error.strerror} while writing", str(path)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)  # gone already after the rename


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make the renames and deletions in folder durable (Windows cannot fsync a folder)."""
    if os.name != "nt":  # Windows cannot open a folder to fsync it
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def sidecar_for(
    path: str | os.PathLike, *, layout: str, dtype: Any, eot_placement: str = "prepend", **fields
) -> dict[str, Any]:
    """The sidecar of a token file just written: its layout ("npy", "bin" or "llmc") and dtype,
    checked against the file; its size, sha256 and probe; and what only the writer knows:
    tokenizer ("tiktoken:gpt2"), n_vocab, eot_id, max_token_id, eot_placement, and more."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(PROBE_BYTES)
        found = _file_layout(str(path), head, size, dtype, {"layout": layout})
        probe = _probe(f, head, size)
        f.seek(0)
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    own = _sidecar(path.name, found._replace(layout=layout), size, sha256, probe)
    _check_writer_fields(own, fields)
    meta = {**own, "eot_placement": eot_placement, **fields}
    _check_sidecar(sidecar_path(path), meta)  # what a reader would refuse, the writer refuses
    _check_sidecar_matches(str(path), meta, found, size, probe)
    return meta


def _sidecar(name: str, layout: FileLayout, size: int, sha256: str, probe: str) -> dict[str, Any]:
    """The fields of every sidecar that come from its file, spelled once."""
    return {
        "format": "npy-tokens",
        "format_version": FORMAT_VERSION,
        "file": name,
        "layout": layout.layout,
        "dtype": layout.dtype.name,
        "shape": list(layout.shape),
        "n_tokens": int(np.prod(layout.shape)),
        "file_size": size,
        "sha256": sha256,
        "probe_sha256": probe,
    }


def write_sidecar(token_path: str | os.PathLike, meta: dict[str, Any]) -> Path:
    """Write meta as the JSON sidecar of token_path, atomically."""
    side = sidecar_path(token_path)
    with atomic_write(side) as f:
        f.write((json.dumps(meta, sort_keys=True, indent=2) + "\n").encode("utf-8"))
    return side


def write_tokens(path: str | os.PathLike, ids: Any, *, n_vocab: int, dtype: Any = None, **fields):
    """Write the ids of any tokenizer as a token file with its sidecar, each atomically; return
    the sidecar. A path ending in .bin gets raw ids (nanoGPT's layout), any other a .npy file.

    ids: integers, 1-D (or 2-D, a sequence a row), stored as dtype: by default the smallest that
    holds n_vocab ids (uint16 for GPT-2). An id that does not fit is refused, never wrapped.
    fields: the sidecar's tokenizer and eot_id (both needed), eot_placement, n_docs, ... A sidecar
    that a reader would refuse (an id past n_vocab, say) is refused before anything is written.
    """
    dtype = token_dtype(n_vocab) if dtype is None else check_token_dtype(dtype, "dtype argument")
    kind = "bin" if Path(path).suffix == ".bin" else "npy"
    tokens = _check_ids(np.asarray(ids), dtype, kind)
    layout = FileLayout(kind, dtype, tokens.shape, 0)
    fields = {**fields, "n_vocab": n_vocab, "max_token_id": int(tokens.max())}
    draft = {**_sidecar(Path(path).name, layout, 0, "", ""), "eot_placement": "prepend", **fields}
    try:  # the sidecar to be written must be one a reader accepts
        _check_sidecar(sidecar_path(path), draft)
    except TokenFileError as error:
        raise TokenFileError(f"nothing written: the sidecar would be refused: {error}") from None
    with atomic_write(path, stale=sidecar_path(path)) as f:
        if layout.layout == "npy":
            np.lib.format.write_array(f, tokens, allow_pickle=False)
        else:
            f.write(tokens.tobytes())
    meta = sidecar_for(path, layout=layout.layout, dtype=dtype, **fields)
    write_sidecar(path, meta)
    return meta


# ---- 2. The dataset: windows, and one batched gather -------------------------------------------


class TokenFile(NamedTuple):
    """One file of a dataset, as it was when the dataset opened it."""

    path: str
    rows: int  # sequences: 1 for a 1-D file, the row count of a 2-D one
    row_len: int  # tokens per sequence
    offset: int  # bytes before the first token
    identity: FileIdentity  # a file that changes after opening is refused
    sha256: str | None  # the sidecar's, for fingerprint()
    probe: str  # probe_sha256 at opening, for fingerprint()


class MappedFile(NamedTuple):
    """A file mapped in this process, and a view of it whose row s is the window at token s."""

    tokens: np.memmap  # flat (1-D), for a 2-D file too
    windows: np.ndarray  # (tokens - seq_len, seq_len + 1): rows overlap, nothing is copied


class NpyTokensDataset:
    """(x, y) next-token windows of memmapped token files: int64 tensors of shape (seq_len,), y
    being x shifted by one token. A map-style dataset: DataLoader needs len() and indexing only.

    ds[i] or ds[epoch, i] is one window; ds[indices] or ds[epoch, indices] a batch, gathered in one
    pass. Files (a list, or a glob sorted by name) share one index space; no window crosses a file,
    or a row of a 2-D file. mode="windows": window i is tokens[i*seq_len : (i+1)*seq_len + 1].
    mode="random": num_samples windows an epoch, each starting anywhere, from (seed, epoch, i).
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        seq_len: int,
        *,
        mode: str = "windows",
        num_samples: int | None = None,
        seed: int = 0,
        dtype: Any = None,
        vocab_size: int | None = None,
        verify: bool = False,
    ) -> None:
        _check_dataset_arguments(seq_len, mode, num_samples, seed)
        self.seq_len = int(seq_len)
        self.mode = mode
        self.seed = int(seed)
        self.paths = _expand_paths(path)
        _check_open_arguments(dtype, vocab_size, verify)
        opened = [_open_file(p, dtype, vocab_size, verify) for p in self.paths]  # fail now
        _check_file_set(self.paths, opened)
        self.dtype = opened[0].layout.dtype
        self.files = [_token_file(p, o) for p, o in zip(self.paths, opened)]
        rows = np.array([f.rows for f in self.files], dtype=np.int64)
        self._row_len = np.array([f.row_len for f in self.files], dtype=np.int64)
        self._windows_per_row = (self._row_len - 1) // self.seq_len
        self._starts_per_row = np.maximum(self._row_len - self.seq_len, 0)  # random starts
        self._window_bounds = _bounds(rows * self._windows_per_row)
        self._start_bounds = _bounds(rows * self._starts_per_row)
        _check_has_windows(self)
        self.num_samples = int(self._window_bounds[-1] if num_samples is None else num_samples)
        self._one_flat_file = len(self.files) == 1 and self.files[0].rows == 1
        self._maps: dict[int, MappedFile] = {}  # file -> its map, least recently used first
        self._max_maps = _map_cap()  # lowered when a process runs out of descriptors all the same

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}  # never pickle mapped data: workers map their own

    def __len__(self) -> int:
        return self.num_samples

    def memmap(self, f: int = 0) -> np.memmap:
        """File f's read-only memmap (flat for a 2-D file too), mapped in this process."""
        if isinstance(f, (bool, np.bool_)) or not isinstance(f, (int, np.integer)):
            raise TypeError(f"a file number must be an int, got {type(f).__name__} {f!r}")
        if not 0 <= f < len(self.files):
            raise IndexError(f"file {f} is out of range for a dataset of {len(self.files)} files")
        return self._mapped(f).tokens

    def fingerprint(self) -> dict[str, Any]:
        """What decides the windows: each file's name, size, dtype, shape and hashes; settings."""
        files = [
            {"name": Path(f.path).name, "bytes": f.identity.size, "dtype": self.dtype.name}
            | {"shape": [f.rows, f.row_len], "sha256": f.sha256, "probe": f.probe}
            for f in self.files
        ]
        settings = {"seq_len": self.seq_len, "mode": self.mode, "seed": self.seed}
        return {"files": files, **settings, "num_samples": self.num_samples}

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, indices, batch = _check_index(index, self)  # batch: a list or array was given
        x, y = self._gather(epoch, indices)
        if batch:
            return x, y
        return x[0], y[0]

    def __getitems__(self, batch: Sequence[Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A DataLoader's batch of samples, gathered in one pass: a list of indices, or of (epoch,
        index) pairs from an EpochSampler; (epoch, indices) from one with a batch_size."""
        epoch, indices, _ = _check_batch(batch, self)
        x, y = self._gather(epoch, indices)
        return list(zip(x, y))

    def locate(self, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The file of each window, and the position of its first token in that file."""
        if self.mode == "random":  # start k of all the files' starts, from (seed, epoch, index)
            hashed = _splitmix64(indices.astype(np.uint64) + np.uint64(_key(self.seed, epoch)))
            slots = (hashed % np.uint64(self._start_bounds[-1])).astype(np.int64)
            bounds, per_row, stride = self._start_bounds, self._starts_per_row, 1
        else:  # window k of all the files' windows
            slots = indices
            bounds, per_row, stride = self._window_bounds, self._windows_per_row, self.seq_len
        if self._one_flat_file:  # no search, no division
            return np.zeros_like(slots), slots * stride
        files = np.searchsorted(bounds[1:], slots, side="right")  # the file that holds each slot
        rows, place = np.divmod(slots - bounds[files], per_row[files])  # its row, its place there
        return files, rows * self._row_len[files] + place * stride

    def _gather(self, epoch: int, indices: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of windows, by one fancy index into each file's window view, widened to int64."""
        import torch

        files, firsts = self.locate(epoch, indices)
        if len(self.files) == 1:
            windows = self._mapped(0).windows[firsts]  # row b: tokens firsts[b] .. + seq_len
        else:
            windows = np.empty((len(firsts), self.seq_len + 1), dtype=self.dtype)
            for f in np.unique(files).tolist():  # file by file: one map in use at a time
                mine = files == f
                windows[mine] = self._mapped(f).windows[firsts[mine]]
        x = windows[:, :-1].astype(np.int64)  # numpy widens unsigned ids exactly
        y = windows[:, 1:].astype(np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    def _mapped(self, f: int) -> MappedFile:
        """File f mapped in this process, after checking that it is still the file the dataset
        opened: reading a mapped file that was truncated in place kills the process."""
        _check_unchanged(self.files[f])
        mapped = self._maps.pop(f, None)  # put back below: the most recently used map goes last
        if mapped is None:
            mapped = self._map_file(self.files[f])
        self._maps[f] = mapped
        return mapped

    def _map_file(self, file: TokenFile) -> MappedFile:
        """Map a file, first closing the least recently used maps beyond the cap. Out of file
        descriptors, the cap drops to half the maps then open, and the map is tried once more."""
        for attempt in (1, 2):
            while len(self._maps) >= self._max_maps:
                del self._maps[next(iter(self._maps))]  # the oldest map, and its descriptor
            try:
                length = file.rows * file.row_len
                tokens = np.memmap(file.path, self.dtype, "r", offset=file.offset, shape=length)
                break
            except OSError as error:
                _check_map_retry(file.path, error, attempt, len(self._maps))
                self._max_maps = max(1, len(self._maps) // 2)  # DataLoader workers need some
        flat = np.asarray(tokens)  # a plain ndarray: no memmap bookkeeping on every slice
        return MappedFile(tokens, _window_view(flat, self.seq_len))


def _window_view(flat: np.ndarray, seq_len: int) -> np.ndarray:
    """A read-only view whose row s is the window tokens s .. s + seq_len: no copy, rows overlap."""
    step = flat.strides[0]
    shape = (max(len(flat) - seq_len, 0), seq_len + 1)
    return np.lib.stride_tricks.as_strided(flat, shape, (step, step), writeable=False)


def _token_file(path: str, o: OpenedFile) -> TokenFile:
    rows, row_len = o.layout.shape if len(o.layout.shape) == 2 else (1, o.layout.shape[0])
    sha256 = o.sidecar.get("sha256")
    return TokenFile(path, rows, row_len, o.layout.offset, o.identity, sha256, o.probe)


def _map_cap() -> int:
    """MAX_OPEN_FILES, or a quarter of the open-file limit where that is less: DataLoader workers
    hand each batch over through a file descriptor of their own, and a program holds others."""
    try:
        import resource  # Unix only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except ImportError:
        return MAX_OPEN_FILES
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_FILES
    return max(1, min(MAX_OPEN_FILES, soft // 4))


def _bounds(counts: np.ndarray) -> np.ndarray:
    """[0, c0, c0 + c1, ...]: item k belongs to the f with bounds[f] <= k < bounds[f + 1]."""
    return np.concatenate(([0], np.cumsum(counts)))


def _expand_paths(path: Any) -> list[str]:
    """One token file, a list of them, or a glob pattern ('data/train_*.npy', sorted by name)."""
    _check_path_argument(path)
    if isinstance(path, (list, tuple)):
        return [os.fspath(p) for p in path]
    text = os.fspath(path)
    if os.path.exists(text) or not any(ch in text for ch in "*?["):
        return [text]
    found = sorted(p for p in glob.glob(text) if not p.endswith(".json"))  # not the sidecars
    _check_glob_found(text, found)
    return found


def _splitmix64(x: Any) -> Any:
    """SplitMix64's output function: a well-spread 64-bit value of each input, a Python int or a
    uint64 array (whose arithmetic wraps at 2**64 by itself)."""
    mask = 2**64 - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


def _key(seed: int, epoch: int) -> int:
    """A 64-bit key from (seed, epoch) alone: the same in every worker and on every rank. The
    epoch is mixed in a step of its own, so epoch e's index i + 1 is not epoch e + 1's index i."""
    return _splitmix64(_splitmix64(seed) + epoch)


# ---- 3. The sampler: epochs, ranks and resume state --------------------------------------------

SAMPLER_STATE_FORMAT = "npy_datasets.EpochSampler"


class SamplerPass(NamedTuple):
    """One pass over an EpochSampler."""

    epoch: int
    start: int  # where in the epoch's order it began (a global position: all ranks' items)
    items: int  # how many items this rank's pass hands out (indices, not batches)


class EpochSampler:
    """A fresh order of a dataset's windows each epoch, for one rank: (epoch, index) pairs, or
    (epoch, indices) batches with batch_size=B, for DataLoader(ds, sampler=..., batch_size=None).

    Epoch e's order is a permutation of range(n) drawn from (seed, e) alone (range(n) without
    shuffle), the same on every rank; rank r of world_size W (default: torch.distributed's) takes
    items r, r + W, ... When W does not divide n, remainder="drop" leaves out the order's last
    n % W items and "pad" repeats its first W - n % W. A pass that runs to its end moves on to the
    next epoch; one left early (a peek with next(iter(loader)), a break) does not, and the next
    pass starts that epoch again. set_epoch(e), as on DistributedSampler, picks an epoch.
    """

    def __init__(
        self,
        data_source: Any,
        *,
        shuffle: bool = True,
        seed: int = 0,
        batch_size: int | None = None,
        drop_last: bool = False,
        world_size: int | None = None,
        rank: int | None = None,
        remainder: str = "drop",
    ) -> None:
        _check_sampler_arguments(shuffle, seed, batch_size, drop_last, world_size, rank, remainder)
        if world_size is None:  # torch.distributed's, or one process
            world_size, rank = _distributed_world()
        self.num_samples = len(data_source)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.batch_size = None if batch_size is None else int(batch_size)
        self.drop_last = drop_last
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.remainder = remainder
        self.epoch = 0  # the epoch of the next pass
        self._start = 0  # where in that epoch's order the next pass begins
        self._resumed = False  # a loaded position that no finished pass has used yet
        self._latest: SamplerPass | None = None  # the pass that began last
        self._handed = 0  # items the latest pass has handed out so far
        fingerprint = getattr(data_source, "fingerprint", None)  # a dataset's files and settings
        self._fingerprint = None if fingerprint is None else fingerprint()
        _check_shares(self)

    @property
    def dropped(self) -> int:
        """Windows of each epoch that no rank sees, so that ranks get equal shares (remainder
        "drop"); with drop_last each rank also leaves out its last partial batch, not counted."""
        return self.num_samples % self.world_size if self.remainder == "drop" else 0

    @property
    def padded(self) -> int:
        """Windows of each epoch that two ranks see (remainder="pad")."""
        return -self.num_samples % self.world_size if self.remainder == "pad" else 0

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch `epoch`. After load_state_dict(), until a pass runs to its end,
        only the loaded epoch is allowed, and it keeps the loaded position: a loop that calls
        set_epoch(e) before each epoch, as DistributedSampler wants, resumes exactly, and one that
        would replay or skip data is stopped."""
        check_arguments(epoch=epoch)
        if self._resumed and epoch != self.epoch:
            loaded = f"continues epoch {self.epoch} at position {self._start}"
            replay = "replay" if epoch < self.epoch else "skip"
            then = f"that would {replay} data; call set_epoch(sampler.epoch), or count from there"
            raise ValueError(
                f"set_epoch({epoch}) right after load_state_dict(), whose state {loaded}: {then}"
            )
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._start = 0
        self._latest = None  # a state saved now describes the pass to come

    def __len__(self) -> int:
        """Items (batches, with batch_size) of the next pass: fewer when it resumes an epoch."""
        items = self._share(self.num_samples - self._start)
        if self.drop_last:
            return items // self.batch_size
        return _ceil_div(items, self.batch_size or 1)

    def _share(self, n: int) -> int:
        """How many of n items in order this rank takes."""
        if self.remainder == "drop":
            return n // self.world_size
        return _ceil_div(n, self.world_size)

    def order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's indices of `epoch`, from position `start` of the epoch's order on."""
        if self.shuffle:
            full = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        else:
            full = np.arange(self.num_samples)
        rest = full[start:]
        extra = len(rest) % self.world_size
        if extra and self.remainder == "drop":  # leave out the order's last items
            rest = rest[: len(rest) - extra]
        elif extra:  # or repeat its first ones (np.resize repeats them again if need be)
            rest = np.concatenate((rest, np.resize(full, self.world_size - extra)))
        return rest[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        # A generator: nothing happens before the first item is asked for, and the sampler moves
        # to the next epoch after the last one only. DataLoader workers ask for items ahead of
        # the loop: with them, a pass whose items all went to the workers counts as finished.
        epoch, start, step = self.epoch, self._start, self.batch_size or 1
        mine = self.order(epoch, start)[: len(self) * step]  # with drop_last, whole batches only
        self._latest = SamplerPass(epoch, start, len(mine))
        self._handed = 0
        for lo in range(0, len(mine), step):
            self._handed = min(lo + step, len(mine))
            if self.batch_size is None:
                yield epoch, int(mine[lo])
            else:
                yield epoch, mine[lo : lo + step]
        self.epoch = epoch + 1
        self._start = 0
        self._resumed = False

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the next item comes from: an epoch and a position in its order (JSON-ready).

        consumed: the batches (items, without batch_size) of the latest pass that the training
        loop has trained on, as `step` in `for step, batch in enumerate(loader, 1)` once that step
        is done. Left out: what the sampler handed out, the same without DataLoader workers;
        workers fetch ahead, so with them pass it. numpy draws the orders: pin its version for
        exact resumes across upgrades.
        """
        latest = self._latest or SamplerPass(self.epoch, self._start, 0)
        if consumed is not None:
            _check_consumed(self, consumed)
        items = self._handed if consumed is None else int(consumed) * (self.batch_size or 1)
        items = min(items, latest.items)
        epoch = latest.epoch
        position = latest.start + items * self.world_size
        if self._latest is not None and items == latest.items:  # the whole pass: the next epoch
            epoch += 1
            position = 0
        state = {"format": SAMPLER_STATE_FORMAT, "version": 1, "epoch": epoch, "position": position}
        settings = {"num_samples": self.num_samples, "shuffle": self.shuffle, "seed": self.seed}
        return {**state, "dataset": self._fingerprint, **settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict(): the next pass starts exactly where that one stopped. The
        state must come from the same windows and seed; another world_size or batch_size is fine."""
        _check_state(self, state)
        self.epoch = state["epoch"]
        self._start = state["position"]
        self._resumed = True
        self._latest = None


def _distributed_world() -> tuple[int, int]:
    """(world_size, rank) of torch.distributed, or (1, 0) outside it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ---- 4. Loaders and the device -----------------------------------------------------------------


def make_dataloaders(
    train: NpyTokensDataset,
    val: NpyTokensDataset | None = None,
    *,
    batch_size: int,
    num_workers: int = 0,
    seed: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    world_size: int | None = None,
    rank: int | None = None,
) -> tuple[DataLoader, DataLoader | None]:
    """Train (shuffled, drop_last) and validation (in order, every window) DataLoaders of (x, y)
    batches; None for validation without a val dataset.

    An EpochSampler hands the dataset a whole batch of indices, gathered in one pass (DataLoader's
    batch_size=None; collate_fn=tuple keeps the dataset's batch as it is). No workers by default:
    for memmapped windows they cost more than they save. Memory is pinned where CUDA is. seed
    orders the training windows. Each rank of torch.distributed (or of world_size and rank) gets
    its share, every rank the same number of steps (validation repeats a few windows for that),
    once the ranks have checked that they agree on files and settings.

    len(train_loader) counts the batches of the next pass: after sampler.load_state_dict(), only
    those left in the resumed epoch. `for step, batch in enumerate(loader, 1)` counts a pass; keep
    a global step of your own beside it.
    """
    import torch
    from torch.utils.data import DataLoader

    _check_loader_arguments(train, val, batch_size, num_workers, seed, pin_memory, prefetch_factor)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        val_fingerprint = None if val is None else val.fingerprint()
        fingerprints = {"train": train.fingerprint(), "val": val_fingerprint}
        verify_across_ranks({**fingerprints, "batch_size": batch_size, "seed": seed})
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    options = {"batch_size": None, "collate_fn": tuple, "num_workers": num_workers}
    if num_workers:  # DataLoader refuses these two without workers
        options.update(persistent_workers=True, prefetch_factor=prefetch_factor)
    common = {"world_size": world_size, "rank": rank, "batch_size": batch_size, "seed": seed}
    sampler = EpochSampler(train, shuffle=True, drop_last=True, remainder="drop", **common)
    train_loader = DataLoader(train, sampler=sampler, pin_memory=pin, **options)
    if val is None:
        return train_loader, None
    sampler = EpochSampler(val, shuffle=False, remainder="pad", **common)
    return train_loader, DataLoader(val, sampler=sampler, pin_memory=pin, **options)


def verify_across_ranks(settings: dict[str, Any], group: Any = None) -> None:
    """Check that every rank of torch.distributed passes equal JSON-able settings (a dataset's
    fingerprint(), say); raise on every rank, naming the first rank that differs and where."""
    import torch
    import torch.distributed as dist

    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":  # NCCL moves CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    mine = torch.frombuffer(bytearray(json.dumps(settings).encode()), dtype=torch.uint8)
    ranks = range(dist.get_world_size(group))
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in ranks]
    dist.all_gather(sizes, torch.tensor([len(mine)], device=device), group=group)
    padded = torch.zeros(int(max(sizes)), dtype=torch.uint8, device=device)
    padded[: len(mine)] = mine
    buffers = [torch.zeros_like(padded) for _ in ranks]
    dist.all_gather(buffers, padded, group=group)  # tensors only: nothing is pickled
    seen = [json.loads(bytes(b[: int(n)].cpu().tolist())) for b, n in zip(buffers, sizes)]
    for rank, theirs in enumerate(seen):
        found = _first_difference(seen[0], theirs)
        if found is not None:
            where, first, other = found
            there = f"{first!r:.120} on rank 0, {other!r:.120} on rank {rank}"
            raise RuntimeError(f"rank {rank} differs from rank 0: {where} is {there}")


def to_device(
    batch: Sequence[torch.Tensor], device: str | torch.device
) -> tuple[torch.Tensor, ...]:
    """Move a batch's tensors to device, asynchronously from pinned memory. (bench_loader.py --gpu
    times this against uint16 ids widened there: either takes microseconds, a GPU step ms.)"""
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)


# ---- 5. Checks: every refusal, one checker per kind of input -----------------------------------

ARGUMENT_RULES: dict[str, Any] = {  # an int range, bool (True or False), or a tuple of choices
    "seq_len": range(1, 2**63),
    "num_samples": range(1, 2**63),
    "seed": range(0, 2**63),
    "epoch": range(0, 2**63),
    "vocab_size": range(1, 2**63),
    "n_vocab": range(1, 2**32 + 1),  # uint32 holds ids up to 2**32 - 1
    "batch_size": range(1, 2**63),
    "num_workers": range(0, 2**31),
    "prefetch_factor": range(1, 2**31),
    "world_size": range(1, 2**31),
    "rank": range(0, 2**31),
    "consumed": range(0, 2**63),
    "mode": ("windows", "random"),
    "remainder": ("drop", "pad"),
    "shuffle": bool,
    "drop_last": bool,
    "verify": bool,
    "pin_memory": bool,
}


def check_arguments(rules: dict[str, Any] = ARGUMENT_RULES, /, **values: Any) -> None:
    """Refuse the first value that its rule does not allow: a TypeError for the wrong kind of
    value, a ValueError for one out of range or not among the choices. A numpy int is an int, a
    bool never is. Pass an optional argument only when it is set."""
    for name, value in values.items():
        if name not in rules:
            raise TypeError(f"no rule for the argument {name!r}: add one to the rules table")
        rule = rules[name]
        if isinstance(rule, range):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if value < rule.start:
                raise ValueError(f"{name} must be at least {rule.start}, got {value}")
            if value >= rule.stop:
                raise ValueError(f"{name} must be at most {rule.stop - 1}, got {value}")
        elif rule is bool:
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        elif not any(type(value) is type(choice) and value == choice for choice in rule):
            raise ValueError(f"{name} must be one of {rule}, got {value!r}")


def _bad(path: str | os.PathLike, problem: str, error: type = TokenFileError) -> Exception:
    """The error for a file: its path, what is wrong with it and, where it helps, what to do."""
    return error(f"{os.fspath(path)!r} {problem}")


def check_token_dtype(dtype: Any, where: str) -> np.dtype:
    """dtype as little-endian uint16 or uint32, or an error naming where it came from."""
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy raises either for a malformed dtype
        raise TokenFileError(
            f"{where}: {dtype!r} is not a dtype; expected uint16 or uint32"
        ) from None
    if found.kind != "u" or found.itemsize not in (2, 4) or found.byteorder == ">":
        valid = "expected little-endian ('uint16', 'uint32')"
        hint = "write_tokens stores ids as uint16 or uint32, refusing any that do not fit"
        raise TokenFileError(f"{where}: dtype {found.str!r} is not supported; {valid} ({hint})")
    return found.newbyteorder("<")


def _check_token_file(path: str | os.PathLike) -> os.stat_result:
    """The stat of a regular, non-empty file, or an error that says what the path is instead."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise _bad(path, "does not exist", FileNotFoundError) from None
    except OSError as error:  # permission, a link loop, ...
        raise _bad(path, f"cannot be read ({error.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise _bad(path, "is a directory; expected a .npy or .bin file")
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO would block until someone writes to it
        raise _bad(path, "is not a regular file; expected a .npy or .bin file")
    if st.st_size == 0:
        raise _bad(path, "is empty (0 bytes); rerun the prep step")
    return st


def _check_npy_header(path: str | os.PathLike, head: bytes, size: int) -> FileLayout:
    """A .npy header, from the file's first bytes: magic, version, length, then the literal."""
    if not NPY_MAGIC.startswith(head[:6]):  # a shorter head may be a cut .npy: said below
        expected = f"expected {NPY_MAGIC!r} (raw ids: .bin)"
        raise _bad(path, f"is not a .npy file: {head[:6]!r}, {expected}")
    if len(head) < 8:
        raise _bad(path, f"has a truncated .npy preamble ({size} bytes)")
    if (head[6], head[7]) not in ((1, 0), (2, 0), (3, 0)):
        raise _bad(
            path, f"has the unsupported .npy version {head[6]}.{head[7]}; expected 1.0, 2.0 or 3.0"
        )
    length_bytes = 2 if head[6] == 1 else 4  # of the header's length: 2 in version 1.0, else 4
    if len(head) < 8 + length_bytes:
        raise _bad(path, f"has a truncated .npy header ({size} bytes)")
    header_len = int.from_bytes(head[8 : 8 + length_bytes], "little")
    if header_len > MAX_NPY_HEADER:
        too_long = f"which is larger than the {MAX_NPY_HEADER} allowed"
        raise _bad(path, f"has a .npy header of {header_len} bytes, {too_long}")
    offset = 8 + length_bytes + header_len
    if offset > size:
        raise _bad(path, f"has a truncated header: need {offset} bytes, file has {size}")
    text = head[8 + length_bytes : offset].decode("utf8" if head[6] == 3 else "latin1", "replace")
    header = _check_npy_dict(path, text)
    dtype = check_token_dtype(header["descr"], repr(os.fspath(path)))
    shape = header["shape"]
    needed = offset + dtype.itemsize * int(np.prod(shape, dtype=object))
    if needed != size:
        problem = "is truncated" if needed > size else "has trailing bytes"
        sizes = f"shape {shape} of {dtype.name} needs {needed} bytes, file has {size}"
        raise _bad(path, f"{problem}: {sizes}")
    if 0 in shape:
        raise _bad(path, f"holds no tokens (shape {shape})")
    return FileLayout("npy", dtype, shape, offset)


def _check_npy_dict(path: str | os.PathLike, text: str) -> dict[str, Any]:
    """The header's dict: exactly descr (a plain dtype), fortran_order False, a 1-D or 2-D shape."""
    try:
        header = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise _bad(path, f"has a .npy header that is not a Python literal: {text[:80]!r}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        keys = sorted(map(str, header)) if isinstance(header, dict) else type(header).__name__
        raise _bad(
            path, f"has a .npy header that must have keys descr, fortran_order, shape; found {keys}"
        )
    if not isinstance(header["descr"], str):
        raise _bad(
            path, f"holds a structured dtype {header['descr']!r}, which is not a token array"
        )
    if header["fortran_order"] is not False:
        raise _bad(path, f"has fortran_order={header['fortran_order']!r}; expected False (C order)")
    shape = header["shape"]
    sizes = isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)
    if not sizes or len(shape) not in (1, 2):
        raise _bad(path, f"is not a 1-D or 2-D token array, got shape {shape!r}")
    return header


def _check_llmc_header(path: str, head: bytes, size: int) -> FileLayout:
    """An llm.c header, checked as llm.c checks it (magic and version), and its size."""
    magic, version, count = np.frombuffer(head[:12].ljust(12, b"\0"), dtype="<i4").tolist()
    if magic in LLMC_OTHER_FILES:
        other = f"llm.c's {LLMC_OTHER_FILES[magic]} file, not a token shard (20240520 or 20240801)"
        raise _bad(path, f"has the magic {magic} of {other}")
    if version != LLMC_VERSIONS[magic]:
        expected = LLMC_VERSIONS[magic]
        raise _bad(
            path, f"has the llm.c magic {magic}, which goes with version {expected}, not {version}"
        )
    if size < LLMC_HEADER_BYTES:
        need = f"need {LLMC_HEADER_BYTES} bytes, file has {size}"
        raise _bad(path, f"has a truncated llm.c header: {need}")
    dtype = LLMC_DTYPES[magic]
    needed = LLMC_HEADER_BYTES + count * dtype.itemsize
    if count <= 0 or needed != size:
        what = f"{count} tokens of {dtype.name} ({needed} bytes with the header)"
        raise _bad(path, f"has an llm.c header that declares {what}, but the file has {size} bytes")
    return FileLayout("llmc", dtype, (count,), LLMC_HEADER_BYTES)


def _check_raw_file(path: str, size: int, dtype: Any) -> FileLayout:
    """Raw ids with no header, of the dtype that the sidecar or the dtype argument gives."""
    if dtype is None:
        nanogpt = "pass dtype=np.uint16 (nanoGPT's .bin) or np.uint32"
        raise _bad(
            path, f"is a raw token file with no sidecar {sidecar_path(path).name!r}: {nanogpt}"
        )
    found = check_token_dtype(dtype, repr(path))
    if size % found.itemsize:
        raise _bad(path, f"has {size} bytes, not a multiple of {found.itemsize} ({found.name})")
    return FileLayout("bin", found, (size // found.itemsize,), 0)


def _check_dtype_argument(path: str, dtype: Any, found: FileLayout) -> None:
    if check_token_dtype(dtype, "dtype argument") != found.dtype:
        says = {"npy": "holds", "llmc": "is an llm.c shard of", "bin": "has a sidecar that says"}
        passed = np.dtype(dtype).name
        raise _bad(path, f"{says[found.layout]} {found.dtype.name} but dtype={passed} was passed")


def _check_open_arguments(dtype: Any, vocab_size: int | None, verify: bool) -> None:
    check_arguments(verify=verify)
    if vocab_size is not None:
        check_arguments(vocab_size=vocab_size)
    if dtype is not None:
        check_token_dtype(dtype, "dtype argument")


SIDECAR_FIELDS = {  # every sidecar's fields, by their JSON type
    str: ("format", "file", "layout", "dtype", "sha256", "tokenizer", "eot_placement"),
    int: ("format_version", "n_tokens", "file_size", "n_vocab", "eot_id", "max_token_id"),
    list: ("shape",),
}
OPTIONAL_SIDECAR_FIELDS = {str: ("probe_sha256", "settings_fingerprint"), dict: ("shard",)}


def _load_sidecar(side: Path) -> Any:
    """A sidecar's JSON; None when there is none, an error for anything else at its name."""
    try:
        st = os.stat(side)
    except FileNotFoundError:
        return None
    except OSError as error:  # a link loop, a permission: not the same as no sidecar
        raise _bad(
            side, f"is a sidecar that cannot be read ({error.strerror}); fix or delete it"
        ) from None
    if not stat.S_ISREG(st.st_mode):  # reading a FIFO would block until someone writes to it
        raise _bad(side, "is not a regular file: a sidecar is a JSON file, or absent")
    try:
        return json.loads(side.read_bytes())
    except (OSError, ValueError, RecursionError) as error:  # ValueError: bad JSON or UTF-8
        raise _bad(side, f"is not valid JSON ({error}); delete this sidecar, rerun the prep step")


def _check_sidecar(side: Path, meta: Any) -> None:
    """A sidecar on its own: its format, each field's type, its version, its ids."""
    if not isinstance(meta, dict) or meta.get("format") != "npy-tokens":
        raise _bad(side, 'is not a sidecar: expected a JSON object with "format": "npy-tokens"')
    fields = [(key, kind) for kind, keys in SIDECAR_FIELDS.items() for key in keys]
    fields += [
        (k, kind) for kind, keys in OPTIONAL_SIDECAR_FIELDS.items() for k in keys if k in meta
    ]
    for key, kind in fields:
        if type(meta.get(key)) is not kind:  # exact types: a JSON true is not an int
            found = f"should be {kind.__name__}, found {meta.get(key)!r}"
            raise _bad(side, f"is not a valid sidecar: field {key!r} {found}")
    version = meta["format_version"]
    if version < 1:
        raise _bad(side, f"has format_version {version}, not a version (1, 2, ...)")
    if version > FORMAT_VERSION:
        update = f"newer than this module's {FORMAT_VERSION}: update npy_datasets.py"
        raise _bad(side, f"has format_version {version}, {update}")
    for key in ("max_token_id", "eot_id"):
        if not 0 <= meta[key] < meta["n_vocab"]:
            raise _bad(
                side, f"has {key} {meta[key]}, outside the vocabulary (n_vocab {meta['n_vocab']})"
            )


def _check_sidecar_matches(path: str, meta: dict, layout: FileLayout, size: int, probe: str):
    """The sidecar must describe this very file: its format, its size, its first and last bytes."""
    if not meta:
        return
    actual = {"layout": layout.layout, "dtype": layout.dtype.name, "shape": list(layout.shape)}
    actual |= {"n_tokens": int(np.prod(layout.shape, dtype=object)), "file_size": size}
    bad = next((key for key in actual if meta[key] != actual[key]), None)
    if bad is not None:
        found = f"{bad} is {meta[bad]!r} in the sidecar, {actual[bad]!r} in the file"
        raise _bad(sidecar_path(path), f"disagrees with {path!r}: {found}; rerun the prep step")
    if "probe_sha256" in meta and meta["probe_sha256"] != probe:  # older sidecars have none
        changed = (
            f"changed in its first or last {PROBE_BYTES // 1024} KiB since its sidecar was written"
        )
        raise _bad(
            path, f"{changed}: replaced, swapped or damaged; write it again, or rerun the prep step"
        )


def _check_sha256(path: str, f: BinaryIO, meta: dict) -> None:
    if not meta:
        raise _bad(path, f"has no sidecar {sidecar_path(path).name!r}, which verify=True needs")
    f.seek(0)
    if hashlib.file_digest(f, "sha256").hexdigest() != meta["sha256"]:
        raise _bad(path, "is damaged or was replaced: its sha256 differs from the sidecar's")


def _check_vocab_size(path: str, top: int, vocab_size: int) -> None:
    if top >= vocab_size:
        raise _bad(path, f"holds ids up to {top}, too many for vocab_size={vocab_size}")


def _check_ids(ids: np.ndarray, dtype: np.dtype, layout: str) -> np.ndarray:
    """ids as dtype, after checking every id fits: a plain astype would wrap 70000 to 4464."""
    if ids.ndim not in (1, 2) or ids.dtype.kind not in "iu":  # signed or unsigned integers
        raise TypeError(f"ids must be a 1-D or 2-D array of integers, got {ids.dtype} {ids.shape}")
    if ids.ndim == 2 and layout == "bin":  # raw ids keep no shape: the rows would run together
        raise ValueError(
            f"2-D ids {ids.shape} cannot be written as .bin, which holds one flat stream; "
            "write a .npy path to keep the rows, or pass ids.ravel() for one stream"
        )
    if ids.size == 0:
        raise ValueError("no token ids to write")
    low, high, top = int(ids.min()), int(ids.max()), np.iinfo(dtype).max
    if low < 0 or high > top:
        wider = "; uint32 holds ids up to 4,294,967,295" if dtype.itemsize < 4 else ""
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} does not fit {dtype.name} (ids 0 to {top:,}){wider}")
    return ids.astype(dtype, copy=False)


def _check_writer_fields(own: dict[str, Any], fields: dict[str, Any]) -> None:
    clash = sorted(set(own) & set(fields))
    if clash:
        raise TypeError(
            f"sidecar_for reads {clash} from the file itself; pass the writer's fields only"
        )


def _check_path_argument(path: Any) -> None:
    files = path if isinstance(path, (list, tuple)) else [path]
    if not files or not all(isinstance(p, (str, os.PathLike)) for p in files):
        raise TypeError(f"path must be a file, a glob or a non-empty list of files: {path!r:.100}")


def _check_glob_found(pattern: str, found: list[str]) -> None:
    if not found:
        skipped = "(sidecars, *.json, are skipped)"
        raise FileNotFoundError(f"no token file matches the pattern {pattern!r} {skipped}")


def _check_dataset_arguments(seq_len: Any, mode: Any, num_samples: Any, seed: Any) -> None:
    check_arguments(seq_len=seq_len, mode=mode, seed=seed)
    if num_samples is not None:
        check_arguments(num_samples=num_samples)
        if mode != "random":
            raise ValueError('num_samples applies to mode="random" only, not to "windows"')


def _check_file_set(paths: list[str], opened: list[OpenedFile]) -> None:
    """The files of one dataset share a dtype and a tokenizer. A file given twice, or a set of
    shards given in part, is allowed, with a warning."""
    dtype = opened[0].layout.dtype
    for path, o in zip(paths, opened):
        if o.layout.dtype != dtype:
            first = f"{paths[0]!r} holds {dtype.name}"
            raise _bad(path, f"holds {o.layout.dtype.name} but {first}: a dataset has one dtype")
    named = [(p, o.sidecar["tokenizer"]) for p, o in zip(paths, opened) if o.sidecar]
    other = next(((p, t) for p, t in named if t != named[0][1]), None)
    if other is not None:
        first = f"{named[0][0]!r} with {named[0][1]!r}; the files of one dataset need one tokenizer"
        raise _bad(other[0], f"was tokenized with {other[1]!r} but {first}")
    repeated = [p for p, k in Counter(map(os.path.realpath, paths)).items() if k > 1]
    if repeated:
        warnings.warn(f"{repeated[0]!r} is given more than once (its windows repeat)", stacklevel=3)
    sets: dict[str, list[dict]] = {}  # shards the prep step wrote together, by their settings
    for o in opened:
        if "shard" in o.sidecar and "settings_fingerprint" in o.sidecar:
            sets.setdefault(o.sidecar["settings_fingerprint"], []).append(o.sidecar["shard"])
    for shards in sets.values():
        count = shards[0].get("count")
        if type(count) is not int:  # not a set the prep step wrote: nothing to compare
            continue
        seen = Counter(shard.get("index") for shard in shards)
        missing = [i for i in range(count) if i not in seen]
        twice = [i for i, k in seen.items() if k > 1]
        if missing or twice:
            found = f"missing {missing[:8] or 'none'}, twice {twice[:8] or 'none'}"
            whole = "pass the glob that the prep step printed, unless a subset is what you want"
            warnings.warn(f"of {count} shards written together, {found}: {whole}", stacklevel=3)


def _check_has_windows(ds: NpyTokensDataset) -> None:
    if ds._window_bounds[-1] > 0:
        return
    where = f"{ds.paths[0]!r}: {'each row has' if ds.files[0].rows > 1 else 'the file has'}"
    if len(ds.files) > 1:
        where = f"none of the {len(ds.files)} files holds a window: the longest sequence has"
    need = f"seq_len={ds.seq_len} needs at least {ds.seq_len + 1} (one x plus its shifted y)"
    raise ValueError(f"{where} {int(ds._row_len.max())} tokens; {need}")


def _check_unchanged(file: TokenFile) -> None:
    """The check on every use: the file is still the one opened (device, inode, size, mtime)."""
    try:
        st = os.stat(file.path)
        same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == file.identity
    except OSError:
        same = False
    if not same:
        changed = "changed since the dataset was opened (size, inode or mtime, or it was removed)"
        raise _bad(file.path, f"{changed}; build a new dataset once the prep step is done")


def _check_map_retry(path: str, error: OSError, attempt: int, maps_open: int) -> None:
    """Raise unless the map failed for want of descriptors and closing maps can free some."""
    out_of_descriptors = error.errno in (errno.EMFILE, errno.ENFILE)
    if out_of_descriptors and attempt == 1 and maps_open:
        return
    hint = "; raise the open-file limit (ulimit -n)" if out_of_descriptors else ""
    raise _bad(path, f"cannot be mapped ({error.strerror}){hint}")


def _check_index(index: Any, ds: NpyTokensDataset) -> tuple[int, np.ndarray, bool]:
    """ds[i], ds[epoch, i], ds[indices] or ds[epoch, indices]: the epoch, the indices (int64, in
    range), and whether a batch was asked for."""
    if isinstance(index, tuple):
        if len(index) != 2:
            forms = "i, (epoch, i), indices or (epoch, indices), indices a list or 1-D array"
            raise TypeError(f"an index is {forms}; got {index!r:.80}")
        epoch, keys = index
        check_arguments(epoch=epoch)
    else:
        epoch, keys = 0, index
    batch = isinstance(keys, (list, np.ndarray))
    return int(epoch), _check_indices(keys if batch else [keys], ds), batch


def _check_indices(keys: list | np.ndarray, ds: NpyTokensDataset) -> np.ndarray:
    """Window indices as int64 in [0, num_samples); a negative one counts from the end."""
    n = ds.num_samples
    if isinstance(keys, np.ndarray):
        if keys.ndim != 1 or keys.dtype.kind not in "iu":  # signed or unsigned integers
            raise TypeError(
                f"an index array must be 1-D of integers, not {keys.dtype} {keys.shape}"
            )
        if len(keys) and keys.min() >= 0 and keys.max() < n:  # a sampler's batch: all in range
            return keys.astype(np.int64, copy=False)
        values = keys.tolist()
    else:
        bad = [k for k in keys if isinstance(k, (bool, np.bool_)) or not hasattr(k, "__index__")]
        if bad:  # a bool is an int to Python, but never an index here
            hint = (
                ": a batch of one epoch is ds[epoch, indices]" if isinstance(bad[0], tuple) else ""
            )
            raise TypeError(
                f"an index must be an int, got {type(bad[0]).__name__} {bad[0]!r:.80}{hint}"
            )
        values = [operator.index(k) for k in keys]
    out = next((v for v in values if not -n <= v < n), None)
    if out is not None:
        more = f" and {len(ds.paths) - 1} more files" if len(ds.paths) > 1 else ""
        raise IndexError(f"index {out} is out of range for {n} windows of {ds.paths[0]!r}{more}")
    return np.array(values, dtype=np.int64) % n


def _check_batch(batch: Any, ds: NpyTokensDataset) -> tuple[int, np.ndarray, bool]:
    """A DataLoader's batch: indices, (epoch, index) pairs of one epoch, or (epoch, indices). A
    tuple of ints, as a DataLoader may hand it over, is indices."""
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[1], (list, np.ndarray)):
        return _check_index(batch, ds)
    keys = list(batch)
    if not keys or not all(isinstance(k, tuple) for k in keys):
        return _check_index(keys, ds)
    if not all(len(k) == 2 for k in keys) or len({k[0] for k in keys}) > 1:
        raise TypeError(f"a batch of (epoch, index) pairs needs one epoch, got {keys!r:.80}")
    return _check_index((keys[0][0], [k[1] for k in keys]), ds)


def _check_sampler_arguments(shuffle, seed, batch_size, drop_last, world_size, rank, remainder):
    check_arguments(shuffle=shuffle, seed=seed, drop_last=drop_last, remainder=remainder)
    if batch_size is not None:
        check_arguments(batch_size=batch_size)
    if drop_last and batch_size is None:
        raise ValueError("drop_last=True needs a batch_size: without one the sampler yields items")
    if (world_size is None) != (rank is None):
        got = f"got world_size={world_size}, rank={rank}"
        raise ValueError(f"pass both world_size and rank, or neither; {got}")
    if world_size is not None:
        check_arguments(world_size=world_size, rank=rank)
        if rank >= world_size:
            valid = f"[0, {world_size}) for world_size={world_size}"
            raise ValueError(f"rank must be in {valid}, got {rank}")


def _check_shares(sampler: EpochSampler) -> None:
    """Every rank gets a share of every epoch, of at least one batch."""
    n, world = sampler.num_samples, sampler.world_size
    if not 1 <= n <= 2**31:  # an epoch's order is held in memory, 8 bytes a window
        fewer = 'for mode="random" pass a smaller num_samples and run more epochs'
        raise ValueError(f"EpochSampler needs 1 to 2**31 windows an epoch, got {n:,}: {fewer}")
    if sampler.remainder == "drop" and n < world:
        instead = 'no rank would get one; use remainder="pad", fewer ranks or a shorter seq_len'
        raise ValueError(f'{n} windows for world_size={world}: with remainder="drop" {instead}')
    if len(sampler) == 0:  # drop_last with a share smaller than one batch: nothing to train on
        share = f"each of the {world} rank(s) gets {sampler._share(n)} of the {n} windows"
        instead = "use a smaller batch_size, fewer ranks or a shorter seq_len (or drop_last=False)"
        b = sampler.batch_size
        raise ValueError(f"batch_size={b} with drop_last=True leaves no batch: {share}; {instead}")


def _check_consumed(sampler: EpochSampler, consumed: Any) -> None:
    """consumed counts batches of the latest pass that the loop received: no more than it got."""
    check_arguments(consumed=consumed)
    if consumed and sampler._latest is None:
        raise ValueError(f"consumed={consumed}, but no pass over this sampler has started")
    step = sampler.batch_size or 1
    handed = _ceil_div(sampler._handed, step)
    if consumed > handed:
        total = _ceil_div(sampler._latest.items, step)
        count = "count the batches of the current pass (enumerate(loader, 1)), not a global step"
        raise ValueError(
            f"consumed={consumed}, but the latest pass has handed out only {handed} of its "
            f"{total} batches; {count}"
        )


def _check_state(sampler: EpochSampler, state: Any) -> None:
    """A saved state must be an EpochSampler's, of the same windows, and inside an epoch."""
    ours = isinstance(state, dict) and state.get("format") == SAMPLER_STATE_FORMAT
    if not ours or state.get("version") != 1:
        raise ValueError(f"not an EpochSampler state of version 1: {state!r:.200}")
    mine = {**sampler.state_dict(), "epoch": 0, "position": 0}
    if set(state) != set(mine):
        raise ValueError(
            f"EpochSampler state: expected the keys {sorted(mine)}, got {sorted(state)}"
        )
    found = _first_difference({**state, "epoch": 0, "position": 0}, mine)
    if found is not None:
        where, saved, here = found
        there = f"{saved!r:.120} in the saved state, {here!r:.120} here"
        raise ValueError(f"EpochSampler state: {where} is {there}")
    epoch, position, n = state["epoch"], state["position"], sampler.num_samples
    if type(epoch) is not int or not 0 <= epoch < 2**63:
        raise ValueError(f"EpochSampler state: epoch must be an int >= 0, got {epoch!r}")
    if type(position) is not int or not 0 <= position < n:
        raise ValueError(
            f"EpochSampler state: position must be an int in [0, {n}), got {position!r}"
        )


def _check_loader_arguments(train, val, batch_size, num_workers, seed, pin_memory, prefetch_factor):
    if not isinstance(train, NpyTokensDataset):
        raise TypeError(f"train must be an NpyTokensDataset, got {type(train).__name__}")
    if val is not None and not isinstance(val, NpyTokensDataset):
        raise TypeError(f"val must be an NpyTokensDataset or None, got {type(val).__name__}")
    check_arguments(batch_size=batch_size, num_workers=num_workers, seed=seed)
    check_arguments(prefetch_factor=prefetch_factor)
    if pin_memory is not None:
        check_arguments(pin_memory=pin_memory)
    if num_workers:
        _check_descriptors_for_workers(num_workers, prefetch_factor)


def _check_descriptors_for_workers(num_workers: int, prefetch_factor: int) -> None:
    """Workers hand each batch over through shared memory, a file descriptor a tensor: under a low
    open-file limit they fail, or the loader waits for ever. Refuse at once, naming the limit."""
    try:
        import resource  # Unix only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        in_use = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except (ImportError, OSError):
        return
    needed = LOADER_DESCRIPTORS + BATCH_DESCRIPTORS * num_workers * prefetch_factor
    if soft != resource.RLIM_INFINITY and soft - in_use < needed:
        limit = f"the open-file limit is {soft}, {in_use} in use"
        fix = f"raise it (ulimit -n {max(4096, 2 * (in_use + needed))}) or use num_workers=0"
        raise ValueError(
            f"num_workers={num_workers} needs {needed} free descriptors, {limit}: {fix}"
        )


def _first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """Where JSON-like a and b first differ, and their values there, walking b's keys in order:
    state_dict() and fingerprint() list causes first (a file's name before its size)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*b, *(k for k in a if k not in b)]:
            found = _first_difference(a.get(key), b.get(key), f"{path}.{key}" if path else key)
            if found is not None:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"len({path})", len(a), len(b)
        pairs = (_first_difference(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
        return next((found for found in pairs if found is not None), None)
    if a == b and type(a) is type(b):
        return None
    return path, a, b
