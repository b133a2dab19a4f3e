"""Serve (x, y) next-token windows from token files on disk, without loading them into RAM.

Copy this one file into your project: it needs numpy, torch and the standard library only.
Every definition here is taught, step by step, in the notebooks of this repository.
"""

from __future__ import annotations

import ast
import contextlib
import glob
import hashlib
import itertools
import json
import operator
import os
import stat
import warnings
from pathlib import Path
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

try:
    import resource  # Unix only: the open-file limit that bounds how many files stay mapped
except ImportError:
    resource = None  # type: ignore[assignment]

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.autograd.profiler import record_function
from torch.utils.data._utils.collate import default_collate, default_collate_fn_map
from torch.utils.data._utils.pin_memory import pin_memory

__all__ = [
    "FORMAT_VERSION",
    "TokenFileError",
    "token_dtype",
    "sidecar_path",
    "read_npy_header",
    "read_sidecar",
    "open_tokens",
    "NpyTokensDataset",
    "EpochSampler",
    "ResumableDataLoader",
    "TokenBatch",
    "collate_windows",
    "default_num_workers",
    "make_dataloaders",
    "verify_across_ranks",
    "to_device",
]

FORMAT_VERSION = 1  # version of the JSON sidecar written beside each token file
TOKEN_DTYPES = ("uint16", "uint32")  # uint16 holds ids < 65,536 (GPT-2: 50,257); uint32 the rest
NPY_MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER = 10_000  # bytes; numpy's own default limit, checked before anything is parsed
LLMC_HEADER_BYTES = 256 * 4  # llm.c shards: 256 int32 words (magic, version, token count, ...)
LLMC_FORMATS = {20240520: (1, np.dtype("<u2")), 20240801: (7, np.dtype("<u4"))}  # magic: (version, dtype)
WINDOW_MODES = ("windows", "random")  # non-overlapping windows, or nanoGPT-style random starts
MAX_OPEN_FILES = 64  # token files one process keeps mapped (each map holds a file descriptor); LRU beyond


class TokenFileError(ValueError):
    """A token file, or its sidecar, is not what the loader can read safely."""


def token_dtype(n_vocab: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a vocabulary of n_vocab tokens."""
    if isinstance(n_vocab, bool) or not isinstance(n_vocab, (int, np.integer)):
        raise TypeError(f"n_vocab must be an int, got {type(n_vocab).__name__} {n_vocab!r}")
    if n_vocab < 1:
        raise ValueError(f"n_vocab must be at least 1, got {n_vocab}")
    if n_vocab <= 2**16:  # ids 0 .. n_vocab - 1 all fit in 16 bits
        return np.dtype("<u2")
    if n_vocab <= 2**32:
        return np.dtype("<u4")
    raise ValueError(f"n_vocab {n_vocab} does not fit uint32 (at most 2**32 ids)")


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where the JSON sidecar of a token file lives: the file's name with '.json' appended."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def _regular_file_size(path: Path) -> int:
    """Size in bytes of a regular file, or a clear error for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"token file {str(path)!r} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise TokenFileError(f"token file {str(path)!r} is {kind}; expected a .npy or .bin file")
    if st.st_size == 0:
        raise TokenFileError(f"token file {str(path)!r} is empty (0 bytes); re-run the prep step")
    return st.st_size


def _check_dtype(dtype: Any, where: str) -> np.dtype:
    """Normalise a token dtype to little-endian uint16/uint32 or name what would be valid."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy raises either for a malformed dtype string
        raise TokenFileError(f"{where}: {dtype!r} is not a dtype; expected one of {TOKEN_DTYPES}") from None
    if dt.kind != "u" or dt.itemsize not in (2, 4) or dt.byteorder == ">":
        raise TokenFileError(
            f"{where}: dtype {dt.str!r} is not supported; expected little-endian {TOKEN_DTYPES} "
            "(convert with arr.astype(np.uint16) if every id is below 65,536)"
        )
    return dt.newbyteorder("<")


def read_npy_header(path: str | os.PathLike) -> tuple[np.dtype, tuple[int, ...], int]:
    """Parse a .npy header without numpy's loader: (dtype, shape, offset of the data in bytes).

    Sizes are checked before anything is read, the header is parsed as a literal only, and the
    declared data must fill the file exactly, so pickles, truncated and padded files are refused.
    """
    path = Path(path)
    size = _regular_file_size(path)
    with open(path, "rb") as f:
        preamble = f.read(8)
        if preamble[:6] != NPY_MAGIC:
            raise TokenFileError(
                f"{str(path)!r} is not a .npy file: it starts with {preamble[:6]!r}, expected "
                f"{NPY_MAGIC!r} (for a raw headerless token file use the .bin suffix)"
            )
        if len(preamble) < 8:
            raise TokenFileError(f"{str(path)!r}: truncated .npy preamble ({size} bytes)")
        major, minor = preamble[6], preamble[7]
        if (major, minor) == (1, 0):
            len_bytes, encoding = 2, "latin1"
        elif (major, minor) in ((2, 0), (3, 0)):
            len_bytes, encoding = 4, "latin1" if major == 2 else "utf8"
        else:
            raise TokenFileError(f"{str(path)!r}: unsupported .npy version {major}.{minor}; expected 1.0, 2.0 or 3.0")
        raw_len = f.read(len_bytes)
        if len(raw_len) < len_bytes:
            raise TokenFileError(f"{str(path)!r}: truncated .npy header ({size} bytes)")
        header_len = int.from_bytes(raw_len, "little")
        offset = 8 + len_bytes + header_len
        if header_len > MAX_NPY_HEADER:
            raise TokenFileError(
                f"{str(path)!r}: .npy header of {header_len} bytes is larger than the {MAX_NPY_HEADER} allowed"
            )
        if offset > size:
            raise TokenFileError(f"{str(path)!r}: truncated header: need {offset} bytes, file has {size}")
        text = f.read(header_len).decode(encoding, errors="replace")
    try:
        header = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # TypeError: {[1]: 2}, unhashable
        raise TokenFileError(f"{str(path)!r}: .npy header is not a Python literal: {text[:80]!r}") from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        keys = sorted(map(str, header)) if isinstance(header, dict) else type(header).__name__
        raise TokenFileError(f"{str(path)!r}: .npy header must have keys descr, fortran_order, shape; found {keys}")
    if not isinstance(header["descr"], str):
        raise TokenFileError(f"{str(path)!r}: structured dtype {header['descr']!r} is not a token array")
    dtype = _check_dtype(header["descr"], repr(str(path)))
    if header["fortran_order"] is not False:
        raise TokenFileError(f"{str(path)!r}: fortran_order={header['fortran_order']!r}; expected False (C order)")
    shape = header["shape"]
    if (
        not isinstance(shape, tuple)
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        or len(shape) not in (1, 2)
    ):
        raise TokenFileError(f"{str(path)!r}: expected a 1-D or 2-D token array, got shape {shape!r}")
    expected = offset + dtype.itemsize * int(np.prod(shape, dtype=object))
    if expected != size:
        problem = "truncated" if expected > size else "has trailing bytes"
        raise TokenFileError(
            f"{str(path)!r} is {problem}: shape {shape} of {dtype.name} needs {expected} bytes, file has {size}"
        )
    if 0 in shape:
        raise TokenFileError(f"{str(path)!r} holds no tokens (shape {shape})")
    return dtype, shape, offset


_SIDECAR_TYPES = {
    "format": str, "format_version": int, "file": str, "layout": str, "dtype": str,
    "shape": list, "n_tokens": int, "file_size": int, "sha256": str, "tokenizer": str,
    "n_vocab": int, "eot_id": int, "eot_placement": str, "max_token_id": int,
}  # fmt: skip


def read_sidecar(path: str | os.PathLike) -> dict[str, Any] | None:
    """Read and type-check the JSON sidecar of a token file; None when there is none."""
    side = sidecar_path(path)
    if not side.exists():
        return None
    if not side.is_file():  # reading a FIFO would block until someone writes to it
        raise TokenFileError(f"sidecar {str(side)!r} is not a regular file; expected a JSON file or none")
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: "[[[[..."
        raise TokenFileError(f"sidecar {str(side)!r} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != "npy-tokens":
        raise TokenFileError(f"sidecar {str(side)!r}: expected an object with \"format\": \"npy-tokens\"")
    for key, typ in _SIDECAR_TYPES.items():
        value = meta.get(key)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise TokenFileError(
                f"sidecar {str(side)!r}: field {key!r} should be {typ.__name__}, found {value!r}"
            )
    if meta["format_version"] > FORMAT_VERSION:
        raise TokenFileError(
            f"sidecar {str(side)!r}: format_version {meta['format_version']} is newer than this "
            f"module's {FORMAT_VERSION}; update npy_datasets.py"
        )
    return meta


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _read_llmc_header(path: Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """Parse the header of an llm.c / modded-nanogpt shard: 256 little-endian int32 words, the
    first three being magic, version and token count, then the tokens."""
    size = _regular_file_size(path)
    with open(path, "rb") as f:
        head = f.read(LLMC_HEADER_BYTES)
    magic = int.from_bytes(head[:4], "little")
    version, dtype = LLMC_FORMATS[magic]
    if len(head) < LLMC_HEADER_BYTES:
        raise TokenFileError(
            f"{str(path)!r}: truncated llm.c header: need {LLMC_HEADER_BYTES} bytes, file has {size}"
        )
    found_version, count = (int.from_bytes(head[i : i + 4], "little", signed=True) for i in (4, 8))
    if found_version != version:
        raise TokenFileError(
            f"{str(path)!r}: llm.c magic {magic} goes with version {version}, found version {found_version}"
        )
    if count <= 0:
        raise TokenFileError(f"{str(path)!r}: llm.c header declares {count} tokens; a shard holds at least one")
    expected = LLMC_HEADER_BYTES + count * dtype.itemsize
    if expected != size:
        raise TokenFileError(
            f"{str(path)!r}: llm.c header declares {count} tokens of {dtype.name} ({expected} bytes with "
            f"the header), but the file has {size} bytes"
        )
    return dtype, (count,), LLMC_HEADER_BYTES


def _file_layout(
    path: Path, dtype: Any, meta: dict[str, Any] | None
) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """Describe a token file as (layout, dtype, shape, data offset): "npy", "llmc" (both found from
    the file's first bytes) or "bin" (raw, headerless: dtype from the argument or the sidecar)."""
    with open(path, "rb") as f:
        head = f.read(8)
    is_npy = head[:6] == NPY_MAGIC
    if not is_npy and len(head) >= 4 and int.from_bytes(head[:4], "little") in LLMC_FORMATS:
        file_dtype, shape, offset = _read_llmc_header(path)
        if dtype is not None and _check_dtype(dtype, "dtype argument") != file_dtype:
            raise TokenFileError(
                f"{str(path)!r} is an llm.c shard of {file_dtype.name} but dtype={np.dtype(dtype).name} was passed"
            )
        return "llmc", file_dtype, shape, offset
    if is_npy or path.suffix == ".npy":
        file_dtype, shape, offset = read_npy_header(path)
        if dtype is not None and _check_dtype(dtype, "dtype argument") != file_dtype:
            raise TokenFileError(
                f"{str(path)!r} holds {file_dtype.name} but dtype={np.dtype(dtype).name} was passed"
            )
        return "npy", file_dtype, shape, offset
    size = _regular_file_size(path)
    if dtype is None and meta is None:
        raise TokenFileError(
            f"{str(path)!r} is a raw token file with no sidecar {sidecar_path(path).name!r}: "
            "pass dtype=np.uint16 (nanoGPT's train.bin) or dtype=np.uint32"
        )
    if dtype is not None:
        dt = _check_dtype(dtype, "dtype argument")
        if meta is not None and meta["dtype"] != dt.name:
            raise TokenFileError(
                f"dtype={dt.name} was passed but sidecar {str(sidecar_path(path))!r} says {meta['dtype']}"
            )
    else:
        dt = _check_dtype(meta["dtype"], f"sidecar {str(sidecar_path(path))!r}")  # type: ignore[index]
    if size % dt.itemsize:
        raise TokenFileError(
            f"{str(path)!r}: size {size} bytes is not a multiple of {dt.itemsize} ({dt.name})"
        )
    return "bin", dt, (size // dt.itemsize,), 0


def _check_sidecar(
    path: Path, meta: dict[str, Any], layout: str, dtype: np.dtype, shape: tuple[int, ...], verify: bool
) -> None:
    """Refuse a sidecar that disagrees with the file it describes, naming the field."""
    side = str(sidecar_path(path))
    found = {
        "layout": layout,
        "dtype": dtype.name,
        "shape": list(shape),
        "n_tokens": int(np.prod(shape, dtype=object)),
        "file_size": os.stat(path).st_size,
    }
    for key, actual in found.items():
        if meta[key] != actual:
            raise TokenFileError(
                f"sidecar {side!r} disagrees with {str(path)!r}: {key} is {meta[key]!r} in the sidecar, "
                f"{actual!r} in the file; re-run the prep step"
            )
    for key in ("max_token_id", "eot_id"):
        if not 0 <= meta[key] < meta["n_vocab"]:
            raise TokenFileError(
                f"sidecar {side!r}: {key} {meta[key]} is outside the vocabulary (n_vocab {meta['n_vocab']})"
            )
    if verify and _sha256(path) != meta["sha256"]:
        raise TokenFileError(f"{str(path)!r}: sha256 differs from the sidecar's; the file is damaged or was replaced")


def open_tokens(
    path: str | os.PathLike,
    dtype: Any = None,
    *,
    vocab_size: int | None = None,
    verify: bool = False,
) -> np.memmap:
    """Open a token file as a read-only memmap, after checking it and its sidecar.

    The format is found from the file: a .npy file, an llm.c / modded-nanogpt shard (magic 20240520
    for uint16, 20240801 for uint32), or else a raw headerless file such as nanoGPT's train.bin.

    Args:
        dtype: needed only for a raw file without a sidecar (np.uint16 for nanoGPT's train.bin).
        vocab_size: the model's vocabulary size; refuse files whose ids could reach past it.
        verify: also compare the file's sha256 with the sidecar's (reads the whole file).
    """
    return _open_checked(path, dtype, vocab_size, verify)[0]


def _open_checked(
    path: str | os.PathLike, dtype: Any, vocab_size: int | None, verify: bool
) -> tuple[np.memmap, dict[str, Any] | None]:
    """open_tokens, also returning the sidecar it checked the file against (None without one)."""
    path = Path(path)
    _regular_file_size(path)
    meta = read_sidecar(path)
    layout, dt, shape, offset = _file_layout(path, dtype, meta)
    if meta is not None:
        _check_sidecar(path, meta, layout, dt, shape, verify)
    elif verify:
        raise TokenFileError(f"verify=True needs the sidecar {str(sidecar_path(path))!r}, which is missing")
    if vocab_size is not None:
        vocab_size = _check_int("vocab_size", vocab_size, 1)
        top = meta["max_token_id"] if meta is not None else int(np.iinfo(dt).max)
        if meta is None or top >= vocab_size:
            raise TokenFileError(
                f"{str(path)!r}: ids up to {top} may not fit vocab_size={vocab_size}"
                + ("" if meta else " (no sidecar records the largest id: leave out vocab_size, or write the "
                   "file with the prep step, whose sidecar does)")
            )
    return np.memmap(path, dtype=dt, mode="r", offset=offset, shape=shape), meta


def _check_int(name: str, value: Any, minimum: int) -> int:
    """An int (or numpy integer, never a bool) that is at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


_MASK64 = (1 << 64) - 1
_SPLITMIX = (0x9E3779B97F4A7C15, 30, 0xBF58476D1CE4E5B9, 27, 0x94D049BB133111EB, 31)  # add, shift, multiply, ...
_SPLITMIX_U64 = tuple(np.uint64(c) for c in _SPLITMIX)  # the same as numpy scalars, made once


def _mix64(x: Any, plus: int = 0) -> Any:
    """SplitMix64's finaliser of x + plus: a fast, well-spread hash of uint64 values (a Python int,
    or a uint64 array, which it overwrites), wrapping mod 2**64."""
    if isinstance(x, int):
        golden, s1, m1, s2, m2, s3 = _SPLITMIX
        x = (x + plus + golden) & _MASK64
        x = ((x ^ (x >> s1)) * m1) & _MASK64
        x = ((x ^ (x >> s2)) * m2) & _MASK64
        return x ^ (x >> s3)
    golden, s1, m1, s2, m2, s3 = _SPLITMIX_U64
    x += np.uint64((_SPLITMIX[0] + plus) & _MASK64) if plus else golden  # x + plus + golden in one call
    x ^= x >> s1  # in place, one numpy call each: every call costs about a microsecond here
    x *= m1
    x ^= x >> s2
    x *= m2
    x ^= x >> s3
    return x


def _keyed_hash(seed: int, stream: int, epoch: int | np.ndarray, index: np.ndarray) -> np.ndarray:
    """A uint64 per index that depends only on (seed, stream, epoch, index): no RNG state anywhere.

    epoch is one int for every index (a batch from EpochSampler) or an array, one per index."""
    key = _mix64((seed * 4 + stream) & _MASK64)
    if isinstance(epoch, (int, np.integer)):  # hash the epoch once, as a Python int
        return _mix64(index.astype(np.uint64), plus=_mix64(key, plus=int(epoch)))
    return _mix64(_mix64(np.uint64(key) + epoch.astype(np.uint64)) + index.astype(np.uint64))


def _warn_incomplete_shards(paths: list[str], metas: list[dict[str, Any] | None]) -> None:
    """Warn when shards that prepare_tokens wrote as one set are missing from paths, or given twice.

    A subset may be intended (a quick run on the first shards), so this warns instead of refusing."""
    sets: dict[str, tuple[str, int, list[int]]] = {}  # settings fingerprint -> (first path, count, indices seen)
    for p, meta in zip(paths, metas):
        shard = meta.get("shard") if meta is not None else None
        if not isinstance(shard, dict) or not all(isinstance(shard.get(k), int) for k in ("index", "count")):
            continue
        first, count, seen = sets.setdefault(str(meta.get("settings_fingerprint")), (p, shard["count"], []))
        seen.append(shard["index"])
    for first, count, seen in sets.values():
        missing = sorted(set(range(count)) - set(seen))
        twice = sorted(i for i, times in Counter(seen).items() if times > 1)
        if missing or twice:
            problem = (f"shard(s) {_ranges(missing)} of {count} missing" if missing else "") + (
                ("; " if missing else "") + f"shard(s) {_ranges(twice)} given more than once" if twice else "")
            warnings.warn(
                f"{first!r} is one of {count} shards written together, but this dataset has {problem}. "
                "Pass the glob prepare_tokens printed (e.g. 'train_[0-9][0-9][0-9][0-9][0-9][0-9].npy') for the "
                "whole set, unless a subset is what you want", stacklevel=3,
            )


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'; at most 10 ranges, then a count."""
    parts: list[tuple[int, int]] = []  # (first, last) of each run of consecutive indices
    for i in indices:
        if parts and parts[-1][1] == i - 1:
            parts[-1] = (parts[-1][0], i)
        else:
            parts.append((i, i))
    text = [f"{a}-{b}" if a != b else f"{a}" for a, b in parts[:10]]
    return ", ".join(text) + (f" and {len(parts) - 10} more ranges" if len(parts) > 10 else "")


def _expand_paths(path: Any) -> list[str]:
    """One token file, a list of them, or a glob pattern ('data/train_*.npy', sorted by name)."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if any(ch in text for ch in "*?[") and not os.path.exists(text):
            found = sorted(p for p in glob.glob(text) if not p.endswith(".json"))  # skip the sidecars
            if not found:
                raise FileNotFoundError(f"no token file matches the pattern {text!r} (sidecars, *.json, are skipped)")
            return found
        return [text]
    if isinstance(path, (list, tuple)) and path:
        bad = [p for p in path if not isinstance(p, (str, os.PathLike))]
        if bad:
            raise TypeError(f"path list items must be str or os.PathLike, got {type(bad[0]).__name__} {bad[0]!r}")
        return [os.fspath(p) for p in path]
    raise TypeError(f"path must be a token file, a non-empty list of them or a glob pattern, got {path!r}")


def _open_file_budget() -> int:
    """How many token files one process keeps mapped: MAX_OPEN_FILES, fewer under a low open-file limit."""
    if resource is None:
        return MAX_OPEN_FILES
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_FILES
    return max(1, min(MAX_OPEN_FILES, soft // 4))  # leave most descriptors to torch, workers and the program


def _file_identity(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class NpyTokensDataset(Dataset):
    """(x, y) next-token windows, int64 tensors of shape (seq_len,), read from memmapped token files.

    path is one token file, a list of them or a glob pattern (matches sorted by name); the files
    share one index space, in order, and no window crosses a file boundary (nor a row of a 2-D
    file: each row is a separate sequence). Per sequence of N tokens:

    mode="windows": window i is tokens[i*seq_len : i*seq_len + seq_len + 1], x its first seq_len
    tokens and y its last seq_len; there are (N - 1) // seq_len windows, and the last
    N - 1 - windows*seq_len tokens are neither an x nor a y (file_summary() counts them). With
    epoch_offset=True every window of an epoch moves right by one offset in [0, seq_len) drawn from
    (seed, epoch), and there are (N - seq_len) // seq_len windows. mode="random": num_samples
    windows (default: as many as mode "windows"), each starting anywhere in [0, N - seq_len - 1] of
    any sequence, drawn from (seed, epoch, index). A sequence too short for one window adds none.

    An index is an int (epoch 0) or an (epoch, index) pair, as EpochSampler yields.
    """

    def __init__(
        self,
        path: str | os.PathLike | Sequence[str | os.PathLike],
        seq_len: int,
        *,
        mode: str = "windows",
        num_samples: int | None = None,
        seed: int = 0,
        epoch_offset: bool = False,
        dtype: Any = None,
        vocab_size: int | None = None,
        verify: bool = False,
    ) -> None:
        self.seq_len = _check_int("seq_len", seq_len, 1)
        if mode not in WINDOW_MODES:
            raise ValueError(f"mode must be one of {WINDOW_MODES}, got {mode!r}")
        self.mode = mode
        self.seed = _check_int("seed", seed, 0)
        if not isinstance(epoch_offset, bool):
            raise TypeError(f"epoch_offset must be True or False, got {epoch_offset!r}")
        if epoch_offset and mode != "windows":
            raise ValueError('epoch_offset applies to mode="windows" only; random starts already vary')
        self.epoch_offset = epoch_offset
        if num_samples is not None and mode != "random":
            raise ValueError('num_samples applies to mode="random" only; mode="windows" has exactly one window per slot')
        self.paths = _expand_paths(path)
        self.dtype = ""
        self._files: list[tuple[str, tuple[int, int], int, tuple[int, int, int, int]]] = []
        self._sha256: list[str | None] = []  # each file's checksum from its sidecar, as opened (for fingerprint)
        tokenizer: tuple[str, str] | None = None  # (a file, its tokenizer) from the first file with a sidecar
        metas = []
        for p in self.paths:  # check every file now: a bad shard fails here, not mid-run
            arr, meta = _open_checked(p, dtype, vocab_size, verify)
            if self.dtype and arr.dtype.name != self.dtype:
                raise TokenFileError(
                    f"{p!r} holds {arr.dtype.name} but {self.paths[0]!r} holds {self.dtype}; "
                    "the files of one dataset need one dtype"
                )
            self.dtype = arr.dtype.name
            metas.append(meta)
            self._sha256.append(meta["sha256"] if meta is not None else None)
            if meta is not None:  # ids from two tokenizers mean different things: never mix them
                tokenizer = tokenizer or (p, meta["tokenizer"])
                if meta["tokenizer"] != tokenizer[1]:
                    raise TokenFileError(
                        f"{p!r} was tokenized with {meta['tokenizer']!r} but {tokenizer[0]!r} with "
                        f"{tokenizer[1]!r}; the files of one dataset need one tokenizer"
                    )
            rows, row_len = (1, arr.shape[0]) if arr.ndim == 1 else arr.shape
            self._files.append((p, (int(rows), int(row_len)), int(arr.offset), _file_identity(p)))
        _warn_incomplete_shards(self.paths, metas)
        spare = self.seq_len - 1 if epoch_offset else 0  # tokens an offset may take from the front
        self._per_row = [max(0, (row_len - 1 - spare) // self.seq_len) for _, (_, row_len), _, _ in self._files]
        windows = sum(rows * w for (_, (rows, _), _, _), w in zip(self._files, self._per_row))
        if windows == 0:
            need = 2 * self.seq_len if epoch_offset else self.seq_len + 1
            longest = max(row_len for _, (_, row_len), _, _ in self._files)
            if len(self.paths) > 1:
                where = f"none of the {len(self.paths)} files holds a window: the longest sequence has"
            else:
                where = f"{self.paths[0]!r}: {'each row has' if self._files[0][1][0] > 1 else 'the file has'}"
            raise ValueError(
                f"{where} {longest} tokens; seq_len={self.seq_len} needs at least {need} "
                + ("(two windows, so any offset leaves one)" if epoch_offset else "(one x plus its shifted y)")
            )
        self.num_samples = windows if num_samples is None else _check_int("num_samples", num_samples, 1)
        self._maps: dict[int, np.memmap] = {}  # file index -> its map, least recently used first
        self._tables: tuple[np.ndarray, ...] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = {}  # never pickle mapped data: each worker reopens the files
        state["_tables"] = None  # rebuilt on first use, so a worker's pickle stays small
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def memmap(self, f: int = 0) -> np.memmap:
        """The read-only memmap of file f (1-D), opened lazily in whichever process uses it first."""
        return self._mapped(f)[0]

    def _mapped(self, f: int) -> tuple[np.memmap, np.ndarray]:
        """File f's memmap, and a read-only view of it whose row s is the window of tokens s .. s + seq_len.

        The file is checked on every use, not only on opening: a forked worker inherits the mapping,
        and reading a mapped file that was truncated in place kills the process with a bus error.
        At most _open_file_budget() files stay mapped; the least recently used one is closed first.
        """
        path, (rows, row_len), offset, identity = self._files[f]
        try:
            same = _file_identity(path) == identity
        except FileNotFoundError:
            same = False
        if not same:
            raise TokenFileError(
                f"{path!r} changed since the dataset was opened (size, inode or mtime differ, or it "
                "was removed); build a new dataset after the prep step finishes"
            )
        mapped = self._maps.pop(f, None)  # re-inserted below: a dict keeps insertion order, so last = newest
        if mapped is None:
            tokens = np.memmap(path, dtype=self.dtype, mode="r", offset=offset, shape=(rows * row_len,))
            flat, width = np.asarray(tokens), self.seq_len + 1  # asarray: a plain ndarray, without memmap's hooks
            step = flat.strides[0]  # overlapping rows, one token apart: no copy, nothing read yet
            windows = np.lib.stride_tricks.as_strided(flat, (max(len(flat) - width + 1, 0), width), (step, step), writeable=False)
            mapped = (tokens, windows)
            if len(self._maps) >= _open_file_budget():
                del self._maps[next(iter(self._maps))]  # the least recently used map (and its descriptor) goes
        self._maps[f] = mapped
        return mapped

    def file_summary(self) -> list[dict[str, Any]]:
        """Per file: tokens, sequences (rows), windows, and tokens no window of mode "windows" uses."""
        out = []
        for (path, (rows, row_len), _, _), per_row in zip(self._files, self._per_row):
            used = per_row * self.seq_len + 1 if per_row else 0
            out.append({"path": path, "tokens": rows * row_len, "rows": rows, "windows": rows * per_row,
                        "unused_tokens": rows * (row_len - used)})  # fmt: skip
        return out

    def fingerprint(self) -> dict[str, Any]:
        """What decides this dataset's windows, for comparing runs and ranks: each file's name,
        size, dtype and shape (and sha256 from its sidecar, as it was when the dataset opened the file),
        and the window settings."""
        files = []
        for (path, shape, _, identity), sha256 in zip(self._files, self._sha256):
            files.append({"name": Path(path).name, "bytes": identity[2], "dtype": self.dtype, "shape": list(shape),
                          "sha256": sha256})  # fmt: skip
        return {"files": files, "seq_len": self.seq_len, "mode": self.mode, "num_samples": self.num_samples,
                "seed": self.seed, "epoch_offset": self.epoch_offset}  # fmt: skip

    def __len__(self) -> int:
        return self.num_samples

    def _split_index(self, index: Any) -> tuple[int, int]:
        """(epoch, i) from an int or an (epoch, i) pair, with negative i counted from the end."""
        epoch = 0
        if isinstance(index, tuple):
            if len(index) != 2:
                raise TypeError(f"an index is an int or an (epoch, index) pair, got {index!r}")
            epoch, index = index
            if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
                raise TypeError(f"epoch must be an int >= 0, got {type(epoch).__name__} {epoch!r}")
            if epoch < 0:
                raise ValueError(f"epoch must be an int >= 0, got {epoch}")
        if isinstance(index, (bool, np.bool_)):
            raise TypeError(f"index must be an int, got {index!r}")
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"index must be an int or an (epoch, index) pair, got {type(index).__name__} {index!r}") from None
        n = self.num_samples
        if not -n <= i < n:
            where = repr(self.paths[0]) + (f" and {len(self.paths) - 1} more files" if len(self.paths) > 1 else "")
            raise IndexError(f"index {i} is out of range for {n} windows of {where}")
        return int(epoch), i % n

    def _layout_tables(self) -> tuple[np.ndarray, ...]:
        """Per-file arrays: row length, windows per row, starts per row, and cumulative counts."""
        if self._tables is None:
            rows, row_len = np.array([shape for _, shape, _, _ in self._files], dtype=np.int64).T
            per_row = np.array(self._per_row, dtype=np.int64)
            starts = np.maximum(row_len - self.seq_len, 0)  # valid random starts: 0 .. row_len - seq_len - 1
            window_cum = np.concatenate(([0], np.cumsum(rows * per_row)))  # file f holds [cum[f], cum[f+1])
            start_cum = np.concatenate(([0], np.cumsum(rows * starts)))
            self._tables = (row_len, per_row, starts, window_cum, start_cum)
        return self._tables

    def locate(self, epochs: int | np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """File, row and first-token position of each window, given an array of indices and their
        epochs (one int for all of them, or an array)."""
        row_len, per_row, starts_per_row, window_cum, start_cum = self._layout_tables()
        if self.mode == "windows":
            cum, local = window_cum, indices
        else:
            cum = start_cum
            local = (_keyed_hash(self.seed, 2, epochs, indices) % np.uint64(start_cum[-1])).astype(np.int64)
        one_row = len(cum) == 2 and self._files[0][1][0] == 1  # one 1-D file: rows are all 0, no division
        if len(cum) == 2:  # one file: no search, plain ints
            files = np.zeros(len(local), dtype=np.int64)
            per_row, starts_per_row = int(per_row[0]), int(starts_per_row[0])
        else:  # the file whose range holds each index; a file without windows has an empty range
            files = np.searchsorted(cum[1:], local, side="right").astype(np.int64)
            local = local - cum[files]
            per_row, starts_per_row = per_row[files], starts_per_row[files]
        if self.mode == "windows":
            rows, slot = (files, local) if one_row else np.divmod(local, per_row)
            starts = slot * self.seq_len
            if self.epoch_offset:
                shift = _keyed_hash(self.seed, 1, epochs, np.zeros_like(indices)) % np.uint64(self.seq_len)
                starts += shift.astype(np.int64)
        else:
            rows, starts = (files, local) if one_row else np.divmod(local, starts_per_row)
        return files, rows, starts

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = self._split_index(index)
        files, rows, starts = self.locate(epoch, np.array([i]))
        f, first = int(files[0]), int(rows[0]) * self._files[int(files[0])][1][1] + int(starts[0])
        window = self._mapped(f)[1][first]  # tokens first .. first + seq_len, a view
        return torch.from_numpy(window[:-1].astype(np.int64)), torch.from_numpy(window[1:].astype(np.int64))

    def _batch_keys(self, indices: Sequence[Any]) -> tuple[int | np.ndarray, np.ndarray]:
        """Epochs (one int for all, or an int64 array) and int64 indices of a batch, checked all at once
        when they are plain ints."""
        n = self.num_samples
        if type(indices) is _BatchKeys and indices.bound <= n:  # EpochSampler's: in range by construction
            return indices.epoch, indices.indices
        types = set(map(type, indices))  # type(), not isinstance(): a bool is not an index
        plain = types == {int}
        if plain or (types == {tuple} and set(map(type, itertools.chain.from_iterable(indices))) == {int}):
            with contextlib.suppress(OverflowError, ValueError):  # too large, or ragged: the slow path names it
                keys = np.array(indices, dtype=np.int64)
                if plain:
                    if (keys >= -n).all() and (keys < n).all():
                        return 0, keys % n  # plain ints mean epoch 0
                elif keys.shape[1:] == (2,):
                    epochs, index = keys[:, 0], keys[:, 1]
                    if (epochs >= 0).all() and (index >= -n).all() and (index < n).all():
                        return epochs, index % n
        pairs = [self._split_index(index) for index in indices]  # slow path: names the bad index
        return np.array([e for e, _ in pairs], dtype=np.int64), np.array([i for _, i in pairs], dtype=np.int64)

    def __getitems__(self, indices: Sequence[Any]) -> _Samples:
        """A whole batch in one pass: its windows gathered by one index into one compact (B, seq_len + 1) array."""
        files, rows, starts = self.locate(*self._batch_keys(indices))
        if len(self._files) == 1:
            (rows_in_file, row_len), windows = self._files[0][1], self._mapped(0)[1]
            firsts = starts if rows_in_file == 1 else rows * row_len + starts
            return _Samples(torch.from_numpy(windows[firsts]))  # row b of the batch: tokens firsts[b] .. + seq_len
        firsts = rows * self._layout_tables()[0][files] + starts
        compact = np.empty((len(firsts), self.seq_len + 1), dtype=self.dtype)
        order = np.argsort(files, kind="stable")  # file by file: one map in use at a time, however many files
        bounds = np.flatnonzero(np.diff(files[order])) + 1
        for group in np.split(order, bounds):
            compact[group] = self._mapped(int(files[group[0]]))[1][firsts[group]]
        return _Samples(torch.from_numpy(compact))


class _Window(tuple):
    """One (x, y) sample of a batch from __getitems__. torch's default_collate, meeting one, hands the
    whole batch to collate_windows (registered for this type below) instead of stacking B samples."""

    __slots__ = ()


class _Samples(Sequence):
    """What __getitems__ returns: a batch's compact windows, which read as B (x_i, y_i) samples when a
    collate function asks for them (widened only then); collate_windows takes the windows whole."""

    def __init__(self, windows: torch.Tensor) -> None:
        self.windows = windows
        self._samples: list[_Window] | None = None

    def _rows(self) -> list[_Window]:
        if self._samples is None:
            x, y = _widen(self.windows)
            self._samples = [_Window(pair) for pair in zip(x.unbind(), y.unbind())]
        return self._samples

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> _Window:
        if self._samples is None and isinstance(i, int):  # one sample: default_collate looks at the first
            x, y = _widen(self.windows[i].unsqueeze(0))
            return _Window((x[0], y[0]))
        return self._rows()[i]

    def __iter__(self) -> Iterator[_Window]:
        return iter(self._rows())


PICKLE_BY_VALUE_MAX_BYTES = 1 << 20  # TokenBatches up to 1 MiB go from a worker to the main process by value


class TokenBatch(Sequence):
    """A batch of windows as the file stores them: one (B, seq_len + 1) uint16 or uint32 tensor.

    It reads as the pair a DataLoader usually yields: `x, y = batch` (or batch[0], batch[1]) gives
    int64 x and y, widened once, on first use, on the device the windows are on. to_device(batch,
    device) and batch.to(device) (which frameworks such as Lightning and Accelerate call) copy the
    compact ids instead: a quarter of the bytes of int64 for uint16, widened on the device.
    """

    def __init__(self, windows: torch.Tensor) -> None:
        self.windows = windows
        self._pair: tuple[torch.Tensor, torch.Tensor] | None = None

    def pin_memory(self) -> TokenBatch:
        return TokenBatch(self.windows.pin_memory())

    def to(self, device: str | torch.device, non_blocking: bool = False) -> TokenBatch:
        return TokenBatch(self.windows.to(device, non_blocking=non_blocking))

    def _widened(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pair is None:
            self._pair = _widen(self.windows)
        return self._pair

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        return self._widened()[i]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._widened())

    def __repr__(self) -> str:
        return f"TokenBatch(windows of shape {tuple(self.windows.shape)}, {self.windows.dtype})"

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """How a DataLoader worker sends the batch to the main process: a small batch as its bytes,
        through the worker's pipe. torch would move the tensor to shared memory instead, which costs
        a new shared-memory file, a mapping and a file descriptor per batch; below about a megabyte
        that costs more than the copy (3x more for a (12, 513) uint16 batch on 2 cores)."""
        windows = self.windows
        if windows.device.type != "cpu" or windows.nbytes > PICKLE_BY_VALUE_MAX_BYTES:
            return TokenBatch, (windows,)  # torch's own reduction: shared memory (or the device's)
        return _token_batch_from_array, (windows.numpy(),)


def _token_batch_from_array(windows: np.ndarray) -> TokenBatch:
    """TokenBatch.__reduce__'s other half: the unpickled ids, as a tensor sharing their memory."""
    return TokenBatch(torch.from_numpy(windows))


def _widen(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (B, seq_len + 1) unsigned ids into int64 x and y, contiguous and not overlapping."""
    if windows.device.type != "cpu":
        return _widen_on_device(windows)
    compact = windows.numpy()
    pair = np.empty((2, compact.shape[0], compact.shape[1] - 1), dtype=np.int64)
    pair[0], pair[1] = compact[:, :-1], compact[:, 1:]  # numpy widens unsigned ids directly
    return torch.from_numpy(pair[0]), torch.from_numpy(pair[1])


def _widen_on_device(windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """_widen for devices without unsigned kernels: widen the same bits as signed ints, then mask."""
    rows, width = windows.shape
    bits = 8 * windows.element_size()
    signed = windows.view(torch.int16 if bits == 16 else torch.int32)
    pair = torch.empty((2, rows, width - 1), dtype=torch.int64, device=windows.device)
    pair[0], pair[1] = signed[:, :-1], signed[:, 1:]
    pair.bitwise_and_((1 << bits) - 1)
    return pair[0], pair[1]


def collate_windows(batch: Sequence[Any], *, collate_fn_map: Any = None) -> Any:
    """Collate for NpyTokensDataset: wraps the windows its __getitems__ gathered, copying nothing.

    torch's default_collate calls it too, for the samples of such a batch, so a plain
    DataLoader(dataset, batch_size=B) also yields the compact TokenBatch; anything else is collated
    as default_collate does (collate_fn_map is the keyword torch passes; it is not used)."""
    if isinstance(batch, _Samples):
        return TokenBatch(batch.windows)
    return default_collate([tuple(s) if type(s) is _Window else s for s in batch])


default_collate_fn_map[_Window] = collate_windows  # the way torch documents to extend default_collate


class _BatchKeys(Sequence):
    """One batch from EpochSampler: an epoch and an int64 array of indices. NpyTokensDataset reads
    it whole; any other dataset sees a sequence of (epoch, index) pairs."""

    __slots__ = ("epoch", "indices", "bound")

    def __init__(self, epoch: int, indices: np.ndarray, bound: int) -> None:
        self.epoch, self.indices, self.bound = epoch, indices, bound  # every index is in [0, bound)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, int]:
        return self.epoch, int(self.indices[i])

    def __repr__(self) -> str:
        return f"_BatchKeys(epoch={self.epoch}, indices={self.indices.tolist()})"


SAMPLER_STATE_FORMAT = "npy_datasets.EpochSampler"
REMAINDERS = ("drop", "pad")  # what a rank does when world_size does not divide an epoch


class EpochSampler(Sampler):
    """A fresh order of a dataset's windows each epoch, for one rank: (epoch, index) pairs, or batches.

    The order of epoch e is a permutation of range(n) drawn from (seed, e) alone (range(n) with
    shuffle=False), the same on every rank. With world_size W (default: torch.distributed's, once it
    is initialised) rank r takes items r, r + W, r + 2W, ... of it, so ranks are disjoint and
    together cover the epoch, whatever the number of DataLoader workers. When W does not divide n,
    remainder="drop" leaves out the epoch's last n % W items (other ones each shuffled epoch) and
    remainder="pad" repeats its first W - n % W items: see .dropped and .padded.

    batch_size=B makes it a batch sampler for DataLoader(batch_sampler=...): each batch reaches
    NpyTokensDataset.__getitems__ as one array; drop_last drops a rank's short last batch.

    Each iteration starts the next epoch, so persistent workers never need telling; set_epoch(e)
    picks the next one. state_dict() / load_state_dict() carry the position in the epoch's order
    (as torchdata's StatefulDataLoader expects of a sampler); ResumableDataLoader uses them to resume
    after exactly the batches a training loop received.
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
        self.num_samples = len(data_source)
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        self.shuffle, self.drop_last = shuffle, drop_last
        self.seed = _check_int("seed", seed, 0)
        self.batch_size = None if batch_size is None else _check_int("batch_size", batch_size, 1)
        if world_size is None and rank is None:
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            world_size, rank = (torch.distributed.get_world_size(), torch.distributed.get_rank()) if distributed else (1, 0)
        elif world_size is None or rank is None:
            raise ValueError(f"pass both world_size and rank, or neither; got world_size={world_size}, rank={rank}")
        self.world_size = _check_int("world_size", world_size, 1)
        self.rank = _check_int("rank", rank, 0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}) for world_size={self.world_size}, got {self.rank}")
        if remainder not in REMAINDERS:
            raise ValueError(f"remainder must be one of {REMAINDERS}, got {remainder!r}")
        self.remainder = remainder
        if self.num_samples < 1:
            raise ValueError("EpochSampler needs a dataset with at least one window")
        if remainder == "drop" and self.num_samples < self.world_size:
            raise ValueError(
                f"{self.num_samples} windows for world_size={self.world_size}: with remainder=\"drop\" no rank "
                "would get one; use remainder=\"pad\", fewer ranks or a shorter seq_len"
            )
        if len(self) == 0:  # drop_last with a share smaller than one batch: an epoch would train on nothing
            raise ValueError(
                f"batch_size={self.batch_size} with drop_last=True leaves no batch: each of the {self.world_size} "
                f"rank(s) gets {self._rank_items(0)} of the {self.num_samples} windows; use a smaller batch_size, "
                "fewer ranks, a shorter seq_len or drop_last=False"
            )
        self._fingerprint = data_source.fingerprint() if hasattr(data_source, "fingerprint") else None
        self.epoch = 0
        self._start = 0  # where in the epoch's order the next iteration begins (set by load_state_dict)
        self._live: dict[str, int] | None = None  # the iteration in progress: epoch, start, items handed out

    @property
    def dropped(self) -> int:
        """Windows of a whole epoch that no rank sees (remainder="drop")."""
        return self.num_samples % self.world_size if self.remainder == "drop" else 0

    @property
    def padded(self) -> int:
        """Windows of a whole epoch that two ranks see (remainder="pad")."""
        return -self.num_samples % self.world_size if self.remainder == "pad" else 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._start = _check_int("epoch", epoch, 0), 0

    def _rank_items(self, start: int) -> int:
        """How many items this rank gets from an epoch entered at position start."""
        left = self.num_samples - start
        return left // self.world_size if self.remainder == "drop" else -(-left // self.world_size)

    def _yielded(self, items: int) -> int:
        """How many items an iteration of `items` items hands out (whole batches only with drop_last)."""
        return items - items % self.batch_size if self.batch_size and self.drop_last else items

    def __len__(self) -> int:
        items = self._yielded(self._rank_items(0))
        return items if self.batch_size is None else -(-items // self.batch_size)

    def order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's indices of `epoch`, from position `start` of the epoch's order on."""
        n, world = self.num_samples, self.world_size
        full = np.random.default_rng([self.seed, epoch]).permutation(n) if self.shuffle else np.arange(n)
        rest = full[start:]
        extra = len(rest) % world
        if extra and self.remainder == "drop":
            rest = rest[: len(rest) - extra]
        elif extra:
            rest = np.concatenate((rest, np.resize(full, world - extra)))  # repeat the epoch's first items
        return rest[self.rank :: world]

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing happens until the first item is asked for, so an iterator that a
        # DataLoader makes and drops unused does not use up an epoch.
        epoch, start = self.epoch, self._start
        self.epoch, self._start = epoch + 1, 0
        mine = self.order(epoch, start)
        stop = self._yielded(len(mine))
        live = self._live = {"epoch": epoch, "start": start, "handed": 0, "stop": stop}
        if self.batch_size is None:
            for k, i in enumerate(mine[:stop].tolist(), 1):
                live["handed"] = k
                yield epoch, i
        else:
            for lo in range(0, stop, self.batch_size):
                live["handed"] = min(lo + self.batch_size, stop)
                yield _BatchKeys(epoch, mine[lo : lo + self.batch_size], self.num_samples)

    def _state(self, epoch: int, start: int, items: int, stop: int) -> dict[str, Any]:
        """The state after this rank took `items` of the `stop` items an iteration entered at start."""
        position = start + items * self.world_size
        if items >= stop or position >= self.num_samples:
            epoch, position = epoch + 1, 0
        return {
            "format": SAMPLER_STATE_FORMAT, "version": 1, "epoch": epoch, "position": position,
            "num_samples": self.num_samples, "shuffle": self.shuffle, "seed": self.seed,
            "dataset": self._fingerprint,
        }  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Where the next item comes from: epoch and position in the epoch's order (JSON-ready).

        Counts what this sampler handed out; with DataLoader workers that runs ahead of what the
        training loop received, so use ResumableDataLoader.state_dict() for checkpoints."""
        live = self._live
        if live is None or live["handed"] >= live["stop"]:
            return self._state(self.epoch, self._start, 0, 1)
        return self._state(live["epoch"], live["start"], live["handed"], live["stop"])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict(): the next iteration starts exactly where that one stopped.

        The state must come from the same windows (files, seq_len, mode, seed, num_samples) and the
        same shuffle seed; another world_size or batch_size continues from the same position."""
        if not isinstance(state, dict) or state.get("format") != SAMPLER_STATE_FORMAT:
            raise ValueError(f"not an EpochSampler state (expected \"format\": {SAMPLER_STATE_FORMAT!r}): {state!r:.200}")
        if state.get("version") != 1:
            raise ValueError(f"EpochSampler state version {state.get('version')!r} is not supported; expected 1")
        mine = self._state(0, 0, 0, 1)
        if set(state) != set(mine):
            raise ValueError(f"EpochSampler state: expected the keys {sorted(mine)}, found {sorted(state)}")
        _compare_fingerprints(state.get("dataset"), self._fingerprint, "the saved state", "this dataset")
        for key in ("num_samples", "shuffle", "seed"):
            if state.get(key) != mine[key]:
                raise ValueError(f"EpochSampler state: {key} is {state.get(key)!r} in the state, {mine[key]!r} here")
        epoch, position = state["epoch"], state["position"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"EpochSampler state: epoch must be an int >= 0, got {epoch!r}")
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < self.num_samples:
            raise ValueError(f"EpochSampler state: position must be an int in [0, {self.num_samples}), got {position!r}")
        self.epoch, self._start, self._live = epoch, position, None


_CAUSES_FIRST = ("files", "name", "bytes", "dtype", "shape", "seq_len", "mode", "epoch_offset", "seed")


def _causes_first(keys: set[str]) -> list[str]:
    """Fingerprint fields in the order a difference is reported: the settings before num_samples,
    which follows from them, and a file's name before its size (other fields after, by name)."""
    return sorted(keys, key=lambda k: (_CAUSES_FIRST.index(k) if k in _CAUSES_FIRST else len(_CAUSES_FIRST), k))


def _compare_fingerprints(a: Any, b: Any, a_name: str, b_name: str) -> None:
    """Raise naming the first field in which two dataset fingerprints differ."""
    if a == b:
        return
    if not (isinstance(a, dict) and isinstance(b, dict)):
        raise ValueError(f"dataset fingerprint differs: {a_name} has {a!r:.120}, {b_name} has {b!r:.120}")
    for key in _causes_first(set(a) | set(b)):
        if key == "files" and isinstance(a.get(key), list) and isinstance(b.get(key), list):
            fa, fb = a[key], b[key]
            if len(fa) != len(fb):
                raise ValueError(f"dataset differs: {a_name} has {len(fa)} files, {b_name} has {len(fb)}")
            for i, (x, y) in enumerate(zip(fa, fb)):
                for field in _causes_first(set(x) | set(y)):
                    if x.get(field) != y.get(field):
                        raise ValueError(
                            f"dataset differs in file {i} ({y.get('name')!r}): {field} is {x.get(field)!r} "
                            f"in {a_name}, {y.get(field)!r} in {b_name}"
                        )
        elif a.get(key) != b.get(key):
            raise ValueError(f"dataset differs: {key} is {a.get(key)!r} in {a_name}, {b.get(key)!r} in {b_name}")


class ResumableDataLoader(DataLoader):
    """A DataLoader over an EpochSampler batch_sampler whose state_dict() counts the batches the
    training loop has received, so a resumed run continues exactly after them, with any number
    of workers (prefetched batches are not counted) and without replaying any."""

    def __iter__(self) -> Iterator[Any]:
        sampler = self.batch_sampler
        if not isinstance(sampler, EpochSampler) or sampler.batch_size is None:  # else each (epoch, i) is a "batch"
            raise TypeError("ResumableDataLoader needs batch_sampler=EpochSampler(dataset, batch_size=...)")
        epoch, start = sampler.epoch, sampler._start  # the iteration about to begin (the sampler is lazy)
        stop = sampler._yielded(sampler._rank_items(start))
        self._progress = [epoch, start, stop, 0]
        batches = super().__iter__() if self.num_workers > 0 else self._in_process()
        return self._count(batches, self._progress)

    def _in_process(self) -> Iterator[Any]:
        """What torch's single-process iterator does for each batch (keys from the sampler, one
        __getitems__, collate, pin) without its per-batch profiler range, which costs more than
        gathering a small batch; the range is kept while a torch profiler is running."""
        fetch = getattr(self.dataset, "__getitems__", None)
        for keys in self.batch_sampler:
            with record_function("ResumableDataLoader.__next__") if torch.autograd._profiler_enabled() else contextlib.nullcontext():
                batch = self.collate_fn(fetch(keys) if fetch else [self.dataset[k] for k in keys])
                if self.pin_memory:
                    batch = pin_memory(batch)
            yield batch

    @staticmethod
    def _count(batches: Iterator[Any], progress: list[int]) -> Iterator[Any]:
        for batch in batches:
            progress[3] += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches received so far (JSON-ready); save it with the model."""
        progress = getattr(self, "_progress", None)
        if progress is None:
            return self.batch_sampler.state_dict()
        epoch, start, stop, batches = progress
        return self.batch_sampler._state(epoch, start, min(batches * self.batch_sampler.batch_size, stop), stop)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next iteration continues where the saved one stopped (see EpochSampler.load_state_dict)."""
        self.batch_sampler.load_state_dict(state)
        self._progress = None


def default_num_workers() -> int:
    """DataLoader workers for this machine: none below 4 usable cores or on Windows, else up to 4."""
    try:
        cores = len(os.sched_getaffinity(0))  # respects taskset / container CPU limits
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        cores = os.cpu_count() or 1
    if os.name == "nt" or cores < 4:  # spawn start-up and inter-process copies cost more than they save
        return 0
    return min(4, cores // 2)


def make_dataloaders(
    train: NpyTokensDataset,
    val: NpyTokensDataset,
    batch_size: int,
    *,
    num_workers: int | None = None,
    seed: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    world_size: int | None = None,
    rank: int | None = None,
) -> tuple[ResumableDataLoader, ResumableDataLoader]:
    """Train (shuffled, drop_last) and validation (in order, every window) DataLoaders.

    Each batch is gathered in one pass and arrives as a compact TokenBatch (see to_device). Under
    torch.distributed (or with world_size and rank given) each rank gets its own disjoint share:
    train drops the epoch's last world_size - 1 windows at most, validation repeats at most as many
    so every rank runs the same number of steps; with torch.distributed initialised, the ranks first
    check that they see the same files and settings.
    """
    for name, ds in (("train", train), ("val", val)):
        if not isinstance(ds, NpyTokensDataset):
            raise TypeError(f"{name} must be an NpyTokensDataset, got {type(ds).__name__}")
    batch_size = _check_int("batch_size", batch_size, 1)
    workers = default_num_workers() if num_workers is None else _check_int("num_workers", num_workers, 0)
    pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
    extra: dict[str, Any] = {}
    if workers > 0:  # these options are refused by DataLoader without workers
        extra = {"persistent_workers": True, "prefetch_factor": _check_int("prefetch_factor", prefetch_factor, 1)}
    ranks = {"world_size": world_size, "rank": rank}
    train_sampler = EpochSampler(train, shuffle=True, seed=seed, batch_size=batch_size, drop_last=True, remainder="drop", **ranks)
    val_sampler = EpochSampler(val, shuffle=False, batch_size=batch_size, remainder="pad", **ranks)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        verify_across_ranks({"train": train.fingerprint(), "val": val.fingerprint(), "batch_size": batch_size, "seed": seed})
    loaders = tuple(
        ResumableDataLoader(ds, batch_sampler=sampler, num_workers=workers, pin_memory=pin, collate_fn=collate_windows, **extra)
        for ds, sampler in ((train, train_sampler), (val, val_sampler))
    )  # fmt: skip
    return loaders  # type: ignore[return-value]


def verify_across_ranks(settings: dict[str, Any], group: Any = None) -> None:
    """Check that every rank of torch.distributed passes the same JSON-able settings (for example a
    dataset's fingerprint()); raise on every rank, naming the first rank that differs and how."""
    dist = torch.distributed
    world = dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
    mine = json.dumps(settings, sort_keys=True).encode()
    size = torch.tensor([len(mine)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    buf = torch.zeros(longest, dtype=torch.uint8, device=device)
    buf[: len(mine)] = torch.frombuffer(bytearray(mine), dtype=torch.uint8)
    bufs = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(bufs, buf, group=group)  # tensors only: nothing is pickled
    seen = [bytes(b[: int(s.item())].cpu().tolist()) for b, s in zip(bufs, sizes)]
    for r, other in enumerate(seen):
        if other != seen[0]:
            first, theirs = json.loads(seen[0]), json.loads(other)
            for key in sorted(set(first) | set(theirs)):
                a, b = first.get(key), theirs.get(key)
                if a != b and isinstance(a, dict) and isinstance(b, dict):
                    try:
                        _compare_fingerprints(a, b, "rank 0", f"rank {r}")
                    except ValueError as e:
                        raise RuntimeError(f"rank {r} sees other data than rank 0 in {key!r}: {e}") from None
                if a != b:
                    raise RuntimeError(f"rank {r} differs from rank 0: {key} is {a!r} on rank 0, {b!r} on rank {r}")


def to_device(batch: TokenBatch | Sequence[torch.Tensor], device: str | torch.device) -> tuple[torch.Tensor, ...]:
    """Move a batch to device (asynchronously from pinned memory); a TokenBatch is widened there."""
    device = torch.device(device)
    if isinstance(batch, TokenBatch):
        if device.type == "cpu":
            return _widen(batch.windows)
        return _widen(batch.windows.to(device, non_blocking=batch.windows.is_pinned()))
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)
