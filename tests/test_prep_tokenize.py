"""How prepare_tokens.py tokenizes: GPT-2 from the bundled files, one EOT per document, text
shaping (.txt separators, CRLF), special-token and hostile text, and vocabularies above 65,536 ids.

Catalogue items 31, 34, 35, 38, 79 and 87 (tests/bad_inputs.md).
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest

import npy_datasets as nd
import prep_outputs
import prep_tokenize
import prepare_tokens as pt
from conftest import (
    DOCS,
    EOT,
    MANY,
    NO_NETWORK,
    ROOT,
    SAMPLE,
    TIKTOKEN_CACHE,
    decoded,
    documents,
    make_dataset,
    prepare,
    prepare_on_one_thread,
    reference_tokens,
    refused,
    text_split,
)

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")


# --- documents and EOTs -------------------------------------------------------------------------


def test_round_trip_decodes_every_document_exactly(tmp_path, enc):
    val = ["A short validation story.", "Another one, with a comma."]
    data = make_dataset(tmp_path / "in", DOCS, val)
    results = prepare(data, tmp_path / "out")
    assert set(results) == {"train", "validation"}
    written = [text for text in DOCS if text]  # the empty document is skipped and counted
    assert results["train"].meta["source"]["n_empty_docs_skipped"] == 1
    for split, texts in (("train", written), ("validation", val)):
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


def test_bytes_do_not_depend_on_threads_or_chunk_size(tmp_path):
    data = make_dataset(tmp_path / "in", MANY, MANY[:9])
    seen = set()
    for threads, chunk in [(1, 1024), (2, 7), (1, 1), (2, 1)]:
        out = tmp_path / f"out_{threads}_{chunk}"
        results = prepare(data, out, num_threads=threads, chunk_docs=chunk)
        meta = results["train"].meta
        seen.add(((out / "train.npy").read_bytes(), meta["sha256"], meta["settings_fingerprint"]))
    assert len(seen) == 1


def test_txt_with_separator_lines_holds_multi_line_stories_and_kept_crlf_round_trips(tmp_path, enc):
    """With keep_line_endings=True, "\\r\\n" and a lone "\\r" stay as written (the default reads
    them as "\\n": tests/test_prep_files.py)."""
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
    results = prepare(folder, tmp_path / "out", keep_line_endings=True)
    kept = [story for story in stories if story]  # the empty story is skipped
    assert decoded(tmp_path / "out" / "train.npy", enc) == kept
    assert results["train"].meta["n_docs"] == 4
    crlf_kept = [story for story in crlf if story]
    assert decoded(tmp_path / "out" / "validation.npy", enc) == crlf_kept  # "\r\n" kept inside
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
        and prepare(folder, tmp_path / "out", keep_line_endings=True)["train"].written
    )
    assert decoded(tmp_path / "out" / "train.npy", enc) == [line for line in lines if line]
    assert (
        "endoftext, between lines of only <|endoftext|> (TinyStoriesV2-GPT4-train.txt)"
        in " ".join(pt._parser().format_help().split())
    )  # the rule, in --help


def test_a_byte_order_mark_is_dropped_at_the_start_of_each_document_and_only_there(tmp_path, enc):
    bom = "\ufeff"
    a = f"{bom}First story.\n<|endoftext|>\nSecond story.\n<|endoftext|>\n"
    b = f"{bom}Third story, {bom}with one inside.\n<|endoftext|>\n"
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "train.txt").write_text(a + b)  # cat a.txt b.txt: b's mark is mid-stream
    (folder / "validation.txt").write_text(f"{bom}one\n{bom}two\nthree{bom}\n")  # a line each
    prepare(folder, tmp_path / "out")
    assert decoded(tmp_path / "out" / "train.npy", enc) == [
        "First story.",
        "Second story.",
        f"Third story, {bom}with one inside.",
    ]
    assert decoded(tmp_path / "out" / "validation.npy", enc) == ["one", "two", f"three{bom}"]
    jsonl = make_dataset(tmp_path / "json", [f"{bom}x", f"y{bom}", bom], ["v"])  # bom: empty
    result = prepare(jsonl, tmp_path / "json_out")["train"]
    assert decoded(result.path, enc) == ["x", f"y{bom}"]
    assert result.meta["source"]["n_empty_docs_skipped"] == 1


def test_hostile_text(tmp_path):
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    big = "The dog ran to the park and back again. " * 25_000  # 1 MB in one document
    texts = [
        "",
        "nul\x00byte",
        "עברית \u200fמימין לשמאל",
        "e\u0301\u0301 combining marks",
        "",
        big,
        "after it",
    ]
    result = pt.prepare_split(
        text_split("train", texts),
        tmp_path / "out",
        enc,
        num_threads=2,
        chunk_docs=2,
        progress=False,
    )
    tokens = nd.open_tokens(result.path, verify=True)
    starts = np.flatnonzero(tokens == enc.eot_token)
    kept = [text for text in texts if text]  # an empty document is skipped, and counted
    assert len(starts) == len(kept) == result.meta["n_docs"]
    assert result.meta["source"]["n_empty_docs_skipped"] == 2
    docs = [
        enc.decode(tokens[a + 1 : b].tolist()) for a, b in zip(starts, [*starts[1:], len(tokens)])
    ]
    assert docs == kept
    # A lone surrogate cannot be encoded as UTF-8: tiktoken replaces it (lossy), and JSON input holding one is refused.
    (chunk,) = pt.tokenize_documents(["a\ud800b"], enc, num_threads=1)
    assert enc.decode(chunk[1:].tolist()) == "a\ufffdb"
    folder = tmp_path / "surrogate"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    with pytest.raises(
        ValueError,
        match=rf"cannot read {re.escape(str(folder / 'train.jsonl'))} line 2: .*lone surrogate",
    ):
        prepare_on_one_thread(folder, tmp_path / "out2")
    assert not (tmp_path / "out2" / "train.npy").exists()


# --- the GPT-2 encoding -------------------------------------------------------------------------


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
    assert (
        prep_tokenize.TIKTOKEN_FILES == TIKTOKEN_CACHE
        and pt.gpt2_encoding(TIKTOKEN_CACHE).n_vocab == 50257
    )


def test_tampered_tokenizer_file_is_refused(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(ROOT / "materials" / "tiktoken_cache", good)
    shutil.copytree(ROOT / "materials" / "tiktoken_cache", bad)
    vocab = (
        bad / "6d1cbeee0f20b3d9449abfede4726ed8212e3aee"
    )  # vocab.bpe, by tiktoken's sha1(url) name
    raw = bytearray(vocab.read_bytes())
    raw[-3] ^= 0x20
    vocab.write_bytes(raw)
    code = (
        "import os, sys, tiktoken, tiktoken.registry\n"
        "os.environ['TIKTOKEN_CACHE_DIR'] = sys.argv[1]; print(tiktoken.get_encoding('gpt2').n_vocab, flush=True)\n"
        "tiktoken.registry.ENCODINGS.clear(); os.environ['TIKTOKEN_CACHE_DIR'] = sys.argv[2]\n"
        "tiktoken.get_encoding('gpt2'); print('loaded the tampered file')\n"
    )
    no_network = {
        k: "http://127.0.0.1:9" for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
    }
    env = {**os.environ, **no_network, "NO_PROXY": "", "no_proxy": ""}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(good), str(bad)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.splitlines() == ["50257"], (
        proc.stdout + proc.stderr[-2000:]
    )  # the good copy loads, offline
    assert (
        proc.returncode == 1 and "Error" in proc.stderr
    )  # the tampered one is refused, then cannot be fetched
    assert not vocab.exists()  # tiktoken deleted it rather than use it
    # Prep reads its own committed folder, not a shared or world-writable one, and checks the file it reads.
    assert prep_tokenize.TIKTOKEN_FILES == ROOT / "materials" / "tiktoken_cache"
    assert not prep_tokenize.TIKTOKEN_FILES.stat().st_mode & stat.S_IWOTH
    encoder = bad / prep_tokenize.GPT2_ENCODER_JSON
    encoder.write_bytes(encoder.read_bytes().replace(b'"hello": 31373', b'"hello": 31374'))
    with pytest.raises(ValueError, match="sha256 differs from GPT-2's encoder.json"):
        pt.gpt2_encoding(bad)


# --- vocabularies -------------------------------------------------------------------------------


def _wide_encoding():
    """GPT-2's merges with the end-of-text token moved to id 70,000: a vocabulary uint16 cannot hold."""
    import tiktoken

    gpt2 = tiktoken.get_encoding("gpt2")
    return tiktoken.Encoding(
        "gpt2_wide_eot",
        pat_str=gpt2._pat_str,
        mergeable_ranks=gpt2._mergeable_ranks,
        special_tokens={"<|endoftext|>": 70_000},
    )


def test_wide_vocabulary_gets_uint32(tmp_path):
    enc = _wide_encoding()
    texts = ["A cat sat.", "Then it ran home."]
    result = pt.prepare_split(
        text_split("train", texts), tmp_path, enc, num_threads=1, progress=False
    )
    meta = result.meta
    assert (meta["dtype"], meta["n_vocab"], meta["eot_id"], meta["max_token_id"]) == (
        "uint32",
        70_001,
        70_000,
        70_000,
    )
    tokens = nd.open_tokens(result.path, verify=True)
    expected = [70_000, *enc.encode_ordinary(texts[0]), 70_000, *enc.encode_ordinary(texts[1])]
    assert tokens.dtype == np.uint32 and tokens.tolist() == expected
    assert nd.NpyTokensDataset(result.path, 2, vocab_size=70_001)[0][0].tolist() == expected[:2]
    refused(
        result.path,
        nd.TokenFileError,
        "ids up to 70000, past vocab_size=70000",
        seq_len=2,
        vocab_size=70_000,
    )
    with pytest.raises(ValueError, match=r"n_vocab=70,001 has ids that uint16 cannot hold"):
        nd.write_tokens(  # refused before a byte is written: a cast would wrap 70000 to 4464
            tmp_path / "narrow.npy",
            expected,
            n_vocab=70_001,
            tokenizer="t",
            eot_id=0,
            dtype="uint16",
        )
    assert not (tmp_path / "narrow.npy").exists()


def test_vocab_limits_come_from_the_encoding(tmp_path):
    import tiktoken

    for enc in (tiktoken.get_encoding("gpt2"), _wide_encoding()):
        meta = pt.prepare_split(
            text_split(enc.name, ["one story"]), tmp_path, enc, num_threads=1, progress=False
        ).meta
        assert meta["n_vocab"] == enc.n_vocab == enc.max_token_value + 1  # special tokens included
        assert (
            meta["dtype"] == prep_outputs.token_dtype(enc.n_vocab).name
            and meta["eot_id"] == enc.eot_token
        )
    assert tiktoken.get_encoding("gpt2").n_vocab == 50_257


def test_an_encoding_that_must_be_downloaded_offline_says_how_to_provide_it(tmp_path):
    env = dict(os.environ, TIKTOKEN_CACHE_DIR=str(tmp_path / "empty_cache"), **NO_NETWORK)
    command = [sys.executable, "python_files/prepare_tokens.py", "--out", str(tmp_path / "out")]
    proc = subprocess.run(
        [*command, "--encoding", "cl100k_base"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and "HTTPSConnectionPool" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("prepare_tokens.py: error: encoding 'cl100k_base': ")
    assert "TIKTOKEN_CACHE_DIR" in line and str(tmp_path / "empty_cache") in line
    assert not (tmp_path / "out").exists()
