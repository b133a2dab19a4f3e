"""Token files beyond the .npy header: paths, raw .bin, llm.c shards, sidecars, open_tokens, token
dtypes and probes.

Catalogue items 1-3, 17, 18, 20-23, 32 and 33 (tests/bad_inputs.md).
"""

import ast
import json
import os
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
from conftest import ROOT, refused, run_process, write_tokens

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


def test_a_missing_path_is_named(tmp_path, monkeypatch):
    for path in (tmp_path / "nope.npy", tmp_path / "no dir" / "train.bin"):
        refused(path, FileNotFoundError)
    monkeypatch.chdir(tmp_path)
    refused("relative.npy", FileNotFoundError)


def test_a_folder_fifo_device_or_socket_is_refused_without_blocking(tmp_path):
    refused(tmp_path, nd.TokenFileError, "directory")
    refused("/dev/null", nd.TokenFileError, "not a regular file")
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    finished, result = in_thread(lambda: nd.NpyTokensDataset(fifo, 4))
    assert finished, "opening a FIFO blocked"
    assert isinstance(result, nd.TokenFileError) and repr(str(fifo)) in str(result)
    short = Path(tempfile.mkdtemp(prefix="npy"))  # a socket path must stay under 108 bytes
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s.npy"))
            refused(short / "s.npy", nd.TokenFileError, "not a regular file")
    finally:
        shutil.rmtree(short)
    (tmp_path / "linked.npy").symlink_to(tmp_path)
    refused(tmp_path / "linked.npy", nd.TokenFileError, "directory")

    good = write_tokens(tmp_path / "good.npy", np.arange(100, dtype=np.uint16), sidecar=False)
    side = nd.sidecar_path(good)
    os.mkfifo(side)  # the sidecar is read too: a FIFO there must not block either
    try:
        finished, result = in_thread(lambda: nd.NpyTokensDataset(good, 4))
        assert finished, "a FIFO sidecar blocked"
        assert isinstance(result, nd.TokenFileError) and repr(str(side)) in str(result)
    finally:
        if not finished:  # release the blocked reader
            os.close(os.open(side, os.O_WRONLY | os.O_NONBLOCK))
    side.unlink()
    side.mkdir()
    assert repr(str(side)) in refused(good, nd.TokenFileError)


def test_an_empty_file_is_refused(tmp_path):
    for name in ("empty.npy", "empty.bin"):
        (tmp_path / name).touch()
        refused(tmp_path / name, nd.TokenFileError, "empty", dtype=np.uint16)


def test_a_read_only_file_is_read_and_never_written(tmp_path):
    path = write_tokens(tmp_path / "ro.npy", np.arange(100, dtype=np.uint16))
    path.chmod(0o444)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    ds = nd.NpyTokensDataset(path, 9)
    assert ds[10][0].tolist() == list(range(90, 99))
    tokens = nd.open_tokens(path)
    assert tokens.mode == "r" and not tokens.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        tokens[0] = 1
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_unusual_but_valid_paths_open(tmp_path, monkeypatch):
    names = ["with space.npy", "ünïcødé тест 数据.npy", "t" * 190 + ".npy", "dots.in.name.npy"]
    for name in names:
        path = write_tokens(tmp_path / name, np.arange(50, dtype=np.uint16))
        for spelled in (path, str(path)):
            assert len(nd.NpyTokensDataset(spelled, 7, verify=True)) == 7
    monkeypatch.chdir(tmp_path)
    assert len(nd.NpyTokensDataset(Path("with space.npy"), 7)) == 7
    refused("missing file ü.npy", FileNotFoundError)


def test_a_name_of_240_characters_is_written_and_read(tmp_path):
    path = write_tokens(tmp_path / ("t" * 240 + ".npy"), np.arange(50, dtype=np.uint16))
    assert len(nd.NpyTokensDataset(path, 7, verify=True)) == 7


@pytest.mark.skipif(
    not Path("/sys/devices/system/cpu/online").exists(), reason="maps a Linux /sys file"
)
def test_a_file_that_cannot_be_mapped_is_named(tmp_path):
    link = tmp_path / "tokens.bin"
    link.symlink_to("/sys/devices/system/cpu/online")  # 4096 bytes to stat, none to map
    with pytest.raises(nd.TokenFileError, match=r"tokens.bin' cannot be mapped"):
        nd.open_tokens(link, dtype=np.uint16)


# --- raw .bin and llm.c shards ------------------------------------------------------------------


def test_a_raw_bin_with_a_partial_id_is_refused(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\0" * 2001)
    refused(tmp_path / "odd.bin", nd.TokenFileError, "2001", "uint16", dtype=np.uint16)
    (tmp_path / "odd4.bin").write_bytes(b"\0" * 4002)
    refused(tmp_path / "odd4.bin", nd.TokenFileError, "4002", "uint32", dtype="uint32")


def test_a_raw_bin_takes_its_dtype_from_its_sidecar_or_the_caller(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    tokens.tofile(tmp_path / "train.bin")  # nanoGPT's layout: no header, no sidecar
    refused(tmp_path / "train.bin", nd.TokenFileError, "pass dtype=np.uint16")  # teaches the fix
    ds = nd.NpyTokensDataset(tmp_path / "train.bin", 8, dtype=np.uint16)  # the caller is trusted
    assert ds[3][0].tolist() == list(range(24, 32))
    wide = np.arange(1000, dtype=np.uint32)
    write_tokens(tmp_path / "wide.bin", wide)
    assert nd.NpyTokensDataset(tmp_path / "wide.bin", 8)[1][0][0].item() == 8  # the sidecar's
    refused(tmp_path / "wide.bin", nd.TokenFileError, "uint32", "dtype=uint16", dtype=np.uint16)
    # uint32 ids described as uint16 (dolma's mix-up): the sidecar's shape exposes it
    write_tokens(tmp_path / "mixed.bin", wide, dtype="uint16")
    refused(tmp_path / "mixed.bin", nd.TokenFileError, "shape", "[1000]", "[2000]")


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


def test_an_llmc_file_that_is_not_a_token_shard_is_refused_even_with_a_dtype(tmp_path):
    tokens = np.arange(100, dtype=np.uint16)
    eval_file = write_llmc(tmp_path / "hellaswag_val.bin", tokens, magic=20240522)  # llm.c's eval
    for dtype in (None, np.uint16):
        with pytest.raises(nd.TokenFileError, match="20240522"):
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
        x, y = ds[0, list(range(len(ds)))]
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


def test_bad_llmc_shards_and_a_dtype_argument_that_disagrees_are_refused(tmp_path):
    u16, u32 = np.arange(100, dtype=np.uint16), np.arange(100, dtype=np.uint32)
    assert "version 7" in _refusal(write_llmc(tmp_path / "a.bin", u16, version=7))
    assert "version 1" in _refusal(write_llmc(tmp_path / "b.bin", u32, version=1))
    short = write_llmc(tmp_path / "short.bin", u16)
    short.write_bytes(short.read_bytes()[:-2])  # one token missing: 1224 bytes declared
    assert "1222" in _refusal(short)
    trailing = write_llmc(tmp_path / "trailing.bin", u32, extra=b"\0" * 4)
    assert "1428" in _refusal(trailing)
    assert "101 tokens" in _refusal(write_llmc(tmp_path / "count.bin", u16, count=101))
    assert "-5 tokens" in _refusal(write_llmc(tmp_path / "negative.bin", u16, count=-5))
    assert "0 tokens" in _refusal(write_llmc(tmp_path / "empty.bin", u16[:0]))
    head = write_llmc(tmp_path / "head.bin", u16)
    head.write_bytes(head.read_bytes()[:500])  # the header itself is cut short
    assert "500" in _refusal(head)
    llmc = write_llmc(tmp_path / "ok.bin", u16)
    assert "uint16" in _refusal(llmc, np.uint32)
    npy = write_tokens(tmp_path / "ok.npy", u32, sidecar=False)
    assert "uint32" in _refusal(npy, np.uint16)


# --- sidecars and probes ------------------------------------------------------------------------


def test_damage_of_the_same_size_is_found_by_verify(tmp_path):
    path = write_tokens(tmp_path / "rot.npy", np.arange(200_000, dtype=np.uint32))  # 800 KB
    raw = bytearray(path.read_bytes())
    middle = 128 + 4 * 100_000  # id 100,000, between the first and the last 64 KiB
    raw[middle] ^= 0x01  # it becomes 100,001: same size, same header
    path.write_bytes(raw)
    ds = nd.NpyTokensDataset(path, 9)  # the default open reads the head and the tail only
    assert ds[0, [100_000 // 9]][0][0, 100_000 % 9].item() == 100_001
    refused(path, nd.TokenFileError, "sha256", verify=True)


def test_a_sidecar_that_does_not_describe_its_file_is_refused(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    for field, value, named, here in [
        ("dtype", "uint32", "dtype", "'uint16'"),
        ("shape", [999], "shape", "[1000]"),
        ("file_size", 7, "file_size", "2128"),
        ("probe_sha256", "0" * 64, "probe_sha256", "'"),
        ("layout", "bin", "shape", "[1064]"),  # "bin" is final: the .npy header read as 64 ids
    ]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, **{field: value})
        refused(path, nd.TokenFileError, named, here)
    path = write_tokens(tmp_path / "new.npy", tokens, format_version=99)
    refused(path, nd.TokenFileError, "format_version", "99")
    path = write_tokens(tmp_path / "other.npy", tokens, format="something else")
    refused(path, nd.TokenFileError, "format")
    for name, text in [("deep.npy", "[" * 100_000), ("junk.npy", "{not json")]:
        path = write_tokens(tmp_path / name, tokens)
        nd.sidecar_path(path).write_text(text)
        assert repr(str(nd.sidecar_path(path))) in refused(path, nd.TokenFileError)


def test_a_sidecars_own_fields_are_trusted_on_open_and_its_hash_read_on_request(tmp_path):
    """The reader compares what can change after writing (the file); what the writer checked
    (n_tokens, eot_id, the tokenizer) is audited by prepare_tokens.py --verify."""
    tokens = np.arange(1000, dtype=np.uint16)
    path = write_tokens(tmp_path / "self.npy", tokens, n_tokens=999, eot_id=70_000)
    assert len(nd.NpyTokensDataset(path, 4)) == 249
    path = write_tokens(tmp_path / "hash.npy", tokens, sha256="0" * 64)
    assert len(nd.NpyTokensDataset(path, 4)) == 249
    refused(path, nd.TokenFileError, "sha256", verify=True)


def test_verify_with_a_sidecar_that_has_no_sha256_is_a_token_file_error(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(100, dtype=np.uint16))
    meta = nd.read_sidecar(path)
    del meta["sha256"]
    nd.sidecar_path(path).write_text(json.dumps(meta))
    refused(path, nd.TokenFileError, "sha256", verify=True)


def test_swapped_shards_of_one_size_are_refused_on_open(tmp_path):
    paths = [
        write_tokens(tmp_path / f"train_{i}.npy", np.arange(1000 * i, 1000 * i + 1000, dtype="u2"))
        for i in range(2)
    ]
    assert nd.NpyTokensDataset(paths, 8)[0][0][0].item() == 0
    a, b = (p.read_bytes() for p in paths)  # swap the data files, leave the sidecars in place
    paths[0].write_bytes(b)
    paths[1].write_bytes(a)
    with pytest.raises(nd.TokenFileError, match=r"train_0.npy'.*probe_sha256"):
        nd.NpyTokensDataset(paths, 8)


# --- token ids and vocabularies -----------------------------------------------------------------


def test_boundary_ids_round_trip(tmp_path):
    for dtype, ids in [
        (np.uint16, [0, 50_256, 65_535, 1, 65_534, 32_768, 32_767]),
        (np.uint32, [0, 2**32 - 1, 65_536, 2**31, 2**31 - 1, 50_256, 1]),
    ]:
        path = tmp_path / f"{dtype.__name__}.npy"
        chunks = (np.array(part, dtype=np.int64) for part in (ids[:3], ids[3:]))
        n_vocab = int(np.iinfo(dtype).max) + 1
        meta = nd.write_tokens(path, chunks, n_vocab=n_vocab, tokenizer="test:ids", eot_id=0)
        assert meta["dtype"] == np.dtype(dtype).name and meta["max_token_id"] == max(ids)
        assert np.load(path).tolist() == ids
        ds = nd.NpyTokensDataset(path, 2)
        singles = [t for i in range(len(ds)) for t in ds[i][0].tolist()]
        x, y = ds[0, list(range(len(ds)))]  # the batched gather widens the top ids exactly too
        assert singles == x.flatten().tolist() == ids[: 2 * len(ds)]
        assert y[:, -1].tolist() == ids[2 : 2 * len(ds) + 1 : 2]


def test_ids_past_vocab_size_are_refused(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    path = write_tokens(tmp_path / "t.npy", tokens, max_token_id=50_256, n_vocab=50_257)
    assert len(nd.NpyTokensDataset(path, 9, vocab_size=50_257)) == 111  # the sidecar's figure
    refused(path, nd.TokenFileError, "50256", "vocab_size=50000", vocab_size=50_000)
    bare = write_tokens(tmp_path / "bare.npy", tokens, sidecar=False)
    assert len(nd.NpyTokensDataset(bare, 9, vocab_size=1000)) == 111  # no sidecar: one scan
    refused(bare, nd.TokenFileError, "999", "vocab_size=999", vocab_size=999)
    high = write_tokens(tmp_path / "high.bin", np.array([5, 60_000, 7] * 10, dtype=np.uint16))
    refused(high, nd.TokenFileError, "60000", vocab_size=50_257)
    for bad, error in [("50257", TypeError), (50_257.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match=f"vocab_size.*{type(bad).__name__}"):
            nd.NpyTokensDataset(path, 9, vocab_size=bad)
    with pytest.raises(ValueError, match="vocab_size.*0$"):
        nd.NpyTokensDataset(path, 9, vocab_size=0)


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
    # and it imports in a fresh interpreter where the prep step's packages cannot be imported
    code = "import sys; sys.modules.update(tiktoken=None, datasets=None, tqdm=None); import npy_datasets; print('ok')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "python_files",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "ok", out.stderr


# --- what an attack found (issue 19) ---------------------------------------------------------------


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
    refused(path, nd.TokenFileError, "probe_sha256")


def test_a_sidecar_field_of_null_and_a_sidecar_link_loop_are_named(tmp_path):
    path = write_tokens(tmp_path / "null.npy", np.arange(100, dtype=np.uint16), probe_sha256=None)
    refused(path, nd.TokenFileError, "probe_sha256", "None")
    loop = write_tokens(tmp_path / "loop.npy", np.arange(100, dtype=np.uint16))
    side = nd.sidecar_path(loop)
    side.unlink()
    side.symlink_to(side.name)  # a link to itself: stat() fails with ELOOP
    assert repr(str(side)) in refused(loop, nd.TokenFileError)


def test_verify_without_a_sidecar_is_refused_before_the_file_is_read(tmp_path, monkeypatch):
    bare = tmp_path / "bare.npy"
    np.save(bare, np.arange(100, dtype=np.uint16))
    monkeypatch.setattr(nd.hashlib, "file_digest", lambda *a: pytest.fail("hashed all the same"))
    refused(bare, nd.TokenFileError, "has no sidecar", "verify=True", verify=True)


# --- issue 33: the file checked is the file mapped ----------------------------------------------


def test_a_file_renamed_over_the_path_just_before_the_map_is_never_served(tmp_path, monkeypatch):
    """Another writer renames a new file over the path after the checks, just before the map
    (np.memmap's first line, here): open_tokens and the dataset's lazy map serve the checked
    file's ids or refuse naming the file, never the new file's ids under the old sidecar."""
    path = write_tokens(tmp_path / "t.npy", np.arange(1000, dtype=np.uint32))
    real_memmap = np.memmap
    swaps = []

    def swap_then_map(*args, **kwargs):
        fresh = write_tokens(tmp_path / "fresh.npy", np.full(1000, 7, dtype=np.uint32))
        os.replace(fresh, path)
        swaps.append(path)
        return real_memmap(*args, **kwargs)

    for open_and_read in (
        lambda: nd.open_tokens(path)[:9],
        lambda: nd.NpyTokensDataset(path, 8)[0][0],
    ):
        write_tokens(path, np.arange(1000, dtype=np.uint32))
        monkeypatch.setattr(np, "memmap", swap_then_map)
        try:
            ids = np.asarray(open_and_read()).tolist()
        except nd.TokenFileError as error:
            assert repr(str(path)) in str(error), error
        else:
            assert ids[:8] == list(range(8)), ids  # the checked file's ids, not the 7s
        monkeypatch.setattr(np, "memmap", real_memmap)
    assert len(swaps) == 2  # each map happened after the swap


RACE = """
import json, os, sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd
path, role = sys.argv[2], sys.argv[3]
deadline = time.monotonic() + 15
if role != "reader":  # a writer: files of its own id and length, renamed over the path
    value, n = (1, 300_000) if role == "a" else (2, 100_000)
    while time.monotonic() < deadline and not os.path.exists(path + ".done"):
        nd.write_tokens(path, np.full(n, value, np.uint16), n_vocab=50257, tokenizer="t",
                        eot_id=0, value=value)
    sys.exit(0)
seen = []  # the sidecar each open read and checked
read = nd.read_sidecar
nd.read_sidecar = lambda p: seen.append(read(p)) or seen[-1]
counts = {"served": 0, "refused": 0, "problem": None}
for i in range(2000):
    if time.monotonic() > deadline:
        break
    seen.clear()
    try:
        ids = np.asarray(nd.open_tokens(path, verify=i % 2 == 0))
    except Exception as error:
        if path not in str(error):  # the file, or its sidecar, by name
            counts["problem"] = f"a bare {type(error).__name__}: {error}"
            break
        counts["refused"] += 1
        continue
    meta = seen[-1] if seen else None
    if meta is not None and (ids.size != meta["n_tokens"] or set(np.unique(ids)) != {meta["value"]}):
        counts["problem"] = f"ids {np.unique(ids)} under a sidecar of {meta['value']}s"
        break
    counts["served"] += 1
open(path + ".done", "w").close()
print(json.dumps(counts))
"""


def test_two_writers_and_a_reader_never_mix_one_file_with_another_files_sidecar(tmp_path):
    """Two processes rename new files (other ids, other lengths) over one path in a loop while a
    third opens it (verify=True and False): each open serves the ids its checked sidecar
    describes, or refuses naming the file; never another file's ids, never a bare error."""
    path = str(tmp_path / "race.npy")
    python = [sys.executable, "-c", RACE, str(ROOT / "python_files"), path]
    nd.write_tokens(
        path, np.full(10, 1, np.uint16), n_vocab=50257, tokenizer="t", eot_id=0, value=1
    )
    writers = [subprocess.Popen([*python, role]) for role in "ab"]
    try:
        proc = run_process([*python, "reader"])
    finally:
        Path(path + ".done").touch()
        for writer in writers:
            writer.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["problem"] is None and result["served"] > 0, result


@pytest.mark.parametrize("version", [1.0, True])
def test_a_format_version_that_is_not_an_integer_is_named_with_a_fix(tmp_path, version):
    """1.0 and true are not versions: the sidecar is damaged, and a newer module would not help."""
    path = write_tokens(tmp_path / "t.npy", np.arange(100, dtype=np.uint16))
    edit = {**json.loads(nd.sidecar_path(path).read_text()), "format_version": version}
    nd.sidecar_path(path).write_text(json.dumps(edit))
    message = refused(path, nd.TokenFileError, "write the file again (rerun the prep step")
    assert "copy a newer one" not in message, message
    assert f"'format_version' is {version!r}" in message, message


def test_a_hand_written_three_field_sidecar_beside_a_nanogpt_bin_serves_it(tmp_path):
    """The reader needs only the sidecar fields it uses: format, format_version, and here the
    dtype of raw ids. The README's example; without max_token_id, vocab_size scans (issue 34)."""
    path = tmp_path / "train.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)  # nanoGPT's train.bin: raw ids, no header
    side = {"format": "npy-tokens", "format_version": 1, "dtype": "uint16"}
    nd.sidecar_path(path).write_text(json.dumps(side))
    assert nd.read_sidecar(path) == side
    assert nd.open_tokens(path, vocab_size=1000).tolist() == list(range(1000))
    ds = nd.NpyTokensDataset(path, seq_len=8)
    assert len(ds) == 124 and ds[1][0].tolist() == list(range(8, 16))
    refused(path, nd.TokenFileError, "past vocab_size=999", vocab_size=999)  # a scan, no field
    refused(path, nd.TokenFileError, "its sidecar has no sha256", verify=True)
    nd.sidecar_path(path).write_text(json.dumps(side | {"shape": [999]}))  # present: compared
    refused(path, nd.TokenFileError, "replaced or damaged", "shape is [999] there, [1000] here")
