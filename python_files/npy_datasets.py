"""Serve (x, y) next-token windows from token files on disk, without loading them into RAM.

Copy this one file into your project: it needs numpy, torch and the standard library only.
Every definition here is taught, step by step, in the notebooks of this repository.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import itertools
import json
import operator
import os
import stat
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate

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
    "TokenBatch",
    "collate_windows",
    "default_num_workers",
    "make_dataloaders",
    "to_device",
]

FORMAT_VERSION = 1  # version of the JSON sidecar written beside each token file
TOKEN_DTYPES = ("uint16", "uint32")  # uint16 holds ids < 65,536 (GPT-2: 50,257); uint32 the rest
NPY_MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER = 10_000  # bytes; numpy's own default limit, checked before anything is parsed
WINDOW_MODES = ("windows", "random")  # non-overlapping windows, or nanoGPT-style random starts


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


def _file_layout(
    path: Path, dtype: Any, meta: dict[str, Any] | None
) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """Describe a token file as (layout, dtype, shape, data offset), from its header or its size."""
    with open(path, "rb") as f:
        is_npy = f.read(6) == NPY_MAGIC
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
    """Open a .npy or raw .bin token file as a read-only memmap, after checking it and its sidecar.

    Args:
        dtype: needed only for a raw .bin file without a sidecar.
        vocab_size: the model's vocabulary size; refuse files whose ids could reach past it.
        verify: also compare the file's sha256 with the sidecar's (reads the whole file).
    """
    path = Path(path)
    _regular_file_size(path)
    meta = read_sidecar(path)
    layout, dt, shape, offset = _file_layout(path, dtype, meta)
    if meta is not None:
        _check_sidecar(path, meta, layout, dt, shape, verify)
    elif verify:
        raise TokenFileError(f"verify=True needs the sidecar {str(sidecar_path(path))!r}, which is missing")
    if vocab_size is not None:
        top = meta["max_token_id"] if meta is not None else int(np.iinfo(dt).max)
        if meta is None or top >= vocab_size:
            raise TokenFileError(
                f"{str(path)!r}: ids up to {top} may not fit vocab_size={vocab_size}"
                + ("" if meta else " (no sidecar records the largest id)")
            )
    return np.memmap(path, dtype=dt, mode="r", offset=offset, shape=shape)


def _check_int(name: str, value: Any, minimum: int) -> int:
    """An int (or numpy integer, never a bool) that is at least `minimum`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


_MASK64 = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a fast, well-spread hash of uint64 values (wraps mod 2**64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _keyed_hash(seed: int, stream: int, epoch: np.ndarray, index: np.ndarray) -> np.ndarray:
    """A uint64 that depends only on (seed, stream, epoch, index): no RNG state anywhere."""
    key = _mix64(np.array([(seed * 4 + stream) & _MASK64], dtype=np.uint64))
    return _mix64(_mix64(key + epoch.astype(np.uint64)) + index.astype(np.uint64))


class NpyTokensDataset(Dataset):
    """(x, y) next-token windows, int64 tensors of shape (seq_len,), read from a memmapped token file.

    mode="windows": window i of a 1-D file of N tokens is tokens[i*seq_len : i*seq_len + seq_len + 1],
    x its first seq_len tokens and y its last seq_len; there are (N - 1) // seq_len windows, and the
    last N - 1 - len*seq_len tokens are never an x. With epoch_offset=True every window of an epoch
    moves right by one offset in [0, seq_len) drawn from (seed, epoch), and there are (N - seq_len)
    // seq_len windows. mode="random": num_samples windows (default: as many as mode "windows"),
    each starting anywhere in [0, N - seq_len - 1], drawn from (seed, epoch, index). In a 2-D file
    each row is a separate sequence and no window crosses a row.

    An index is an int (epoch 0) or an (epoch, index) pair, as EpochSampler yields.
    """

    def __init__(
        self,
        path: str | os.PathLike,
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
        self.path = str(path)
        arr = open_tokens(self.path, dtype, vocab_size=vocab_size, verify=verify)
        self.dtype = arr.dtype.name
        self.shape = tuple(int(d) for d in arr.shape)
        self._offset = int(arr.offset)
        self._identity = self._file_identity()
        self._arr: np.memmap | None = arr
        rows, row_len = (1, self.shape[0]) if len(self.shape) == 1 else self.shape
        need = 2 * self.seq_len if epoch_offset else self.seq_len + 1
        if row_len < need:
            what = "each row has" if len(self.shape) == 2 else "the file has"
            raise ValueError(
                f"{self.path!r}: {what} {row_len} tokens; seq_len={self.seq_len} needs at least {need} "
                + ("(two windows, so any offset leaves one)" if epoch_offset else "(one x plus its shifted y)")
            )
        self._rows, self._row_len = rows, row_len
        spare = self.seq_len - 1 if epoch_offset else 0  # tokens an offset may take from the front
        self.windows_per_row = (row_len - 1 - spare) // self.seq_len
        if mode == "random":
            self.num_samples = rows * self.windows_per_row if num_samples is None else _check_int("num_samples", num_samples, 1)
        elif num_samples is not None:
            raise ValueError('num_samples applies to mode="random" only; mode="windows" has exactly one window per slot')
        else:
            self.num_samples = rows * self.windows_per_row

    def _file_identity(self) -> tuple[int, int, int, int]:
        st = os.stat(self.path)
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_arr"] = None  # never pickle the mapped data: each worker reopens the file itself
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def tokens(self) -> np.memmap:
        """The read-only memmap, opened lazily in whichever process uses it first.

        The file is checked on every use, not only on opening: a forked worker inherits the mapping,
        and reading a mapped file that was truncated in place kills the process with a bus error.
        """
        try:
            same = self._file_identity() == self._identity
        except FileNotFoundError:
            same = False
        if not same:
            raise TokenFileError(
                f"{self.path!r} changed since the dataset was opened (size, inode or mtime differ, or it "
                "was removed); build a new dataset after the prep step finishes"
            )
        if self._arr is None:
            self._arr = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self._offset, shape=self.shape)
        return self._arr

    def __len__(self) -> int:
        return self.num_samples

    def _split_index(self, index: Any) -> tuple[int, int]:
        """(epoch, i) from an int or an (epoch, i) pair, with negative i counted from the end."""
        epoch = 0
        if isinstance(index, tuple):
            if len(index) != 2:
                raise TypeError(f"an index is an int or an (epoch, index) pair, got {index!r}")
            epoch, index = index
            if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
                raise TypeError(f"epoch must be an int >= 0, got {epoch!r}")
        if isinstance(index, (bool, np.bool_)):
            raise TypeError(f"index must be an int, got {index!r}")
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"index must be an int or an (epoch, index) pair, got {type(index).__name__} {index!r}") from None
        n = self.num_samples
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of range for {n} windows of {self.path!r}")
        return int(epoch), i % n

    def locate(self, epochs: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Row and first-token position of each window, given arrays of epochs and indices."""
        per_row = self.windows_per_row
        if self.mode == "windows":
            rows, slot = np.divmod(indices, per_row)
            starts = slot * self.seq_len
            if self.epoch_offset:
                starts = starts + (_keyed_hash(self.seed, 1, epochs, np.zeros_like(indices)) % np.uint64(self.seq_len)).astype(np.int64)
        else:
            choices = self._row_len - self.seq_len  # valid starts per row: 0 .. row_len - seq_len - 1
            pick = _keyed_hash(self.seed, 2, epochs, indices) % np.uint64(self._rows * choices)
            rows, starts = np.divmod(pick.astype(np.int64), choices)
        return rows.astype(np.int64), starts.astype(np.int64)

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = self._split_index(index)
        rows, starts = self.locate(np.array([epoch]), np.array([i]))
        row, start = int(rows[0]), int(starts[0])
        data = self.tokens if len(self.shape) == 1 else self.tokens[row]
        window = data[start : start + self.seq_len + 1]
        return torch.from_numpy(window[:-1].astype(np.int64)), torch.from_numpy(window[1:].astype(np.int64))

    def _batch_keys(self, indices: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
        """Epochs and indices of a batch as int64 arrays, checked all at once when they are plain ints."""
        types = set(map(type, indices))  # type(), not isinstance(): a bool is not an index
        plain = types == {int}
        if plain or (types == {tuple} and set(map(type, itertools.chain.from_iterable(indices))) == {int}):
            with contextlib.suppress(OverflowError, ValueError):  # too large, or ragged: the slow path names it
                keys = np.array(indices, dtype=np.int64)
                if plain or keys.shape[1:] == (2,):
                    epochs, index = (np.zeros_like(keys), keys) if plain else (keys[:, 0], keys[:, 1])
                    n = self.num_samples
                    if (epochs >= 0).all() and (index >= -n).all() and (index < n).all():
                        return epochs, index % n
        pairs = [self._split_index(index) for index in indices]  # slow path: names the bad index
        return np.array([e for e, _ in pairs], dtype=np.int64), np.array([i for _, i in pairs], dtype=np.int64)

    def __getitems__(self, indices: Sequence[Any]) -> _Samples:
        """A whole batch in one pass: one slice copy per window into one compact (B, seq_len + 1) array."""
        rows, starts = self.locate(*self._batch_keys(indices))
        width = self.seq_len + 1
        compact = np.empty((len(starts), width), dtype=self.dtype)
        tokens = np.asarray(self.tokens)  # a plain ndarray view: slicing it skips np.memmap's Python hooks
        if len(self.shape) == 1:
            for b, start in enumerate(starts.tolist()):
                compact[b] = tokens[start : start + width]
        else:
            for b, (row, start) in enumerate(zip(rows.tolist(), starts.tolist())):
                compact[b] = tokens[row, start : start + width]
        return _Samples(torch.from_numpy(compact))


class _Samples(Sequence):
    """What __getitems__ returns: the (x_i, y_i) samples a DataLoader's default collate expects,
    widened only if someone reads them; collate_windows takes the compact windows instead."""

    def __init__(self, windows: torch.Tensor) -> None:
        self.windows = windows
        self._samples: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _rows(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self._samples is None:
            x, y = _widen(self.windows)
            self._samples = list(zip(x.unbind(), y.unbind()))
        return self._samples

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rows()[i]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self._rows())


class TokenBatch:
    """A batch of windows as the file stores them: one (B, seq_len + 1) uint16 or uint32 tensor.

    `x, y = batch` gives int64 x and y on the CPU; to_device(batch, device) copies the compact ids
    (a quarter of the bytes of int64 for uint16) and widens them on the device.
    """

    def __init__(self, windows: torch.Tensor) -> None:
        self.windows = windows

    def pin_memory(self) -> TokenBatch:
        return TokenBatch(self.windows.pin_memory())

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(_widen(self.windows))


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


def collate_windows(batch: list) -> Any:
    """Collate for NpyTokensDataset: wraps the windows its __getitems__ gathered, copying nothing."""
    if isinstance(batch, _Samples):
        return TokenBatch(batch.windows)
    return default_collate(batch)


class EpochSampler(Sampler):
    """Yields (epoch, index) pairs: a fresh permutation of range(n) per epoch, from (seed, epoch) only.

    Each new iteration moves to the next epoch, so a persistent DataLoader worker never needs to
    be told; set_epoch(e) chooses the epoch of the next iteration explicitly.
    """

    def __init__(self, data_source: Any, *, shuffle: bool = True, seed: int = 0) -> None:
        self.num_samples = len(data_source)
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be True or False, got {shuffle!r}")
        self.shuffle = shuffle
        self.seed = _check_int("seed", seed, 0)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = _check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
        else:
            order = np.arange(self.num_samples)
        return ((epoch, i) for i in order.tolist())


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
) -> tuple[DataLoader, DataLoader]:
    """Train (shuffled, drop_last) and validation (in order, every window) DataLoaders."""
    batch_size = _check_int("batch_size", batch_size, 1)
    workers = default_num_workers() if num_workers is None else _check_int("num_workers", num_workers, 0)
    pin = torch.cuda.is_available() if pin_memory is None else bool(pin_memory)
    extra: dict[str, Any] = {}
    if workers > 0:  # these options are refused by DataLoader without workers
        extra = {"persistent_workers": True, "prefetch_factor": _check_int("prefetch_factor", prefetch_factor, 1)}
    train_loader = DataLoader(
        train, batch_size=batch_size, sampler=EpochSampler(train, shuffle=True, seed=seed), drop_last=True,
        num_workers=workers, pin_memory=pin, collate_fn=collate_windows, **extra,
    )  # fmt: skip
    val_loader = DataLoader(
        val, batch_size=batch_size, sampler=EpochSampler(val, shuffle=False), drop_last=False,
        num_workers=workers, pin_memory=pin, collate_fn=collate_windows, **extra,
    )  # fmt: skip
    return train_loader, val_loader


def to_device(batch: TokenBatch | Sequence[torch.Tensor], device: str | torch.device) -> tuple[torch.Tensor, ...]:
    """Move a batch to device (asynchronously from pinned memory); a TokenBatch is widened there."""
    device = torch.device(device)
    if isinstance(batch, TokenBatch):
        windows = batch.windows.to(device, non_blocking=batch.windows.is_pinned())
        return _widen(windows)
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)
