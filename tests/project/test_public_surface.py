"""The public surface, declared in one place (public_surface.json) and checked against the package.

A name that disappears fails the test (a removal breaks users); a new name
fails too until it is added to the snapshot, so every addition is a
deliberate edit: ``python -m tests.project.test_public_surface`` rewrites the
snapshot from the package.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

SNAPSHOT = pathlib.Path(__file__).with_name("public_surface.json")
# Classes whose public methods and properties are part of the surface too.
CLASSES = {"hypergrid.grid": ["HyperCommGrid"], "hypergrid.layout": ["GridLayout"]}


def _module_names(module: str) -> list[str]:
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    assert names is not None, f"public module {module} declares no __all__"
    for name in names:
        assert hasattr(mod, name), f"{module}.__all__ lists {name!r}, which the module does not define"
    return sorted(names)


def _class_members(module: str, cls_name: str) -> list[str]:
    cls = getattr(importlib.import_module(module), cls_name)
    return sorted(name for name, _ in inspect.getmembers(cls) if not name.startswith("_"))


def current() -> dict[str, Any]:
    snapshot = json.loads(SNAPSHOT.read_text())
    surface: dict[str, Any] = {"modules": {}, "classes": {}, "commands": snapshot["commands"]}
    for module in snapshot["modules"]:
        surface["modules"][module] = _module_names(module)
    for module, classes in CLASSES.items():
        for cls_name in classes:
            surface["classes"][f"{module}.{cls_name}"] = _class_members(module, cls_name)
    return surface


def _diff(old: list[str], new: list[str]) -> tuple[list[str], list[str]]:
    return sorted(set(old) - set(new)), sorted(set(new) - set(old))


@pytest.mark.parametrize("module", sorted(json.loads(SNAPSHOT.read_text())["modules"]))
def test_public_module_names(module: str) -> None:
    removed, added = _diff(json.loads(SNAPSHOT.read_text())["modules"][module], _module_names(module))
    assert not removed, f"{module} lost public name(s) {removed}: a removal breaks users"
    regenerate = "python -m tests.project.test_public_surface"
    assert not added, f"{module} gained {added}: add them to {SNAPSHOT.name} ({regenerate})"


@pytest.mark.parametrize("qualname", sorted(json.loads(SNAPSHOT.read_text())["classes"]))
def test_public_class_members(qualname: str) -> None:
    module, _, cls_name = qualname.rpartition(".")
    removed, added = _diff(json.loads(SNAPSHOT.read_text())["classes"][qualname], _class_members(module, cls_name))
    assert not removed, f"{qualname} lost public member(s) {removed}"
    assert not added, f"{qualname} gained {added}: add them to {SNAPSHOT.name}"


@pytest.mark.parametrize("command", json.loads(SNAPSHOT.read_text())["commands"])
def test_cli_commands_answer_help(command: str) -> None:
    out = subprocess.run([sys.executable, "-m", "hypergrid", command, "--help"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "usage" in out.stdout.lower()


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
