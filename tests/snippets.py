"""The documentation's runnable snippets: found by their marker, run the way the page tells a user to run them.

A fenced ``python`` block of ``docs/`` is runnable when the line just above its fence is the HTML comment
``<!-- runnable -->`` (invisible on the rendered page), optionally with options::

    <!-- runnable: nproc=7 -->
    <!-- runnable: nproc=4 needs=torchtitan env=SPMD_BACKEND=spmd_types|full_dtensor|partial_dtensor -->

- ``nproc=N``: the block is a script for ``python -m hypergrid.run --standalone --nproc-per-node N`` (run with
  ``--min-healthy N``, so one failed worker fails the run); without it, ``python script.py``.
- ``needs=a,b``: modules it imports that ``make test`` does not install (the test skips without them).
- ``env=NAME=a|b``: run once per value of the environment variable ``NAME``.

A runnable block is a whole script, copied to a file as it stands: it passes when it exits 0. Doctest blocks
(``>>>``) are run by pytest's ``--doctest-glob`` instead, and need no marker.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!--\s*runnable(?::(?P<options>[^>]*?))?\s*-->")
OPTIONS = ("nproc", "needs", "env")
#: The hard limit of one run, in seconds (the 7-rank bridge script takes about 20 s on a loaded 2-core box).
TIMEOUT_S = 240


@dataclass(frozen=True)
class Snippet:
    """One run of a runnable block: its page, the line of its fence, its source and how it is started."""

    page: str
    line: int
    source: str
    nproc: int = 1
    needs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """``page:line``, and the variant's environment (a test id)."""
        variant = "".join(f"[{key}={value}]" for key, value in self.env.items())
        return f"{self.page}:{self.line}{variant}"

    def missing(self) -> list[str]:
        """The modules of ``needs`` this interpreter cannot import."""
        return [module for module in self.needs if importlib.util.find_spec(module) is None]


def _options(page: str, line: int, text: str) -> tuple[int, tuple[str, ...], list[dict[str, str]]]:
    """A marker's options: ``nproc``, ``needs`` and the environments of its runs (one each)."""
    nproc, needs, environments = 1, (), [{}]
    for option in text.split():
        key, _, value = option.partition("=")
        if key not in OPTIONS or not value:
            raise ValueError(f"{page}:{line}: runnable marker option {option!r}: expected key=value, key in {OPTIONS}")
        if key == "nproc":
            if not value.isdigit() or not 1 <= int(value) <= 8:
                raise ValueError(f"{page}:{line}: nproc={value!r}: expected 1 to 8 processes")
            nproc = int(value)
        elif key == "needs":
            needs = tuple(value.split(","))
        else:
            name, _, values = value.partition("=")
            if not name or not values:
                raise ValueError(f"{page}:{line}: env={value!r}: expected NAME=value|value...")
            environments = [{name: each} for each in values.split("|")]
    return nproc, needs, environments


def parse(page: str, text: str) -> list[Snippet]:
    """The runs of every runnable block of one page (``page``: its name in messages and test ids).

    Raises:
        ValueError: a marker not followed by a ``python`` fence, a fence never closed, or a bad option.

    Examples:
        >>> page = "intro\\n<!-- runnable: nproc=2 -->\\n```python\\nprint(1)\\n```\\n```python\\nnot run\\n```\\n"
        >>> [(s.name, s.nproc, s.source) for s in parse("p.md", page)]
        [('p.md:3', 2, 'print(1)\\n')]
    """
    lines = text.splitlines(keepends=True)
    found: list[Snippet] = []
    for index, line in enumerate(lines):
        marker = MARKER.fullmatch(line.strip())
        if marker is None:
            continue
        fence = index + 1
        if fence >= len(lines) or lines[fence].strip() != "```python":
            raise ValueError(f"{page}:{index + 1}: a runnable marker must be the line just above a ```python fence")
        end = next((i for i in range(fence + 1, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{page}:{fence + 1}: the runnable block is never closed")
        nproc, needs, environments = _options(page, index + 1, marker.group("options") or "")
        source = "".join(lines[fence + 1 : end])
        found += [Snippet(page, fence + 1, source, nproc, needs, env) for env in environments]
    return found


def snippets() -> list[Snippet]:
    """Every run of every runnable block of docs/, page by page."""
    pages = sorted((ROOT / "docs").rglob("*.md"))
    return [s for page in pages for s in parse(str(page.relative_to(ROOT)), page.read_text(encoding="utf-8"))]


def run(snippet: Snippet, directory: pathlib.Path) -> tuple[int, str]:
    """Run one snippet as a script in ``directory``: its exit status and its output (stdout and stderr together).

    The script imports this checkout's hypergrid (``PYTHONPATH``). A run past `TIMEOUT_S` is killed, with the
    launcher's workers (its own session), and reported as exit status -9.
    """
    script = directory / f"{pathlib.Path(snippet.page).stem}_{snippet.line}.py"
    script.write_text(snippet.source, encoding="utf-8")
    command = [sys.executable, str(script)]
    if snippet.nproc > 1:
        launcher = ["-m", "hypergrid.run", "--standalone", "--nproc-per-node", str(snippet.nproc)]
        command = [sys.executable, *launcher, "--min-healthy", str(snippet.nproc), str(script)]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, **snippet.env}
    process = subprocess.Popen(
        command, cwd=directory, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the session this run started: the launcher and its workers
        output, _ = process.communicate()
        return -9, output.decode(errors="replace") + f"\n(killed after {TIMEOUT_S} s)"
    return process.returncode, output.decode(errors="replace")
