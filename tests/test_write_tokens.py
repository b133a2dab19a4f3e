"""Writing token files with the module: write_tokens and sidecar_for refuse what a reader would
refuse, before a byte is written, and read the file's own facts from the file."""

import re

import numpy as np
import pytest

import npy_datasets as nd
from conftest import refused, write_tokens


def test_write_tokens_refuses_a_bad_sidecar_before_writing_a_byte(tmp_path):
    path = tmp_path / "b.npy"
    old = write_tokens(path, np.arange(100, dtype=np.uint16))  # an earlier, good output
    before = old.read_bytes()
    for fields, problem in [
        ({"eot_id": 0}, "field 'tokenizer' should be str, found None"),
        ({"tokenizer": "t", "eot_id": 600}, "eot_id 600, outside the vocabulary (n_vocab 500)"),
    ]:
        with pytest.raises(nd.TokenFileError, match=re.escape(problem)):
            nd.write_tokens(path, np.arange(300), n_vocab=500, **fields)
    with pytest.raises(nd.TokenFileError, match=r"max_token_id 599, outside the vocabulary"):
        nd.write_tokens(path, np.arange(600), n_vocab=500, tokenizer="t", eot_id=0)  # fits uint16
    assert path.read_bytes() == before and nd.read_sidecar(path)["n_tokens"] == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.npy", "b.npy.json"]  # no temp left


def test_raw_ids_that_spell_the_npy_magic_stay_raw_ids_under_a_bin_sidecar(tmp_path):
    ids = np.array([20115, 19797, 22864, 0, 1, *range(2, 60)], dtype=np.uint16)  # "\x93NUMPY\0..."
    path = write_tokens(tmp_path / "ids.bin", ids)
    assert path.read_bytes()[:6] == nd.NPY_MAGIC
    assert nd.open_tokens(path).tolist() == ids.tolist()
    plain = write_tokens(tmp_path / "plain.bin", np.arange(100, dtype=np.uint16))
    with pytest.raises(
        nd.TokenFileError, match="layout is 'npy' in the sidecar, 'bin' in the file"
    ):
        nd.sidecar_for(
            plain,
            layout="npy",
            dtype="uint16",
            tokenizer="t",
            n_vocab=100,
            eot_id=0,
            max_token_id=99,
        )


def test_a_cut_npy_preamble_and_an_unknown_argument_are_named_for_what_they_are(tmp_path):
    path = tmp_path / "cut.npy"
    path.write_bytes(nd.NPY_MAGIC[:3])
    refused(path, nd.TokenFileError, "has a truncated .npy preamble (3 bytes)")
    with pytest.raises(TypeError, match="no rule for the argument 'seqlen'"):
        nd.check_arguments(seqlen=3)


def test_sidecar_for_takes_the_writers_fields_only(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(100, dtype=np.uint16))
    fields = {"tokenizer": "t", "n_vocab": 100, "eot_id": 0, "max_token_id": 99}
    with pytest.raises(
        TypeError, match=r"sidecar_for reads \['n_tokens', 'sha256'\] from the file"
    ):
        nd.sidecar_for(path, layout="npy", dtype="uint16", n_tokens=999, sha256="0" * 64, **fields)
    meta = nd.sidecar_for(path, layout="npy", dtype="uint16", **fields)
    assert meta["n_tokens"] == 100 and meta["eot_placement"] == "prepend"


def test_two_d_ids_keep_their_rows_in_a_npy_and_are_refused_for_a_bin(tmp_path):
    rows = np.arange(40).reshape(4, 10)
    npy = tmp_path / "rows.npy"
    nd.write_tokens(npy, rows, n_vocab=50, tokenizer="t", eot_id=0)
    assert nd.open_tokens(npy).shape == (4, 10)
    ds = nd.NpyTokensDataset(npy, seq_len=4)  # windows stay inside a row: 2 a row
    assert len(ds) == 8 and ds[2][0].tolist() == [10, 11, 12, 13]
    with pytest.raises(ValueError, match=r"2-D ids \(4, 10\) cannot be written as \.bin"):
        nd.write_tokens(tmp_path / "rows.bin", rows, n_vocab=50, tokenizer="t", eot_id=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.npy", "rows.npy.json"]
