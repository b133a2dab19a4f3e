"""Serve (x, y) next-token windows from token files on disk, without loading them into RAM.

Copy this one file into your project: it needs Python 3.11+, numpy, torch and the standard library.

    train = NpyTokensDataset("data/tinystories/train.npy", seq_len=256)  # or a list, or a glob
    val = NpyTokensDataset("data/tinystories/validation.npy", seq_len=256)
    train_loader, val_loader = make_dataloaders(train, val, batch_size=32)
    if resuming:  # after loading the model and the optimizer from the same checkpoint
        train_loader.load_state_dict(checkpoint["loader"])
    for epoch in range(train_loader.sampler.epoch, 10):  # a resumed run starts at the saved epoch
        train_loader.sampler.set_epoch(epoch)
        for batch in train_loader:  # after a resume, the rest of the saved epoch
            x, y = to_device(batch, "cuda")  # int64, (32, 256) each: y is x shifted by one token
            ...  # loss = model(x, y); now and then save the model, the optimizer and
            # train_loader.state_dict() together: the state counts the batches this loop received

len(train_loader) is always a whole epoch's batches; count your steps yourself. Lightning and
accelerate take these loaders as they are (the README shows how).

Importing it imports numpy only (torch where used): a prep step can write token files without torch."""

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

PathLike = str | os.PathLike  # a path, as a str or a Path

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORMAT_VERSION",
    "TokenFileError",
    "write_tokens",
    "read_sidecar",
    "open_tokens",
    "NpyTokensDataset",
    "EpochSampler",
    "EpochLoader",
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
LLMC_OTHER_FILES = (20240326, 20240327, 20240328, 20240522)  # llm.c's model, state, ... files
PROBE_BYTES = 1 << 16  # every open hashes a file's first and last 64 KiB: a swap shows, cheaply
MAX_OPEN_FILES = 1024  # files one process keeps mapped at most (each map holds a descriptor)
# Descriptors DataLoader workers need free: 2 workers with prefetch_factor 2 hung under 24 free,
# that is 16 for the loader and 2 (x and y) for each batch in flight; 4 a batch doubles that.
LOADER_DESCRIPTORS = 16
BATCH_DESCRIPTORS = 4
# The sidecar fields write_tokens measures or takes as arguments, and their JSON types: **fields
# cannot set them, and read_sidecar refuses a sidecar that lacks one.
WRITTEN_FIELDS = {"format": str, "format_version": int, "file": str, "layout": str, "dtype": str}
WRITTEN_FIELDS |= {"shape": list, "n_tokens": int, "file_size": int, "sha256": str}
WRITTEN_FIELDS |= {"probe_sha256": str, "max_token_id": int, "tokenizer": str, "n_vocab": int}
WRITTEN_FIELDS |= {"eot_id": int}
JSON_TYPES = {str: "string", int: "integer", list: "array"}


class TokenFileError(ValueError):
    """A token file, or its sidecar, is not what the loader can read safely."""


class TokenFile(NamedTuple):
    """A token file as it was when it was checked and opened."""

    path: str
    layout: str  # "npy" or "llmc" (both told by their first bytes), or "bin" (raw ids)
    dtype: np.dtype
    shape: tuple[int, ...]  # (tokens,), or (sequences, tokens of each) for a 2-D .npy
    offset: int  # bytes before the first id
    identity: tuple[int, int, int, int]  # device, inode, size, mtime: a replacement differs
    probe: str  # sha256 of its first and last PROBE_BYTES
    sidecar: dict[str, Any]  # {} for a file without one


def write_tokens(
    path: PathLike,
    ids: Any,
    *,
    n_vocab: int,
    tokenizer: str,
    eot_id: int,
    dtype: Any = None,
    header: Callable[[np.dtype, tuple[int, ...]], bytes] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """Write ids below n_vocab, then their JSON sidecar (with fields); return the sidecar. ids: an
    array (2-D: a row a sequence), or an iterable of 1-D arrays, streamed (one a document, say).
    A .bin path gets raw ids, any other .npy, or header(dtype, shape)'s bytes (one length for any
    shape). Nothing old is replaced until all is written."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{str(path)!r} is a folder; write_tokens needs a file path")
    _check_int("n_vocab", n_vocab, 1, 2**32)
    _check_int("eot_id", eot_id, 0, n_vocab - 1)
    if not isinstance(tokenizer, str) or not tokenizer:
        raise TypeError(f"tokenizer must be a name such as 'tiktoken:gpt2', got {tokenizer!r}")
    if dtype is None:  # GPT-2's largest id, 50256, fits uint16
        dtype = "<u2" if n_vocab <= 2**16 else "<u4"
    dtype = _token_dtype(dtype, "the dtype argument")
    if n_vocab - 1 > np.iinfo(dtype).max:
        raise ValueError(f"n_vocab={n_vocab:,} has ids that {dtype.name} cannot hold")
    taken = sorted(fields.keys() & WRITTEN_FIELDS)
    if taken:
        raise TypeError(f"{str(path)!r}: write_tokens sets {taken} itself; nothing written")
    fields = {k: v.item() if isinstance(v, np.generic) else v for k, v in fields.items()}
    try:  # (ids == eot).sum() is a numpy int, now an int; what JSON cannot hold is refused
        fields = json.loads(json.dumps(fields, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise TypeError(f"{str(path)!r}: a sidecar field is not JSON ({error}); nothing written")
    fields = {**fields, "tokenizer": tokenizer}
    fields |= {"n_vocab": int(n_vocab), "eot_id": int(eot_id)}
    if header is None:  # raw ids in a .bin, as nanoGPT's train.bin
        header = (lambda dtype, shape: b"") if path.suffix == ".bin" else _npy_header
    return _write_atomically(path, ids, dtype, n_vocab, header, fields)


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    header = io.BytesIO()  # numpy pads it to 128 bytes for any shape
    fields = {"descr": dtype.str, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    return header.getvalue()


def _write_atomically(
    path: Path, ids: Any, dtype: np.dtype, n_vocab: int, header: Callable, fields: dict
) -> dict[str, Any]:
    """New files, renamed over the old ones after the old sidecar: none describes another file."""
    side = sidecar_path(path)
    tag = f"tmp.{os.getpid()}.{secrets.token_hex(4)}"  # .train.npy.tmp.<pid>.<random>
    short = os.fsencode(path.name)[:200].decode("utf-8", "ignore")  # a name holds 255 bytes
    tmp = path.with_name(f".{short}.{tag}")
    side_tmp = path.with_name(f".{short}.json.{tag}")
    try:
        with open(tmp, "x+b") as f:  # "x": never a file, or a link, planted at that name
            meta = _write_ids(f, path, ids, dtype, n_vocab, header)
        meta |= fields
        with open(side_tmp, "xb") as f:
            f.write((json.dumps(meta, sort_keys=True, indent=2) + "\n").encode())
            os.fsync(f.fileno())
        side.unlink(missing_ok=True)
        os.replace(tmp, path)
        os.replace(side_tmp, side)
        if os.name != "nt":  # the renames survive a power cut (Windows cannot open a folder)
            folder = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except OSError as error:  # a full disk names no file, a missing folder the temporary one
        if error.filename in (None, str(tmp), str(side_tmp)):
            raise OSError(error.errno, f"{error.strerror} while writing", str(path)) from error
        raise
    finally:
        tmp.unlink(missing_ok=True)  # gone already after a rename
        side_tmp.unlink(missing_ok=True)
    return meta


def _write_ids(
    f: BinaryIO, path: Path, ids: Any, dtype: np.dtype, n_vocab: int, header: Callable
) -> dict[str, Any]:
    """Stream ids into f after a header rewritten once their count is known; return what the
    sidecar says of the file, spelled once: open_tokens compares it with the file."""
    start = header(dtype, (0,))
    layout = "bin" if not start else "npy" if start.startswith(NPY_MAGIC) else "llmc"
    llmc = int.from_bytes(start[:4], "little") in LLMC_VERSIONS
    if (layout == "llmc" and not llmc) or (path.suffix == ".npy" and layout != "npy"):
        raise ValueError(f"{str(path)!r}: header= writes llm.c's header only (.npy: numpy's)")
    one_array = isinstance(ids, (list, tuple, range)) or hasattr(ids, "__array__")  # torch's too
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{str(path)!r}: ids are an array of ints, or an iterable of them")
    chunks = [ids] if one_array else ids  # else an iterable of 1-D arrays
    most_dims = 2 if one_array and layout == "npy" else 1  # raw ids keep no rows
    f.write(start)
    count, top, shape = 0, 0, (0,)
    for chunk in chunks:
        tokens = _checked_ids(path, chunk, dtype, n_vocab, most_dims)
        f.write(memoryview(tokens.reshape(-1)).cast("B"))  # 1-D: (0, 5) cannot be cast
        count += tokens.size
        top = max(top, int(tokens.max(initial=0)))
        shape = tokens.shape if one_array else (count,)
    if count == 0:
        raise ValueError(f"{str(path)!r}: no token ids to write; nothing written")
    f.seek(0)
    if f.write(header(dtype, shape)) != len(start):
        raise ValueError(f"{str(path)!r}: header= must give bytes of one length for any shape")
    f.flush()
    os.fsync(f.fileno())
    size = os.fstat(f.fileno()).st_size
    f.seek(0)
    sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    f.seek(0)
    probe = _probe(f, f.read(PROBE_BYTES), size)
    about = {"format": "npy-tokens", "format_version": FORMAT_VERSION, "file": path.name}
    about |= {"layout": layout, "dtype": dtype.name, "shape": list(shape), "n_tokens": count}
    return about | {"file_size": size, "sha256": sha256, "probe_sha256": probe, "max_token_id": top}


def _checked_ids(
    path: Path, chunk: Any, dtype: np.dtype, n_vocab: int, most_dims: int
) -> np.ndarray:
    """chunk as C-ordered ids of dtype, once each is below n_vocab: astype would wrap 70000."""
    try:
        ids = np.asarray(chunk)
    except ValueError:  # numpy refuses a ragged list
        fix = "to write rows of many lengths, pass an iterator of 1-D arrays: iter(rows)"
        raise ValueError(f"{str(path)!r}: ragged ids; {fix}; nothing written") from None
    except TypeError:  # torch's bfloat16, which numpy has no type for
        found = getattr(chunk, "dtype", type(chunk).__name__)
        raise TypeError(f"{str(path)!r}: ids must be integers, not {found}") from None
    if not 1 <= ids.ndim <= most_dims or (ids.size and ids.dtype.kind not in "iu"):
        found = f"{ids.dtype} {ids.shape}"
        valid = "1-D or 2-D (.npy)" if most_dims == 2 else "1-D"
        raise TypeError(f"{str(path)!r}: ids must be {valid} integers, not {found}")
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        bad = ids.min() if ids.min() < 0 else ids.max()
        raise ValueError(f"{str(path)!r}: token id {bad} is not below n_vocab={n_vocab}")
    return np.ascontiguousarray(ids, dtype=dtype)  # C order, the order the file is read in


def _probe(f: BinaryIO, head: bytes, size: int) -> str:
    """sha256 of a file's first and last PROBE_BYTES: two files of one size differ there."""
    f.seek(max(len(head), size - PROBE_BYTES))  # the tail, never the head twice
    return hashlib.sha256(head + f.read(PROBE_BYTES)).hexdigest()


def sidecar_path(path: PathLike) -> Path:
    """A token file's JSON sidecar: its name with '.json' added (train.npy.json)."""
    return Path(path).with_name(Path(path).name + ".json")


def read_sidecar(path: PathLike) -> dict[str, Any] | None:
    """A token file's JSON sidecar, or None; every field write_tokens writes, of its JSON type
    (`prepare_tokens.py --verify` checks their values)."""
    side = sidecar_path(path)
    if not os.path.lexists(side):
        return None
    if not side.is_file():  # a FIFO would make the read below wait for a writer
        raise TokenFileError(f"{str(side)!r} is not a file: a sidecar is JSON, or absent")
    try:
        meta = json.loads(side.read_bytes())
    except (OSError, ValueError, RecursionError) as error:  # ValueError: bad JSON or UTF-8
        raise TokenFileError(
            f"{str(side)!r} is no JSON to read ({error}); write it again"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != "npy-tokens":
        raise TokenFileError(f'{str(side)!r} is not a sidecar: it lacks "format": "npy-tokens"')
    version = meta.get("format_version")
    if type(version) is int and not 1 <= version <= FORMAT_VERSION:  # 1.0 or true: below
        newer = f"this npy_datasets.py reads 1 to {FORMAT_VERSION}: copy a newer one"
        raise TokenFileError(f"{str(side)!r} has format_version {version!r}; {newer}")
    for key, kind in WRITTEN_FIELDS.items():  # exact: a JSON true is a bool, not an integer
        if type(meta.get(key)) is not kind:
            found = f"is {meta[key]!r:.60}, not" if key in meta else "is missing: it needs"
            problem = f"{key!r} {found} a JSON {JSON_TYPES[kind]}"
            fix = "write the file again (rerun the prep step, or write_tokens)"
            raise TokenFileError(f"{str(side)!r}: {problem}; {fix}")
    return meta


def open_tokens(
    path: PathLike, dtype: Any = None, *, vocab_size: int | None = None, verify: bool = False
) -> np.memmap:
    """A token file (.npy, llm.c shard, or raw ids of the sidecar's dtype or dtype=) as a
    read-only memmap; vocab_size refuses larger ids, verify=True checks the sha256 too."""
    return _memmap(_open_file(os.fspath(path), dtype, vocab_size, verify))


def _open_file(path: str, dtype: Any, vocab_size: int | None, verify: bool) -> TokenFile:
    """A token file checked: a stat, its sidecar, a read of its head and tail, its header."""
    if vocab_size is not None:
        _check_int("vocab_size", vocab_size, 1)
    if type(verify) is not bool:
        raise TypeError(f"verify must be True or False, got {verify!r}")
    dtype = None if dtype is None else _token_dtype(dtype, "the dtype argument")
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
    if verify and not meta:
        raise TokenFileError(f"{path!r} has no sidecar, whose sha256 verify=True compares")
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())  # the file open now: all below reads it, and _memmap maps it
        head = f.read(PROBE_BYTES)
        layout, found, shape, offset = _layout(path, head, st.st_size, meta, dtype)
        probe = _probe(f, head, st.st_size)
        f.seek(0)
        digest = hashlib.file_digest(f, "sha256").hexdigest() if verify else None
    if dtype not in (None, found):
        raise TokenFileError(f"{path!r} holds {found.name}, but dtype={dtype.name} was passed")
    actual = {"layout": layout, "dtype": found.name, "shape": list(shape), "file_size": st.st_size}
    actual["probe_sha256"] = probe
    bad = next((key for key in actual if meta and meta.get(key) != actual[key]), None)
    if bad is not None:  # the sidecar must describe this very file
        was = f"{bad} is {meta.get(bad)!r:.70} there, {actual[bad]!r:.70} here"
        raise TokenFileError(f"{path!r} was replaced or damaged since its sidecar: {was}")
    if verify and digest != meta.get("sha256"):  # a read of every byte
        raise TokenFileError(
            f"{path!r} is damaged: its sha256 is not its sidecar's, which verify=True compares"
        )
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    file = TokenFile(path, layout, found, shape, offset, identity, probe, meta)
    if vocab_size is not None:  # the sidecar's max_token_id, or else one scan of the file
        top = meta.get("max_token_id") if meta else int(_memmap(file).max())
        if type(top) is not int:
            raise TokenFileError(f"{path!r}'s sidecar has no max_token_id to check vocab_size with")
        if top >= vocab_size:
            raise TokenFileError(f"{path!r} holds ids up to {top}, past vocab_size={vocab_size}")
    return file


def _layout(
    path: str, head: bytes, size: int, meta: dict[str, Any], dtype: np.dtype | None
) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """The layout the first bytes tell, and the ids' dtype, shape and offset. A sidecar's "bin"
    is final: raw ids may spell a magic (GPT-2's 20115, 19797, 22864 are b"\x93NUMPY")."""
    magic = int.from_bytes(head[:4], "little")
    raw = meta.get("layout") == "bin"
    if not raw and (head.startswith(NPY_MAGIC) or path.endswith(".npy")):
        return ("npy", *_npy_layout(path, head, size))
    if not raw and magic in LLMC_OTHER_FILES:
        raise TokenFileError(f"{path!r} is an llm.c file, but not a token shard: magic {magic}")
    if not raw and magic in LLMC_VERSIONS:  # checked as llm.c checks it: magic, version, size
        version, count = np.frombuffer(head[4:12].ljust(8, b"\0"), dtype="<i4").tolist()
        dtype = LLMC_DTYPES[magic]
        needed = LLMC_HEADER_BYTES + count * dtype.itemsize
        if version != LLMC_VERSIONS[magic] or count <= 0 or needed != size:
            found = f"magic {magic}, version {version}, {count} tokens: {needed} bytes, not {size}"
            raise TokenFileError(f"{path!r} is not an llm.c token shard llm.c would read: {found}")
        return "llmc", dtype, (count,), LLMC_HEADER_BYTES
    dtype = meta.get("dtype", dtype)  # raw ids: the sidecar's dtype, or else the argument's
    if dtype is None:
        fix = "pass dtype=np.uint16 (nanoGPT's train.bin) or np.uint32"
        raise TokenFileError(f"{path!r} holds raw ids and no sidecar gives their dtype: {fix}")
    dtype = _token_dtype(dtype, repr(path))
    if size % dtype.itemsize:
        raise TokenFileError(f"{path!r} has {size} bytes, not a whole number of {dtype.name} ids")
    return "bin", dtype, (size // dtype.itemsize,), 0


def _npy_layout(path: str, head: bytes, size: int) -> tuple[np.dtype, tuple[int, ...], int]:
    """A .npy header as numpy's own reader parses it (it never unpickles), then what numpy leaves
    to us, checked before anything is mapped: uint16 or uint32, 1-D or 2-D, C order, whole."""
    if not head.startswith(NPY_MAGIC):
        found = "is cut short in" if NPY_MAGIC.startswith(head) else f"starts {head[:6]!r}, not"
        raise TokenFileError(f"{path!r} {found} the .npy magic (raw ids belong in a .bin)")
    readers = {
        (1, 0): np.lib.format.read_array_header_1_0,
        (2, 0): np.lib.format.read_array_header_2_0,
    }
    try:
        with io.BytesIO(head) as f:  # the bytes read already: numpy caps a header at 10,000
            version = np.lib.format.read_magic(f)
            if version not in readers:  # 3.0 holds utf-8 field names: never a token array
                raise ValueError(f"format version {version}, where token files are 1.0 or 2.0")
            shape, fortran, found = readers[version](f)
            offset = f.tell()
    except Exception as error:  # numpy raises several kinds for a damaged header
        reason = str(error).split(".\n")[0].split(". ")[0]  # never numpy's allow_pickle advice
        raise TokenFileError(f"{path!r} has a .npy header numpy cannot read: {reason}") from None
    dtype = _token_dtype(found, repr(path))  # before any map: a 0-byte dtype kills numpy's
    if (
        not 1 <= len(shape) <= 2
        or any(type(n) is not int for n in shape)  # numpy lets True pass as an int
        or min(shape) < 1
        or (fortran and len(shape) == 2 and 1 not in shape)
    ):
        order = "Fortran" if fortran else "C"
        valid = "token ids are 1-D or 2-D, in C order, each dimension at least 1"
        raise TokenFileError(f"{path!r} holds shape {shape} in {order} order: {valid}")
    needed = offset + dtype.itemsize * int(np.prod(shape, dtype=object))
    if needed > size:
        raise TokenFileError(
            f"{path!r} is cut short: its header needs {needed:,} bytes, it has {size:,}"
        )
    return dtype, shape, offset


def _token_dtype(dtype: Any, where: str) -> np.dtype:
    """dtype as little-endian uint16 or uint32, the widths of token ids, or an error."""
    try:
        found = np.dtype(dtype)
    except (TypeError, ValueError):  # numpy raises either for what is not a dtype
        raise TokenFileError(f"{where}: {dtype!r} is not a dtype; use uint16 or uint32") from None
    if found.kind != "u" or found.itemsize not in (2, 4) or found.byteorder == ">":
        raise TokenFileError(f"{where}: dtype {found.str!r} is not uint16 or uint32, little-endian")
    return found.newbyteorder("<")


def _memmap(file: TokenFile) -> np.memmap:
    """The checked file's ids, read-only. The path is opened once more and mapped only if the
    open file is the one checked: another file renamed over the path since then is refused."""
    try:
        with open(file.path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == file.identity:
                return np.memmap(f, file.dtype, "r", offset=file.offset, shape=file.shape)
    except (OSError, ValueError) as error:  # out of descriptors, say: each map holds one
        limit, in_use = _descriptors()
        fix = f": {in_use} in use, the limit is {limit}; raise it (ulimit -n {_fits(in_use, 1)})"
        fix = fix if getattr(error, "errno", None) in (errno.EMFILE, errno.ENFILE) else ""
        reason = getattr(error, "strerror", None) or error  # ValueError: it shrank just now
        raise TokenFileError(f"{file.path!r} cannot be mapped ({reason}){fix}") from None
    raise TokenFileError(f"{file.path!r} changed since it was checked: open it again")


def _descriptors() -> tuple[int | None, int]:
    try:
        import resource  # Unix only
    except ImportError:
        return None, 0
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    limit = None if limit == resource.RLIM_INFINITY else limit
    try:
        return limit, len(os.listdir("/dev/fd"))  # Linux and macOS
    except OSError:  # listing them takes one: none is left
        return limit, limit or 0


def _fits(in_use: int, needed: int) -> int:
    """An open-file limit to advise: room for twice what is in use and needed, 4096 at least."""
    return max(4096, 2 * (in_use + needed))


def _check_int(name: str, value: Any, low: int, high: int = 2**63 - 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r:.80}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be from {low:,} to {high:,}, got {value}")


# ---- 2. The dataset: windows, and one batched gather -------------------------------------------


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
    other = next((f for f in files if f.dtype != files[0].dtype), None)
    if other is not None:
        both = f"{other.path!r} holds {other.dtype.name}, {files[0].path!r} {files[0].dtype.name}"
        raise TokenFileError(f"{both}: a dataset has one dtype")
    named = {f.sidecar["tokenizer"]: f.path for f in files if "tokenizer" in f.sidecar}
    if len(named) > 1:
        raise TokenFileError(f"files of one dataset need one tokenizer; these differ: {named}")


class NpyTokensDataset:
    """(x, y) next-token windows of token files: int64 tensors, y being x shifted by one token.
    ds[i] is window i, (seq_len,) each; ds[epoch, indices] a batch, gathered in one pass. Files (a
    list, or a sorted glob) share one index space; no window crosses a file or a 2-D file's row.
    mode="windows": window i is tokens[i*seq_len : (i+1)*seq_len + 1]; mode="random":
    num_samples windows an epoch, each starting anywhere, drawn from (seed, epoch, i) alone."""

    def __init__(
        self,
        path: PathLike | Sequence[PathLike],
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
        if num_samples is not None:
            _check_int("num_samples", num_samples, 1)
        self.seq_len = int(seq_len)
        self.mode = mode
        self.seed = int(seed)
        self.paths = _expand_paths(path)
        self.files = [_open_file(p, dtype, vocab_size, verify) for p in self.paths]  # fail now
        self.dtype = self.files[0].dtype
        _check_one_dtype_and_tokenizer(self.files)
        shapes = np.array([f.shape if len(f.shape) == 2 else (1, *f.shape) for f in self.files])
        self._row_len = shapes[:, 1]  # tokens of each file's rows (sequences)
        self._windows_per_row = (self._row_len - 1) // self.seq_len
        self._starts_per_row = np.maximum(self._row_len - self.seq_len, 0)  # random starts
        # [0, c0, c0 + c1, ...]: window k is in the file f with bounds[f] <= k < bounds[f + 1]
        self._window_bounds = np.concatenate(([0], np.cumsum(shapes[:, 0] * self._windows_per_row)))
        self._start_bounds = np.concatenate(([0], np.cumsum(shapes[:, 0] * self._starts_per_row)))
        if self._window_bounds[-1] == 0:
            need = f"{self._row_len.max()} tokens at most, seq_len={seq_len} needs {seq_len + 1}"
            fix = "use a smaller seq_len, or prepare with a larger --val-fraction"
            raise ValueError(f"{self.paths[0]!r} and the rest hold no window: {need}; {fix}")
        self.num_samples = int(self._window_bounds[-1] if num_samples is None else num_samples)
        self._one_flat_file = len(self.files) == 1 and len(self.files[0].shape) == 1
        self._maps: dict[int, np.ndarray] = {}  # file -> its windows, least recently used first
        self._pid = None  # the process whose maps those are: each maps files of its own

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_maps": {}}  # never pickle mapped data: workers map their own

    def __len__(self) -> int:
        return self.num_samples

    def fingerprint(self) -> dict[str, Any]:
        """What decides the windows: each file's name, size, shape and hashes; the settings."""
        files = [
            {"name": Path(f.path).name, "bytes": f.identity[2], "dtype": f.dtype.name}
            | {"shape": list(f.shape), "sha256": f.sidecar.get("sha256"), "probe": f.probe}
            for f in self.files
        ]
        settings = {"seq_len": self.seq_len, "mode": self.mode, "seed": self.seed}
        return {"files": files, **settings, "num_samples": self.num_samples}

    def __getitem__(self, index: int | tuple[int, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(index, tuple):  # one window of epoch 0: (seq_len,) each
            x, y = self._gather(0, self._indices([index]))
            return x[0], y[0]
        if len(index) != 2 or not isinstance(index[1], (list, np.ndarray)):
            raise TypeError(
                f"use ds[i] or ds[epoch, indices], indices a list or array: {index!r:.80}"
            )
        _check_int("epoch", index[0], 0)
        return self._gather(int(index[0]), self._indices(index[1]))

    def __getitems__(self, keys: list[int] | tuple) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A batch of windows gathered in one pass: epoch 0's for DataLoader(ds, batch_size=B), or
        an EpochSampler's (epoch, indices) for DataLoader(ds, batch_sampler=sampler)."""
        epoch, indices = keys if isinstance(keys, tuple) and len(keys) == 2 else (0, keys)
        _check_int("epoch", epoch, 0)
        x, y = self._gather(int(epoch), self._indices(indices))
        return list(zip(x, y))

    def _indices(self, keys: list | np.ndarray) -> np.ndarray:
        """Window indices as int64 in [0, len(self)); a negative one counts from the end."""
        found = np.asarray(keys)
        bools = isinstance(keys, list) and bool in map(type, keys)  # numpy reads True as 1
        if found.ndim != 1 or (found.size and found.dtype.kind not in "iu") or bools:
            found = f"{found.dtype} {keys!r:.80}"
            raise TypeError(f"use ds[i] (an int) or ds[epoch, indices] (1-D ints), not {found}")
        n = self.num_samples
        low, high = (int(found.min()), int(found.max())) if found.size else (0, 0)
        if low < -n or high >= n:
            bad = low if low < -n else high
            raise IndexError(f"index {bad} is out of range for {n} windows of {self.paths[0]!r}")
        return found.astype(np.int64) % n if low < 0 else found.astype(np.int64, copy=False)

    def locate(self, epoch: int, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The file of each window, and the position of its first token in that file."""
        indices = np.asarray(indices, dtype=np.int64)  # a list too
        if self.mode == "random":  # start k of all the files' starts, from (seed, epoch, index)
            key = _splitmix64(_splitmix64(self.seed) + epoch)  # epoch e's i + 1 is not e + 1's i
            hashed = _splitmix64(indices.astype(np.uint64) + np.uint64(key))
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
        """File f's windows, mapped in this process once the file is checked to be the one opened
        (a read of a mapped file truncated in place kills the process with SIGBUS)."""
        file = self.files[f]
        try:
            st = os.stat(file.path)
            same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == file.identity
        except OSError:
            same = False
        if not same:
            raise TokenFileError(f"{file.path!r} changed since the dataset opened it: open it anew")
        if self._pid != os.getpid():  # a new process, a DataLoader worker say: maps of its own
            self._maps = {}  # the maps a forked worker inherited go, and their descriptors
            self._pid = os.getpid()
            limit, in_use = _descriptors()  # keep half of those free after DataLoader's own
            free = MAX_OPEN_FILES if limit is None else (limit - in_use - LOADER_DESCRIPTORS) // 2
            self._max_maps = max(1, min(MAX_OPEN_FILES, free))
            _check_worker_descriptors(limit, in_use)
        windows = self._maps.pop(f, None)  # put back last: the most recently used goes last
        while windows is None and len(self._maps) >= self._max_maps:
            del self._maps[next(iter(self._maps))]  # the least recently used map, and its file
        if windows is None:
            flat = np.asarray(_memmap(file)).reshape(-1)  # a plain array: no memmap bookkeeping
            step = flat.strides[0]  # row s is tokens s .. s + seq_len: no copy, rows overlap
            shape = (max(len(flat) - self.seq_len, 0), self.seq_len + 1)
            windows = np.lib.stride_tricks.as_strided(flat, shape, (step, step), writeable=False)
        self._maps[f] = windows
        return windows


def _check_worker_descriptors(limit: int | None, in_use: int) -> None:
    """A DataLoader worker with fewer than LOADER_DESCRIPTORS free cannot hand a batch over: it
    would lose it and the loader wait for ever (descriptors were opened after make_dataloaders)."""
    from torch.utils.data import get_worker_info

    if get_worker_info() is not None and limit is not None and limit - in_use < LOADER_DESCRIPTORS:
        state = f"a DataLoader worker has {limit - in_use} of {limit} descriptors free"
        fix = f"raise the limit (ulimit -n {_fits(in_use, LOADER_DESCRIPTORS)})"
        fix += " or open fewer files after make_dataloaders"
        raise TokenFileError(f"{state}, fewer than {LOADER_DESCRIPTORS}: {fix}")


def _splitmix64(x: Any) -> Any:
    """SplitMix64's output function: a well-spread 64-bit value of each input, a Python int or a
    uint64 array (whose arithmetic wraps at 2**64 by itself)."""
    mask = 2**64 - 1
    x = (x + 0x9E3779B97F4A7C15) & mask
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
    return x ^ (x >> 31)


# ---- 3. The sampler: epochs, ranks and resume state --------------------------------------------

SAMPLER_STATE_FORMAT = "npy_datasets.EpochSampler"


@dataclass
class SamplerPass:
    """One pass over an EpochSampler, as far as it has gone."""

    epoch: int
    start: int  # where in the epoch's order it began (a global position: all ranks' items)
    items: int  # the indices this rank's pass holds
    handed: int = 0  # how many of them reached the loop so far


class EpochSampler:
    """Batches of window indices, (epoch, indices), for DataLoader(ds, sampler=..., batch_size=None).
    Epoch e's order is drawn from (seed, e) alone. Rank r of world_size W takes the order's items
    r, r + W, ...; remainder="drop" leaves out the last n % W items, "pad" repeats the first ones.

    Which epoch a pass serves: after a pass that served all its batches, the next epoch from its
    start; after a pass the loop left early (a break, a peek), the same pass again. set_epoch(e)
    makes the next pass epoch e from its start, except right after load_state_dict, when only the
    loaded epoch is accepted and its pass starts at the loaded position. len() is a whole epoch's
    batches of this rank, also when a resumed pass holds fewer. Inside make_dataloaders' loader a
    batch is served when the loop receives it; iterated by a plain DataLoader, when it is handed to
    the workers, which fetch ahead."""

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
            raise TypeError(f"shuffle and drop_last are True or False: {shuffle!r}, {drop_last!r}")
        if remainder not in ("drop", "pad"):
            raise ValueError(f'remainder must be "drop" or "pad", got {remainder!r}')
        if (world_size is None) != (rank is None):
            raise ValueError(f"pass both world_size and rank, or neither: {world_size}, {rank}")
        self._world_from_torch = world_size is None  # checked again when each pass begins
        if world_size is None:
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
        self._epoch = 0  # the next pass's epoch and start, unless the latest pass was served whole
        self._start = 0
        self._resumed = False  # a loaded position that no pass has served to its end yet
        self._latest: SamplerPass | None = None  # the pass that began last
        fingerprint = getattr(data_source, "fingerprint", None)  # a dataset's files and settings
        self._fingerprint = None if fingerprint is None else fingerprint()
        if not 1 <= self.num_samples <= 2**31:  # an epoch's order is held in memory
            raise ValueError(f"{self.num_samples:,} windows: an epoch takes 1 to 2**31 windows")
        if len(self) == 0:
            share = f"{self._share(self.num_samples)} windows a rank: lower batch_size or ranks"
            raise ValueError(f"batch_size={batch_size} leaves no whole batch of {share}")

    @property
    def epoch(self) -> int:
        """The epoch of the next pass."""
        return self._next_pass()[0]

    def _finished(self) -> bool:
        return self._latest is not None and self._latest.handed == self._latest.items

    def _next_pass(self) -> tuple[int, int]:
        """The epoch of the next pass, and its start in that epoch's order."""
        if self._finished():
            return self._latest.epoch + 1, 0
        return self._epoch, self._start

    def set_epoch(self, epoch: int) -> None:
        """The next pass is epoch `epoch`, from its start, even while one runs; right after
        load_state_dict, only the loaded epoch, from the loaded position."""
        _check_int("epoch", epoch, 0)
        resuming = self._resumed and not self._finished()
        if resuming and epoch != self._epoch:
            loaded = f"the loaded state continues epoch {self._epoch} at {self._start}"
            lightning = "a Lightning checkpoint saved after fit(max_steps=...) counts it as done"
            fix = f"start at sampler.epoch ({lightning}: save with ModelCheckpoint instead)"
            raise ValueError(f"set_epoch({epoch}), but {loaded}: {fix}")
        self._start = self._start if resuming else 0
        self._epoch = int(epoch)
        self._resumed = resuming
        self._latest = None  # a state saved now describes the pass to come

    def __len__(self) -> int:
        """A whole epoch's batches of this rank."""
        items = self._share(self.num_samples)
        return items // self.batch_size if self.drop_last else -(-items // self.batch_size)

    def _share(self, n: int) -> int:
        return n // self.world_size if self.remainder == "drop" else -(-n // self.world_size)

    def order(self, epoch: int, start: int = 0) -> np.ndarray:
        """This rank's indices of `epoch`, from position `start` of the epoch's order on."""
        if not 0 <= start <= self.num_samples:
            raise ValueError(f"start must be from 0 to {self.num_samples:,}, got {start}")
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
        # A generator: a pass decides its epoch when its first batch is asked for.
        current, batches = self._begin()
        for epoch, indices in batches:
            current.handed += len(indices)
            yield epoch, indices

    def _begin(self) -> tuple[SamplerPass, Iterator[tuple[int, np.ndarray]]]:
        """Begin the next pass: its record, and its batches (which the caller counts)."""
        if self._world_from_torch and _distributed_world() != (self.world_size, self.rank):
            world, rank = _distributed_world()
            made = f"made for rank {self.rank} of {self.world_size}, now rank {rank} of {world}"
            fix = "make the loaders after torch.distributed.init_process_group (see the README)"
            raise RuntimeError(f"an EpochSampler {made}: {fix}")
        self._resumed = self._resumed and not self._finished()
        epoch, start = self._next_pass()
        mine = self.order(epoch, start)
        if self.drop_last:  # whole batches only
            mine = mine[: len(mine) // self.batch_size * self.batch_size]
        self._epoch = epoch
        self._start = start
        self._latest = SamplerPass(epoch, start, len(mine))
        size = self.batch_size
        return self._latest, ((epoch, mine[lo : lo + size]) for lo in range(0, len(mine), size))

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the next batch comes from (JSON): after `consumed` batches of the latest pass,
        `step` of enumerate(loader, 1), or else all that reached the loop."""
        latest = self._latest or SamplerPass(self._epoch, self._start, 0)
        items = latest.handed
        if consumed is not None:
            handed = -(-latest.handed // self.batch_size)  # batches, the last one maybe short
            _check_int("consumed", consumed, 0)
            if consumed > handed:
                count = "count this pass's batches (enumerate(loader, 1)), not all steps"
                raise ValueError(f"consumed={consumed}, but the pass handed out {handed}: {count}")
            items = min(int(consumed) * self.batch_size, latest.items)
        epoch, position = latest.epoch, latest.start + items * self.world_size
        if self._latest is not None and items == latest.items:  # the whole pass: the next epoch
            epoch, position = latest.epoch + 1, 0
        state = {"format": SAMPLER_STATE_FORMAT, "version": 1, "epoch": epoch, "position": position}
        settings = {"num_samples": self.num_samples, "shuffle": self.shuffle, "seed": self.seed}
        return {**state, "dataset": self._fingerprint, **settings}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where a state_dict() of the same windows, order and seed stopped."""
        mine = self.state_dict() | {"epoch": 0, "position": 0}
        if not isinstance(state, dict) or set(state) != set(mine):
            raise ValueError(f"not an EpochSampler state (keys {sorted(mine)}): {state!r:.200}")
        settings = [k for k in mine if k not in ("epoch", "position")]
        differs = [k for k in settings if (type(state[k]), state[k]) != (type(mine[k]), mine[k])]
        bad = next(iter(differs), None)
        if bad is not None:  # types too: a JSON true is not 1
            saved, here = state[bad], mine[bad]
            if isinstance(saved, dict) and isinstance(here, dict):  # the dataset: which field of it
                inner = next((k for k in here if saved.get(k) != here[k]), "")
                bad, saved, here = f"{bad}.{inner}", saved.get(inner), here.get(inner)
            there = f"{saved!r:.120} in the state, {here!r:.120} here"
            raise ValueError(f"an EpochSampler state of other windows or order: {bad} is {there}")
        _check_int("epoch", state["epoch"], 0)
        _check_int("position", state["position"], 0, self.num_samples - 1)
        self._epoch = int(state["epoch"])
        self._start = int(state["position"])
        self._resumed = True
        self._latest = None


def _distributed_world() -> tuple[int, int]:
    """(world_size, rank) of torch.distributed, or (1, 0) in a process torchrun did not start."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    launched = os.environ.get("WORLD_SIZE", "1")  # torchrun, Lightning and accelerate set it
    if launched != "1":
        fix = "call torch.distributed.init_process_group first, or pass world_size and rank"
        raise RuntimeError(
            f"WORLD_SIZE={launched}, but torch.distributed is not initialised: {fix}"
        )
    return 1, 0


# ---- 4. Loaders and the device -----------------------------------------------------------------


class EpochLoader:
    """(x, y) batches of an EpochSampler's passes, read by a torch DataLoader (and its workers).
    It counts the batches your loop receives, so state_dict() is exact with any number of workers,
    and a pass the loop leaves early is served again, whatever the workers fetched ahead. It is not
    a DataLoader: Lightning and accelerate rebuild those around samplers of their own (which would
    split each rank's share again), and take any other iterable with len() as it is."""

    def __init__(
        self,
        dataset: NpyTokensDataset,
        sampler: EpochSampler,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int = 2,
    ) -> None:
        from torch.utils.data import DataLoader

        self.dataset = dataset
        self.sampler = sampler
        self.batch_size = sampler.batch_size
        self.batch_sampler = None  # as in a DataLoader whose sampler yields whole batches
        self._pass = _PassIndices()
        self._workers = (num_workers, prefetch_factor) if num_workers else None  # not started
        options = {"batch_size": None, "collate_fn": tuple, "num_workers": num_workers}
        if num_workers:  # DataLoader refuses these two without workers
            options.update(persistent_workers=True, prefetch_factor=prefetch_factor)
        self.dataloader = DataLoader(dataset, sampler=self._pass, pin_memory=pin_memory, **options)

    def __len__(self) -> int:
        """A whole epoch's batches of this rank, as the sampler's."""
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        # A generator: the pass begins when its first batch is asked for, after set_epoch.
        if self._workers is not None:  # descriptors opened since make_dataloaders count too
            _check_descriptors_for_workers(*self._workers)
            self._workers = None  # persistent: started once
        current, batches = self.sampler._begin()
        self._pass.batches = batches  # what the DataLoader's next iterator reads
        for x, y in self.dataloader:
            current.handed += len(x)  # before the loop gets it: a break after it keeps it
            yield x, y

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch comes from, after the batches your loop received (JSON)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where a state_dict() of the same windows, order and seed stopped."""
        self.sampler.load_state_dict(state)


class _PassIndices:
    """The DataLoader's sampler inside an EpochLoader: the batches of the pass begun last."""

    batches: Iterator[tuple[int, np.ndarray]] = iter(())

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        return self.batches


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
) -> tuple[EpochLoader, EpochLoader | None]:
    """Train (shuffled by seed, drop_last) and validation (in order, every window; or None)
    loaders of (x, y) batches. No workers by default: for memmaps they cost more than they save.
    Memory is pinned where CUDA is. Each rank of torch.distributed (or world_size, rank) gets a
    share, as many steps as the others, once all agree on files and settings: under torchrun,
    Lightning or accelerate, make them after the process group starts."""
    import torch

    if not isinstance(train, NpyTokensDataset) or not isinstance(
        val, (NpyTokensDataset, type(None))
    ):
        found = f"{type(train).__name__} and {type(val).__name__}"
        raise TypeError(f"train and val (or None) must be NpyTokensDatasets, got {found}")
    for name, value, low in (("batch_size", batch_size, 1), ("seed", seed, 0)):
        _check_int(name, value, low)  # before the ranks compare them as JSON
    _check_int("num_workers", num_workers, 0)
    _check_int("prefetch_factor", prefetch_factor, 1)
    if pin_memory not in (None, True, False):
        raise TypeError(f"pin_memory must be True, False or None, got {pin_memory!r}")
    if num_workers:  # else workers may hang
        _check_descriptors_for_workers(num_workers, prefetch_factor)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        val_fingerprint = None if val is None else val.fingerprint()
        fingerprints = {"train": train.fingerprint(), "val": val_fingerprint}
        verify_across_ranks({**fingerprints, "batch_size": int(batch_size), "seed": int(seed)})
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    if pin and torch.cuda.is_available():
        _check_pinning()
    options = {"num_workers": num_workers, "pin_memory": pin, "prefetch_factor": prefetch_factor}
    common = {"world_size": world_size, "rank": rank, "batch_size": batch_size, "seed": seed}
    sampler = EpochSampler(train, shuffle=True, drop_last=True, remainder="drop", **common)
    train_loader = EpochLoader(train, sampler, **options)
    if val is None:
        return train_loader, None
    sampler = EpochSampler(val, shuffle=False, remainder="pad", **common)
    return train_loader, EpochLoader(val, sampler, **options)


def _check_descriptors_for_workers(num_workers: int, prefetch_factor: int) -> None:
    """Workers hand each batch over through shared memory, a descriptor a tensor: under a low
    open-file limit they fail or hang, so refuse at once, naming the limit."""
    limit, in_use = _descriptors()
    needed = LOADER_DESCRIPTORS + BATCH_DESCRIPTORS * num_workers * prefetch_factor
    if limit is not None and limit - in_use < needed:
        fix = f"raise it (ulimit -n {_fits(in_use, needed)}) or use num_workers=0"
        raise ValueError(
            f"{num_workers} workers need {needed} free descriptors, {in_use} of {limit} used: {fix}"
        )


def _check_pinning() -> None:
    """Start CUDA, which pinning needs, now: it needs descriptors, and a low limit is named here."""
    import torch

    try:
        torch.empty(1).pin_memory()
    except RuntimeError as error:  # torch.AcceleratorError is one
        limit, in_use = _descriptors()
        state = f"{str(error).strip().splitlines()[0]}; {in_use} of {limit} descriptors in use"
        fix = f"raise the open-file limit (ulimit -n {_fits(in_use, LOADER_DESCRIPTORS)})"
        fix += " or pass pin_memory=False"
        raise RuntimeError(f"pinning memory starts CUDA, which failed ({state}): {fix}") from error


def verify_across_ranks(settings: dict[str, Any], group: Any = None) -> None:
    """Raise on every rank of torch.distributed unless all pass equal JSON-able settings (a
    dataset's fingerprint(), say), naming the first rank that differs."""
    import torch
    import torch.distributed as dist

    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).digest()
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"  # NCCL moves CUDA tensors
    mine = torch.tensor(list(digest), dtype=torch.uint8, device=device)
    seen = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(seen, mine, group=group)  # 32 bytes a rank: nothing is pickled
    other = next((rank for rank, theirs in enumerate(seen) if not torch.equal(theirs, seen[0])), 0)
    if other:
        mine = f"rank {dist.get_rank(group)} has {settings}"
        raise RuntimeError(f"rank {other} has other files or settings than rank 0; {mine}")


def to_device(
    batch: Sequence[torch.Tensor], device: str | torch.device
) -> tuple[torch.Tensor, ...]:
    """Move a batch's tensors to device, asynchronously from pinned memory."""
    return tuple(t.to(device, non_blocking=t.is_pinned()) for t in batch)
