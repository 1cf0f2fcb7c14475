"""The runnable snippets of docs/ that need a framework (``needs=``), under each of their variants.

Run by ``make test-frameworks``, whose environment installs torchtitan; skipped where a module is missing.
docs/migrate/torchtitan.md's script runs once per ``spmd_backend``.
"""

from __future__ import annotations

import pathlib

import pytest

from tests import snippets

NEEDING = [snippet for snippet in snippets.snippets() if snippet.needs]


@pytest.mark.processes
@pytest.mark.timeout(snippets.TIMEOUT_S + 30)
@pytest.mark.parametrize("snippet", NEEDING, ids=[snippet.name for snippet in NEEDING])
def test_the_snippet_runs(snippet: snippets.Snippet, tmp_path: pathlib.Path) -> None:
    if snippet.missing():
        pytest.skip(f"{snippet.name} needs {snippet.missing()}")
    code, output = snippets.run(snippet, tmp_path)
    assert code == 0, f"{snippet.name} exited {code}:\n{output[-4000:]}"
