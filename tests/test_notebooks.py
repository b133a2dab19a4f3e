"""The notebooks and the modules in python_files/ must be the same code, and the notebooks tidy.

A definition is "taught" when a notebook code cell defines it: a top-level def or class, a method
inside a class cell, or a method defined on its own and attached with `Class.name = name`. Its
parsed code (docstring and annotations included, comments and layout not) must equal the module's.
"""

import ast
import builtins
import inspect
import json
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
PREP_PARTS = ("prep_settings", "prep_sources", "prep_files", "prep_tokenize", "prep_outputs")
MODULES = {  # where the definitions a notebook may teach live; prepare_tokens imports the prep_*
    name: ROOT / "python_files" / f"{name}.py"
    for name in ("npy_datasets", "prepare_tokens", *PREP_PARTS, "train_tiny")  # 06 teaches the last
}
PUBLIC_MODULES = ("npy_datasets", "prepare_tokens")  # their __all__ is what the notebooks cover


def _code_cells(notebook: Path) -> list[str]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    # IPython-only lines (magics, shell escapes) are not Python; blank them before parsing.
    return [
        "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in s.splitlines())
        for s in sources
    ]


def _without_methods(node: ast.ClassDef) -> str:
    """A class statement's own part: name, bases, decorators and non-method body (docstring)."""
    body = [n for n in node.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return ast.dump(
        ast.ClassDef(
            name=node.name,
            bases=node.bases,
            keywords=node.keywords,
            body=body,
            decorator_list=node.decorator_list,
        )
    )


def _clean_docstrings(tree: ast.AST) -> ast.AST:
    """Docstrings as inspect.cleandoc leaves them: a method taught on its own, outside its class,
    is dedented, and so are the continuation lines of its docstring."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                first.value.value = inspect.cleandoc(first.value.value)
    return tree


def definitions(tree: ast.Module) -> dict[str, str]:
    """Qualified name -> dumped AST for the defs, classes, methods and constants of one module."""
    tree = _clean_docstrings(tree)
    found: dict[str, str] = {}
    attached = {}  # `Class.method = method` statements attach a top-level def to a class
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
        ):
            target = node.targets[0]
            if isinstance(target.value, ast.Name) and isinstance(node.value, ast.Name):
                attached[node.value.id] = f"{target.value.id}.{target.attr}"
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[attached.get(node.name, node.name)] = ast.dump(node)
        elif isinstance(node, ast.ClassDef):
            found[node.name] = _without_methods(node)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{item.name}"] = ast.dump(item)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id.isupper():
                    found[t.id] = ast.dump(node)
    return found


def module_definitions() -> dict[str, dict[str, str]]:
    return {
        name: definitions(ast.parse(path.read_text(encoding="utf-8")))
        for name, path in MODULES.items()
    }


def taught_definitions() -> dict[str, list[tuple[str, str]]]:
    """Qualified name -> [(notebook name, dumped AST)] for every definition in every notebook."""
    taught = defaultdict(list)
    for nb in NOTEBOOKS:
        for source in _code_cells(nb):
            for name, dump in definitions(ast.parse(source)).items():
                taught[name].append((nb.name, dump))
    return taught


def public_names(module: str) -> list[str]:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", None) == "__all__" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module} has no __all__")


def test_there_are_numbered_notebooks():
    assert len(NOTEBOOKS) >= 4
    for nb in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9]+(_[a-z0-9]+)+\.ipynb", nb.name), nb.name


def _used_names(notebook: Path) -> set[str]:
    """Names a notebook's code reads: plain names and attributes (nd.open_tokens reads open_tokens)."""
    used = set()
    for source in _code_cells(notebook):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
    return used


def test_every_public_name_is_taught_or_used_somewhere():
    """The notebooks teach the core line for line and show the rest by import: every public name of
    the modules is either defined in a notebook (and equal to the module's) or used by one."""
    taught = taught_definitions()
    used = set().union(*(_used_names(nb) for nb in NOTEBOOKS))
    missing = [
        f"{module}.{name}"
        for module in PUBLIC_MODULES
        for name in public_names(module)
        if name not in used and not any(q == name or q.startswith(name + ".") for q in taught)
    ]
    assert not missing, f"public, but neither taught nor used in any notebook: {missing}"


def test_taught_definitions_equal_the_modules():
    modules = module_definitions()
    by_name = defaultdict(list)
    for module, defs in modules.items():
        for name, dump in defs.items():
            by_name[name].append((module, dump))
    drift = []
    for name, places in taught_definitions().items():
        if name not in by_name:
            continue  # a notebook-only helper (a plot, a demonstration)
        for notebook, dump in places:
            if all(dump != module_dump for _, module_dump in by_name[name]):
                modules_named = ", ".join(m for m, _ in by_name[name])
                drift.append(f"{notebook}: {name} differs from {modules_named}")
    assert not drift, "notebook and module disagree:\n" + "\n".join(drift)


def test_taught_definitions_equal_the_modules_text_comments_included():
    """The test above compares code; this one the text too, comments included, so that a
    comment changed in a module reaches the notebooks that copy the definition
    (sync_notebooks.py copies it)."""
    sync = [sys.executable, str(ROOT / "tools" / "sync_notebooks.py"), "--check"]
    found = subprocess.run(sync, capture_output=True, text=True, timeout=60)  # 1.5 s quiet
    assert found.returncode == 0, f"run tools/sync_notebooks.py:\n{found.stdout}{found.stderr}"


# --- hygiene ------------------------------------------------------------------------------------

ABSOLUTE_PATH = re.compile(r"(/home/|/root/|/work/|/tmp/|/Users/|[A-Z]:\\\\)")


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_hygiene(notebook):
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    counts = [c["execution_count"] for c in code]
    assert counts == list(range(1, len(code) + 1)), f"cells not run top to bottom once: {counts}"
    for cell in code:  # a check cell asserts or prints: its stored output is what nbval compares
        source = "".join(cell["source"])
        if re.search(r"^(assert |print\()", source, flags=re.M) and not cell["outputs"]:
            raise AssertionError(f"stored output missing for:\n{source[:200]}")
    for cell in code:
        source = "".join(cell["source"])
        ignored = source.startswith("# NBVAL_IGNORE_OUTPUT")
        for out in cell["outputs"]:
            text = json.dumps(out)
            assert not ABSOLUTE_PATH.search(text), f"absolute path in an output of:\n{source[:200]}"
            if not ignored:
                assert out.get("name") != "stderr", f"stderr in a compared cell:\n{source[:200]}"
        assert not ABSOLUTE_PATH.search(source), f"absolute path in:\n{source[:200]}"


# --- size and names ----------------------------------------------------------------------------

MAX_CELL_LINES, MAX_NOTEBOOK_LINES = 40, 400  # a step is short enough to read at once


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_cells_are_short_and_notebooks_too(notebook):
    sizes = [len(source.splitlines()) for source in _code_cells(notebook)]
    assert max(sizes) <= MAX_CELL_LINES, (
        f"a code cell of {max(sizes)} lines (cell {sizes.index(max(sizes))})"
    )
    assert sum(sizes) <= MAX_NOTEBOOK_LINES, f"{sum(sizes)} code lines"


IPYTHON_NAMES = {"display", "get_ipython", "In", "Out", "_", "__", "___"}  # defined by the kernel
NESTED_SCOPES = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.Lambda,
    ast.ClassDef,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
)


def _scope_parts(scope: ast.AST) -> tuple[list[ast.AST], list[ast.AST]]:
    """The nodes a scope evaluates itself, and the nested scopes inside it. A def's decorators, defaults
    and annotations belong to the scope around it; its parameters and body to its own."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        todo = [scope.args] + (scope.body if isinstance(scope.body, list) else [scope.body])
    elif isinstance(scope, ast.ClassDef):
        todo = list(scope.body)
    else:  # a module or a comprehension
        todo = list(ast.iter_child_nodes(scope))
    own, nested = [], []
    while todo:
        node = todo.pop()
        own.append(node)
        if isinstance(node, NESTED_SCOPES):
            nested.append(node)
            outer = [
                *getattr(node, "decorator_list", []),
                *getattr(node, "bases", []),
                *getattr(node, "keywords", []),
            ]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                outer += [*args.defaults, *[d for d in args.kw_defaults if d is not None]]
                outer += [
                    a.annotation
                    for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]
                    if a.annotation
                ]
                outer += [node.returns] if getattr(node, "returns", None) else []
            todo.extend(outer)
        elif isinstance(node, ast.arguments):
            own.extend(
                a
                for a in [*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg]
                if a
            )
        else:
            todo.extend(ast.iter_child_nodes(node))
    return own, nested


def _bound(nodes: list[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names |= set(node.names)
    return names


def _undefined(scope: ast.AST, visible: set[str], module_names: set[str]) -> list[tuple[str, int]]:
    """Names a scope reads that nothing binds: in itself, an enclosing function, or (for code that runs
    later, inside a def) anywhere in the notebook's top level."""
    own, nested = _scope_parts(scope)
    mine = (
        visible
        | _bound(own)
        | (_bound([scope]) if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) else set())
    )
    missing = [
        (n.id, n.lineno)
        for n in own
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in mine
    ]
    inner = (
        (mine - _bound(own)) | module_names
        if isinstance(scope, ast.ClassDef)
        else mine | module_names
    )
    for child in nested:
        missing += _undefined(child, inner, module_names)
    return missing


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_code_uses_no_undefined_name(notebook):
    """Read in order, every name a notebook's code uses is defined in it (or is a builtin): a name that
    only another notebook, or the module, defines would fail the first time that line runs."""
    trees = [ast.parse(source) for source in _code_cells(notebook)]
    everywhere = set().union(*(_bound(_scope_parts(t)[0]) for t in trees))
    seen, problems = set(dir(builtins)) | IPYTHON_NAMES, []
    for number, tree in enumerate(trees):
        seen |= _bound(_scope_parts(tree)[0])
        problems += [
            f"cell {number}: {name} (line {line})"
            for name, line in _undefined(tree, seen, everywhere | seen)
        ]
    assert not problems, "undefined names:\n" + "\n".join(problems)
