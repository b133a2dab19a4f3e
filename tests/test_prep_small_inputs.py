"""Inputs with too little text: documents that are all empty, a carve that draws only empty
ones, a progress bar over empty rows, and a validation split too small to use (issues 26, 28)."""

import re

import pytest

import prepare_tokens as pt
from conftest import MANY, make_dataset, prepare
from npy_datasets import read_sidecar

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")


@pytest.mark.parametrize(
    "name, body, n_read",
    [
        ("bom_only.txt", b"\xef\xbb\xbf", 1),  # Notepad's empty file
        ("blank_only.txt", b"\n \n\t\r\n", 3),  # a document per line, each empty
        ("separators_only.txt", b"<|endoftext|>\n<|endoftext|>\n", 2),
        ("empty_texts.jsonl", b'{"text": ""}\n{"text": "  "}\n{"text": "\\ufeff"}\n', 3),
        ("empty_texts.csv", b'id,text\n1,\n2," "\n', 2),
    ],
)
def test_an_input_of_empty_documents_is_one_line_naming_it_and_the_counts(
    tmp_path, name, body, n_read
):
    (tmp_path / name).write_bytes(body)
    with pytest.raises(SystemExit) as exc:
        pt.main(["--dataset", str(tmp_path / name), "--out", str(tmp_path / "out")])
    counts = f"({n_read} read, {n_read} empty)"
    all_empty = f"{tmp_path / name} split train: its documents are all empty {counts}"
    assert exc.value.code == f"prepare_tokens.py: error: {all_empty}; nothing to tokenize"
    assert not (tmp_path / "out").exists()


def test_a_carved_validation_of_empty_documents_names_the_carve(tmp_path):
    rest, validation = pt.carve_validation(10, 0.1, seed=1337)
    texts = ["" if row in validation else f"story {row}" for row in range(10)]
    (tmp_path / "stories.txt").write_text("\n".join(texts) + "\n")
    with pytest.raises(ValueError) as info:
        prepare(tmp_path / "stories.txt", tmp_path / "out", val_fraction=0.1)
    carve = "the documents carved as validation: try another --seed or --val-fraction"
    expected = f"{tmp_path / 'stories.txt'} split train ({carve}): its documents are all empty"
    assert str(info.value) == f"{expected} (1 read, 1 empty); nothing to tokenize"


def test_the_progress_bar_ends_at_its_total_with_empty_documents_among_them(tmp_path, capsys):
    texts = [f"Story {i}: the dog ran." if i % 4 else "" for i in range(80)]  # 20 empty
    (tmp_path / "stories.txt").write_text("\n".join(texts) + "\n")
    assert (
        pt.main(["--dataset", str(tmp_path / "stories.txt"), "--out", str(tmp_path / "out")]) == 0
    )
    bars = re.findall(r"(train|validation):\s+\d+%\|[^|]*\| (\d+)/(\d+)", capsys.readouterr().err)
    last = {split: (int(done), int(total)) for split, done, total in bars}  # each bar's last state
    assert last == {"train": (80 - 1, 80 - 1), "validation": (1, 1)}, bars  # rows read, of rows


def test_a_validation_split_too_small_for_ten_windows_is_a_warning_naming_val_fraction(
    tmp_path, capsys
):
    data = make_dataset(tmp_path / "in", MANY)  # validation carved: 1 document of 60
    assert pt.main(["--dataset", str(data), "--out", str(tmp_path / "a")]) == 0
    tokens = {
        s: read_sidecar(tmp_path / "a" / f"{s}.npy")["n_tokens"] for s in ("train", "validation")
    }
    assert tokens["validation"] < 10 * 256 + 1
    counts = f"validation holds {tokens['validation']:,} tokens, train {tokens['train']:,}"
    few = "fewer than 2,561 tokens, 10 windows of 256 tokens (the quick start's seq_len)"
    fix = "raise --val-fraction (now 0.005) to carve more of train"
    err = capsys.readouterr().err.splitlines()
    assert f"warning: {counts}: {few}; {fix}" in err
    long_story = "The dog ran to the park and back again. " * 100  # about 1,000 tokens
    own = make_dataset(tmp_path / "own", MANY, [long_story] * 3)  # its own validation split
    assert pt.main(["--dataset", str(own), "--out", str(tmp_path / "b")]) == 0
    assert read_sidecar(tmp_path / "b" / "validation.npy")["n_tokens"] >= 10 * 256 + 1
    assert "warning:" not in capsys.readouterr().err
    make_dataset(own, MANY, [long_story])  # its own, too small: nothing to carve more of
    assert pt.main(["--dataset", str(own), "--out", str(tmp_path / "b")]) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert few in warning and "--val-fraction" not in warning
