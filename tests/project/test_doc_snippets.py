"""Every runnable snippet of docs/ (marked ``<!-- runnable -->``, see tests/snippets.py) runs as written and exits 0.

Snippets that need a framework ``make test`` does not install run in ``make test-frameworks``
(tests/frameworks/test_doc_snippets.py).
"""

from __future__ import annotations

import pathlib

import pytest

from tests import snippets

PLAIN = [snippet for snippet in snippets.snippets() if not snippet.needs]


def test_the_markers_are_well_formed_and_the_bridge_script_is_marked() -> None:
    found = {snippet.page: snippet for snippet in snippets.snippets()}  # raises on a malformed marker
    assert found["docs/bridge.md"].nproc == 7
    assert "create_pgs" in found["docs/bridge.md"].source
    assert found["docs/migrate/torchtitan.md"].needs == ("torchtitan",)


def test_the_elastic_page_opens_with_its_quick_start_run_under_the_launcher() -> None:
    """docs/elastic.md's first script is the quick start, run as a user runs it (issue 45)."""
    text = (snippets.ROOT / "docs" / "elastic.md").read_text(encoding="utf-8")
    (quick,) = snippets.parse("docs/elastic.md", text)
    assert quick.line == text.splitlines().index("```python") + 1, "the quick start should be the page's first script"
    assert quick.nproc > 1 and "spares=" in quick.source and "hypergrid.ElasticLoop(" in quick.source
    code = [line for line in quick.source.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(code) <= 50, f"the quick start has {len(code)} lines of code; issue 54 allows 50"


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        ("<!-- runnable -->\ntext\n```python\nx = 1\n```\n", "just above"),
        ("<!-- runnable -->\n```python\nx = 1\n", "never closed"),
        ("<!-- runnable: nproc=9 -->\n```python\nx = 1\n```\n", "1 to 8"),
        ("<!-- runnable: ranks=2 -->\n```python\nx = 1\n```\n", "'ranks=2'"),
        ("<!-- runnable: env=X -->\n```python\nx = 1\n```\n", "NAME=value"),
    ],
)
def test_a_malformed_marker_is_refused(page: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        snippets.parse("page.md", page)


def test_a_failing_snippet_fails(tmp_path: pathlib.Path) -> None:
    (snippet,) = snippets.parse("page.md", "<!-- runnable -->\n```python\nraise SystemExit(3)\n```\n")
    assert snippets.run(snippet, tmp_path)[0] == 3


@pytest.mark.processes
@pytest.mark.timeout(snippets.TIMEOUT_S + 30)
@pytest.mark.parametrize("snippet", PLAIN, ids=[snippet.name for snippet in PLAIN])
def test_the_snippet_runs(snippet: snippets.Snippet, tmp_path: pathlib.Path) -> None:
    code, output = snippets.run(snippet, tmp_path)
    assert code == 0, f"{snippet.name} exited {code}:\n{output[-4000:]}"
