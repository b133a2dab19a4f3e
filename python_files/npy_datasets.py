"""Serve (x, y) next-token windows from token files on disk, without loading them into RAM.

Copy this one file into your project: it needs Python 3.11+, numpy, torch and the standard library only.

    import torch
    from npy_datasets import NpyTokensDataset, make_dataloaders, to_device

    train = NpyTokensDataset("data/tinystories/train.npy", seq_len=256)  # or a list or glob of shards
    val = NpyTokensDataset("data/tinystories/validation.npy", seq_len=256)
    train_loader, val_loader = make_dataloaders(train, val, batch_size=32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for step, batch in enumerate(train_loader, 1):
        x, y = to_device(batch, device)  # int64, (32, 256) each: y is x shifted by one token
        ...  # loss = model(x, y); checkpoint train_loader.sampler.state_dict(consumed=step) with it

The public API, in the order the data flows (the sections of this file); importing the file imports
numpy only (torch where it is used), so a torch-free prep step can share the format half:
    open_tokens(path)                 check a token file (.npy + JSON sidecar, llm.c shard, raw .bin), map it
    NpyTokensDataset(path, seq_len)   (x, y) windows of one file or many; ds[epoch, indices] is a whole batch
    EpochSampler(ds, batch_size=B)    a new order each epoch, one share per rank, state_dict() to resume
    make_dataloaders(train, val, B)   the two DataLoaders; to_device(batch, device) moves a batch
"""

from __future__ import annotations

import ast
import errno
import glob
import hashlib
import json
import operator
import os
import stat
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

__all__ = [
    "FORMAT_VERSION",
    "TokenFileError",
    "token_dtype",
    "sidecar_path",
    "check_token_dtype",
    "probe_sha256",
    "read_npy_header",
    "read_sidecar",
    "open_tokens",
    "NpyTokensDataset",
    "EpochSampler",
    "make_dataloaders",
    "verify_across_ranks",
    "to_device",
]

# ---- 1. The file format ------------------------------------------------------------------------

FORMAT_VERSION = 1  # version of the JSON sidecar written beside each token file
TOKEN_DTYPES = ("uint16", "uint32")  # uint16 holds ids < 65,536 (GPT-2: 50,257); uint32 the rest
NPY_MAGIC = b"\x93NUMPY"
NPY_VERSIONS = {
    (1, 0): (2, "latin1"),
    (2, 0): (4, "latin1"),
    (3, 0): (4, "utf8"),
}  # header length bytes, encoding
MAX_NPY_HEADER = 10_000  # bytes; numpy's own default limit, checked before anything is parsed
LLMC_HEADER_BYTES = 256 * 4  # llm.c shards: 256 int32 words (magic, version, token count, unused)
LLMC_FORMATS = {
    20240520: (1, np.dtype("<u2")),
    20240801: (7, np.dtype("<u4")),
}  # magic: (version, dtype)
LLMC_LIKE = range(
    20240000, 20300000
)  # a date as first word: an llm.c file, perhaps one we cannot read
PROBE_BYTES = (
    1 << 16
)  # a sidecar's probe_sha256 hashes a file's first and last 64 KiB: cheap on every open
MAX_OPEN_FILES = 1024  # files one process keeps mapped (each holds a descriptor); LRU beyond, so keep it above the shards


class TokenFileError(ValueError):
    """A token file, or its sidecar, is not what the loader can read safely."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    """An int (or numpy integer, never a bool) that is at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def token_dtype(n_vocab: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id of a vocabulary of n_vocab tokens."""
    if _check_int("n_vocab", n_vocab, 1) > 2**32:
        raise ValueError(f"n_vocab {n_vocab} does not fit uint32 (at most 2**32 ids)")
    return np.dtype("<u2" if n_vocab <= 2**16 else "<u4")  # ids 0 .. n_vocab - 1 all fit


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where the JSON sidecar of a token file lives: the file's name with '.json' appended."""
    return Path(path).with_name(Path(path).name + ".json")


def check_token_dtype(dtype: Any, where: str) -> np.dtype:
    """A token dtype as little-endian uint16 or uint32, or a TokenFileError naming what would be valid."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy raises either for a malformed dtype string
        raise TokenFileError(
            f"{where}: {dtype!r} is not a dtype; expected one of {TOKEN_DTYPES}"
        ) from None
    if dt.kind != "u" or dt.itemsize not in (2, 4) or dt.byteorder == ">":
        raise TokenFileError(
            f"{where}: dtype {dt.str!r} is not supported; expected little-endian {TOKEN_DTYPES} "
            "(convert with arr.astype(np.uint16) if every id is below 65,536)"
        )
    return dt.newbyteorder("<")


def probe_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's first PROBE_BYTES and its last PROBE_BYTES after those (all of a file under twice that
    size): tells apart files of one size, say two swapped shards, without reading them whole."""
    with open(path, "rb") as f:
        head = f.read(PROBE_BYTES)
        f.seek(max(len(head), os.fstat(f.fileno()).st_size - PROBE_BYTES))
        return hashlib.sha256(head + f.read(PROBE_BYTES)).hexdigest()


def _file_size(path: Path) -> int:
    """Size in bytes of a regular, non-empty file, or a clear error for anything else."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"token file {str(path)!r} does not exist") from None
    except OSError as e:  # a permission, a link loop, ...
        raise TokenFileError(f"token file {str(path)!r} cannot be read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise TokenFileError(f"token file {str(path)!r} is {kind}; expected a .npy or .bin file")
    if st.st_size == 0:
        raise TokenFileError(f"token file {str(path)!r} is empty (0 bytes); re-run the prep step")
    return st.st_size


def read_npy_header(path: str | os.PathLike) -> tuple[np.dtype, tuple[int, ...], int]:
    """Parse a .npy header as a literal, never with numpy's loader: (dtype, shape, data offset). Sizes are
    checked before anything is parsed, and the data must fill the file exactly: no pickle, nothing cut."""
    name, size = repr(str(path)), _file_size(Path(path))
    with open(path, "rb") as f:
        if (pre := f.read(8))[:6] != NPY_MAGIC:
            raise TokenFileError(
                f"{name} is not a .npy file: it starts with {pre[:6]!r}, expected {NPY_MAGIC!r} "
                "(for a raw headerless token file use the .bin suffix)"
            )
        if len(pre) < 8:
            raise TokenFileError(f"{name}: truncated .npy preamble ({size} bytes)")
        if (version := (pre[6], pre[7])) not in NPY_VERSIONS:
            raise TokenFileError(
                f"{name}: unsupported .npy version {pre[6]}.{pre[7]}; expected 1.0, 2.0 or 3.0"
            )
        len_bytes, encoding = NPY_VERSIONS[version]
        if len(raw := f.read(len_bytes)) < len_bytes:
            raise TokenFileError(f"{name}: truncated .npy header ({size} bytes)")
        if (header_len := int.from_bytes(raw, "little")) > MAX_NPY_HEADER:
            raise TokenFileError(
                f"{name}: .npy header of {header_len} bytes is larger than the {MAX_NPY_HEADER} allowed"
            )
        if (offset := 8 + len_bytes + header_len) > size:
            raise TokenFileError(f"{name}: truncated header: need {offset} bytes, file has {size}")
        text = f.read(header_len).decode(encoding, errors="replace")
    try:
        header = ast.literal_eval(text)
    except (
        ValueError,
        TypeError,
        SyntaxError,
        MemoryError,
        RecursionError,
    ):  # TypeError: {[1]: 2}, unhashable
        raise TokenFileError(
            f"{name}: .npy header is not a Python literal: {text[:80]!r}"
        ) from None
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        keys = sorted(map(str, header)) if isinstance(header, dict) else type(header).__name__
        raise TokenFileError(
            f"{name}: .npy header must have keys descr, fortran_order, shape; found {keys}"
        )
    if not isinstance(header["descr"], str):
        raise TokenFileError(f"{name}: structured dtype {header['descr']!r} is not a token array")
    dtype, shape = check_token_dtype(header["descr"], name), header["shape"]
    if header["fortran_order"] is not False:
        raise TokenFileError(
            f"{name}: fortran_order={header['fortran_order']!r}; expected False (C order)"
        )
    if not (
        isinstance(shape, tuple)
        and len(shape) in (1, 2)
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise TokenFileError(f"{name}: expected a 1-D or 2-D token array, got shape {shape!r}")
    if (expected := offset + dtype.itemsize * int(np.prod(shape, dtype=object))) != size:
        problem = "is truncated" if expected > size else "has trailing bytes"
        raise TokenFileError(
            f"{name} {problem}: shape {shape} of {dtype.name} needs {expected} bytes, file has {size}"
        )
    if 0 in shape:
        raise TokenFileError(f"{name} holds no tokens (shape {shape})")
    return dtype, shape, offset


SIDECAR_FIELDS = {
    "format": str,
    "format_version": int,
    "file": str,
    "layout": str,
    "dtype": str,
    "shape": list,
    "n_tokens": int,
    "file_size": int,
    "sha256": str,
    "tokenizer": str,
    "n_vocab": int,
    "eot_id": int,
    "eot_placement": str,
    "max_token_id": int,
}
# Optional sidecar fields: probe_sha256 (checked when present), shard and settings_fingerprint (a shard set's).


def read_sidecar(path: str | os.PathLike) -> dict[str, Any] | None:
    """Read and type-check the JSON sidecar of a token file; None when there is none."""
    side = sidecar_path(path)
    if not side.exists():
        return None
    if not side.is_file():  # reading a FIFO would block until someone writes to it
        raise TokenFileError(
            f"sidecar {str(side)!r} is not a regular file; expected a JSON file or none"
        )
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (
        UnicodeDecodeError,
        ValueError,
        RecursionError,
    ) as e:  # ValueError: bad JSON, or a 5,000-digit int
        raise TokenFileError(
            f"sidecar {str(side)!r} is not valid JSON ({e}); delete it and re-run the prep step"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != "npy-tokens":
        raise TokenFileError(
            f'sidecar {str(side)!r}: expected an object with "format": "npy-tokens"'
        )
    for key, typ in SIDECAR_FIELDS.items():
        if type(meta.get(key)) is not typ:  # exact types: a JSON true is not an int
            raise TokenFileError(
                f"sidecar {str(side)!r}: field {key!r} should be {typ.__name__}, found {meta.get(key)!r}"
            )
    if not 1 <= (version := meta["format_version"]) <= FORMAT_VERSION:
        why = (
            "is not a version (1, 2, ...)"
            if version < 1
            else f"is newer than this module's {FORMAT_VERSION}; update npy_datasets.py"
        )
        raise TokenFileError(f"sidecar {str(side)!r}: format_version {version} {why}")
    return meta


class FileLayout(NamedTuple):
    """Where a token file keeps its ids."""

    layout: str  # "npy", "llmc" (both found from the first bytes) or "bin" (raw ids, no header)
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # bytes before the first id


def _file_layout(path: Path, dtype: Any, meta: dict[str, Any] | None) -> FileLayout:
    """A file's layout, from its first bytes: the .npy magic (a sidecar that says otherwise is refused later), an
    llm.c header (256 int32 words: a date-like magic, version, count, a few more, then zeros) unless a sidecar
    says "bin", or else raw ids, their dtype from the sidecar or the argument."""
    name, size, raw = (
        repr(str(path)),
        _file_size(path),
        meta is not None and meta["layout"] == "bin",
    )
    with open(path, "rb") as f:
        first = f.read(LLMC_HEADER_BYTES)
    magic, version, count = np.frombuffer(first[:12].ljust(12, b"\0"), dtype="<i4").tolist()
    if first[:6] == NPY_MAGIC or (path.suffix == ".npy" and not raw):
        found = FileLayout("npy", *read_npy_header(path))
    elif (
        not raw and size >= 8 and magic in LLMC_LIKE and not first[32:].strip(b"\0")
    ):  # text ids are never all zeros
        if magic not in LLMC_FORMATS:
            raise TokenFileError(
                f"{name} starts with the llm.c-like magic {magic}, which this loader does not read; "
                "known: 20240520 (version 1, uint16) and 20240801 (version 7, uint32)"
            )
        if size < LLMC_HEADER_BYTES:
            raise TokenFileError(
                f"{name}: truncated llm.c header: need {LLMC_HEADER_BYTES} bytes, file has {size}"
            )
        if version != LLMC_FORMATS[magic][0]:
            raise TokenFileError(
                f"{name}: llm.c magic {magic} goes with version {LLMC_FORMATS[magic][0]}, found {version}"
            )
        if count <= 0:
            raise TokenFileError(
                f"{name}: llm.c header declares {count} tokens; a shard holds at least one"
            )
        found = FileLayout("llmc", LLMC_FORMATS[magic][1], (count,), LLMC_HEADER_BYTES)
        if (expected := LLMC_HEADER_BYTES + count * found.dtype.itemsize) != size:
            raise TokenFileError(
                f"{name}: llm.c header declares {count} tokens of {found.dtype.name} ({expected} bytes "
                f"with the header), but the file has {size} bytes"
            )
    elif dtype is None and meta is None:
        raise TokenFileError(
            f"{name} is a raw token file with no sidecar {sidecar_path(path).name!r}: "
            "pass dtype=np.uint16 (nanoGPT's train.bin) or dtype=np.uint32"
        )
    else:
        dt = check_token_dtype(
            dtype if meta is None else meta["dtype"],
            "dtype argument" if meta is None else "sidecar",
        )
        if size % dt.itemsize:
            raise TokenFileError(
                f"{name}: size {size} bytes is not a multiple of {dt.itemsize} ({dt.name})"
            )
        found = FileLayout("bin", dt, (size // dt.itemsize,), 0)
    if dtype is not None and check_token_dtype(dtype, "dtype argument") != found.dtype:
        what = {"npy": "holds", "llmc": "is an llm.c shard of", "bin": "has a sidecar that says"}[
            found.layout
        ]
        raise TokenFileError(
            f"{name} {what} {found.dtype.name} but dtype={np.dtype(dtype).name} was passed"
        )
    return found


def open_tokens(
    path: str | os.PathLike,
    dtype: Any = None,
    *,
    vocab_size: int | None = None,
    verify: bool = False,
) -> np.memmap:
    """Open a token file as a read-only memmap, after checking it and its sidecar. The format comes from the
    first bytes: .npy, an llm.c shard, or else raw ids such as nanoGPT's train.bin (dtype= where no sidecar
    says it). vocab_size refuses an id at or past it: the sidecar's max_token_id, or without a sidecar one scan.
    verify=True also checks the file's sha256 against the sidecar's (a whole read)."""
    return _open_checked(Path(path), dtype, vocab_size, verify)[0]


def _open_checked(
    path: Path, dtype: Any, vocab_size: int | None, verify: bool
) -> tuple[np.memmap, dict[str, Any]]:
    """open_tokens, also returning the sidecar it checked the file against ({} without one): read once."""
    _file_size(path)  # a missing, empty or irregular file is refused before its sidecar is read
    meta = read_sidecar(path)
    found, side = _file_layout(path, dtype, meta), str(sidecar_path(path))
    if meta is None and verify:
        raise TokenFileError(f"verify=True needs the sidecar {side!r}, which is missing")
    if meta is not None:  # the sidecar must describe this very file
        actual = {
            "layout": found.layout,
            "dtype": found.dtype.name,
            "shape": list(found.shape),
            "n_tokens": int(np.prod(found.shape, dtype=object)),
            "file_size": os.stat(path).st_size,
        }
        for key in [k for k in actual if meta[k] != actual[k]][:1]:
            raise TokenFileError(
                f"sidecar {side!r} disagrees with {str(path)!r}: {key} is {meta[key]!r} in the "
                f"sidecar, {actual[key]!r} in the file; re-run the prep step"
            )
        for key in [k for k in ("max_token_id", "eot_id") if not 0 <= meta[k] < meta["n_vocab"]][
            :1
        ]:
            raise TokenFileError(
                f"sidecar {side!r}: {key} {meta[key]} is outside the vocabulary (n_vocab {meta['n_vocab']})"
            )
        if (
            "probe_sha256" in meta and probe_sha256(path) != meta["probe_sha256"]
        ):  # older sidecars have none
            raise TokenFileError(
                f"{str(path)!r}: its first and last {PROBE_BYTES // 1024} KiB differ from what the sidecar "
                "recorded: the file was replaced or swapped with another; re-run the prep step"
            )
        with open(path, "rb") as f:
            if verify and hashlib.file_digest(f, "sha256").hexdigest() != meta["sha256"]:
                raise TokenFileError(
                    f"{str(path)!r}: sha256 differs from the sidecar's; the file is damaged or was replaced"
                )
    try:
        tokens = np.memmap(
            path, dtype=found.dtype, mode="r", offset=found.offset, shape=found.shape
        )
    except (
        OSError
    ) as e:  # a file of /sys or /proc behind a link, a device that cannot be mapped, ...
        raise TokenFileError(
            f"token file {str(path)!r} cannot be mapped: {e.strerror or e}"
        ) from None
    if vocab_size is not None and _check_int(
        "vocab_size", vocab_size, 1
    ):  # checked before any scan
        top = (
            meta["max_token_id"] if meta is not None else int(tokens.max())
        )  # the sidecar's word, or one scan
        if top >= vocab_size:
            raise TokenFileError(
                f"{str(path)!r}: ids up to {top} may not fit vocab_size={vocab_size}"
            )
    return tokens, meta or {}


# ---- 2. The dataset: windows, and one batched gather -------------------------------------------


class TokenFile(NamedTuple):
    """One file of a dataset, as it was when the dataset opened it."""

    path: str
    rows: int  # sequences: 1 for a 1-D file, the row count of a 2-D one
    row_len: int  # tokens per sequence
    offset: int  # bytes before the first token
    identity: tuple[
        int, int, int, int
    ]  # (device, inode, size, mtime_ns): a file that changes is refused
    sha256: str | None  # from the sidecar, for fingerprint()


def _identity(path: str) -> tuple[int, int, int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _expand_paths(path: Any) -> list[str]:
    """One token file, a list of them, or a glob pattern ('data/train_*.npy', sorted by name)."""
    if isinstance(path, (list, tuple)) and path:
        if bad := [p for p in path if not isinstance(p, (str, os.PathLike))]:
            raise TypeError(
                f"path list items must be str or os.PathLike, got {type(bad[0]).__name__} {bad[0]!r}"
            )
        return [os.fspath(p) for p in path]
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"path must be a token file, a non-empty list of them or a glob pattern, got {path!r}"
        )
    if not any(ch in (text := os.fspath(path)) for ch in "*?[") or os.path.exists(text):
        return [text]
    if not (found := sorted(p for p in glob.glob(text) if not p.endswith(".json"))):
        raise FileNotFoundError(
            f"no token file matches the pattern {text!r} (sidecars, *.json, are skipped)"
        )
    return found


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'; at most 10 ranges."""
    firsts = [i for k, i in enumerate(indices) if k == 0 or indices[k - 1] != i - 1]
    lasts = [i for k, i in enumerate(indices) if k == len(indices) - 1 or indices[k + 1] != i + 1]
    runs = [f"{a}-{b}" if a != b else f"{a}" for a, b in zip(firsts, lasts)]
    return ", ".join(runs[:10]) + (", ..." if len(runs) > 10 else "")


def _warn_incomplete_shards(paths: list[str], metas: list[dict[str, Any]]) -> None:
    """Warn when shards that the prep step wrote as one set are missing from paths, or repeated."""
    sets: dict[
        str, tuple[str, int, list[int]]
    ] = {}  # settings fingerprint -> (first path, count, indices)
    for p, meta in zip(paths, metas):
        shard, key = (
            meta.get("shard"),
            meta.get("settings_fingerprint"),
        )  # no fingerprint: no known set
        if (
            isinstance(shard, dict)
            and isinstance(shard.get("index"), int)
            and isinstance(shard.get("count"), int)
            and key
        ):
            sets.setdefault(str(key), (p, shard["count"], []))[2].append(shard["index"])
    for first, count, seen in sets.values():
        missing, twice = (
            sorted(set(range(count)) - set(seen)),
            sorted(i for i, k in Counter(seen).items() if k > 1),
        )
        problems = [f"shard(s) {_ranges(missing)} of {count} missing"] * bool(missing)
        if problems := problems + [f"shard(s) {_ranges(twice)} given more than once"] * bool(twice):
            warnings.warn(
                f"{first!r} is one of {count} shards written together, but this dataset has {'; '.join(problems)}. "
                "Pass the glob the prep step printed (e.g. 'train_[0-9][0-9][0-9][0-9][0-9][0-9].npy') "
                "for the whole set, unless a subset is what you want",
                stacklevel=3,
            )


def _keyed_hash(
    seed: int, stream: int, epochs: int | np.ndarray, indices: np.ndarray
) -> np.ndarray:
    """A uint64 per index from (seed, stream, epoch, index) alone (SplitMix64): every worker and rank agrees."""

    def mix(
        x: np.ndarray,
    ) -> np.ndarray:  # a well-spread hash of x + 2**64 / golden ratio, in place, wrapping
        x += np.uint64(0x9E3779B97F4A7C15)
        for shift, multiplier in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, 1)):
            x ^= x >> np.uint64(shift)
            x *= np.uint64(multiplier)
        return x

    key = mix(np.array([(seed * 4 + stream) % 2**64], dtype=np.uint64))
    return mix(
        mix(key + np.asarray(epochs).astype(np.uint64)) + indices.astype(np.uint64)
    )  # a hash, not a proof


def _open_file_budget(mapped: int) -> int:
    """Files to keep mapped: at most MAX_OPEN_FILES, a quarter of the open-file limit, and the `mapped`
    ones plus half the descriptors still free, the other half left to the program (CUDA torch holds many)."""
    try:
        import resource  # Unix only

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        free = soft - len(
            os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd")
        )
    except (ImportError, OSError):
        return MAX_OPEN_FILES
    return (
        MAX_OPEN_FILES
        if soft == resource.RLIM_INFINITY
        else max(1, min(MAX_OPEN_FILES, soft // 4, mapped + free // 2))
    )


class NpyTokensDataset:
    """(x, y) next-token windows, int64 tensors of shape (seq_len,), from memmapped token files (a map-style
    dataset: DataLoader needs len and indexing only). ds[i] and ds[epoch, i] give one window; ds[epoch, indices]
    and ds[list of ints or (epoch, i) pairs] a batch, gathered in one pass. The files (a list, or a glob sorted
    by name) share one index space; no window crosses a file or a row of a 2-D file. Window i of mode "windows"
    is tokens[i*seq_len : (i+1)*seq_len + 1], x its first seq_len, y its last; epoch_offset moves an epoch's
    windows by one offset in [0, seq_len). mode="random" starts each window anywhere, from (seed, epoch, i)."""

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
        self.seq_len, self.seed = _check_int("seq_len", seq_len, 1), _check_int("seed", seed, 0)
        if mode not in ("windows", "random"):
            raise ValueError(f"mode must be one of ('windows', 'random'), got {mode!r}")
        if not isinstance(epoch_offset, bool):
            raise TypeError(f"epoch_offset must be True or False, got {epoch_offset!r}")
        if epoch_offset and mode != "windows":
            raise ValueError(
                'epoch_offset applies to mode="windows" only; random starts already vary'
            )
        if num_samples is not None and mode != "random":
            raise ValueError(
                'num_samples applies to mode="random" only; mode="windows" has exactly one window per slot'
            )
        self.mode, self.epoch_offset, self.paths, self.files = (
            mode,
            epoch_offset,
            _expand_paths(path),
            [],
        )
        metas: list[dict[str, Any]] = []  # {} for a file without a sidecar
        for p in self.paths:  # check every file now: a bad shard fails here, not mid-run
            tokens, meta = _open_checked(Path(p), dtype, vocab_size, verify)
            if self.files and tokens.dtype.name != self.dtype:
                raise TokenFileError(
                    f"{p!r} holds {tokens.dtype.name} but {self.paths[0]!r} holds {self.dtype}; "
                    "the files of one dataset need one dtype"
                )
            named = [(q, m["tokenizer"]) for q, m in zip(self.paths, metas) if m][:1]
            if meta and named and meta["tokenizer"] != named[0][1]:
                raise TokenFileError(
                    f"{p!r} was tokenized with {meta['tokenizer']!r} but {named[0][0]!r} with "
                    f"{named[0][1]!r}; the files of one dataset need one tokenizer"
                )
            self.dtype, (rows, row_len) = tokens.dtype.name, np.atleast_2d(tokens).shape
            self.files.append(
                TokenFile(p, rows, row_len, tokens.offset, _identity(p), meta.get("sha256"))
            )
            metas.append(meta)
        if repeated := sorted(
            p for p, k in Counter(map(os.path.realpath, self.paths)).items() if k > 1
        ):
            warnings.warn(
                f"{repeated[0]!r} is given more than once (its windows repeat every epoch)",
                stacklevel=2,
            )
        _warn_incomplete_shards(self.paths, metas)
        rows, self._row_len = np.array([(f.rows, f.row_len) for f in self.files], dtype=np.int64).T
        spare = self.seq_len - 1 if epoch_offset else 0  # tokens an offset may take from the front
        self._windows_per_row = np.maximum(0, (self._row_len - 1 - spare) // self.seq_len)
        self._starts_per_row = np.maximum(
            self._row_len - self.seq_len, 0
        )  # random starts 0 .. row_len - seq_len - 1
        self._window_cum = np.concatenate(
            ([0], np.cumsum(rows * self._windows_per_row))
        )  # file f: [cum[f], cum[f+1])
        self._start_cum = np.concatenate(([0], np.cumsum(rows * self._starts_per_row)))
        if self._window_cum[-1] == 0:
            where = (
                f"none of the {len(self.paths)} files holds a window: the longest sequence has"
                if len(self.paths) > 1
                else f"{self.paths[0]!r}: {'each row has' if self.files[0].rows > 1 else 'the file has'}"
            )
            need = (
                f"{2 * seq_len} (two windows, so any offset leaves one)"
                if epoch_offset
                else f"{seq_len + 1} (one x plus its shifted y)"
            )
            raise ValueError(
                f"{where} {self._row_len.max()} tokens; seq_len={self.seq_len} needs at least {need}"
            )
        self.num_samples = (
            int(self._window_cum[-1])
            if num_samples is None
            else _check_int("num_samples", num_samples, 1)
        )
        self._maps: dict[
            int, tuple[np.memmap, np.ndarray]
        ] = {}  # file -> (memmap, window view), oldest first

    def __getstate__(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "_maps": {},
        }  # never pickle mapped data: each worker maps the files itself

    def __len__(self) -> int:
        return self.num_samples

    def memmap(self, f: int = 0) -> np.memmap:
        """The read-only memmap of file f, flat (1-D) for a 2-D file too, opened lazily in whichever process uses it first."""
        if not 0 <= operator.index(f) < len(self.files):
            raise IndexError(f"file {f} is out of range for a dataset of {len(self.files)} files")
        return self._mapped(f)[0]

    def _mapped(self, f: int) -> tuple[np.memmap, np.ndarray]:
        """File f's memmap, and a read-only view whose row s is the window of tokens s .. s + seq_len. The file
        is checked on every use: reading a mapped file truncated in place kills the process."""
        file = self.files[f]
        try:
            same = _identity(file.path) == file.identity
        except OSError:
            same = False
        if not same:
            raise TokenFileError(
                f"{file.path!r} changed since the dataset was opened (size, inode or mtime differ, "
                "or it was removed); build a new dataset after the prep step finishes"
            )
        if (
            mapped := self._maps.pop(f, None)
        ) is None:  # re-inserted below: the newest map is the dict's last
            while len(self._maps) >= _open_file_budget(len(self._maps)):
                del self._maps[
                    next(iter(self._maps))
                ]  # the least recently used map and its descriptor go
            for retry in (
                False,
                True,
            ):  # out of descriptors: close the oldest map and try once more
                try:
                    tokens = np.memmap(
                        file.path,
                        dtype=self.dtype,
                        mode="r",
                        offset=file.offset,
                        shape=(file.rows * file.row_len,),
                    )
                    break
                except OSError as e:
                    out = e.errno in (errno.EMFILE, errno.ENFILE)
                    if retry or not out or not self._maps:
                        hint = "; raise the open-file limit (ulimit -n)" if out else ""
                        raise TokenFileError(
                            f"{file.path!r} cannot be mapped ({e.strerror}){hint}"
                        ) from None
                    del self._maps[next(iter(self._maps))]
            flat, step = (
                np.asarray(tokens),
                tokens.strides[0],
            )  # asarray: a plain ndarray, without memmap's hooks
            shape = (
                max(len(flat) - self.seq_len, 0),
                self.seq_len + 1,
            )  # rows overlap, one token apart: no copy
            mapped = (
                tokens,
                np.lib.stride_tricks.as_strided(flat, shape, (step, step), writeable=False),
            )
        self._maps[f] = mapped
        return mapped

    def file_summary(self) -> list[dict[str, Any]]:
        """Per file: tokens, sequences (rows), windows, and tokens no window of mode "windows" uses."""
        return [
            {
                "path": f.path,
                "tokens": f.rows * f.row_len,
                "rows": f.rows,
                "windows": f.rows * per_row,
                "unused_tokens": f.rows
                * (f.row_len - (per_row * self.seq_len + 1 if per_row else 0)),
            }
            for f, per_row in zip(self.files, self._windows_per_row.tolist())
        ]

    def fingerprint(self) -> dict[str, Any]:
        """What decides the windows (each file's name, size, dtype, shape, sidecar sha256; the settings)."""
        files = [
            {
                "name": Path(f.path).name,
                "bytes": f.identity[2],
                "dtype": self.dtype,
                "shape": [f.rows, f.row_len],
                "sha256": f.sha256,
            }
            for f in self.files
        ]
        return {
            "files": files,
            "seq_len": self.seq_len,
            "mode": self.mode,
            "epoch_offset": self.epoch_offset,
            "seed": self.seed,
            "num_samples": self.num_samples,
        }

    def _keys(self, index: Any) -> tuple[int | np.ndarray, np.ndarray, bool]:
        """(epochs, indices, is a batch) of a request, checked: epochs one int for all or one per index;
        indices int64 in [0, num_samples), a negative one counted from the end."""
        epoch, n, pairs = (
            0,
            self.num_samples,
            not isinstance(index, tuple),
        )  # pairs: a list without an epoch
        if isinstance(index, tuple):
            if len(index) != 2:
                raise TypeError(f"an index is an int or an (epoch, index) pair, got {index!r}")
            epoch, index = index
            if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
                raise TypeError(f"epoch must be an int >= 0, got {type(epoch).__name__} {epoch!r}")
            if epoch < 0:
                raise ValueError(f"epoch must be an int >= 0, got {epoch}")
        batch = isinstance(index, (list, np.ndarray))
        if isinstance(index, np.ndarray) and (index.ndim != 1 or index.dtype.kind not in "iu"):
            raise TypeError(
                f"an index array must be 1-D of integers, got {index.dtype} of shape {index.shape}"
            )
        if (
            isinstance(index, np.ndarray) and index.dtype != np.uint64
        ):  # uint64: checked one by one below, exactly
            if (
                len(indices := index.astype(np.int64, copy=False))
                and 0 <= indices.min()
                and indices.max() < n
            ):
                return (
                    int(epoch),
                    indices,
                    batch,
                )  # EpochSampler's batches: nothing to check further
        elif (
            pairs and isinstance(index, list) and index and isinstance(index[0], tuple)
        ):  # (epoch, index) pairs
            keys = [self._keys(k) for k in index]
            if bad := [k for k, key in zip(index, keys) if not isinstance(k, tuple) or key[2]]:
                raise TypeError(
                    f"a list of (epoch, index) pairs holds (epoch, int) pairs only, got {bad[0]!r:.80}"
                )
            return (
                np.array([k[0] for k in keys], dtype=np.int64),
                np.concatenate([k[1] for k in keys]),
                True,
            )
        else:
            for k in index if batch else [index]:  # bool is an int to Python, never an index here
                if isinstance(k, (bool, np.bool_)) or not hasattr(k, "__index__"):
                    raise TypeError(
                        f"index must be an int or an (epoch, index) pair, got {type(k).__name__} {k!r}"
                    )
            indices = np.array(
                [operator.index(k) for k in (index if batch else [index])], dtype=object
            )  # exact
        if (bad := (indices < -n) | (indices >= n)).any():
            where = repr(self.paths[0]) + (
                f" and {len(self.paths) - 1} more files" if len(self.paths) > 1 else ""
            )
            raise IndexError(f"index {indices[bad][0]} is out of range for {n} windows of {where}")
        return int(epoch), (indices % n).astype(np.int64), batch

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        epochs, indices, batch = self._keys(index)
        x, y = self._gather(epochs, indices)
        return (x, y) if batch else (x[0], y[0])

    def __getitems__(self, indices: Sequence[Any]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch's B samples, gathered in one pass, when a DataLoader batches indices itself (make_dataloaders uses
        ds[...]): a list from a BatchSampler, or (epoch, indices) from batch_sampler=EpochSampler(ds, batch_size=B)."""
        pair = (
            isinstance(indices, tuple)
            and len(indices) == 2
            and isinstance(indices[1], (list, np.ndarray))
        )
        epochs, keys, _ = self._keys(indices if pair else list(indices))
        return list(zip(*self._gather(epochs, keys)))

    def locate(
        self, epochs: int | np.ndarray, indices: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each window's file and the position of its first token in that file, from indices in
        [0, num_samples) and their epochs (one int for all, or one per index)."""
        windows = self.mode == "windows"
        cum = self._window_cum if windows else self._start_cum
        local = (
            indices
            if windows
            else (_keyed_hash(self.seed, 2, epochs, indices) % np.uint64(cum[-1])).astype(np.int64)
        )
        if len(self.files) == 1 and self.files[0].rows == 1:  # one 1-D file: no search, no division
            files, firsts = np.zeros_like(local), local * self.seq_len if windows else local
        else:  # the file whose range holds each index (a file without windows has an empty range)
            files = np.searchsorted(cum[1:], local, side="right")
            rows, slot = np.divmod(
                local - cum[files],
                (self._windows_per_row if windows else self._starts_per_row)[files],
            )
            firsts = rows * self._row_len[files] + (slot * self.seq_len if windows else slot)
        if self.epoch_offset:
            firsts = firsts + (
                _keyed_hash(self.seed, 1, epochs, np.zeros_like(indices)) % np.uint64(self.seq_len)
            ).astype(np.int64)
        return files, firsts

    def _gather(
        self, epochs: int | np.ndarray, indices: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's windows, by one index into each file's window view, widened to int64 in one pass."""
        import torch

        files, firsts = self.locate(epochs, indices)
        if len(self.files) == 1:
            compact = self._mapped(0)[1][firsts]  # row b: tokens firsts[b] .. firsts[b] + seq_len
        else:
            compact = np.empty((len(firsts), self.seq_len + 1), dtype=self.dtype)
            order = np.argsort(
                files, kind="stable"
            )  # file by file: one map in use at a time, however many files
            for group in np.split(order, np.flatnonzero(np.diff(files[order])) + 1)[
                : len(order)
            ]:  # none when empty
                compact[group] = self._mapped(int(files[group[0]]))[1][firsts[group]]
        pair = np.empty((2, len(compact), self.seq_len), dtype=np.int64)
        pair[0], pair[1] = compact[:, :-1], compact[:, 1:]  # numpy widens unsigned ids directly
        return torch.from_numpy(pair[0]), torch.from_numpy(pair[1])


# ---- 3. The sampler: epochs, ranks and resume state --------------------------------------------

SAMPLER_STATE_FORMAT = "npy_datasets.EpochSampler"


class EpochSampler:
    """A fresh order of a dataset's windows each epoch, for one rank: (epoch, index) pairs, or batches.

    Epoch e's order is a permutation of range(n) drawn from (seed, e) alone (range(n) without shuffle),
    the same on every rank; rank r of world_size W (default: torch.distributed's) takes items r, r + W, ...
    When W does not divide n, remainder="drop" leaves out the order's last n % W items and "pad" repeats
    its first W - n % W. batch_size=B yields (epoch, up to B indices) for DataLoader(batch_size=None).
    Each pass starts the next epoch by itself; set_epoch(e), as on DistributedSampler, picks the next one.
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
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, _check_int("seed", seed, 0)
        self.batch_size = None if batch_size is None else _check_int("batch_size", batch_size, 1)
        if drop_last and batch_size is None:
            raise ValueError(
                "drop_last=True needs a batch_size: without one the sampler yields single items"
            )
        if (world_size is None) != (rank is None):
            raise ValueError(
                f"pass both world_size and rank, or neither; got world_size={world_size}, rank={rank}"
            )
        if world_size is None:
            import torch

            dist = torch.distributed.is_available() and torch.distributed.is_initialized()
            world_size, rank = (
                (torch.distributed.get_world_size(), torch.distributed.get_rank())
                if dist
                else (1, 0)
            )
        self.world_size, self.rank = (
            _check_int("world_size", world_size, 1),
            _check_int("rank", rank, 0),
        )
        if self.rank >= self.world_size:
            raise ValueError(
                f"rank must be in [0, {self.world_size}) for world_size={self.world_size}, got {self.rank}"
            )
        if remainder not in ("drop", "pad"):
            raise ValueError(f"remainder must be one of ('drop', 'pad'), got {remainder!r}")
        self.remainder = remainder
        if (
            not 1 <= self.num_samples <= 2**31
        ):  # an epoch's order is held in memory, 8 bytes a window
            raise ValueError(
                f'EpochSampler needs 1 to 2**31 windows an epoch, got {self.num_samples:,}: for mode="random"'
                " pass a smaller num_samples and run more epochs"
            )
        if remainder == "drop" and self.num_samples < self.world_size:
            raise ValueError(
                f'{self.num_samples} windows for world_size={self.world_size}: with remainder="drop" no '
                'rank would get one; use remainder="pad", fewer ranks or a shorter seq_len'
            )
        self.epoch, self._start = (
            0,
            0,
        )  # the next pass: its epoch, and where in that epoch's order it begins
        if (
            len(self) == 0
        ):  # drop_last with a share smaller than one batch: an epoch would train on nothing
            share = (self.num_samples + self.padded) // self.world_size
            raise ValueError(
                f"batch_size={self.batch_size} with drop_last=True leaves no batch: each of the "
                f"{self.world_size} rank(s) gets {share} of the {self.num_samples} "
                "windows; use a smaller batch_size, fewer ranks, a shorter seq_len or drop_last=False"
            )
        self._fingerprint = (
            data_source.fingerprint() if hasattr(data_source, "fingerprint") else None
        )
        self._pass: tuple[int, int, int] | None = (
            None  # the latest pass: epoch, start, items it hands out
        )
        self._handed = 0  # items the latest pass has handed out so far
        self._resuming = False  # a loaded state (self.epoch, self._start) that no pass has used yet

    @property
    def dropped(self) -> int:
        """Windows of each epoch that no rank sees so that ranks get equal shares (remainder="drop"); with
        drop_last, each rank also leaves out its last partial batch, which this does not count."""
        return self.num_samples % self.world_size if self.remainder == "drop" else 0

    @property
    def padded(self) -> int:
        """Windows of a whole epoch that two ranks see (remainder="pad")."""
        return -self.num_samples % self.world_size if self.remainder == "pad" else 0

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch `epoch`, from its start. Right after load_state_dict(), only the loaded epoch is
        allowed, and it keeps the loaded position: a loop that calls set_epoch(e) before each epoch, as
        DistributedSampler wants, resumes exactly, and one that would replay or skip an epoch is stopped."""
        if (epoch := _check_int("epoch", epoch, 0)) != self.epoch and self._resuming:
            raise ValueError(
                f"set_epoch({epoch}) right after load_state_dict(), whose state continues epoch {self.epoch} at "
                f"position {self._start}: that would {'replay' if epoch < self.epoch else 'skip'} data; "
                "call set_epoch(sampler.epoch), or start the loop's epoch count there"
            )
        self.epoch, self._start, self._pass = epoch, self._start if self._resuming else 0, None

    def __len__(self) -> int:
        """Items (batches, with batch_size) of the next pass: fewer when it resumes an epoch part-way."""
        left, step = self.num_samples - self._start, self.batch_size or 1
        items = left // self.world_size if self.remainder == "drop" else -(-left // self.world_size)
        return items // step if self.drop_last else -(-items // step)

    def order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's indices of `epoch`, from position `start` of the epoch's order on."""
        n, world = self.num_samples, self.world_size
        full = (
            np.random.default_rng([self.seed, epoch]).permutation(n)
            if self.shuffle
            else np.arange(n)
        )
        rest = full[start:]
        if extra := len(rest) % world:  # drop the order's last items, or repeat its first ones
            rest = (
                rest[: len(rest) - extra]
                if self.remainder == "drop"
                else np.concatenate((rest, np.resize(full, world - extra)))
            )
        return rest[self.rank :: world]

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        # A generator: nothing happens until the first item is asked for, so an iterator made and dropped unused
        # does not use up an epoch (DataLoader workers ask for items as soon as their iterator is made).
        epoch, start, step = self.epoch, self._start, self.batch_size or 1
        mine = self.order(epoch, start)[: len(self) * step]  # with drop_last, whole batches only
        self.epoch, self._start = epoch + 1, 0
        self._pass, self._handed, self._resuming = (epoch, start, len(mine)), 0, False
        for lo in range(0, len(mine), step):
            self._handed = min(lo + step, len(mine))
            yield (
                (epoch, int(mine[lo])) if self.batch_size is None else (epoch, mine[lo : lo + step])
            )

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the next item comes from: an epoch and a position in its order (JSON-ready).

        consumed: the batches (items, without batch_size) of the latest pass the training loop has trained on:
        `step` in `for step, batch in enumerate(loader, 1)` once that step is done (micro-batches, with gradient
        accumulation). Left out: what the sampler handed out, the same without DataLoader workers; workers
        fetch ahead, so with them pass it. numpy draws the orders: pin it for exact resumes across upgrades."""
        epoch, start, total = self._pass or (self.epoch, self._start, 0)
        items, step = (
            self._handed,
            self.batch_size or 1,
        )  # without a pass, total is 0: a stale count adds nothing
        if consumed is not None:
            if (consumed := _check_int("consumed", consumed, 0)) and not self._pass:
                raise ValueError(f"consumed={consumed}, but no pass over this sampler has started")
            if consumed > (
                handed := -(-items // step)
            ):  # the loop cannot have received more than was handed out
                raise ValueError(
                    f"consumed={consumed}, but the latest pass has handed out only {handed} of its {-(-total // step)} "
                    "batches; count the batches of the current pass (enumerate(loader, 1)), not a global step"
                )
            items = consumed * step
        position = start + min(items, total) * self.world_size
        if self._pass and items >= total:
            epoch, position = epoch + 1, 0
        return {
            "format": SAMPLER_STATE_FORMAT,
            "version": 1,
            "epoch": epoch,
            "position": position,
            "dataset": self._fingerprint,
            "num_samples": self.num_samples,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict(): the next pass starts exactly where that one stopped. The state must
        come from the same windows and shuffle seed; another world_size or batch_size continues from there."""
        mine = {**self.state_dict(), "epoch": 0, "position": 0}
        if (
            not isinstance(state, dict)
            or state.get("format") != SAMPLER_STATE_FORMAT
            or state.get("version") != 1
        ):
            raise ValueError(
                f'not an EpochSampler state of version 1 ("format": {SAMPLER_STATE_FORMAT!r}): {state!r:.200}'
            )
        if set(state) != set(mine):
            raise ValueError(
                f"EpochSampler state: expected the keys {sorted(mine)}, found {sorted(state)}"
            )
        if found := _first_difference({**state, "epoch": 0, "position": 0}, mine):
            raise ValueError(
                "EpochSampler state: {} is {!r:.120} in the saved state, {!r:.120} here".format(
                    *found
                )
            )
        epoch, position = state["epoch"], state["position"]
        if type(epoch) is not int or epoch < 0:
            raise ValueError(f"EpochSampler state: epoch must be an int >= 0, got {epoch!r}")
        if type(position) is not int or not 0 <= position < self.num_samples:
            raise ValueError(
                f"EpochSampler state: position must be an int in [0, {self.num_samples}), got {position!r}"
            )
        self.epoch, self._start, self._pass, self._resuming = epoch, position, None, True


def _first_difference(a: Any, b: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """Where two JSON-like values first differ, as (path, a's value, b's value), keys in b's order: state_dict()
    and fingerprint() list causes first (a file's name before its size, seq_len before num_samples)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*b, *(k for k in a if k not in b)]:
            if found := _first_difference(
                a.get(key), b.get(key), f"{path}.{key}" if path else str(key)
            ):
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"len({path})", len(a), len(b)
        return next(
            filter(
                None,
                (_first_difference(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))),
            ),
            None,
        )
    return None if a == b and type(a) is type(b) else (path, a, b)


# ---- 4. Loaders and the device -----------------------------------------------------------------


def make_dataloaders(
    train: NpyTokensDataset,
    val: NpyTokensDataset,
    batch_size: int,
    *,
    num_workers: int = 0,
    seed: int = 0,
    pin_memory: bool | None = None,
    prefetch_factor: int = 2,
    world_size: int | None = None,
    rank: int | None = None,
) -> tuple[DataLoader, DataLoader]:
    """Train (shuffled, drop_last) and validation (in order, every window) DataLoaders of (x, y) batches.

    An EpochSampler hands the dataset a whole batch of indices, gathered in one pass (batch_size=None: the
    dataset makes the batch, and collate_fn=tuple keeps it as it is). No workers by default: for memmapped
    windows they cost more than they save. Memory is pinned where CUDA is. seed orders the training windows
    (a dataset's own seed places its random starts). Each rank of torch.distributed (or world_size and rank)
    gets its share, every rank the same number of steps (validation repeats a few windows for that), once the
    ranks have checked that they see the same files and settings. A validation dataset of mode="random" or with
    epoch_offset draws other windows each pass; build it with the defaults for the same windows every time.
    """
    import torch
    from torch.utils.data import DataLoader

    for name, ds in (("train", train), ("val", val)):
        if not isinstance(ds, NpyTokensDataset):
            raise TypeError(f"{name} must be an NpyTokensDataset, got {type(ds).__name__}")
    batch_size, workers = (
        _check_int("batch_size", batch_size, 1),
        _check_int("num_workers", num_workers, 0),
    )
    pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
    options: dict[str, Any] = {
        "batch_size": None,
        "collate_fn": tuple,
        "num_workers": workers,
        "pin_memory": pin,
    }
    if workers:  # DataLoader refuses these without workers
        options.update(
            persistent_workers=True,
            prefetch_factor=_check_int("prefetch_factor", prefetch_factor, 1),
        )
    if (
        torch.distributed.is_available() and torch.distributed.is_initialized()
    ):  # first: a sampler may refuse one rank's files
        verify_across_ranks(
            {
                "train": train.fingerprint(),
                "val": val.fingerprint(),
                "batch_size": batch_size,
                "seed": seed,
            }
        )
    ranks = {"world_size": world_size, "rank": rank, "batch_size": batch_size, "seed": seed}
    train_sampler = EpochSampler(train, shuffle=True, drop_last=True, remainder="drop", **ranks)
    val_sampler = EpochSampler(val, shuffle=False, remainder="pad", **ranks)
    return DataLoader(train, sampler=train_sampler, **options), DataLoader(
        val, sampler=val_sampler, **options
    )


def verify_across_ranks(settings: dict[str, Any], group: Any = None) -> None:
    """Check that every rank of torch.distributed passes the same JSON-able settings (a dataset's
    fingerprint(), say); raise on every rank, naming the first rank that differs and where."""
    import torch
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend(group) == "nccl"
        else torch.device("cpu")
    )
    mine = torch.frombuffer(bytearray(json.dumps(settings).encode()), dtype=torch.uint8).to(device)
    sizes = [
        torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))
    ]
    dist.all_gather(sizes, torch.tensor([len(mine)], device=device), group=group)
    bufs = [torch.zeros(int(max(sizes)), dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(
        bufs, torch.cat((mine, bufs[0][len(mine) :])), group=group
    )  # tensors only: nothing is pickled
    seen = [json.loads(bytes(b[: int(s)].cpu().tolist())) for b, s in zip(bufs, sizes)]
    for r, theirs in enumerate(seen):
        if found := _first_difference(seen[0], theirs):
            raise RuntimeError(
                f"rank {r} differs from rank 0: {found[0]} is {found[1]!r:.120} on rank 0, {found[2]!r:.120} on rank {r}"
            )


def to_device(
    batch: Sequence[torch.Tensor], device: str | torch.device
) -> tuple[torch.Tensor, ...]:
    """Move a batch's tensors to device, asynchronously when they are in pinned memory. (On an H100 a
    pinned int64 copy was faster than sending uint16 ids and widening them there: fewer kernel launches.)"""
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)
