"""write_tokens: ids streamed from an array or from chunks, in C order, the dtype the vocabulary
needs, and a sidecar; every refusal comes before the old file or its sidecar is touched, and names
the file being written."""

import errno
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

import npy_datasets as nd

WRITER = {"n_vocab": 50, "tokenizer": "test:ids", "eot_id": 0}


def llmc_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """llm.c's shard header: 256 int32 words, magic, version and token count first."""
    magic, version = (20240520, 1) if dtype == np.uint16 else (20240801, 7)
    words = np.zeros(256, dtype="<i4")
    words[:3] = magic, version, int(np.prod(shape))
    return words.tobytes()


def saved(folder) -> dict[str, tuple[bytes, int]]:
    """Every file in folder: its bytes and inode (a file renamed over it has another)."""
    return {p.name: (p.read_bytes(), p.stat().st_ino) for p in sorted(folder.iterdir())}


# --- what is written ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tokens.npy", "tokens.bin"])
def test_chunks_from_a_generator_write_the_same_file_as_one_array(tmp_path, name):
    ids = np.arange(1000) % 50
    (tmp_path / "whole").mkdir()
    (tmp_path / "chunks").mkdir()
    whole = nd.write_tokens(tmp_path / "whole" / name, ids, **WRITER)
    chunks = (ids[i : i + 7] for i in range(0, len(ids), 7))  # a generator: read once
    streamed = nd.write_tokens(tmp_path / "chunks" / name, chunks, **WRITER)
    assert streamed == whole and whole["shape"] == [1000]
    one, other = (tmp_path / folder / name for folder in ("whole", "chunks"))
    assert one.read_bytes() == other.read_bytes()
    assert nd.open_tokens(other).tolist() == ids.tolist()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names open files through /proc")
def test_each_fsync_finds_every_byte_of_its_file_with_the_os(tmp_path, monkeypatch):
    """A write still in Python's buffer when fsync runs is not on the disk after a power cut (the
    sidecar's was, until it was flushed first)."""
    synced, real_fsync = {}, os.fsync

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not os.path.isdir(name):
            synced[Path(name).name.split(".tmp.")[0]] = os.fstat(fd).st_size
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "train.npy"
    nd.write_tokens(path, np.arange(1000), n_vocab=50257, tokenizer="tiktoken:gpt2", eot_id=50256)
    sidecar = nd.sidecar_path(path)
    assert synced == {".train.npy": path.stat().st_size, ".train.npy.json": sidecar.stat().st_size}


def test_two_d_ids_keep_their_rows_in_a_npy_and_are_refused_for_a_bin(tmp_path):
    rows = np.arange(40).reshape(4, 10)
    meta = nd.write_tokens(tmp_path / "rows.npy", rows, **WRITER)
    assert meta["shape"] == [4, 10] and nd.open_tokens(tmp_path / "rows.npy").shape == (4, 10)
    ds = nd.NpyTokensDataset(tmp_path / "rows.npy", seq_len=4)  # windows stay inside a row
    assert len(ds) == 8 and ds[2][0].tolist() == [10, 11, 12, 13]
    for name, ids in [("rows.bin", rows), ("chunk.npy", iter([rows]))]:  # raw ids keep no rows
        with pytest.raises(TypeError, match=r"(4, 10)") as info:
            nd.write_tokens(tmp_path / name, ids, **WRITER)
        assert repr(str(tmp_path / name)) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.npy", "rows.npy.json"]


def test_fortran_ordered_and_transposed_ids_are_written_in_c_order(tmp_path):
    ids = np.arange(12).reshape(3, 4)
    for name, given in [
        ("f.npy", np.asfortranarray(ids)),
        ("t.npy", ids.T),
        ("s.npy", ids[:, ::2]),
    ]:
        nd.write_tokens(tmp_path / name, given, **WRITER)
        tokens = nd.open_tokens(tmp_path / name)
        assert tokens.flags.c_contiguous and tokens.tolist() == given.tolist()


def test_the_default_dtype_is_the_narrowest_that_holds_the_vocabulary(tmp_path):
    path = tmp_path / "t.npy"
    for n_vocab, dtype in [(50_257, "uint16"), (2**16, "uint16"), (2**16 + 1, "uint32")]:
        meta = nd.write_tokens(path, [0, n_vocab - 1], n_vocab=n_vocab, tokenizer="t", eot_id=0)
        assert meta["dtype"] == dtype and np.load(path).tolist() == [0, n_vocab - 1]
    with pytest.raises(ValueError, match="70,000"):
        nd.write_tokens(path, [0], n_vocab=70_000, tokenizer="t", eot_id=0, dtype="uint16")
    assert nd.sidecar_path("data/x/train.npy") == Path("data/x/train.npy.json")


def test_a_numpy_number_in_a_field_is_written_as_a_plain_number(tmp_path):
    ids = np.array([0, 3, 3, 7])
    meta = nd.write_tokens(tmp_path / "t.npy", ids, **WRITER, n_docs=(ids == 3).sum())
    assert meta["n_docs"] == 2 and type(meta["n_docs"]) is int
    assert json.loads(nd.sidecar_path(tmp_path / "t.npy").read_text())["n_docs"] == 2


def test_layout_llmc_writes_an_llmc_shard_that_opens_as_one(tmp_path):
    for dtype, n_vocab in [(np.uint16, 50_257), (np.uint32, 128_256)]:
        path = tmp_path / f"shard_{dtype.__name__}.bin"
        ids = (np.arange(500) * 97) % n_vocab
        meta = nd.write_tokens(
            path,
            iter(np.split(ids, 5)),
            n_vocab=n_vocab,
            tokenizer="t",
            eot_id=0,
            layout="llmc",
        )
        assert meta["layout"] == "llmc" and meta["dtype"] == np.dtype(dtype).name
        assert path.read_bytes()[: nd.LLMC_HEADER_BYTES] == llmc_header(dtype, (500,))
        assert path.stat().st_size == nd.LLMC_HEADER_BYTES + 500 * np.dtype(dtype).itemsize
        assert nd.open_tokens(path).tolist() == ids.tolist()
        nd.sidecar_path(path).unlink()  # llm.c's own reader needs no sidecar: nor does this one
        assert nd.open_tokens(path).tolist() == ids.tolist()


def test_raw_ids_that_spell_the_npy_magic_stay_raw_ids_under_a_bin_sidecar(tmp_path):
    ids = np.array([20115, 19797, 22864, 0, 1, *range(2, 60)])  # "\x93NUMPY\0..." as uint16
    path = tmp_path / "ids.bin"
    nd.write_tokens(path, ids, n_vocab=50_257, tokenizer="t", eot_id=0)
    assert path.read_bytes()[:6] == nd.NPY_MAGIC
    assert nd.open_tokens(path).tolist() == ids.tolist()


@pytest.mark.parametrize(
    "name, layout",
    [("shard.npy", "llmc"), ("shard.npy", "bin"), ("other.bin", "zip")],
    ids=["llm.c layout in a .npy path", "raw ids in a .npy path", "a layout open_tokens lacks"],
)
def test_a_layout_open_tokens_would_misread_is_refused_before_writing(tmp_path, name, layout):
    with pytest.raises(ValueError, match=re.escape(repr(str(tmp_path / name)))):
        nd.write_tokens(
            tmp_path / name, np.arange(100), n_vocab=50_257, tokenizer="t", eot_id=0, layout=layout
        )
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("name, layout", [("a.npy", "npy"), ("a.bin", "bin"), ("a.tok", "npy")])
def test_the_layout_defaults_from_the_suffix(tmp_path, name, layout):
    meta = nd.write_tokens(tmp_path / name, np.arange(10), **WRITER)
    assert meta["layout"] == layout and nd.open_tokens(tmp_path / name).tolist() == list(range(10))


def test_ragged_rows_are_refused_saying_what_a_list_and_an_iterator_write(tmp_path):
    """A list of equal-length arrays is rows; an iterator of arrays is one stream, whose windows
    cross the arrays: the refusal says both, and never offers the stream as rows (issue 34)."""
    rows = [np.arange(4), np.arange(3)]
    with pytest.raises(ValueError) as info:
        nd.write_tokens(tmp_path / "r.npy", rows, **WRITER)
    message = str(info.value)
    assert "rows of many lengths" not in message, message
    assert "a list of arrays is written as rows" in message and "one stream" in message, message
    meta = nd.write_tokens(tmp_path / "r.npy", iter(rows), **WRITER)
    assert meta["shape"] == [7]  # what the message says: one stream, no rows


# --- refusals: the old file and its sidecar stay as they were -----------------------------------


def bad_chunks():
    yield np.arange(10)
    yield np.array([3, 77])  # a later chunk, once the first is in the temporary file


@pytest.mark.parametrize(
    "ids, extra, error, found",
    [
        pytest.param([[1, 2], [3]], {}, ValueError, "ragged", id="ragged"),
        pytest.param(np.arange(5.0), {}, TypeError, "float64", id="floats"),
        pytest.param(np.array([True, False]), {}, TypeError, "bool", id="bools"),
        pytest.param(np.arange(8).reshape(2, 2, 2), {}, TypeError, "(2, 2, 2)", id="3-D"),
        pytest.param(np.array([], dtype=np.int64), {}, ValueError, "no token ids", id="empty"),
        pytest.param(iter([]), {}, ValueError, "no token ids", id="no chunks"),
        pytest.param(np.array([1, 77]), {}, ValueError, "77", id="id past n_vocab"),
        pytest.param(np.array([1, -1]), {}, ValueError, "id -1 is outside 0 to", id="negative id"),
        pytest.param(bad_chunks(), {}, ValueError, "77", id="id past n_vocab in a later chunk"),
        pytest.param(np.arange(5), {"n_docs": {1}}, TypeError, "set", id="a set field"),
        pytest.param(np.arange(5), {"loss": float("nan")}, TypeError, "JSON", id="a NaN field"),
        pytest.param(np.arange(5), {"sha256": "0"}, TypeError, "sha256", id="sha256 field"),
        pytest.param(np.arange(5), {"max_token_id": 4}, TypeError, "max_token_id", id="max id"),
        pytest.param(np.arange(5), {"shape": [5]}, TypeError, "shape", id="shape field"),
    ],
)
def test_a_refused_write_leaves_the_old_file_and_sidecar_as_they_were(
    tmp_path, ids, extra, error, found
):
    path = tmp_path / "t.npy"
    nd.write_tokens(path, np.arange(30) % 50, **WRITER)
    before = saved(tmp_path)
    with pytest.raises(error) as info:
        nd.write_tokens(path, ids, **WRITER | extra)
    message = str(info.value)
    assert repr(str(path)) in message and found in message and ".tmp." not in message
    assert saved(tmp_path) == before  # no temporary file left either


def test_a_refused_argument_leaves_the_old_file_and_sidecar_as_they_were(tmp_path):
    path = tmp_path / "t.npy"
    nd.write_tokens(path, np.arange(30) % 50, **WRITER)
    before = saved(tmp_path)
    for extra, error, found in [
        ({"dtype": "int8"}, nd.TokenFileError, "i1"),
        ({"dtype": ">u2"}, nd.TokenFileError, ">u2"),
        ({"dtype": "nope"}, nd.TokenFileError, "nope"),
        ({"n_vocab": 2**32 + 1}, ValueError, "n_vocab"),
        ({"n_vocab": True}, TypeError, "n_vocab"),
        ({"eot_id": 50}, ValueError, "eot_id"),
        ({"tokenizer": ""}, TypeError, "tokenizer"),
    ]:
        with pytest.raises(error, match=found):
            nd.write_tokens(path, np.arange(5), **WRITER | extra)
    assert saved(tmp_path) == before


def test_a_folder_at_the_path_is_refused_and_left_alone(tmp_path):
    (tmp_path / "t.npy").mkdir()
    with pytest.raises(IsADirectoryError) as info:
        nd.write_tokens(tmp_path / "t.npy", np.arange(5), **WRITER)
    assert repr(str(tmp_path / "t.npy")) in str(info.value)
    assert [p.name for p in tmp_path.iterdir()] == ["t.npy"] and not list(
        (tmp_path / "t.npy").iterdir()
    )


def test_a_full_disk_names_the_file_being_written_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "t.npy"
    nd.write_tokens(path, np.arange(30) % 50, **WRITER)
    before = saved(tmp_path)

    def full(fd):  # a full disk as fsync reports it under delayed allocation: no file named
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as info:
        nd.write_tokens(path, np.arange(40) % 50, **WRITER)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert saved(tmp_path) == before


def test_a_missing_folder_is_named_by_the_target_path(tmp_path):
    path = tmp_path / "missing" / "t.npy"
    with pytest.raises(FileNotFoundError) as info:
        nd.write_tokens(path, np.arange(5), **WRITER)
    message = str(info.value)
    assert str(path) in message and ".tmp." not in message
    assert f"the folder {str(path.parent)!r} does not exist" in message, message


def test_the_fields_write_tokens_sets_are_the_ones_it_refuses_from_the_caller(tmp_path):
    meta = nd.write_tokens(tmp_path / "t.npy", np.arange(10), **WRITER, n_docs=1)
    assert set(meta) - {"n_docs"} == set(nd.WRITTEN_FIELDS)  # measured, or taken as arguments
    for name in sorted(
        nd.WRITTEN_FIELDS.keys() - {"tokenizer", "n_vocab", "eot_id", "dtype", "layout"}
    ):  # arguments
        with pytest.raises(TypeError, match=name):
            nd.write_tokens(tmp_path / "u.npy", never_read(), **WRITER, **{name: 1})
    assert not (tmp_path / "u.npy").exists()  # refused before the first chunk was asked for


def never_read():
    """A stream that must not be read: a refusal comes before the first chunk."""
    yield np.arange(10)
    raise AssertionError("write_tokens read the ids before refusing the field")


def test_torch_tensors_are_arrays_to_write(tmp_path):
    import torch

    flat = nd.write_tokens(tmp_path / "flat.npy", torch.arange(12), **WRITER)
    rows = nd.write_tokens(tmp_path / "rows.npy", torch.arange(12).view(3, 4), **WRITER)
    assert (flat["shape"], rows["shape"]) == ([12], [3, 4])
    assert nd.open_tokens(tmp_path / "rows.npy").tolist() == torch.arange(12).view(3, 4).tolist()


# --- issue 33: every refusal names the file; every legal name is written --------------------------


@pytest.mark.parametrize(
    "ids",
    [np.zeros((0, 5), dtype=np.uint16), np.zeros((5, 0), dtype=np.uint16), "bfloat16"],
    ids=["0x5", "5x0", "bfloat16"],
)
def test_empty_rows_and_a_bfloat16_tensor_are_refused_naming_the_file(tmp_path, ids):
    import torch

    ids = torch.arange(5).to(torch.bfloat16) if isinstance(ids, str) else ids
    path = tmp_path / "t.npy"
    nd.write_tokens(path, np.arange(30) % 50, **WRITER)
    before = saved(tmp_path)
    with pytest.raises((ValueError, TypeError)) as info:
        nd.write_tokens(path, ids, **WRITER)
    message = str(info.value)
    assert message.startswith(repr(str(path))), message
    if isinstance(ids, torch.Tensor):  # numpy's reason names the dtype: "ScalarType BFloat16"
        assert "bfloat16" in message.lower() and "cannot be read as a numpy array" in message
    else:
        assert "no token ids" in message
    assert saved(tmp_path) == before  # the old file and sidecar, as they were


class CudaTensor:
    """What write_tokens sees of an int64 tensor on a GPU: numpy cannot read it."""

    def __iter__(self):
        raise AssertionError("ids with __array__ are one array, not iterated")

    def __array__(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu()")


def test_ids_numpy_cannot_read_are_refused_with_numpys_reason_not_a_wrong_dtype(tmp_path):
    """An int64 tensor on a GPU holds integers: the refusal says numpy cannot read it and why,
    not that ids must be integers."""
    path = tmp_path / "t.npy"
    with pytest.raises(TypeError) as info:
        nd.write_tokens(path, CudaTensor(), **WRITER)
    message = str(info.value)
    expected = f"{str(path)!r}: ids cannot be read as a numpy array (can't convert cuda:0 device"
    assert message.startswith(expected) and "a CPU tensor" in message, message
    assert "must be integers" not in message and not path.exists()


def test_each_layouts_header_has_one_length_for_any_shape_a_file_can_have():
    """_write_ids writes a placeholder header, then the final one over it once the ids are
    counted: a final header of another length would overwrite ids, so every layout's header must
    keep its length from no ids to the largest shapes (int64 counts; an llm.c count is an int32)."""
    extremes = {"npy": [(0,), (2**62,), (1, 1), (2**62, 2**62)], "bin": [(0,), (2**62,)]}
    extremes["llmc"] = [(0,), (2**31 - 1,)]
    for layout, shapes in extremes.items():
        for dtype in (np.dtype("<u2"), np.dtype("<u4")):
            lengths = {len(nd.HEADERS[layout](dtype, shape)) for shape in shapes}
            assert lengths == {{"npy": 128, "bin": 0, "llmc": 1024}[layout]}, (layout, dtype)


def test_a_name_of_244_utf8_bytes_is_written_and_opens(tmp_path):
    """The filesystem takes 255 bytes a name: the hidden temporary names keep at most 200 bytes
    of it, not 200 characters (600 bytes here)."""
    name = "文" * 80 + ".npy"
    assert len(name.encode()) == 244
    meta = nd.write_tokens(tmp_path / name, np.arange(30) % 50, **WRITER)
    assert meta["file"] == name and nd.open_tokens(tmp_path / name).tolist() == list(range(30))
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, name + ".json"]
