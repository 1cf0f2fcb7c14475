"""Every promise of docs/reliability.md names the test that proves it, and that test exists.

The page's tables are its promises: each row of a table with a "test" column
names at least one test file as ``tests/.../test_*.py`` (optionally
``::function``), and every test the page names anywhere exists.
"""

from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reliability.md"
NAMED = re.compile(r"`(tests/[A-Za-z0-9_/]+\.py)(?:::([A-Za-z0-9_]+))?`")


def _tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each markdown table of ``text`` as (header cells, rows of cells)."""
    tables = []
    lines = text.splitlines()
    for index, line in enumerate(lines[:-1]):
        if line.startswith("|") and re.fullmatch(r"\|[-| :]+\|", lines[index + 1].strip()):
            header = [cell.strip() for cell in line.strip("|").split("|")]
            rows = []
            for row in lines[index + 2 :]:
                if not row.startswith("|"):
                    break
                rows.append([cell.strip() for cell in row.strip("|").split("|")])
            tables.append((header, rows))
    return tables


def test_every_row_of_a_table_with_tests_names_its_test_file() -> None:
    tables = [(header, rows) for header, rows in _tables(PAGE.read_text()) if "test" in header]
    assert tables, "docs/reliability.md should list its promises in tables with a test column"
    for header, rows in tables:
        column = header.index("test")
        for row in rows:
            assert NAMED.search(row[column]), f"this promise names no test file: {' | '.join(row)[:200]}"


def test_every_test_the_page_names_exists() -> None:
    named = NAMED.findall(PAGE.read_text())
    assert len(named) > 20
    for path, function in named:
        file = ROOT / path
        assert file.is_file(), f"docs/reliability.md names {path}, which does not exist"
        if function:
            functions = {
                node.name for node in ast.walk(ast.parse(file.read_text())) if isinstance(node, ast.FunctionDef)
            }
            assert function in functions, f"{path} has no {function}"
