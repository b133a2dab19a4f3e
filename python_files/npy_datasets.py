"""Serve (x, y) next-token windows from token files on disk, without loading them into RAM.

Copy this one file into your project: it needs Python 3.11+, numpy, torch and the standard library.

    import torch
    from npy_datasets import NpyTokensDataset, make_dataloaders, to_device

    train = NpyTokensDataset("data/tinystories/train.npy", seq_len=256)  # or a list, or a glob
    val = NpyTokensDataset("data/tinystories/validation.npy", seq_len=256)
    train_loader, val_loader = make_dataloaders(train, val, batch_size=32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for epoch in range(train_loader.sampler.epoch, 10):
        train_loader.sampler.set_epoch(epoch)
        for step, batch in enumerate(train_loader, 1):
            x, y = to_device(batch, device)  # int64, (32, 256) each: y is x shifted by one token
            ...  # loss = model(x, y); save train_loader.sampler.state_dict(consumed=step) with it

The sections follow the data:
    1. Token files   write_tokens() writes ids and a JSON sidecar; open_tokens() maps them back
    2. The dataset   NpyTokensDataset: the (x, y) windows of one file or many
    3. The sampler   EpochSampler: a new order each epoch, one share per rank, state to resume
    4. Loaders       make_dataloaders() and to_device()
Importing the file imports numpy only (torch where it is used): a prep step can write token files
without torch.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import io
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch.utils.data import DataLoader

__all__ = [
    "FORMAT_VERSION",
    "TokenFileError",
    "write_tokens",
    "read_sidecar",
    "open_tokens",
    "NpyTokensDataset",
    "EpochSampler",
    "make_dataloaders",
    "verify_across_ranks",
    "to_device",
]

# ---- 1. Token files ----------------------------------------------------------------------------

FORMAT_VERSION = 1  # of the JSON sidecar written beside each token file
NPY_MAGIC = b"\x93NUMPY"
LLMC_HEADER_BYTES = 256 * 4  # llm.c shards: 256 int32 words (magic, version, token count, unused)
LLMC_VERSIONS = {20240520: 1, 20240801: 7}  # llm.c's token shards: magic -> version
LLMC_DTYPES = {20240520: np.dtype("<u2"), 20240801: np.dtype("<u4")}  # GPT-2 ids, Llama 3 ids
LLMC_OTHER_FILES = {20240326: "model", 20240327: "state", 20240328: "tokenizer", 20240522: "eval"}
PROBE_BYTES = 1 << 16  # every open hashes a file's first and last 64 KiB: a swap shows, cheaply
MAX_OPEN_FILES = 1024  # files one process keeps mapped at most (each map holds a descriptor)
# DataLoader workers need 16 free descriptors, and 4 for each batch in flight (x and y, doubled):
# 2 workers with prefetch_factor 2 hung under 24 free, so 16 + 2 a batch was measured.
LOADER_DESCRIPTORS = 16
BATCH_DESCRIPTORS = 4
WRITER_FIELDS = ("tokenizer", "n_vocab", "eot_id", "max_token_id")  # what only the writer knows


class TokenFileError(ValueError):
    """A token file, or its sidecar, is not what the loader can read safely."""


class TokenFile(NamedTuple):
    """A token file as it was checked when it was opened."""

    path: str
    layout: str  # "npy" or "llmc" (both told by their first bytes), or "bin" (raw ids)
    dtype: np.dtype
    shape: tuple[int, ...]  # (tokens,), or (sequences, tokens of each) for a 2-D .npy
    offset: int  # bytes before the first id
    identity: tuple[int, int, int, int]  # device, inode, size, mtime: its replacement differs
    probe: str  # sha256 of its first and last PROBE_BYTES
    sidecar: dict[str, Any]  # {} for a file without one


def write_tokens(
    path: str | os.PathLike,
    ids: Any,
    *,
    n_vocab: int,
    tokenizer: str,
    eot_id: int,
    dtype: Any = None,
    header: Callable[[np.dtype, tuple[int, ...]], bytes] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Write token ids, then the JSON sidecar beside them; return the sidecar. A path ending in
    .bin gets raw ids (nanoGPT's layout), any other a .npy file.

    ids: an array or a list (1-D, or 2-D with a sequence a row), or an iterable of 1-D arrays
    streamed one at a time (a document or a batch each), so the corpus never has to fit in
    memory. Every id must be below n_vocab. dtype: by default the smallest that holds n_vocab ids
    (uint16 for GPT-2's 50,257). fields: more JSON for the sidecar (eot_placement, n_docs, ...).
    header(dtype, shape): bytes of one length for any shape, written before the ids instead of
    the .npy header (the prep step writes llm.c shards so). Nothing is replaced until everything
    is written: a refusal or a crash leaves the old file and its sidecar as they were.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; write_tokens needs a file path")
    _check_int("n_vocab", n_vocab, 1, 2**32)
    _check_int("eot_id", eot_id, 0, n_vocab - 1)
    if not isinstance(tokenizer, str) or not tokenizer:
        raise TypeError(f"tokenizer must be a name such as 'tiktoken:gpt2', got {tokenizer!r}")
    if dtype is None:  # GPT-2's largest id, 50256, fits uint16
        dtype = "<u2" if n_vocab <= 2**16 else "<u4"
    dtype = _token_dtype(dtype, f"{str(path)!r}: the dtype argument")
    if n_vocab - 1 > np.iinfo(dtype).max:
        raise ValueError(f"n_vocab={n_vocab:,} has ids past {dtype.name}'s {np.iinfo(dtype).max:,}")
    try:  # numpy's numbers become Python's; what JSON cannot hold is refused before any write
        fields = json.loads(json.dumps(fields, allow_nan=False, default=_python_number))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{str(path)!r}: a sidecar field is not JSON ({error}); nothing written")
    if header is None:
        header = _no_header if path.suffix == ".bin" else _npy_header
    layout = _layout_of(path, header(dtype, (0,)))
    given = {"tokenizer": tokenizer, "n_vocab": int(n_vocab), "eot_id": int(eot_id)}
    fields = {"eot_placement": "prepend", **fields, **given}
    return _write_atomically(path, ids, dtype, n_vocab, header, layout, fields)


def _python_number(value: Any) -> int | float:
    if isinstance(value, (np.integer, np.floating)):  # (ids == eot).sum() is a numpy int
        return value.item()
    raise TypeError(f"{type(value).__name__} {value!r:.40} is not JSON")


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """A .npy header (format 1.0): numpy pads it to 128 bytes for any shape, so it goes last."""
    header = io.BytesIO()
    fields = {"descr": dtype.str, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue()


def _no_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    return b""  # raw ids, as nanoGPT's train.bin


def _layout_of(path: Path, head: bytes) -> str:
    """The layout a reader will tell from a file's first bytes: the ones header= writes."""
    if not head:
        return "bin"
    if head.startswith(NPY_MAGIC):
        return "npy"
    if int.from_bytes(head[:4], "little") in LLMC_VERSIONS:
        return "llmc"
    raise ValueError(f"{str(path)!r}: header= must write a .npy or an llm.c token shard header")


def _write_atomically(
    path: Path, ids: Any, dtype: np.dtype, n_vocab: int, header: Callable, layout: str, fields: dict
) -> dict[str, Any]:
    """The ids and the sidecar go to new files beside path, then are renamed over the old ones,
    the old sidecar deleted first: a crash never leaves a sidecar that describes another file."""
    side = sidecar_path(path)
    tmp, side_tmp = _temporary(path), _temporary(side)
    try:
        with open(tmp, "xb") as f:  # "x": never a file, or a link, planted at that name
            shape, top = _write_ids(f, path, ids, dtype, n_vocab, header)
            os.fsync(f.fileno())
        meta = _file_fields(tmp, path.name, layout, dtype, shape) | {"max_token_id": top}
        taken = sorted(meta.keys() & fields.keys())
        if taken:
            raise TypeError(f"{str(path)!r}: write_tokens sets {taken} itself; nothing written")
        meta |= fields
        with open(side_tmp, "xb") as f:
            f.write((json.dumps(meta, sort_keys=True, indent=2) + "\n").encode())
            os.fsync(f.fileno())
        side.unlink(missing_ok=True)
        os.replace(tmp, path)
        os.replace(side_tmp, side)
        _fsync_folder(path.parent)  # the renames survive a power cut
    except OSError as error:  # a full disk names no file: name the one being written
        if error.filename is None:
            raise OSError(error.errno, f"{error.strerror} while writing", str(path)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)  # gone already after a rename
        side_tmp.unlink(missing_ok=True)
    return meta


def _temporary(path: Path) -> Path:
    """A hidden name beside path for a file written and then renamed: .<name>.tmp.<pid>.<random>."""
    return path.with_name(f".{path.name[:200]}.tmp.{os.getpid()}.{secrets.token_hex(4)}")


def _write_ids(
    f: BinaryIO, path: Path, ids: Any, dtype: np.dtype, n_vocab: int, header: Callable
) -> tuple[tuple[int, ...], int]:
    """Stream ids into f after a header that is written again at the end, once their count is
    known; return their shape and the largest id."""
    if isinstance(ids, (np.ndarray, list, tuple)):  # one array
        chunks, dims = [ids], (1, 2)
    elif isinstance(ids, Iterable) and not isinstance(ids, (str, bytes)):
        chunks, dims = ids, (1,)
    else:
        raise TypeError(f"{str(path)!r}: ids must be an array or an iterable of 1-D arrays")
    start = header(dtype, (0,))
    f.write(start)
    count, top, shape = 0, -1, (0,)
    for chunk in chunks:
        tokens, largest = _checked_ids(path, chunk, dtype, n_vocab, dims)
        f.write(memoryview(tokens).cast("B"))
        count += tokens.size
        top = max(top, largest)
        shape = tokens.shape
    if count == 0:
        raise ValueError(f"{str(path)!r}: no token ids to write; nothing written")
    shape = shape if dims == (1, 2) else (count,)
    end = header(dtype, shape)
    if len(end) != len(start):
        raise ValueError(f"{str(path)!r}: header= gave {len(end)} bytes, then {len(start)}")
    f.seek(0)
    f.write(end)
    return shape, top


def _checked_ids(
    path: Path, chunk: Any, dtype: np.dtype, n_vocab: int, dims: tuple[int, ...]
) -> tuple[np.ndarray, int]:
    """chunk as C-ordered ids of dtype, and its largest id, once every id is known to be below
    n_vocab: a plain astype would wrap 70000 to 4464."""
    try:
        ids = np.asarray(chunk)
    except ValueError:  # numpy refuses a ragged list
        raise ValueError(
            f"{str(path)!r}: ids of different lengths can't make an array; pass an iterator of "
            "1-D arrays (iter(documents)) to write them one after another; nothing written"
        ) from None
    if ids.ndim not in dims or (ids.size and ids.dtype.kind not in "iu"):
        shapes = " or ".join(f"{d}-D" for d in dims)
        found = f"{ids.dtype} of shape {ids.shape}"
        raise TypeError(
            f"{str(path)!r}: ids must be {shapes} integers, got {found}; nothing written"
        )
    if not ids.size:
        return ids.astype(dtype), -1
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= n_vocab:
        bad = low if low < 0 else high
        valid = f"outside the vocabulary (0 to {n_vocab - 1:,})"
        raise ValueError(f"{str(path)!r}: token id {bad} is {valid}; nothing written")
    return np.ascontiguousarray(ids, dtype=dtype), high  # C order, as the file reads


def _file_fields(
    file: Path, name: str, layout: str, dtype: np.dtype, shape: tuple[int, ...]
) -> dict[str, Any]:
    """What a sidecar says of its file, spelled once: open_tokens compares it with the file."""
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        probe = _probe(f, f.read(PROBE_BYTES), size)
        f.seek(0)
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return {
        "format": "npy-tokens",
        "format_version": FORMAT_VERSION,
        "file": name,
        "layout": layout,
        "dtype": dtype.name,
        "shape": list(shape),
        "n_tokens": int(np.prod(shape)),
        "file_size": size,
        "sha256": sha256,
        "probe_sha256": probe,
    }


def _probe(f: BinaryIO, head: bytes, size: int) -> str:
    """sha256 of a file's first and last PROBE_BYTES (all of a smaller one): it tells two files
    of one size apart, two swapped shards say, without reading them whole."""
    f.seek(max(len(head), size - PROBE_BYTES))  # the tail, never the head twice
    return hashlib.sha256(head + f.read(PROBE_BYTES)).hexdigest()


def _fsync_folder(folder: Path) -> None:
    if os.name != "nt":  # Windows cannot open a folder to flush its renames
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def sidecar_path(path: str | os.PathLike) -> Path:
    """Where a token file's JSON sidecar lives: its name with '.json' added (train.npy.json)."""
    return Path(path).with_name(Path(path).name + ".json")


def read_sidecar(path: str | os.PathLike) -> dict[str, Any] | None:
    """The JSON sidecar of a token file, or None when it has none. What the reader needs of it
    is checked in open_tokens; prepare_tokens.py --verify checks every field."""
    side = sidecar_path(path)
    try:  # O_NONBLOCK: opening a FIFO for reading must not wait for a writer
        fd = os.open(side, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as error:  # a link loop, a permission: not the same as no sidecar
        raise TokenFileError(f"{str(side)!r} cannot be read ({error.strerror}); fix or delete it")
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TokenFileError(
                f"{str(side)!r} is not a file: a sidecar is a JSON file, or absent"
            )
        text = f.read()
    try:
        meta = json.loads(text)
    except (ValueError, RecursionError) as error:  # ValueError: bad JSON or UTF-8
        raise TokenFileError(f"{str(side)!r} is not JSON ({error}); write the file again") from None
    if not isinstance(meta, dict) or meta.get("format") != "npy-tokens":
        raise TokenFileError(f'{str(side)!r} is not a sidecar: it lacks "format": "npy-tokens"')
    version = meta.get("format_version")
    if type(version) is not int or not 1 <= version <= FORMAT_VERSION:
        newer = f"this npy_datasets.py reads 1 to {FORMAT_VERSION}: copy a newer one"
        raise TokenFileError(f"{str(side)!r} has format_version {version!r}; {newer}")
    return meta


def open_tokens(
    path: str | os.PathLike,
    dtype: Any = None,
    *,
    vocab_size: int | None = None,
    verify: bool = False,
) -> np.memmap:
    """A token file as a read-only memmap, once it and its sidecar are checked.

    The format comes from the first bytes: .npy, an llm.c shard, or else raw ids such as nanoGPT's
    train.bin (pass dtype= where no sidecar gives it). vocab_size refuses ids at or past it, by
    the sidecar's max_token_id or else one scan of the file. verify=True also compares the file's
    sha256 with the sidecar's, a read of every byte.
    """
    return _memmap(_open_file(os.fspath(path), dtype, vocab_size, verify))


def _open_file(path: str, dtype: Any, vocab_size: int | None, verify: bool) -> TokenFile:
    """A token file checked: one stat, its sidecar, a read of its head and tail, its header."""
    if vocab_size is not None:
        _check_int("vocab_size", vocab_size, 1)
    if type(verify) is not bool:
        raise TypeError(f"verify must be True or False, got {verify!r}")
    if dtype is not None:
        dtype = _token_dtype(dtype, "the dtype argument")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path!r} does not exist") from None
    except OSError as error:  # a permission, a link loop, ...
        raise TokenFileError(f"{path!r} cannot be read ({error.strerror})") from None
    if not stat.S_ISREG(st.st_mode):  # a folder; or a FIFO, whose reader waits for a writer
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise TokenFileError(f"{path!r} is {kind}; expected a .npy or .bin token file")
    if st.st_size == 0:
        raise TokenFileError(f"{path!r} is empty (0 bytes); write it again")
    meta = read_sidecar(path) or {}
    with open(path, "rb") as f:
        head = f.read(PROBE_BYTES)
        layout, found, shape, offset = _layout(path, head, st.st_size, meta, dtype)
        probe = _probe(f, head, st.st_size)
        if verify:
            _check_sha256(path, f, meta)
    if dtype is not None and dtype != found:
        raise TokenFileError(f"{path!r} holds {found.name}, but dtype={dtype.name} was passed")
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    file = TokenFile(path, layout, found, shape, offset, identity, probe, meta)
    if meta:
        _check_against_sidecar(file)
    if vocab_size is not None:  # the sidecar's max_token_id, or else one scan of the file
        top = meta["max_token_id"] if meta else int(_memmap(file).max())
        if top >= vocab_size:
            raise TokenFileError(f"{path!r} holds ids up to {top}, past vocab_size={vocab_size}")
    return file


def _check_sha256(path: str, f: BinaryIO, meta: dict[str, Any]) -> None:
    if not meta:
        raise TokenFileError(f"{path!r} has no sidecar, whose sha256 verify=True compares")
    f.seek(0)
    if hashlib.file_digest(f, "sha256").hexdigest() != meta.get("sha256"):
        raise TokenFileError(
            f"{path!r} is damaged or was replaced: its sha256 is not its sidecar's"
        )


def _check_against_sidecar(file: TokenFile) -> None:
    """The sidecar must describe this very file: its format, its size, its first and last bytes."""
    actual = {"layout": file.layout, "dtype": file.dtype.name, "shape": list(file.shape)}
    actual |= {"file_size": file.identity[2], "probe_sha256": file.probe}
    bad = next((key for key in actual if file.sidecar.get(key) != actual[key]), None)
    if bad is not None:
        found = f"{bad} is {file.sidecar.get(bad)!r:.80} in the sidecar, {actual[bad]!r:.80} here"
        fix = "the file was replaced, swapped or damaged: write it again"
        raise TokenFileError(f"{file.path!r} does not match its sidecar: {found}; {fix}")
    if type(file.sidecar.get("max_token_id")) is not int:
        raise TokenFileError(f"{file.path!r}'s sidecar has no int max_token_id; write it again")


def _layout(
    path: str, head: bytes, size: int, meta: dict[str, Any], dtype: np.dtype | None
) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """The layout, told by the first bytes, and the dtype, shape and offset of the ids. A
    sidecar that says "bin" is final: raw ids may spell a magic (GPT-2's 20115, 19797, 22864)."""
    magic = int.from_bytes(head[:4], "little")
    raw = meta.get("layout") == "bin"
    dtype = meta.get("dtype", dtype)  # raw ids: the sidecar's dtype, or else the argument's
    if not raw and (head.startswith(NPY_MAGIC) or path.endswith(".npy")):
        return ("npy", *_npy_layout(path, head))
    if not raw and (magic in LLMC_VERSIONS or magic in LLMC_OTHER_FILES):
        return ("llmc", *_llmc_layout(path, head, size))
    if dtype is None:
        nanogpt = "pass dtype=np.uint16 (nanoGPT's train.bin) or np.uint32"
        raise TokenFileError(
            f"{path!r} holds raw ids and has no sidecar to give their dtype: {nanogpt}"
        )
    dtype = _token_dtype(dtype, repr(path))
    if size % dtype.itemsize:
        raise TokenFileError(f"{path!r} has {size} bytes, not a whole number of {dtype.name} ids")
    return "bin", dtype, (size // dtype.itemsize,), 0


def _npy_layout(path: str, head: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """A .npy file's dtype, shape and data offset, as numpy reads them (never a pickle), and the
    checks numpy leaves to us: ids of uint16 or uint32, 1-D or 2-D, in C order, not empty."""
    if not head.startswith(NPY_MAGIC):
        cut = NPY_MAGIC.startswith(head)  # the first bytes of the magic, then the end
        problem = "is cut short inside" if cut else f"starts with {head[:6]!r}, not"
        raise TokenFileError(f"{path!r} {problem} the .npy magic (raw ids belong in a .bin)")
    try:
        array = np.load(path, mmap_mode="r")  # allow_pickle=False, numpy's default
    except (ValueError, OSError, EOFError) as error:
        reason = "it holds pickled Python objects" if "pickle" in str(error) else error
        raise TokenFileError(f"{path!r} is not a .npy file numpy can map: {reason}") from None
    dtype = _token_dtype(array.dtype, repr(path))
    if array.ndim not in (1, 2) or array.size == 0 or not array.flags.c_contiguous:
        found = f"shape {array.shape}, {'C' if array.flags.c_contiguous else 'Fortran'} order"
        raise TokenFileError(f"{path!r} holds {found}: ids are 1-D or 2-D, C order, not empty")
    return dtype, array.shape, array.offset


def _llmc_layout(path: str, head: bytes, size: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """An llm.c shard's header, checked as llm.c checks it (magic and version), and its size."""
    magic, version, count = np.frombuffer(head[:12].ljust(12, b"\0"), dtype="<i4").tolist()
    if magic in LLMC_OTHER_FILES:
        other = f"llm.c's {LLMC_OTHER_FILES[magic]} file, not a token shard (20240520 or 20240801)"
        raise TokenFileError(f"{path!r} has the magic {magic} of {other}")
    if version != LLMC_VERSIONS[magic]:
        expected = f"which goes with version {LLMC_VERSIONS[magic]}, not {version}"
        raise TokenFileError(f"{path!r} has the llm.c magic {magic}, {expected}")
    dtype = LLMC_DTYPES[magic]
    needed = LLMC_HEADER_BYTES + count * dtype.itemsize
    if count <= 0 or needed != size:
        declared = f"declares {count} tokens of {dtype.name} ({needed} bytes with the header)"
        raise TokenFileError(f"{path!r}: its llm.c header {declared}, but the file has {size}")
    return dtype, (count,), LLMC_HEADER_BYTES


def _token_dtype(dtype: Any, where: str) -> np.dtype:
    """dtype as little-endian uint16 or uint32, the widths token ids take, or an error."""
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy raises either for what is not a dtype
        raise TokenFileError(
            f"{where}: {dtype!r} is not a dtype; expected uint16 or uint32"
        ) from None
    if found.kind != "u" or found.itemsize not in (2, 4) or found.byteorder == ">":
        raise TokenFileError(f"{where}: dtype {found.str!r} is not uint16 or uint32, little-endian")
    return found.newbyteorder("<")


def _memmap(file: TokenFile) -> np.memmap:
    """The file's ids, mapped read-only."""
    try:
        return np.memmap(file.path, file.dtype, "r", offset=file.offset, shape=file.shape)
    except OSError as error:  # out of file descriptors, say: each map holds one
        limit, in_use = _descriptors()
        fix = ""
        if error.errno in (errno.EMFILE, errno.ENFILE):
            fix = f": {in_use} of the open-file limit of {limit} are in use; raise it (ulimit -n)"
        raise TokenFileError(f"{file.path!r} cannot be mapped ({error.strerror}){fix}") from None


def _descriptors() -> tuple[int | None, int]:
    """This process's open-file limit (None where none is known) and the descriptors it uses."""
    try:
        import resource  # Unix only

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        in_use = len(os.listdir("/dev/fd"))  # Linux and macOS
    except (ImportError, OSError):
        return None, 0
    return (None if limit == resource.RLIM_INFINITY else limit), in_use


def _check_int(name: str, value: Any, low: int, high: int = 2**63 - 1) -> None:
    """Refuse value unless it is an int (a numpy int too, a bool never) from low to high."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.80}")
    if not low <= value <= high:
        valid = f"at least {low}" if high == 2**63 - 1 else f"from {low} to {high:,}"
        raise ValueError(f"{name} must be {valid}, got {value}")


# ---- 2. The dataset: windows, and one batched gather -------------------------------------------


class NpyTokensDataset:
    """(x, y) next-token windows of memmapped token files: int64 tensors of shape (seq_len,), y
    being x shifted by one token. A map-style dataset: DataLoader needs len() and indexing only.

    ds[i] is window i; ds[epoch, indices] a batch, gathered in one pass (what EpochSampler hands
    a DataLoader). Files (a list, or a glob sorted by name) share one index space; no window
    crosses a file, or a row of a 2-D file. mode="windows": window i is tokens[i*seq_len :
    (i+1)*seq_len + 1]. mode="random": num_samples windows an epoch, each starting anywhere, at a
    place drawn from (seed, epoch, i) alone.
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
        _check_int("seq_len", seq_len, 1)
        _check_int("seed", seed, 0)
        if mode not in ("windows", "random"):
            raise ValueError(f'mode must be "windows" or "random", got {mode!r}')
        if num_samples is not None and mode != "random":
            raise ValueError('num_samples applies to mode="random" only')
        self.seq_len = int(seq_len)
        self.mode = mode
        self.seed = int(seed)
        self.paths = _expand_paths(path)
        self.files = [_open_file(p, dtype, vocab_size, verify) for p in self.paths]  # fail now
        self.dtype = self.files[0].dtype
        _check_one_dtype_and_tokenizer(self.files)
        shapes = [f.shape if len(f.shape) == 2 else (1, f.shape[0]) for f in self.files]
        shapes = np.array(shapes, dtype=np.int64)  # (rows, tokens of each row) of each file
        rows = shapes[:, 0]
        self._row_len = shapes[:, 1]
        self._windows_per_row = (self._row_len - 1) // self.seq_len
        self._starts_per_row = np.maximum(self._row_len - self.seq_len, 0)  # random starts
        self._window_bounds = _bounds(rows * self._windows_per_row)
        self._start_bounds = _bounds(rows * self._starts_per_row)
        if self._window_bounds[-1] == 0:
            where = repr(self.paths[0]) if len(self.paths) == 1 else f"{len(self.paths)} files"
            need = f"seq_len={seq_len} needs {seq_len + 1} (x and the shifted y)"
            fix = "pass a smaller seq_len, or rerun the prep step with a larger --val-fraction"
            longest = f"its longest sequence has {self._row_len.max()} tokens"
            raise ValueError(f"{where} holds no window: {longest}, {need}; {fix}")
        if num_samples is not None:
            _check_int("num_samples", num_samples, 1)
        self.num_samples = int(self._window_bounds[-1] if num_samples is None else num_samples)
        self._one_flat_file = len(self.files) == 1 and len(self.files[0].shape) == 1
        self._maps: dict[int, np.ndarray] = {}  # file -> its windows, least recently used first
        self._pid = os.getpid()  # the process whose maps _maps holds
        self._max_maps = _map_cap()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}  # never pickle mapped data: workers map their own

    def __len__(self) -> int:
        return self.num_samples

    def fingerprint(self) -> dict[str, Any]:
        """What decides the windows: each file's name, size, dtype, shape and hashes; settings."""
        files = [
            {"name": Path(f.path).name, "bytes": f.identity[2], "dtype": self.dtype.name}
            | {"shape": list(f.shape), "sha256": f.sidecar.get("sha256"), "probe": f.probe}
            for f in self.files
        ]
        settings = {"seq_len": self.seq_len, "mode": self.mode, "seed": self.seed}
        return {"files": files, **settings, "num_samples": self.num_samples}

    def __getitem__(self, index: int | tuple[int, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(index, tuple):  # (epoch, indices): a batch
            if len(index) != 2 or not isinstance(index[1], (list, np.ndarray)):
                forms = "ds[i], or ds[epoch, indices] with indices a list or 1-D array"
                raise TypeError(f"an index is {forms}; got {index!r:.80}")
            _check_int("epoch", index[0], 0)
            return self._gather(int(index[0]), self._indices(index[1]))
        x, y = self._gather(0, self._indices([index]))
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch of windows of epoch 0 gathered in one pass, for DataLoader(ds, batch_size=B)."""
        x, y = self._gather(0, self._indices(indices))
        return list(zip(x, y))

    def _indices(self, keys: list | np.ndarray) -> np.ndarray:
        """Window indices as int64 in [0, len(self)); a negative one counts from the end."""
        n = self.num_samples
        if isinstance(keys, np.ndarray) and keys.ndim == 1 and keys.dtype.kind in "iu":
            if len(keys) and 0 <= keys.min() and keys.max() < n:  # a sampler's batch
                return keys.astype(np.int64, copy=False)
        keys = keys.tolist() if isinstance(keys, np.ndarray) else list(keys)
        bad = next(
            (k for k in keys if isinstance(k, bool) or not isinstance(k, (int, np.integer))), None
        )
        if bad is not None:  # a bool is an int to Python, but never an index here
            raise TypeError(f"a window index is an int, got {type(bad).__name__} {bad!r:.80}")
        out = next((k for k in keys if not -n <= k < n), None)
        if out is not None:
            raise IndexError(f"index {out} is out of range for {n} windows of {self.paths[0]!r}")
        return np.array(keys, dtype=np.int64) % n

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
            windows = self._windows(0)[firsts]  # row b: tokens firsts[b] .. + seq_len
        else:
            windows = np.empty((len(firsts), self.seq_len + 1), dtype=self.dtype)
            for f in np.unique(files).tolist():  # file by file: one map in use at a time
                mine = files == f
                windows[mine] = self._windows(f)[firsts[mine]]
        x = windows[:, :-1].astype(np.int64)  # numpy widens unsigned ids exactly
        y = windows[:, 1:].astype(np.int64)
        return torch.from_numpy(x), torch.from_numpy(y)

    def _windows(self, f: int) -> np.ndarray:
        """File f's window view, mapped in this process, once the file is checked to be the one
        opened: reading a mapped file that was truncated in place kills the process (SIGBUS)."""
        file = self.files[f]
        if _identity(file.path) != file.identity:
            changed = "changed since the dataset opened it (size, inode or mtime), or is gone"
            raise TokenFileError(f"{file.path!r} {changed}; open a new dataset once it is written")
        if self._pid != os.getpid():  # a forked DataLoader worker: it maps files of its own
            self._maps = {}  # the maps it inherited go, and their descriptors
            self._pid = os.getpid()
            self._max_maps = _map_cap()
        windows = self._maps.pop(f, None)  # put back last: the most recently used goes last
        while windows is None and len(self._maps) >= self._max_maps:
            del self._maps[next(iter(self._maps))]  # the least recently used map, and its file
        if windows is None:
            windows = _window_view(np.asarray(_memmap(file)).reshape(-1), self.seq_len)
        self._maps[f] = windows
        return windows


def _expand_paths(path: Any) -> list[str]:
    """One token file, a list of them, or a glob pattern ('data/train_*.npy', sorted by name)."""
    files = path if isinstance(path, (list, tuple)) else [path]
    if not files or not all(isinstance(p, (str, os.PathLike)) for p in files):
        raise TypeError(f"path must be a file, a glob or a non-empty list of files: {path!r:.100}")
    text = os.fspath(files[0])
    if isinstance(path, (list, tuple)) or os.path.exists(text) or not set(text) & set("*?["):
        return [os.fspath(p) for p in files]
    found = sorted(p for p in glob.glob(text) if not p.endswith(".json"))  # not the sidecars
    if not found:
        raise FileNotFoundError(f"no token file matches {text!r} (sidecars, *.json, are skipped)")
    return found


def _check_one_dtype_and_tokenizer(files: list[TokenFile]) -> None:
    """The files of one dataset share a dtype and, where sidecars name it, a tokenizer."""
    first = files[0]
    other = next((f for f in files if f.dtype != first.dtype), None)
    if other is not None:
        both = f"{first.path!r} holds {first.dtype.name}: a dataset has one dtype"
        raise TokenFileError(f"{other.path!r} holds {other.dtype.name}, but {both}")
    named = [f for f in files if "tokenizer" in f.sidecar]
    other = next(
        (f for f in named if f.sidecar["tokenizer"] != named[0].sidecar["tokenizer"]), None
    )
    if other is not None:
        both = f"{named[0].path!r} by {named[0].sidecar['tokenizer']!r}"
        raise TokenFileError(
            f"{other.path!r} was tokenized by {other.sidecar['tokenizer']!r}, but {both}: "
            "the files of one dataset need one tokenizer"
        )


def _identity(path: str) -> tuple[int, int, int, int] | None:
    """What tells a file from its replacement: device, inode, size, last change; None if gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _map_cap() -> int:
    """How many files this process keeps mapped: MAX_OPEN_FILES, or where fewer descriptors are
    free, half of those left after DataLoader's own (a worker hands each batch over in some)."""
    limit, in_use = _descriptors()
    if limit is None:
        return MAX_OPEN_FILES
    return max(1, min(MAX_OPEN_FILES, (limit - in_use - LOADER_DESCRIPTORS) // 2))


def _window_view(flat: np.ndarray, seq_len: int) -> np.ndarray:
    """A read-only view whose row s is the window tokens s .. s + seq_len: no copy, rows overlap."""
    step = flat.strides[0]
    shape = (max(len(flat) - seq_len, 0), seq_len + 1)
    return np.lib.stride_tricks.as_strided(flat, shape, (step, step), writeable=False)


def _bounds(counts: np.ndarray) -> np.ndarray:
    """[0, c0, c0 + c1, ...]: item k belongs to the f with bounds[f] <= k < bounds[f + 1]."""
    return np.concatenate(([0], np.cumsum(counts)))


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


@dataclass
class SamplerPass:
    """One pass over an EpochSampler, as far as it has gone."""

    epoch: int
    start: int  # where in the epoch's order it began (a global position: all ranks' items)
    items: int  # the indices this rank's pass hands out
    handed: int = 0  # how many of them it has handed out so far


class EpochSampler:
    """Batches of a dataset's window indices, a fresh order each epoch, for one rank: it yields
    (epoch, indices) for DataLoader(ds, sampler=..., batch_size=None).

    Epoch e's order is a permutation of range(n) drawn from (seed, e) alone (range(n) without
    shuffle), the same on every rank; rank r of world_size W (default: torch.distributed's) takes
    items r, r + W, ... When W does not divide n, remainder="drop" leaves out the order's last
    n % W items and "pad" repeats its first W - n % W.

    A pass moves on to the next epoch when the pass before it handed out all of its batches;
    after one left early, the next pass starts that epoch again. DataLoader workers fetch ahead:
    with them, a break in an epoch's last num_workers * prefetch_factor batches (or a peek at an
    epoch that short) has handed out the whole epoch, which then counts as done. A loop that
    calls set_epoch(epoch) before each epoch, as DistributedSampler wants, gets its epochs
    whatever was fetched; state_dict(consumed=step) saves exactly what was trained.
    """

    def __init__(
        self,
        data_source: Any,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        world_size: int | None = None,
        rank: int | None = None,
        remainder: str = "drop",
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        _check_int("seed", seed, 0)
        if type(shuffle) is not bool or type(drop_last) is not bool:
            raise TypeError(
                f"shuffle and drop_last must be True or False: {shuffle!r}, {drop_last!r}"
            )
        if remainder not in ("drop", "pad"):
            raise ValueError(f'remainder must be "drop" or "pad", got {remainder!r}')
        if (world_size is None) != (rank is None):
            raise ValueError(f"pass both world_size and rank, or neither: {world_size}, {rank}")
        if world_size is None:  # torch.distributed's, or one process
            world_size, rank = _distributed_world()
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0, world_size - 1)
        self.num_samples = len(data_source)
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.remainder = remainder
        self._epoch = 0  # the next pass's epoch and start, unless the latest pass went all through
        self._start = 0
        self._resumed = False  # a loaded position that no pass has finished yet
        self._latest: SamplerPass | None = None  # the pass that began last
        fingerprint = getattr(data_source, "fingerprint", None)  # a dataset's files and settings
        self._fingerprint = None if fingerprint is None else fingerprint()
        if not 1 <= self.num_samples <= 2**31:  # an epoch's order is held in memory, 8 bytes each
            fewer = 'for mode="random" pass a smaller num_samples and run more epochs'
            raise ValueError(
                f"EpochSampler takes 1 to 2**31 windows, got {self.num_samples:,}: {fewer}"
            )
        if len(self) == 0:
            share = f"{self._share(self.num_samples)} of the {self.num_samples} windows a rank"
            fix = "use a smaller batch_size, fewer ranks or a shorter seq_len"
            raise ValueError(f"batch_size={batch_size} leaves no batch of {share}: {fix}")

    @property
    def epoch(self) -> int:
        """The epoch of the next pass."""
        return self._next_pass()[0]

    def _finished(self) -> bool:
        """Whether the latest pass has handed out all its batches (all were asked for)."""
        return self._latest is not None and self._latest.handed == self._latest.items

    def _next_pass(self) -> tuple[int, int]:
        """The epoch of the next pass, and its start in that epoch's order."""
        if self._finished():
            return self._latest.epoch + 1, 0
        return self._epoch, self._start

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch `epoch`, from its start; this wins over a pass that is running.
        Right after load_state_dict(), until a pass of the loaded epoch has ended, only that
        epoch is allowed, and it keeps the loaded position: a loop that calls set_epoch(e) before
        each epoch resumes exactly, and one that would replay or skip data is stopped."""
        _check_int("epoch", epoch, 0)
        resuming = self._resumed and not self._finished()
        if resuming and epoch != self._epoch:
            loaded = f"continues epoch {self._epoch} at position {self._start}"
            then = f"that would {'replay' if epoch < self._epoch else 'skip'} data"
            raise ValueError(
                f"set_epoch({epoch}) after load_state_dict(), whose state {loaded}: {then}; "
                "call set_epoch(sampler.epoch), or count your epochs from there"
            )
        self._start = self._start if resuming else 0
        self._epoch = int(epoch)
        self._resumed = resuming
        self._latest = None  # a state saved now describes the pass to come

    def __len__(self) -> int:
        """Batches of the next pass: fewer when it resumes an epoch part of the way in."""
        items = self._share(self.num_samples - self._next_pass()[1])
        return items // self.batch_size if self.drop_last else _ceil_div(items, self.batch_size)

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

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        # A generator: the pass begins when its first batch is asked for, and only then decides
        # its epoch. Workers ask ahead of the loop: the pass counts what it handed out.
        batches = len(self)
        self._resumed = self._resumed and not self._finished()
        epoch, start = self._next_pass()
        mine = self.order(epoch, start)[: batches * self.batch_size]  # drop_last: whole batches
        current = SamplerPass(epoch, start, len(mine))
        self._epoch = epoch
        self._start = start
        self._latest = current
        for lo in range(0, len(mine), self.batch_size):
            current.handed = min(lo + self.batch_size, len(mine))
            yield epoch, mine[lo : lo + self.batch_size]

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the next batch comes from: an epoch and a position in its order (JSON-ready).

        consumed: the batches of the latest pass that the loop has trained on, as `step` in
        `for step, batch in enumerate(loader, 1)` once that step is done. Left out: what the
        sampler handed out, the same without DataLoader workers; workers fetch ahead, so with
        them pass it. numpy draws the orders: pin its version for exact resumes across upgrades.
        """
        latest = self._latest
        if consumed is not None:
            _check_int("consumed", consumed, 0)
        if latest is None:
            if consumed:
                raise ValueError(f"consumed={consumed}, but no pass has started since the last set")
            epoch, position = self._epoch, self._start
        else:
            items = latest.handed
            if consumed is not None:
                handed = _ceil_div(latest.handed, self.batch_size)
                if consumed > handed:
                    count = "count the batches of this pass (enumerate(loader, 1)), not all steps"
                    raise ValueError(
                        f"consumed={consumed}, but the pass has handed out {handed}: {count}"
                    )
                items = min(consumed * self.batch_size, latest.items)
            epoch, position = latest.epoch, latest.start + items * self.world_size
            if items == latest.items:  # the whole pass: the next epoch from its start
                epoch, position = latest.epoch + 1, 0
        state = {"format": SAMPLER_STATE_FORMAT, "version": 1, "epoch": epoch, "position": position}
        settings = {"num_samples": self.num_samples, "shuffle": self.shuffle, "seed": self.seed}
        return {**state, "dataset": self._fingerprint, **settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict(): the next pass starts exactly where that one stopped. The
        state must come from the same windows and seed; another world_size or batch_size is fine."""
        if not isinstance(state, dict) or state.get("format") != SAMPLER_STATE_FORMAT:
            raise ValueError(f"not an EpochSampler state: {state!r:.200}")
        mine = self.state_dict() | {"epoch": state.get("epoch"), "position": state.get("position")}
        if set(state) != set(mine):
            raise ValueError(
                f"EpochSampler state: expected the keys {sorted(mine)}, got {sorted(state)}"
            )
        bad = next((k for k in mine if json.dumps(state.get(k)) != json.dumps(mine[k])), None)
        if bad is not None:  # JSON compares types too: true is not 1
            there = f"{state.get(bad)!r:.120} in the state, {mine[bad]!r:.120} here"
            raise ValueError(f"EpochSampler state of other windows or order: {bad} is {there}")
        epoch, position = state["epoch"], state["position"]
        if type(epoch) is not int or epoch < 0:
            raise ValueError(f"EpochSampler state: epoch must be an int >= 0, got {epoch!r}")
        if type(position) is not int or not 0 <= position < self.num_samples:
            valid = f"an int in [0, {self.num_samples})"
            raise ValueError(f"EpochSampler state: position must be {valid}, got {position!r}")
        self._epoch = epoch
        self._start = position
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

    for name, ds in (("train", train), ("val", val)):
        if not isinstance(ds, NpyTokensDataset) and not (name == "val" and ds is None):
            raise TypeError(f"{name} must be an NpyTokensDataset, got {type(ds).__name__}")
    _check_int("num_workers", num_workers, 0)
    _check_int("prefetch_factor", prefetch_factor, 1)
    if pin_memory is not None and type(pin_memory) is not bool:
        raise TypeError(f"pin_memory must be True, False or None, got {pin_memory!r}")
    if num_workers:
        _check_descriptors_for_workers(num_workers, prefetch_factor)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        val_fingerprint = None if val is None else val.fingerprint()
        fingerprints = {"train": train.fingerprint(), "val": val_fingerprint}
        verify_across_ranks({**fingerprints, "batch_size": batch_size, "seed": seed})
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    if pin and torch.cuda.is_available():
        _check_pinning()
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


def _check_descriptors_for_workers(num_workers: int, prefetch_factor: int) -> None:
    """Workers hand each batch over through shared memory, a file descriptor a tensor: under a low
    open-file limit they fail, or the loader waits for ever. Refuse at once, naming the limit."""
    limit, in_use = _descriptors()
    needed = LOADER_DESCRIPTORS + BATCH_DESCRIPTORS * num_workers * prefetch_factor
    if limit is not None and limit - in_use < needed:
        fix = f"raise it (ulimit -n {max(4096, 2 * (in_use + needed))}) or use num_workers=0"
        state = f"the open-file limit is {limit}, {in_use} in use"
        raise ValueError(
            f"num_workers={num_workers} needs {needed} free descriptors, {state}: {fix}"
        )


def _check_pinning() -> None:
    """Pinned memory starts CUDA, which needs descriptors of its own: start it now, so that a low
    open-file limit is named here rather than failing in the loader's first batch."""
    import torch

    try:
        torch.empty(1).pin_memory()
    except RuntimeError as error:  # torch.AcceleratorError is one
        limit, in_use = _descriptors()
        first = str(error).strip().splitlines()[0]
        state = f"the open-file limit is {limit}, {in_use} in use"
        fix = "raise it (ulimit -n 4096) or pass pin_memory=False"
        raise RuntimeError(
            f"pinning memory starts CUDA, which failed ({first}); {state}: {fix}"
        ) from error


def verify_across_ranks(settings: dict[str, Any], group: Any = None) -> None:
    """Check that every rank of torch.distributed passes equal JSON-able settings (a dataset's
    fingerprint(), say); raise on every rank, naming the first rank that differs and the key."""
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
        bad = next((k for k in {**seen[0], **theirs} if theirs.get(k) != seen[0].get(k)), None)
        if bad is not None:
            there = f"{seen[0].get(bad)!r:.120} on rank 0, {theirs.get(bad)!r:.120} on rank {rank}"
            raise RuntimeError(f"rank {rank} differs from rank 0 in {bad!r}: {there}")


def to_device(
    batch: Sequence[torch.Tensor], device: str | torch.device
) -> tuple[torch.Tensor, ...]:
    """Move a batch's tensors to device, asynchronously from pinned memory. (bench_loader.py --gpu
    times this against uint16 ids widened there: either takes microseconds, a GPU step ms.)"""
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)
