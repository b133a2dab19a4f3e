"""The prep step's settings: their defaults, the rules each argument follows, and one checker.

prepare_tokens.py and the prep_*.py files beside it read their defaults here, and each public
function checks its arguments with check_prep_arguments before any slow work starts.
"""

from __future__ import annotations

import numbers
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPLITS = ("train", "validation")  # TinyStories' two splits
VALIDATION_SPLIT = "validation"  # the split carved from CARVE_SOURCE when a dataset has none
VALIDATION_NAMES = (VALIDATION_SPLIT, "val")  # either asks for it: nanoGPT's train.py reads val.bin
CARVE_SOURCE = "train"  # documents for a missing validation split come from here
VAL_FRACTION = 0.005  # share of train documents carved off as validation (at least one)
SEED = 1337  # seeds the carve permutation, so every run carves the same documents
ENCODING = "gpt2"  # tiktoken encoding: GPT-2's 50,257-token BPE, from the bundled files
EOT_PLACEMENT = "prepend"  # EOT opens each document: a window starting at one sees a story's start
EOT_PLACEMENTS = (EOT_PLACEMENT, "append")  # or EOT ends each document, as nanoGPT writes it
LAYOUTS = ("npy", "bin", "llmc")  # .npy with a header, raw .bin (nanoGPT), llm.c's .bin shards
CHUNK_DOCS = 1024  # documents per thread-pool task and per read: amortises overhead, bounds memory
SPLIT_NAME = re.compile(r"\w[\w.-]*")  # becomes a file name: no '/', '\\', ':', NUL or leading '.'
OPTIONAL = ("num_threads", "shard_tokens")  # None means: every usable core, one file per split

PREP_RULES: dict[str, Any] = {  # an int range, bool (True or False), or a tuple of choices
    "seed": range(0, 2**63),
    "n_vocab": range(1, 2**32 + 1),  # uint32 holds ids up to 2**32 - 1
    "chunk_docs": range(1, 2**63),
    "num_threads": range(1, 2**31),
    "shard_tokens": range(1, 2**63),
    "layout": LAYOUTS,
    "eot_placement": EOT_PLACEMENTS,
    "force": bool,
    "progress": bool,
    "keep_line_endings": bool,
}


def check_prep_arguments(**values: Any) -> None:
    """Refuse the first bad argument with a ValueError or TypeError that names it. splits and
    val_fraction follow rules of their own; num_threads and shard_tokens may be None."""
    if "splits" in values:
        _check_split_names(values.pop("splits"))
    if "val_fraction" in values:
        _check_val_fraction(values.pop("val_fraction"))
    for name in OPTIONAL:
        if values.get(name, 0) is None:
            del values[name]
    for name, value in values.items():
        if name not in PREP_RULES:
            raise TypeError(f"no rule for the argument {name!r}: add one to PREP_RULES")
        _check_argument(name, value, PREP_RULES[name])


def _check_argument(name: str, value: Any, rule: Any) -> None:
    """A TypeError for the wrong kind of value, a ValueError for one out of range or not among
    the choices. A numpy int is an int, a bool never is."""
    if isinstance(rule, range):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if value < rule.start:
            raise ValueError(f"{name} must be at least {rule.start}, got {value}")
        if value >= rule.stop:
            raise ValueError(f"{name} must be at most {rule.stop - 1}, got {value}")
    elif rule is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    elif not any(type(value) is type(choice) and value == choice for choice in rule):
        raise ValueError(f"{name} must be one of {rule}, got {value!r}")


def split_names(splits: Sequence[str] | str) -> tuple[str, ...]:
    """splits as a tuple of names: one name alone is one split."""
    if isinstance(splits, str):
        return (splits,)
    return tuple(splits)


def _check_split_names(splits: Sequence[str] | str) -> None:
    names = split_names(splits)
    if not names or not all(isinstance(name, str) and name for name in names):
        raise ValueError(f"splits must be one or more non-empty names, got {splits!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"splits must be distinct, got {list(names)}")
    bad = next((name for name in names if not SPLIT_NAME.fullmatch(name)), None)
    if bad is not None:  # "../x" or "/x" would leave the output folder
        allowed = "use letters, digits, '_', '.' and '-', not first '.'"
        raise ValueError(f"split name {bad!r} cannot be a file name: {allowed}")


def _check_val_fraction(val_fraction: Any) -> None:
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, numbers.Real):
        raise TypeError(f"val_fraction must be a number, got {val_fraction!r}")
    if not 0 < val_fraction < 1:  # nan and inf fail it too
        raise ValueError(f"val_fraction must be strictly between 0 and 1, got {val_fraction}")


def usable_cores() -> int:
    """The cores this process may run on: sched_getaffinity respects taskset and container
    limits; macOS and Windows lack it."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def display_path(path: str | os.PathLike) -> str:
    """path for a message: relative to the working folder when inside it, else absolute."""
    full = Path(path).resolve()
    here = Path.cwd().resolve()
    if full.is_relative_to(here):
        return str(full.relative_to(here))
    return str(full)
