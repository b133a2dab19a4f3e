"""prepare_tokens.py --verify: every deep check of token files that exist, one line a file, exit
status 0 when every file passes and 1 otherwise. Each check has a file that fails it, and a good
set passes them all.

The files are tiny arange files written by the module's write_tokens (token i at position i),
or a prep run's output; a sidecar is made wrong by editing its JSON.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import npy_datasets as nd
import prepare_tokens as pt
from conftest import MANY, ROOT, make_dataset, prepare
from prep_outputs import sidecar_path
from prep_verify import OPTIONAL_FIELDS

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")

N_VOCAB = 100


def token_file(folder: Path, name: str = "tokens.npy", n: int = 10, **fields) -> Path:
    """An arange token file with its sidecar: ids 0 .. n - 1 (every id below N_VOCAB)."""
    path = folder / name
    ids = np.arange(n) % N_VOCAB
    nd.write_tokens(path, ids, n_vocab=N_VOCAB, tokenizer="test:arange", eot_id=0, **fields)
    return path


def edit_sidecar(path: Path, drop: str | None = None, **changes) -> None:
    """Change fields of path's sidecar, or drop one, as a hand edit or an old writer would."""
    side = sidecar_path(path)
    meta = json.loads(side.read_text())
    meta.pop(drop, None)
    side.write_text(json.dumps({**meta, **changes}))


def shard_set(folder: Path, count: int, fingerprint: str = "a" * 64) -> list[Path]:
    """count shards written together: one settings_fingerprint, shard indices 0 .. count - 1."""
    folder.mkdir(exist_ok=True)
    return [
        token_file(
            folder,
            f"train_{index:06d}.npy",
            settings_fingerprint=fingerprint,
            shard={"index": index, "count": count},
        )
        for index in range(count)
    ]


def verify(capsys, *patterns) -> tuple[int, list[str]]:
    """The exit status of prepare_tokens.py --verify patterns, and its lines."""
    code = pt.main(["--verify", *map(str, patterns)])
    return code, capsys.readouterr().out.splitlines()


# --- a good set ---------------------------------------------------------------------------------


def test_a_prep_runs_files_pass_every_check_with_exit_status_0(tmp_path):
    data, out = make_dataset(tmp_path / "in", MANY, MANY[:3]), tmp_path / "out"
    shards = prepare(data, out, splits=["train"], shard_tokens=300)["train"].shards
    one = prepare(data, tmp_path / "one", splits=["validation"], layout="llmc")["validation"].path
    assert len(shards) > 2
    command = [sys.executable, "python_files/prepare_tokens.py", "--verify"]
    pattern = str(out / "train_*.npy")  # quoted, as a user passes it: verify expands it
    proc = subprocess.run(
        [*command, pattern, str(one)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [f"{path}: OK" for path in (*shards, one)]


def test_a_file_write_tokens_wrote_with_only_its_arguments_passes(tmp_path, capsys):
    path = token_file(tmp_path)  # no eot_placement, n_docs or settings: what a user's loop writes
    assert "eot_placement" not in nd.read_sidecar(path)
    assert verify(capsys, path) == (0, [f"{path}: OK"])


def test_verify_writes_nothing_and_takes_no_other_option(tmp_path, capsys):
    path = token_file(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert verify(capsys, path) == (0, [f"{path}: OK"])
    with pytest.raises(SystemExit) as usage:
        pt.main(["--verify", str(path), "--force"])
    assert usage.value.code == 2
    assert "--verify checks files and writes nothing: leave out --force" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


# --- the sidecar's schema -----------------------------------------------------------------------

WRONG_TYPE = {  # a value of another JSON type for each field: true is a bool, never an integer
    str: 1,
    int: True,
    list: "10",
    dict: [0],
}
JSON_NAME = {str: "string", int: "integer", list: "array", dict: "object"}
MODULE_CHECKS = ("format", "format_version")  # read_sidecar refuses these in words of their own
REWRITE = "write the file again (rerun the prep step, or write_tokens)"  # a fix that works


@pytest.mark.parametrize("key", [*nd.WRITTEN_FIELDS, *OPTIONAL_FIELDS])
def test_each_field_of_the_wrong_json_type_fails(tmp_path, capsys, key):
    kind = {**nd.WRITTEN_FIELDS, **OPTIONAL_FIELDS}[key]
    good, bad = token_file(tmp_path, "good.npy"), token_file(tmp_path, "bad.npy")
    edit_sidecar(bad, **{key: WRONG_TYPE[kind]})
    code, lines = verify(capsys, good, bad)
    assert code == 1 and lines[0] == f"{good}: OK"
    wrong = f"{key!r} is {WRONG_TYPE[kind]!r}, not a JSON {JSON_NAME[kind]}"
    if key in MODULE_CHECKS:
        assert re.fullmatch(rf"{re.escape(str(bad))}: .*(format|format_version).*", lines[1])
    elif key in OPTIONAL_FIELDS:  # the prep step's own fields: the audit's check
        assert lines[1] == f"{bad}: its sidecar's {wrong}"
    else:  # what write_tokens writes: read_sidecar's check, on every open
        assert lines[1] == f"{bad}: {str(sidecar_path(bad))!r}: {wrong}; {REWRITE}"


@pytest.mark.parametrize("key", [k for k in nd.WRITTEN_FIELDS if k not in MODULE_CHECKS])
def test_each_missing_field_fails_verify_and_the_file_still_opens(tmp_path, capsys, key):
    """--verify keeps the full schema; the reader needs none of these fields (issue 34)."""
    path = token_file(tmp_path)
    edit_sidecar(path, drop=key)
    kind = JSON_NAME[nd.WRITTEN_FIELDS[key]]
    said = f"{str(sidecar_path(path))!r}: {key!r} is missing: it needs a JSON {kind}"
    assert verify(capsys, path) == (1, [f"{path}: {said}; {REWRITE}"])
    assert nd.open_tokens(path).size > 0


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"eot_id": N_VOCAB}, f"its sidecar's eot_id {N_VOCAB} is outside the vocabulary"),
        ({"max_token_id": N_VOCAB}, f"its sidecar's max_token_id {N_VOCAB} is outside the"),
        ({"eot_id": -1}, "its sidecar's eot_id -1 is outside the vocabulary"),
        ({"n_tokens": 11}, "its sidecar's n_tokens 11 is not the size of its shape [10]"),
        ({"shape": [10, True]}, "its sidecar's shape [10, True] is not 1 or 2 positive integers"),
        ({"shard": {"index": 2, "count": 2}}, "its sidecar's shard {'index': 2, 'count': 2} needs"),
        ({"shard": {"count": 2}}, "its sidecar's shard {'count': 2} needs integers index and"),
    ],
)
def test_a_field_out_of_range_fails(tmp_path, capsys, changes, problem):
    path = token_file(tmp_path)
    edit_sidecar(path, **changes)
    code, lines = verify(capsys, path)
    assert code == 1 and lines[0].startswith(f"{path}: {problem}"), lines


# --- the file against its sidecar: open_tokens, the sha256, every id ----------------------------


def test_damage_past_the_probe_fails_the_sha256(tmp_path, capsys):
    path = token_file(tmp_path, n=200_000)  # 400 KB: the middle lies past the first and last 64 KiB
    raw = bytearray(path.read_bytes())
    raw[200_000] ^= 1
    path.write_bytes(bytes(raw))
    nd.open_tokens(path)  # an open compares the size and the probe only: it passes
    code, lines = verify(capsys, path)
    assert code == 1 and re.fullmatch(rf"{re.escape(str(path))}: .*sha256.*", lines[0]), lines


def test_a_file_cut_short_fails_its_open(tmp_path, capsys):
    path = token_file(tmp_path)
    path.write_bytes(path.read_bytes()[:-2])
    code, lines = verify(capsys, path)  # the words are open_tokens' own
    assert code == 1 and lines[0].startswith(f"{path}: ") and lines[0] != f"{path}: OK", lines


def test_ids_above_the_sidecars_max_token_id_fail_the_scan(tmp_path, capsys):
    path = token_file(tmp_path)  # ids 0 .. 9
    edit_sidecar(path, max_token_id=5)
    problem = "holds ids up to 9, but its sidecar's max_token_id is 5"
    assert verify(capsys, path) == (1, [f"{path}: {problem}"])


def test_an_id_outside_the_vocabulary_fails_the_scan(tmp_path, capsys):
    path = token_file(tmp_path)  # ids 0 .. 9, written with n_vocab 100
    edit_sidecar(path, n_vocab=8, max_token_id=7, eot_id=0)
    problem = "holds the id 9, outside the vocabulary (n_vocab 8)"
    assert verify(capsys, path) == (1, [f"{path}: {problem}"])


def test_missing_files_sidecars_and_globs_each_get_a_line(tmp_path, capsys):
    no_sidecar = token_file(tmp_path, "raw.npy")
    sidecar_path(no_sidecar).unlink()
    bad_json = token_file(tmp_path, "bad_json.npy")
    sidecar_path(bad_json).write_text("{")
    code, lines = verify(
        capsys, tmp_path / "missing.npy", tmp_path / "none_*.npy", no_sidecar, bad_json
    )
    assert code == 1 and lines[:3] == [
        f"{tmp_path / 'missing.npy'}: does not exist",
        f"{tmp_path / 'none_*.npy'}: matches no file",
        f"{no_sidecar}: has no sidecar to check against",
    ]
    named = lines[3].startswith(f"{bad_json}: '{sidecar_path(bad_json)}' ")  # read_sidecar's words
    assert named and "JSON" in lines[3], lines


def test_a_folder_a_sidecar_and_a_glob_over_both_are_told_apart(tmp_path, capsys):
    path = token_file(tmp_path, "train.npy")
    side = sidecar_path(path)
    code, lines = verify(capsys, tmp_path, side, tmp_path / "*")
    assert code == 1 and lines == [
        f"{tmp_path}: is a folder: give its token files, as '{tmp_path}/*.npy'",
        f"{side}: is a sidecar: give its token file, {path}",
        f"{path}: OK",  # the glob's match: the sidecar beside it is skipped
    ]


# --- files given together: shard sets, a file given twice ---------------------------------------


def test_a_shard_set_with_shards_missing_fails_each_of_its_files(tmp_path, capsys):
    shards = shard_set(tmp_path, 4)
    other = shard_set(tmp_path / "other", 1, fingerprint="b" * 64)  # a set of its own: whole
    code, lines = verify(capsys, shards[0], shards[2], *other)
    not_given = "of 4 written together, but shards 1, 3 of that set are not given"
    assert code == 1 and lines == [
        f"{shards[0]}: shard 0 {not_given}",
        f"{shards[2]}: shard 2 {not_given}",
        f"{other[0]}: OK",
    ]
    assert verify(capsys, *shards) == (0, [f"{path}: OK" for path in shards])


def test_a_long_list_of_missing_shards_is_cut_short(tmp_path, capsys):
    first = token_file(tmp_path, shard={"index": 0, "count": 10**9})
    code, lines = verify(capsys, first)
    missing = "shards 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (999,999,999 in all) of that set"
    written = "shard 0 of 1000000000 written together"
    assert code == 1 and lines == [f"{first}: {written}, but {missing} are not given"]


def test_a_repeated_shard_index_and_a_disagreeing_count_fail(tmp_path, capsys):
    shards = shard_set(tmp_path, 3)
    copy = tmp_path / "copy" / shards[1].name
    copy.parent.mkdir()
    for source in (shards[1], sidecar_path(shards[1])):  # the same shard, twice, as two files
        shutil.copy(source, copy.parent)
    code, lines = verify(capsys, *shards, copy)
    assert code == 1 and lines == [
        f"{shards[0]}: OK",
        f"{shards[1]}: shard 1 is given twice: {copy} has its index too",
        f"{shards[2]}: OK",
        f"{copy}: shard 1 is given twice: {shards[1]} has its index too",
    ]
    edit_sidecar(shards[2], shard={"index": 2, "count": 4})  # one run said 3 shards, another 4
    code, lines = verify(capsys, *shards)
    says = "its shard set says [3, 4] shards: from different runs"
    assert code == 1 and [line.split(": ", 1)[1] for line in lines] == [says] * 3


def test_a_file_given_twice_fails_the_second_time(tmp_path, capsys):
    path = token_file(tmp_path)
    link = tmp_path / "link.npy"
    link.symlink_to(path)
    os.symlink(sidecar_path(path), sidecar_path(link))
    code, lines = verify(capsys, path, tmp_path / "*.npy")  # the glob finds it, and its link
    assert code == 1 and lines == [
        f"{path}: OK",
        f"{link}: is given twice (the same file as {path})",
        f"{path}: is given twice (the same file as {path})",
    ]


def test_a_prep_runs_incomplete_or_reordered_shards(tmp_path, capsys):
    """The check the module's loader made once (a warning) now lives here."""
    data = make_dataset(tmp_path / "in", MANY, MANY[:3])
    shards = prepare(data, tmp_path / "out", shard_tokens=300, splits=["train"])["train"].shards
    k = len(shards)
    assert k > 4
    code, lines = verify(capsys, shards[0], shards[2])
    not_given = f"of {k} written together, but shards 1, 3, 4"
    assert code == 1 and [line.split(": ", 1)[1][: len(not_given) + 8] for line in lines] == [
        f"shard 0 {not_given}",
        f"shard 2 {not_given}",
    ]
    in_any_order = list(reversed(shards))
    assert verify(capsys, *in_any_order) == (0, [f"{p}: OK" for p in in_any_order])


# --- issue 33: names, eot_placement, an empty pattern ---------------------------------------------


def test_a_renamed_shard_and_a_sidecar_copied_beside_another_file_fail(tmp_path, capsys):
    """The set is complete by index, but the glob serves shards in name order: a shard renamed
    (2 to 99) fails, and so does a sidecar copied beside another file of the same ids."""
    shards = shard_set(tmp_path / "set", 3)
    for source in (shards[2], sidecar_path(shards[2])):
        source.rename(str(source).replace("000002", "000099"))
    renamed = tmp_path / "set" / "train_000099.npy"
    code, lines = verify(capsys, tmp_path / "set" / "train_*.npy")
    moved = "(renamed, or its sidecar copied from another file: rename it back or write it again)"
    said = f"its sidecar describes 'train_000002.npy', not 'train_000099.npy' {moved}"
    assert code == 1 and lines == [f"{shards[0]}: OK", f"{shards[1]}: OK", f"{renamed}: {said}"]
    one, other = token_file(tmp_path, "one.npy"), token_file(tmp_path, "other.npy")
    shutil.copy(sidecar_path(one), sidecar_path(other))  # the same ids: every byte check passes
    code, lines = verify(capsys, other)
    said = f"its sidecar describes 'one.npy', not 'other.npy' {moved}"
    assert code == 1 and lines == [f"{other}: {said}"]


def test_an_eot_placement_that_is_neither_prepend_nor_append_fails(tmp_path, capsys):
    good = token_file(tmp_path, "good.npy", eot_placement="append")
    bad = token_file(tmp_path, "bad.npy", eot_placement="middle")
    said = "its sidecar's eot_placement 'middle' is not one of ('prepend', 'append')"
    assert verify(capsys, good, bad) == (1, [f"{good}: OK", f"{bad}: {said}"])


def test_an_empty_pattern_is_answered_with_one_line(tmp_path, capsys):
    path = token_file(tmp_path)
    said = "'': is an empty path: give token files, or a quoted glob"
    assert verify(capsys, "", path) == (1, [said, f"{path}: OK"])
    command = [sys.executable, "python_files/prepare_tokens.py", "--verify", ""]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, said + "\n", "")
