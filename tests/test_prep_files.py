"""Which files of a local input prepare_tokens.py reads, and how each format reads: every data file
of a folder or a one-line refusal naming the files left out; .txt (a BOM, empty documents), .json
(lines or one list), .csv and the prep step's own outputs inside an input folder.

Tiny local fixtures, no network. Catalogue items 81, 85 and 87 (tests/bad_inputs.md).
"""

import json
import re

import datasets
import numpy as np
import pytest

import prep_files
import prepare_tokens as pt
from conftest import EOT, MANY, decoded, make_dataset, prepare, write_jsonl
from npy_datasets import read_sidecar

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")


def cli_error(tmp_path, dataset, *extra: str) -> str:
    """The one line the command line prints for an input it refuses (exit status 1)."""
    out = tmp_path / "refused"
    with pytest.raises(SystemExit) as exc:
        pt.main(["--dataset", str(dataset), "--out", str(out), *extra])
    message = exc.value.code
    assert isinstance(message, str) and "\n" not in message, message
    assert message.startswith("prepare_tokens.py: error: "), message
    assert not (out / "train.npy").exists()
    return message


# --- which files of a folder --------------------------------------------------------------------


def test_every_data_file_of_a_folder_is_read_or_named_in_a_refusal(tmp_path, enc):
    folder = tmp_path / "in"
    write_jsonl(folder / "train.jsonl", [{"text": f"json story {i}"} for i in range(100)])
    (folder / "train.txt").write_text("".join(f"text story {i}\n" for i in range(50)))
    message = cli_error(tmp_path, folder)  # two formats: datasets would read the .jsonl alone
    assert "train.jsonl" in message and "train.txt" in message and "one format" in message
    (folder / "train.txt").unlink()

    write_jsonl(folder / "sub" / "train.jsonl", [{"text": "an old copy"}])
    message = cli_error(tmp_path, folder)  # datasets would add the subfolder's file to train
    assert "sub/train.jsonl" in message and "subfolder" in message
    (folder / "sub" / "train.jsonl").unlink()

    write_jsonl(folder / "notes.jsonl", [{"text": "not a story"}])
    message = cli_error(tmp_path, folder)  # named after no split: datasets would skip it
    assert "notes.jsonl" in message and "no split" in message
    (folder / "notes.jsonl").unlink()

    (folder / ".hidden.jsonl").write_text('{"text": "skipped, as datasets skips it"}\n')
    results = prepare(folder, tmp_path / "out")
    stories = decoded(tmp_path / "out" / "train.npy", enc)
    stories += decoded(tmp_path / "out" / "validation.npy", enc)
    assert sorted(stories) == sorted(f"json story {i}" for i in range(100))
    train_sha = results["train"].meta["source"]["input_fingerprint"]
    assert (
        train_sha
        == pt.load_text_splits(folder / "train.jsonl")["train"].source["input_fingerprint"]
    )  # the hash covers the one file read


def test_the_prep_steps_own_outputs_in_an_input_folder_are_skipped(tmp_path, enc):
    folder = make_dataset(tmp_path / "in", MANY[:20])  # train.jsonl, nothing else
    prepare(folder / "train.jsonl", folder)  # the outputs land beside the input file
    assert (folder / "train.npy.json").is_file() and (folder / "validation.npy.json").is_file()
    results = prepare(folder, tmp_path / "out")  # datasets would read the sidecars as data
    assert set(results) == {"train", "validation"}
    stories = decoded(tmp_path / "out" / "train.npy", enc)
    stories += decoded(tmp_path / "out" / "validation.npy", enc)
    assert sorted(stories) == sorted(MANY[:20])


def test_a_folder_without_data_files_is_refused(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "README.md").write_text("no data here")
    message = cli_error(tmp_path, tmp_path / "in")
    assert "holds no data files" in message and str(tmp_path / "in") in message


# --- how each format reads ----------------------------------------------------------------------


def test_a_json_file_with_an_int_among_strings_names_the_file_and_row(tmp_path, enc):
    folder = tmp_path / "in"
    folder.mkdir()
    rows = [{"story": "a"}, {"story": 1}, {"story": "c"}]
    (folder / "train.json").write_text(
        json.dumps(rows)
    )  # one JSON list, as TinyStories' data00.json
    message = cli_error(tmp_path, folder, "--column", "story")
    expected = f"cannot read {folder / 'train.json'} row 2: column 'story' is 1, not text"
    assert expected in message
    rows[1] = {"story": "b"}
    (folder / "train.json").write_text(json.dumps(rows, indent=2))
    (folder / "validation.json").write_text("".join(json.dumps(r) + "\n" for r in rows))  # lines
    prepare(folder, tmp_path / "out", column="story")
    assert decoded(tmp_path / "out" / "train.npy", enc) == ["a", "b", "c"]
    assert decoded(tmp_path / "out" / "validation.npy", enc) == ["a", "b", "c"]


def test_a_csv_column_of_digits_is_text_and_errors_name_file_and_line(tmp_path, enc):
    folder = tmp_path / "in"
    folder.mkdir()
    texts = [f"story number {i}" for i in range(20)] + [str(i) for i in range(30_000)]
    lines = ["id,text", *(f"{i},{t}" for i, t in enumerate(texts))]
    (folder / "train.csv").write_text("\n".join(lines) + "\n")  # datasets: "Schema ... different"
    (folder / "validation.csv").write_text('id,text\n1,"a story, with a comma\nand a line"\n')
    prepare(folder, tmp_path / "out", splits=["validation"])
    assert decoded(tmp_path / "out" / "validation.npy", enc) == [
        "a story, with a comma\nand a line"
    ]
    tokens = np.load(prepare(folder, tmp_path / "out")["train"].path)
    assert np.count_nonzero(tokens == EOT) == len(texts)
    assert decoded(tmp_path / "out" / "train.npy", enc)[-3:] == ["29997", "29998", "29999"]
    (folder / "validation.csv").write_text("id,body\n1,x\n")
    message = cli_error(tmp_path, folder)
    expected = f"cannot read {folder / 'validation.csv'} line 1: column 'text' not found"
    assert expected in message and "available: ['id', 'body']" in message


def test_txt_bom_and_empty_documents_are_skipped_and_counted(tmp_path, enc, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    separated = ["First story.", "", "  \n ", "Second story,\n\nin two paragraphs."]
    body = "".join(f"{story}\n<|endoftext|>\n" for story in separated)
    (folder / "train.txt").write_bytes(b"\xef\xbb\xbf" + body.encode())  # a BOM, as Notepad saves
    (folder / "validation.txt").write_bytes(b"\xef\xbb\xbfone\n\ntwo\n   \nthree\n")  # a line each
    assert pt.main(["--dataset", str(folder), "--out", str(tmp_path / "out")]) == 0
    assert decoded(tmp_path / "out" / "train.npy", enc) == [separated[0], separated[3]]
    assert decoded(tmp_path / "out" / "validation.npy", enc) == ["one", "two", "three"]
    lines = capsys.readouterr().out.splitlines()
    assert re.match(r"train: 2 docs \(4 read, 2 empty skipped\), \d+ tokens", lines[0]), lines
    assert re.match(r"validation: 3 docs \(5 read, 2 empty skipped\), \d+ tokens", lines[1]), lines
    for split, skipped in (("train", 2), ("validation", 2)):
        meta = read_sidecar(tmp_path / "out" / f"{split}.npy")
        assert meta["source"]["n_empty_docs_skipped"] == skipped
    in_memory = datasets.Dataset.from_dict(
        {"text": ["a", "", "b", " \t"]}
    )  # any input, not only .txt
    split = pt.TextSplit("train", in_memory, "text", {"dataset": "inline", "split": "train"})
    result = pt.prepare_split(split, tmp_path / "mem", enc, num_threads=1, progress=False)
    assert result.meta["n_docs"] == 2 and result.meta["source"]["n_empty_docs_skipped"] == 2
    assert result.summary().startswith("train: 2 docs (4 read, 2 empty skipped), ")


# --- your own text: a .txt in three forms, cut by --separator -----------------------------------

PARAGRAPHS = [
    "Once upon a time, Tom had a red ball.\nHe threw it over the fence.",
    "Lily found the ball.\nShe gave it back.\nTom said thank you.",
    "A story of one line.",
    "A cat sat on a mat.\nIt slept all day.",
]


def test_separator_reads_each_form_of_a_txt_and_is_a_setting(tmp_path, enc, capsys):
    forms = {
        "endoftext": "".join(f"{text}\n<|endoftext|>\n" for text in PARAGRAPHS),
        "line": "".join(text.replace("\n", " ") + "\n" for text in PARAGRAPHS),
        "blank-line": "\n\n  \n".join(PARAGRAPHS) + "\n\n",  # a run of blank lines is one break
    }
    expected = {
        "endoftext": PARAGRAPHS,
        "line": [text.replace("\n", " ") for text in PARAGRAPHS],
        "blank-line": PARAGRAPHS,
    }
    for separator, body in forms.items():
        folder = tmp_path / separator
        folder.mkdir()
        (folder / "train.txt").write_bytes(body.encode())
        (folder / "validation.txt").write_bytes(body.encode())
        out = tmp_path / f"out_{separator}"
        argv = ["--dataset", str(folder), "--out", str(out), "--separator", separator]
        assert pt.main(argv) == 0
        for split in ("train", "validation"):
            assert decoded(out / f"{split}.npy", enc) == expected[separator], separator
            assert read_sidecar(out / f"{split}.npy")["source"]["separator"] == separator
        assert "note:" not in capsys.readouterr().err  # the option was named: no note

    folder = tmp_path / "blank-line"  # read as the default, auto: a document per line, one note
    results = prepare(folder, tmp_path / "out_blank-line")
    assert all(result.written for result in results.values())  # another setting: rewritten
    lines = [line for text in PARAGRAPHS for line in text.split("\n")]
    assert decoded(tmp_path / "out_blank-line" / "train.npy", enc) == lines
    assert results["train"].meta["source"]["separator"] == "auto"
    notes = capsys.readouterr().err.splitlines()
    assert len(notes) == 1, notes  # once, though each file is read more than once
    assert notes[0].startswith("note: train.txt, validation.txt have blank lines between lines")
    assert "--separator blank-line" in notes[0] and "--separator line" in notes[0]

    write_jsonl(tmp_path / "json" / "train.jsonl", [{"text": "a"}, {"text": "b"}])
    message = cli_error(tmp_path, tmp_path / "json", "--separator", "blank-line")
    assert "--separator blank-line: it cuts .txt files" in message and "holds none" in message
    with pytest.raises(ValueError, match="separator must be one of auto, endoftext, line"):
        prepare(folder, tmp_path / "out", separator="paragraph")


NOTE = "note: stories.txt has blank lines between lines of text but is read a document per line"


def test_a_txt_of_a_document_a_line_with_a_few_empty_lines_gets_the_note(tmp_path, capsys):
    """Any blank line between lines of text is worth the note, which costs nothing; blank lines
    only at the start or the end are not, and --separator line keeps the reading without it."""
    texts = [f"Story {i}: the dog ran to the park." for i in range(60)]
    texts[20] = texts[41] = ""  # two empty documents among sixty
    (tmp_path / "stories.txt").write_text("\n".join(texts) + "\n")
    results = prepare(tmp_path / "stories.txt", tmp_path / "out", splits=["train", "validation"])
    n_docs = sum(result.meta["n_docs"] for result in results.values())
    skipped = sum(result.meta["source"]["n_empty_docs_skipped"] for result in results.values())
    assert (n_docs, skipped) == (58, 2)
    assert capsys.readouterr().err.startswith(NOTE)
    prepare(tmp_path / "stories.txt", tmp_path / "line", splits=["train"], separator="line")
    (tmp_path / "stories.txt").write_text("\n\n" + "\n".join(texts[:20]) + "\n\n\n")
    prepare(tmp_path / "stories.txt", tmp_path / "edges", splits=["train", "validation"])
    assert "note:" not in capsys.readouterr().err


def test_six_stories_of_25_lines_between_blank_lines_get_the_note(tmp_path, capsys):
    """Six blank-line separated stories of 25 lines: read as 150 one-line documents, with the note
    that names --separator blank-line (one blank line in 30 lines)."""
    stories = ["\n".join(f"Story {s}, line {i}: the dog ran." for i in range(25)) for s in range(6)]
    (tmp_path / "stories.txt").write_text("\n\n".join(stories) + "\n")
    results = prepare(tmp_path / "stories.txt", tmp_path / "out", splits=["train", "validation"])
    assert sum(result.meta["n_docs"] for result in results.values()) == 150
    err = capsys.readouterr().err
    assert err.startswith(NOTE) and "--separator blank-line" in err, err


@pytest.mark.parametrize("separator", ["auto", "line", "blank-line", "endoftext"])
def test_a_txt_byte_order_mark_is_not_in_the_first_document(tmp_path, separator):
    """Notepad starts a file with a BOM: reading the .txt drops it, whatever the separator, so the
    first document starts with its text, and a BOM before a blank line makes no document."""
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffOnce upon a time.\nThe end.\n".encode())
    tables = prep_files.read_documents([str(path)], "text", {str(path): separator})
    documents = [text for table in tables for text in table.column("text").to_pylist()]
    one = ["Once upon a time.\nThe end."]
    assert documents == (one if separator in ("blank-line", "endoftext") else one[0].split("\n"))
    path.write_bytes("\ufeff\nOnce upon a time.\n".encode())
    tables = prep_files.read_documents([str(path)], "text", {str(path): "blank-line"})
    assert [text for table in tables for text in table.column("text").to_pylist()] == [
        "Once upon a time."
    ]


def test_a_categorical_parquet_text_column_is_read_as_text(tmp_path, enc):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["a red ball", "a blue ball", "a red ball", "the end"]
    folder = tmp_path / "pq"
    folder.mkdir()
    column = pa.array(texts).dictionary_encode()  # pandas' "category" dtype is stored this way
    pq.write_table(pa.table({"text": column}), folder / "train.parquet")
    pq.write_table(pa.table({"text": column}), folder / "validation.parquet")
    assert pa.types.is_dictionary(pq.read_schema(folder / "train.parquet").field("text").type)
    prepare(folder, tmp_path / "out")
    assert decoded(tmp_path / "out" / "train.npy", enc) == texts
    numbers = pa.schema([("text", pa.dictionary(pa.int32(), pa.int64()))])  # categories of ints
    with pytest.raises(ValueError, match=r"column 'text' holds dictionary<values=int64.*not text"):
        prep_files.check_text_column(numbers, "text")


# --- line endings: "\r\n" and a lone "\r" read as "\n", or kept -------------------------------

CRLF_STORIES = ["Tom had a red ball.\r\nHe threw it.", "Lily found it.\r\n\r\nThe end."]


def crlf_inputs(folder):
    """The same stories as a Windows .txt (between <|endoftext|> lines), as a .jsonl whose texts
    hold "\\r\\n", and as a .txt of an old Mac's lines, each ended by a lone "\\r"."""
    txt = folder / "txt"
    txt.mkdir(parents=True)
    body = "".join(f"{story}\r\n<|endoftext|>\r\n" for story in CRLF_STORIES)
    (txt / "train.txt").write_bytes(body.encode())
    (txt / "validation.txt").write_bytes(body.encode())
    make_dataset(folder / "jsonl", CRLF_STORIES, CRLF_STORIES)
    mac = folder / "mac"
    mac.mkdir()
    (mac / "train.txt").write_bytes(b"one line\rtwo lines\rthree\r")
    (mac / "validation.txt").write_bytes(b"v\r")
    return txt, folder / "jsonl", mac


def test_crlf_and_lone_cr_are_read_as_newlines_by_default_and_kept_with_the_option(tmp_path, enc):
    txt, jsonl, mac = crlf_inputs(tmp_path / "in")
    as_lf = [story.replace("\r\n", "\n") for story in CRLF_STORIES]
    for dataset in (txt, jsonl):
        out = tmp_path / f"out_{dataset.name}"
        assert pt.main(["--dataset", str(dataset), "--out", str(out)]) == 0
        assert decoded(out / "train.npy", enc) == as_lf  # no "\r" left in any document
        assert read_sidecar(out / "train.npy")["source"]["line_endings"] == "lf"
        argv = ["--dataset", str(dataset), "--out", str(out), "--keep-line-endings"]
        assert pt.main(argv) == 0  # another setting: written again, not "up to date"
        assert decoded(out / "train.npy", enc) == CRLF_STORIES, dataset.name
        assert read_sidecar(out / "train.npy")["source"]["line_endings"] == "kept"
    assert decoded(prepare(mac, tmp_path / "mac")["train"].path, enc) == [
        "one line",
        "two lines",
        "three",
    ]  # a lone "\r" ends a line, as in Python's text mode
    kept = prepare(mac, tmp_path / "mac_kept", keep_line_endings=True)["train"].path
    assert decoded(kept, enc) == ["one line\rtwo lines\rthree\r"]  # kept: one line of text
    assert "--keep-line-endings" in pt._parser().format_help()
