"""The README's "With Lightning, accelerate or torchdata", Lightning's part: its commands, word for
word, on a small token folder, in 1 and 2 processes. Every rank trains the batches make_dataloaders'
loader gives on its own, the ranks' shares of each epoch are disjoint and whole, and a run resumed from
a checkpoint trains the unbroken run's batches step for step, across epoch ends (issue 32). Accelerate
and torchdata: test_frameworks_accelerate.py; the shared parts: frameworks_harness.py."""

import sys

import pytest

from conftest import ROOT
from frameworks_harness import (
    BATCH,
    SEQ,
    check_runs,
    readme_block,
    readme_commands,
    run,
)

pytest.importorskip("lightning")


def test_lightning_commands_one_process(framework_tokens, tmp_path):
    commands = readme_commands("lightning")
    one = [c for c in commands if "--devices" not in c]
    assert len(one) == 2 and "--resume" in one[1]
    first = run(one[0], tmp_path, framework_tokens, tmp_path / "whole.jsonl")
    second = run(
        one[1], tmp_path, framework_tokens, tmp_path / "resumed.jsonl"
    )  # from step 15 of 20
    assert first.splitlines()[-1] == second.splitlines()[-1]  # the same loss, to the last digit
    check_runs(framework_tokens, 1, tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", 15)
    at_the_end = [*one[0], "--resume", "data/lightning/step=20.ckpt"]  # epoch 0's last batch
    run(at_the_end, tmp_path, framework_tokens, tmp_path / "end.jsonl")
    check_runs(framework_tokens, 1, tmp_path / "whole.jsonl", tmp_path / "end.jsonl", 20)


def test_lightning_commands_two_processes(framework_tokens, tmp_path):
    two = [c for c in readme_commands("lightning") if "--devices" in c]
    assert len(two) == 2 and "--resume" in two[1]
    run(two[0], tmp_path, framework_tokens, tmp_path / "whole.jsonl")
    run(two[1], tmp_path, framework_tokens, tmp_path / "resumed.jsonl")  # from step 5 of 10 a rank
    check_runs(framework_tokens, 2, tmp_path / "whole.jsonl", tmp_path / "resumed.jsonl", 5)


def test_the_readme_shows_the_examples_own_code():
    lightning = (ROOT / "python_files" / "lightning_example.py").read_text(encoding="utf-8")
    block = readme_block("**PyTorch Lightning**")
    assert block in lightning  # the data module, as the example defines it
    accelerate = (ROOT / "python_files" / "accelerate_example.py").read_text(encoding="utf-8")
    lines = {line.strip() for line in accelerate.splitlines()}
    assert all(line in lines for line in readme_block("**accelerate**").splitlines())


def test_a_lightning_checkpoint_saved_after_max_steps_is_refused_naming_the_fix(
    framework_tokens, tmp_path
):
    """trainer.save_checkpoint after fit(max_steps=12) counts the stopped epoch as done, while the
    loader's state continues it: the resumed fit stops at once, naming ModelCheckpoint, instead of
    skipping the rest of the epoch or serving it as the next one."""
    import lightning as L

    sys.path.insert(0, str(ROOT / "python_files"))
    from lightning_example import TinyModel, TokenData

    quiet = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}
    options = {"accelerator": "cpu", "devices": 1, "enable_checkpointing": False, **quiet}
    trainer = L.Trainer(max_steps=12, **options)  # 12 of epoch 0's 20 batches
    trainer.fit(TinyModel(1000), datamodule=TokenData(framework_tokens, SEQ, BATCH))
    trainer.save_checkpoint(tmp_path / "after_12.ckpt")
    resumed = L.Trainer(max_steps=30, **options)
    with pytest.raises(ValueError, match=r"set_epoch\(1\), but .* epoch 0 at 48.*ModelCheckpoint"):
        resumed.fit(
            TinyModel(1000),
            datamodule=TokenData(framework_tokens, SEQ, BATCH),
            ckpt_path=tmp_path / "after_12.ckpt",
        )
