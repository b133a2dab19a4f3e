"""The bad-input and fault catalogue: every one of its 80 items, tried or not applicable.

CATALOGUE below is the one table. Each entry names the tests that try the item (in this file,
test_faults.py, test_scale.py or the older test files), or says why the item does not apply to this
project, or (for future work) which issue it waits for. Where the project deliberately does something
other than the catalogue suggests, `differs` says what, and the tests check the project's own
documented behaviour; `limit` names a case the module cannot catch and why.

tests/bad_inputs.md is this table as a page to read, one row per item: `python tests/test_catalogue.py`
rewrites it, and test_bad_inputs_md_is_the_table keeps the two equal. The README's "What is checked"
figures come from the same table, and test_readme_table_matches_the_catalogue keeps them equal.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import os
import pickle
import random
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import npy_datasets as nd
from code_hazards import code_hazards, project_sources
from conftest import ROOT, write_tokens  # pytest loads conftest first: it sets sys.path

REMAINDERS = ("drop", "pad")  # what a rank does when world_size does not divide an epoch

TOKEN_FILE_ERROR = nd.TokenFileError


# =================================================================================================
# The table.

AREAS = {
    "file": "file / header",
    "params": "parameters",
    "dtype": "dtype / vocabulary",
    "workers": "workers",
    "distributed": "distributed",
    "disk": "interruption / disk",
    "security": "security",
}

OLD = "test_npy_datasets.py::"
PREP = "test_prepare.py::"
FAULTS = "test_faults.py::"
SCALE = "test_scale.py::"


@dataclass(frozen=True)
class Item:
    number: int
    area: str
    title: str  # in this project's words, not the catalogue's
    tests: tuple[str, ...] = ()  # "test_name" (this file) or "file.py::test_name"
    not_applicable: str = ""  # why the item does not apply here
    pending: str = ""  # the issue that will implement it
    differs: str = ""  # where the project deliberately does something else, and what it does
    limit: str = ""  # a case the module cannot catch, and why


CATALOGUE = [
    # --- file / header (loader side) ---
    Item(1, "file", "path does not exist", ("test_item_01_missing_path",)),
    Item(
        2,
        "file",
        "directory, FIFO, device or socket instead of a file (also as the sidecar)",
        ("test_item_02_not_a_regular_file",),
    ),
    Item(3, "file", "empty file", ("test_item_03_empty_file",)),
    Item(
        4,
        "file",
        "wrong magic: text, raw .bin or a pickle named .npy",
        ("test_item_04_bad_magic_never_unpickles",),
    ),
    Item(5, "file", "unknown .npy format version", ("test_item_05_unknown_version",)),
    Item(6, "file", "header cut short", ("test_item_06_truncated_header",)),
    Item(
        7,
        "file",
        "huge declared header length",
        ("test_item_07_oversized_header_refused_before_reading",),
    ),
    Item(
        8,
        "file",
        "header that is not a plain dict literal",
        ("test_item_08_header_must_be_a_literal_dict",),
    ),
    Item(
        9,
        "file",
        "dtype other than uint16",
        (
            "test_item_09_descr_other_than_unsigned_16_or_32",
            "test_item_09_project_accepts_both_widths",
        ),
        differs="uint32 files are accepted as well as uint16 (vocabularies above 65,536 ids)",
    ),
    Item(10, "file", "big-endian ids", ("test_item_10_big_endian",)),
    Item(
        11,
        "file",
        "object, structured or subarray dtype",
        ("test_item_11_object_structured_subarray",),
    ),
    Item(12, "file", "Fortran order", ("test_item_12_fortran_order",)),
    Item(
        13,
        "file",
        "not a 1-D array",
        ("test_item_13_dimensions",),
        differs="2-D files are accepted: each row is a separate sequence and no window crosses rows",
    ),
    Item(
        14,
        "file",
        "declared shape larger than the data",
        ("test_item_14_declared_shape_larger_than_data",),
    ),
    Item(15, "file", "bytes after the declared data", ("test_item_15_trailing_bytes",)),
    Item(16, "file", "negative, zero or overflowing dimensions", ("test_item_16_bad_dimensions",)),
    Item(17, "file", "raw .bin with an odd byte count", ("test_item_17_odd_bin_size",)),
    Item(
        18,
        "file",
        "raw .bin with no sidecar or a disagreeing one",
        ("test_item_18_bin_needs_a_dtype_source",),
        differs="a .bin without sidecar opens when the caller passes dtype= (nanoGPT's files); "
        "the caller is then trusted",
    ),
    Item(
        19,
        "file",
        "file truncated, rewritten or replaced after it was opened",
        (
            FAULTS + "test_file_changed_under_a_running_loader_is_a_clear_error",
            FAULTS + "test_holding_the_array_across_a_truncation_still_dies_of_sigbus",
        ),
        limit="code that keeps ds.memmap() (the array) and reads it after the file shrank in place, or a "
        "truncation landing between the per-batch check and the copy, still dies of SIGBUS: "
        "the kernel signals a read past the end of a mapped file, and only reading without mmap "
        "would avoid it",
    ),
    Item(20, "file", "read-only file", ("test_item_20_read_only_file",)),
    Item(
        21,
        "file",
        "damaged bytes, same size",
        ("test_item_21_bit_rot",),
        differs="the default open checks the header, size and sidecar fields but reads no pages; "
        "verify=True compares the sha256",
    ),
    Item(
        22,
        "file",
        "sidecar that disagrees with its file or with itself",
        ("test_item_22_inconsistent_sidecar",),
        differs="the tokenizer name is recorded but not checked: the loader has no tokenizer to compare it with",
    ),
    Item(23, "file", "unusual but valid paths", ("test_item_23_unusual_paths",)),
    # --- parameters ---
    Item(24, "params", "seq_len of the wrong type or value", ("test_item_24_seq_len",)),
    Item(25, "params", "fewer tokens than one window needs", ("test_item_25_too_few_tokens",)),
    Item(
        26,
        "params",
        "window count and positions",
        (
            OLD + "test_windows_cover_every_token_once",
            OLD + "test_epoch_offset_shifts_every_window_by_one_offset",
        ),
    ),
    Item(
        27,
        "params",
        "out-of-range, negative and odd index types",
        (OLD + "test_index_types", OLD + "test_a_batch_of_bad_indices_names_the_bad_one"),
    ),
    Item(28, "params", "more than 2**31 tokens", ("test_item_28_offsets_past_2_31_tokens",)),
    Item(
        29,
        "params",
        "bad prep parameters",
        (
            "test_item_29_prep_parameters",
            PREP + "test_bad_parameters_fail_before_any_work",
            PREP + "test_output_folder_checks",
        ),
    ),
    Item(
        30,
        "params",
        "output already exists",
        ("test_item_30_existing_output_is_swapped_not_deleted",),
        differs="no overwrite flag: an output whose sidecar records the same settings is kept, any other "
        "is rebuilt beside it and renamed over it; nothing else in the folder is touched",
    ),
    # --- dtype / vocabulary ---
    Item(
        31,
        "dtype",
        "ids of 65,536 and above",
        (
            "test_item_31_wide_vocabulary_gets_uint32",
            PREP + "test_id_that_does_not_fit_the_dtype_raises_instead_of_wrapping",
        ),
        differs="a vocabulary above 65,536 ids gets uint32 files instead of a refusal; an id that does not "
        "fit the chosen dtype is still an error, never a wrap",
    ),
    Item(32, "dtype", "boundary ids round-trip", ("test_item_32_boundary_ids_round_trip",)),
    Item(
        33,
        "dtype",
        "file ids beyond the model's vocabulary",
        ("test_item_33_vocab_size",),
        differs="the check uses the sidecar's max_token_id; a file without a sidecar is scanned once "
        "for its largest id",
    ),
    Item(
        34,
        "dtype",
        "special-token text inside a document",
        (PREP + "test_literal_endoftext_in_text_is_ordinary_text",),
    ),
    Item(
        35,
        "dtype",
        "hostile text",
        ("test_item_35_hostile_text", PREP + "test_none_cell_names_split_row_and_column"),
        differs="a 1 MB document stands in for 100 MB to keep the suite fast; a lone surrogate is replaced "
        "by U+FFFD by tiktoken, and a JSON file holding one is refused by the datasets reader "
        "(its error names the row; the file name appears only in datasets' log)",
    ),
    Item(
        36,
        "dtype",
        "missing or non-text column",
        (
            PREP + "test_missing_column_lists_available_columns",
            PREP + "test_non_text_column_is_refused",
        ),
    ),
    Item(
        37,
        "dtype",
        "mixing dtypes or tokenizers across shards",
        ("test_item_37_one_dtype_and_one_tokenizer_per_dataset",),
        differs="a file without sidecar has no recorded tokenizer and is not compared; make_dataloaders "
        "does not compare train with validation (two datasets, each checked on its own)",
    ),
    Item(
        38,
        "dtype",
        "vocabulary size from the right attribute",
        ("test_item_38_vocab_limits_come_from_the_encoding",),
    ),
    Item(39, "dtype", "what __getitem__ returns", ("test_item_39_windows_are_int64_copies",)),
    # --- workers ---
    Item(
        40,
        "workers",
        "same batches for 0, 1, 2 workers, fork and spawn",
        (OLD + "test_worker_count_and_start_method_do_not_change_batches",),
    ),
    Item(41, "workers", "small pickle for spawn", (OLD + "test_pickles_small_without_the_data",)),
    Item(
        42,
        "workers",
        "persistent workers over several epochs",
        (OLD + "test_worker_count_and_start_method_do_not_change_batches",),
    ),
    Item(
        43,
        "workers",
        "worker killed",
        (FAULTS + "test_a_killed_worker_is_reported_and_nothing_is_left",),
    ),
    Item(
        44,
        "workers",
        "exception inside a worker",
        (FAULTS + "test_a_worker_error_names_the_worker_the_index_and_the_file",),
    ),
    Item(
        45,
        "workers",
        "stalled storage",
        (FAULTS + "test_a_stalled_read_hits_the_dataloader_timeout",),
        differs="make_dataloaders keeps PyTorch's default of no timeout (local files); pass timeout= "
        "to your own DataLoader for network storage",
    ),
    Item(
        46,
        "workers",
        "pinned memory",
        (
            OLD + "test_pinned_batches_reach_the_gpu",
            "test_item_46_no_pinning_and_no_warning_without_a_gpu",
        ),
        differs="the GPU half runs only where CUDA is available; without it make_dataloaders does not pin",
    ),
    Item(
        47,
        "workers",
        "open files and mappings",
        (
            "test_item_47_no_file_opened_per_window",
            "test_item_47_many_shards_under_a_low_open_file_limit",
        ),
    ),
    Item(
        48,
        "workers",
        "early break and deleted loaders",
        (FAULTS + "test_breaking_early_and_deleting_the_loader_stop_the_workers",),
    ),
    Item(49, "workers", "memory over long epochs", ("test_item_49_private_memory_stays_flat",)),
    Item(
        50,
        "workers",
        "randomness only from (seed, epoch, index)",
        ("test_item_50_no_global_random_state",),
    ),
    # --- distributed ---
    Item(
        51,
        "distributed",
        "rank partitions",
        (
            SCALE + "test_ranks_split_each_epoch_disjoint_and_complete",
            SCALE + "test_distributed_sampler_indices_are_windows_of_epoch_zero",
            SCALE + "test_torchrun_ranks_cover_the_epoch_disjointly",
        ),
    ),
    Item(
        52,
        "distributed",
        "set_epoch forgotten",
        (
            "test_item_52_every_iteration_is_the_next_epoch",
            SCALE + "test_iterators_made_and_dropped_do_not_skip_epochs",
        ),
        differs="nothing to forget and so no warning: EpochSampler starts the next epoch at every iteration "
        "(set_epoch only chooses one); torch's DistributedSampler still needs set_epoch, as its "
        "documentation says",
    ),
    Item(
        53,
        "distributed",
        "ranks with different seeds or files",
        (SCALE + "test_torchrun_ranks_that_disagree_all_fail_naming_rank_and_field",),
    ),
    Item(
        54,
        "distributed",
        "a rank reads a file still being written",
        ("test_item_54_a_file_being_written_is_never_read",),
        differs="no rank waits for another's prep (run prep before launching): the file in progress has a "
        "hidden temporary name, so an early rank finds no file, or the previous complete one, which "
        "the ranks' agreement check and the per-read file check refuse",
    ),
    Item(
        55,
        "distributed",
        "fewer windows than ranks, unequal batches",
        (
            "test_item_55_fewer_windows_than_ranks_and_equal_steps",
            SCALE + "test_ranks_split_each_epoch_disjoint_and_complete",
        ),
        differs="equal steps per rank follow from the split (every rank takes the same number of items) and "
        "from the agreement check on files and settings, so len(dataloader) is not all-gathered",
    ),
    Item(
        56,
        "distributed",
        "invalid rank or world size",
        ("test_item_56_invalid_rank_or_world_size",),
    ),
    Item(
        57,
        "distributed",
        "resume with changed settings",
        (
            SCALE + "test_resume_refuses_a_state_from_other_windows",
            SCALE + "test_resume_with_another_batch_or_world_size_continues_at_the_same_position",
            SCALE + "test_resume_in_a_fresh_process_continues_exactly",
        ),
    ),
    Item(
        58,
        "distributed",
        "resume state round trip",
        (
            SCALE + "test_resume_in_a_fresh_process_continues_exactly",
            SCALE + "test_make_dataloaders_resume_across_the_epoch_end",
            SCALE + "test_any_stop_point_is_a_global_position_the_next_run_starts_from",
        ),
        differs="a state saved after an epoch's last batch already points at the next epoch, so the resumed "
        "loop's first iteration is that whole epoch (torchdata's first iteration would be empty)",
    ),
    # --- interruption / disk (prep side) ---
    Item(
        59,
        "disk",
        "SIGKILL during prep",
        (FAULTS + "test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done",),
    ),
    Item(
        60,
        "disk",
        "Ctrl-C or an exception mid-write",
        (
            FAULTS + "test_ctrl_c_at_chunk_k_removes_the_temp_and_keeps_the_old_output",
            PREP + "test_interrupted_write_leaves_nothing_and_keeps_earlier_output",
        ),
    ),
    Item(
        61,
        "disk",
        "crash between the data rename and the sidecar",
        (
            FAULTS + "test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done",
            PREP + "test_crash_between_data_and_sidecar_leaves_no_sidecar",
        ),
        differs="the loader opens a .npy without sidecar (any np.save file is valid input, its header "
        "describes it); prep treats it as unfinished and rebuilds it, and verify=True refuses it",
    ),
    Item(
        62,
        "disk",
        "power loss: fsync, rename, fsync the folder",
        (FAULTS + "test_fsync_rename_fsync_order_with_temp_files_beside_the_target",),
    ),
    Item(
        63,
        "disk",
        "disk full while writing",
        (FAULTS + "test_file_size_limit_fails_clearly_and_keeps_the_old_output",),
        differs="tried with RLIMIT_FSIZE (EFBIG) only: a full tmpfs (ENOSPC) needs mount rights",
    ),
    Item(
        64,
        "disk",
        "no preallocated or sparse output",
        (
            "test_item_64_prep_streams_and_never_preallocates",
            FAULTS + "test_file_size_limit_fails_clearly_and_keeps_the_old_output",
        ),
    ),
    Item(
        65,
        "disk",
        "free-space check before writing",
        not_applicable="declined by design: the token count is known only after tokenizing, and a full "
        "disk fails cleanly with the old output intact (item 63)",
    ),
    Item(
        66,
        "disk",
        "leftovers of an older run",
        (
            FAULTS + "test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done",
            FAULTS + "test_a_zero_filled_file_without_sidecar_is_rebuilt",
            PREP + "test_stale_temp_files_of_dead_runs_are_removed",
        ),
    ),
    Item(
        67,
        "disk",
        "two prep runs on one output",
        (
            FAULTS + "test_two_runs_on_one_output_leave_one_valid_output",
            FAULTS + "test_a_sidecar_deleted_by_another_run_in_between_is_not_an_error",
        ),
        limit="two runs with different settings can leave one run's token file with the other's sidecar; "
        "open_tokens refuses the pair when the size differs, verify=True always",
    ),
    Item(
        68, "disk", "rerun after success", (PREP + "test_rerun_skips_and_changed_settings_rebuild",)
    ),
    Item(
        69,
        "disk",
        "a tokenizer worker dies",
        (FAULTS + "test_a_failing_tokenizer_thread_stops_prep_with_its_error",),
        differs="tokenizing runs on threads, not datasets.map processes: a failure is re-raised by the writer",
    ),
    Item(
        70,
        "disk",
        "temp file on another filesystem",
        (FAULTS + "test_fsync_rename_fsync_order_with_temp_files_beside_the_target",),
    ),
    Item(71, "disk", "output folder not writable", ("test_item_71_unwritable_output_folder",)),
    # --- security ---
    Item(
        72, "security", "no pickle anywhere", ("test_item_72_77_no_pickle_loading_or_remote_code",)
    ),
    Item(
        73,
        "security",
        "malicious object .npy or pickle disguised as .npy",
        ("test_item_04_bad_magic_never_unpickles", "test_item_11_object_structured_subarray"),
    ),
    Item(
        74,
        "security",
        "header parser under attack",
        (
            "test_item_74_header_parser_fuzz",
            "test_item_74_fuzz_reaches_acceptance_and_many_refusals",
            "test_item_07_oversized_header_refused_before_reading",
        ),
    ),
    Item(
        75,
        "security",
        "path traversal through names",
        ("test_item_75_names_cannot_leave_the_output_folder",),
    ),
    Item(
        76,
        "security",
        "symlinks planted at output or temp paths",
        ("test_item_76_planted_symlinks",),
        differs="a symlinked output folder is followed: --out is the user's own choice",
    ),
    Item(
        77,
        "security",
        "remote code from the Hub",
        ("test_item_72_77_no_pickle_loading_or_remote_code",),
        differs="Hub inputs record datasets' fingerprint in the sidecar, not a pinned revision",
    ),
    Item(78, "security", "resume state validated", ("test_item_78_resume_state_is_validated",)),
    Item(
        79,
        "security",
        "tampered tiktoken cache",
        ("test_item_79_tampered_tokenizer_file_is_refused",),
    ),
    Item(
        80,
        "security",
        "file modes",
        ("test_item_80_output_modes_follow_the_umask",),
        differs="the project creates no cache folder of its own, so only the output modes apply",
    ),
]


def _test_ref(ref: str) -> tuple[Path, str]:
    file, _, name = ref.rpartition("::")
    return Path(__file__).with_name(file or Path(__file__).name), name


@functools.lru_cache(maxsize=None)
def _top_level_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
    }


def area_rows() -> list[list[str]]:
    """The README's table: per area the items, how many apply, are tried and are pending, and a status."""
    rows = []
    for key, name in [*AREAS.items(), ("total", "total")]:
        items = [i for i in CATALOGUE if key == "total" or i.area == key]
        apply = [i for i in items if not i.not_applicable]
        tried = [i for i in apply if i.tests]
        pending = [i for i in apply if i.pending]
        differs = sum(bool(i.differs) for i in tried)
        limits = sum(bool(i.limit) for i in tried)
        notes = [
            f"{differs} {'differs' if differs == 1 else 'differ'} by design" if differs else "",
            f"{limits} known {'limit' if limits == 1 else 'limits'}" if limits else "",
            f"{len(pending)} {'waits' if len(pending) == 1 else 'wait'} for {pending[0].pending}"
            if pending
            else "",
        ]
        status = "; ".join(filter(None, ["tried" if tried else "", *notes]))
        rows.append(
            [name, str(len(items)), str(len(apply)), str(len(tried)), str(len(pending)), status]
        )
    return rows


# --- the table's own checks ------------------------------------------------------------------------


def test_table_has_every_number_from_1_to_80_once():
    numbers = [item.number for item in CATALOGUE]
    assert sorted(numbers) == list(range(1, 81)), [n for n, c in Counter(numbers).items() if c > 1]
    assert numbers == sorted(numbers)  # in catalogue order, so a reader can follow along


def test_every_entry_is_tried_pending_or_not_applicable_and_says_why():
    for item in CATALOGUE:
        kinds = [
            bool(item.tests) and not item.pending,
            bool(item.not_applicable),
            bool(item.pending),
        ]
        assert sum(kinds) == 1, (
            f"item {item.number} must have tests, a not_applicable reason or a pending issue"
        )
        assert item.area in AREAS and item.title
        if item.not_applicable or item.pending:
            assert not (item.differs or item.limit), (
                f"item {item.number}: notes belong to tried items"
            )


def test_every_named_test_exists():
    missing = []
    for item in CATALOGUE:
        for ref in item.tests:
            path, name = _test_ref(ref)
            if not path.is_file() or name not in _top_level_tests(path):
                missing.append(f"item {item.number}: {ref}")
    assert not missing, missing


def test_every_item_test_is_in_the_table():
    named = {_test_ref(ref) for item in CATALOGUE for ref in item.tests}
    for file, prefix in (("test_catalogue.py", "test_item_"), ("test_faults.py", "test_")):
        path = Path(__file__).with_name(file)
        orphans = sorted(
            t for t in _top_level_tests(path) if t.startswith(prefix) and (path, t) not in named
        )
        assert not orphans, f"{file}: tests no catalogue entry names: {orphans}"


BAD_INPUTS_MD = ROOT / "tests" / "bad_inputs.md"


def catalogue_markdown() -> str:
    """tests/bad_inputs.md: one row per item, with what the project does about it and the tests that try it."""
    rows = []
    for item in CATALOGUE:
        if item.not_applicable:
            does = f"does not apply: {item.not_applicable}"
        elif item.pending:
            does = f"waits for {item.pending}"
        else:
            does = "; ".join(
                filter(
                    None,
                    [
                        "tried",
                        item.differs and f"by design, {item.differs}",
                        item.limit and f"known limit: {item.limit}",
                    ],
                )
            )
        tests = "<br>".join(f"`{ref}`" for ref in item.tests) or "none"
        cells = [str(item.number), AREAS[item.area], item.title, does, tests]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(
        [
            "# Bad inputs and faults",
            "",
            "Eighty ways for a token loader and its prep step to be fed something wrong or to",
            "fail midway, what the project does about it, and the tests that try it. Written by",
            "`python tests/test_catalogue.py` from the table in `tests/test_catalogue.py`; a test keeps them equal.",
            "A test named without a file lives in `tests/test_catalogue.py`.",
            "",
            "| # | area | bad input or fault | what the project does | tests |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def test_bad_inputs_md_is_the_table():
    assert BAD_INPUTS_MD.is_file(), (
        "tests/bad_inputs.md is missing: run python tests/test_catalogue.py"
    )
    assert BAD_INPUTS_MD.read_text(encoding="utf-8") == catalogue_markdown(), (
        "tests/bad_inputs.md differs from the table: run python tests/test_catalogue.py"
    )
    assert (
        len(re.findall(r"^\| \d+ \|", BAD_INPUTS_MD.read_text(encoding="utf-8"), flags=re.M))
        == len(CATALOGUE)
        == 80
    )


def test_readme_table_matches_the_catalogue():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## What is checked\n(.*?)(?=^## )", readme, flags=re.M | re.S)
    assert section, "README.md has no '## What is checked' section before the next section"
    lines = [line for line in section.group(1).splitlines() if line.startswith("|")]
    assert lines[:2] == [
        "| area | items | apply | tried | pending | status |",
        "|---|---|---|---|---|---|",
    ]
    body = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert body == area_rows(), (
        "README figures differ from the table; expected rows:\n"
        + "\n".join("| " + " | ".join(row) + " |" for row in area_rows())
    )


# =================================================================================================
# Helpers.


def npy_bytes(header: bytes | str, version: bytes = b"\x01\x00", data: bytes = b"") -> bytes:
    """A .npy file from its parts; the length field is 2 bytes for version 1, 4 for versions 2 and 3."""
    header = header.encode("latin1") if isinstance(header, str) else header
    width = 2 if version[0] == 1 else 4
    return b"\x93NUMPY" + version + len(header).to_bytes(width, "little") + header + data


def header_for(descr: str = "'<u2'", fortran: str = "False", shape: str = "(4,)") -> bytes:
    return f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()


def refused(path, expected: type[BaseException], *fragments: str, seq_len=4, **kwargs) -> str:
    """The message of the error NpyTokensDataset raises: exactly `expected`, naming the path and each fragment."""
    with pytest.raises(BaseException) as info:
        nd.NpyTokensDataset(path, seq_len, **kwargs)
    message = str(info.value)
    assert type(info.value) is expected, f"{type(info.value).__name__}: {message}"
    assert repr(str(path)) in message or repr(str(nd.sidecar_path(path))) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


class Payload:
    """Unpickling this creates a marker file: proof that a loader ran pickle."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def in_thread(function, timeout: float = 10.0):
    """function() in a daemon thread: (finished in time, result or exception)."""
    box = {}

    def run():
        try:
            box["result"] = function()
        except BaseException as error:
            box["result"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), box.get("result")


# =================================================================================================
# File / header.


def test_item_01_missing_path(tmp_path, monkeypatch):
    for path in (tmp_path / "nope.npy", tmp_path / "no dir" / "train.bin"):
        refused(path, FileNotFoundError, "does not exist")
    monkeypatch.chdir(tmp_path)
    assert "'relative.npy' does not exist" in refused("relative.npy", FileNotFoundError)


def test_item_02_not_a_regular_file(tmp_path):
    refused(tmp_path, TOKEN_FILE_ERROR, "is a directory", "expected a .npy or .bin file")
    refused("/dev/null", TOKEN_FILE_ERROR, "not a regular file")
    fifo = tmp_path / "fifo.npy"
    os.mkfifo(fifo)
    finished, result = in_thread(lambda: nd.NpyTokensDataset(fifo, 4))
    assert finished, "opening a FIFO blocked"
    assert isinstance(result, nd.TokenFileError) and "not a regular file" in str(result)
    short = Path(tempfile.mkdtemp(prefix="npy"))  # a socket path must stay under 108 bytes
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(short / "s.npy"))
            refused(short / "s.npy", TOKEN_FILE_ERROR, "not a regular file")
    finally:
        shutil.rmtree(short)
    (tmp_path / "linked.npy").symlink_to(tmp_path)
    refused(tmp_path / "linked.npy", TOKEN_FILE_ERROR, "is a directory")

    good = write_tokens(tmp_path / "good.npy", np.arange(100, dtype=np.uint16), sidecar=False)
    side = nd.sidecar_path(good)
    os.mkfifo(side)  # the sidecar is read too: a FIFO there must not block either
    try:
        finished, result = in_thread(lambda: nd.NpyTokensDataset(good, 4))
        assert finished, "a FIFO sidecar blocked"
        assert isinstance(result, nd.TokenFileError)
        assert f"sidecar {str(side)!r} is not a regular file" in str(result)
    finally:
        if not finished:  # release the blocked reader
            os.close(os.open(side, os.O_WRONLY | os.O_NONBLOCK))
    side.unlink()
    side.mkdir()
    assert "is not a regular file" in refused(good, TOKEN_FILE_ERROR)


def test_item_03_empty_file(tmp_path):
    for name in ("empty.npy", "empty.bin"):
        (tmp_path / name).touch()
        refused(tmp_path / name, TOKEN_FILE_ERROR, "is empty (0 bytes)", dtype=np.uint16)


def test_item_04_bad_magic_never_unpickles(tmp_path):
    marker = tmp_path / "unpickled"
    cases = {
        "text.npy": b"token ids, one per line\n1\n2\n3\n",
        "pickle.npy": pickle.dumps(Payload(marker)),
        "raw.npy": np.arange(100, dtype=np.uint16).tobytes(),  # a nanoGPT .bin renamed
    }
    for name, raw in cases.items():
        (tmp_path / name).write_bytes(raw)
        message = refused(
            tmp_path / name, TOKEN_FILE_ERROR, "is not a .npy file", r"expected b'\x93NUMPY'"
        )
        assert repr(raw[:6]) in message  # the bytes found
    assert not marker.exists()
    with pytest.raises(
        ValueError, match="pickled"
    ):  # np.load reads the same file as a pickle, if allowed
        np.load(tmp_path / "pickle.npy")


def test_item_05_unknown_version(tmp_path):
    for version, shown in [(b"\x04\x00", "4.0"), (b"\x00\x00", "0.0"), (b"\x01\x07", "1.7")]:
        (tmp_path / "v.npy").write_bytes(npy_bytes(header_for(), version, b"\0" * 8))
        refused(
            tmp_path / "v.npy",
            TOKEN_FILE_ERROR,
            f"unsupported .npy version {shown}",
            "expected 1.0, 2.0 or 3.0",
        )


def test_item_06_truncated_header(tmp_path):
    whole = npy_bytes(header_for(), data=b"\0" * 8)
    (tmp_path / "cut.npy").write_bytes(whole[:30])
    refused(
        tmp_path / "cut.npy",
        TOKEN_FILE_ERROR,
        f"truncated header: need {10 + len(header_for())} bytes, file has 30",
    )
    (tmp_path / "preamble.npy").write_bytes(whole[:7])
    refused(tmp_path / "preamble.npy", TOKEN_FILE_ERROR, "truncated .npy preamble (7 bytes)")
    (tmp_path / "length.npy").write_bytes(
        b"\x93NUMPY\x02\x00\x10"
    )  # a 4-byte length field cut after one byte
    refused(tmp_path / "length.npy", TOKEN_FILE_ERROR, "truncated .npy header (9 bytes)")


def test_item_07_oversized_header_refused_before_reading(tmp_path):
    cases = {
        "v2.npy": (
            b"\x93NUMPY\x02\x00" + (2**32 - 1).to_bytes(4, "little") + b"{}",
            2**32 - 1,
        ),  # 14 bytes
        "v3.npy": (b"\x93NUMPY\x03\x00" + (2**31).to_bytes(4, "little") + b"{}", 2**31),
        "v1.npy": (
            npy_bytes(b"{" + b" " * 65_533 + b"}"),
            65_535,
        ),  # present in full, and still too long
    }
    for name, (raw, length) in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        refused(
            path,
            TOKEN_FILE_ERROR,
            f".npy header of {length} bytes is larger than the 10000 allowed",
        )
        best = min(_seconds(lambda: _raises(nd.read_npy_header, path)) for _ in range(5))
        assert best < 0.05, f"{name}: {best:.3f} s to refuse"
        tracemalloc.start()
        try:
            _raises(nd.read_npy_header, path)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024, (
            f"{name}: {peak} bytes allocated to refuse a header"
        )  # never the declared size


def _seconds(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def _raises(function, *args):
    with pytest.raises(nd.TokenFileError):
        function(*args)


def test_item_08_header_must_be_a_literal_dict(tmp_path):
    marker = tmp_path / "ran"
    cases = {
        f"__import__('os').system('touch {marker}')": "not a Python literal",
        "dict(descr='<u2', fortran_order=False, shape=(4,))": "not a Python literal",
        "{[1]: 2}": "not a Python literal",  # a literal that cannot be built: unhashable key
        "{'descr': '<u2', 'fortran_order': False, 'shape': (4,), 'extra': 1}": "must have keys descr, fortran_order, shape; found ['descr', 'extra', 'fortran_order', 'shape']",
        "{'descr': '<u2', 'shape': (4,)}": "found ['descr', 'shape']",
        "['descr', 'fortran_order', 'shape']": "found list",
    }
    for header, expected in cases.items():
        (tmp_path / "h.npy").write_bytes(npy_bytes(header, data=b"\0" * 8))
        refused(tmp_path / "h.npy", TOKEN_FILE_ERROR, expected)
    assert not marker.exists()


@pytest.mark.parametrize("dtype", ["<i8", "<f4", "|u1", "<u8", "<i2", "<i4", "<f2", "|b1"])
def test_item_09_descr_other_than_unsigned_16_or_32(tmp_path, dtype):
    np.save(tmp_path / "t.npy", np.arange(10).astype(dtype))
    refused(
        tmp_path / "t.npy",
        TOKEN_FILE_ERROR,
        f"dtype {np.dtype(dtype).str!r} is not supported",
        "expected little-endian ('uint16', 'uint32')",
    )


def test_item_09_project_accepts_both_widths(tmp_path):
    for dtype in (np.uint16, np.uint32):  # the documented difference: both widths are token files
        ds = nd.NpyTokensDataset(
            write_tokens(tmp_path / f"{dtype.__name__}.npy", np.arange(40, dtype=dtype)), 4
        )
        assert ds.dtype == dtype.__name__ and ds[2][0].tolist() == [8, 9, 10, 11]


def test_item_10_big_endian(tmp_path):
    for dtype in (">u2", ">u4"):
        np.save(tmp_path / "be.npy", np.arange(10, dtype=dtype))
        refused(
            tmp_path / "be.npy",
            TOKEN_FILE_ERROR,
            f"dtype {dtype!r} is not supported",
            "little-endian",
        )


def test_item_11_object_structured_subarray(tmp_path):
    marker = tmp_path / "unpickled"
    np.save(
        tmp_path / "obj.npy", np.array([Payload(marker)], dtype=object)
    )  # np.save pickles the objects
    refused(tmp_path / "obj.npy", TOKEN_FILE_ERROR, "dtype '|O' is not supported")
    np.save(tmp_path / "rec.npy", np.zeros(3, dtype=[("a", "<u2")]))
    refused(
        tmp_path / "rec.npy",
        TOKEN_FILE_ERROR,
        "structured dtype [('a', '<u2')] is not a token array",
    )
    (tmp_path / "sub.npy").write_bytes(
        npy_bytes(header_for("('<u2', (2,))", shape="(3,)"), data=b"\0" * 12)
    )
    refused(tmp_path / "sub.npy", TOKEN_FILE_ERROR, "structured dtype ('<u2', (2,))")
    (tmp_path / "sub2.npy").write_bytes(
        npy_bytes(header_for("'(2,)<u2'", shape="(3,)"), data=b"\0" * 12)
    )
    refused(tmp_path / "sub2.npy", TOKEN_FILE_ERROR, "dtype '|V4' is not supported")
    (tmp_path / "sub3.npy").write_bytes(
        npy_bytes(header_for("'(-1,)u2'", shape="(3,)"), data=b"\0" * 6)
    )
    refused(
        tmp_path / "sub3.npy", TOKEN_FILE_ERROR, "'(-1,)u2' is not a dtype"
    )  # numpy's own ValueError, named
    assert not marker.exists()


def test_item_12_fortran_order(tmp_path):
    np.save(tmp_path / "f2.npy", np.asfortranarray(np.arange(20, dtype=np.uint16).reshape(4, 5)))
    refused(tmp_path / "f2.npy", TOKEN_FILE_ERROR, "fortran_order=True; expected False (C order)")
    (tmp_path / "f1.npy").write_bytes(npy_bytes(header_for(fortran="True"), data=b"\0" * 8))
    refused(tmp_path / "f1.npy", TOKEN_FILE_ERROR, "fortran_order=True")
    (tmp_path / "f0.npy").write_bytes(npy_bytes(header_for(fortran="0"), data=b"\0" * 8))
    refused(tmp_path / "f0.npy", TOKEN_FILE_ERROR, "fortran_order=0")  # only the literal False


def test_item_13_dimensions(tmp_path):
    np.save(tmp_path / "scalar.npy", np.uint16(7))
    refused(
        tmp_path / "scalar.npy", TOKEN_FILE_ERROR, "expected a 1-D or 2-D token array, got shape ()"
    )
    np.save(tmp_path / "cube.npy", np.arange(27, dtype=np.uint16).reshape(3, 3, 3))
    refused(tmp_path / "cube.npy", TOKEN_FILE_ERROR, "got shape (3, 3, 3)")
    rows = nd.NpyTokensDataset(
        write_tokens(tmp_path / "rows.npy", np.arange(30, dtype=np.uint16).reshape(3, 10)), 4
    )
    assert [rows[i][0][0].item() for i in range(len(rows))] == [
        0,
        4,
        10,
        14,
        20,
        24,
    ]  # the documented difference


def test_item_14_declared_shape_larger_than_data(tmp_path):
    path = tmp_path / "short.npy"
    raw = npy_bytes(header_for(shape="(1000000,)"), data=b"\0" * 228)
    path.write_bytes(raw)
    needed = 10 + len(header_for(shape="(1000000,)")) + 2_000_000
    refused(
        path,
        TOKEN_FILE_ERROR,
        f"is truncated: shape (1000000,) of uint16 needs {needed} bytes, file has {len(raw)}",
    )
    assert (
        path.read_bytes() == raw
    )  # never opened for writing: numpy's mode "r+" would have grown it


def test_item_15_trailing_bytes(tmp_path):
    raw = npy_bytes(header_for(shape="(6,)"), data=b"\0" * 12)
    for extra in (b"\0", b"\0" * 14, raw):  # a stray byte, garbage, the file written twice
        (tmp_path / "tail.npy").write_bytes(raw + extra)
        refused(
            tmp_path / "tail.npy",
            TOKEN_FILE_ERROR,
            "has trailing bytes",
            f"file has {len(raw) + len(extra)}",
        )


def test_item_16_bad_dimensions(tmp_path):
    cases = {
        "(-5,)": "got shape (-5,)",
        "(True,)": "got shape (True,)",
        "(3.0,)": "got shape (3.0,)",
        "(2**62,)": "not a Python literal",  # an expression, not a literal
        f"({2**62}, {2**62})": f"needs {10 + len(header_for(shape=f'({2**62}, {2**62})')) + 2 * 2**124} bytes",
        "(0,)": "holds no tokens (shape (0,))",
        "(0, 5)": "holds no tokens (shape (0, 5))",
    }
    for shape, expected in cases.items():
        (tmp_path / "d.npy").write_bytes(npy_bytes(header_for(shape=shape)))
        refused(tmp_path / "d.npy", TOKEN_FILE_ERROR, expected)


def test_item_17_odd_bin_size(tmp_path):
    (tmp_path / "odd.bin").write_bytes(b"\0" * 2001)
    refused(
        tmp_path / "odd.bin",
        TOKEN_FILE_ERROR,
        "size 2001 bytes is not a multiple of 2 (uint16)",
        dtype=np.uint16,
    )
    (tmp_path / "odd4.bin").write_bytes(b"\0" * 4002)
    refused(
        tmp_path / "odd4.bin",
        TOKEN_FILE_ERROR,
        "size 4002 bytes is not a multiple of 4 (uint32)",
        dtype="uint32",
    )


def test_item_18_bin_needs_a_dtype_source(tmp_path):
    wide = np.arange(1000, dtype=np.uint32)
    wide.tofile(tmp_path / "bare.bin")
    refused(
        tmp_path / "bare.bin",
        TOKEN_FILE_ERROR,
        "raw token file with no sidecar 'bare.bin.json'",
        "pass dtype=np.uint16",
    )
    # uint32 ids described as uint16: the count in the sidecar exposes it (dolma's uint16/uint32 mix-up)
    write_tokens(tmp_path / "mixed.bin", wide, dtype="uint16")
    refused(
        tmp_path / "mixed.bin",
        TOKEN_FILE_ERROR,
        "shape is [1000] in the sidecar, [2000] in the file",
    )
    write_tokens(tmp_path / "told.bin", wide)
    refused(
        tmp_path / "told.bin",
        TOKEN_FILE_ERROR,
        "has a sidecar that says uint32 but dtype=uint16 was passed",
        dtype=np.uint16,
    )
    # the documented escape hatch: no sidecar, explicit dtype; the caller is trusted, so a wrong one reads garbage
    ds = nd.NpyTokensDataset(tmp_path / "bare.bin", 4, dtype=np.uint16)
    assert ds[0][0].tolist() == [0, 0, 1, 0]


def test_item_20_read_only_file(tmp_path):
    path = write_tokens(tmp_path / "ro.npy", np.arange(100, dtype=np.uint16))
    path.chmod(0o444)
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    ds = nd.NpyTokensDataset(path, 9)
    assert ds[10][0].tolist() == list(range(90, 99))
    assert ds.memmap().mode == "r" and not ds.memmap().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        ds.memmap()[0] = 1
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_item_21_bit_rot(tmp_path):
    path = write_tokens(tmp_path / "rot.npy", np.arange(1000, dtype=np.uint16))
    raw = bytearray(path.read_bytes())
    raw[-2] ^= 0x01  # the last id, 999, becomes 998: same size, same header
    path.write_bytes(raw)
    assert nd.NpyTokensDataset(path, 9)[-1][1][-1].item() == 998  # the default open reads no pages
    refused(path, TOKEN_FILE_ERROR, "sha256 differs from the sidecar's", verify=True)


def test_item_22_inconsistent_sidecar(tmp_path):
    tokens = np.arange(1000, dtype=np.uint16)
    for field, value, found in [
        ("dtype", "uint32", "'uint16'"),
        ("n_tokens", 999, "1000"),
        ("shape", [999], "[1000]"),
        ("file_size", 7, "2128"),
        ("layout", "bin", "'npy'"),
    ]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, **{field: value})
        message = refused(
            path, TOKEN_FILE_ERROR, f"{field} is {value!r} in the sidecar, {found} in the file"
        )
        assert repr(str(nd.sidecar_path(path))) in message
    for field, value in [("max_token_id", 50257), ("eot_id", 50257), ("eot_id", -1)]:
        path = write_tokens(tmp_path / f"{field}.npy", tokens, n_vocab=50257, **{field: value})
        refused(
            path, TOKEN_FILE_ERROR, f"{field} {value} is outside the vocabulary (n_vocab 50257)"
        )
    path = write_tokens(tmp_path / "type.npy", tokens, n_tokens="1000")
    refused(path, TOKEN_FILE_ERROR, "field 'n_tokens' should be int, found '1000'")
    path = write_tokens(tmp_path / "bool.npy", tokens, eot_id=True)  # isinstance(True, int) holds
    refused(path, TOKEN_FILE_ERROR, "field 'eot_id' should be int, found True")
    path = write_tokens(tmp_path / "new.npy", tokens, format_version=99)
    refused(path, TOKEN_FILE_ERROR, "format_version 99 is newer than this module's 1")
    path = write_tokens(tmp_path / "deep.npy", tokens)
    nd.sidecar_path(path).write_text("[" * 100_000)
    refused(path, TOKEN_FILE_ERROR, "is not valid JSON")


def test_item_23_unusual_paths(tmp_path, monkeypatch):
    names = ["with space.npy", "ünïcødé тест 数据.npy", "t" * 240 + ".npy", "dots.in.name.npy"]
    for name in names:
        path = write_tokens(tmp_path / name, np.arange(50, dtype=np.uint16))
        for spelled in (path, str(path)):
            assert len(nd.NpyTokensDataset(spelled, 7, verify=True)) == 7
    monkeypatch.chdir(tmp_path)
    assert len(nd.NpyTokensDataset(Path("with space.npy"), 7)) == 7
    assert "'missing file ü.npy' does not exist" in refused("missing file ü.npy", FileNotFoundError)


# =================================================================================================
# Parameters.


def test_item_24_seq_len(arange_file):
    path = arange_file(100)
    for bad, error, expected in [
        (0, ValueError, "seq_len must be at least 1, got 0"),
        (-1, ValueError, "got -1"),
        (True, TypeError, "seq_len must be an int, got bool True"),
        (2.0, TypeError, "got float 2.0"),
        ("8", TypeError, "got str '8'"),
        (None, TypeError, "got NoneType None"),
    ]:
        with pytest.raises(error) as info:
            nd.NpyTokensDataset(path, bad)
        assert type(info.value) is error and expected in str(info.value)
    for good in (np.int64(9), np.uint8(9), 9):
        assert len(nd.NpyTokensDataset(path, good)) == 11


def test_item_25_too_few_tokens(arange_file):
    refused(
        arange_file(4, name="four.npy"),
        ValueError,
        "the file has 4 tokens; seq_len=4 needs at least 5",
        "(one x plus its shifted y)",
    )
    assert len(nd.NpyTokensDataset(arange_file(5, name="five.npy"), 4)) == 1
    refused(
        arange_file(7, name="seven.npy"),
        ValueError,
        "needs at least 8 (two windows, so any offset leaves one)",
        epoch_offset=True,
    )
    refused(arange_file(8, name="rows.npy", shape=(2, 4)), ValueError, "each row has 4 tokens")
    random_mode = nd.NpyTokensDataset(
        arange_file(5, name="r.npy"), 4, mode="random", num_samples=10
    )
    assert {random_mode[i][0].tolist()[0] for i in range(10)} == {0}  # the single valid start


def test_item_28_offsets_past_2_31_tokens(tmp_path):
    n = 2**31 + 1000  # 8 GiB of uint32 ids, stored sparsely: only the last 1000 are written
    header = npy_bytes(header_for("'<u4'", shape=f"({n},)").ljust(117, b" ") + b"\n")
    path = tmp_path / "huge.npy"
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + 4 * n)
        f.seek(len(header) + 4 * (n - 1000))
        f.write(np.arange(n - 1000, n, dtype=np.uint32).tobytes())
    assert path.stat().st_blocks * 512 < 1 << 20, "the filesystem did not keep the file sparse"
    ds = nd.NpyTokensDataset(path, 100)
    assert len(ds) == (n - 1) // 100
    start = (len(ds) - 1) * 100  # above 2**31 - 1: an int32 offset would wrap negative
    assert start > 2**31
    x, y = ds[-1]
    assert x.tolist() == list(range(start, start + 100)) and y[-1].item() == start + 100
    bx, _ = ds[[len(ds) - 1, 0]]
    assert bx[0, 0].item() == start and bx[1].tolist() == [0] * 100
    files, firsts = ds.locate(np.array([0]), np.array([len(ds) - 1]))
    assert firsts.dtype == np.int64 and int(firsts[0]) == start and files.tolist() == [0]


def _prep_input(folder: Path, texts: list[str], validation: list[str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", texts), ("validation", validation)):
        if rows is not None:
            (folder / f"{split}.jsonl").write_text(
                "".join(json.dumps({"text": t, "story": t.upper()}) + "\n" for t in rows)
            )
    return folder


STORIES = [
    f"Story {i}: " + "The dog ran to the park. " * (i % 5) + f"The end {i}." for i in range(24)
]


def _prepare(pt, dataset, out, **kwargs):
    kwargs.setdefault("progress", False)
    kwargs.setdefault("num_threads", 1)
    return {r.split: r for r in pt.prepare(str(dataset), out, **kwargs)}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_item_29_prep_parameters(tmp_path, pt):
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
        ({"seed": -1}, ValueError, "seed must be an int >= 0, got -1"),
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
    data = _prep_input(tmp_path / "in", STORIES[:4], STORIES[4:6])
    with pytest.raises(
        ValueError, match=re.escape(f"output folder {str(data)!r} is inside the input dataset")
    ):
        pt.prepare(data, data, progress=False)
    assert not (tmp_path / "out").exists() and sorted(p.name for p in data.iterdir()) == [
        "train.jsonl",
        "validation.jsonl",
    ]


def test_item_30_existing_output_is_swapped_not_deleted(tmp_path, pt):
    data, out = _prep_input(tmp_path / "in", STORIES, STORIES[:5]), tmp_path / "out"
    _prepare(pt, data, out, column="story")
    (out / "notes.txt").write_text("mine")
    (out / "keep").mkdir()
    (out / "keep" / "x.npy").write_bytes(b"not tokens")
    previous = np.load(out / "train.npy")
    reader = np.load(out / "train.npy", mmap_mode="r")  # someone still reading the old file
    inode = (out / "train.npy").stat().st_ino
    assert _prepare(pt, data, out, column="story")["train"].written is False  # same settings: kept
    assert _prepare(pt, data, out)["train"].written  # other settings: rebuilt
    assert (out / "train.npy").stat().st_ino != inode  # a new file renamed over the old one
    np.testing.assert_array_equal(reader, previous)  # the old reader still sees the old bytes
    assert (out / "notes.txt").read_text() == "mine" and (
        out / "keep" / "x.npy"
    ).read_bytes() == b"not tokens"
    assert (
        nd.open_tokens(out / "train.npy", verify=True).size
        == nd.read_sidecar(out / "train.npy")["n_tokens"]
    )


# =================================================================================================
# dtype / vocabulary.


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


def _split(pt, name: str, texts: list[str]):
    import datasets

    return pt.TextSplit(
        name,
        datasets.Dataset.from_dict({"text": texts}),
        "text",
        {"dataset": "inline", "split": name},
    )


def test_item_31_wide_vocabulary_gets_uint32(tmp_path, pt):
    enc = _wide_encoding()
    texts = ["A cat sat.", "Then it ran home."]
    result = pt.prepare_split(
        _split(pt, "train", texts), tmp_path, enc, num_threads=1, progress=False
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
        TOKEN_FILE_ERROR,
        "ids up to 70000 may not fit vocab_size=70000",
        seq_len=2,
        vocab_size=70_000,
    )
    with pytest.raises(
        ValueError, match=r"token id 70000 does not fit uint16 \(valid ids: 0 to 65,535\)"
    ):
        pt.write_token_file(
            [np.array(expected)], tmp_path / "narrow.npy", np.uint16
        )  # checked before the cast
    assert not (tmp_path / "narrow.npy").exists()


def test_item_32_boundary_ids_round_trip(tmp_path, pt):
    for dtype, ids in [
        (np.uint16, [0, 50_256, 65_535, 1, 65_534, 32_768, 32_767]),
        (np.uint32, [0, 2**32 - 1, 65_536, 2**31, 2**31 - 1, 50_256, 1]),
    ]:
        path = tmp_path / f"{dtype.__name__}.npy"
        pt.write_token_file([np.array(ids[:3]), np.array(ids[3:])], path, dtype)
        assert np.load(path).tolist() == ids
        ds = nd.NpyTokensDataset(path, 2)
        singles = [t for i in range(len(ds)) for t in ds[i][0].tolist()]
        x, y = ds[list(range(len(ds)))]  # the batched gather widens the top ids exactly too
        px, py = ds[0, np.arange(len(ds))]
        assert singles == x.flatten().tolist() == px.flatten().tolist() == ids[: 2 * len(ds)]
        assert torch.equal(y, py) and y[:, -1].tolist() == ids[2 : 2 * len(ds) + 1 : 2]


def test_item_33_vocab_size(tmp_path):
    path = write_tokens(
        tmp_path / "t.npy", np.arange(1000, dtype=np.uint16), max_token_id=50_256, n_vocab=50_257
    )
    assert len(nd.NpyTokensDataset(path, 9, vocab_size=50_257)) == 111
    refused(
        path, TOKEN_FILE_ERROR, "ids up to 50256 may not fit vocab_size=50000", vocab_size=50_000
    )
    bare = write_tokens(tmp_path / "bare.npy", np.arange(1000, dtype=np.uint16), sidecar=False)
    assert (
        len(nd.NpyTokensDataset(bare, 9, vocab_size=1000)) == 111
    )  # no sidecar: the file is scanned once
    refused(bare, TOKEN_FILE_ERROR, "ids up to 999 may not fit vocab_size=999", vocab_size=999)
    high = write_tokens(
        tmp_path / "high.bin", np.array([5, 60_000, 7] * 10, dtype=np.uint16), sidecar=False
    )
    refused(
        high,
        TOKEN_FILE_ERROR,
        "ids up to 60000 may not fit vocab_size=50257",
        vocab_size=50_257,
        dtype=np.uint16,
    )
    for bad, error, message in [
        ("50257", TypeError, "vocab_size must be an int, got str '50257'"),
        (50_257.0, TypeError, "vocab_size must be an int, got float 50257.0"),
        (True, TypeError, "vocab_size must be an int, got bool True"),
        (0, ValueError, "vocab_size must be at least 1, got 0"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            nd.NpyTokensDataset(path, 9, vocab_size=bad)


def test_item_35_hostile_text(tmp_path, pt):
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
        _split(pt, "train", texts),
        tmp_path / "out",
        enc,
        num_threads=2,
        chunk_docs=2,
        progress=False,
    )
    tokens = nd.open_tokens(result.path, verify=True)
    starts = np.flatnonzero(tokens == enc.eot_token)
    assert len(starts) == len(texts) == result.meta["n_docs"]  # an empty document is one EOT alone
    docs = [
        enc.decode(tokens[a + 1 : b].tolist()) for a, b in zip(starts, [*starts[1:], len(tokens)])
    ]
    assert docs == texts
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
        _prepare(pt, folder, tmp_path / "out2")
    assert not (tmp_path / "out2" / "train.npy").exists()


def test_item_37_one_dtype_and_one_tokenizer_per_dataset(tmp_path):
    gpt2 = write_tokens(
        tmp_path / "a.npy", np.arange(100, dtype=np.uint16), tokenizer="tiktoken:gpt2"
    )
    wide = write_tokens(
        tmp_path / "b.npy", np.arange(100, dtype=np.uint32), tokenizer="tiktoken:gpt2"
    )
    other = write_tokens(
        tmp_path / "c.npy", np.arange(100, dtype=np.uint16), tokenizer="test:other"
    )
    bare = write_tokens(tmp_path / "d.npy", np.arange(100, dtype=np.uint16), sidecar=False)
    with pytest.raises(nd.TokenFileError) as info:
        nd.NpyTokensDataset([gpt2, wide], 8)
    assert f"{str(wide)!r} holds uint32 but {str(gpt2)!r} holds uint16" in str(info.value)
    with pytest.raises(nd.TokenFileError) as info:
        nd.NpyTokensDataset([gpt2, bare, other], 8)  # same dtype, ids from another tokenizer
    assert (
        f"{str(other)!r} was tokenized with 'test:other' but {str(gpt2)!r} with 'tiktoken:gpt2'; "
        "the files of one dataset need one tokenizer"
    ) in str(info.value)
    assert (
        len(nd.NpyTokensDataset([gpt2, bare], 8)) == 2 * 12
    )  # nothing recorded for d.npy: nothing to compare


def test_item_38_vocab_limits_come_from_the_encoding(tmp_path, pt):
    import tiktoken

    for enc in (tiktoken.get_encoding("gpt2"), _wide_encoding()):
        meta = pt.prepare_split(
            _split(pt, enc.name, ["one story"]), tmp_path, enc, num_threads=1, progress=False
        ).meta
        assert meta["n_vocab"] == enc.n_vocab == enc.max_token_value + 1  # special tokens included
        assert meta["dtype"] == nd.token_dtype(enc.n_vocab).name and meta["eot_id"] == enc.eot_token
    assert tiktoken.get_encoding("gpt2").n_vocab == 50_257


def test_item_39_windows_are_int64_copies(tmp_path):
    path = write_tokens(tmp_path / "t.npy", np.arange(200, dtype=np.uint16))
    ds = nd.NpyTokensDataset(path, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's warning about non-writable arrays
        x, y = ds[3]
        bx, by = ds[[3, 4]]
        dx, dy = torch.utils.data.default_collate(
            ds.__getitems__([3, 4])
        )  # what a plain DataLoader does
    for t, shape in [
        (x, (16,)),
        (y, (16,)),
        (bx, (2, 16)),
        (by, (2, 16)),
        (dx, (2, 16)),
        (dy, (2, 16)),
    ]:
        assert t.dtype == torch.int64 and t.is_contiguous() and tuple(t.shape) == shape
    x.add_(1000)
    bx.add_(1000)
    assert y[0].item() == 49 and by[0, 0].item() == 49  # y never shares memory with x
    assert ds[3][0][0].item() == 48 and ds.memmap()[48] == 48  # nor with the file


# =================================================================================================
# Workers.


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="on a CUDA machine test_pinned_batches_reach_the_gpu checks pinning",
)
def test_item_46_no_pinning_and_no_warning_without_a_gpu(arange_file):
    ds = nd.NpyTokensDataset(arange_file(2000, dtype=np.uint16), 16)
    train, val = nd.make_dataloaders(ds, ds, batch_size=4, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # DataLoader(pin_memory=True) warns on a CPU-only machine
        batch = next(iter(train))
        next(iter(val))
    assert train.pin_memory is False and val.pin_memory is False and not batch[0].is_pinned()


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(), reason="counts open files through Linux's /proc"
)
def test_item_47_no_file_opened_per_window(tmp_path):
    path = write_tokens(tmp_path / "fds.npy", np.arange(20_000, dtype=np.uint16))
    ds = nd.NpyTokensDataset(path, 8)
    ds[0]
    fds = _open_fds()
    for i in range(len(ds)):
        ds[i]
    for start in range(0, len(ds) - 64, 64):
        ds[list(range(start, start + 64))]
    assert (
        _open_fds() <= fds
    )  # none opened (an earlier test's may close meanwhile, when garbage is collected)
    mappings = [
        line
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(str(path))
    ]
    assert len(mappings) == 1  # one mapping, made once


SHARD_EPOCH = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
import npy_datasets as nd
from torch.utils.data import DataLoader

resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
taken = [open(sys.argv[1] + "/npy_datasets.py") for _ in range(int(sys.argv[3]))]  # descriptors already in use
ds = nd.NpyTokensDataset(sys.argv[2], 8)
mapped = lambda: len({line.split()[-1] for line in open("/proc/self/maps") if "shard_" in line})
train, _ = nd.make_dataloaders(ds, ds, batch_size=32, num_workers=0)
seen, most = [], 0
for x, _ in train:
    seen += x[:, 0].tolist()
    most = max(most, mapped())
workers = DataLoader(ds, sampler=nd.EpochSampler(ds, batch_size=32), batch_size=None, num_workers=2)
in_workers = [v for x, _ in workers for v in x[:, 0].tolist()]
print(json.dumps({"windows": len(ds), "seen": seen, "workers": in_workers, "most_mapped": most,
                  "budget": nd._open_file_budget(0)}))
"""


@pytest.mark.skipif(
    not Path("/proc/self/maps").exists(),
    reason="sets RLIMIT_NOFILE and counts maps through Linux's /proc",
)
@pytest.mark.parametrize("taken", [0, 24])
def test_item_47_many_shards_under_a_low_open_file_limit(tmp_path, taken):
    for i in range(200):  # shard i holds ids 100*i .. 100*i + 49: six windows of 8
        write_tokens(
            tmp_path / f"shard_{i:03d}.npy", np.arange(100 * i, 100 * i + 50, dtype=np.uint16)
        )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            SHARD_EPOCH,
            str(ROOT / "python_files"),
            str(tmp_path / "shard_*.npy"),
            str(taken),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    every = sorted(100 * i + 8 * k for i in range(200) for k in range(6))
    assert (
        got["windows"] == 1200 and 1 <= got["budget"] <= 16
    )  # 64 descriptors: at most a quarter for maps
    assert got["budget"] == 16 or taken  # fewer only where descriptors were already taken
    assert (
        sorted(got["seen"]) == every[: len(got["seen"])] or len(got["seen"]) == 1184
    )  # drop_last: 37 batches
    assert len(set(got["seen"])) == len(got["seen"]) == 1184 and set(got["seen"]) <= set(every)
    assert sorted(got["workers"]) == every  # two workers under the same limit: the whole epoch
    assert 1 <= got["most_mapped"] <= 16  # an epoch over 200 files never held more than the budget


def _memory_kb(field: str) -> int:
    for line in (
        Path("/proc/self/status" if field == "RssFile" else "/proc/self/smaps_rollup")
        .read_text()
        .splitlines()
    ):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc")


@pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").exists(), reason="reads Linux's per-process memory counters"
)
def test_item_49_private_memory_stays_flat(tmp_path):
    path = tmp_path / "big.npy"
    np.save(path, np.arange(16 * 2**20, dtype=np.uint32).astype(np.uint16))  # 32 MB
    ds = nd.NpyTokensDataset(path, 1024)
    batches = [list(range(i, min(i + 64, len(ds)))) for i in range(0, len(ds), 64)]

    def epoch():
        for keys in batches:
            x, y = ds[keys]

    file_before = _memory_kb("RssFile")
    epoch()
    anonymous = _memory_kb("Anonymous")
    epoch()
    epoch()
    assert (
        _memory_kb("Anonymous") - anonymous < 8 * 1024
    )  # kB: private memory does not grow with reading
    assert (
        _memory_kb("RssFile") - file_before > 16 * 1024
    )  # the mapped file's pages show up as RSS, separately


def test_item_50_no_global_random_state(arange_file):
    path = arange_file(5000)
    rand = nd.NpyTokensDataset(path, 7, mode="random", num_samples=50, seed=3)
    shifted = nd.NpyTokensDataset(path, 7, epoch_offset=True, seed=3)

    def draw():
        sampler = nd.EpochSampler(rand, seed=3)
        return (
            [rand[(e, i)][0][0].item() for e in (0, 1) for i in range(50)],
            [shifted[(e, 0)][0][0].item() for e in range(6)],
            list(sampler),
            list(sampler),
        )

    for seed in (1, 2):  # the global generators, seeded and advanced differently, change nothing
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        np.random.random(seed), torch.rand(seed), random.random()
        if seed == 1:
            first = draw()
    assert draw() == first
    assert len(set(first[1])) > 1  # the epochs do get different offsets
    generators = (np.random.Generator, np.random.RandomState, torch.Generator, random.Random)
    assert not any(isinstance(v, generators) for ds in (rand, shifted) for v in vars(ds).values())
    windows = nd.NpyTokensDataset(path, 7)
    loader = DataLoader(
        windows,
        batch_size=16,
        sampler=nd.EpochSampler(windows, seed=5),
        num_workers=2,
        multiprocessing_context="fork",
    )
    starts = sorted(v for x, _ in loader for v in x[:, 0].tolist())
    assert starts == [7 * i for i in range(len(windows))]  # two workers, every window exactly once


# =================================================================================================
# Distributed (the torchrun, rank-split and resume tests live in test_scale.py).


def test_item_52_every_iteration_is_the_next_epoch(arange_file):
    ds = nd.NpyTokensDataset(arange_file(400), 8)  # 49 windows
    train, _ = nd.make_dataloaders(ds, ds, batch_size=6, num_workers=0, seed=3)
    epochs = [
        [v for x, _ in train for v in x[:, 0].tolist()] for _ in range(3)
    ]  # no set_epoch anywhere
    assert all(len(set(e)) == len(e) == 48 for e in epochs)  # 8 batches of 6, one window dropped
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    train.sampler.set_epoch(1)  # choosing an epoch replays it
    assert [v for x, _ in train for v in x[:, 0].tolist()] == epochs[1]


def test_item_54_a_file_being_written_is_never_read(tmp_path, pt):
    path = tmp_path / "train_000.npy"
    seen = []

    def chunks(ids):
        yield ids[:40]
        for attempt in (
            lambda: nd.NpyTokensDataset(path, 8),
            lambda: nd.NpyTokensDataset(str(tmp_path / "train_*.npy"), 8),
        ):
            try:  # a rank starting now, while the first chunk sits in the temporary file
                seen.append(attempt())
            except FileNotFoundError as e:
                seen.append(str(e))
        yield ids[40:]

    pt.write_token_file(chunks(np.arange(100)), path)
    assert seen == [
        f"token file {str(path)!r} does not exist",
        f"no token file matches the pattern {str(tmp_path / 'train_*.npy')!r} (sidecars, *.json, are skipped)",
    ]
    write_tokens(path, np.arange(100, dtype=np.uint16))  # a finished file with its sidecar
    early = []

    def rerun():  # the same size and dtype, other ids: only the checksum tells the versions apart
        yield np.arange(100, 150)
        early.append(nd.NpyTokensDataset(path, 8))  # this rank opens the previous, complete file
        yield np.arange(150, 200)

    pt.write_token_file(rerun(), path)  # renamed into place; its sidecar is not written yet
    late = nd.NpyTokensDataset(path, 8)
    path_, before, after = nd._first_difference(
        early[0].fingerprint(), late.fingerprint()
    )  # what verify_across_ranks reports
    assert path_ == "files[0].sha256" and len(before) == 64 and after is None
    with pytest.raises(nd.TokenFileError, match="changed since the dataset was opened"):
        early[0][0]  # and the early rank itself never reads the new bytes as the old file
    assert late[0][0][:3].tolist() == [100, 101, 102]


def test_item_55_fewer_windows_than_ranks_and_equal_steps(arange_file):
    ds = nd.NpyTokensDataset(arange_file(25), 8)  # 3 windows
    with pytest.raises(
        ValueError,
        match=r'3 windows for world_size=4: with remainder="drop" no rank would get one; use remainder="pad"',
    ):
        nd.make_dataloaders(
            ds, ds, batch_size=2, num_workers=0, world_size=4, rank=0
        )  # training drops
    padded = [nd.EpochSampler(ds, world_size=4, rank=r, remainder="pad") for r in range(4)]
    assert [len(list(s)) for s in padded] == [1] * 4 and padded[0].padded == 1
    for n in range(
        1, 25
    ):  # every rank takes the same number of steps, whatever n, W, B and the options
        for world in range(1, 9):
            for batch_size, drop_last, remainder in itertools.product(
                (1, 2, 5), (False, True), REMAINDERS
            ):
                share = n // world if remainder == "drop" else -(-n // world)
                if remainder == "drop" and n < world or drop_last and share < batch_size:
                    with pytest.raises(ValueError, match="no rank would get one|leaves no batch"):
                        nd.EpochSampler(
                            range(n),
                            world_size=world,
                            rank=0,
                            batch_size=batch_size,
                            drop_last=drop_last,
                            remainder=remainder,
                        )
                    continue
                ranks = [
                    nd.EpochSampler(
                        range(n),
                        world_size=world,
                        rank=r,
                        batch_size=batch_size,
                        drop_last=drop_last,
                        remainder=remainder,
                    )
                    for r in range(world)
                ]
                steps = {(len(s), len(list(s))) for s in ranks}
                assert len(steps) == 1 and len({a for a, b in steps if a == b}) == 1, (
                    n,
                    world,
                    batch_size,
                    drop_last,
                    remainder,
                )


def test_item_56_invalid_rank_or_world_size(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)
    cases = [
        (
            {"world_size": 2, "rank": 2},
            ValueError,
            "rank must be in [0, 2) for world_size=2, got 2",
        ),
        ({"world_size": 2, "rank": -1}, ValueError, "rank must be at least 0, got -1"),
        ({"world_size": 0, "rank": 0}, ValueError, "world_size must be at least 1, got 0"),
        ({"world_size": 2.0, "rank": 0}, TypeError, "world_size must be an int, got float 2.0"),
        ({"world_size": 2, "rank": True}, TypeError, "rank must be an int, got bool True"),
        (
            {"world_size": 2},
            ValueError,
            "pass both world_size and rank, or neither; got world_size=2, rank=None",
        ),
    ]
    for kwargs, error, message in cases:
        for build in (
            lambda: nd.EpochSampler(ds, **kwargs),
            lambda: nd.make_dataloaders(ds, ds, 4, num_workers=0, **kwargs),
        ):
            with pytest.raises(error) as info:
                build()
            assert message in str(info.value), (kwargs, str(info.value))


# =================================================================================================
# Interruption / disk (the fault tests live in test_faults.py).


def test_item_64_prep_streams_and_never_preallocates():
    tree = ast.parse((ROOT / "python_files" / "prepare_tokens.py").read_text(encoding="utf-8"))
    names = {
        getattr(n, "attr", getattr(n, "id", None))
        for n in ast.walk(tree)
        if isinstance(n, (ast.Attribute, ast.Name))
    }
    # a sparse or preallocated memmap turns a full disk into SIGBUS; streaming writes turn it into OSError
    assert not names & {
        "memmap",
        "open_memmap",
        "truncate",
        "ftruncate",
        "posix_fallocate",
        "fallocate",
        "mmap",
    }


def test_item_71_unwritable_output_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    prefix = []
    if os.geteuid() == 0:  # root passes every permission check unless it gives up CAP_DAC_OVERRIDE
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permission bits cannot be enforced")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    code = (
        "import sys; sys.path.insert(0, 'python_files'); import prepare_tokens as pt\n"
        "pt.load_text_splits = pt.tokenize_documents = pt.tiktoken = None  # reaching any of them fails\n"
        "pt.prepare(None, sys.argv[1], progress=False)\n"
    )
    out = locked / "out" / "deeper"
    locked.chmod(0o555)
    try:
        proc = subprocess.run(
            [*prefix, sys.executable, "-c", code, str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        locked.chmod(0o755)
    expected = (
        f"ValueError: cannot write to output folder {str(out)!r}: {str(locked)!r} is not writable"
    )
    assert proc.returncode == 1 and expected in proc.stderr, proc.stderr[-2000:]
    assert list(locked.iterdir()) == []


# =================================================================================================
# Security.


def test_item_72_77_no_pickle_loading_or_remote_code():
    bad = {  # each snippet must be caught, with the reason in the message
        "import pickle\nwith open('c.pkl', 'rb') as f:\n    cache = pickle.load(f)": "pickle.load",
        "import pickle as pk\ndata = pk.loads(blob)": "pk.loads of bytes not made by pk.dumps",
        "import pickle\nblob = pickle.dumps(x)\nblob = open('c', 'rb').read()\nobj = pickle.loads(blob)": "pickle.loads of bytes",
        "from pickle import loads": "imports pickle.loads",
        "import numpy as np\nids = np.load('t.npy', allow_pickle=True)": "allow_pickle=True",
        "import numpy\nflag = True\nids = numpy.load(p, allow_pickle=flag)": "allow_pickle=flag",
        "import torch\nstate = torch.load('ckpt.pt')": "torch.load without weights_only=True",
        "import torch as T\nstate = T.load('ckpt.pt', weights_only=False)": "torch.load without weights_only=True",
        "from torch import load": "imports torch.load",
        "import pandas as pd\ndf = pd.read_pickle('x')": "read_pickle",
        "import datasets\nds = datasets.load_dataset('x/y', trust_remote_code=True)": "trust_remote_code=True",
        "import joblib\nmodel = joblib.load('m.joblib')": "joblib.load",
    }
    for snippet, reason in bad.items():
        hazards = code_hazards(snippet)
        assert len(hazards) == 1 and reason in hazards[0], (snippet, hazards)
    good = [
        "import pickle\nclone = pickle.loads(pickle.dumps(ds))",
        "import pickle\ndef f(ds):\n    blob = pickle.dumps(ds)\n    return pickle.loads(blob)",
        "import numpy as np\nids = np.load('t.npy', mmap_mode='r')\nids = np.load('t.npy', allow_pickle=False)",
        "import torch\nstate = torch.load('ckpt.pt', weights_only=True)",
        "import json\nmeta = json.loads(text)",
    ]
    for snippet in good:
        assert code_hazards(snippet) == [], snippet
    sources = project_sources(ROOT)
    names = {name for name, _ in sources}
    assert {
        "python_files/npy_datasets.py",
        "python_files/prepare_tokens.py",
        "notebooks/03_build_the_dataset.ipynb",
        "tests/test_catalogue.py",
    } <= names
    hazards = [f"{name}: {h}" for name, source in sources for h in code_hazards(source)]
    assert hazards == []


HEADER_PIECES = {
    "descr": [
        "'<u2'",
        "'<u4'",
        "'>u2'",
        "'|O'",
        "'<f8'",
        "'(2,)<u2'",
        "[('a', '<u2')]",
        "('<u2', (2,))",
        "'M8[xyz]'",
        "'(-1,)u2'",
        "'u99'",
        "''",
        "None",
        "b'<u2'",
        "{}",
        "__import__('os')",
        "'<u2' + ''",
        "[]",
    ],
    "fortran": ["False", "False", "True", "0", "None", "'False'", "[]"],
    "shape": [
        "(3,)",
        "(2, 3)",
        "()",
        "(0,)",
        "(-1,)",
        "(3.0,)",
        "(True,)",
        "[3]",
        "(2**40,)",
        f"({2**62}, {2**62})",
        "(3, 2, 1)",
        "(1, 1, 1, 1)",
        "((3,),)",
        "{1: 2}",
        "(1" + "0" * 5000 + ",)",
        "(" * 14 + "3" + ",)" * 14,
    ],  # nested tuples
}


@st.composite
def npy_like_files(draw) -> bytes:
    """A .npy file built from good and bad header pieces, then maybe damaged byte by byte (one in five stays valid)."""
    clean = draw(st.integers(0, 4)) == 0
    pieces = (
        {k: v[:2] for k, v in HEADER_PIECES.items()}
        if clean or draw(st.booleans())
        else HEADER_PIECES
    )
    descr, fortran, shape = (
        draw(st.sampled_from(pieces[k])) for k in ("descr", "fortran", "shape")
    )
    keys = (
        "normal"
        if clean
        else draw(
            st.sampled_from(
                ["normal"] * 5 + ["missing", "extra", "duplicate", "not a dict", "junk"]
            )
        )
    )
    text = {
        "normal": f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}",
        "missing": f"{{'descr': {descr}, 'shape': {shape}}}",
        "extra": f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, 'x': 1}}",
        "duplicate": f"{{'descr': {descr}, 'descr': '<u2', 'fortran_order': {fortran}, 'shape': {shape}}}",
        "not a dict": f"({descr}, {fortran}, {shape})",
        "junk": draw(st.text(max_size=60)),
    }[keys]
    text += " " * draw(st.integers(0, 70)) + (
        "\n" if clean else draw(st.sampled_from(["\n", "", "\x00", "\n\n"]))
    )
    versions = [b"\x01\x00", b"\x02\x00", b"\x03\x00"] + (
        [] if clean else [b"\x01\x00", b"\x04\x00"]
    )
    version = draw(st.sampled_from(versions))
    header = text.encode("utf8" if version == b"\x03\x00" else "latin1", errors="replace")
    try:
        n = int(np.prod(ast.literal_eval(shape))) * np.dtype(ast.literal_eval(descr)).itemsize
    except Exception:  # any piece that is not a size: pick a few bytes
        n = 8
    data = b"\0" * max(
        0, min(n, 4096) + (0 if clean else draw(st.sampled_from([0, 0, 0, -1, 1, -2, 2])))
    )
    raw = bytearray(npy_bytes(header, version, data))
    if clean:
        return bytes(raw)
    first = draw(
        st.sampled_from([0, 6, 8, 10])
    )  # the magic, the version, the length field or the header on
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):  # byte damage
        raw[draw(st.integers(min(first, len(raw) - 1), len(raw) - 1))] = draw(st.integers(0, 255))
    if draw(st.integers(0, 3)) == 0:
        raw = raw[: draw(st.integers(min(first, len(raw)), len(raw)))]
    return bytes(raw)


@pytest.mark.filterwarnings(
    "ignore:invalid escape sequence"
)  # a header such as '\\p' makes the parser warn, then it is refused
@settings(
    max_examples=300, deadline=250, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(raw=st.one_of(st.binary(max_size=200), npy_like_files()))
@example(raw=npy_bytes("{[1]: 2}"))  # regression: ast.literal_eval raised TypeError here
@example(
    raw=npy_bytes(header_for("'(-1,)u2'"), data=b"\0" * 8)
)  # regression: np.dtype raised ValueError
def test_item_74_header_parser_fuzz(raw):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.npy"
        path.write_bytes(raw)
        try:
            dtype, shape, offset = nd.read_npy_header(path)
        except nd.TokenFileError as error:
            assert repr(str(path)) in str(error)
            return
        # accepted: it must be a token array that fills the file exactly, and numpy must agree
        assert (
            dtype in (np.dtype("<u2"), np.dtype("<u4"))
            and 1 <= len(shape) <= 2
            and all(d > 0 for d in shape)
        )
        assert offset + dtype.itemsize * int(np.prod(shape)) == len(raw)
        mapped = np.load(path, mmap_mode="r")
        assert (mapped.dtype, mapped.shape, mapped.offset) == (dtype, shape, offset)
        del mapped


def test_item_74_fuzz_reaches_acceptance_and_many_refusals():
    """The strategy is worth running: it produces valid files as well as each kind of refusal."""
    outcomes = Counter()

    @settings(max_examples=400, deadline=None, database=None)
    @given(raw=npy_like_files())
    def sample(raw):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "f.npy"
            path.write_bytes(raw)
            try:
                nd.read_npy_header(path)
                outcomes["accepted"] += 1
            except nd.TokenFileError as error:
                kind = re.sub(r"'[^']*'|\d+|\(.*", "", str(error).split(": ", 1)[-1])[:25]
                outcomes[kind.strip()] += 1

    sample()
    assert outcomes["accepted"] > 0 and len(outcomes) >= 8, outcomes


def test_item_75_names_cannot_leave_the_output_folder(tmp_path, pt):
    import tiktoken

    enc = tiktoken.get_encoding("gpt2")
    out = tmp_path / "a" / "out"
    for bad in [
        "../escaped",
        "../../escaped",
        "/tmp/escaped",
        "C:\\escaped",
        "a\x00b",
        "~",
        ".hidden",
        "a/b",
    ]:
        with pytest.raises(
            ValueError, match=re.escape(f"split name {bad!r} cannot be a file name")
        ):
            pt.prepare_split(_split(pt, bad, ["text"]), out, enc, num_threads=1, progress=False)
        with pytest.raises(
            ValueError, match=re.escape(f"split name {bad!r}")
        ):  # before loading the missing dataset
            pt.prepare(tmp_path / "missing", out, splits=["train", bad], progress=False)
    assert list(tmp_path.rglob("*")) == []  # not even the output folder was created
    for name in [
        "owner/..",
        "../../etc",
        "x/.",
        "..",
        "C:\\data",
        "~/x",
    ]:  # names used for the default folder
        folder = pt._default_out_dir(name, None)
        assert (
            folder.parent == pt.REPO_ROOT / "data"
            and folder.name not in ("", ".", "..")
            and "/" not in folder.name
        )


def test_item_76_planted_symlinks(tmp_path, pt, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    data, out = _prep_input(tmp_path / "in", STORIES[:6], STORIES[6:8]), tmp_path / "out"
    out.mkdir()
    for name in ("train.npy", "train.npy.json"):
        (out / name).symlink_to(victim)
    _prepare(pt, data, out, splits=["train"])
    assert victim.read_text() == "precious"
    assert not (out / "train.npy").is_symlink() and not (out / "train.npy.json").is_symlink()
    assert nd.open_tokens(out / "train.npy", verify=True).size > 0
    # A link planted at the next temp name: O_EXCL refuses to open it, and a fresh name is drawn.
    names = iter(["deadbeef", "cafef00d"])
    monkeypatch.setattr(pt.secrets, "token_hex", lambda n: next(names))
    planted = out / f".train.bin.tmp.{os.getpid()}.deadbeef"
    planted.symlink_to(victim)
    pt.write_token_file([np.arange(5)], out / "train.bin", layout="bin")
    assert victim.read_text() == "precious" and planted.is_symlink()
    assert np.fromfile(out / "train.bin", dtype=np.uint16).tolist() == [0, 1, 2, 3, 4]


def test_item_78_resume_state_is_validated(arange_file):
    ds = nd.NpyTokensDataset(arange_file(200), 8)  # 24 windows
    sampler = nd.EpochSampler(ds, seed=1, batch_size=4)
    next(iter(sampler))
    state = sampler.state_dict()
    assert (state["epoch"], state["position"]) == (0, 4)
    other = nd.NpyTokensDataset(arange_file(200, name="other.npy"), 6)
    bad = [
        ([], "not an EpochSampler state"),
        ({**state, "format": "torchdata"}, "not an EpochSampler state"),
        ({**state, "version": 2}, "not an EpochSampler state of version 1"),
        ({**state, "extra": 1}, "EpochSampler state: expected the keys"),
        (
            {k: v for k, v in state.items() if k != "position"},
            "EpochSampler state: expected the keys",
        ),
        ({**state, "epoch": -1}, "epoch must be an int >= 0, got -1"),
        ({**state, "epoch": "1"}, "epoch must be an int >= 0, got '1'"),
        ({**state, "epoch": True}, "epoch must be an int >= 0, got True"),
        ({**state, "position": 24}, "position must be an int in [0, 24), got 24"),
        ({**state, "position": -1}, "position must be an int in [0, 24), got -1"),
        ({**state, "position": 4.0}, "position must be an int in [0, 24), got 4.0"),
        ({**state, "seed": 2}, "seed is 2 in the saved state, 1 here"),
        ({**state, "num_samples": 25}, "num_samples is 25 in the saved state, 24 here"),
        (
            {**state, "dataset": other.fingerprint()},
            "dataset.files[0].name is 'other.npy' in the saved state, 'tokens.npy' here",
        ),
    ]
    fresh = nd.EpochSampler(ds, seed=1, batch_size=4)
    before = fresh.state_dict()
    for value, message in bad:
        with pytest.raises(ValueError) as info:
            fresh.load_state_dict(value)
        assert message in str(info.value), (value, str(info.value))
        assert fresh.state_dict() == before  # a refused state changes nothing
    fresh.load_state_dict(json.loads(json.dumps(state)))
    epoch, indices = next(iter(fresh))
    assert epoch == 0 and indices.tolist() == nd.EpochSampler(ds, seed=1).order(0)[4:8].tolist()


def test_item_79_tampered_tokenizer_file_is_refused(tmp_path, pt):
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
    assert pt.TIKTOKEN_FILES == ROOT / "materials" / "tiktoken_cache"
    assert not pt.TIKTOKEN_FILES.stat().st_mode & stat.S_IWOTH
    encoder = bad / pt.GPT2_ENCODER_JSON
    encoder.write_bytes(encoder.read_bytes().replace(b'"hello": 31373', b'"hello": 31374'))
    with pytest.raises(ValueError, match="sha256 differs from GPT-2's encoder.json"):
        pt.gpt2_encoding(bad)


def test_item_80_output_modes_follow_the_umask(tmp_path, pt):
    data = _prep_input(tmp_path / "in", STORIES[:6], STORIES[6:8])
    for mask, mode in [(0o022, 0o644), (0o077, 0o600)]:
        out = tmp_path / f"out_{mask:o}"
        previous = os.umask(mask)
        try:
            _prepare(pt, data, out, splits=["train"])
        finally:
            os.umask(previous)
        assert {
            name: stat.S_IMODE((out / name).stat().st_mode)
            for name in ("train.npy", "train.npy.json")
        } == {"train.npy": mode, "train.npy.json": mode}


if (
    __name__ == "__main__"
):  # python tests/test_catalogue.py: rewrite tests/bad_inputs.md from the table
    BAD_INPUTS_MD.write_text(catalogue_markdown(), encoding="utf-8")
    print(f"wrote {BAD_INPUTS_MD.relative_to(ROOT)}: {len(CATALOGUE)} items")
