"""The .npy header: read by hand, never through numpy's loader, and refused before any data is read.

Magic, version and header length; the header dict; the dtype; Fortran order, shape and the file's
size; and a fuzzer over good and bad header pieces. Catalogue items 4-16, 73 and 74
(tests/bad_inputs.md).
"""

import ast
import pickle
import re
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import npy_datasets as nd
from conftest import dataset_error, header_for, npy_bytes, refused, write_tokens


class Payload:
    """Unpickling this creates a marker file: proof that a loader ran pickle."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# --- magic, version and header length -----------------------------------------------------------


def test_item_04_bad_magic_never_unpickles(tmp_path):
    marker = tmp_path / "unpickled"
    cases = {
        "text.npy": b"token ids, one per line\n1\n2\n3\n",
        "pickle.npy": pickle.dumps(Payload(marker)),
        "raw.npy": np.arange(100, dtype=np.uint16).tobytes(),  # a nanoGPT .bin renamed
    }
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        message = refused(
            tmp_path / name, nd.TokenFileError, "is not a .npy file", r"expected b'\x93NUMPY'"
        )
        assert repr(raw[:6]) in message  # the bytes found
    assert not marker.exists()
    with pytest.raises(
        ValueError, match="pickled"
    ):  # np.load reads the same file as a pickle, if allowed
        np.load(tmp_path / "pickle.npy")


def test_pickle_disguised_as_npy_never_runs(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "evil.npy").write_bytes(pickle.dumps(Payload()))
    assert "not a .npy file" in dataset_error(tmp_path / "evil.npy")
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,)}"
    (tmp_path / "obj.npy").write_bytes(npy_bytes(header) + pickle.dumps([Payload()]))
    msg = dataset_error(tmp_path / "obj.npy")
    assert "'|O' is not supported" in msg and not marker.exists()


def test_item_05_unknown_version(tmp_path):
    for version, shown in [(b"\x04\x00", "4.0"), (b"\x00\x00", "0.0"), (b"\x01\x07", "1.7")]:
        (tmp_path / "v.npy").write_bytes(npy_bytes(header_for(), version, b"\0" * 8))
        refused(
            tmp_path / "v.npy",
            nd.TokenFileError,
            f"unsupported .npy version {shown}",
            "expected 1.0, 2.0 or 3.0",
        )


def test_item_06_truncated_header(tmp_path):
    whole = npy_bytes(header_for(), data=b"\0" * 8)
    (tmp_path / "cut.npy").write_bytes(whole[:30])
    refused(
        tmp_path / "cut.npy",
        nd.TokenFileError,
        f"truncated header: need {10 + len(header_for())} bytes, file has 30",
    )
    (tmp_path / "preamble.npy").write_bytes(whole[:7])
    refused(tmp_path / "preamble.npy", nd.TokenFileError, "truncated .npy preamble (7 bytes)")
    (tmp_path / "length.npy").write_bytes(
        b"\x93NUMPY\x02\x00\x10"
    )  # a 4-byte length field cut after one byte
    refused(tmp_path / "length.npy", nd.TokenFileError, "truncated .npy header (9 bytes)")


def test_item_07_oversized_header_refused_before_reading(tmp_path):
    cases = {
        "v2.npy": (
            b"\x93NUMPY\x02\x00" + (2**32 - 1).to_bytes(4, "little") + b"{}",
            2**32 - 1,
        ),  # 14 bytes
        "v3.npy": (b"\x93NUMPY\x03\x00" + (2**31).to_bytes(4, "little") + b"{}", 2**31),
        "v1.npy": (
            npy_bytes(b"{" + b" " * 65_533 + b"}"),
            65_535,
        ),  # present in full, and still too long
    }
    for name, (raw, length) in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        refused(
            path,
            nd.TokenFileError,
            f".npy header of {length} bytes, which is larger than the 10000 allowed",
        )
        best = min(_seconds(lambda: _raises(nd.read_npy_header, path)) for _ in range(5))
        assert best < 0.05, f"{name}: {best:.3f} s to refuse"
        tracemalloc.start()
        try:
            _raises(nd.read_npy_header, path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024, (
            f"{name}: {peak} bytes allocated to refuse a header"
        )  # never the declared size


def _seconds(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _raises(function, *args):
    with pytest.raises(nd.TokenFileError):
        function(*args)


# --- the header dict ----------------------------------------------------------------------------


def test_item_08_header_must_be_a_literal_dict(tmp_path):
    marker = tmp_path / "ran"
    cases = {
        f"__import__('os').system('touch {marker}')": "not a Python literal",
        "dict(descr='<u2', fortran_order=False, shape=(4,))": "not a Python literal",
        "{[1]: 2}": "not a Python literal",  # a literal that cannot be built: unhashable key
        "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'extra': 1}": "must have keys descr, fortran_order, shape; found ['descr', 'extra', 'fortran_order', 'shape']",
        "{'descr': '<u2', 'shape': (4,)}": "found ['descr', 'shape']",
        "['descr', 'fortran_order', 'shape']": "found list",
    }
    for header, expected in cases.items():
        (tmp_path / "h.npy").write_bytes(npy_bytes(header, data=b"\0" * 8))
        refused(tmp_path / "h.npy", nd.TokenFileError, expected)
    assert not marker.exists()


@pytest.mark.parametrize(
    "raw, expected",
    [
        (b"hello world, not numpy", "not a .npy file"),
        (b"\x93NUMPY\x04\x00\x10\x00", "unsupported .npy version 4.0"),
        (b"\x93NUMPY\x02\x00\xff\xff\xff\xff" + b" " * 6, "larger than the 10000 allowed"),
        (
            npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (4,)}")[:-10],
            "truncated header",
        ),
        (npy_bytes(b"__import__('os').system('true')") + b"\0" * 8, "not a Python literal"),
        (npy_bytes(b"{'descr': '<u2', 'shape': (4,)}") + b"\0" * 8, "must have keys"),
        (
            npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (-5,)}"),
            "got shape (-5,)",
        ),
        (
            npy_bytes(
                b"{'descr': '<u2', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904)}"
            ),
            "is truncated",
        ),
        (
            npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (1000000,)}")
            + b"\0" * 228,
            "is truncated",
        ),
        (
            npy_bytes(b"{'descr': '<u2', 'fortran_order': False, 'shape': (6,)}") + b"\0" * 14,
            "has trailing bytes",
        ),
        (
            npy_bytes(b"{'descr': [('a', '<u2')], 'fortran_order': False, 'shape': (6,)}")
            + b"\0" * 12,
            "structured",
        ),
    ],
)
def test_bad_npy_headers(tmp_path, raw, expected):
    (tmp_path / "bad.npy").write_bytes(raw)
    assert expected in dataset_error(tmp_path / "bad.npy")


# --- the dtype ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["<i8", "<f4", "|u1", "<u8", "<i2", "<i4", "<f2", "|b1"])
def test_item_09_descr_other_than_unsigned_16_or_32(tmp_path, dtype):
    np.save(tmp_path / "t.npy", np.arange(10).astype(dtype))
    refused(
        tmp_path / "t.npy",
        nd.TokenFileError,
        f"dtype {np.dtype(dtype).str!r} is not supported",
        "expected little-endian ('uint16', 'uint32')",
    )


def test_item_09_project_accepts_both_widths(tmp_path):
    for dtype in (np.uint16, np.uint32):  # the documented difference: both widths are token files
        ds = nd.NpyTokensDataset(
            write_tokens(tmp_path / f"{dtype.__name__}.npy", np.arange(40, dtype=dtype)), 4
        )
        assert ds.dtype == dtype.__name__ and ds[2][0].tolist() == [8, 9, 10, 11]


def test_item_10_big_endian(tmp_path):
    for dtype in (">u2", ">u4"):
        np.save(tmp_path / "be.npy", np.arange(10, dtype=dtype))
        refused(
            tmp_path / "be.npy",
            nd.TokenFileError,
            f"dtype {dtype!r} is not supported",
            "little-endian",
        )


def test_item_11_object_structured_subarray(tmp_path):
    marker = tmp_path / "unpickled"
    np.save(
        tmp_path / "obj.npy", np.array([Payload(marker)], dtype=object)
    )  # np.save pickles the objects
    refused(tmp_path / "obj.npy", nd.TokenFileError, "dtype '|O' is not supported")
    np.save(tmp_path / "rec.npy", np.zeros(3, dtype=[("a", "<u2")]))
    refused(
        tmp_path / "rec.npy",
        nd.TokenFileError,
        "structured dtype [('a', '<u2')], which is not a token array",
    )
    (tmp_path / "sub.npy").write_bytes(
        npy_bytes(header_for("('<u2', (2,))", shape="(3,)"), data=b"\0" * 12)
    )
    refused(tmp_path / "sub.npy", nd.TokenFileError, "structured dtype ('<u2', (2,))")
    (tmp_path / "sub2.npy").write_bytes(
        npy_bytes(header_for("'(2,)<u2'", shape="(3,)"), data=b"\0" * 12)
    )
    refused(tmp_path / "sub2.npy", nd.TokenFileError, "dtype '|V4' is not supported")
    (tmp_path / "sub3.npy").write_bytes(
        npy_bytes(header_for("'(-1,)u2'", shape="(3,)"), data=b"\0" * 6)
    )
    refused(
        tmp_path / "sub3.npy", nd.TokenFileError, "'(-1,)u2' is not a dtype"
    )  # numpy's own ValueError, named
    assert not marker.exists()


# --- order, shape and the file's size -----------------------------------------------------------


def test_item_12_fortran_order(tmp_path):
    np.save(tmp_path / "f2.npy", np.asfortranarray(np.arange(20, dtype=np.uint16).reshape(4, 5)))
    refused(tmp_path / "f2.npy", nd.TokenFileError, "fortran_order=True; expected False (C order)")
    (tmp_path / "f1.npy").write_bytes(npy_bytes(header_for(fortran="True"), data=b"\0" * 8))
    refused(tmp_path / "f1.npy", nd.TokenFileError, "fortran_order=True")
    (tmp_path / "f0.npy").write_bytes(npy_bytes(header_for(fortran="0"), data=b"\0" * 8))
    refused(tmp_path / "f0.npy", nd.TokenFileError, "fortran_order=0")  # only the literal False


def test_item_13_dimensions(tmp_path):
    np.save(tmp_path / "scalar.npy", np.uint16(7))
    refused(
        tmp_path / "scalar.npy",
        nd.TokenFileError,
        "is not a 1-D or 2-D token array, got shape ()",
    )
    np.save(tmp_path / "cube.npy", np.arange(27, dtype=np.uint16).reshape(3, 3, 3))
    refused(tmp_path / "cube.npy", nd.TokenFileError, "got shape (3, 3, 3)")
    rows = nd.NpyTokensDataset(
        write_tokens(tmp_path / "rows.npy", np.arange(30, dtype=np.uint16).reshape(3, 10)), 4
    )
    assert [rows[i][0][0].item() for i in range(len(rows))] == [
        0,
        4,
        10,
        14,
        20,
        24,
    ]  # the documented difference


def test_item_14_declared_shape_larger_than_data(tmp_path):
    path = tmp_path / "short.npy"
    raw = npy_bytes(header_for(shape="(1000000,)"), data=b"\0" * 228)
    path.write_bytes(raw)
    needed = 10 + len(header_for(shape="(1000000,)")) + 2_000_000
    refused(
        path,
        nd.TokenFileError,
        f"is truncated: shape (1000000,) of uint16 needs {needed} bytes, file has {len(raw)}",
    )
    assert (
        path.read_bytes() == raw
    )  # never opened for writing: numpy's mode "r+" would have grown it


def test_item_15_trailing_bytes(tmp_path):
    raw = npy_bytes(header_for(shape="(6,)"), data=b"\0" * 12)
    for extra in (b"\0", b"\0" * 14, raw):  # a stray byte, garbage, the file written twice
        (tmp_path / "tail.npy").write_bytes(raw + extra)
        refused(
            tmp_path / "tail.npy",
            nd.TokenFileError,
            "has trailing bytes",
            f"file has {len(raw) + len(extra)}",
        )


def test_a_npy_with_trailing_bytes_says_so_in_plain_words(tmp_path):
    path = tmp_path / "tail.npy"
    np.save(path, np.arange(6, dtype=np.uint16))
    path.write_bytes(path.read_bytes() + b"\0" * 4)
    with pytest.raises(
        nd.TokenFileError,
        match=r"tail.npy' has trailing bytes: shape \(6,\) of uint16 needs 140 bytes, file has 144",
    ):
        nd.read_npy_header(path)


def test_item_16_bad_dimensions(tmp_path):
    cases = {
        "(-5,)": "got shape (-5,)",
        "(True,)": "got shape (True,)",
        "(3.0,)": "got shape (3.0,)",
        "(2**62,)": "not a Python literal",  # an expression, not a literal
        f"({2**62}, {2**62})": f"needs {10 + len(header_for(shape=f'({2**62}, {2**62})')) + 2 * 2**124} bytes",
        "(0,)": "holds no tokens (shape (0,))",
        "(0, 5)": "holds no tokens (shape (0, 5))",
    }
    for shape, expected in cases.items():
        (tmp_path / "d.npy").write_bytes(npy_bytes(header_for(shape=shape)))
        refused(tmp_path / "d.npy", nd.TokenFileError, expected)


@pytest.mark.parametrize(
    "array, expected",
    [
        (np.arange(10, dtype=np.float32), "'<f4' is not supported"),
        (np.arange(10, dtype=np.int64), "'<i8' is not supported"),
        (np.arange(10, dtype=">u2"), "'>u2' is not supported"),
        (
            np.arange(27, dtype=np.uint16).reshape(3, 3, 3),
            "1-D or 2-D token array, got shape (3, 3, 3)",
        ),
        (np.arange(4, dtype=np.uint16), "the file has 4 tokens; seq_len=4 needs at least 5"),
        (np.arange(8, dtype=np.uint16).reshape(2, 4), "each row has 4 tokens"),
        (np.zeros(0, dtype=np.uint16), "holds no tokens"),
        (np.asfortranarray(np.arange(20, dtype=np.uint16).reshape(4, 5)), "fortran_order=True"),
    ],
)
def test_bad_npy_contents(tmp_path, array, expected):
    np.save(tmp_path / "bad.npy", array)
    msg = dataset_error(tmp_path / "bad.npy")
    assert expected in msg and "bad.npy" in msg


# --- the parser under a fuzzer ------------------------------------------------------------------


HEADER_PIECES = {
    "descr": [
        "'<u2'",
        "'<u4'",
        "'>u2'",
        "'|O'",
        "'<f8'",
        "'(2,)<u2'",
        "[('a', '<u2')]",
        "('<u2', (2,))",
        "'M8[xyz]'",
        "'(-1,)u2'",
        "'u99'",
        "''",
        "None",
        "b'<u2'",
        "{}",
        "__import__('os')",
        "'<u2' + ''",
        "[]",
    ],
    "fortran": ["False", "False", "True", "0", "None", "'False'", "[]"],
    "shape": [
        "(3,)",
        "(2, 3)",
        "()",
        "(0,)",
        "(-1,)",
        "(3.0,)",
        "(True,)",
        "[3]",
        "(2**40,)",
        f"({2**62}, {2**62})",
        "(3, 2, 1)",
        "(1, 1, 1, 1)",
        "((3,),)",
        "{1: 2}",
        "(1" + "0" * 5000 + ",)",
        "(" * 14 + "3" + ",)" * 14,
    ],  # nested tuples
}


@st.composite
def npy_like_files(draw) -> bytes:
    """A .npy file built from good and bad header pieces, then maybe damaged byte by byte (one in five stays valid)."""
    clean = draw(st.integers(0, 4)) == 0
    pieces = (
        {k: v[:2] for k, v in HEADER_PIECES.items()}
        if clean or draw(st.booleans())
        else HEADER_PIECES
    )
    descr, fortran, shape = (
        draw(st.sampled_from(pieces[k])) for k in ("descr", "fortran", "shape")
    )
    keys = (
        "normal"
        if clean
        else draw(
            st.sampled_from(
                ["normal"] * 5 + ["missing", "extra", "duplicate", "not a dict", "junk"]
            )
        )
    )
    text = {
        "normal": f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}",
        "missing": f"{{'descr': {descr}, 'shape': {shape}}}",
        "extra": f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, 'x': 1}}",
        "duplicate": f"{{'descr': {descr}, 'descr': '<u2', 'fortran_order': {fortran}, 'shape': {shape}}}",
        "not a dict": f"({descr}, {fortran}, {shape})",
        "junk": draw(st.text(max_size=60)),
    }[keys]
    text += " " * draw(st.integers(0, 70)) + (
        "\n" if clean else draw(st.sampled_from(["\n", "", "\x00", "\n\n"]))
    )
    versions = [b"\x01\x00", b"\x02\x00", b"\x03\x00"] + (
        [] if clean else [b"\x01\x00", b"\x04\x00"]
    )
    version = draw(st.sampled_from(versions))
    header = text.encode("utf8" if version == b"\x03\x00" else "latin1", errors="replace")
    try:
        n = int(np.prod(ast.literal_eval(shape))) * np.dtype(ast.literal_eval(descr)).itemsize
    except Exception:  # any piece that is not a size: pick a few bytes
        n = 8
    data = b"\0" * max(
        0, min(n, 4096) + (0 if clean else draw(st.sampled_from([0, 0, 0, -1, 1, -2, 2])))
    )
    raw = bytearray(npy_bytes(header, version, data))
    if clean:
        return bytes(raw)
    first = draw(
        st.sampled_from([0, 6, 8, 10])
    )  # the magic, the version, the length field or the header on
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):  # byte damage
        raw[draw(st.integers(min(first, len(raw) - 1), len(raw) - 1))] = draw(st.integers(0, 255))
    if draw(st.integers(0, 3)) == 0:
        raw = raw[: draw(st.integers(min(first, len(raw)), len(raw)))]
    return bytes(raw)


@pytest.mark.filterwarnings(
    "ignore:invalid escape sequence"
)  # a header such as '\\p' makes the parser warn, then it is refused
@settings(
    max_examples=300, deadline=250, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(raw=st.one_of(st.binary(max_size=200), npy_like_files()))
@example(raw=npy_bytes("{[1]: 2}"))  # regression: ast.literal_eval raised TypeError here
@example(
    raw=npy_bytes(header_for("'(-1,)u2'"), data=b"\0" * 8)
)  # regression: np.dtype raised ValueError
def test_item_74_header_parser_fuzz(raw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.npy"
        path.write_bytes(raw)
        try:
            _, dtype, shape, offset = nd.read_npy_header(path)
        except nd.TokenFileError as error:
            assert repr(str(path)) in str(error)
            return
        # accepted: it must be a token array that fills the file exactly, and numpy must agree
        assert (
            dtype in (np.dtype("<u2"), np.dtype("<u4"))
            and 1 <= len(shape) <= 2
            and all(d > 0 for d in shape)
        )
        assert offset + dtype.itemsize * int(np.prod(shape)) == len(raw)
        mapped = np.load(path, mmap_mode="r")
        assert (mapped.dtype, mapped.shape, mapped.offset) == (dtype, shape, offset)
        del mapped


def test_item_74_fuzz_reaches_acceptance_and_many_refusals():
    """The strategy is worth running: it produces valid files as well as each kind of refusal."""
    outcomes = Counter()

    @settings(max_examples=400, deadline=None, database=None)
    @given(raw=npy_like_files())
    def sample(raw):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "f.npy"
            path.write_bytes(raw)
            try:
                nd.read_npy_header(path)
                outcomes["accepted"] += 1
            except nd.TokenFileError as error:
                kind = re.sub(r"'[^']*'|\d+|\(.*", "", str(error).split(": ", 1)[-1])[:25]
                outcomes[kind.strip()] += 1

    sample()
    assert outcomes["accepted"] > 0 and len(outcomes) >= 8, outcomes
