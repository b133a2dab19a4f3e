"""prepare_tokens.py --verify: an audit of token files that exist, one line a file.

    python python_files/prepare_tokens.py --verify 'data/tinystories/train_*.npy'

Opening a file (open_tokens) checks what a loader needs: the sidecar's fields that are present, of
their JSON type, the layout, the size, and the first and last 64 KiB against the sidecar. The audit
adds what no open pays for: every field write_tokens writes, present, their values and the prep
step's own fields, the file's name against its
sidecar's, the sha256 of the whole file, a scan of every id, and, over the files given together, a
shard set with shards missing or repeated, and a file given twice.
"""

from __future__ import annotations

import glob
import math
import os
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from npy_datasets import (
    JSON_TYPES,
    WRITTEN_FIELDS,
    TokenFileError,
    open_tokens,
    read_sidecar,
    sidecar_path,
)
from prep_settings import EOT_PLACEMENTS

OPTIONAL_FIELDS = {  # the prep step writes these; write_tokens, only when it is given them
    "eot_placement": str,
    "settings_fingerprint": str,
    "shard": dict,
}
SHOWN = 10  # missing shard indices a line lists, at most


@dataclass
class Checked:
    """One file given to verify, and what the audit found."""

    path: str  # as given, or as a glob matched it
    problems: list[str] = field(default_factory=list)  # none: the file passed every check
    sidecar: dict[str, Any] = field(default_factory=dict)  # {} unless it follows the schema

    def line(self) -> str:
        """'<path>: OK', or the path and every problem found."""
        if not self.problems:
            return f"{self.path}: OK"
        return f"{self.path}: " + "; ".join(self.problems)


def verify_files(patterns: Sequence[str]) -> list[Checked]:
    """Every check, on the files that patterns (paths or globs) name, in their order."""
    checked = []
    first_seen: dict[str, str] = {}  # realpath -> the path it was first given as
    for pattern in patterns:
        if not pattern:  # '' names no file: the current folder, whose sidecar would be '.json'
            checked.append(Checked("''", ["is an empty path: give token files, or a quoted glob"]))
            continue
        paths = _expand(pattern)
        if not paths:
            checked.append(Checked(pattern, ["matches no file"]))
        for path in paths:
            real = os.path.realpath(path)
            if real in first_seen:
                twice = f"is given twice (the same file as {first_seen[real]})"
                checked.append(Checked(path, [twice]))
                continue
            first_seen[real] = path
            checked.append(_check_file(path))
    _check_shard_sets(checked)
    return checked


def _expand(pattern: str) -> list[str]:
    """pattern itself, or where no file has that name, the token files it matches as a glob,
    sorted (not the sidecars, *.json, as the loaders' globs)."""
    if os.path.lexists(pattern) or not glob.has_magic(pattern):
        return [pattern]
    return sorted(p for p in glob.glob(pattern) if not p.endswith(".json"))


def _check_file(path: str) -> Checked:
    """One file's checks, each needing the one before: its sidecar's schema, open_tokens with
    verify=True (layout, size, probe, sha256 against the sidecar), then a scan of every id."""
    try:
        meta = read_sidecar(path)  # its JSON, format and format_version
    except TokenFileError as error:
        return Checked(path, [_without_path(error, path)])
    if meta is None:
        if not os.path.lexists(path):
            return Checked(path, ["does not exist"])
        if os.path.isdir(path):
            return Checked(path, [f"is a folder: give its token files, as '{path}/*.npy'"])
        if path.endswith(".json"):
            return Checked(path, [f"is a sidecar: give its token file, {path[:-5]}"])
        return Checked(path, ["has no sidecar to check against"])
    missing = next((key for key in WRITTEN_FIELDS if key not in meta), None)
    if missing is not None:  # the loader reads a file without them; the prep step writes all
        needs = f"it needs a JSON {JSON_TYPES[WRITTEN_FIELDS[missing]]}"
        fix = "write the file again (rerun the prep step, or write_tokens)"
        side = str(sidecar_path(path))
        return Checked(path, [f"{side!r}: {missing!r} is missing: {needs}; {fix}"])
    problem = _sidecar_problem(meta)
    if problem is not None:
        return Checked(path, [problem])
    if meta["file"] != os.path.basename(path):  # a glob serves files in the order of their names
        moved = "renamed, or its sidecar copied from another file: rename it back or write it again"
        problem = f"its sidecar describes {meta['file']!r}, not {os.path.basename(path)!r}"
        return Checked(path, [f"{problem} ({moved})"], meta)
    try:
        tokens = open_tokens(path, verify=True)
    except (TokenFileError, OSError) as error:
        return Checked(path, [_without_path(error, path)], meta)
    top = int(tokens.max())  # one read of every id
    if top >= meta["n_vocab"]:
        outside = f"outside the vocabulary (n_vocab {meta['n_vocab']})"
        return Checked(path, [f"holds the id {top}, {outside}"], meta)
    if top != meta["max_token_id"]:
        says = f"its sidecar's max_token_id is {meta['max_token_id']}"
        return Checked(path, [f"holds ids up to {top}, but {says}"], meta)
    return Checked(path, [], meta)


def _without_path(error: Exception, path: str) -> str:
    """error's message without the path it starts with: the line names the file already."""
    text = str(error)
    for start in (f"{path!r}: ", f"{path!r} "):
        text = text.removeprefix(start)
    return text


def _sidecar_problem(meta: dict[str, Any]) -> str | None:
    """The first way meta breaks the sidecar's schema, or None (read_sidecar checked the types
    of the fields write_tokens writes; _check_file that each is present)."""
    for key, kind in OPTIONAL_FIELDS.items():
        if key in meta and type(meta[key]) is not kind:  # exact: a JSON true is a bool
            json_type = {**JSON_TYPES, dict: "object"}[kind]
            return f"its sidecar's {key!r} is {meta[key]!r:.60}, not a JSON {json_type}"
    if meta.get("eot_placement", EOT_PLACEMENTS[0]) not in EOT_PLACEMENTS:
        return (
            f"its sidecar's eot_placement {meta['eot_placement']!r} is not one of {EOT_PLACEMENTS}"
        )
    shape = meta["shape"]
    if len(shape) not in (1, 2) or not all(type(n) is int and n > 0 for n in shape):
        return f"its sidecar's shape {shape!r:.60} is not 1 or 2 positive integers"
    if meta["n_tokens"] != math.prod(shape):
        return f"its sidecar's n_tokens {meta['n_tokens']} is not the size of its shape {shape}"
    for key in ("eot_id", "max_token_id"):
        if not 0 <= meta[key] < meta["n_vocab"]:
            outside = f"outside the vocabulary (n_vocab {meta['n_vocab']})"
            return f"its sidecar's {key} {meta[key]} is {outside}"
    if "shard" in meta:
        index = meta["shard"].get("index")
        count = meta["shard"].get("count")
        if type(index) is not int or type(count) is not int or not 0 <= index < count:
            place = "needs integers index and count, 0 <= index < count"
            return f"its sidecar's shard {meta['shard']!r:.80} {place}"
    return None


def _check_shard_sets(checked: list[Checked]) -> None:
    """Add the problems of each shard set to its files: shards written together share a
    settings_fingerprint and a count, and each index from 0 to count - 1 is given once."""
    sets: dict[Any, list[Checked]] = defaultdict(list)
    for file in checked:
        if "shard" in file.sidecar:
            sets[file.sidecar.get("settings_fingerprint")].append(file)
    for files in sets.values():
        counts = sorted({file.sidecar["shard"]["count"] for file in files})
        if len(counts) > 1:
            for file in files:
                file.problems.append(f"its shard set says {counts} shards: from different runs")
            continue
        given = Counter(file.sidecar["shard"]["index"] for file in files)
        missing = _missing(given, counts[0])
        for file in files:
            index = file.sidecar["shard"]["index"]
            if missing is not None:
                not_given = f"shards {missing} of that set are not given"
                file.problems.append(
                    f"shard {index} of {counts[0]} written together, but {not_given}"
                )
            if given[index] > 1:
                same = [other.path for other in files if other.sidecar["shard"]["index"] == index]
                also = ", ".join(path for path in same if path != file.path)
                file.problems.append(f"shard {index} is given twice: {also} has its index too")


def _missing(given: Counter, count: int) -> str | None:
    """The indices below count that given lacks, for a message (the first SHOWN, then how many
    in all), or None. A count of a billion costs no more than a count of ten."""
    n_missing = count - len(given)
    if n_missing == 0:
        return None
    first = islice((index for index in range(count) if index not in given), SHOWN)
    shown = ", ".join(map(str, first))
    if n_missing > SHOWN:
        return f"{shown}, ... ({n_missing:,} in all)"
    return shown
