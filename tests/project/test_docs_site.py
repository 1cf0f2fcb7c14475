"""The built docs site: the API reference renders, and the site works opened from disk.

One `mkdocs build --strict` per test session (about a second), into a temporary directory.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import pathlib
import re
import subprocess
import sys
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
RAW_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj):`?")
# Names every reader of the API reference searches for; each must be in the search index.
API_NAMES = ("HyperCommGrid", "GridLayout", "create_pg", "get_rank_enum", "spawn", "HyperGridError")
_NEEDED = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def _missing_docs_tools() -> list[str]:
    missing = []
    for module in _NEEDED:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(module)
    return missing


class _Page(HTMLParser):
    """The text, the ids and the links (href/src) of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.text: list[str] = []
        self.ids: set[str] = set()
        self.links: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids.add(str(values["id"]))
        for attribute in ("href", "src"):
            if values.get(attribute) is not None:
                self.links.append(str(values[attribute]))
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)


def _parse(path: pathlib.Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    missing = _missing_docs_tools()
    if missing:
        pytest.skip(f"the docs tools are not installed ({', '.join(missing)}); `pip install -e .[docs]`")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def pages(site: pathlib.Path) -> dict[pathlib.Path, _Page]:
    # 404.html is for web servers only (they serve it at any path, so its links are site-absolute).
    parsed = {path: _parse(path) for path in sorted(site.rglob("*.html")) if path != site / "404.html"}
    return parsed


def test_no_raw_sphinx_roles_in_the_built_site(site: pathlib.Path, pages: dict[pathlib.Path, _Page]) -> None:
    found = []
    for path, page in pages.items():
        text = "".join(page.text)
        for match in RAW_ROLE.finditer(text):
            snippet = " ".join(text[max(0, match.start() - 40) : match.end() + 40].split())
            found.append(f"{path.relative_to(site)}: ...{snippet}...")
    assert not found, f"{len(found)} raw Sphinx role(s) render as text; use `Name` instead:\n" + "\n".join(found)


def test_the_api_reference_renders_docstrings(pages: dict[pathlib.Path, _Page], site: pathlib.Path) -> None:
    reference = pages.get(site / "reference.html")
    assert reference is not None, f"no reference.html among {sorted(str(p.relative_to(site)) for p in pages)}"
    # Entries are ids such as hypergrid.grid.HyperCommGrid.create_pg (the module part may move).
    for name in ("HyperCommGrid", "GridLayout", "HyperCommGrid.create_pg", "GridLayout.group_ranks"):
        assert any(i.startswith("hypergrid.") and i.endswith("." + name) for i in reference.ids), f"no entry {name!r}"
    text = "".join(reference.text)
    # Google-style sections become tables/headings, never the raw "Args:" line of the docstring.
    assert "Parameters:" in text
    assert not re.search(r"^\s*Args:\s*$", text, re.MULTILINE), "a docstring's Args: section rendered as plain text"


def test_every_documented_grid_member_has_an_entry(pages: dict[pathlib.Path, _Page], site: pathlib.Path) -> None:
    # A method HyperCommGrid delegates to a facet object gets its docstring at run time (delegating) and, for
    # the reference, from tests/griffe_delegating.py: without it the entry would silently vanish.
    from hypergrid.grid import HyperCommGrid

    ids = pages[site / "reference.html"].ids
    documented = [n for n, m in inspect.getmembers(HyperCommGrid) if not n.startswith("_") and inspect.getdoc(m)]
    missing = [n for n in documented if not any(i.endswith(".HyperCommGrid." + n) for i in ids)]
    assert not missing, f"HyperCommGrid members with a docstring but no entry in the API reference: {missing}"


def test_mkdocs_yml_turns_directory_urls_off() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config.get("use_directory_urls") is False, "pages must be .html files for the site to work from disk"


def _internal(link: str) -> bool:
    parts = urlsplit(link)
    return not (parts.scheme or parts.netloc or link.startswith("//"))


def test_every_internal_link_resolves_to_a_file(site: pathlib.Path, pages: dict[pathlib.Path, _Page]) -> None:
    broken = []
    checked = 0
    for path, page in pages.items():
        for link in page.links:
            if not _internal(link):
                continue
            parts = urlsplit(link)
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            checked += 1
            where = f"{path.relative_to(site)} -> {link!r}"
            if not target.is_file():
                broken.append(f"{where}: no such file" + (" (a directory URL)" if target.is_dir() else ""))
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{where}: no element with id {parts.fragment!r}")
    assert checked > 100, f"only {checked} internal links found: is the site built?"
    assert not broken, f"{len(broken)} internal link(s) do not resolve from disk:\n" + "\n".join(broken)


def test_search_works_from_disk(site: pathlib.Path, pages: dict[pathlib.Path, _Page]) -> None:
    index_json = site / "search" / "search_index.json"
    index_js = site / "search" / "search_index.js"
    assert index_json.is_file(), "no search index"
    # From file:// the theme cannot fetch the JSON; it loads search/search_index.js as a script instead.
    assert index_js.is_file(), "no search/search_index.js: enable the material `offline` plugin"
    prefix = "var __index = "
    script = index_js.read_text(encoding="utf-8")
    assert script.startswith(prefix)
    inlined = json.loads(script[len(prefix) :])
    assert inlined == json.loads(index_json.read_text(encoding="utf-8"))
    # The theme's bundle is what takes that file:// path: check it is the bundle these pages load.
    bundles = {
        (path.parent / link).resolve()
        for path, page in pages.items()
        for link in page.links
        if _internal(link) and re.search(r"assets/javascripts/bundle\.[^/]*\.js$", link)
    }
    assert bundles, "the pages load no theme bundle"
    for bundle in bundles:
        assert "search/search_index.js" in bundle.read_text(encoding="utf-8"), f"{bundle.name} has no file:// search"
    documents = inlined["docs"]
    locations = {doc["location"].split("#")[0] for doc in documents}
    assert {"index.html", "reference.html", "api.html"} <= locations
    assert all(not location.endswith("/") for location in locations), "directory URLs in the search index"
    reference_text = " ".join(doc["title"] + " " + doc["text"] for doc in documents if "reference" in doc["location"])
    for name in API_NAMES:
        assert name in reference_text, f"{name!r} is not in the search index of the API reference"


REPOSITORY = "https://github.com/hypergrid-dev/hypergrid"
MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)|<(https?://[^>\s]+)>")


def test_readme_links_are_absolute_and_point_into_the_repository() -> None:
    """README is also the package index's page, where relative links break."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [a or b for a, b in MARKDOWN_LINK.findall(readme)]
    assert len(links) >= 8
    relative = [link for link in links if not urlsplit(link).scheme]
    assert not relative, f"relative links in README.md: {relative}"
    missing = []
    for link in links:
        for kind in ("blob", "tree"):
            prefix = f"{REPOSITORY}/{kind}/main/"
            if link.startswith(prefix):
                target = ROOT / urlsplit(link[len(prefix) :]).path
                if not (target.is_file() if kind == "blob" else target.is_dir()):
                    missing.append(link)
    assert not missing, f"README.md links to files this repository does not have: {missing}"


def test_project_urls_name_the_same_repository() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    assert {"Homepage", "Documentation", "Repository", "Changelog", "Issues"} <= set(urls)
    assert all(url.startswith(REPOSITORY) for url in urls.values()), urls
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load((ROOT / "mkdocs.yml").read_text())["repo_url"] == REPOSITORY
