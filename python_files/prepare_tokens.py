"""Tokenize a text dataset with any tiktoken encoding (GPT-2's by default); write a token file
per split, and a JSON sidecar.

    python python_files/prepare_tokens.py                                  # data/tinystories_sample
    python python_files/prepare_tokens.py --dataset roneneldan/TinyStories  # data/tinystories

    prepare(out="data/tinystories_sample")  # from Python: one PreparedSplit per split

Per split: <out>/<split>.npy (or --layout bin, llmc) and its JSON sidecar, written atomically, the
sidecar last; a split whose files still match sidecars that record the same settings is skipped.
This file holds prepare() and the command line; the files beside it do the parts, in the order
the data flows:
    prep_settings.py   defaults, the rules of every argument, one checker
    prep_sources.py    the text: a Hub dataset, a save_to_disk folder or local files; the carve
    prep_files.py      local files: which files of a folder are read, and a reader per format
    prep_tokenize.py   GPT-2's encoding, and the thread pool that tokenizes in input order
    prep_outputs.py    token files, shards and sidecars; the output folder's lock
    prep_verify.py     --verify: every check of token files that exist
The README's "The full TinyStories" lists the inputs, "Shards and other formats" the layouts.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiktoken
from tqdm import tqdm

from npy_datasets import FORMAT_VERSION
from prep_files import FILE_FORMATS, OPENERS, SEPARATORS
from prep_outputs import (
    PER_FILE,
    DocumentCount,
    SplitOutput,
    check_shard_names,
    check_writable,
    complete_sidecars,
    kept_sidecars,
    make_staging_folder,
    output_lock,
    publish,
    remove_temp_files,
    shard_path,
    token_dtype,
    write_files,
)
from prep_settings import (
    CHUNK_DOCS,
    DEFAULT_SPLITS,
    ENCODING,
    EOT_PLACEMENT,
    EOT_PLACEMENTS,
    LAYOUTS,
    REPO_ROOT,
    SEED,
    VAL_FRACTION,
    VALIDATION_NAMES,
    check_prep_arguments,
    display_path,
    split_names,
    usable_cores,
)
from prep_sources import (
    SAMPLE_DATASET,
    HubUnreachableError,
    SkipCount,
    TextSplit,
    carve_validation,
    document_texts,
    load_text_splits,
    resolve_dataset,
)
from prep_tokenize import gpt2_encoding, load_encoding, tokenize_documents
from prep_verify import verify_files

__all__ = [
    "TextSplit",
    "PreparedSplit",
    "HubUnreachableError",
    "gpt2_encoding",  # notebooks 01 and 06 call it, and carve_validation, as pt.*
    "load_text_splits",
    "carve_validation",
    "tokenize_documents",
    "shard_path",
    "prepare_split",
    "prepare",
    "main",
]

UNCHECKED = ("dataset", "out", "column", "encoding", "separator")  # checked where used
SMALL_VALIDATION_WINDOWS = 10  # fewer windows than this make a validation loss mostly noise
QUICKSTART_SEQ_LEN = 256  # the seq_len of quickstart.py and the notebooks


@dataclass(frozen=True)
class PreparedSplit:
    """One split's token file, its sidecar, and whether this run wrote it. For a sharded split,
    path is the glob of its shards (NpyTokensDataset takes it), shards lists them, and meta holds
    the fields they share with totals over all of them (n_tokens, n_docs, max_token_id)."""

    split: str
    path: Path
    meta: dict[str, Any]
    written: bool  # False when up-to-date files were kept
    shards: tuple[Path, ...] = ()  # empty for one file

    def summary(self) -> str:
        """One line for the terminal: split, documents, tokens, dtype, path and what happened."""
        status = "written" if self.written else "up to date"
        if self.shards:
            count = len(self.shards)
            status = f"{count:,} shard{'s' if count != 1 else ''}, {status}"
        docs = f"{self.meta['n_docs']:,} docs"
        skipped = self.meta["source"].get("n_empty_docs_skipped", 0)
        if skipped:  # else every document read was written
            read = self.meta["n_docs"] + skipped
            docs += f" ({read:,} read, {skipped:,} empty skipped)"
        tokens = f"{self.meta['n_tokens']:,} tokens, {self.meta['dtype']}"
        return f"{self.split}: {docs}, {tokens} -> {self._shown_path()} ({status})"

    def _shown_path(self) -> str:
        if not self.shards:
            return display_path(self.path)
        folder = glob.escape(display_path(self.shards[0].parent))  # a glob, as path is
        return os.path.join(folder, self.path.name)


# ---- One split: kept when up to date, else tokenized, written and published ----------------
def prepare_split(
    split: TextSplit,
    out: str | os.PathLike,
    enc: tiktoken.Encoding,
    *,
    layout: str = "npy",
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    force: bool = False,
    progress: bool = True,
    shard_tokens: int | None = None,
    eot_placement: str = EOT_PLACEMENT,
) -> PreparedSplit:
    """Tokenize one split into <out>/<split>.<layout> and its sidecar, unless up-to-date files
    exist. With shard_tokens, into shard_path()s of shard_tokens ids each (the last: the rest),
    staged and swapped in only when all are written."""
    check_prep_arguments(
        splits=split.name,
        layout=layout,
        num_threads=num_threads,
        chunk_docs=chunk_docs,
        force=force,
        progress=progress,
        shard_tokens=shard_tokens,
        eot_placement=eot_placement,
    )
    output = _split_output(split, Path(out), enc, layout, shard_tokens, eot_placement)
    if output.sharded:
        check_shard_names(output)  # even with force: never replace another split's file
    kept = None if force else kept_sidecars(output)
    if kept is not None:
        return _result(output, kept, written=False)  # writes nothing: a read-only folder will do
    output.folder.mkdir(parents=True, exist_ok=True)
    with output_lock(output.folder) as locked:  # another run writing here: wait for it
        if locked:
            remove_temp_files(output.folder)  # under the lock, a dead run's
        kept = None if force else kept_sidecars(output)  # the run waited for may have made them
        if kept is not None:
            return _result(output, kept, written=False)
        check_writable(output.folder)
        threads = usable_cores() if num_threads is None else num_threads
        metas = _write_split(split, output, enc, threads, chunk_docs, progress)
    return _result(output, metas, written=True)


def _split_output(
    split: TextSplit,
    out: Path,
    enc: tiktoken.Encoding,
    layout: str,
    shard_tokens: int | None,
    eot_placement: str,
) -> SplitOutput:
    """Where split goes, and every setting that decides its bytes: not the dataset's spelling,
    the threads or the chunk size."""
    settings = {key: value for key, value in split.source.items() if key != "dataset"}
    settings["tokenizer"] = f"tiktoken:{enc.name}"
    settings["n_vocab"] = enc.n_vocab
    settings["eot_id"] = enc.eot_token
    settings["eot_placement"] = eot_placement
    settings["empty_docs"] = "skipped"  # since issue 19; older files held them, and are rebuilt
    settings["dtype"] = token_dtype(enc.n_vocab).name
    settings["layout"] = layout
    settings["format_version"] = FORMAT_VERSION
    if shard_tokens is not None:
        settings["shard_tokens"] = int(shard_tokens)
    return SplitOutput(out, split.name, layout, shard_tokens, settings)


def _write_split(
    split: TextSplit,
    output: SplitOutput,
    enc: tiktoken.Encoding,
    num_threads: int,
    chunk_docs: int,
    progress: bool,
) -> list[dict[str, Any]]:
    """Tokenize split into output's files in a staging folder, then swap them in with sidecars."""
    skipped = SkipCount()
    texts = document_texts(split, skipped)
    placement = output.settings["eot_placement"]
    chunks = tokenize_documents(
        texts, enc, num_threads=num_threads, chunk_docs=chunk_docs, eot_placement=placement
    )
    total = (
        len(split.rows) if split.rows is not None else getattr(split.documents, "num_rows", None)
    )
    bar = tqdm(total=total, desc=split.name, unit="doc", file=sys.stderr, disable=not progress)

    def show_read(written: int) -> None:  # total counts rows read, the empty ones too: so does this
        bar.update(skipped.read_docs - bar.n)

    count = DocumentCount(enc.eot_token, show_read)
    staging = make_staging_folder(output.folder, split.name)
    try:
        with bar, contextlib.closing(chunks):  # closing: stop the worker threads if writing fails
            written = write_files(output, chunks, count, staging)
        source = {**split.source, "n_empty_docs_skipped": skipped.empty_docs}
        metas = complete_sidecars(output, written, source, staging)
        publish(output, staging, metas)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return metas


def _result(output: SplitOutput, metas: list[dict[str, Any]], written: bool) -> PreparedSplit:
    """The PreparedSplit of one file, or of shards: the fields they share, and totals."""
    if not output.sharded:
        return PreparedSplit(output.split, output.path, metas[0], written)
    totals = {key: value for key, value in metas[0].items() if key not in PER_FILE}
    totals["n_tokens"] = sum(meta["n_tokens"] for meta in metas)
    totals["n_docs"] = sum(meta["n_docs"] for meta in metas)
    totals["max_token_id"] = max(meta["max_token_id"] for meta in metas)
    shards = tuple(output.folder / meta["file"] for meta in metas)
    return PreparedSplit(output.split, output.path, totals, written, shards)


# ---- Every split of a dataset --------------------------------------------------------------
def prepare(
    dataset: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    *,
    column: str = "text",
    splits: Sequence[str] = DEFAULT_SPLITS,
    val_fraction: float = VAL_FRACTION,
    seed: int = SEED,
    encoding: str = ENCODING,
    layout: str = "npy",
    num_threads: int | None = None,
    chunk_docs: int = CHUNK_DOCS,
    force: bool = False,
    progress: bool = True,
    shard_tokens: int | None = None,
    eot_placement: str = EOT_PLACEMENT,
    separator: str = "auto",
    keep_line_endings: bool = False,
) -> list[PreparedSplit]:
    """Tokenize every requested split of dataset (None: the bundled sample) into out (None:
    data/<name>). shard_tokens: shards of that many tokens (see prepare_split). encoding "gpt2"
    comes from the bundled files, another from tiktoken (see load_encoding). separator: how a
    .txt is cut into documents (load_text_splits). keep_line_endings: "\\r\\n" and a lone "\\r"
    stay in the text (False, the default: each is read as "\\n")."""
    options = {
        "layout": layout,
        "num_threads": num_threads,
        "chunk_docs": chunk_docs,
        "force": force,
        "progress": progress,
        "shard_tokens": shard_tokens,
        "eot_placement": eot_placement,
    }
    checked = dict(splits=splits, val_fraction=val_fraction, seed=seed)
    check_prep_arguments(**checked, keep_line_endings=keep_line_endings, **options)
    name, path = resolve_dataset(dataset)
    out = Path(out) if out is not None else _default_out_dir(name, path)
    _check_out_dir(out, path)
    enc = load_encoding(encoding)
    text_splits = load_text_splits(
        dataset, column, splits, val_fraction, seed, separator, keep_line_endings
    )
    return [prepare_split(text_splits[s], out, enc, **options) for s in split_names(splits)]


def _default_out_dir(name: str, path: Path | None) -> Path:
    """data/<short dataset name> under the repo root: data/tinystories_sample, data/tinystories."""
    if path is not None:
        stem = path.resolve().name
    else:
        stem = name.rstrip("/").split("/")[-1]
    while Path(stem).suffix in (*FILE_FORMATS, *OPENERS):
        stem = Path(stem).stem
    short = re.sub(r"[^a-z0-9._-]+", "_", stem.lower()).strip("._")
    return REPO_ROOT / "data" / (short or "dataset")


def _check_out_dir(out: Path, input_path: Path | None) -> None:
    """Refuse an output folder that lies inside the input, is a file, is a dangling link, or
    cannot be created. An existing folder may be read-only: a run that is up to date writes
    nothing, and one that is not is refused before it tokenizes (check_writable)."""
    if input_path is not None and out.resolve().is_relative_to(input_path.resolve()):
        inside = f"is inside the input dataset {str(input_path)!r}; choose another --out"
        raise ValueError(f"output folder {str(out)!r} {inside}")
    existing = out
    while not existing.exists():
        if existing.is_symlink():  # mkdir would fail only after the dataset loaded
            target = f"is a link to {os.readlink(existing)!r}, which does not exist"
            fix = "create its target or remove the link"
            raise ValueError(f"output folder {str(out)!r}: {str(existing)!r} {target}; {fix}")
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"cannot create output folder {str(out)!r}: {str(existing)!r} is a file")
    if existing != out and not os.access(existing, os.W_OK | os.X_OK):
        unwritable = f"{str(existing)!r} is not writable"
        raise ValueError(f"cannot write to output folder {str(out)!r}: {unwritable}")


# ---- The command line: argparse's dests are prepare()'s keyword arguments -----------------
def _parser() -> argparse.ArgumentParser:
    nanogpt = (
        "nanoGPT's train.bin and val.bin: --layout bin --eot-placement append --splits train val"
    )
    parser = argparse.ArgumentParser(
        prog="prepare_tokens.py", description=__doc__.splitlines()[0], epilog=nanogpt
    )
    _add_input_arguments(parser)
    _add_output_arguments(parser)
    parser.add_argument(
        "--num-threads",
        type=int,
        help=f"tokenizer threads (default: usable cores, here {usable_cores()})",
    )
    parser.add_argument(
        "--chunk-docs",
        type=int,
        default=CHUNK_DOCS,
        help=f"documents per thread task (default: {CHUNK_DOCS})",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild even when the outputs are up to date"
    )
    parser.add_argument(
        "--verify",
        nargs="+",
        metavar="PATH",
        help="write nothing; check these token files (paths or quoted globs) in full: every "
        "sidecar field, the sha256, every id, shard sets. One line a file; exit status 1 on a "
        "problem",
    )
    return parser


def _add_input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        help=f"Hub name or local folder/file; default: {SAMPLE_DATASET}. A .txt is cut into "
        "documents by --separator. Empty documents are skipped and counted",
    )
    parser.add_argument(
        "--separator",
        choices=SEPARATORS,
        default="auto",
        help="how a .txt holds its documents: endoftext, between lines of only <|endoftext|> "
        "(TinyStoriesV2-GPT4-train.txt); line, one a line; blank-line, paragraphs between blank "
        "lines. auto (default): endoftext if the file has such a line, else line",
    )
    parser.add_argument(
        "--keep-line-endings",
        action="store_true",
        help='keep "\\r\\n" and a lone "\\r" in the text as they are (default: each is read as '
        '"\\n", as Python\'s text mode reads them)',
    )
    parser.add_argument("--column", default="text", help="column holding the text (default: text)")
    parser.add_argument(
        "--splits",
        nargs="+",
        default=list(DEFAULT_SPLITS),
        help="splits to write (default: train validation); val is validation, as nanoGPT names it",
    )
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=VAL_FRACTION,
        help=f"validation carved from train if none (default: {VAL_FRACTION})",
    )
    parser.add_argument(
        "--seed", type=int, default=SEED, help=f"seed of that carve (default: {SEED})"
    )
    parser.add_argument(
        "--encoding",
        default=ENCODING,
        help=f"tiktoken encoding (default: {ENCODING}, from the bundled files)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", help="output folder; default: data/<dataset name> in the repo")
    parser.add_argument(
        "--layout",
        choices=LAYOUTS,
        default="npy",
        help="npy (default), bin: nanoGPT's raw ids, or llmc: llm.c's shards with a header",
    )
    parser.add_argument(
        "--eot-placement",
        choices=EOT_PLACEMENTS,
        default=EOT_PLACEMENT,
        help="end-of-text token before each document (default, as llm.c) or after it (nanoGPT)",
    )
    parser.add_argument(
        "--shard-tokens",
        type=int,
        metavar="N",
        help="write each split as shards of N tokens, the last holding the rest. llm.c's loader "
        "stops on any shard (the last one and validation's too) of fewer than "
        "processes * B * T + 1 tokens: check the last shard's size",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: prepare every split and print one summary line per split."""
    parser = _parser()
    args = vars(parser.parse_args(argv))
    patterns = args.pop("verify")
    if patterns is not None:
        return _verify(parser, args, patterns)
    try:  # prepare() checks them too: here a bad one is a usage error (exit status 2)
        check_prep_arguments(**{k: v for k, v in args.items() if k not in UNCHECKED})
    except (TypeError, ValueError) as e:
        parser.error(str(e))
    previous = _exit_on_sigterm()
    try:
        results = prepare(**args)
    except KeyboardInterrupt:
        print("interrupted: unfinished files removed, earlier outputs untouched", file=sys.stderr)
        return 130
    except (ValueError, OSError) as e:  # HubUnreachableError, a missing file, a bad input, ...
        raise SystemExit(f"prepare_tokens.py: error: {e}") from None
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for result in results:
        print(result.summary())
    note = _carve_note(results)
    if note is not None:
        print(note)
    warning = _small_validation_warning(results)
    if warning is not None:
        print(warning, file=sys.stderr)
    return 0


def _verify(parser: argparse.ArgumentParser, args: dict[str, Any], patterns: list[str]) -> int:
    """--verify: every check of the files that patterns name, one line a file; 0 if all pass."""
    given = [key for key, value in args.items() if value != parser.get_default(key)]
    if given:
        option = "--" + given[0].replace("_", "-")
        parser.error(f"--verify checks files and writes nothing: leave out {option}")
    checked = verify_files(patterns)
    for file in checked:
        print(file.line())
    return 0 if all(not file.problems for file in checked) else 1


def _exit_on_sigterm() -> Any:
    """Make `kill` unwind like Ctrl-C (main thread only); return the handler it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _carve_note(results: list[PreparedSplit]) -> str | None:
    """A line when train was carved but its validation split not written: what train leaves out."""
    carved = [r.meta["source"] for r in results if "val_fraction" in r.meta["source"]]
    if not carved or any(source["split"] in VALIDATION_NAMES for source in carved):
        return None
    source = carved[0]
    settings = f"--val-fraction {source['val_fraction']}, --seed {source['seed']}"
    left_out = f"leaves out the documents carved off as validation ({settings})"
    return f"note: {source['split']} {left_out}; add validation to --splits to write them"


def _small_validation_warning(results: list[PreparedSplit]) -> str | None:
    """A line when validation holds fewer than SMALL_VALIDATION_WINDOWS windows of the quick
    start's seq_len: its tokens, train's, and --val-fraction when it was carved."""
    tokens = {r.split: r.meta["n_tokens"] for r in results}
    validation = next((name for name in VALIDATION_NAMES if name in tokens), None)
    need = SMALL_VALIDATION_WINDOWS * QUICKSTART_SEQ_LEN + 1
    if validation is None or tokens[validation] >= need:
        return None
    counts = f"{validation} holds {tokens[validation]:,} tokens"
    if "train" in tokens:
        counts += f", train {tokens['train']:,}"
    windows = f"{SMALL_VALIDATION_WINDOWS} windows of {QUICKSTART_SEQ_LEN} tokens"
    few = f"fewer than {need:,} tokens, {windows} (the quick start's seq_len)"
    source = next(r.meta["source"] for r in results if r.split == validation)
    if "val_fraction" in source:
        fix = f"raise --val-fraction (now {source['val_fraction']}) to carve more of train"
    else:
        fix = "its loss will be noisy; a larger validation split fixes it"
    return f"warning: {counts}: {few}; {fix}"


if __name__ == "__main__":
    sys.exit(main())
