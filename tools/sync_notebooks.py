"""Copy the modules' definitions into the notebook cells that teach them, then re-run the notebooks.

The modules in python_files/ are the source of truth; test_notebooks.py fails when a notebook's
copy of a definition differs. After changing a module:

    .venv/bin/python tools/sync_notebooks.py            # rewrite drifted definitions in place
    .venv/bin/python tools/sync_notebooks.py --execute  # ... and re-execute every notebook
    .venv/bin/python tools/sync_notebooks.py --check    # exit 1 if anything would change

A definition has drifted when its code or its text (comments and docstrings included) differs
from the module's. Only a drifted definition's own lines are replaced (a def, a method inside a
class cell, a method taught on its own and attached with `Class.name = name`, an UPPER_CASE
constant); prose, the cells around it and a class cell's other parts stay as written. Execution
runs each notebook top to bottom in a fresh kernel from the repository root, with no timing
metadata, so stored outputs stay deterministic.
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from pathlib import Path

import nbformat

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "tests")
)  # test_notebooks holds the comparison
from test_notebooks import MODULES, NOTEBOOKS, definitions, taught_definitions  # noqa: E402 (imported after the sys.path line above)


def _first_line(node: ast.AST) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def _methods(node: ast.ClassDef) -> list[ast.AST]:
    return [item for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _header_lines(node: ast.ClassDef, lines: list[str]) -> tuple[int, int]:
    """First and last line of a class statement's own part: up to its first method, blank lines trimmed."""
    methods = _methods(node)
    last = _first_line(methods[0]) - 1 if methods else node.end_lineno
    while last > node.lineno and not lines[last - 1].strip():
        last -= 1
    return _first_line(node), last


def _segments(tree: ast.Module, lines: list[str]) -> dict[str, str]:
    """Qualified name -> source text (decorators included, dedented) of each definition; a class
    name maps to its own part (header, docstring, attributes), "Class.method" to each method."""
    out: dict[str, str] = {}

    def text(first: int, last: int) -> str:
        return textwrap.dedent("".join(lines[first - 1 : last]))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = text(_first_line(node), node.end_lineno)
        elif isinstance(node, ast.ClassDef):
            out[node.name] = text(*_header_lines(node, lines))
            for item in _methods(node):
                out[f"{node.name}.{item.name}"] = text(_first_line(item), item.end_lineno)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id.isupper():
                    out[t.id] = text(_first_line(node), node.end_lineno)
    return out


def module_sources() -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, list[str]]]:
    """Per qualified name: the modules' dumped ASTs and their source texts; per class, its methods in order."""
    dumps: dict[str, list[str]] = {}
    texts: dict[str, list[str]] = {}
    methods: dict[str, list[str]] = {}
    for path in MODULES.values():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        for name, dump in definitions(ast.parse(source)).items():
            dumps.setdefault(name, []).append(dump)
        for name, text in _segments(ast.parse(source), lines).items():
            texts.setdefault(name, []).append(text)
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef):
                methods[node.name] = [item.name for item in _methods(node)]
    return dumps, texts, methods


def sync_cell(
    source: str,
    dumps: dict[str, list[str]],
    texts: dict[str, list[str]],
    methods: dict[str, list[str]] | None = None,
    taught: set[str] | None = None,
) -> tuple[str, list[str]]:
    """The cell's source with drifted definitions replaced, and the names replaced or added.

    A class taught in this cell also gets its own part (header, docstring) replaced when that drifted,
    and gains the module's methods that no notebook teaches yet, each after the method before it."""
    parsable = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )
    try:
        tree = ast.parse(parsable)
    except SyntaxError:
        return source, []
    mine = definitions(ast.parse(parsable))
    attached = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Attribute)
        ):
            target = node.targets[0]
            if isinstance(target.value, ast.Name) and isinstance(node.value, ast.Name):
                attached[node.value.id] = f"{target.value.id}.{target.attr}"
    candidates: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            candidates.append((attached.get(node.name, node.name), node))
        elif isinstance(node, ast.ClassDef):
            candidates += [
                (f"{node.name}.{item.name}", item)
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id.isupper():
                    candidates.append((t.id, node))
    lines = source.splitlines(keepends=True)
    edits = []

    def indented(name: str, col: int) -> str:
        return textwrap.indent(texts[name][0], " " * col, lambda line: line.strip() != "")

    def replacing(
        first: int, last: int, text: str
    ) -> str:  # keep the cell's ending: no newline after its last line
        return text if lines[last - 1].endswith("\n") else text.rstrip("\n")

    for name, node in candidates:
        if name not in dumps:
            continue
        first, last = _first_line(node), node.end_lineno
        here = textwrap.dedent("".join(lines[first - 1 : last])).rstrip("\n")
        same_text = here in (text.rstrip("\n") for text in texts[name])  # comments too
        if mine.get(name) in dumps[name] and same_text:
            continue
        edits.append((first, last, replacing(first, last, indented(name, node.col_offset)), name))
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name not in dumps:
            continue
        if mine.get(node.name) not in dumps[node.name]:
            first, last = _header_lines(node, lines)
            edits.append(
                (
                    first,
                    last,
                    replacing(first, last, indented(node.name, node.col_offset)),
                    node.name,
                )
            )
        here = {item.name: item for item in _methods(node)}
        col = next(iter(here.values())).col_offset if here else node.col_offset + 4
        for k, method in enumerate((methods or {}).get(node.name, [])):
            name = f"{node.name}.{method}"
            if method in here or name in (taught or set()):
                continue
            before = [here[m] for m in (methods or {})[node.name][:k] if m in here]
            after = before[-1].end_lineno if before else _header_lines(node, lines)[1]
            newline = "" if lines[after - 1].endswith("\n") else "\n"
            edits.append((after + 1, after, newline + "\n" + indented(name, col), name))
    # from the end, so line numbers stay valid; methods inserted at one place go in module order
    for _, (first, last, new, _) in sorted(
        enumerate(edits), key=lambda e: (e[1][0], e[1][1], e[0]), reverse=True
    ):
        lines[first - 1 : last] = [new]
    text = "".join(lines)
    return (text if source.endswith("\n") else text.rstrip("\n")), [name for *_, name in edits]


def execute(notebook: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(
        nb,
        # seconds a cell may run: nbval's default, so a hang here is a hang under pytest too. The
        # longest cell (06's 300 training steps) took 146 s beside two CPU-bound processes.
        timeout=2000,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(notebook.parent)}},
    ).execute()
    nbformat.write(nb, notebook)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if a notebook has drifted"
    )
    parser.add_argument(
        "--execute", action="store_true", help="re-execute the notebooks after syncing"
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to sync (default: all)")
    args = parser.parse_args(argv)
    dumps, texts, methods = module_sources()
    taught = set(taught_definitions())
    drifted = False
    for path in args.notebooks or NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        changed = []
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            new, names = sync_cell(cell.source, dumps, texts, methods, taught)
            if names:
                cell.source = new
                changed += names
        if changed:
            drifted = True
            print(f"{path.name}: {', '.join(changed)}")
            if not args.check:
                nbformat.write(nb, path)
        if args.execute and not args.check:
            print(f"{path.name}: executing")
            execute(path)
    return 1 if args.check and drifted else 0


if __name__ == "__main__":
    sys.exit(main())
