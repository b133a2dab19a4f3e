""".npy files that are not token files: numpy reads the header (np.load with mmap_mode="r", pickles
refused), and every refusal, numpy's or the module's own (uint16 or uint32 little-endian, 1-D or
2-D, C order, not empty), is a TokenFileError naming the file. Catalogue items 4-16, 73 and 74
(tests/bad_inputs.md).
"""

import ast
import pickle
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import npy_datasets as nd
from conftest import ROOT, header_for, npy_bytes, refused, write_tokens


class Payload:
    """Unpickling this creates a marker file: proof that a loader ran pickle."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def refused_npy(path, *fragments: str) -> str:
    """The TokenFileError open_tokens and the dataset both raise for path, naming it; never
    advice to pass allow_pickle=True."""
    message = refused(path, nd.TokenFileError, *fragments)
    with pytest.raises(nd.TokenFileError) as info:
        nd.open_tokens(path)
    address = re.compile(r"0x[0-9a-f]+")  # numpy names a node of the header by its address
    assert address.sub("", str(info.value)) == address.sub("", message)
    assert "allow_pickle" not in message, message
    return message


# --- magic, version and header length -----------------------------------------------------------


def test_a_file_without_the_npy_magic_is_refused_and_a_pickle_never_runs(tmp_path):
    marker = tmp_path / "unpickled"
    cases = {
        "text.npy": b"token ids, one per line\n1\n2\n3\n",
        "pickle.npy": pickle.dumps(Payload(marker)),
        "raw.npy": np.arange(100, dtype=np.uint16).tobytes(),  # a nanoGPT .bin renamed
    }
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        refused_npy(tmp_path / name, repr(raw[:6]))  # the bytes found instead of the magic
    (tmp_path / "cut.npy").write_bytes(nd.NPY_MAGIC[:3])
    refused_npy(tmp_path / "cut.npy")
    assert not marker.exists()


def test_an_object_npy_is_refused_without_unpickling(tmp_path):
    marker = tmp_path / "unpickled"
    np.save(tmp_path / "obj.npy", np.array([Payload(marker)], dtype=object))  # np.save pickles
    refused_npy(tmp_path / "obj.npy")
    assert not marker.exists()


def test_an_unknown_npy_version_is_refused(tmp_path):
    for version, shown in [
        (b"\x04\x00", "(4, 0)"),
        (b"\x00\x00", "(0, 0)"),
        (b"\x01\x07", "(1, 7)"),
    ]:
        (tmp_path / "v.npy").write_bytes(npy_bytes(header_for(), version, b"\0" * 8))
        refused_npy(tmp_path / "v.npy", shown)


def test_a_header_cut_short_is_refused(tmp_path):
    whole = npy_bytes(header_for(), data=b"\0" * 8)
    for name, raw in {
        "header.npy": whole[:30],  # inside the header dict
        "preamble.npy": whole[:7],  # inside the version
        "length.npy": b"\x93NUMPY\x02\x00\x10",  # a 4-byte length field cut after one byte
    }.items():
        (tmp_path / name).write_bytes(raw)
        refused_npy(tmp_path / name)


def test_a_huge_declared_header_length_is_refused(tmp_path):
    for name, raw in {
        "v2.npy": b"\x93NUMPY\x02\x00" + (2**32 - 1).to_bytes(4, "little") + b"{}",  # 14 bytes
        "v3.npy": b"\x93NUMPY\x03\x00" + (2**31).to_bytes(4, "little") + b"{}",
        "v1.npy": npy_bytes(b"{" + b" " * 65_533 + b"}"),  # there in full, past numpy's 10,000
    }.items():
        (tmp_path / name).write_bytes(raw)
        refused_npy(tmp_path / name)


def test_an_oversized_header_is_named_as_one_not_as_a_pickle(tmp_path):
    path = tmp_path / "long.npy"
    header = header_for()[:-1] + b" " * 20_000 + b"\n"  # a valid header, 20,056 bytes long
    path.write_bytes(npy_bytes(header, data=b"\0" * 8))
    assert "pickle" not in refused_npy(path)


def test_a_huge_declared_header_length_is_refused_under_a_memory_limit(tmp_path):
    path = tmp_path / "v2.npy"
    path.write_bytes(b"\x93NUMPY\x02\x00" + (2**32 - 1).to_bytes(4, "little") + b"{}")
    code = (
        "import resource, sys, npy_datasets as nd\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2**31, resource.RLIM_INFINITY))\n"
        "try:\n    nd.open_tokens(sys.argv[1])\n"
        "except Exception as error:\n    print(type(error).__name__, error)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT / "python_files",
        capture_output=True,
        text=True,
        timeout=120,
        env={"OPENBLAS_NUM_THREADS": "1", "PATH": ""},
    )
    assert out.stdout.startswith(f"TokenFileError {str(path)!r}"), out.stdout + out.stderr


# --- the header dict ----------------------------------------------------------------------------


def test_a_header_that_is_not_a_plain_dict_literal_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    cases = {
        f"__import__('os').system('touch {marker}')": (),
        "dict(descr='<u2', fortran_order=False, shape=(4,))": (),
        "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'extra': 1}": ("'extra'",),
        "{'descr': '<u2', 'shape': (4,)}": ("['descr', 'shape']",),
        "['descr', 'fortran_order', 'shape']": (),
    }
    for header, found in cases.items():
        (tmp_path / "h.npy").write_bytes(npy_bytes(header, data=b"\0" * 8))
        refused_npy(tmp_path / "h.npy", *found)
    assert not marker.exists()


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("{[1]: 2}", id="unhashable key: TypeError"),
        pytest.param("{" * 3000, id="unclosed brackets: tokenize.TokenError"),
        pytest.param("-" * 9000 + "1", id="nested too deep for the parser: MemoryError"),
    ],
)
def test_a_header_numpy_cannot_parse_is_always_a_token_file_error(tmp_path, header):
    (tmp_path / "h.npy").write_bytes(npy_bytes(header, data=b"\0" * 8))
    refused_npy(tmp_path / "h.npy")


# --- the dtype ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", ["<i8", "<f4", "|u1", "<u8", "<i2", "<i4", "<f2", "|b1", ">u2", ">u4"]
)
def test_a_dtype_other_than_little_endian_uint16_or_uint32_is_refused(tmp_path, dtype):
    np.save(tmp_path / "t.npy", np.arange(10).astype(dtype))
    refused_npy(tmp_path / "t.npy", repr(np.dtype(dtype).str))


def test_uint16_and_uint32_are_both_token_files(tmp_path):
    for dtype in (np.uint16, np.uint32):  # the documented difference: vocabularies past 65,536
        ds = nd.NpyTokensDataset(
            write_tokens(tmp_path / f"{dtype.__name__}.npy", np.arange(40, dtype=dtype)), 4
        )
        assert ds.dtype == dtype and ds[2][0].tolist() == [8, 9, 10, 11]


def test_structured_and_subarray_dtypes(tmp_path):
    np.save(tmp_path / "rec.npy", np.zeros(3, dtype=[("a", "<u2")]))
    refused_npy(tmp_path / "rec.npy", "'|V2'")  # a record of one uint16 field is no token array
    (tmp_path / "bad.npy").write_bytes(
        npy_bytes(header_for("'(-1,)u2'", shape="(3,)"), data=b"\0" * 6)
    )
    refused_npy(tmp_path / "bad.npy", "(-1,)u2")  # numpy's own ValueError, with the file named
    # A subarray dtype, '(2,)<u2', is no token dtype: numpy's header reader gives it as one
    # 4-byte item, refused before anything is mapped (numpy would map it as a (3, 2) array).
    ids = np.arange(6, dtype="<u2")
    (tmp_path / "sub.npy").write_bytes(
        npy_bytes(header_for("'(2,)<u2'", shape="(3,)"), data=ids.tobytes())
    )
    refused_npy(tmp_path / "sub.npy", "'|V4'")


# --- order, shape and the file's size -----------------------------------------------------------


def test_fortran_order_is_refused_where_it_changes_the_order_of_the_ids(tmp_path):
    np.save(tmp_path / "f2.npy", np.asfortranarray(np.arange(20, dtype=np.uint16).reshape(4, 5)))
    refused_npy(tmp_path / "f2.npy", "(4, 5)", "Fortran order")
    (tmp_path / "f0.npy").write_bytes(npy_bytes(header_for(fortran="0"), data=b"\0" * 8))
    refused_npy(tmp_path / "f0.npy", "fortran_order")  # only True or False
    # 1-D: Fortran and C order lay out the same bytes, so the file reads as written
    ids = np.arange(4, dtype="<u2")
    (tmp_path / "f1.npy").write_bytes(npy_bytes(header_for(fortran="True"), data=ids.tobytes()))
    assert nd.open_tokens(tmp_path / "f1.npy").tolist() == [0, 1, 2, 3]


def test_ids_must_be_one_or_two_dimensional(tmp_path):
    np.save(tmp_path / "scalar.npy", np.uint16(7))
    refused_npy(tmp_path / "scalar.npy", "shape ()")
    np.save(tmp_path / "cube.npy", np.arange(27, dtype=np.uint16).reshape(3, 3, 3))
    refused_npy(tmp_path / "cube.npy", "shape (3, 3, 3)")
    rows = write_tokens(tmp_path / "rows.npy", np.arange(30, dtype=np.uint16).reshape(3, 10))
    ds = nd.NpyTokensDataset(rows, 4)  # the documented difference: a row a sequence
    assert [ds[i][0][0].item() for i in range(len(ds))] == [0, 4, 10, 14, 20, 24]


def test_a_declared_shape_larger_than_the_data_is_refused_and_the_file_left_alone(tmp_path):
    path = tmp_path / "short.npy"
    raw = npy_bytes(header_for(shape="(1000000,)"), data=b"\0" * 228)
    path.write_bytes(raw)
    refused_npy(path)
    assert path.read_bytes() == raw  # mapped read-only: numpy's mode "r+" would have grown it


def test_trailing_bytes_are_refused_by_the_sidecars_size(tmp_path):
    path = write_tokens(tmp_path / "tail.npy", np.arange(6, dtype=np.uint16))
    size = path.stat().st_size
    raw = path.read_bytes()
    for extra in (b"\0", b"\0" * 14, raw):  # a stray byte, garbage, the file written twice
        path.write_bytes(raw + extra)
        refused_npy(path, "file_size", f"{size}", f"{size + len(extra)}")
    # Without a sidecar numpy maps the shape its header declares, and the rest is not read.
    nd.sidecar_path(path).unlink()
    assert nd.open_tokens(path).tolist() == list(range(6))


def test_negative_zero_and_overflowing_dimensions_are_refused(tmp_path):
    cases = {
        "(-5,)": (),
        "(3.0,)": (),
        "(True,)": ("shape (True,)",),  # a bool is an int to Python, not a dimension
        "(2**62,)": (),  # an expression, not a literal
        f"({2**62}, {2**62})": (),  # 2**125 bytes: numpy's size overflows
        "(0,)": ("shape (0,)",),
        "(0, 5)": ("shape (0, 5)",),
        "(5, 0)": ("shape (5, 0)",),
    }
    for shape, found in cases.items():
        (tmp_path / "d.npy").write_bytes(npy_bytes(header_for(shape=shape)))
        with np.errstate(over="ignore"):  # numpy's memmap multiplies the overflowing shape
            refused_npy(tmp_path / "d.npy", *found)


# --- numpy's reader under a fuzzer --------------------------------------------------------------

HEADER_PIECES = {
    "descr": [
        "'<u2'",
        "'<u4'",
        "'>u2'",
        "'|O'",
        "'<f8'",
        "'(2,)<u2'",
        "[('a', '<u2')]",
        "'M8[xyz]'",
        "'(-1,)u2'",
        "''",
        "None",
        "__import__('os')",
        "[]",
    ],
    "fortran": ["False", "False", "True", "0", "None", "'False'"],
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
        "((3,),)",
        "{1: 2}",
        "(1" + "0" * 5000 + ",)",
    ],
}


@st.composite
def npy_like_files(draw) -> bytes:
    """A .npy file built from good and bad header pieces, then maybe damaged byte by byte or cut
    short (one in five stays valid)."""
    clean = draw(st.integers(0, 4)) == 0
    pieces = HEADER_PIECES
    if clean or draw(st.booleans()):
        pieces = {key: values[:2] for key, values in HEADER_PIECES.items()}
    descr, fortran, shape = (draw(st.sampled_from(pieces[k])) for k in pieces)
    text = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}"
    if not clean:
        text = draw(
            st.sampled_from(
                [text] * 5
                + [
                    f"{{'descr': {descr}, 'shape': {shape}}}",
                    f"({descr}, {fortran}, {shape})",
                    draw(st.text(max_size=60)),
                ]
            )
        )
    text += " " * draw(st.integers(0, 70)) + "\n"
    version = draw(st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00"]))
    header = text.encode("utf8" if version == b"\x03\x00" else "latin1", errors="replace")
    try:
        size = int(np.prod(ast.literal_eval(shape))) * np.dtype(ast.literal_eval(descr)).itemsize
    except Exception:  # any piece that is not a size: a few bytes
        size = 8
    data = b"\0" * max(0, min(size, 4096) + (0 if clean else draw(st.sampled_from([0, -1, 2]))))
    raw = bytearray(npy_bytes(header, version, data))
    if clean:
        return bytes(raw)
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # damage past the magic
        raw[draw(st.integers(min(6, len(raw) - 1), len(raw) - 1))] = draw(st.integers(0, 255))
    if draw(st.integers(0, 3)) == 0:
        raw = raw[: draw(st.integers(0, len(raw)))]
    return bytes(raw)


def open_or_refusal(raw: bytes) -> str:
    """ "accepted", once the array is checked to be a token array, or the kind of refusal: the
    only error allowed is a TokenFileError naming the file, never advising allow_pickle."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.npy"
        path.write_bytes(raw)
        try:
            with np.errstate(over="ignore"):
                tokens = nd.open_tokens(path)
        except nd.TokenFileError as error:
            message = str(error)
            assert message.startswith(repr(str(path))) and "allow_pickle" not in message
            reason = message.split(": ")[-1]  # numpy's reason, or the module's own words
            return re.sub(r"'[^']*'|\d+|\(.*|\[.*|<.*", "", reason)[:30].strip()
        assert tokens.dtype in (np.dtype("<u2"), np.dtype("<u4")), tokens.dtype
        assert tokens.ndim in (1, 2) and tokens.size and tokens.flags.c_contiguous
        assert tokens.offset + tokens.nbytes <= len(raw)
        del tokens
        return "accepted"


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(raw=st.one_of(st.binary(max_size=200), npy_like_files()))
@example(raw=npy_bytes(header_for("'(-1,)u2'"), data=b"\0" * 8))  # numpy's ValueError, wrapped
@example(raw=npy_bytes(header_for(shape="(True,)"), data=b"\0" * 2))  # np.memmap's TypeError
def test_any_bytes_open_as_token_ids_or_raise_a_token_file_error(raw):
    open_or_refusal(raw)


def test_the_fuzzer_makes_valid_files_and_many_kinds_of_refusal():
    """The strategy is worth running: it produces valid files as well as each kind of refusal."""
    outcomes = Counter()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)  # the same each run
    @given(raw=npy_like_files())
    def sample(raw):
        outcomes[open_or_refusal(raw)] += 1

    sample()
    assert outcomes["accepted"] > 0 and len(outcomes) >= 8, outcomes
