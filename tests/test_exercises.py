"""Every exercise has a reference answer, and each answer is collected after its notebook's cells.

The answers themselves live in tests/notebook_exercises.py, a pytest plugin (pytest.ini: -p), which
adds them to each notebook's nbval run as "notebooks/NAME.ipynb::Exercise K".
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SUBPROCESS_TIMEOUT
from notebook_exercises import ANSWERS, PENDING, key_of
from test_notebooks import NOTEBOOKS


def _exercise_numbers(notebook: Path) -> list[int]:
    """The numbers of the list under the notebook's **Exercises** heading."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    if "**Exercises**" not in text:
        return []
    exercises = re.split(r"\n\*\*(Next|Back)", text.split("**Exercises**", 1)[1])[0]
    return [int(n) for n in re.findall(r"^(\d+)\. ", exercises, flags=re.M)]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_an_answer(notebook):
    key = key_of(notebook)
    answered = sorted(n for k, n in ANSWERS if k == key)
    if key in PENDING:
        assert not answered, f"{key} has answers now: take it out of PENDING"
        pytest.skip(f"{key}: its exercises have no reference answers yet (PENDING)")
    numbers = _exercise_numbers(notebook)
    assert numbers, f"{notebook.name} has no numbered list under **Exercises**"
    assert answered == numbers, f"exercises {numbers}, answers {answered}"


def test_answers_and_pending_name_notebooks_that_exist():
    named = {key for key, _ in ANSWERS} | PENDING
    missing = named - {key_of(nb) for nb in NOTEBOOKS}
    assert not missing, f"no notebook is named {sorted(missing)}"
    built = next(nb for nb in NOTEBOOKS if key_of(nb) == "build_the_dataset")
    assert _exercise_numbers(built) == [1, 2, 3]  # the parser reads the list it is meant to


def test_a_notebooks_answers_follow_its_last_cell_and_need_all_of_them():
    whole, part = "notebooks/03_build_the_dataset.ipynb", "notebooks/01_tokenize_tinystories.ipynb"
    answer = "notebooks/02_write_token_files.ipynb::Exercise 2"  # chosen by its id: it runs alone
    cells = json.loads((ROOT / whole).read_text(encoding="utf-8"))["cells"]
    code_cells = sum(cell["cell_type"] == "code" for cell in cells)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # pytest.ini's options
    done = subprocess.run(  # pytest's collection only, in the folder pytest.ini is in
        [sys.executable, "-m", "pytest", "--co", "-q", "-n", "0", whole, f"{part}::Cell 0", answer],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert collected == [
        *(f"{whole}::Cell {i}" for i in range(code_cells)),
        *(f"{whole}::Exercise {n}" for n in (1, 2, 3)),
        f"{part}::Cell 0",  # one cell of a notebook: its answers are not chosen with it
        answer,
    ]
