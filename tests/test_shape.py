"""The shape of npy_datasets.py as a reader meets it, measured on the file as ruff formats it.

A reference reads one idea a line: no function longer than a screen, no walrus, no state packed
into positional tuples, and the path that valid input takes free of refusals (they live in the
module's last section, "Checks", one checker per kind of input).
"""

import ast

from conftest import ROOT

MODULE = ROOT / "python_files" / "npy_datasets.py"
MAX_LINES = 1_385  # the honest size with every tested behaviour: see docs/maintainers.md
MAX_FUNCTION_LINES = 50
MAIN_PATH = {  # what valid input runs through: no `raise` in these
    "NpyTokensDataset.__init__",
    "NpyTokensDataset.locate",
    "NpyTokensDataset._gather",
    "EpochSampler.__init__",
    "EpochSampler.order",
    "EpochSampler.__iter__",
    "make_dataloaders",
}


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    found[f"{node.name}.{item.name}"] = item
    return found


TREE = ast.parse(MODULE.read_text(encoding="utf-8"))
FUNCTIONS = _functions(TREE)


def test_the_module_is_at_most_its_honest_size():
    lines = len(MODULE.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"npy_datasets.py has {lines} lines (formatted), over {MAX_LINES}"


def test_no_function_is_longer_than_fifty_lines():
    long = {
        name: node.end_lineno - node.lineno + 1
        for name, node in FUNCTIONS.items()
        if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert len(FUNCTIONS) > 40 and not long, long


def test_no_walrus_and_no_state_packed_into_a_tuple():
    walrus = [node.lineno for node in ast.walk(TREE) if isinstance(node, ast.NamedExpr)]
    packed = [  # self.a, self.b = ...: state assigned by position
        node.lineno
        for node in ast.walk(TREE)
        if isinstance(node, ast.Assign)
        and any(
            isinstance(target, ast.Tuple) and any(isinstance(e, ast.Attribute) for e in target.elts)
            for target in node.targets
        )
    ]
    assert not walrus and not packed, {"walrus": walrus, "packed state": packed}


def test_the_main_path_holds_no_raise():
    assert MAIN_PATH <= set(FUNCTIONS), MAIN_PATH - set(FUNCTIONS)
    raising = {
        name: [node.lineno for node in ast.walk(FUNCTIONS[name]) if isinstance(node, ast.Raise)]
        for name in MAIN_PATH
    }
    assert not any(raising.values()), raising
    checkers = [name for name in FUNCTIONS if name.startswith("_check")]
    assert len(checkers) > 20  # the refusals live there
