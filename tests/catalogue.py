"""The bad-input and fault catalogue: one table of every item, and the cross-index of which test
tries which input.

Each entry names the tests that try the item, each as file::test (the tests live in the unit files:
the .npy header in test_header.py, token files in test_format.py, the dataset in test_dataset.py and
test_dataset_files.py, the sampler in test_sampler.py and test_resume.py, the loaders in
test_loaders.py, the prep step in the test_prep_*.py files, injected faults in test_faults.py), or
says why the item does not apply to this project, or (for future work) which issue it waits for.
Where the project deliberately does something other than the catalogue suggests, `differs` says
what, and the tests check the project's own documented behaviour; `limit` names a case the project
cannot catch and why. tests/test_catalogue.py checks the table and writes it out as
tests/bad_inputs.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

AREAS = {
    "file": "file / header",
    "params": "parameters",
    "dtype": "dtype / vocabulary",
    "workers": "workers",
    "distributed": "distributed",
    "disk": "interruption / disk",
    "security": "security",
    "prep": "prep step",
}

HEADER = "test_header.py::"
FORMAT = "test_format.py::"
DATASET = "test_dataset.py::"
FILES = "test_dataset_files.py::"
SAMPLER = "test_sampler.py::"
RESUME = "test_resume.py::"
LOADERS = "test_loaders.py::"
PREP_INPUTS = "test_prep_inputs.py::"
PREP_FILES = "test_prep_files.py::"
TOKENIZE = "test_prep_tokenize.py::"
PREP_OUTPUTS = "test_prep_outputs.py::"
RERUNS = "test_prep_reruns.py::"
FAULTS = "test_faults.py::"
STYLE = "test_style.py::"
WRITER = "test_write_tokens.py::"
VERIFY = "test_prep_verify.py::"
DESCRIPTORS = "test_descriptors.py::"
SMALL_INPUTS = "test_prep_small_inputs.py::"


@dataclass(frozen=True)
class Item:
    number: int
    area: str
    title: str  # in this project's words, not the catalogue's
    tests: tuple[str, ...] = ()  # "test_file.py::test_name", the file in tests/
    not_applicable: str = ""  # why the item does not apply here
    pending: str = ""  # the issue that will implement it
    differs: str = ""  # where the project deliberately does something else, and what it does
    limit: str = ""  # a case the module cannot catch, and why

    def tried_by(self, *tests: str, differs: str = "", limit: str = "") -> Item:
        """This item, tried by these tests ("test_file.py::test_name"), with its notes."""
        return dataclasses.replace(self, tests=tests, differs=differs, limit=limit)

    def does_not_apply(self, why: str) -> Item:
        return dataclasses.replace(self, not_applicable=why)

    def waits_for(self, issue: str) -> Item:
        return dataclasses.replace(self, pending=issue)


CATALOGUE = [
    # --- file / header (loader side) ---
    Item(1, "file", "path does not exist").tried_by(FORMAT + "test_a_missing_path_is_named"),
    Item(
        2, "file", "directory, FIFO, device or socket instead of a file (also as the sidecar)"
    ).tried_by(FORMAT + "test_a_folder_fifo_device_or_socket_is_refused_without_blocking"),
    Item(3, "file", "empty file").tried_by(FORMAT + "test_an_empty_file_is_refused"),
    Item(4, "file", "wrong magic: text, raw .bin or a pickle named .npy").tried_by(
        HEADER + "test_a_file_without_the_npy_magic_is_refused_and_a_pickle_never_runs"
    ),
    Item(5, "file", "unknown .npy format version").tried_by(
        HEADER + "test_an_unknown_npy_version_is_refused"
    ),
    Item(6, "file", "header cut short").tried_by(HEADER + "test_a_header_cut_short_is_refused"),
    Item(7, "file", "huge declared header length").tried_by(
        HEADER + "test_a_huge_declared_header_length_is_refused",
        differs="numpy's reader refuses a header past its 10,000 bytes once it has read what the "
        "file holds of it, not from the length field alone",
    ),
    Item(8, "file", "header that is not a plain dict literal").tried_by(
        HEADER + "test_a_header_that_is_not_a_plain_dict_literal_is_refused_without_running_it"
    ),
    Item(9, "file", "dtype other than uint16").tried_by(
        HEADER + "test_a_dtype_other_than_little_endian_uint16_or_uint32_is_refused",
        HEADER + "test_uint16_and_uint32_are_both_token_files",
        differs="uint32 files are accepted as well as uint16 (vocabularies above 65,536 ids)",
    ),
    Item(10, "file", "big-endian ids").tried_by(
        HEADER + "test_a_dtype_other_than_little_endian_uint16_or_uint32_is_refused"
    ),
    Item(11, "file", "object, structured or subarray dtype").tried_by(
        HEADER + "test_an_object_npy_is_refused_without_unpickling",
        HEADER + "test_structured_and_subarray_dtypes",
    ),
    Item(12, "file", "Fortran order").tried_by(
        HEADER + "test_fortran_order_is_refused_where_it_changes_the_order_of_the_ids",
        differs="a 1-D file that says fortran_order True is read: its bytes are the same in "
        "either order",
    ),
    Item(13, "file", "not a 1-D array").tried_by(
        HEADER + "test_ids_must_be_one_or_two_dimensional",
        differs="2-D files are accepted: each row is a separate sequence and no window crosses rows",
    ),
    Item(14, "file", "declared shape larger than the data").tried_by(
        HEADER + "test_a_declared_shape_larger_than_the_data_is_refused_and_the_file_left_alone"
    ),
    Item(15, "file", "bytes after the declared data").tried_by(
        HEADER + "test_trailing_bytes_are_refused_by_the_sidecars_size",
        differs="a .npy with trailing bytes and no sidecar opens: numpy maps the shape its header "
        "declares and the rest is never read; with a sidecar its file_size refuses the file",
    ),
    Item(16, "file", "negative, zero or overflowing dimensions").tried_by(
        HEADER + "test_negative_zero_and_overflowing_dimensions_are_refused"
    ),
    Item(17, "file", "raw .bin with an odd byte count").tried_by(
        FORMAT + "test_a_raw_bin_with_a_partial_id_is_refused"
    ),
    Item(18, "file", "raw .bin with no sidecar or a disagreeing one").tried_by(
        FORMAT + "test_a_raw_bin_takes_its_dtype_from_its_sidecar_or_the_caller",
        differs="a .bin without sidecar opens when the caller passes dtype= (nanoGPT's files); "
        "the caller is then trusted",
    ),
    Item(19, "file", "file truncated, rewritten or replaced after it was opened").tried_by(
        FAULTS + "test_file_changed_under_a_running_loader_is_a_clear_error",
        FAULTS + "test_holding_the_array_across_a_truncation_still_dies_of_sigbus",
        limit="code that keeps open_tokens()'s array and reads it after the file shrank in place, or a "
        "truncation landing between the per-batch check and the copy, still dies of SIGBUS: "
        "the kernel signals a read past the end of a mapped file, and only reading without mmap "
        "would avoid it",
    ),
    Item(20, "file", "read-only file").tried_by(
        FORMAT + "test_a_read_only_file_is_read_and_never_written"
    ),
    Item(21, "file", "damaged bytes, same size").tried_by(
        FORMAT + "test_damage_of_the_same_size_is_found_by_verify",
        differs="the default open compares the size and a hash of the first and last 64 KiB with "
        "the sidecar; verify=True compares the sha256 of every byte",
    ),
    Item(22, "file", "sidecar that disagrees with its file or with itself").tried_by(
        FORMAT + "test_a_sidecar_that_does_not_describe_its_file_is_refused",
        FORMAT + "test_a_sidecars_own_fields_are_trusted_on_open_and_its_hash_read_on_request",
        differs="an open compares what can change after writing (layout, dtype, shape, size, the "
        "probe) and the format version; the fields write_tokens checked (n_tokens, eot_id, the "
        "tokenizer) are audited by prepare_tokens.py --verify, not on every open",
    ),
    Item(23, "file", "unusual but valid paths").tried_by(
        FORMAT + "test_unusual_but_valid_paths_open"
    ),
    # --- parameters ---
    Item(24, "params", "seq_len of the wrong type or value").tried_by(
        DATASET + "test_seq_len_of_the_wrong_type_or_value_is_refused_by_name"
    ),
    Item(25, "params", "fewer tokens than one window needs").tried_by(
        DATASET + "test_too_few_tokens_for_one_window_are_refused_naming_the_counts"
    ),
    Item(26, "params", "window count and positions").tried_by(
        DATASET + "test_windows_cover_every_token_once",
    ),
    Item(27, "params", "out-of-range, negative and odd index types").tried_by(
        DATASET + "test_one_window_takes_an_int_of_any_integer_type_and_refuses_the_rest",
        DATASET + "test_a_batch_of_bad_indices_names_the_bad_one",
        DATASET + "test_epoch_and_indices_index_a_batch",
    ),
    Item(28, "params", "more than 2**31 tokens").tried_by(
        DATASET + "test_offsets_past_2_31_tokens_do_not_wrap"
    ),
    Item(29, "params", "bad prep parameters").tried_by(
        PREP_INPUTS + "test_prep_parameters",
        PREP_INPUTS + "test_bad_parameters_fail_before_any_work",
        PREP_OUTPUTS + "test_output_folder_checks",
    ),
    Item(30, "params", "output already exists").tried_by(
        RERUNS + "test_existing_output_is_swapped_not_deleted",
        differs="no overwrite flag: an output whose sidecar records the same settings is kept, any other "
        "is rebuilt beside it and renamed over it; nothing else in the folder is touched",
    ),
    # --- dtype / vocabulary ---
    Item(31, "dtype", "ids of 65,536 and above").tried_by(
        TOKENIZE + "test_wide_vocabulary_gets_uint32",
        PREP_OUTPUTS + "test_id_that_does_not_fit_the_dtype_raises_instead_of_wrapping",
        differs="a vocabulary above 65,536 ids gets uint32 files instead of a refusal; an id that does not "
        "fit the chosen dtype is still an error, never a wrap",
    ),
    Item(32, "dtype", "boundary ids round-trip").tried_by(FORMAT + "test_boundary_ids_round_trip"),
    Item(33, "dtype", "file ids beyond the model's vocabulary").tried_by(
        FORMAT + "test_ids_past_vocab_size_are_refused",
        differs="the check uses the sidecar's max_token_id; a file without a sidecar is scanned once "
        "for its largest id",
    ),
    Item(34, "dtype", "special-token text inside a document").tried_by(
        TOKENIZE + "test_literal_endoftext_in_text_is_ordinary_text"
    ),
    Item(35, "dtype", "hostile text").tried_by(
        TOKENIZE + "test_hostile_text",
        PREP_INPUTS + "test_none_cell_names_split_row_and_column",
        differs="a 1 MB document stands in for 100 MB to keep the suite fast; a lone surrogate is replaced "
        "by U+FFFD by tiktoken, and a JSON file holding one is refused by the datasets reader "
        "(its error names the row; the file name appears only in datasets' log)",
    ),
    Item(36, "dtype", "missing or non-text column").tried_by(
        PREP_INPUTS + "test_missing_column_lists_available_columns",
        PREP_INPUTS + "test_non_text_column_is_refused",
    ),
    Item(37, "dtype", "mixing dtypes or tokenizers across shards").tried_by(
        FILES + "test_a_dataset_has_one_dtype_and_one_tokenizer",
        differs="a file without sidecar has no recorded tokenizer and is not compared; make_dataloaders "
        "does not compare train with validation (two datasets, each checked on its own)",
    ),
    Item(38, "dtype", "vocabulary size from the right attribute").tried_by(
        TOKENIZE + "test_vocab_limits_come_from_the_encoding"
    ),
    Item(39, "dtype", "what __getitem__ returns").tried_by(
        DATASET + "test_windows_are_int64_copies"
    ),
    # --- workers ---
    Item(40, "workers", "same batches for 0, 1, 2 workers, fork and spawn").tried_by(
        LOADERS + "test_worker_count_and_start_method_do_not_change_batches"
    ),
    Item(41, "workers", "small pickle for spawn").tried_by(
        FILES + "test_pickles_small_without_the_data_and_workers_give_the_same_batches"
    ),
    Item(42, "workers", "persistent workers over several epochs").tried_by(
        LOADERS + "test_worker_count_and_start_method_do_not_change_batches"
    ),
    Item(43, "workers", "worker killed").tried_by(
        FAULTS + "test_a_killed_worker_is_reported_and_nothing_is_left"
    ),
    Item(44, "workers", "exception inside a worker").tried_by(
        FAULTS + "test_a_worker_error_names_the_worker_the_index_and_the_file"
    ),
    Item(45, "workers", "stalled storage").tried_by(
        FAULTS + "test_a_stalled_read_hits_the_dataloader_timeout",
        differs="make_dataloaders keeps PyTorch's default of no timeout (local files); pass timeout= "
        "to your own DataLoader for network storage",
    ),
    Item(46, "workers", "pinned memory").tried_by(
        LOADERS + "test_pinned_batches_reach_the_gpu",
        LOADERS + "test_no_pinning_and_no_warning_without_a_gpu",
        differs="the GPU half runs only where CUDA is available; without it make_dataloaders does not pin",
    ),
    Item(47, "workers", "open files and mappings").tried_by(
        FILES + "test_windows_open_no_file_and_map_each_file_once",
        FILES + "test_an_epoch_over_many_shards_keeps_half_the_free_descriptors_for_others",
        FILES + "test_running_out_of_descriptors_while_mapping_names_the_limit_and_ulimit",
    ),
    Item(48, "workers", "early break and deleted loaders").tried_by(
        FAULTS + "test_breaking_early_and_deleting_the_loader_stop_the_workers"
    ),
    Item(49, "workers", "memory over long epochs").tried_by(
        FILES + "test_private_memory_stays_flat_over_epochs"
    ),
    Item(50, "workers", "randomness only from (seed, epoch, index)").tried_by(
        SAMPLER + "test_global_random_state_changes_no_window_and_no_order"
    ),
    # --- distributed ---
    Item(51, "distributed", "rank partitions").tried_by(
        SAMPLER + "test_ranks_split_each_epoch_disjoint_and_complete",
        LOADERS + "test_distributed_sampler_indices_are_windows_of_epoch_zero",
        LOADERS + "test_torchrun_ranks_cover_the_epoch_disjointly",
    ),
    Item(52, "distributed", "set_epoch forgotten").tried_by(
        SAMPLER + "test_each_pass_is_the_next_epoch_without_set_epoch",
        SAMPLER + "test_iterators_made_and_dropped_do_not_skip_epochs",
        SAMPLER + "test_a_loop_that_takes_exactly_len_batches_moves_on_to_the_next_epoch",
        SAMPLER + "test_set_epoch_during_a_pass_chooses_the_pass_after_it",
        SAMPLER + "test_a_loop_that_calls_set_epoch_gets_its_epochs_whatever_workers_fetched",
        SAMPLER + "test_the_pass_after_a_break_is_the_same_with_any_worker_count",
        differs="nothing to forget and so no warning: a pass after one whose batches the loop all "
        "received (a loop that takes exactly len(loader) of them too) is the next epoch, one left "
        "early is served again, and set_epoch chooses one, even while a pass runs; the loader "
        "counts what the loop received, so DataLoader workers, which fetch ahead, change nothing; "
        "torch's DistributedSampler still needs set_epoch",
    ),
    Item(53, "distributed", "ranks with different seeds or files").tried_by(
        LOADERS + "test_torchrun_ranks_that_disagree_all_fail_naming_the_rank"
    ),
    Item(54, "distributed", "a rank reads a file still being written").tried_by(
        LOADERS + "test_a_file_being_written_is_never_read",
        differs="no rank waits for another's prep (run prep before launching): the file in progress has a "
        "hidden temporary name, so an early rank finds no file, or the previous complete one, which "
        "the ranks' agreement check and the per-read file check refuse",
    ),
    Item(55, "distributed", "fewer windows than ranks, unequal batches").tried_by(
        SAMPLER + "test_every_rank_takes_the_same_number_of_steps",
        SAMPLER + "test_ranks_split_each_epoch_disjoint_and_complete",
        differs="equal steps per rank follow from the split (every rank takes the same number of items) and "
        "from the agreement check on files and settings, so len(dataloader) is not all-gathered",
    ),
    Item(56, "distributed", "invalid rank or world size").tried_by(
        SAMPLER + "test_an_invalid_rank_or_world_size_is_refused_by_name"
    ),
    Item(57, "distributed", "resume with changed settings").tried_by(
        RESUME + "test_resume_refuses_a_state_from_other_windows",
        RESUME + "test_resume_with_another_batch_or_world_size_continues_at_the_same_position",
        RESUME + "test_a_run_killed_and_resumed_trains_the_batches_of_one_uninterrupted_run",
    ),
    Item(58, "distributed", "resume state round trip").tried_by(
        RESUME + "test_a_run_killed_and_resumed_trains_the_batches_of_one_uninterrupted_run",
        RESUME + "test_make_dataloaders_resume_across_the_epoch_end",
        RESUME + "test_a_state_saved_at_a_break_is_exact_whatever_workers_fetched",
        RESUME + "test_any_stop_point_is_a_global_position_the_next_run_starts_from",
        differs="a state saved after an epoch's last batch already points at the next epoch, so the resumed "
        "loop's first iteration is that whole epoch (torchdata's first iteration would be empty)",
    ),
    # --- interruption / disk (prep side) ---
    Item(59, "disk", "SIGKILL during prep").tried_by(
        FAULTS + "test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done"
    ),
    Item(60, "disk", "Ctrl-C or an exception mid-write").tried_by(
        FAULTS + "test_ctrl_c_at_chunk_k_removes_the_temp_and_keeps_the_old_output",
        RERUNS + "test_interrupted_write_leaves_nothing_and_keeps_earlier_output",
    ),
    Item(61, "disk", "crash between the data rename and the sidecar").tried_by(
        FAULTS + "test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done",
        RERUNS + "test_crash_between_data_and_sidecar_leaves_no_sidecar",
        differs="the loader opens a .npy without sidecar (any np.save file is valid input, its header "
        "describes it); prep treats it as unfinished and rebuilds it, and verify=True refuses it",
    ),
    Item(62, "disk", "power loss: fsync, rename, fsync the folder").tried_by(
        FAULTS + "test_fsync_rename_fsync_order_with_temp_files_beside_the_target",
        WRITER + "test_each_fsync_finds_every_byte_of_its_file_with_the_os",
    ),
    Item(63, "disk", "disk full while writing").tried_by(
        FAULTS + "test_file_size_limit_fails_clearly_and_keeps_the_old_output",
        differs="tried with RLIMIT_FSIZE (EFBIG) only: a full tmpfs (ENOSPC) needs mount rights",
    ),
    Item(64, "disk", "no preallocated or sparse output").tried_by(
        PREP_OUTPUTS + "test_prep_streams_and_never_preallocates",
        FAULTS + "test_file_size_limit_fails_clearly_and_keeps_the_old_output",
    ),
    Item(65, "disk", "free-space check before writing").does_not_apply(
        "declined by design: the token count is known only after tokenizing, and a full "
        "disk fails cleanly with the old output intact (item 63)"
    ),
    Item(66, "disk", "leftovers of an older run").tried_by(
        FAULTS + "test_sigkill_at_each_stage_of_prep_leaves_nothing_half_done",
        FAULTS + "test_a_zero_filled_file_without_sidecar_is_rebuilt",
        RERUNS + "test_stale_temp_files_of_dead_runs_are_removed",
    ),
    Item(67, "disk", "two prep runs on one output").tried_by(
        FAULTS + "test_two_runs_on_one_output_leave_one_valid_output",
        FAULTS + "test_a_sidecar_deleted_by_another_run_in_between_is_not_an_error",
        limit="runs take turns through a lock on the output folder; where the filesystem has no "
        "flock (Windows, some network filesystems), two runs with different settings can leave one "
        "run's token file with the other's sidecar, which open_tokens refuses when the size or the "
        "probe differs, and verify=True always",
    ),
    Item(68, "disk", "rerun after success").tried_by(
        RERUNS + "test_rerun_skips_and_changed_settings_rebuild"
    ),
    Item(69, "disk", "a tokenizer worker dies").tried_by(
        FAULTS + "test_a_failing_tokenizer_thread_stops_prep_with_its_error",
        differs="tokenizing runs on threads, not datasets.map processes: a failure is re-raised by the writer",
    ),
    Item(70, "disk", "temp file on another filesystem").tried_by(
        FAULTS + "test_fsync_rename_fsync_order_with_temp_files_beside_the_target"
    ),
    Item(71, "disk", "output folder not writable").tried_by(
        PREP_OUTPUTS + "test_unwritable_output_folder"
    ),
    # --- security ---
    Item(72, "security", "no pickle anywhere").tried_by(
        STYLE + "test_no_pickle_loading_or_remote_code"
    ),
    Item(73, "security", "malicious object .npy or pickle disguised as .npy").tried_by(
        HEADER + "test_a_file_without_the_npy_magic_is_refused_and_a_pickle_never_runs",
        HEADER + "test_an_object_npy_is_refused_without_unpickling",
    ),
    Item(74, "security", "header parser under attack").tried_by(
        HEADER + "test_any_bytes_open_as_token_ids_or_raise_a_token_file_error",
        HEADER + "test_the_fuzzer_makes_valid_files_and_many_kinds_of_refusal",
        HEADER + "test_a_huge_declared_header_length_is_refused",
        differs="the module has no parser of its own: numpy's np.load reads the header; the fuzzer "
        "checks that what it refuses reaches the caller as a TokenFileError naming the file",
    ),
    Item(75, "security", "path traversal through names").tried_by(
        PREP_OUTPUTS + "test_names_cannot_leave_the_output_folder"
    ),
    Item(76, "security", "symlinks planted at output or temp paths").tried_by(
        PREP_OUTPUTS + "test_planted_symlinks",
        differs="a symlinked output folder is followed: --out is the user's own choice",
    ),
    Item(77, "security", "remote code from the Hub").tried_by(
        STYLE + "test_no_pickle_loading_or_remote_code",
        differs="Hub inputs record datasets' fingerprint in the sidecar, not a pinned revision",
    ),
    Item(78, "security", "resume state validated").tried_by(
        RESUME + "test_a_state_of_another_format_or_order_is_refused_naming_the_field"
    ),
    Item(79, "security", "tampered tiktoken cache").tried_by(
        TOKENIZE + "test_tampered_tokenizer_file_is_refused"
    ),
    Item(80, "security", "file modes").tried_by(
        PREP_OUTPUTS + "test_output_modes_follow_the_umask",
        differs="the project creates no cache folder of its own, so only the output modes apply",
    ),
    # issue 19/20: the prep step
    Item(81, "prep", "an input folder's files in two formats, a subfolder or no split").tried_by(
        PREP_FILES + "test_every_data_file_of_a_folder_is_read_or_named_in_a_refusal"
    ),
    Item(82, "prep", "brackets in the output folder's name").tried_by(
        PREP_OUTPUTS + "test_a_shard_glob_matches_only_its_own_folder"
    ),
    Item(83, "prep", "an output damaged at the same size, rerun without --force").tried_by(
        RERUNS + "test_damage_of_the_same_size_is_rebuilt_without_force",
        limit="damage past a file's first and last 64 KiB is found by verify=True, not a rerun",
    ),
    Item(84, "prep", "a second run on shared storage, in another PID namespace").tried_by(
        RERUNS + "test_a_live_run_that_this_run_cannot_see_keeps_its_temp_files",
        limit="without flock (Windows, some network filesystems) runs neither wait nor clean up",
    ),
    Item(85, "prep", "a byte order mark, empty and whitespace-only documents").tried_by(
        PREP_FILES + "test_txt_bom_and_empty_documents_are_skipped_and_counted",
        PREP_FILES + "test_a_txt_byte_order_mark_is_not_in_the_first_document",
        TOKENIZE + "test_a_byte_order_mark_is_dropped_at_the_start_of_each_document_and_only_there",
        SMALL_INPUTS + "test_an_input_of_empty_documents_is_one_line_naming_it_and_the_counts",
        differs="an empty document is skipped and counted (source.n_empty_docs_skipped), not "
        "written as a lone end-of-text token as nanoGPT's prepare.py writes it",
    ),
    Item(86, "prep", "train alone from an input whose validation is carved").tried_by(
        PREP_INPUTS + "test_train_alone_from_a_carved_input_says_what_it_leaves_out"
    ),
    Item(
        87, "prep", "errors that named nothing: .json, .csv, sidecars, offline, read-only"
    ).tried_by(
        PREP_FILES + "test_a_json_file_with_an_int_among_strings_names_the_file_and_row",
        PREP_FILES + "test_a_csv_column_of_digits_is_text_and_errors_name_file_and_line",
        PREP_FILES + "test_the_prep_steps_own_outputs_in_an_input_folder_are_skipped",
        TOKENIZE + "test_an_encoding_that_must_be_downloaded_offline_says_how_to_provide_it",
        PREP_OUTPUTS + "test_an_up_to_date_rerun_into_a_read_only_folder_writes_nothing",
    ),
    Item(88, "prep", "shard sizes that divide the token count; a sharded split's totals").tried_by(
        RERUNS + "test_shard_tokens_that_divide_the_count_or_are_one",
        RERUNS + "test_a_sharded_splits_totals_come_from_every_shard",
    ),
    # --- issue 19/20: the loader ---
    Item(89, "workers", "DataLoader workers under a low open-file limit (a hang)").tried_by(
        FILES + "test_workers_under_a_low_open_file_limit_are_refused_at_once_naming_it",
        LOADERS + "test_the_descriptor_check_counts_the_batches_each_worker_prefetches",
        DESCRIPTORS + "test_workers_under_a_descriptor_budget_serve_the_epoch_or_name_the_limit",
        DESCRIPTORS + "test_pinning_that_fails_is_refused_naming_the_limit_and_both_ways_out",
    ),
    Item(90, "file", "llm.c shard whose unused header words are not zero").tried_by(
        FORMAT + "test_an_llmc_header_with_other_words_set_is_read_by_its_magic_and_version"
    ),
    Item(91, "distributed", "ranks with same-size files of other ids and no sidecars").tried_by(
        LOADERS + "test_torchrun_ranks_that_disagree_all_fail_naming_the_rank"
    ),
    Item(92, "params", "integers past int64, and a bool as an index").tried_by(
        DATASET + "test_huge_numbers_and_a_bool_index_are_refused_by_name"
    ),
    Item(93, "file", "sidecar with a null field, or a sidecar that is a link loop").tried_by(
        FORMAT + "test_a_sidecar_field_of_null_and_a_sidecar_link_loop_are_named"
    ),
    Item(94, "file", "same-size change in the last KiB of a large file").tried_by(
        FORMAT + "test_a_change_in_the_last_kib_of_a_large_file_is_refused_on_open"
    ),
    Item(95, "workers", "a hot file among more files than the map cap").tried_by(
        FILES + "test_a_hot_file_stays_mapped_while_cold_ones_take_turns",
        FILES + "test_a_worker_whose_maps_fill_the_cap_closes_the_least_recently_used",
    ),
    Item(
        96, "distributed", "a state saved mid-epoch: padded ranks, or right after set_epoch"
    ).tried_by(
        RESUME + "test_a_padded_sampler_resumed_mid_epoch_repeats_the_windows_a_whole_pass_would",
        RESUME + "test_a_state_saved_between_set_epoch_and_the_first_batch_counts_nothing_stale",
    ),
    Item(97, "params", "random windows of consecutive epochs").tried_by(
        DATASET + "test_random_windows_of_one_epoch_are_not_the_next_epochs_shifted_by_one"
    ),
    Item(98, "workers", "a peek at one batch before the training loop").tried_by(
        LOADERS + "test_a_peek_uses_up_no_epoch",
        differs="a pass left early does not count as an epoch: the loop after a peek starts "
        "epoch 0 from its first batch, as DataLoader with DistributedSampler does, also when "
        "DataLoader workers fetched the whole epoch (the loader counts what the loop received)",
    ),
    # --- issues 25 to 28: one writer, epochs that count, descriptors, your own text ---
    Item(
        99,
        "workers",
        "a loop that takes exactly len(loader) batches: zip, islice, a last-step break",
    ).tried_by(
        SAMPLER + "test_a_loop_that_takes_exactly_len_batches_moves_on_to_the_next_epoch",
        SAMPLER + "test_a_loop_that_calls_set_epoch_gets_its_epochs_whatever_workers_fetched",
        RESUME + "test_a_state_saved_at_a_break_is_exact_whatever_workers_fetched",
        SAMPLER + "test_the_pass_after_a_break_is_the_same_with_any_worker_count",
        differs="a pass moves on when the loop received all the batches of the one before, with "
        "any number of workers; the README's loop calls set_epoch(epoch) and saves the loader's "
        "state_dict(), both exact",
    ),
    Item(100, "params", "set_epoch called while a pass is running").tried_by(
        SAMPLER + "test_set_epoch_during_a_pass_chooses_the_pass_after_it"
    ),
    Item(
        101, "workers", "descriptors taken after make_dataloaders; budgets the check passes"
    ).tried_by(
        DESCRIPTORS + "test_workers_under_a_descriptor_budget_serve_the_epoch_or_name_the_limit",
        FILES + "test_running_out_of_descriptors_while_mapping_names_the_limit_and_ulimit",
    ),
    Item(102, "workers", "a GPU machine with a low open-file limit: pinning starts CUDA").tried_by(
        DESCRIPTORS + "test_pinning_that_fails_is_refused_naming_the_limit_and_both_ways_out"
    ),
    Item(
        103,
        "disk",
        "a writer refusal after the old file exists: Fortran order, a non-JSON field, a folder",
    ).tried_by(
        WRITER + "test_fortran_ordered_and_transposed_ids_are_written_in_c_order",
        WRITER + "test_a_refused_write_leaves_the_old_file_and_sidecar_as_they_were",
        WRITER + "test_a_refused_argument_leaves_the_old_file_and_sidecar_as_they_were",
        WRITER + "test_a_folder_at_the_path_is_refused_and_left_alone",
        WRITER + "test_the_fields_write_tokens_sets_are_the_ones_it_refuses_from_the_caller",
    ),
    Item(
        104, "prep", "a live write_tokens in a prep output folder; a lock file that cannot lock"
    ).tried_by(
        RERUNS + "test_a_prep_run_leaves_a_live_write_tokens_temp_file_alone",
        RERUNS + "test_a_lock_file_that_cannot_lock_is_an_error_naming_it",
    ),
    Item(105, "prep", "a dictionary-encoded (categorical) parquet text column").tried_by(
        PREP_FILES + "test_a_categorical_parquet_text_column_is_read_as_text"
    ),
    Item(
        106, "prep", "stories separated by blank lines; a validation split too small to use"
    ).tried_by(
        PREP_FILES + "test_separator_reads_each_form_of_a_txt_and_is_a_setting",
        PREP_FILES + "test_a_txt_of_a_document_a_line_with_a_few_empty_lines_gets_the_note",
        PREP_FILES + "test_six_stories_of_25_lines_between_blank_lines_get_the_note",
        SMALL_INPUTS + "test_the_progress_bar_ends_at_its_total_with_empty_documents_among_them",
        SMALL_INPUTS
        + "test_a_validation_split_too_small_for_ten_windows_is_a_warning_naming_val_fraction",
    ),
    Item(
        107, "file", "an old file audited in full: fields, sha256, ids, shard sets, a file twice"
    ).tried_by(
        VERIFY + "test_each_field_of_the_wrong_json_type_fails",
        VERIFY + "test_damage_past_the_probe_fails_the_sha256",
        VERIFY + "test_an_id_outside_the_vocabulary_fails_the_scan",
        VERIFY + "test_a_shard_set_with_shards_missing_fails_each_of_its_files",
        VERIFY + "test_a_file_given_twice_fails_the_second_time",
        differs="the loader checks only what it uses and what can change after writing (size, "
        "probe, dtype, shape, version, tokenizer); prepare_tokens.py --verify makes the deep checks",
    ),
    Item(108, "dtype", "a sidecar's max_token_id from the largest id, not the last").tried_by(
        RERUNS + "test_max_token_id_is_the_largest_id_of_every_chunk_not_the_first"
    ),
]
