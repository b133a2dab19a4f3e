"""What prepare_tokens.py reads: local files and folders, save_to_disk, the Hub (offline),
carving validation from train, the errors an input can raise, and bad parameters.

Tiny local fixtures, no network. Catalogue items 29, 35, 36 and 86 (tests/bad_inputs.md).
"""

import json
import os
import re
import subprocess
import sys
import threading

import datasets
import numpy as np
import pytest

import prep_sources
import prepare_tokens as pt
from conftest import (
    DOCS,
    EOT,
    MANY,
    NO_NETWORK,
    ROOT,
    STORIES,
    decoded,
    make_dataset,
    prep_input,
    prepare,
    write_jsonl,
)

# datasets' Arrow copies of the fixtures go to a temporary folder (conftest.datasets_cache)
pytestmark = pytest.mark.usefixtures("datasets_cache")


# --- local files, folders and saved datasets ----------------------------------------------------


def test_texts_come_in_dataset_order_and_local_files_are_streamed(tmp_path):
    whole = pt.load_text_splits(make_dataset(tmp_path / "in", MANY, MANY[:3]))["train"]
    carved = pt.load_text_splits(
        make_dataset(tmp_path / "in2", MANY), val_fraction=0.25
    )  # sorted, scattered rows
    assert callable(whole.documents) and not isinstance(
        whole.documents, datasets.Dataset
    )  # the file itself, streamed
    assert list(prep_sources.iter_texts(whole)) == MANY
    rows = {name: carved[name].rows for name in ("train", "validation")}
    assert (len(rows["train"]), len(rows["validation"])) == (45, 15)
    assert sorted([*rows["train"], *rows["validation"]]) == list(range(60))
    for name in ("train", "validation"):
        assert np.all(np.diff(rows[name]) > 0)
        assert list(prep_sources.iter_texts(carved[name])) == [MANY[i] for i in rows[name]]
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
        assert list(prep_sources.iter_texts(split)) == list(docs["text"])
    picked = pt.TextSplit(
        "train",
        in_memory.select([0, 1]),
        "text",
        {"dataset": "inline", "split": "train"},
        np.array([1]),
    )
    assert list(prep_sources.iter_texts(picked)) == [MANY[1]]


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
    texts = [t for t in DOCS if t]  # an empty document is skipped
    if kind in ("parquet_folder", "save_to_disk"):
        assert (train, validation) == (texts, val)
        assert results["train"].meta["source"]["from_split"] == "train"
    else:  # a single file is the train split: validation is carved from it
        expected = texts + val if kind == "jsonl_gz_file" else [t for t in lines if t]
        assert sorted(train + validation) == sorted(expected) and len(validation) == 1
        assert results["validation"].meta["source"]["val_fraction"] == pt.VAL_FRACTION
    assert re.fullmatch(
        r"sha256:[0-9a-f]{64}", results["train"].meta["source"]["input_fingerprint"]
    )


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


# --- carving validation from train --------------------------------------------------------------


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


# --- input problems -----------------------------------------------------------------------------


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
    expected = (
        f"cannot read {tmp_path / 'pq' / 'train.parquet'}: column 'text' holds int64, not text"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
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
    monkeypatch.setattr(datasets, "load_from_disk", lambda path: empty)
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


# --- the Hub, offline ---------------------------------------------------------------------------


def test_hub_probe_honours_offline_mode(monkeypatch):
    tried = threading.Event()

    def connect(*args, **kwargs):  # the probe's one way out: recorded, and refused at once
        tried.set()
        raise OSError("a test: no network")

    monkeypatch.setattr(prep_sources.socket, "create_connection", connect)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)  # only the variable says it
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert prep_sources.hub_reachable() is False
    assert not tried.is_set()  # no probe at all
    monkeypatch.delenv("HF_HUB_OFFLINE")  # online: the probe connects (here: refused)
    assert prep_sources.hub_reachable(timeout=0.01) is False
    assert tried.wait(60)  # the probe's thread got to connect: the check above could see one


def test_unreachable_hub_fails_at_once_naming_offline_mode_and_the_sample(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError(
            "load_dataset called: it would retry the unreachable Hub for half a minute"
        )

    monkeypatch.setattr(prep_sources, "hub_reachable", lambda timeout=3.0: False)
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


# Runs a script as `python script args` does, and reports on stderr every name lookup and
# connection it tries (Python's audit events), so a test can see that it tried none.
REPORT_NETWORK = """import os, runpy, sys
def report(event, args):
    if event in ("socket.getaddrinfo", "socket.connect"):
        print(f"network: {event} {args!r}", file=sys.stderr, flush=True)
sys.addaudithook(report)
script = sys.argv.pop(1)
sys.path[0] = os.path.dirname(os.path.abspath(script))
runpy.run_path(script, run_name="__main__")
"""


def test_cli_offline_hub_name_fails_without_trying_the_network_naming_the_sample(tmp_path):
    """Offline, a Hub name fails at once: nothing is tried that datasets would retry for 30 s."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), **NO_NETWORK)
    for var in (
        "HF_DATASETS_CACHE",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_DATASETS_OFFLINE",
    ):
        env.pop(var, None)  # everything under the empty HF_HOME: no cache can answer
    command = [
        sys.executable,
        "-c",
        REPORT_NETWORK,
        "python_files/prepare_tokens.py",
        "--dataset",
        "roneneldan/TinyStories",
        "--out",
        str(tmp_path / "out"),
    ]
    # 60 s: a hang; the run takes about 2 s beside two busy processes
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "network:" not in proc.stderr, proc.stderr
    assert "Hugging Face Hub is unreachable" in proc.stderr
    assert (
        "--dataset materials/tinystories_sample" in proc.stderr and "omit --dataset" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "out").exists()


# --- parameters ---------------------------------------------------------------------------------


def test_prep_parameters(tmp_path):
    missing = (
        tmp_path / "no_such_dataset"
    )  # loading it would raise FileNotFoundError: the checks come first
    cases = [
        ({"num_threads": 0}, ValueError, "num_threads must be at least 1, got 0"),
        ({"num_threads": True}, TypeError, "num_threads must be an int, got bool True"),
        ({"chunk_docs": -1}, ValueError, "chunk_docs must be at least 1, got -1"),
        ({"chunk_docs": 2.5}, TypeError, "chunk_docs must be an int, got float 2.5"),
        (
            {"val_fraction": float("nan")},
            ValueError,
            "val_fraction must be strictly between 0 and 1, got nan",
        ),
        ({"val_fraction": float("inf")}, ValueError, "got inf"),
        ({"val_fraction": 0.0}, ValueError, "got 0.0"),
        ({"val_fraction": -0.1}, ValueError, "got -0.1"),
        ({"val_fraction": "0.1"}, TypeError, "val_fraction must be a number, got '0.1'"),
        ({"seed": -1}, ValueError, "seed must be at least 0, got -1"),
        ({"seed": 1.5}, TypeError, "seed must be an int, got float 1.5"),
        ({"layout": "csv"}, ValueError, "layout must be one of ('npy', 'bin', 'llmc'), got 'csv'"),
        ({"splits": []}, ValueError, "splits must be one or more non-empty names, got []"),
        (
            {"splits": ["train", "train"]},
            ValueError,
            "splits must be distinct, got ['train', 'train']",
        ),
    ]
    for kwargs, error, expected in cases:
        with pytest.raises(error) as info:
            pt.prepare(missing, tmp_path / "out", progress=False, **{"num_threads": 1, **kwargs})
        assert type(info.value) is error and expected in str(info.value), (kwargs, str(info.value))
    data = prep_input(tmp_path / "in", STORIES[:4], STORIES[4:6])
    with pytest.raises(
        ValueError, match=re.escape(f"output folder {str(data)!r} is inside the input dataset")
    ):
        pt.prepare(data, data, progress=False)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in data.iterdir()) == [
        "train.jsonl",
        "validation.jsonl",
    ]


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
        (["--seed", "-1"], "seed must be at least 0, got -1"),
        (["--splits", "../x"], "split name '../x' cannot be a file name"),
        (["--layout", "csv"], "argument --layout: invalid choice: 'csv'"),
        (["--format", "npy"], "unrecognized arguments: --format npy"),
        (["--shard-tokens", "0"], "shard_tokens must be at least 1, got 0"),
        (["--shard-tokens", "1e6"], "argument --shard-tokens: invalid int value: '1e6'"),
        (["--eot-placement", "after"], "argument --eot-placement: invalid choice: 'after'"),
    ],
)
def test_cli_rejects_bad_parameters(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        pt.main(argv)
    assert exc.value.code == 2  # a usage error, before anything is loaded
    assert f"prepare_tokens.py: error: {message}" in capsys.readouterr().err


def test_shard_tokens_must_be_a_positive_int(tmp_path):
    for bad in (0, -5, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="shard_tokens"):
            pt.prepare(
                tmp_path / "no_such_dataset", tmp_path / "out", shard_tokens=bad, progress=False
            )
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="more than 6 digits"):
        pt.shard_path(tmp_path, "train", 10**6)


# --- issue 19/20: what a carve leaves out, nanoGPT's split name ---------------------------------


def test_train_alone_from_a_carved_input_says_what_it_leaves_out(tmp_path, capsys):
    data = make_dataset(tmp_path / "in", MANY)  # no validation split: one is carved from train
    assert pt.main(["--dataset", str(data), "--out", str(tmp_path / "a"), "--splits", "train"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("train: 59 docs"), lines
    assert lines[1] == (
        "note: train leaves out the documents carved off as validation (--val-fraction 0.005, "
        "--seed 1337); add validation to --splits to write them"
    )
    assert pt.main(["--dataset", str(data), "--out", str(tmp_path / "b")]) == 0
    assert "note:" not in capsys.readouterr().out  # both splits written: nothing left out


def test_splits_named_val_are_the_validation_split_as_nanogpt_names_it(tmp_path, enc):
    carved = make_dataset(tmp_path / "one", MANY)  # train only: val is carved from it
    results = prepare(carved, tmp_path / "a", splits=["train", "val"])
    validation = prepare(carved, tmp_path / "b")["validation"]
    assert (tmp_path / "a" / "val.npy").read_bytes() == validation.path.read_bytes()
    assert results["val"].meta["source"]["from_split"] == "train"
    both = make_dataset(tmp_path / "two", MANY, MANY[:3])  # a validation split: val reads it
    command = ["--dataset", str(both), "--out", str(tmp_path / "c"), "--splits", "train", "val"]
    assert pt.main([*command, "--layout", "bin", "--eot-placement", "append"]) == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir() if p.suffix == ".bin") == [
        "train.bin",
        "val.bin",
    ]  # the two files nanoGPT's train.py reads
    nanogpt = [i for text in MANY[:3] for i in (*enc.encode_ordinary(text), EOT)]
    assert np.fromfile(tmp_path / "c" / "val.bin", dtype=np.uint16).tolist() == nanogpt
    with pytest.raises(ValueError, match=r"split 'test' not found"):
        prepare(both, tmp_path / "d", splits=["test"])
