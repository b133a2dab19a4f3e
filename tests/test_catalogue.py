"""Checks on the bad-input and fault catalogue (the table is tests/catalogue.py): every item once,
tried, pending or not applicable, every named test defined, every item test named.

tests/bad_inputs.md is the table as a page to read, one row per item: `python tests/test_catalogue.py`
rewrites it, and test_bad_inputs_md_is_the_table keeps the two equal. The maintainers' page's
"What is checked" figures come from the same table, and a test keeps them equal.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from pathlib import Path

from catalogue import AREAS, CATALOGUE
from conftest import ROOT

TESTS = Path(__file__).resolve().parent


def _test_files() -> list[Path]:
    return sorted(TESTS.glob("test_*.py"))


def _ref(ref: str) -> tuple[str, str]:
    """("test_file.py", "test_name") from "test_file.py::test_name"; every reference names its file."""
    file, _, name = ref.rpartition("::")
    return file, name


@functools.lru_cache(maxsize=None)
def _top_level_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
    }


def area_rows() -> list[list[str]]:
    """The README's table: per area the items, how many apply, are tried and are pending, and a status."""
    rows = []
    for key, name in [*AREAS.items(), ("total", "total")]:
        items = [i for i in CATALOGUE if key == "total" or i.area == key]
        apply = [i for i in items if not i.not_applicable]
        tried = [i for i in apply if i.tests]
        pending = [i for i in apply if i.pending]
        differs = sum(bool(i.differs) for i in tried)
        limits = sum(bool(i.limit) for i in tried)
        notes = [
            f"{differs} {'differs' if differs == 1 else 'differ'} by design" if differs else "",
            f"{limits} known {'limit' if limits == 1 else 'limits'}" if limits else "",
            f"{len(pending)} {'waits' if len(pending) == 1 else 'wait'} for {pending[0].pending}"
            if pending
            else "",
        ]
        status = "; ".join(filter(None, ["tried" if tried else "", *notes]))
        rows.append(
            [name, str(len(items)), str(len(apply)), str(len(tried)), str(len(pending)), status]
        )
    return rows


# --- the table's own checks ------------------------------------------------------------------------


def test_table_has_every_number_from_1_up_once():
    numbers = [item.number for item in CATALOGUE]
    expected = list(range(1, len(CATALOGUE) + 1))
    assert sorted(numbers) == expected, [n for n, c in Counter(numbers).items() if c > 1]
    assert numbers == sorted(numbers)  # in catalogue order, so a reader can follow along


def test_every_entry_is_tried_pending_or_not_applicable_and_says_why():
    for item in CATALOGUE:
        kinds = [
            bool(item.tests) and not item.pending,
            bool(item.not_applicable),
            bool(item.pending),
        ]
        assert sum(kinds) == 1, (
            f"item {item.number} must have tests, a not_applicable reason or a pending issue"
        )
        assert item.area in AREAS and item.title
        if item.not_applicable or item.pending:
            assert not (item.differs or item.limit), (
                f"item {item.number}: notes belong to tried items"
            )


def test_every_named_test_exists():
    defined = {}  # test name -> the files that define it, in any test file
    for path in _test_files():
        for name in _top_level_tests(path):
            defined.setdefault(name, []).append(path.name)
    missing = []
    for item in CATALOGUE:
        for ref in item.tests:
            file, name = _ref(ref)
            if file not in defined.get(name, []):
                found = ", ".join(defined.get(name, [])) or "no test file"
                missing.append(f"item {item.number}: {ref} (defined in {found})")
    assert not missing, missing


def test_every_item_test_is_in_the_table():
    named = {_ref(ref) for item in CATALOGUE for ref in item.tests}
    orphans = sorted(
        f"{path.name}::{t}"
        for path in _test_files()
        for t in _top_level_tests(path)
        if (t.startswith("test_item_") or path.name == "test_faults.py")
        and (path.name, t) not in named
    )
    assert not orphans, f"tests no catalogue entry names: {orphans}"


BAD_INPUTS_MD = ROOT / "tests" / "bad_inputs.md"


def catalogue_markdown() -> str:
    """tests/bad_inputs.md: one row per item, with what the project does about it and the tests that try it."""
    rows = []
    for item in CATALOGUE:
        if item.not_applicable:
            does = f"does not apply: {item.not_applicable}"
        elif item.pending:
            does = f"waits for {item.pending}"
        else:
            does = "; ".join(
                filter(
                    None,
                    [
                        "tried",
                        item.differs and f"by design, {item.differs}",
                        item.limit and f"known limit: {item.limit}",
                    ],
                )
            )
        tests = "<br>".join(f"`{ref}`" for ref in item.tests) or "none"
        cells = [str(item.number), AREAS[item.area], item.title, does, tests]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(
        [
            "# Bad inputs and faults",
            "",
            f"{len(CATALOGUE)} ways for a token loader and its prep step to be fed something wrong",
            "or to fail midway, what the project does about it, and the tests that try it. Written by",
            "`python tests/test_catalogue.py` from the table in `tests/catalogue.py`; a test keeps them equal.",
            "Each test is named as file::test, its file in `tests/`.",
            "",
            "| # | area | bad input or fault | what the project does | tests |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    )


def test_bad_inputs_md_is_the_table():
    assert BAD_INPUTS_MD.is_file(), (
        "tests/bad_inputs.md is missing: run python tests/test_catalogue.py"
    )
    assert BAD_INPUTS_MD.read_text(encoding="utf-8") == catalogue_markdown(), (
        "tests/bad_inputs.md differs from the table: run python tests/test_catalogue.py"
    )
    assert len(
        re.findall(r"^\| \d+ \|", BAD_INPUTS_MD.read_text(encoding="utf-8"), flags=re.M)
    ) == len(CATALOGUE)


def test_the_maintainers_table_matches_the_catalogue():
    page = (ROOT / "docs" / "maintainers.md").read_text(encoding="utf-8")
    section = re.search(r"^## What is checked\n(.*?)(?=^## )", page, flags=re.M | re.S)
    assert section, "docs/maintainers.md has no '## What is checked' section before the next one"
    assert f"A catalogue of {len(CATALOGUE)} bad inputs" in section.group(1)
    lines = [line for line in section.group(1).splitlines() if line.startswith("|")]
    assert lines[:2] == [
        "| area | items | apply | tried | pending | status |",
        "|---|---|---|---|---|---|",
    ]
    body = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert body == area_rows(), (
        "docs/maintainers.md's figures differ from the table; expected rows:\n"
        + "\n".join("| " + " | ".join(row) + " |" for row in area_rows())
    )


if (
    __name__ == "__main__"
):  # python tests/test_catalogue.py: rewrite tests/bad_inputs.md from the table
    BAD_INPUTS_MD.write_text(catalogue_markdown(), encoding="utf-8")
    print(f"wrote {BAD_INPUTS_MD.relative_to(ROOT)}: {len(CATALOGUE)} items")
