"""The README's "Use the module in your project" snippet runs as written, in a fresh process."""

import os
import re
import subprocess
import sys

from conftest import ROOT


def readme_snippet(section: str) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", body, flags=re.S)
    assert blocks, f"no python block under '## {section}'"
    return blocks[0]


def test_the_use_the_module_snippet_runs_as_written(tmp_path):
    code = readme_snippet("Use the module in your project")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT / "python_files"),
    }  # the copied module sits beside the script
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.fullmatch(
        r"16 batches of \(12, 1024\) on (cpu|cuda:\d+); next epoch 1\n", proc.stdout
    ), proc.stdout
    assert {p.name for p in tmp_path.iterdir()} == {
        "train.npy",
        "val.bin",
    }  # it writes only its own files
