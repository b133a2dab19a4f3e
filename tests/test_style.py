"""One layout and one lint set for every Python file and notebook: ruff, pinned in requirements.txt;
test files of at most 600 lines, no test name defined twice; and code_hazards, the linter for the
ways this project must never load data (catalogue items 72 and 77, tests/bad_inputs.md).

After an edit, `.venv/bin/ruff format . && .venv/bin/ruff check --fix .` from the repository root
makes these pass. The notebook/module agreement test compares syntax trees, so formatting a
definition in either place changes nothing there.
"""

import ast
import re
import subprocess
import sys
from collections import defaultdict

import pytest

from code_hazards import code_hazards, project_sources
from conftest import ROOT

FOLDERS = ("python_files", "tests", "tools", "benchmarks", "materials")
SOURCES = [path for folder in FOLDERS for path in sorted((ROOT / folder).glob("*.py"))]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TEST_FILES = sorted((ROOT / "tests").glob("test_*.py"))
MAX_TEST_FILE_LINES = 600  # as ruff format lays a file out; split a longer one by unit
PREP_FILES = [ROOT / "python_files" / "prepare_tokens.py"] + sorted(
    (ROOT / "python_files").glob("prep_*.py")
)  # the prep step: its entry point and the files it is split into
MAX_FUNCTION_LINES = 50  # a function, decorators included, as ruff format lays it out


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


def test_every_test_file_is_at_most_600_lines():
    lengths = {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in TEST_FILES}
    assert len(lengths) > 10, lengths
    long = {name: n for name, n in lengths.items() if n > MAX_TEST_FILE_LINES}
    assert not long, f"test files over {MAX_TEST_FILE_LINES} lines: {long}"


def test_no_test_function_is_defined_twice_under_one_name():
    defined = defaultdict(list)  # name -> the files (once per definition) that define it
    for path in TEST_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test"
            ):
                defined[node.name].append(path.name)
    twice = {name: files for name, files in defined.items() if len(files) > 1}
    assert not twice, f"test names defined more than once: {twice}"


def test_no_pickle_loading_or_remote_code():
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


def _packed(node: ast.AST) -> bool:
    """An assignment of several unrelated values on one line: `a, b = 1, []`."""
    return (
        isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Tuple)
        and isinstance(node.value, ast.Tuple)
    )


def test_the_prep_files_read_like_a_reference():
    assert len(PREP_FILES) > 1, PREP_FILES  # split by job: the command line, sources, outputs
    problems = []
    for path in PREP_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.name} line {getattr(node, 'lineno', '?')}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                length = node.end_lineno - first + 1
                if length > MAX_FUNCTION_LINES:
                    problems.append(f"{where}: {node.name} is {length} lines")
            if isinstance(node, ast.NamedExpr):
                problems.append(f"{where}: a walrus")
            if _packed(node):
                problems.append(f"{where}: several values assigned on one line")
    assert not problems, problems


def test_importing_the_prep_files_imports_no_torch():
    names = [path.stem for path in PREP_FILES]
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('torch', 'npy_datasets') if m in sys.modules))"
    )  # npy_datasets, whose FORMAT_VERSION prepare_tokens writes, imports torch only when used
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT / "python_files",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "['npy_datasets']", proc.stderr[-2000:]
