"""One timing table: at most ten module-level timing constants in the package, each named in docs/elastic.md.

Every other bound is derived from a setting by `hypergrid.timing.Timing` (issue 53). A timing constant is a
module-level name that reads like one (it ends in ``_S``, ``_SECONDS``, ``_TIMEOUT``, ``_INTERVAL``, ``_WAITS``,
``_TRIES`` or ``_PROBES``) or any upper-case constant of ``hypergrid/timing.py``, the table's home in the code.
"""

from __future__ import annotations

import ast
import re

from tests import layering

MOST = 10
TABLE_PAGE = layering.ROOT / "docs" / "timing.md"
TABLE_HEADING = "# Timing constants"
TIMING_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*(_S|_SECONDS|_TIMEOUT|_INTERVAL|_WAITS|_TRIES|_PROBES)$")
CONSTANT_NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
TABLE_HOME = "timing"


def timing_constants(sources: dict[str, str]) -> list[str]:
    """``module.NAME`` of every timing constant in ``sources`` (module name -> its source text), sorted."""
    found = []
    for module, text in sources.items():
        for node in ast.parse(text).body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            names = [leaf.id for target in targets for leaf in ast.walk(target) if isinstance(leaf, ast.Name)]
            for name in names:
                if TIMING_NAME.match(name) or (module == TABLE_HOME and CONSTANT_NAME.match(name)):
                    found.append(f"{module}.{name}")
    return sorted(found)


def table_names(page: str) -> set[str]:
    """The names written in backticks in the page's timing table section (a dotted name also by its last part)."""
    start = page.index(TABLE_HEADING)
    end = page.find("\n## ", start + len(TABLE_HEADING))
    section = page[start : len(page) if end < 0 else end]
    names = set()
    for quoted in re.findall(r"`([^`]+)`", section):
        names.add(quoted)
        names.add(quoted.rpartition(".")[2])
    return names


def unlisted(constants: list[str], names: set[str]) -> list[str]:
    """The constants the table does not name."""
    return [constant for constant in constants if constant.rpartition(".")[2] not in names]


def _package() -> dict[str, str]:
    return {name: path.read_text() for name, path in layering.modules().items()}


def test_at_most_ten_timing_constants() -> None:
    constants = timing_constants(_package())
    assert len(constants) <= MOST, f"{len(constants)} timing constants (at most {MOST}): {constants}"


def test_every_timing_constant_is_in_the_table() -> None:
    missing = unlisted(timing_constants(_package()), table_names(TABLE_PAGE.read_text()))
    assert not missing, f"not in {TABLE_PAGE.name}'s table ({TABLE_HEADING!r}): {missing}"


def test_the_checks_find_a_new_constant() -> None:
    sources = _package()
    before = timing_constants(sources)
    sources["ops.new"] = "FOO_S = 1.0\nBAR_TIMEOUT: float = 2.0\nA_INTERVAL, (B_WAITS, c) = 1, (2, 3)\nLIMIT = 4\n"
    sources[TABLE_HOME] += "\nSPAN = 3\n"
    added = sorted(set(timing_constants(sources)) - set(before))
    assert added == ["ops.new.A_INTERVAL", "ops.new.BAR_TIMEOUT", "ops.new.B_WAITS", "ops.new.FOO_S", "timing.SPAN"]
    names = table_names(TABLE_PAGE.read_text())
    assert unlisted(added, names) == added  # each would fail the table's test
    assert len(timing_constants(dict.fromkeys(["x"], "A_S = 1\n" * (MOST + 1)))) > MOST  # and the count's
    assert {"liveness_s", "FOREVER_S"} <= names
