"""Token files beyond the .npy header: paths, raw .bin, llm.c shards, sidecars, open_tokens, token
dtypes and probes.

Catalogue items 1-3, 17, 18, 20-23, 32 and 33 (tests/bad_inputs.md).
"""

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import npy_datasets as nd
from conftest import ROOT, dataset_error, refused, write_tokens

# --- paths --------------------------------------------------------------------------------------


def in_thread(function, timeout: float = 10.0):
    """function() in a daemon thread: (finished in time, result or exception)."""
    box = {}

    def run():
        try:
            box["result"] = function()
        except BaseException as error:
            box["result"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("result")


def test_item_01_missing_path(tmp_path, monkeypatch):
    for path in (tmp_path / "nope.npy", tmp_path / "no dir" / "train.bin"):
        refused(path, FileNotFoundError, "does not exist")
    monkeypatch.chdir(tmp_path)
    assert "'relative.npy' does not exist" in refused("relative.npy", FileNotFoundError)


def test_item_02_not_a_regular_file(tmp_path):
    refused(tmp_path, nd.TokenFileError, "is a directory", "expected a .npy or .bin file")
    refused("/dev/null", nd.TokenFileError, "not a regular file")
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    finished, result = in_thread(lambda: nd.NpyTokensDataset(fifo, 4))
    assert finished, "opening a FIFO blocked"
    assert isinstance(result, nd.TokenFileError) and "not a regular file" in str(result)
    short = Path(tempfile.mkdtemp(prefix="npy"))  # a socket path must stay under 108 bytes
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s.npy"))
            refused(short / "s.npy", nd.TokenFileError, "not a regular file")
    finally:
        shutil.rmtree(short)
    (tmp_path / "linked.npy").symlink_to(tmp_path)
    refused(tmp_path / "linked.npy", nd.TokenFileError, "is a directory")

    good = write_tokens(tmp_path / "good.npy", np.arange(100, dtype=np.uint16), sidecar=False)
    side = nd.sidecar_path(good)
    os.mkfifo(side)  # the sidecar is read too: a FIFO there must not block either
    try:
        finished, result = in_thread(lambda: nd.NpyTokensDataset(good, 4))
        assert finished, "a FIFO sidecar blocked"
        assert isinstance(result, nd.TokenFileError)
        assert f"{str(side)!r} is not a regular file: a sidecar" in str(result)
    finally:
        if not finished:  # release the blocked reader
            os.close(os.open(side, os.O_WRONLY | os.O_NONBLOCK))
    side.unlink()
    side.mkdir()
    assert "is not a regular file" in refused(good, nd.TokenFileError)


def test_item_03_empty_file(tmp_path):
    for name in ("empty.npy", "empty.bin"):
        (tmp_path / name).touch()
        refused(tmp_path / name, nd.TokenFileError, "is empty (0 bytes)", dtype=np.uint16)


def test_missing_directory_and_empty_files(tmp_path):
    assert "does not exist" in dataset_error(tmp_path / "nope.npy")
    assert "is a directory" in dataset_error(tmp_path)
    (tmp_path / "empty.npy").touch()
    assert "empty (0 bytes)" in dataset_error(tmp_path / "empty.npy")
    os.mkfifo(tmp_path / "fifo.npy")
    assert "not a regular file" in dataset_error(
        tmp_path / "fifo.npy"
    )  # and it did not block reading


def test_item_20_read_only_file(tmp_path):
    path = write_tokens(tmp_path / "ro.npy", np.arange(100, dtype=np.uint16))
    path.chmod(0o444)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    ds = nd.NpyTokensDataset(path, 9)
    assert ds[10][0].tolist() == list(range(90, 99))
    assert ds.memmap().mode == "r" and not ds.memmap().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        ds.memmap()[0] = 1
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_read_only_file_and_memmap(arange_file):
    path = arange_file(100)
    os.chmod(path, 0o444)
    ds = nd.NpyTokensDataset(path, 9)
    assert ds.memmap().flags.writeable is False and ds.memmap().mode == "r"
    with pytest.raises(ValueError):
        ds.memmap()[0] = 1


def test_item_23_unusual_paths(tmp_path, monkeypatch):
    names = ["with space.npy", "ünïcødé тест 数据.npy", "t" * 240 + ".npy", "dots.in.name.npy"]
    for name in names:
        path = write_tokens(tmp_path / name, np.arange(50, dtype=np.uint16))
        for spelled in (path, str(path)):
            assert len(nd.NpyTokensDataset(spelled, 7, verify=True)) == 7
    monkeypatch.chdir(tmp_path)
    assert len(nd.NpyTokensDataset(Path("with space.npy"), 7)) == 7
    assert "'missing file ü.npy' does not exist" in refused("missing file ü.npy", FileNotFoundError)


@pytest.mark.skipif(
    not Path("/sys/devices/system/cpu/online").exists(), reason="maps a Linux /sys file"
)
def test_a_file_that_cannot_be_mapped_is_named(tmp_path):
    link = tmp_path / "tokens.bin"
    link.symlink_to(
        "/sys/devices/system/cpu/online"
    )  # a regular file of 4096 bytes to stat, but not one to map
    with pytest.raises(nd.TokenFileError, match=r"tokens.bin' cannot be mapped"):
        nd.open_tokens(link, dtype=np.uint16)


# --- raw .bin and llm.c shards ------------------------------------------------------------------


def test_item_17_odd_bin_size(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\0" * 2001)
    refused(
        tmp_path / "odd.bin",
        nd.TokenFileError,
        "has 2001 bytes, not a multiple of 2 (uint16)",
        dtype=np.uint16,
    )
    (tmp_path / "odd4.bin").write_bytes(b"\0" * 4002)
    refused(
        tmp_path / "odd4.bin",
        nd.TokenFileError,
        "has 4002 bytes, not a multiple of 4 (uint32)",
        dtype="uint32",
    )


def test_item_18_bin_needs_a_dtype_source(tmp_path):
    wide = np.arange(1000, dtype=np.uint32)
    wide.tofile(tmp_path / "bare.bin")
    refused(
        tmp_path / "bare.bin",
        nd.TokenFileError,
        "raw token file with no sidecar 'bare.bin.json'",
        "pass dtype=np.uint16",
    )
    # uint32 ids described as uint16: the count in the sidecar exposes it (dolma's uint16/uint32 mix-up)
    write_tokens(tmp_path / "mixed.bin", wide, dtype="uint16")
    refused(
        tmp_path / "mixed.bin",
        nd.TokenFileError,
        "shape is [1000] in the sidecar, [2000] in the file",
    )
    write_tokens(tmp_path / "told.bin", wide)
    refused(
        tmp_path / "told.bin",
        nd.TokenFileError,
        "has a sidecar that says uint32 but dtype=uint16 was passed",
        dtype=np.uint16,
    )
    # the documented escape hatch: no sidecar, explicit dtype; the caller is trusted, so a wrong one reads garbage
    ds = nd.NpyTokensDataset(tmp_path / "bare.bin", 4, dtype=np.uint16)
    assert ds[0][0].tolist() == [0, 0, 1, 0]


def test_raw_bin_files(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")  # nanoGPT's layout: no header, no sidecar
    assert "pass dtype=np.uint16" in dataset_error(tmp_path / "train.bin")
    ds = nd.NpyTokensDataset(tmp_path / "train.bin", 8, dtype=np.uint16)
    assert ds[3][0].tolist() == list(range(24, 32))
    (tmp_path / "odd.bin").write_bytes(b"\0" * 2001)
    assert "has 2001 bytes, not a multiple of 2 (uint16)" in dataset_error(
        tmp_path / "odd.bin", dtype="uint16"
    )
    write_tokens(tmp_path / "wide.bin", np.arange(1000, dtype=np.uint32))
    assert (
        nd.NpyTokensDataset(tmp_path / "wide.bin", 8)[1][0][0].item() == 8
    )  # dtype from the sidecar
    assert "sidecar" in dataset_error(
        tmp_path / "wide.bin", dtype=np.uint16
    ) and "says uint32" in dataset_error(tmp_path / "wide.bin", dtype=np.uint16)


def test_a_raw_bin_whose_first_ids_spell_an_llmc_date_opens_with_its_dtype(tmp_path):
    tokens = np.array(
        [100, 309, 13, 0, *range(1, 600)], dtype=np.uint16
    )  # as int32: 20250724, then version 13
    tokens.tofile(tmp_path / "train.bin")  # nanoGPT's layout (EOT appended): no header, no sidecar
    assert nd.open_tokens(tmp_path / "train.bin", dtype=np.uint16).tolist() == tokens.tolist()
    assert (
        nd.NpyTokensDataset(tmp_path / "train.bin", 8, dtype=np.uint16)[0][0].tolist()
        == tokens[:8].tolist()
    )


def write_llmc(
    path: Path, tokens: np.ndarray, *, magic=None, version=None, count=None, extra=b""
) -> Path:
    """An llm.c / modded-nanogpt shard: 256 little-endian int32 words (magic, version, token count)
    then the tokens; v1 (magic 20240520) holds uint16, v7 (magic 20240801) uint32."""
    wide = tokens.dtype == np.uint32
    header = np.zeros(256, dtype="<i4")
    header[0] = (20240801 if wide else 20240520) if magic is None else magic
    header[1] = (7 if wide else 1) if version is None else version
    header[2] = len(tokens) if count is None else count
    path.write_bytes(
        header.tobytes() + tokens.astype(tokens.dtype.newbyteorder("<")).tobytes() + extra
    )
    return path


def test_an_unknown_llmc_magic_is_refused_even_with_a_dtype(tmp_path):
    eval_file = write_llmc(
        tmp_path / "hellaswag_val.bin", np.arange(100, dtype=np.uint16), magic=20240522
    )  # llm.c's eval files
    for dtype in (None, np.uint16):
        with pytest.raises(
            nd.TokenFileError,
            match="has the magic 20240522 of llm.c's eval file, not a token shard",
        ):
            nd.open_tokens(eval_file, dtype=dtype)


def test_a_raw_file_whose_sidecar_says_bin_is_never_read_as_llmc(tmp_path):
    magic = np.array([20240520], dtype="<i4").view("<u2")  # ids 55016 and 308 spell llm.c's magic
    tokens = np.concatenate(
        [magic, np.array([1, 0], dtype=np.uint16), np.arange(200, dtype=np.uint16)]
    )
    path = write_tokens(tmp_path / "train.bin", tokens)  # a sidecar with layout "bin", dtype uint16
    assert nd.open_tokens(path).tolist() == tokens.tolist()
    assert nd.NpyTokensDataset(path, 8)[0][0].tolist() == tokens[:8].tolist()


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_every_format_reads_back_the_same_tokens_and_windows(tmp_path, dtype):
    # ids near the top of the dtype: a signed or narrower read would change them
    tokens = (np.iinfo(dtype).max - 999 + np.arange(1000)).astype(dtype)
    llmc_name = "v1.bin" if dtype == np.uint16 else "v7.bin"
    files = {
        "npy + sidecar": (write_tokens(tmp_path / "side.npy", tokens), None),
        "npy alone": (write_tokens(tmp_path / "alone.npy", tokens, sidecar=False), None),
        "raw bin + dtype": (write_tokens(tmp_path / "train.bin", tokens, sidecar=False), dtype),
        "raw bin + sidecar": (write_tokens(tmp_path / "side.bin", tokens), None),
        "llm.c": (write_llmc(tmp_path / llmc_name, tokens), None),
        "llm.c + matching dtype": (tmp_path / llmc_name, dtype),
    }
    seq_len = 7
    expected = [
        tokens[i * seq_len : i * seq_len + seq_len + 1].astype(np.int64)
        for i in range(999 // seq_len)
    ]
    for name, (path, dt) in files.items():
        arr = nd.open_tokens(path, dt)
        assert arr.dtype == dtype and arr.shape == tokens.shape and np.array_equal(arr, tokens), (
            name
        )
        ds = nd.NpyTokensDataset(path, seq_len, dtype=dt)
        assert len(ds) == len(expected), name
        for i in (0, 1, len(ds) // 2, len(ds) - 1):
            x, y = ds[i]
            assert (
                x.tolist() == expected[i][:-1].tolist() and y.tolist() == expected[i][1:].tolist()
            ), (name, i)
        x, y = ds[list(range(len(ds)))]
        assert torch.equal(
            torch.cat([x, y[:, -1:]], dim=1), torch.from_numpy(np.stack(expected))
        ), name


def _refusal(path, dtype=None) -> str:
    with pytest.raises(nd.TokenFileError) as info:
        nd.open_tokens(path, dtype)
    with pytest.raises(nd.TokenFileError) as again:  # the dataset refuses it the same way
        nd.NpyTokensDataset(path, 4, dtype=dtype)
    assert str(again.value) == str(info.value) and Path(path).name in str(info.value)
    return str(info.value)


def test_bad_llmc_and_raw_files_are_refused_with_clear_messages(tmp_path):
    u16, u32 = np.arange(100, dtype=np.uint16), np.arange(100, dtype=np.uint32)
    assert "magic 20240520, which goes with version 1, not 7" in _refusal(
        write_llmc(tmp_path / "a.bin", u16, version=7)
    )
    assert "magic 20240801, which goes with version 7, not 1" in _refusal(
        write_llmc(tmp_path / "b.bin", u32, version=1)
    )
    short = write_llmc(tmp_path / "short.bin", u16)
    short.write_bytes(short.read_bytes()[:-2])  # one token missing
    assert (
        "declares 100 tokens of uint16 (1224 bytes with the header), but the file has 1222 bytes"
        in _refusal(short)
    )
    trailing = write_llmc(tmp_path / "trailing.bin", u32, extra=b"\0" * 4)
    assert (
        "declares 100 tokens of uint32 (1424 bytes with the header), but the file has 1428 bytes"
        in _refusal(trailing)
    )
    assert "declares 101 tokens" in _refusal(write_llmc(tmp_path / "count.bin", u16, count=101))
    assert "declares -5 tokens" in _refusal(write_llmc(tmp_path / "negative.bin", u16, count=-5))
    assert "declares 0 tokens" in _refusal(write_llmc(tmp_path / "empty.bin", u16[:0]))
    head = write_llmc(tmp_path / "head.bin", u16)
    head.write_bytes(head.read_bytes()[:500])  # the header itself is cut short
    assert "truncated llm.c header: need 1024 bytes, file has 500" in _refusal(head)
    llmc = write_llmc(tmp_path / "ok.bin", u16)
    assert "is an llm.c shard of uint16 but dtype=uint32 was passed" in _refusal(llmc, np.uint32)
    npy = write_tokens(tmp_path / "ok.npy", u32, sidecar=False)
    assert "holds uint32 but dtype=uint16 was passed" in _refusal(npy, np.uint16)
    u16.tofile(tmp_path / "train.bin")
    assert "raw token file with no sidecar 'train.bin.json': pass dtype=np.uint16" in _refusal(
        tmp_path / "train.bin"
    )


# --- sidecars and probes ------------------------------------------------------------------------


def test_item_21_bit_rot(tmp_path):
    path = write_tokens(tmp_path / "rot.npy", np.arange(200_000, dtype=np.uint32))  # 800 KB
    raw = bytearray(path.read_bytes())
    middle = 128 + 4 * 100_000  # id 100,000, between the first and the last 64 KiB
    raw[middle] ^= 0x01  # it becomes 100,001: same size, same header
    path.write_bytes(raw)
    ds = nd.NpyTokensDataset(path, 9)  # the default open reads the head and the tail only
    assert ds[0, [100_000 // 9]][0][0, 100_000 % 9].item() == 100_001
    refused(path, nd.TokenFileError, "its sha256 differs from the sidecar's", verify=True)


def test_item_22_inconsistent_sidecar(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    for field, value, found in [
        ("dtype", "uint32", "'uint16'"),
        ("n_tokens", 999, "1000"),
        ("shape", [999], "[1000]"),
        ("file_size", 7, "2128"),
        ("layout", "bin", "[1064]"),  # "bin" is final: the header read as ids, 64 of them more
    ]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, **{field: value})
        said = f"{field} is {value!r} in the sidecar, {found}"
        if field == "layout":
            said = f"shape is [1000] in the sidecar, {found}"
        message = refused(path, nd.TokenFileError, f"{said} in the file")
        assert repr(str(nd.sidecar_path(path))) in message
    for field, value in [("max_token_id", 50257), ("eot_id", 50257), ("eot_id", -1)]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, n_vocab=50257, **{field: value})
        refused(path, nd.TokenFileError, f"{field} {value}, outside the vocabulary (n_vocab 50257)")
    path = write_tokens(tmp_path / "type.npy", tokens, n_tokens="1000")
    refused(path, nd.TokenFileError, "field 'n_tokens' should be int, found '1000'")
    path = write_tokens(tmp_path / "bool.npy", tokens, eot_id=True)  # isinstance(True, int) holds
    refused(path, nd.TokenFileError, "field 'eot_id' should be int, found True")
    path = write_tokens(tmp_path / "new.npy", tokens, format_version=99)
    refused(path, nd.TokenFileError, "format_version 99, newer than this module's 1")
    path = write_tokens(tmp_path / "deep.npy", tokens)
    nd.sidecar_path(path).write_text("[" * 100_000)
    refused(path, nd.TokenFileError, "is not valid JSON")


def test_sidecar_must_agree_with_the_file(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    for field, value in [
        ("dtype", "uint32"),
        ("n_tokens", 999),
        ("file_size", 7),
        ("shape", [999]),
    ]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, **{field: value})
        msg = dataset_error(path)
        assert f"{field} is {value!r} in the sidecar" in msg and f"{field}.npy" in msg
    path = write_tokens(tmp_path / "vocab.npy", tokens, max_token_id=70000, n_vocab=50257)
    assert "max_token_id 70000, outside the vocabulary" in dataset_error(path)
    path = write_tokens(tmp_path / "type.npy", tokens, n_tokens="1000")
    assert "field 'n_tokens' should be int" in dataset_error(path)
    path = write_tokens(tmp_path / "hash.npy", tokens, sha256="0" * 64)
    assert len(nd.NpyTokensDataset(path, 4)) == 249  # the hash is read only on request
    assert "sha256 differs" in dataset_error(path, verify=True)
    (tmp_path / "junk.npy.json").write_text("{not json")
    np.save(tmp_path / "junk.npy", tokens)
    assert "is not valid JSON" in dataset_error(tmp_path / "junk.npy")


def test_swapped_shards_of_one_size_are_refused_on_open(tmp_path):
    paths = [
        write_tokens(
            tmp_path / f"train_{i:06d}.npy", np.arange(1000 * i, 1000 * i + 1000, dtype=np.uint16)
        )
        for i in range(2)
    ]
    for p in paths:  # what the prep step records in each sidecar
        side = nd.sidecar_path(p)
        side.write_text(
            json.dumps({**json.loads(side.read_text()), "probe_sha256": nd.probe_sha256(p)})
        )
    assert nd.NpyTokensDataset(paths, 8)[0][0][0].item() == 0
    a, b = (p.read_bytes() for p in paths)  # swap the data files, leave the sidecars in place
    paths[0].write_bytes(b)
    paths[1].write_bytes(a)
    with pytest.raises(
        nd.TokenFileError,
        match=r"train_000000.npy' changed in its first or last 64 KiB since its sidecar was written",
    ):
        nd.NpyTokensDataset(paths, 8)
    big = write_tokens(
        tmp_path / "big.npy", np.arange(200_000, dtype=np.uint32)
    )  # head and tail probed apart
    assert nd.probe_sha256(big) != nd.probe_sha256(
        write_tokens(tmp_path / "other.npy", np.arange(1, 200_001, dtype=np.uint32))
    )


# --- token dtypes and vocabularies --------------------------------------------------------------


def test_token_dtype_and_sidecar_path():
    assert nd.token_dtype(50257) == np.uint16 and nd.token_dtype(2**16) == np.uint16
    assert nd.token_dtype(2**16 + 1) == np.uint32 and nd.token_dtype(100277) == np.uint32
    for bad, err in [(0, ValueError), (2**32 + 1, ValueError), (True, TypeError), (5.0, TypeError)]:
        with pytest.raises(err):
            nd.token_dtype(bad)
    assert nd.sidecar_path("data/x/train.npy") == Path("data/x/train.npy.json")


def test_item_32_boundary_ids_round_trip(tmp_path, pt):
    for dtype, ids in [
        (np.uint16, [0, 50_256, 65_535, 1, 65_534, 32_768, 32_767]),
        (np.uint32, [0, 2**32 - 1, 65_536, 2**31, 2**31 - 1, 50_256, 1]),
    ]:
        path = tmp_path / f"{dtype.__name__}.npy"
        pt.write_token_file([np.array(ids[:3]), np.array(ids[3:])], path, dtype)
        assert np.load(path).tolist() == ids
        ds = nd.NpyTokensDataset(path, 2)
        singles = [t for i in range(len(ds)) for t in ds[i][0].tolist()]
        x, y = ds[list(range(len(ds)))]  # the batched gather widens the top ids exactly too
        px, py = ds[0, np.arange(len(ds))]
        assert singles == x.flatten().tolist() == px.flatten().tolist() == ids[: 2 * len(ds)]
        assert torch.equal(y, py) and y[:, -1].tolist() == ids[2 : 2 * len(ds) + 1 : 2]


def test_item_33_vocab_size(tmp_path):
    path = write_tokens(
        tmp_path / "t.npy", np.arange(1000, dtype=np.uint16), max_token_id=50_256, n_vocab=50_257
    )
    assert len(nd.NpyTokensDataset(path, 9, vocab_size=50_257)) == 111
    refused(
        path, nd.TokenFileError, "ids up to 50256, too many for vocab_size=50000", vocab_size=50_000
    )
    bare = write_tokens(tmp_path / "bare.npy", np.arange(1000, dtype=np.uint16), sidecar=False)
    assert (
        len(nd.NpyTokensDataset(bare, 9, vocab_size=1000)) == 111
    )  # no sidecar: the file is scanned once
    refused(bare, nd.TokenFileError, "ids up to 999, too many for vocab_size=999", vocab_size=999)
    high = write_tokens(
        tmp_path / "high.bin", np.array([5, 60_000, 7] * 10, dtype=np.uint16), sidecar=False
    )
    refused(
        high,
        nd.TokenFileError,
        "ids up to 60000, too many for vocab_size=50257",
        vocab_size=50_257,
        dtype=np.uint16,
    )
    for bad, error, message in [
        ("50257", TypeError, "vocab_size must be an int, got str '50257'"),
        (50_257.0, TypeError, "vocab_size must be an int, got float 50257.0"),
        (True, TypeError, "vocab_size must be an int, got bool True"),
        (0, ValueError, "vocab_size must be at least 1, got 0"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            nd.NpyTokensDataset(path, 9, vocab_size=bad)


def test_vocab_size_check(arange_file):
    path = arange_file(1000)
    assert len(nd.NpyTokensDataset(path, 4, vocab_size=1000)) == 249
    assert "ids up to 999, too many for vocab_size=999" in dataset_error(path, vocab_size=999)


# --- the module itself --------------------------------------------------------------------------


def test_module_needs_only_numpy_torch_and_the_standard_library():
    tree = ast.parse((ROOT / "python_files" / "npy_datasets.py").read_text())
    roots = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    roots |= {
        n.module.split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.level == 0
    }
    assert roots - set(sys.stdlib_module_names) == {"numpy", "torch"}


def test_module_imports_in_a_fresh_interpreter_without_the_prep_packages():
    code = "import sys; sys.modules.update(tiktoken=None, datasets=None, tqdm=None); import npy_datasets; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "python_files",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "ok", out.stderr


# --- issue 19: what an attack found ---------------------------------------------------------------


def test_an_llmc_header_with_other_words_set_is_read_by_its_magic_and_version(tmp_path):
    """llm.c checks only the magic and the version: a shard whose unused header words are not zero
    is still an llm.c shard, never raw ids whose first 512 'tokens' are the header."""
    tokens = np.arange(400, dtype=np.uint16)
    path = write_llmc(tmp_path / "shard.bin", tokens)
    raw = bytearray(path.read_bytes())
    raw[4 * 9 : 4 * 10] = (12345).to_bytes(4, "little")  # word 9 of the header, unused by llm.c
    path.write_bytes(raw)
    assert nd.open_tokens(path).tolist() == tokens.tolist()
    assert nd.open_tokens(path, dtype=np.uint16).tolist() == tokens.tolist()
    assert nd.NpyTokensDataset(path, 8)[0][0].tolist() == list(range(8))


def test_a_change_in_the_last_kib_of_a_large_file_is_refused_on_open(tmp_path):
    path = write_tokens(tmp_path / "big.npy", np.arange(300_000, dtype=np.uint32))  # 1.2 MB
    raw = bytearray(path.read_bytes())
    raw[-4096] ^= 0x01  # inside the last 4 KiB: the tail the probe hashes
    path.write_bytes(raw)
    refused(path, nd.TokenFileError, "changed in its first or last 64 KiB")


def test_a_sidecar_field_of_null_and_a_sidecar_link_loop_are_named(tmp_path):
    path = write_tokens(tmp_path / "null.npy", np.arange(100, dtype=np.uint16), probe_sha256=None)
    message = refused(path, nd.TokenFileError, "field 'probe_sha256' should be str, found None")
    assert "replaced" not in message  # the sidecar is at fault, not the file
    loop = write_tokens(tmp_path / "loop.npy", np.arange(100, dtype=np.uint16))
    side = nd.sidecar_path(loop)
    side.unlink()
    side.symlink_to(side.name)  # a link to itself: stat() fails with ELOOP
    refused(loop, nd.TokenFileError, "is a sidecar that cannot be read", "symbolic links")
