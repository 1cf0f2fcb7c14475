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
    "spec": {"errors", "values"},
    "coordinates": {"errors", "spec", "values"},
    "layout": {"coordinates", "errors", "spec", "values"},
    "economy": {"errors", "layout"},
    "worldstate": {"errors"},
    "creation": {"errors", "worldstate"},
    "request": {"errors"},
    "agreement": {"request"},
    "guard": {"agreement", "request", "worldstate"},
    "batch": {
        "creation",
        "errors",
        "facet",
        "guard",
        "hierarchy",
        "layout",
        "options",
        "registry",
        "views",
        "worldstate",
    },  # views: for types only,
    "facet": {"errors", "layout"},
    "getters": {"facet", "layout"},
    "registry": {"creation", "errors", "layout"},
    "views": {"errors", "facet", "grid", "layout", "registry", "values"},
    "shims": {"facet", "layout"},
    "nodes": {"errors", "facet", "hierarchy", "layout", "placement", "registry", "topology"},
    "placement": {"errors", "topology"},
    "hierarchy": {"errors", "layout", "values"},
    "meshspec": {"errors", "layout"},
    "mesh": {"facet", "meshspec"},
    "collectives": {"errors", "facet", "layout", "values"},
    "pipeline": {"errors", "facet"},
    "options": {"errors"},
    "communicators": {"economy", "facet", "layout", "options", "registry"},
    "grid": {
        "batch",
        "collectives",
        "communicators",
        "options",
        "creation",
        "economy",
        "errors",
        "facet",
        "getters",
        "guard",
        "layout",
        "mesh",
        "nodes",
        "pipeline",
        "registry",
        "shims",
        "values",
        "views",
        "worldstate",
    },
    "autograd": {"collectives", "grid", "layout"},
    "launch": {"errors", "values"},
    "cli": {"economy", "errors", "layout"},
    "cli_plan": {"errors", "topology"},
    "topology/__init__": {"topology"},
    "topology/tiers": {"errors", "values", "topology"},
    "topology/spans": {"layout"},
    "topology/cost": {"errors", "topology"},
    "topology/traffic": {"errors", "layout", "topology", "values"},
    "topology/planner": {"errors", "grid", "layout", "topology", "values"},  # grid: lazily, inside Plan.to_grid
    "topology/calibrate": {"errors", "topology"},
    "demo": {"cli", "errors", "grid", "launch"},
}
PURE = (
    "errors",
    "values",
    "spec",
    "coordinates",
    "layout",
    "meshspec",
    "economy",
    "options",
    "hierarchy",
    "placement",
    *(m for m in ALLOWED if m.startswith("topology/")),
)


def test_layout_core_loads_without_torch() -> None:
    code = (
        "import sys, hypergrid.layout, hypergrid.values, hypergrid.errors, hypergrid.topology, hypergrid.cli_plan; "
        "print('torch' in sys.modules)"
    )
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
