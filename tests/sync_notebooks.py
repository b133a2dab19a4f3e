"""Copy the modules' definitions into the notebook cells that teach them, then re-run the notebooks.

The modules in python_files/ are the source of truth; test_notebooks.py fails when a notebook's
copy of a definition differs. After changing a module:

    .venv/bin/python tests/sync_notebooks.py            # rewrite drifted definitions in place
    .venv/bin/python tests/sync_notebooks.py --execute  # ... and re-execute every notebook
    .venv/bin/python tests/sync_notebooks.py --check    # exit 1 if anything would change

Only a drifted definition's own lines are replaced (a def, a method inside a class cell, a method
taught on its own and attached with `Class.name = name`, an UPPER_CASE constant); prose, the cells
around it and a class cell's other parts stay as written. Execution runs each notebook top to
bottom in a fresh kernel from the repository root, with no timing metadata, so stored outputs
stay deterministic.
"""

from __future__ import annotations

import argparse
import ast
import sys
import textwrap
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_notebooks import MODULES, NOTEBOOKS, ROOT, definitions  # noqa: E402


def _segments(tree: ast.Module, lines: list[str]) -> dict[str, str]:
    """Qualified name -> source text (decorators included, dedented) of each definition."""
    out: dict[str, str] = {}

    def text(node: ast.AST) -> str:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = text(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = text(item)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id.isupper():
                    out[t.id] = text(node)
    return out


def module_sources() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Per qualified name: the modules' dumped ASTs and their source texts."""
    dumps: dict[str, list[str]] = {}
    texts: dict[str, list[str]] = {}
    for path in MODULES.values():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines(keepends=True)
        for name, dump in definitions(ast.parse(source)).items():
            dumps.setdefault(name, []).append(dump)
        for name, text in _segments(ast.parse(source), lines).items():
            texts.setdefault(name, []).append(text)
    return dumps, texts


def sync_cell(source: str, dumps: dict[str, list[str]], texts: dict[str, list[str]]) -> tuple[str, list[str]]:
    """The cell's source with drifted definitions replaced, and the names replaced."""
    parsable = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        tree = ast.parse(parsable)
    except SyntaxError:
        return source, []
    mine = definitions(ast.parse(parsable))
    attached = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute):
            target = node.targets[0]
            if isinstance(target.value, ast.Name) and isinstance(node.value, ast.Name):
                attached[node.value.id] = f"{target.value.id}.{target.attr}"
    candidates: list[tuple[str, ast.AST]] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            candidates.append((attached.get(node.name, node.name), node))
        elif isinstance(node, ast.ClassDef):
            candidates += [(f"{node.name}.{item.name}", item) for item in node.body
                           if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]  # fmt: skip
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(t, ast.Name) and t.id.isupper():
                    candidates.append((t.id, node))
    lines = source.splitlines(keepends=True)
    edits = []
    for name, node in candidates:
        if name not in dumps or mine.get(name) in dumps[name]:
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        indent = " " * node.col_offset
        new = textwrap.indent(texts[name][0], indent, lambda line: line.strip() != "")
        edits.append((first, node.end_lineno, new, name))
    for first, last, new, _ in sorted(edits, reverse=True):
        lines[first - 1 : last] = [new]
    text = "".join(lines)
    return (text if source.endswith("\n") else text.rstrip("\n")), [name for *_, name in edits]


def execute(notebook: Path) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()  # fmt: skip
    nbformat.write(nb, notebook)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook has drifted")
    parser.add_argument("--execute", action="store_true", help="re-execute the notebooks after syncing")
    parser.add_argument("notebooks", nargs="*", type=Path, help="notebooks to sync (default: all)")
    args = parser.parse_args(argv)
    dumps, texts = module_sources()
    drifted = False
    for path in args.notebooks or NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        changed = []
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            new, names = sync_cell(cell.source, dumps, texts)
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
