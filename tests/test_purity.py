"""The layout core imports no torch; imports point downward only."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "hypergrid"

# module -> the hypergrid modules it may import (downward only)
ALLOWED = {
    "errors": set(),
    "values": {"errors"},
    "layout": {"errors", "values"},
    "worldstate": set(),
    "creation": {"errors", "worldstate"},
    "request": {"errors"},
    "agreement": {"request"},
    "guard": {"agreement", "request", "worldstate"},
    "grid": {"creation", "errors", "guard", "layout", "values", "worldstate"},
    "launch": {"errors", "values"},
    "cli": {"errors", "layout"},
    "demo": {"cli", "errors", "grid", "launch"},
}
PURE = ("errors", "values", "layout")


def test_layout_core_loads_without_torch() -> None:
    code = "import sys, hypergrid.layout, hypergrid.values, hypergrid.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_imports_point_downward() -> None:
    for name, allowed in ALLOWED.items():
        inner = {m.split(".")[1] for m in _imports(PACKAGE / f"{name}.py") if m.startswith("hypergrid.")}
        assert inner <= allowed, (name, inner - allowed)
    for core in PURE:
        assert not any(m.split(".")[0] == "torch" for m in _imports(PACKAGE / f"{core}.py"))
