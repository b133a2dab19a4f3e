#!/usr/bin/env python
"""A linter for the ways this project must never load data: unpickling, np.load(allow_pickle=...),
torch.load without weights_only=True, pandas' read_pickle, and Hub remote code (trust_remote_code).

    python tools/code_hazards.py              # every .py file and notebook of the repository
    python tools/code_hazards.py FILE ...     # these .py files or notebooks

Prints one line per hazard and exits 1 if there is any. tests/test_style.py runs it on the
repository (items 72-77 of tests/bad_inputs.md).
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


PICKLE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "joblib"}


def project_sources(root: Path) -> list[tuple[str, str]]:
    """(name, Python source) of every .py file and every notebook's code cells, virtual environments excluded."""
    skip = {
        ".git",
        "data",
        "__pycache__",
        "node_modules",
        ".ipynb_checkpoints",
        ".hypothesis",
        ".pytest_cache",
    }
    paths = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [
            d for d in dirs if d not in skip and not (Path(folder, d) / "pyvenv.cfg").exists()
        ]  # no venvs
        paths += [Path(folder, f) for f in files]
    sources = []
    for path in sorted(paths):
        rel = path.relative_to(root)
        if path.suffix == ".py":
            sources.append((str(rel), path.read_text(encoding="utf-8")))
        elif path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
            lines = (
                "" if line.lstrip().startswith(("%", "!")) else line
                for cell in code
                for line in cell.splitlines()
            )
            sources.append((str(rel), "\n".join(lines)))
    return sources


def _scopes(tree: ast.AST):
    """Each scope (module, function, lambda, class) with the nodes that belong to it directly."""
    scope_types = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, scope_types))]:
        nodes, stack = [], list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            nodes.append(node)
            if not isinstance(node, scope_types):
                stack.extend(ast.iter_child_nodes(node))
        yield nodes


def code_hazards(source: str) -> list[str]:
    """Unpickling, pickle-enabled loads, torch.load without weights_only=True, and Hub remote code.

    pickle.loads is allowed on bytes that pickle.dumps made in the same scope (a name every
    assignment of which is a dumps call): that is an in-memory round trip of the program's own
    object, which is what DataLoader does for spawned workers, not data read from anywhere.
    """
    tree = ast.parse(source)
    found = []
    pickles, torches = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                (pickles if root in PICKLE_MODULES else torches if root == "torch" else set()).add(
                    alias.asname or root
                )
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if node.module.split(".")[0] in PICKLE_MODULES and alias.name in (
                    "load",
                    "loads",
                    "Unpickler",
                ):
                    found.append(f"line {node.lineno}: imports {node.module}.{alias.name}")
                if node.module == "torch" and alias.name == "load":
                    found.append(
                        f"line {node.lineno}: imports torch.load (use torch.load(..., weights_only=True))"
                    )

    def is_dumps(value):
        return (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr == "dumps"
            and isinstance(value.func.value, ast.Name)
            and value.func.value.id in pickles
        )

    for nodes in _scopes(tree):
        assigned: dict[str, bool] = {}
        for node in nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned[target.id] = assigned.get(target.id, True) and is_dumps(node.value)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.NamedExpr)) and isinstance(
                node.target, ast.Name
            ):
                assigned[node.target.id] = False
        for node in nodes:
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            owner = (
                func.value.id
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                else None
            )
            keywords = {k.arg: k.value for k in node.keywords}
            if owner in pickles and func.attr in ("load", "Unpickler"):
                found.append(f"line {node.lineno}: {owner}.{func.attr}")
            if owner in pickles and func.attr == "loads":
                arg = node.args[0] if node.args else None
                own = is_dumps(arg) or (isinstance(arg, ast.Name) and assigned.get(arg.id, False))
                if not own:
                    found.append(
                        f"line {node.lineno}: {owner}.loads of bytes not made by {owner}.dumps here"
                    )
            if isinstance(func, ast.Attribute) and func.attr == "read_pickle":
                found.append(f"line {node.lineno}: read_pickle")
            if owner in torches and func.attr == "load":
                weights_only = keywords.get("weights_only")
                if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                    found.append(f"line {node.lineno}: torch.load without weights_only=True")
            for name in ("allow_pickle", "trust_remote_code"):
                if name in keywords and not (
                    isinstance(keywords[name], ast.Constant) and keywords[name].value is False
                ):
                    found.append(f"line {node.lineno}: {name}={ast.unparse(keywords[name])}")
    return found


def main(argv: list[str]) -> int:
    if argv:
        sources = []
        for name in argv:
            path = Path(name)
            if path.suffix == ".ipynb":
                cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
                sources.append(
                    (
                        name,
                        "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code"),
                    )
                )
            else:
                sources.append((name, path.read_text(encoding="utf-8")))
    else:
        sources = project_sources(ROOT)
    hazards = [f"{name}: {hazard}" for name, source in sources for hazard in code_hazards(source)]
    print("\n".join(hazards) or f"no hazards in {len(sources)} files")
    return 1 if hazards else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
