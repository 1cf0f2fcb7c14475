"""The sdist carries its own test suite: build it, unpack it, and pytest collects the same tests there.

No network: the sdist is built by setuptools' PEP 517 backend in this interpreter (no isolated build
environment), from a copy of the source tree without caches, virtual environments or build output.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "venv",
    "site",
    "build",
    "dist",
    "bench-results",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
)
_BUILD = "import sys, setuptools.build_meta as backend; print(backend.build_sdist(sys.argv[1]))"


def _run(command: list[str], cwd: pathlib.Path) -> str:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, (
        f"{' '.join(command)} failed in {cwd}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    )
    return result.stdout


def _collected(cwd: pathlib.Path) -> set[str]:
    """The test ids `python -m pytest --collect-only -q` finds in `cwd` (collection errors fail)."""
    out = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], cwd)
    return {line for line in out.splitlines() if "::" in line}


@pytest.mark.timeout(240)
def test_sdist_collects_the_same_tests(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("setuptools.build_meta", reason="building the sdist needs setuptools")
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_NOT_SOURCE)
    dist = tmp_path / "dist"
    dist.mkdir()
    name = _run([sys.executable, "-c", _BUILD, str(dist)], source).strip().splitlines()[-1]
    unpacked = tmp_path / "unpacked"
    with tarfile.open(dist / name) as archive:
        if hasattr(tarfile, "data_filter"):
            archive.extractall(unpacked, filter="data")
        else:  # Python < 3.10.12 has no extraction filters; this archive was built just above
            archive.extractall(unpacked)
    (top,) = unpacked.iterdir()
    needed_files = (
        "tests/conftest.py",
        "tests/workers/basic.py",
        "tests/layering.py",
        "tests/project/public_surface.json",
        "tests/references.py",
        "mkdocs.yml",
        "docs/index.md",
    )
    for needed in needed_files:
        assert (top / needed).is_file(), f"the sdist lacks {needed}"
    assert not list(top.rglob("__pycache__")), "the sdist carries __pycache__ directories"
    imported = _run([sys.executable, "-c", "import hypergrid; print(hypergrid.__file__)"], top).strip()
    assert pathlib.Path(imported).is_relative_to(top), f"the unpacked sdist imports {imported}, not its own package"
    in_sdist = _collected(top)
    in_repository = _collected(ROOT)
    assert in_sdist == in_repository, (
        f"missing from the sdist: {sorted(in_repository - in_sdist)[:20]}; only in the sdist: "
        f"{sorted(in_sdist - in_repository)[:20]}"
    )
