"""Local text files: which files of a folder are read, and one streaming reader per format.

Every data file of a folder is read, or the run stops with one line naming the files it would
leave out. Each reader streams its file and names the file and line (or row) of any fault; the
datasets library reads none of them, so no cached copy can stand in for the file itself.
"""

from __future__ import annotations

import bz2
import contextlib
import csv
import functools
import gzip
import io
import json
import lzma
import os
import re
import sys
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import data_files
from tiktoken_ext.openai_public import ENDOFTEXT  # GPT-2's end-of-text token, as text

from prep_settings import CHUNK_DOCS

FILE_FORMATS = {  # a data file's suffix -> its format
    ".txt": "text",
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
}
OPENERS = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}  # compressed files, by suffix
HIDDEN = (".", "__")  # names that datasets skips in a folder, and so does the prep step
OWN_OUTPUTS = (".npy.json", ".bin.json")  # the prep step's sidecars: never a document
BOM = "\ufeff"  # a UTF-8 byte order mark, as Notepad starts a file: not part of the text
SEPARATOR = ENDOFTEXT.encode()  # a .txt line of only this ends a story (TinyStoriesV2-GPT4-*.txt)
SEPARATORS = ("auto", "endoftext", "line", "blank-line")  # how a .txt is cut into documents
LINE_END = re.compile(
    r"\r?\n\Z"
)  # cut off each document read: "\r\n" or "\n" (a lone "\r" is text)
LINE_ENDINGS = re.compile(rb"\r\n?")  # Windows' "\r\n" and old Macs' lone "\r": read as "\n"
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # from a JSON escape such as "\ud800": not text
READ_ERRORS = (OSError, EOFError, ValueError, csv.Error, zlib.error, lzma.LZMAError)
TEXT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)  # Arrow text


@dataclass
class Place:
    """Where a reader is in its file, for the error message: the line (or the row) read last."""

    unit: str = "line"
    number: int = 0

    def where(self, error: BaseException) -> str:
        if not self.number:
            return ""
        if isinstance(error, ValueError):  # this line holds the fault
            return f" {self.unit} {self.number}"
        return f" after {self.unit} {self.number}"  # the file ended or broke after it


def file_format(name: str) -> str | None:
    """The format of a data file by its name ("json" for stories.jsonl.gz), or None."""
    path = Path(name)
    if path.suffix in OPENERS:
        path = path.with_suffix("")
    return FILE_FORMATS.get(path.suffix.lower())


# ---- A folder: every data file read, or the files left out named ----------------------------
def folder_files(folder: Path) -> dict[str, list[str]]:
    """The data files of folder by split, named as datasets names splits (train*, validation*,
    val*, test*, ...; every file in train when no name says). Hidden files and the prep step's
    own sidecars are skipped; any other file that would be left out stops the run."""
    found = _data_files_under(folder)
    if not found:
        expected = ", ".join(FILE_FORMATS)
        raise ValueError(f"{folder} holds no data files; expected {expected} (or .gz, .bz2, .xz)")
    try:
        patterns = data_files.get_data_patterns(str(folder))
    except data_files.EmptyDatasetError:  # data files, but none datasets would read
        patterns = {}
    named = data_files.DataFilesDict.from_patterns(patterns, base_path=str(folder))
    real = {os.path.realpath(path): path for path in found}
    by_split = {}
    for split, paths in named.items():
        kept = [real[os.path.realpath(p)] for p in paths if os.path.realpath(p) in real]
        if kept:
            by_split[str(split)] = kept
    _check_folder_files(folder, by_split, found)
    return by_split


def _data_files_under(folder: Path) -> list[str]:
    """Every data file under folder, in name order; hidden ones and sidecars left out."""
    found = []
    for root, folders, files in os.walk(folder):
        folders[:] = sorted(name for name in folders if not name.startswith(HIDDEN))
        for name in sorted(files):
            if not name.startswith(HIDDEN) and not name.endswith(OWN_OUTPUTS) and file_format(name):
                found.append(os.path.abspath(os.path.join(root, name)))
    return found


def _check_folder_files(folder: Path, by_split: dict[str, list[str]], found: list[str]) -> None:
    """Refuse a folder whose split files leave a data file out, mix formats, or mix levels."""
    read = {path for paths in by_split.values() for path in paths}
    left_out = [path for path in found if path not in read]
    if left_out:
        names = _names(folder, left_out)
        rule = "a split's files are named after it: train*, validation*, test*"
        raise ValueError(f"{folder}: {names} in no split ({rule}); rename or move them")
    formats = sorted({file_format(path) for path in found})
    if len(formats) > 1:
        kinds = "; ".join(
            f"{kind}: {_names(folder, [p for p in found if file_format(p) == kind])}"
            for kind in formats
        )
        only_one = "keep one format, or pass one file as --dataset"
        raise ValueError(
            f"{folder} holds data files of {len(formats)} formats ({kinds}); {only_one}"
        )
    top = os.path.abspath(folder)
    nested = [path for path in found if os.path.dirname(path) != top]
    if nested and len(nested) < len(found):
        one = "move them, or pass one folder as --dataset"
        where = f"in a subfolder as well as beside them ({_names(folder, nested)})"
        raise ValueError(f"{folder} holds data files {where}; {one}")


def _names(folder: Path, paths: list[str]) -> str:
    """Up to three paths, relative to folder, and how many more."""
    shown = ", ".join(os.path.relpath(path, folder) for path in paths[:3])
    if len(paths) > 3:
        return f"{shown} and {len(paths) - 3} more"
    return shown


# ---- Reading: one file after another, in tables of CHUNK_DOCS documents -----------------------
def read_documents(
    paths: list[str],
    column: str,
    separators: Mapping[str, str] | None = None,
    keep_line_endings: bool = False,
) -> Iterator[pa.Table]:
    """The documents of local data files, in order, in tables of up to CHUNK_DOCS rows; a fault is
    a ValueError naming the file and its line (or row). separators: each .txt file's separator
    (txt_separators); a file it does not name is read as "auto". keep_line_endings: a .txt's
    "\\r\\n" and lone "\\r" stay as they are (False: read as "\\n", as Python's text mode does)."""
    for path in paths:
        separator = "auto" if separators is None else separators.get(path, "auto")
        texts = _file_documents(path, column, separator, keep_line_endings)
        batch = list(islice(texts, CHUNK_DOCS))
        if not batch:
            raise ValueError(f"cannot read {path}: it holds no documents")
        while batch:
            yield pa.table({column: batch})
            batch = list(islice(texts, CHUNK_DOCS))


def _file_documents(
    path: str, column: str, separator: str = "auto", keep_line_endings: bool = False
) -> Iterator[str]:
    """The documents of one file, read by its format."""
    reader = READERS[file_format(path)]
    if reader is _txt_documents:  # the one format with no column: cut by separator instead
        reader = functools.partial(
            _txt_documents, separator=separator, keep_line_endings=keep_line_endings
        )
    with _reading(path) as (f, place):
        yield from reader(f, column, place)


@contextlib.contextmanager
def _reading(path: str) -> Iterator[tuple[BinaryIO, Place]]:
    """path opened as bytes (decompressed by its suffix), and where in it the reader is; a read
    error inside is a ValueError naming the file and its line (or row)."""
    place = Place()
    try:
        with OPENERS.get(Path(path).suffix, open)(path, "rb") as f:
            yield f, place
    except READ_ERRORS as error:  # ValueError: bad JSON or UTF-8, a non-text cell, ...
        raise ValueError(f"cannot read {path}{place.where(error)}: {error}") from error


# ---- .txt: cut at <|endoftext|> lines, at blank lines, or at every line end --------------------
def txt_separators(
    paths: list[str], separator: str, folder: Path, keep_line_endings: bool = False
) -> dict[str, str]:
    """Each .txt file's separator: separator itself; for "auto", endoftext where the file holds a
    line of only <|endoftext|>, else line. The files auto reads a line a document that have blank
    lines between lines of text are named in one note on stderr (folder: names are relative to it).
    keep_line_endings: a lone "\\r" ends no line (as read_documents)."""
    if separator not in SEPARATORS:
        raise ValueError(f"separator must be one of {', '.join(SEPARATORS)}; got {separator!r}")
    chosen = {}
    noted = []
    for path in paths:
        if file_format(path) != "text":
            continue
        if separator != "auto":
            chosen[path] = separator
            continue
        with _reading(path) as (f, place):
            lines = _byte_lines(f, keep_line_endings)
            chosen[path], has_blank_lines = _auto_separator(lines, place)
        if has_blank_lines:
            noted.append(path)
    if noted:
        print(_blank_line_note(_names(folder, noted), len(noted)), file=sys.stderr, flush=True)
    return chosen


def _auto_separator(lines: Iterator[bytes], place: Place) -> tuple[str, bool]:
    """("endoftext", False) when a line is only <|endoftext|>; else "line", and whether the lines
    have a blank line between two lines of text: paragraphs, perhaps, and a note costs nothing."""
    text_seen = False  # a line of text so far
    blank_after_text = False  # a blank line since the last line of text
    blank_between = False  # a blank line between two lines of text
    for line in lines:
        place.number += 1
        content = line.strip().removeprefix(BOM.encode())
        if content == SEPARATOR:
            return "endoftext", False
        if content:
            blank_between = blank_between or blank_after_text
            text_seen = True
            blank_after_text = False
        else:
            blank_after_text = text_seen
    return "line", blank_between


def _blank_line_note(names: str, count: int) -> str:
    """One line: these files are read a line a document, and the option that reads paragraphs."""
    has, read = ("has", "is") if count == 1 else ("have", "are")
    what = f"{has} blank lines between lines of text but {read} read a document per line"
    options = (
        "pass --separator blank-line for a document per paragraph, or --separator line to keep "
        "this without the note"
    )
    return f"note: {names} {what}; {options}"


def _txt_documents(
    f: BinaryIO,
    column: str,
    place: Place,
    separator: str = "auto",
    keep_line_endings: bool = False,
) -> Iterator[str]:
    """A .txt cut by separator: "endoftext" at its lines of only <|endoftext|>, "blank-line" at its
    runs of blank lines (each document keeping its inner line breaks), "line" at every line end.
    "auto": endoftext if the file holds such a line, else line. Lines end at \\n, \\r\\n and a
    lone \\r, each read as \\n; keep_line_endings: at \\n alone, and a lone \\r is text."""
    if separator == "auto":
        separator, _ = _auto_separator(_byte_lines(f, keep_line_endings), Place())
        f.seek(0)  # the pass above stops at the first separator line
    lines = _lines(_byte_lines(f, keep_line_endings), place)
    if separator == "endoftext":
        return _stories(lines)
    if separator == "blank-line":
        return _paragraphs(lines)
    return (LINE_END.sub("", line) for line in lines)


def _byte_lines(f: BinaryIO, keep_line_endings: bool) -> Iterator[bytes]:
    """f's lines, each ending in "\\n" (the last maybe not): "\\r\\n" and a lone "\\r" end a
    line too, read as "\\n", unless keep_line_endings (then only "\\n" ends one)."""
    for line in f:  # a binary file's lines end at b"\\n" only
        if keep_line_endings or b"\r" not in line:
            yield line
        else:
            yield from LINE_ENDINGS.sub(b"\n", line).splitlines(keepends=True)


def _lines(lines: Iterator[bytes], place: Place) -> Iterator[str]:
    """lines decoded as UTF-8, the first without a byte order mark; place counts them."""
    for line in lines:
        place.number += 1
        text = line.decode("utf-8")
        if place.number == 1:
            text = text.removeprefix(BOM)
        yield text


def _stories(lines: Iterator[str]) -> Iterator[str]:
    """The text between separator lines; a story's last line break belongs to its separator."""
    story = []
    for line in lines:
        if line.strip().removeprefix(BOM) == ENDOFTEXT:  # as _auto_separator finds them
            yield LINE_END.sub("", "".join(story))
            story = []
        else:
            story.append(line)
    if "".join(story).strip():  # text after the last separator: a story unless only spaces
        yield LINE_END.sub("", "".join(story))


def _paragraphs(lines: Iterator[str]) -> Iterator[str]:
    """The runs of lines between blank lines (empty, or only whitespace): one or more blank lines
    end a document, so none is empty; a paragraph's last line break belongs to the blank line."""
    paragraph = []
    for line in lines:
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            yield LINE_END.sub("", "".join(paragraph))
            paragraph = []
    if paragraph:
        yield LINE_END.sub("", "".join(paragraph))


def _json_documents(f: BinaryIO, column: str, place: Place) -> Iterator[str]:
    """JSON Lines (an object a line), or one JSON list of objects, read whole as datasets reads it
    (TinyStories' data00.json ... data49.json)."""
    head = f.read(4096).removeprefix(BOM.encode()).lstrip()
    f.seek(0)
    if head.startswith(b"["):
        place.unit = "row"
        for row in json.load(f):
            place.number += 1
            yield _json_text(row, column)
        return
    for line in f:
        place.number += 1
        if line.strip():
            yield _json_text(_json_row(line), column)


def _json_row(line: bytes) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:  # its "line 1 column 9" would contradict the file's line
        raise ValueError(f"invalid JSON ({error.msg} at column {error.colno})") from None


def _json_text(row: Any, column: str) -> str:
    if not isinstance(row, dict) or column not in row:
        available = sorted(row) if isinstance(row, dict) else row
        raise ValueError(f"column {column!r} not found; available: {available!r:.60}")
    return _text(row[column], column)


def _csv_documents(f: BinaryIO, column: str, place: Place) -> Iterator[str]:
    """A .csv with a header row; every cell is text, digits too: no type is guessed."""
    rows = csv.DictReader(io.TextIOWrapper(f, encoding="utf-8-sig", newline=""))
    if rows.fieldnames is None:  # an empty file
        return
    place.number = rows.line_num
    if column not in rows.fieldnames:
        raise ValueError(f"column {column!r} not found; available: {rows.fieldnames}")
    for row in rows:
        place.number = rows.line_num  # a quoted cell may span lines: its last one
        yield _text(row[column], column)


def _parquet_documents(f: BinaryIO, column: str, place: Place) -> Iterator[str]:
    """A .parquet file, read a batch of CHUNK_DOCS rows at a time, its text column only."""
    place.unit = "row"
    table = pq.ParquetFile(f)
    check_text_column(table.schema_arrow, column)
    for batch in table.iter_batches(batch_size=CHUNK_DOCS, columns=[column]):
        for value in batch.column(0).to_pylist():
            place.number += 1
            yield _text(value, column)


def check_text_column(schema: pa.Schema, column: str) -> None:
    """Refuse a table whose column is missing or holds something other than text."""
    if column not in schema.names:
        raise ValueError(f"column {column!r} not found; available: {schema.names}")
    kind = schema.field(column).type
    values = kind.value_type if pa.types.is_dictionary(kind) else kind  # categorical: its values
    if not any(is_text(values) for is_text in TEXT_TYPES):
        raise ValueError(f"column {column!r} holds {kind}, not text")


def _text(value: Any, column: str) -> str:
    """value, if it is a document's text; else a ValueError that says what is there instead."""
    if not isinstance(value, str):
        every = "every document must be a string"
        raise ValueError(f"column {column!r} is {value!r:.40}, not text; {every}")
    if value.isascii():
        return value
    surrogate = LONE_SURROGATE.search(value)
    if surrogate is not None:
        found = ascii(surrogate[0])
        raise ValueError(f"column {column!r} holds a lone surrogate ({found}), which is not text")
    return value


READERS = {  # a format -> its reader: (binary file, column, place) -> documents
    "text": _txt_documents,
    "json": _json_documents,
    "csv": _csv_documents,
    "parquet": _parquet_documents,
}
