"""python_files/ddp_example.py on one process: a resumed run continues the step count.

The example's torchrun runs are in test_loaders.py; this file runs it without torchrun, on the CPU.
"""

import sys

import pytest

import ddp_example
from conftest import ROOT, run_process

EXAMPLE = [sys.executable, str(ROOT / "python_files" / "ddp_example.py")]


def step_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("rank ")]


def test_a_resumed_run_prints_the_global_step_and_the_same_batches(tmp_path):
    data, state = tmp_path / "data", tmp_path / "state.json"
    common = ["--data", str(data), "--batch-size", "2", "--seq-len", "16"]
    whole = run_process([*EXAMPLE, *common, "--steps", "6"])
    assert whole.returncode == 0, whole.stderr[-2000:]
    first = run_process([*EXAMPLE, *common, "--steps", "4", "--save-state", str(state)])
    resumed = run_process([*EXAMPLE, *common, "--steps", "2", "--resume", str(state)])
    assert first.returncode == 0 and resumed.returncode == 0, resumed.stderr[-2000:]
    assert len(step_lines(whole.stdout)) == 6
    assert step_lines(first.stdout) == step_lines(whole.stdout)[:4]
    assert step_lines(resumed.stdout) == step_lines(whole.stdout)[4:]  # "step 5", "step 6"
    assert "step 5 " in step_lines(resumed.stdout)[0]


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"step": 3}', "it has no 'sampler'"),
        ("not json", "Expecting value"),
        ('{"step": 3, "sampler": {"epoch": -1}}', "epoch"),
    ],
)
def test_a_resume_file_it_cannot_use_is_refused_naming_resume(tmp_path, capsys, text, said):
    state = tmp_path / "state.json"
    state.write_text(text)
    common = ["--data", str(tmp_path / "data"), "--steps", "1", "--resume", str(state)]
    with pytest.raises(SystemExit) as exit:
        ddp_example.main(common)
    assert str(exit.value).startswith(f"--resume {state}: not a state --save-state wrote: ")
    assert said in str(exit.value)
