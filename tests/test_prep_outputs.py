"""What prepare_tokens.py writes: .npy, .bin and llm.c layouts, headers, sidecars, the ids it
refuses, the output folder, names, links and modes, and the command line's output.

Catalogue items 29, 31, 64, 71, 75, 76, 80, 82 and 87 (tests/bad_inputs.md).
"""

import ast
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import datasets
import numpy as np
import pytest
import tiktoken

import npy_datasets as nd
import prepare_tokens as pt
from conftest import (
    DOCS,
    EOT,
    MANY,
    NO_NETWORK,
    ROOT,
    SAMPLE,
    STORIES,
    decoded,
    make_dataset,
    prep_input,
    prepare,
    prepare_on_one_thread,
    reference_tokens,
    text_split,
)
from npy_datasets import PROBE_BYTES, open_tokens, read_sidecar
from prep_outputs import sidecar_path

NPY_HEADER_BYTES = 128  # write_tokens' .npy header: numpy pads it to 128 bytes for any shape

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")


# --- layouts and headers ------------------------------------------------------------------------


def test_npy_is_a_real_npy_with_a_64_byte_aligned_header(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    prepare(data, tmp_path / "out")
    path = tmp_path / "out" / "train.npy"
    loaded, mapped = np.load(path), np.load(path, mmap_mode="r")
    np.testing.assert_array_equal(loaded, mapped)
    with open(path, "rb") as f:
        assert np.lib.format.read_magic(f) == (1, 0)
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        offset = f.tell()
    assert (shape, fortran, dtype) == (loaded.shape, False, np.dtype(np.uint16))
    assert offset % 64 == 0 and offset == NPY_HEADER_BYTES
    assert mapped.offset == offset and path.stat().st_size == offset + 2 * loaded.size


def test_bin_layout_is_the_npy_data_without_header(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    prepare(data, tmp_path / "npy")
    results = prepare(data, tmp_path / "bin", layout="bin")
    npy_bytes = (tmp_path / "npy" / "train.npy").read_bytes()
    bin_path = tmp_path / "bin" / "train.bin"
    assert bin_path.read_bytes() == npy_bytes[NPY_HEADER_BYTES:]
    meta = results["train"].meta
    assert (meta["layout"], meta["file"], meta["dtype"]) == ("bin", "train.bin", "uint16")
    assert sidecar_path(bin_path).name == "train.bin.json"
    np.testing.assert_array_equal(
        open_tokens(bin_path, verify=True), np.load(tmp_path / "npy" / "train.npy")
    )


def test_eot_append_writes_nanogpts_bin_byte_for_byte_and_prepend_stays_the_default(tmp_path, enc):
    val = ["A short validation story.", "Another one, with a comma."]
    stories = [text for text in DOCS if text]  # nanoGPT would write "" as an EOT alone: not here
    data = make_dataset(tmp_path / "in", stories, val)
    nanogpt = {}
    for split, texts in (("train", stories), ("validation", val)):
        ids = []
        for text in texts:  # nanoGPT's data/openwebtext/prepare.py: ids = enc.encode_ordinary(text); ids.append(eot)
            ids += [*enc.encode_ordinary(text), enc.eot_token]
        nanogpt[split] = np.array(
            ids, dtype=np.uint16
        ).tobytes()  # then written as a raw uint16 memmap
    assert (
        pt.main(
            [
                "--dataset",
                str(data),
                "--out",
                str(tmp_path / "cli"),
                "--layout",
                "bin",
                "--eot-placement",
                "append",
            ]
        )
        == 0
    )
    results = prepare(data, tmp_path / "out", layout="bin", eot_placement="append")
    for split, texts in (("train", stories), ("validation", val)):
        assert (
            (tmp_path / "cli" / f"{split}.bin").read_bytes()
            == nanogpt[split]
            == (tmp_path / "out" / f"{split}.bin").read_bytes()
        )
        assert (
            results[split].meta["eot_placement"]
            == read_sidecar(tmp_path / "out" / f"{split}.bin")["eot_placement"]
            == "append"
        )
        assert results[split].meta["n_docs"] == len(texts)
    again = prepare(data, tmp_path / "out", layout="bin")[
        "train"
    ]  # the default, prepend: the placement is a setting
    assert again.written and again.meta["eot_placement"] == "prepend"
    assert (tmp_path / "out" / "train.bin").read_bytes() == reference_tokens(stories, enc).tobytes()
    with pytest.raises(
        ValueError, match=r"eot_placement must be one of \('prepend', 'append'\), got 'after'"
    ):
        pt.prepare(data, tmp_path / "x", eot_placement="after")


def llmc_shard(path: Path) -> np.ndarray:
    """Read a shard by llm.c's layout, by hand: 256 int32 words (magic, version, token count, zeros), then the ids."""
    header = np.fromfile(path, dtype="<i4", count=256)
    magic, version, count = header[:3].tolist()
    dtype = {(20240520, 1): np.uint16, (20240801, 7): np.uint32}[magic, version]
    tokens = np.fromfile(path, dtype=dtype, offset=256 * 4)
    assert (
        len(tokens) == count
        and not header[3:].any()
        and path.stat().st_size == 1024 + count * np.dtype(dtype).itemsize
    )
    return tokens


def test_llmc_shards_have_llmcs_header_and_hold_the_npy_tokens(tmp_path, enc):
    data = make_dataset(tmp_path / "in", MANY, MANY[:5])
    prepare(data, tmp_path / "npy")
    assert (
        pt.main(
            [
                "--dataset",
                str(data),
                "--out",
                str(tmp_path / "llmc"),
                "--layout",
                "llmc",
                "--shard-tokens",
                "100",
            ]
        )
        == 0
    )
    for split in ("train", "validation"):
        shards = sorted((tmp_path / "llmc").glob(f"{split}_*.bin"))
        assert len(shards) > 1 and [len(llmc_shard(p)) for p in shards][:-1] == [100] * (
            len(shards) - 1
        )
        assert np.array_equal(
            np.concatenate([llmc_shard(p) for p in shards]),
            np.load(tmp_path / "npy" / f"{split}.npy"),
        )
        for path in shards:  # the loader reads them by their header, and the sidecar agrees
            assert open_tokens(path, verify=True).tolist() == llmc_shard(path).tolist()
            assert read_sidecar(path)["layout"] == "llmc" and llmc_shard(path).dtype == np.uint16
    wide = tiktoken.Encoding(
        "gpt2_wide_eot",
        pat_str=enc._pat_str,
        mergeable_ranks=enc._mergeable_ranks,
        special_tokens={"<|endoftext|>": 70_000},
    )  # over 65,536 ids: uint32, magic 20240801
    split = pt.TextSplit(
        "train",
        datasets.Dataset.from_dict({"text": DOCS}),
        "text",
        {"dataset": "inline", "split": "train"},
    )
    result = pt.prepare_split(split, tmp_path / "wide", wide, layout="llmc", progress=False)
    assert result.path.name == "train.bin" and np.fromfile(
        result.path, dtype="<i4", count=2
    ).tolist() == [20240801, 7]
    expected = [i for text in DOCS if text for i in (70_000, *enc.encode_ordinary(text))]
    assert llmc_shard(result.path).tolist() == expected == open_tokens(result.path).tolist()


def test_sidecar_fields_describe_the_file(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    prepare(data, tmp_path / "out")
    path = tmp_path / "out" / "train.npy"
    side = sidecar_path(path)
    meta = json.loads(side.read_text())
    assert side.read_text() == json.dumps(meta, sort_keys=True, indent=2) + "\n"
    tokens = np.load(path)
    expected = {
        "format": "npy-tokens",
        "format_version": 1,
        "file": "train.npy",
        "layout": "npy",
        "dtype": "uint16",
        "shape": [tokens.size],
        "n_tokens": tokens.size,
        "file_size": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "probe_sha256": probe(path),
        "tokenizer": "tiktoken:gpt2",
        "n_vocab": 50257,
        "eot_id": EOT,
        "eot_placement": "prepend",
        "max_token_id": int(tokens.max()),
        "n_docs": len(DOCS) - 1,  # DOCS holds one empty document: skipped
        "created_by": "prepare_tokens.py",
    }
    assert {k: meta[k] for k in expected} == expected
    assert sorted(meta) == sorted([*expected, "settings_fingerprint", "source"])  # nothing else
    source = meta["source"]
    assert source["dataset"] == str(data)
    assert (source["split"], source["from_split"], source["column"]) == ("train", "train", "text")
    assert "val_fraction" not in source and "seed" not in source
    train_sha = hashlib.sha256((data / "train.jsonl").read_bytes()).hexdigest()
    assert source["input_fingerprint"] == "sha256:" + hashlib.sha256(train_sha.encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", meta["settings_fingerprint"])
    assert read_sidecar(path) == meta
    assert open_tokens(path, verify=True).shape == tokens.shape


def probe(path: Path) -> str:
    """The sidecar's probe_sha256: sha256 of a file's first and last 64 KiB (all of a smaller one)."""
    data = path.read_bytes()
    tail = data[max(PROBE_BYTES, len(data) - PROBE_BYTES) :]
    return hashlib.sha256(data[:PROBE_BYTES] + tail).hexdigest()


# --- the ids it refuses -------------------------------------------------------------------------


def test_id_that_does_not_fit_the_dtype_raises_instead_of_wrapping(tmp_path, monkeypatch):
    assert np.array([70000]).astype(np.uint16)[0] == 4464  # what a bare cast would silently write
    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    prepare(data, out, splits=["train"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def a_bad_id(*args, **kwargs):
        yield np.array([EOT, 1, 2], dtype=np.uint32)
        yield np.array([EOT, 70000], dtype=np.uint32)  # past GPT-2's 50,257 ids, and uint16's

    monkeypatch.setattr(pt, "tokenize_documents", a_bad_id)
    for shard_tokens in (None, 2):  # one file, or the third shard
        with pytest.raises(ValueError, match=r"token id 70000 is "):
            prepare(data, out, splits=["train"], force=True, shard_tokens=shard_tokens)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no staging folder left


def test_prep_streams_and_never_preallocates():
    names = set()
    for path in [ROOT / "python_files" / "prepare_tokens.py", *ROOT.glob("python_files/prep_*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names |= {
            getattr(n, "attr", getattr(n, "id", None))
            for n in ast.walk(tree)
            if isinstance(n, (ast.Attribute, ast.Name))
        }
    assert "write_tokens" in names  # the files were read
    # a sparse or preallocated memmap turns a full disk into SIGBUS; streaming writes turn it into OSError
    assert not names & {
        "memmap",
        "open_memmap",
        "truncate",
        "ftruncate",
        "posix_fallocate",
        "fallocate",
        "mmap",
    }


# --- the output folder, names, links and modes --------------------------------------------------


def test_output_folder_checks(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(
        ValueError,
        match=re.escape(f"cannot create output folder {str(a_file)!r}: {str(a_file)!r} is a file"),
    ):
        prepare(data, a_file)
    with pytest.raises(ValueError, match="is a file"):
        prepare(data, a_file / "sub")
    for inside in (data, data / "tokens"):
        with pytest.raises(ValueError, match="inside the input dataset"):
            prepare(data, inside)
    assert sorted(p.name for p in data.iterdir()) == ["train.jsonl", "validation.jsonl"]


def test_a_dangling_out_link_fails_before_the_dataset_loads(tmp_path, monkeypatch):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    monkeypatch.setattr(
        pt, "load_text_splits", lambda *a, **k: pytest.fail("the dataset was loaded")
    )
    for out, named in (
        (tmp_path / "link", "link"),
        (tmp_path / "link2" / "sub", "link2"),
    ):  # the folder, or a parent
        (tmp_path / named).symlink_to(tmp_path / "missing" / "target")
        with pytest.raises(
            ValueError,
            match=rf"{re.escape(str(tmp_path / named))}' is a link to .*missing/target.*"
            "which does not exist",
        ):
            prepare(data, out)
        with pytest.raises(
            SystemExit, match="which does not exist"
        ):  # the CLI: one line, exit status 1
            pt.main(["--dataset", str(data), "--out", str(out)])
        assert not (tmp_path / "missing").exists()


def test_unwritable_output_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    prefix = []
    if os.geteuid() == 0:  # root passes every permission check unless it gives up CAP_DAC_OVERRIDE
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permission bits cannot be enforced")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    code = (
        "import sys; sys.path.insert(0, 'python_files'); import prepare_tokens as pt\n"
        "pt.load_text_splits = pt.tokenize_documents = pt.tiktoken = None  # reaching any of them fails\n"
        "pt.prepare(None, sys.argv[1], progress=False)\n"
    )
    out = locked / "out" / "deeper"
    locked.chmod(0o555)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        locked.chmod(0o755)
    expected = (
        f"ValueError: cannot write to output folder {str(out)!r}: {str(locked)!r} is not writable"
    )
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr[-2000:]
    assert list(locked.iterdir()) == []


def test_names_cannot_leave_the_output_folder(tmp_path):
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    out = tmp_path / "a" / "out"
    for bad in [
        "../escaped",
        "../../escaped",
        "/tmp/escaped",
        "C:\\escaped",
        "a\x00b",
        "~",
        ".hidden",
        "a/b",
    ]:
        with pytest.raises(
            ValueError, match=re.escape(f"split name {bad!r} cannot be a file name")
        ):
            pt.prepare_split(text_split(bad, ["text"]), out, enc, num_threads=1, progress=False)
        with pytest.raises(
            ValueError, match=re.escape(f"split name {bad!r}")
        ):  # before loading the missing dataset
            pt.prepare(tmp_path / "missing", out, splits=["train", bad], progress=False)
    assert list(tmp_path.rglob("*")) == []  # not even the output folder was created
    for name in [
        "owner/..",
        "../../etc",
        "x/.",
        "..",
        "C:\\data",
        "~/x",
    ]:  # names used for the default folder
        folder = pt._default_out_dir(name, None)
        assert (
            folder.parent == pt.REPO_ROOT / "data"
            and folder.name not in ("", ".", "..")
            and "/" not in folder.name
        )


def test_planted_symlinks(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    data, out = prep_input(tmp_path / "in", STORIES[:6], STORIES[6:8]), tmp_path / "out"
    out.mkdir()
    for name in ("train.npy", "train.npy.json"):
        (out / name).symlink_to(victim)
    prepare_on_one_thread(data, out, splits=["train"])
    assert victim.read_text() == "precious"
    assert not (out / "train.npy").is_symlink() and not (out / "train.npy.json").is_symlink()
    assert nd.open_tokens(out / "train.npy", verify=True).size > 0
    # A link planted at the next staging folder's name: mkdir refuses it, and a fresh name is drawn.
    real_token_hex = secrets.token_hex
    drawn = iter(["deadbeef"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(drawn, None) or real_token_hex(n))
    planted = out / f".prepare_tokens.tmp.{os.getpid()}.deadbeef.train"
    victim_folder = tmp_path / "victim_folder"
    victim_folder.mkdir()
    planted.symlink_to(victim_folder)
    assert prepare_on_one_thread(data, out, splits=["train"], layout="bin")["train"].written
    assert next(drawn, None) is None  # the planted name was drawn first
    assert list(victim_folder.iterdir()) == [] and planted.is_symlink()
    assert nd.open_tokens(out / "train.bin", verify=True).size > 0


def test_output_modes_follow_the_umask(tmp_path):
    data = prep_input(tmp_path / "in", STORIES[:6], STORIES[6:8])
    for mask, mode in [(0o022, 0o644), (0o077, 0o600)]:
        out = tmp_path / f"out_{mask:o}"
        previous = os.umask(mask)
        try:
            prepare_on_one_thread(data, out, splits=["train"])
        finally:
            os.umask(previous)
        assert {
            name: stat.S_IMODE((out / name).stat().st_mode)
            for name in ("train.npy", "train.npy.json")
        } == {"train.npy": mode, "train.npy.json": mode}


# --- end to end on the bundled sample -----------------------------------------------------------


def test_cli_end_to_end_on_bundled_sample(tmp_path, enc):
    # Not skipped when the sample is missing: the repository promises it.
    for split in ("train", "validation"):
        assert (SAMPLE / f"{split}.jsonl").is_file(), (
            f"bundled sample missing: {SAMPLE / f'{split}.jsonl'}"
        )
    foreign = (
        tmp_path / "their_tiktoken_cache"
    )  # a user's own TIKTOKEN_CACHE_DIR, without GPT-2, and no network
    foreign.mkdir()
    env = dict(
        os.environ,
        HF_DATASETS_CACHE=str(tmp_path / "hf_datasets"),
        TIKTOKEN_CACHE_DIR=str(foreign),
        **NO_NETWORK,
    )
    command = [sys.executable, "python_files/prepare_tokens.py", "--out", str(tmp_path)]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2
    for line, split in zip(lines, ("train", "validation")):
        rows = (SAMPLE / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        texts = [json.loads(row)["text"] for row in rows]
        path = (tmp_path / f"{split}.npy").resolve()
        tokens = open_tokens(path, verify=True)
        assert (
            line
            == f"{split}: {len(texts):,} docs, {tokens.size:,} tokens, uint16 -> {path} (written)"
        )
        assert decoded(tmp_path / f"{split}.npy", enc) == texts
        np.testing.assert_array_equal(
            tokens, reference_tokens(texts, enc)
        )  # the ids tiktoken's own gpt2 gives
        assert (
            read_sidecar(tmp_path / f"{split}.npy")["source"]["dataset"]
            == "materials/tinystories_sample"
        )
    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert [line.endswith("(up to date)") for line in rerun.stdout.splitlines()] == [True, True]


def test_a_shard_glob_matches_only_its_own_folder(tmp_path):
    from npy_datasets import NpyTokensDataset

    data = make_dataset(tmp_path / "in", MANY, ["v"])
    mine = prepare(data, tmp_path / "run[1]", splits=["train"], shard_tokens=300)["train"]
    other = prepare(data, tmp_path / "run1", splits=["train"], shard_tokens=700)["train"]
    assert len(mine.shards) != len(other.shards)  # run[1] as a pattern would match run1
    dataset = NpyTokensDataset(str(mine.path), 8)  # the glob as returned and printed
    assert [f.path for f in dataset.files] == [str(p) for p in mine.shards]
    assert str(mine.path).endswith(f"run[[]1]/train_{'[0-9]' * 6}.npy")
    assert "run[[]1]/train_[0-9]" in mine.summary()


def test_an_up_to_date_rerun_into_a_read_only_folder_writes_nothing(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, ["v"]), tmp_path / "out"
    prepare(data, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    prefix = []
    if os.geteuid() == 0:  # root passes every permission check unless it gives up CAP_DAC_OVERRIDE
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permission bits cannot be enforced")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    command = [sys.executable, "python_files/prepare_tokens.py", "--dataset", str(data)]
    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / "hf"), **NO_NETWORK)
    out.chmod(0o555)
    try:
        kept = subprocess.run(
            [*prefix, *command, "--out", str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        rebuild = subprocess.run(
            [*prefix, *command, "--out", str(out), "--shard-tokens", "100"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        out.chmod(0o755)
    assert kept.returncode == 0, kept.stderr[-2000:]
    assert [line.endswith("(up to date)") for line in kept.stdout.splitlines()] == [True, True]
    assert rebuild.returncode == 1 and "Traceback" not in rebuild.stderr
    assert f"cannot write to output folder {str(out)!r}" in rebuild.stderr, rebuild.stderr
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
