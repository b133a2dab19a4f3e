"""Tests for python_files/prepare_tokens.py: tiny local fixtures, no network, a few seconds in all."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "python_files") not in sys.path:
    sys.path.insert(0, str(ROOT / "python_files"))

import datasets  # noqa: E402 (imported after the sys.path line above)
import tiktoken  # noqa: E402 (imported after the sys.path line above)
import tiktoken_ext.openai_public  # noqa: E402 (imported after the sys.path line above)

import prepare_tokens as pt  # noqa: E402 (imported after the sys.path line above)
from npy_datasets import (  # noqa: E402 (imported after the sys.path line above)
    TokenFileError,
    open_tokens,
    probe_sha256,
    read_npy_header,
    read_sidecar,
    sidecar_path,
)

SAMPLE = ROOT / "materials" / "tinystories_sample"
TIKTOKEN_CACHE = ROOT / "materials" / "tiktoken_cache"
NO_NETWORK = {
    k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
}  # port 9: refused
EOT = 50256
DOCS = [
    "Once upon a time, there was a little cat named Tom.",
    "Zoë said: \u201cHello!\u201d \u2014 and José smiled at her.",
    "",
    "  leading and trailing spaces  ",
    "Line one.\nLine two.\n\nLine four.",
    'Tom typed "<|endoftext|>" into the story and laughed.',
    "emoji 🐱 and 中文 text",
]
MANY = [f"Story {i}: " + "The dog ran to the park. " * (i % 6) + f"The end {i}." for i in range(60)]


@pytest.fixture(scope="session", autouse=True)
def isolated_datasets_cache(tmp_path_factory):
    """Keep datasets' Arrow copies of the fixtures out of the user's ~/.cache/huggingface."""
    saved = datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = str(tmp_path_factory.mktemp("hf_datasets_cache"))
    yield datasets.config.HF_DATASETS_CACHE
    datasets.config.HF_DATASETS_CACHE = saved


@pytest.fixture(scope="session")
def enc():
    """tiktoken's own GPT-2, as tiktoken_ext.openai_public builds it from its cache: the reference prep must match."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
        for name, value in NO_NETWORK.items():
            patch.setenv(name, value)
        return tiktoken.Encoding(**tiktoken_ext.openai_public.gpt2())


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def make_dataset(folder: Path, train: list[str], validation: list[str] | None = None) -> Path:
    """A folder with train.jsonl (and validation.jsonl), TinyStories schema."""
    write_jsonl(folder / "train.jsonl", [{"text": t} for t in train])
    if validation is not None:
        write_jsonl(folder / "validation.jsonl", [{"text": t} for t in validation])
    return folder


def documents(tokens: np.ndarray) -> list[np.ndarray]:
    """Cut a token file at its EOTs: each document is the ids after one EOT, up to the next."""
    starts = np.flatnonzero(tokens == EOT)
    assert starts.size and starts[0] == 0, "a token file must start with EOT"
    ends = [*starts[1:], len(tokens)]
    return [tokens[a + 1 : b] for a, b in zip(starts, ends)]


def decoded(path: Path, enc) -> list[str]:
    return [enc.decode(doc.tolist()) for doc in documents(np.load(path))]


def reference_tokens(texts: list[str], enc) -> np.ndarray:
    """The expected file content, computed the slow obvious way."""
    ids = []
    for text in texts:
        ids += [EOT, *enc.encode_ordinary(text)]
    return np.array(ids, dtype=np.uint16)


def temp_files(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if ".tmp." in p.name]


def prepare(dataset, out, **kwargs):
    kwargs.setdefault("progress", False)
    return {r.split: r for r in pt.prepare(dataset, out, **kwargs)}


# --- round trip and encoding -------------------------------------------------------------------


def test_round_trip_decodes_every_document_exactly(tmp_path, enc):
    val = ["A short validation story.", "Another one, with a comma."]
    data = make_dataset(tmp_path / "in", DOCS, val)
    results = prepare(data, tmp_path / "out")
    assert set(results) == {"train", "validation"}
    for split, texts in (("train", DOCS), ("validation", val)):
        tokens = np.load(tmp_path / "out" / f"{split}.npy")
        assert tokens.dtype == np.uint16
        assert tokens[0] == EOT
        assert np.count_nonzero(tokens == EOT) == len(texts) == results[split].meta["n_docs"]
        assert decoded(tmp_path / "out" / f"{split}.npy", enc) == texts
        np.testing.assert_array_equal(tokens, reference_tokens(texts, enc))


def test_literal_endoftext_in_text_is_ordinary_text(tmp_path, enc):
    text = 'She wrote "<|endoftext|>" on the board.'
    data = make_dataset(tmp_path / "in", [text, "next"], ["v"])
    prepare(data, tmp_path / "out")
    tokens = np.load(tmp_path / "out" / "train.npy")
    first = documents(tokens)[0]
    assert EOT not in first.tolist()
    assert first.tolist() == enc.encode_ordinary(text)
    assert enc.decode(first.tolist()) == text
    assert np.count_nonzero(tokens == EOT) == 2


def test_tokenize_documents_yields_ordered_chunks(enc):
    chunks = list(pt.tokenize_documents(MANY, enc, num_threads=2, chunk_docs=3))
    assert len(chunks) == 20  # 60 documents, 3 per chunk
    assert all(np.count_nonzero(c == EOT) == 3 and c[0] == EOT for c in chunks)
    np.testing.assert_array_equal(np.concatenate(chunks), reference_tokens(MANY, enc))


def test_gpt2_encoding_is_tiktokens_gpt2_from_the_bundled_files(enc):
    ours = pt.gpt2_encoding()
    assert (ours.name, ours.n_vocab, ours.eot_token, ours.max_token_value) == (
        "gpt2",
        50257,
        EOT,
        50256,
    )
    texts = [
        *DOCS,
        *MANY,
        *(
            json.loads(row)["text"]
            for row in (SAMPLE / "validation.jsonl").read_text().splitlines()
        ),
    ]
    assert [ours.encode_ordinary(t) for t in texts] == [enc.encode_ordinary(t) for t in texts]
    assert ours.encode("<|endoftext|>", allowed_special="all") == [EOT]


def test_gpt2_encoding_ignores_a_foreign_tiktoken_cache_offline(tmp_path, enc):
    foreign = tmp_path / "their_cache"  # a user's or an image's TIKTOKEN_CACHE_DIR, without GPT-2
    foreign.mkdir()
    blocked = tmp_path / "a_file"  # a cache folder that cannot be created (read-only, as root too)
    blocked.write_text("x")
    code = (
        "import json, sys; sys.path.insert(0, 'python_files'); import prepare_tokens as pt\n"
        "print(json.dumps([pt.gpt2_encoding().encode_ordinary(t) for t in json.loads(sys.argv[1])]))"
    )
    for cache in (foreign, blocked / "cache"):
        env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(cache), **NO_NETWORK)
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(DOCS)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout) == [enc.encode_ordinary(t) for t in DOCS]
    assert list(foreign.iterdir()) == []  # nothing copied into someone else's cache


def test_gpt2_encoding_refuses_a_file_whose_sha256_differs(tmp_path):
    import shutil

    shutil.copytree(TIKTOKEN_CACHE, tmp_path / "files")
    encoder = tmp_path / "files" / "6c7ea1a7e38e3a7f062df639a5b80947f075ffe6"  # encoder.json
    raw = bytearray(encoder.read_bytes())
    raw[-10] ^= 0x01  # one digit of one rank
    encoder.write_bytes(raw)
    with pytest.raises(ValueError, match="sha256 differs from GPT-2's encoder.json"):
        pt.gpt2_encoding(tmp_path / "files")
    assert encoder.read_bytes() == raw  # refused, and left for the user to look at
    assert pt.TIKTOKEN_FILES == TIKTOKEN_CACHE and pt.gpt2_encoding(TIKTOKEN_CACHE).n_vocab == 50257


def test_texts_come_in_dataset_order_and_local_files_are_streamed(tmp_path):
    whole = pt.load_text_splits(make_dataset(tmp_path / "in", MANY, MANY[:3]))["train"]
    carved = pt.load_text_splits(
        make_dataset(tmp_path / "in2", MANY), val_fraction=0.25
    )  # sorted, scattered rows
    assert callable(whole.documents) and not isinstance(
        whole.documents, datasets.Dataset
    )  # the file itself, streamed
    assert list(pt._iter_texts(whole)) == MANY
    rows = {name: carved[name].rows for name in ("train", "validation")}
    assert (len(rows["train"]), len(rows["validation"])) == (45, 15)
    assert sorted([*rows["train"], *rows["validation"]]) == list(range(60))
    for name in ("train", "validation"):
        assert np.all(np.diff(rows[name]) > 0)
        assert list(pt._iter_texts(carved[name])) == [MANY[i] for i in rows[name]]
    in_memory = datasets.Dataset.from_dict(
        {"text": MANY}
    )  # a Dataset (save_to_disk, the Hub), in its own order
    for docs in (
        in_memory,
        in_memory.shuffle(seed=0),
        in_memory.select(range(5, 50)),
        in_memory.select([3, 3, 1]),
    ):
        split = pt.TextSplit("train", docs, "text", {"dataset": "inline", "split": "train"})
        assert list(pt._iter_texts(split)) == list(docs["text"])
    picked = pt.TextSplit(
        "train",
        in_memory.select([0, 1]),
        "text",
        {"dataset": "inline", "split": "train"},
        np.array([1]),
    )
    assert list(pt._iter_texts(picked)) == [MANY[1]]


def test_a_rewritten_input_is_tokenized_again_never_served_from_a_cache(tmp_path, enc):
    old, new = (
        [f"old story {i}" for i in range(20)],
        [f"new story {i}" for i in range(20)],
    )  # the same sizes
    data, out = make_dataset(tmp_path / "in", old, ["v"]), tmp_path / "out"
    first = prepare(data, out)["train"]
    train = data / "train.jsonl"
    stat = train.stat()
    write_jsonl(train, [{"text": t} for t in new])
    os.utime(
        train, ns=(stat.st_atime_ns, stat.st_mtime_ns)
    )  # same size, same mtime: only the bytes differ
    assert train.stat().st_size == stat.st_size and train.stat().st_mtime_ns == stat.st_mtime_ns
    again = prepare(data, out)["train"]
    assert (
        again.written
        and again.meta["source"]["input_fingerprint"] != first.meta["source"]["input_fingerprint"]
    )
    assert (
        decoded(out / "train.npy", enc) == new
    )  # the sidecar vouches for the text that was tokenized
    assert not prepare(data, out)["train"].written


def test_bytes_do_not_depend_on_threads_or_chunk_size(tmp_path):
    data = make_dataset(tmp_path / "in", MANY, MANY[:9])
    seen = set()
    for threads, chunk in [(1, 1024), (2, 7), (1, 1), (2, 1)]:
        out = tmp_path / f"out_{threads}_{chunk}"
        results = prepare(data, out, num_threads=threads, chunk_docs=chunk)
        meta = results["train"].meta
        seen.add(((out / "train.npy").read_bytes(), meta["sha256"], meta["settings_fingerprint"]))
    assert len(seen) == 1


# --- file format --------------------------------------------------------------------------------


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
    assert offset % 64 == 0 and offset == pt.NPY_HEADER_SIZE
    assert read_npy_header(path) == (np.dtype("<u2"), loaded.shape, offset)


@pytest.mark.parametrize("n_tokens", [0, 1, 123_456_789, 2**63 - 1])
def test_npy_header_has_the_same_length_for_any_count(n_tokens):
    header = pt.npy_header(np.uint32, n_tokens)
    assert len(header) == pt.NPY_HEADER_SIZE
    f = io.BytesIO(header)
    assert np.lib.format.read_magic(f) == (1, 0)
    assert np.lib.format.read_array_header_1_0(f) == ((n_tokens,), False, np.dtype("<u4"))


def test_bin_layout_is_the_npy_data_without_header(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    prepare(data, tmp_path / "npy")
    results = prepare(data, tmp_path / "bin", layout="bin")
    npy_bytes = (tmp_path / "npy" / "train.npy").read_bytes()
    bin_path = tmp_path / "bin" / "train.bin"
    assert bin_path.read_bytes() == npy_bytes[pt.NPY_HEADER_SIZE :]
    meta = results["train"].meta
    assert (meta["layout"], meta["file"], meta["dtype"]) == ("bin", "train.bin", "uint16")
    assert sidecar_path(bin_path).name == "train.bin.json"
    np.testing.assert_array_equal(
        open_tokens(bin_path, verify=True), np.load(tmp_path / "npy" / "train.npy")
    )


def test_eot_append_writes_nanogpts_bin_byte_for_byte_and_prepend_stays_the_default(tmp_path, enc):
    val = ["A short validation story.", "Another one, with a comma."]
    data = make_dataset(tmp_path / "in", DOCS, val)
    nanogpt = {}
    for split, texts in (("train", DOCS), ("validation", val)):
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
                "--format",
                "bin",
                "--eot",
                "append",
            ]
        )
        == 0
    )
    results = prepare(data, tmp_path / "out", layout="bin", eot_placement="append")
    for split, texts in (("train", DOCS), ("validation", val)):
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
    assert (tmp_path / "out" / "train.bin").read_bytes() == reference_tokens(DOCS, enc).tobytes()
    with pytest.raises(
        ValueError, match=r"eot_placement must be one of \('prepend', 'append'\), got 'after'"
    ):
        pt.prepare(data, tmp_path / "x", eot_placement="after")


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
        "probe_sha256": probe_sha256(path),
        "tokenizer": "tiktoken:gpt2",
        "n_vocab": 50257,
        "eot_id": EOT,
        "eot_placement": "prepend",
        "max_token_id": int(tokens.max()),
        "n_docs": len(DOCS),
        "created_by": "prepare_tokens.py",
    }
    assert {k: meta[k] for k in expected} == expected
    source = meta["source"]
    assert source["dataset"] == str(data)
    assert (source["split"], source["from_split"], source["column"]) == ("train", "train", "text")
    assert "val_fraction" not in source and "seed" not in source
    train_sha = hashlib.sha256((data / "train.jsonl").read_bytes()).hexdigest()
    assert source["input_fingerprint"] == "sha256:" + hashlib.sha256(train_sha.encode()).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", meta["settings_fingerprint"])
    assert read_sidecar(path) == meta
    assert open_tokens(path, verify=True).shape == tokens.shape


# --- reruns --------------------------------------------------------------------------------------


def test_rerun_skips_and_changed_settings_rebuild(tmp_path):
    rows = [{"text": t, "story": t.upper()} for t in MANY[:20]]
    write_jsonl(tmp_path / "in" / "train.jsonl", rows)
    write_jsonl(tmp_path / "in" / "validation.jsonl", rows[:3])
    data, out = tmp_path / "in", tmp_path / "out"
    train, side = out / "train.npy", out / "train.npy.json"

    assert all(r.written for r in prepare(data, out).values())
    stamps = (train.stat().st_mtime_ns, side.stat().st_mtime_ns)
    time.sleep(0.01)
    again = prepare(data, out, num_threads=1, chunk_docs=3)  # neither changes the bytes
    assert not any(r.written for r in again.values())
    assert "(up to date)" in again["train"].summary()
    assert (train.stat().st_mtime_ns, side.stat().st_mtime_ns) == stamps

    before = train.read_bytes()
    by_story = prepare(data, out, column="story")
    assert by_story["train"].written and train.read_bytes() != before
    assert prepare(data, out, column="story")["train"].written is False
    assert prepare(data, out, column="story", force=True)["train"].written

    assert prepare(data, out, column="story", layout="bin")["train"].written
    assert (out / "train.bin").is_file() and (out / "train.bin.json").is_file()

    with open(train, "ab") as f:  # damaged file: its size no longer matches the sidecar
        f.write(b"\0\0")
    assert prepare(data, out, column="story")["train"].written
    assert open_tokens(train, verify=True).size == read_sidecar(train)["n_tokens"]


@pytest.mark.parametrize("layout", ["npy", "bin"])
def test_shards_hold_exactly_shard_tokens_and_concatenate_to_the_one_file(tmp_path, enc, layout):
    from npy_datasets import NpyTokensDataset

    data = make_dataset(tmp_path / "in", MANY, MANY[:3])
    whole = np.asarray(open_tokens(prepare(data, tmp_path / "one")["train"].path))
    n = 97  # not a divisor of the split's length, and smaller than most documents: documents span shards
    result = prepare(data, tmp_path / "shards", shard_tokens=n, layout=layout)["train"]
    k = -(-len(whole) // n)
    assert len(whole) % n and result.written and len(result.shards) == k
    assert [p.name for p in result.shards] == [f"train_{i:06d}.{layout}" for i in range(k)]
    assert result.path == tmp_path / "shards" / f"train_{'[0-9]' * 6}.{layout}"
    assert result.summary().endswith(f"({k} shards, written)")
    parts = [np.asarray(open_tokens(p, verify=True)) for p in result.shards]
    assert [len(part) for part in parts] == [n] * (k - 1) + [len(whole) - n * (k - 1)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    metas = [read_sidecar(p) for p in result.shards]
    assert [m["shard"] for m in metas] == [
        {"index": i, "count": k, "shard_tokens": n, "first_token": i * n} for i in range(k)
    ]
    assert [m["n_docs"] for m in metas] == [int(np.count_nonzero(part == EOT)) for part in parts]
    assert (result.meta["n_docs"], result.meta["n_tokens"], result.meta["n_shards"]) == (
        len(MANY),
        len(whole),
        k,
    )
    assert len({m["settings_fingerprint"] for m in metas}) == 1
    assert (
        metas[0]["settings_fingerprint"]
        != read_sidecar(tmp_path / "one" / "train.npy")["settings_fingerprint"]
    )
    ds = NpyTokensDataset(result.path, 8)  # the glob as returned
    assert len(ds) == sum((len(part) - 1) // 8 for part in parts)
    assert prepare(data, tmp_path / "shards", shard_tokens=len(whole) + 5, layout=layout)[
        "train"
    ].shards == (
        tmp_path / "shards" / f"train_000000.{layout}",
    )  # one shard holds all; the others of the previous run are gone with their sidecars
    assert sorted(q.name for q in (tmp_path / "shards").glob("train_*")) == [
        f"train_000000.{layout}",
        f"train_000000.{layout}.json",
    ]


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
                "--format",
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
    expected = [i for text in DOCS for i in (70_000, *enc.encode_ordinary(text))]
    assert llmc_shard(result.path).tolist() == expected == open_tokens(result.path).tolist()


def test_sharded_rerun_skips_rebuilds_on_change_and_is_byte_identical(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    first = prepare(data, out, shard_tokens=300)["train"]
    snapshot = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()}
    time.sleep(0.01)
    again = prepare(data, out, shard_tokens=300, num_threads=1, chunk_docs=5)
    assert not any(r.written for r in again.values()) and again["train"].shards == first.shards
    assert "shards, up to date)" in again["train"].summary()
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.iterdir()} == snapshot

    forced = prepare(data, out, shard_tokens=300, force=True)["train"]
    assert forced.written and {p.name: p.read_bytes() for p in out.iterdir()} == {
        k: v[0] for k, v in snapshot.items()
    }

    stray = (
        out / f"train_{len(first.shards):06d}.npy"
    )  # a shard from some other run: not up to date any more
    stray.write_bytes(first.shards[0].read_bytes())
    assert prepare(data, out, shard_tokens=300)["train"].written and not stray.exists()

    first.shards[1].unlink()  # a missing shard is rebuilt
    assert prepare(data, out, shard_tokens=300)["train"].written and first.shards[1].is_file()

    smaller = prepare(data, out, shard_tokens=100)["train"]
    assert smaller.written and len(smaller.shards) > len(first.shards)
    assert (out / "train.npy").exists() is False  # sharded output never writes the one-file name


def test_a_failed_sharded_rebuild_keeps_the_previous_shards_whole(tmp_path, monkeypatch):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    before = prepare(data, out, shard_tokens=300)["train"]
    snapshot = {p.name: p.read_bytes() for p in out.iterdir()}
    tokens = np.concatenate([np.load(p) for p in before.shards])
    real, calls = pt.write_token_file, []

    def interrupted_on_the_third_shard(chunks, path, *args, **kwargs):
        calls.append(Path(path))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(chunks, path, *args, **kwargs)

    monkeypatch.setattr(pt, "write_token_file", interrupted_on_the_third_shard)
    with pytest.raises(KeyboardInterrupt):
        prepare(data, out, shard_tokens=200, splits=["train"])  # other settings: a rebuild
    assert all(
        p.parent != out for p in calls
    )  # shards are written beside, never over, the finished ones
    assert {p.name: p.read_bytes() for p in out.iterdir()} == snapshot  # staging folder gone too
    assert all(
        open_tokens(p, verify=True).size == read_sidecar(p)["n_tokens"] for p in before.shards
    )
    monkeypatch.undo()
    after = prepare(data, out, shard_tokens=200, splits=["train"])["train"]
    assert after.written and np.array_equal(
        np.concatenate([np.load(p) for p in after.shards]), tokens
    )
    assert len(after.shards) == -(-len(tokens) // 200) and sorted(
        p.name for p in out.glob("train*")
    ) == sorted([p.name for p in after.shards] + [p.name + ".json" for p in after.shards])


def test_ctrl_c_during_the_swap_waits_until_the_new_shards_are_whole(tmp_path, monkeypatch):
    import signal

    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    prepare(data, out, shard_tokens=100, splits=["train"])
    real_replace, renames = pt.os.replace, []

    def ctrl_c_after_the_first_rename(src, dst):
        real_replace(src, dst)
        if (
            Path(dst).parent != out or Path(src).parent == out
        ):  # a temp file's rename, not the swap's
            return
        renames.append(Path(dst))
        if len(renames) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, half way through the renames

    monkeypatch.setattr(pt.os, "replace", ctrl_c_after_the_first_rename)
    with pytest.raises(KeyboardInterrupt):
        prepare(data, out, shard_tokens=300, splits=["train"])
    monkeypatch.undo()
    assert len(renames) > 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    shards = sorted(
        out.glob("train_*.npy")
    )  # all of the new run, finished, none of the old one left
    assert [p.name for p in shards] == [p.name for p in renames]
    assert all(
        read_sidecar(p)["shard"]["shard_tokens"] == 300 and open_tokens(p, verify=True).size
        for p in shards
    )
    assert not prepare(data, out, shard_tokens=300, splits=["train"])["train"].written


def test_sharding_refuses_to_touch_another_splits_file_with_a_shard_name(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    prepare(data, out, splits=["validation"])
    for suffix in ("", ".json"):  # as if a split named train_000001 had been written here
        (out / f"validation.npy{suffix}").rename(out / f"train_000001.npy{suffix}")
    before = (out / "train_000001.npy").read_bytes()
    with pytest.raises(
        ValueError, match=r"train_000001.npy' is not a shard of split 'train'.*choose another --out"
    ):
        prepare(data, out, shard_tokens=10_000, splits=["train"])
    assert (out / "train_000001.npy").read_bytes() == before and (
        out / "train_000001.npy.json"
    ).is_file()
    assert sorted(p.name for p in out.iterdir()) == ["train_000001.npy", "train_000001.npy.json"]


def test_a_killed_runs_shard_staging_folder_is_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    staging = tmp_path / f".train_shards.tmp.{dead.pid}.0badc0de"
    staging.mkdir()
    (staging / "train_000000.npy").write_bytes(b"half a shard")
    alive = (
        tmp_path / ".train_shards.tmp.1.0badc0de"
    )  # pid 1 is always alive: its run may still be writing
    alive.mkdir()
    assert pt.clean_stale_temp_files(tmp_path) == [staging]
    assert not staging.exists() and alive.is_dir()


def test_the_dataset_warns_when_a_shard_set_is_incomplete_or_repeated(tmp_path):
    import warnings

    from npy_datasets import NpyTokensDataset

    data = make_dataset(tmp_path / "in", MANY, MANY[:3])
    result = prepare(data, tmp_path / "out", shard_tokens=300, splits=["train"])["train"]
    k = len(result.shards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the whole set, in any order: no warning
        NpyTokensDataset(result.path, 8)
        NpyTokensDataset(list(reversed(result.shards)), 8)
    with pytest.warns(
        UserWarning,
        match=rf"one of {k} shards written together, .* shard\(s\) 1, 3-{k - 1} of {k} missing",
    ):
        NpyTokensDataset([result.shards[0], result.shards[2]], 8)
    with pytest.warns(UserWarning, match=r"shard\(s\) 0 given more than once"):
        NpyTokensDataset([*result.shards, result.shards[0]], 8)


def test_shard_tokens_must_be_a_positive_int(tmp_path):
    for bad in (0, -5, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="shard_tokens"):
            pt.prepare(
                tmp_path / "no_such_dataset", tmp_path / "out", shard_tokens=bad, progress=False
            )
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="more than 6 digits"):
        pt.shard_path(tmp_path, "train", 10**6)


# --- carving validation from train ------------------------------------------------------------------


def test_carve_validation_when_the_dataset_has_none(tmp_path, enc):
    texts = [f"document number {i}" for i in range(40)]
    data = make_dataset(tmp_path / "in", texts)  # train.jsonl only
    results = prepare(data, tmp_path / "a", val_fraction=0.1, seed=7)
    train, val = (
        decoded(tmp_path / "a" / "train.npy", enc),
        decoded(tmp_path / "a" / "validation.npy", enc),
    )
    assert len(val) == 4 and len(train) == 36
    assert not set(train) & set(val)
    assert sorted(train + val) == sorted(texts)
    assert train == [t for t in texts if t in set(train)]  # each split keeps the original order
    for split in ("train", "validation"):
        source = results[split].meta["source"]
        assert (source["split"], source["from_split"]) == (split, "train")
        assert (source["val_fraction"], source["seed"]) == (0.1, 7)

    prepare(data, tmp_path / "b", val_fraction=0.1, seed=7)  # same seed, same carve, same bytes
    for name in ("train.npy", "validation.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()

    only_train = prepare(data, tmp_path / "c", splits=["train"], val_fraction=0.1, seed=7)
    assert list(only_train) == ["train"]  # train alone is still the remainder: no later leak
    assert (tmp_path / "c" / "train.npy").read_bytes() == (
        tmp_path / "a" / "train.npy"
    ).read_bytes()

    reseeded = prepare(data, tmp_path / "a", val_fraction=0.1, seed=8)
    assert reseeded["validation"].written and reseeded["train"].written
    assert set(decoded(tmp_path / "a" / "validation.npy", enc)) != set(val)


def test_carve_validation_keeps_at_least_one_document_each():
    rest, val = pt.carve_validation(10)  # 10 * 0.005 rounds to 0: one document anyway
    assert (len(rest), len(val)) == (9, 1)
    assert sorted([*rest, *val]) == list(range(10)) and np.all(np.diff(rest) > 0)
    for n, fraction, n_val in [
        (1000, 0.005, 5),
        (300, 0.005, 2),
        (500, 0.005, 2),
        (40, 0.1, 4),
        (7, 0.5, 4),
    ]:
        rest, val = pt.carve_validation(
            n, fraction
        )  # round half to even: 1.5 -> 2, 2.5 -> 2, 3.5 -> 4
        assert (len(rest), len(val)) == (n - n_val, n_val), (n, fraction)
    assert (
        pt.carve_validation(100, 0.1, seed=1)[1].tolist()
        == pt.carve_validation(100, 0.1, seed=1)[1].tolist()
    )
    assert (
        pt.carve_validation(100, 0.1, seed=1)[1].tolist()
        != pt.carve_validation(100, 0.1, seed=2)[1].tolist()
    )
    with pytest.raises(ValueError, match="both splits need at least one"):
        pt.carve_validation(1)


# --- writer safety ------------------------------------------------------------------------------


def test_id_that_does_not_fit_the_dtype_raises_instead_of_wrapping(tmp_path):
    assert np.array([70000]).astype(np.uint16)[0] == 4464  # what a bare cast would silently write
    path = tmp_path / "train.npy"
    with pytest.raises(ValueError, match=r"token id 70000 does not fit uint16.*uint32"):
        pt.write_token_file([np.array([1, 2]), np.array([5, 70000])], path, np.uint16)
    with pytest.raises(ValueError, match=r"token id -1 does not fit uint16"):
        pt.write_token_file([np.array([-1, 2])], path, np.uint16)
    assert list(tmp_path.iterdir()) == []
    stats = pt.write_token_file([np.array([1, 70000])], tmp_path / "wide.npy", np.uint32)
    assert (stats["n_tokens"], stats["max_token_id"]) == (2, 70000)
    np.testing.assert_array_equal(
        np.load(tmp_path / "wide.npy"), np.array([1, 70000], dtype=np.uint32)
    )


def test_max_token_id_is_the_largest_id_of_every_chunk_not_the_first(tmp_path):
    chunks = [
        np.array([3, 1]),
        np.array([], dtype=np.uint32),
        np.array([7, 60000, 2]),
        np.array([9]),
    ]
    assert (
        pt.write_token_file(chunks, tmp_path / "t.npy")["max_token_id"]
        == 60000
        == np.load(tmp_path / "t.npy").max()
    )
    data = make_dataset(
        tmp_path / "in", MANY[:20], ["v"]
    )  # shards of 7 ids: some hold no EOT, the largest id
    result = prepare(data, tmp_path / "out", shard_tokens=7, chunk_docs=1)["train"]
    tops = [read_sidecar(shard)["max_token_id"] for shard in result.shards]
    assert tops == [int(np.load(shard).max()) for shard in result.shards] and min(tops) < EOT
    assert result.meta["max_token_id"] == max(tops) == EOT


def test_write_token_file_refuses_empty_output_and_wrong_suffix(tmp_path):
    with pytest.raises(ValueError, match="no tokens"):
        pt.write_token_file([np.array([], dtype=np.int64)], tmp_path / "train.npy")
    with pytest.raises(ValueError, match=r"must end in \.bin"):
        pt.write_token_file([np.array([1])], tmp_path / "train.npy", layout="bin")
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_leaves_nothing_and_keeps_earlier_output(tmp_path, monkeypatch):
    def two_chunks_then_ctrl_c(*args, **kwargs):
        yield np.array([EOT, 1, 2])
        yield np.array([EOT, 3])
        raise KeyboardInterrupt

    fresh = tmp_path / "fresh" / "train.npy"
    fresh.parent.mkdir()
    with pytest.raises(KeyboardInterrupt):
        pt.write_token_file(two_chunks_then_ctrl_c(), fresh)
    assert list(fresh.parent.iterdir()) == []

    data, out = make_dataset(tmp_path / "in", MANY, ["v"]), tmp_path / "out"
    prepare(data, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(pt, "tokenize_documents", two_chunks_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        prepare(data, out, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched, no temp files


def test_crash_between_data_and_sidecar_leaves_no_sidecar(tmp_path, monkeypatch):
    data, out = make_dataset(tmp_path / "in", MANY, ["v"]), tmp_path / "out"
    prepare(data, out)

    def crash(*args, **kwargs):
        raise OSError("simulated power cut before the sidecar")

    monkeypatch.setattr(pt, "write_sidecar", crash)
    with pytest.raises(OSError, match="simulated"):
        prepare(data, out, force=True)
    assert (out / "train.npy").is_file() and not (out / "train.npy.json").exists()
    assert temp_files(out) == []
    monkeypatch.undo()
    assert prepare(data, out)["train"].written  # no sidecar means incomplete: rebuilt
    assert open_tokens(out / "train.npy", verify=True).size > 0


def test_stale_temp_files_of_dead_runs_are_removed(tmp_path):
    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    out.mkdir()
    dead = out / ".train.npy.tmp.999999999.deadbeef"  # far above any possible pid
    alive = out / f".train.npy.tmp.{os.getppid()}.cafef00d"  # our parent: still running
    other = out / "notes.tmp.txt"
    for p in (dead, alive, other):
        p.write_bytes(b"x")
    prepare(data, out)
    assert not dead.exists() and alive.exists() and other.exists()


# --- input problems --------------------------------------------------------------------------------


def test_missing_column_lists_available_columns(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    expected = (
        f"cannot read {data / 'train.jsonl'} line 1: column 'body' not found; available: ['text']"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        prepare(data, tmp_path / "out", column="body")
    assert not (tmp_path / "out").exists()


def test_none_cell_names_split_row_and_column(tmp_path):
    write_jsonl(
        tmp_path / "in" / "train.jsonl",
        [{"text": "a"}, {"text": "b"}, {"text": None}, {"text": "d"}],
    )
    with pytest.raises(ValueError, match=r"train.jsonl line 3: column 'text' is None, not text"):
        prepare(tmp_path / "in", tmp_path / "out")


def test_non_text_column_is_refused(tmp_path):
    write_jsonl(tmp_path / "nums" / "train.jsonl", [{"text": 1}, {"text": 2}])
    with pytest.raises(ValueError, match=r"nums/train.jsonl line 1: column 'text' is 1, not text"):
        prepare(tmp_path / "nums", tmp_path / "out")
    (tmp_path / "pq").mkdir()
    datasets.Dataset.from_dict({"text": [1, 2]}).to_parquet(tmp_path / "pq" / "train.parquet")
    with pytest.raises(
        ValueError, match=r"column 'text' in .* split train holds .*int64.*not text"
    ):
        prepare(tmp_path / "pq", tmp_path / "out")


def test_empty_split_is_refused(tmp_path, monkeypatch):
    # datasets' own loaders refuse to build an empty split, so hand one over as a save_to_disk folder would.
    features = datasets.Features({"text": datasets.Value("string")})
    empty = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": ["a", "b"]}, features=features),
            "validation": datasets.Dataset.from_dict({"text": []}, features=features),
        }
    )
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "dataset_dict.json").write_text('{"splits": ["train", "validation"]}')
    monkeypatch.setattr(pt.datasets, "load_from_disk", lambda path: empty)
    with pytest.raises(ValueError, match="split validation has no documents"):
        prepare(tmp_path / "saved", tmp_path / "out")


@pytest.mark.parametrize(
    "kind",
    [
        "empty",
        "truncated_gz",
        "bad_json_line",
        "bad_utf8",
        "bad_json_later",
        "ints_in_one_split",
        "lone_surrogate",
    ],
)
def test_an_unreadable_input_is_one_error_naming_file_and_line(tmp_path, kind, capsys):
    import gzip
    import random

    folder = tmp_path / "in"
    folder.mkdir()
    rng = random.Random(0)  # text that does not compress away, so half the .gz is half the data
    rows = "".join(
        json.dumps({"text": "".join(rng.choice("abcdefgh ") for _ in range(200))}) + "\n"
        for _ in range(3000)
    )
    file, where = folder / "train.jsonl", r" line 2: "
    if kind == "empty":
        file.write_text("")
        where = ": it holds no documents"
    elif kind == "truncated_gz":
        whole = gzip.compress(rows.encode())
        (file := folder / "train.jsonl.gz").write_bytes(whole[: len(whole) // 2])
        where = r" after line \d+: Compressed file ended"
    elif kind == "bad_json_line":
        file.write_text('{"text": "a"}\n{"text": oops}\n')
        where += r"invalid JSON \(Expecting value at column 10\)"
    elif kind == "bad_json_later":  # past the first batch of documents
        file.write_text(rows * 10 + '{"text": oops}\n')
        where = r" line 30001: invalid JSON"
    elif kind == "ints_in_one_split":  # strings in train, ints in validation: never cast to "1"
        file.write_text('{"text": "a"}\n{"text": "b"}\n')
        (file := folder / "validation.jsonl").write_text('{"text": "c"}\n{"text": 1}\n')
        where += "column 'text' is 1, not text"
    elif kind == "lone_surrogate":
        file.write_text('{"text": "a"}\n{"text": "x\\ud800y"}\n')
        where += r"column 'text' holds a lone surrogate \('\\ud800'\)"
    else:
        (file := folder / "train.txt").write_bytes(b"fine\n\xff\xfe not utf-8\n")
        where += "'utf-8' codec can't decode byte 0xff"
    with pytest.raises(SystemExit) as exc:
        pt.main(["--dataset", str(folder), "--out", str(tmp_path / "out")])
    message = exc.value.code
    assert isinstance(message, str) and "\n" not in message  # printed as one line, exit status 1
    assert re.fullmatch(
        rf"prepare_tokens.py: error: cannot read {re.escape(str(file))}{where}.*", message
    ), message
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "out" / "train.npy").exists()


def test_unknown_split_and_missing_path(tmp_path):
    data = make_dataset(tmp_path / "in", DOCS, ["v"])
    with pytest.raises(
        ValueError, match=r"split 'test' not found .* available: \['train', 'validation'\]"
    ):
        prepare(data, tmp_path / "out", splits=["train", "test"])
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        prepare(tmp_path / "nowhere", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        prepare("not/here.jsonl", tmp_path / "out")


@pytest.mark.parametrize("kind", ["parquet_folder", "save_to_disk", "jsonl_gz_file", "txt_file"])
def test_other_input_formats(tmp_path, enc, kind):
    val = ["validation story"]
    if kind == "parquet_folder":
        data = tmp_path / "pq"
        data.mkdir()
        datasets.Dataset.from_dict({"text": DOCS}).to_parquet(data / "train.parquet")
        datasets.Dataset.from_dict({"text": val}).to_parquet(data / "validation.parquet")
    elif kind == "save_to_disk":
        data = tmp_path / "saved"
        datasets.DatasetDict(
            {
                "train": datasets.Dataset.from_dict({"text": DOCS}),
                "validation": datasets.Dataset.from_dict({"text": val}),
            }
        ).save_to_disk(data)
    elif kind == "jsonl_gz_file":
        import gzip

        data = tmp_path / "stories.jsonl.gz"
        with gzip.open(data, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in DOCS + val)
    else:
        data = tmp_path / "stories.txt"  # one document per line
        lines = [t for t in DOCS + val if "\n" not in t]
        data.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    results = prepare(data, tmp_path / "out")
    train, validation = (
        decoded(tmp_path / "out" / "train.npy", enc),
        decoded(tmp_path / "out" / "validation.npy", enc),
    )
    if kind in ("parquet_folder", "save_to_disk"):
        assert (train, validation) == (DOCS, val)
        assert results["train"].meta["source"]["from_split"] == "train"
    else:  # a single file is the train split: validation is carved from it
        expected = DOCS + val if kind == "jsonl_gz_file" else lines
        assert sorted(train + validation) == sorted(expected) and len(validation) == 1
        assert results["validation"].meta["source"]["val_fraction"] == pt.VAL_FRACTION
    assert re.fullmatch(
        r"sha256:[0-9a-f]{64}", results["train"].meta["source"]["input_fingerprint"]
    )


def test_txt_with_separator_lines_holds_multi_line_stories_and_crlf_round_trips(tmp_path, enc):
    stories = [
        "Once upon a time.\nTom said hi.\n\nThe end.",
        'Lily wrote "<|endoftext|>" in a line.',
        "",
        "A lone carriage return\rstays inside the story.",
        "  spaces kept  ",
    ]
    folder = tmp_path / "tinystories_v2"
    folder.mkdir()
    (folder / "train.txt").write_bytes(
        "".join(f"{s}\n<|endoftext|>\n" for s in stories).encode()
    )  # TinyStoriesV2
    crlf = [
        s.replace("\n", "\r\n") for s in stories
    ]  # a Windows copy; the last story has no separator after it
    (folder / "validation.txt").write_bytes(
        ("\r\n  <|endoftext|> \r\n".join(crlf) + "\r\n").encode()
    )
    results = prepare(folder, tmp_path / "out")
    assert (
        decoded(tmp_path / "out" / "train.npy", enc) == stories
        and results["train"].meta["n_docs"] == 5
    )
    assert (
        decoded(tmp_path / "out" / "validation.npy", enc) == crlf
    )  # "\r\n" inside a story is kept as it was
    lines = [
        "one document",
        "a lone \r is not a line break",
        "",
        "<|endoftext|> is text on a longer line",
    ]
    (folder / "train.txt").write_bytes(
        "\r\n".join(lines).encode()
    )  # no separator line: one document per line
    (folder / "validation.txt").write_bytes(b"v\n")
    assert (
        decoded(tmp_path / "out" / "train.npy", enc) != lines
        and prepare(folder, tmp_path / "out")["train"].written
    )
    assert decoded(tmp_path / "out" / "train.npy", enc) == lines
    assert (
        "lines of only <|endoftext|> (TinyStoriesV2-GPT4-train.txt) holds the stories"
        in " ".join(pt._parser().format_help().split())
    )  # the rule, in --help


# --- parameters and output folder -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_threads": 0},
        {"num_threads": -2},
        {"chunk_docs": 0},
        {"val_fraction": float("nan")},
        {"val_fraction": float("inf")},
        {"val_fraction": 0.0},
        {"val_fraction": 1.0},
        {"val_fraction": -0.1},
        {"layout": "csv"},
        {"seed": -1},
        {"splits": []},
        {"splits": ["train", "train"]},
    ],
)
def test_bad_parameters_fail_before_any_work(tmp_path, kwargs):
    missing = tmp_path / "no_such_dataset"  # would raise FileNotFoundError if loading started
    with pytest.raises(ValueError):
        pt.prepare(missing, tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-threads", "0"], "num_threads must be at least 1, got 0"),
        (["--chunk-docs", "-1"], "chunk_docs must be at least 1, got -1"),
        (["--val-fraction", "nan"], "val_fraction must be strictly between 0 and 1, got nan"),
        (["--val-fraction", "1"], "val_fraction must be strictly between 0 and 1, got 1.0"),
        (["--seed", "-1"], "seed must be an int >= 0, got -1"),
        (["--splits", "../x"], "split name '../x' cannot be a file name"),
        (["--format", "csv"], "argument --format: invalid choice: 'csv'"),
        (["--shard-tokens", "0"], "shard_tokens must be at least 1, got 0"),
        (["--shard-tokens", "1e6"], "argument --shard-tokens: invalid int value: '1e6'"),
        (["--eot", "after"], "argument --eot: invalid choice: 'after'"),
    ],
)
def test_cli_rejects_bad_parameters(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        pt.main(argv)
    assert exc.value.code == 2  # a usage error, before anything is loaded
    assert f"prepare_tokens.py: error: {message}" in capsys.readouterr().err


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


# --- the Hub, offline ------------------------------------------------------------------------------


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


def test_an_unreadable_sidecar_means_rebuild_without_force(tmp_path):
    data, out = make_dataset(tmp_path / "in", DOCS, ["v"]), tmp_path / "out"
    first = prepare(data, out)["train"].meta
    side = sidecar_path(out / "train.npy")
    side.write_text(
        re.sub(r'"n_tokens": \d+', '"n_tokens": ' + "9" * 5000, side.read_text())
    )  # past int() digit limit
    with pytest.raises(TokenFileError, match=re.escape(str(side))):
        read_sidecar(out / "train.npy")
    again = prepare(data, out)["train"]
    assert again.written and read_sidecar(out / "train.npy") == again.meta
    assert {k: v for k, v in again.meta.items() if k != "created_by"} == {
        k: v for k, v in first.items() if k != "created_by"
    }


def test_hub_probe_honours_offline_mode(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    assert pt.hub_reachable() is False
    assert time.monotonic() - start < 0.5  # no probe at all


def test_unreachable_hub_fails_at_once_naming_offline_mode_and_the_sample(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError(
            "load_dataset called: it would retry the unreachable Hub for half a minute"
        )

    monkeypatch.setattr(pt, "hub_reachable", lambda timeout=pt.HUB_PROBE_TIMEOUT_S: False)
    monkeypatch.setattr(datasets, "load_dataset", never)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    with pytest.raises(pt.HubUnreachableError, match="materials/tinystories_sample") as exc:
        pt.load_text_splits("someone/not-cached-anywhere")
    assert "Hub is unreachable" in str(exc.value) and "set HF_HUB_OFFLINE=1" in str(exc.value)
    assert "omit --dataset" in str(exc.value)
    asked = []  # offline mode set by the user: datasets reads its local cache, and a miss is explained

    def not_in_the_cache(name):
        asked.append(name)
        raise FileNotFoundError(name)

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets, "load_dataset", not_in_the_cache)
    with pytest.raises(pt.HubUnreachableError, match="not in the local cache"):
        pt.load_text_splits("someone/not-cached-anywhere")
    assert asked == ["someone/not-cached-anywhere"]


def test_cli_offline_hub_name_fails_fast_naming_the_sample(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    for var in (
        "HF_DATASETS_CACHE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_DATASETS_OFFLINE",
    ):
        env.pop(var, None)  # everything under the empty HF_HOME: no cache can answer
    start = time.monotonic()
    command = [
        sys.executable,
        "python_files/prepare_tokens.py",
        "--dataset",
        "roneneldan/TinyStories",
        "--out",
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    assert elapsed < 20
    assert "Hugging Face Hub is unreachable" in proc.stderr
    assert (
        "--dataset materials/tinystories_sample" in proc.stderr and "omit --dataset" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out").exists()


# --- end to end on the bundled sample -----------------------------------------------------------------


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


def test_cli_shard_tokens_writes_shards_the_dataset_reads_by_glob(tmp_path):
    from npy_datasets import NpyTokensDataset

    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / "hf_datasets"))
    command = [
        sys.executable,
        "python_files/prepare_tokens.py",
        "--out",
        str(tmp_path),
        "--shard-tokens",
        "100000",
    ]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pattern = (tmp_path / f"train_{'[0-9]' * 6}.npy").resolve()
    assert proc.stdout.splitlines() == [
        f"train: 1,800 docs, 342,147 tokens, uint16 -> {pattern} (4 shards, written)",
        f"validation: 180 docs, 35,098 tokens, uint16 -> {pattern.with_name('validation_' + '[0-9]' * 6 + '.npy')} (1 shard, written)",
    ]
    ds = NpyTokensDataset(str(pattern), 256)
    assert [f["tokens"] for f in ds.file_summary()] == [100_000, 100_000, 100_000, 42_147]
    assert len(ds) == 3 * (99_999 // 256) + 42_146 // 256


def test_importing_prepare_tokens_does_not_import_torch():
    code = "import sys, prepare_tokens; print(sorted(m for m in ('torch', 'npy_datasets') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "python_files",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.strip() == "['npy_datasets']", out.stderr
