"""One layout and one lint set for every Python file and notebook: ruff, pinned in requirements.txt.

After an edit, `.venv/bin/ruff format . && .venv/bin/ruff check --fix .` from the repository root
makes these pass. The notebook/module agreement test compares syntax trees, so formatting a
definition in either place changes nothing there.
"""

import re
import subprocess
import sys

import pytest

from conftest import ROOT

FOLDERS = ("python_files", "tests", "tools", "benchmarks", "materials")
SOURCES = [path for folder in FOLDERS for path in sorted((ROOT / folder).glob("*.py"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_ruff_format_leaves_every_file_as_it_is():
    result = _ruff("format", "--check", "--diff", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_check_passes():
    result = _ruff("check", ".")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize("path", SOURCES + NOTEBOOKS, ids=lambda p: p.name)
def test_no_format_escape_and_every_noqa_says_why(path):
    text = path.read_text(encoding="utf-8")
    assert "fmt: " + "skip" not in text and "fmt: " + "off" not in text, path.name
    for line in text.splitlines():
        match = re.search(r"#\s*noqa(: [A-Z0-9, ]+)?(.*)", line)
        if match:  # the reason follows the codes, on the same line: "# noqa: E402 (after sys.path)"
            assert match[2].strip(' \\n",'), f"{path.name}: noqa without a reason: {line.strip()}"
