"""Every page agrees with the code on the grid's methods: a written signature is the real one, a call binds.

The pages name methods in two ways. A signature (``is_first(dim, rank=None)``: bare parameter names and
real defaults) lists real parameters in their order, the required ones at least, and all of them on the
API page (docs/api.md, in a code span that starts with the name). A call (``grid.is_last("pp", rank=3)``)
must bind to the signature. Both are checked for the public methods of ``HyperCommGrid`` and
``GridLayout`` wherever a page writes ``grid.NAME(...)``, ``layout.NAME(...)`` or a code span ``NAME(...)``.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hypergrid import GridLayout, HyperCommGrid

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
CLASSES = {"grid": HyperCommGrid, "layout": GridLayout}


def _methods(name: str) -> list[Callable[..., Any]]:
    found = [getattr(cls, name) for cls in CLASSES.values() if callable(getattr(cls, name, None))]
    return [method for method in found if not isinstance(method, type)]


def _mentions(text: str) -> Iterator[tuple[str, str, bool]]:
    """``(name, the call as written, bare)`` for every method mention with balanced parentheses.

    ``bare``: a code span that starts with the name (how the API page writes signatures), not ``grid.NAME(``.
    """
    pattern = re.compile(r"(?:\b(?:grid|layout)\.|`)([a-z_][a-z0-9_]*)\(")
    for match in pattern.finditer(text):
        name = match.group(1)
        if name.startswith("_") or not _methods(name):
            continue
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, min(len(text), match.end() + 400)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        if depth == 0:
            yield name, name + text[match.end() - 1 : end + 1], match.group(0).startswith("`")


def _parameters(method: Callable[..., Any]) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(method).parameters.values() if p.name != "self"]


def _as_signature(call: ast.Call, method: Callable[..., Any]) -> list[str] | None:
    """The parameter names of ``call`` read as a written signature, or None if it is a real call.

    A signature names parameters bare (``dims``) and gives keywords their real
    default (``rank=None``) or a symbol (``op=SUM``); anything else is a call.
    """
    parameters = {p.name: p for p in _parameters(method)}
    if not all(isinstance(arg, ast.Name) and arg.id in parameters for arg in call.args):
        return None
    written = [arg.id for arg in call.args if isinstance(arg, ast.Name)]
    for keyword in call.keywords:
        if keyword.arg is None:
            written.append("**" + getattr(keyword.value, "id", "?"))
            continue
        real = parameters.get(keyword.arg)
        symbolic = isinstance(keyword.value, ast.Name)
        if real is None or not (symbolic or _same_default(keyword.value, real.default)):
            return None
        written.append(keyword.arg)
    return written


def _same_default(node: ast.expr, default: Any) -> bool:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return False
    return value is not ... and type(value) is type(default) and value == default


def _problem(name: str, written: str, complete: bool) -> str | None:
    text = re.sub(r",\s*[*/](?=\s*[,)])", "", written)  # the markers of keyword-only and positional-only
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None  # prose, not code
    if not isinstance(call, ast.Call) or text in (f"{name}()", f"{name}(...)"):
        return None  # the name alone
    errors = []
    for method in _methods(name):
        parameters = _parameters(method)
        signature = _as_signature(call, method)
        if signature is None:
            keywords = {k.arg: None for k in call.keywords if k.arg is not None}
            try:
                inspect.signature(method).bind(None, *call.args, **keywords)
            except TypeError as error:
                errors.append(f"as a call: {error}")
                continue
            return None
        real = [("**" + p.name if p.kind is p.VAR_KEYWORD else p.name) for p in parameters]
        needed = [
            n
            for n, p in zip(real, parameters)
            if (p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
            or (complete and p.kind is not p.POSITIONAL_ONLY)
        ]
        in_order = [n for n in real if n in signature] == signature
        if in_order and set(needed) <= set(signature):
            return None
        what = "the method's parameters" if complete else "the method's required parameters, in order,"
        errors.append(f"lists {signature}; {what} are {needed if complete else real}")
    return "; ".join(errors)


def test_the_pages_mention_methods_at_all() -> None:
    found = [mention for page in PAGES for mention in _mentions(page.read_text())]
    assert len(found) > 50 and ("is_last", 'is_last("pp", rank=3)', False) in found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_signatures_and_calls_on_the_page_agree_with_the_code(page: pathlib.Path) -> None:
    reference = page.name == "api.md"  # the reference: its signatures are written in full
    problems = [
        f"`{written}`: {problem}"
        for name, written, bare in _mentions(page.read_text())
        if (problem := _problem(name, written, reference and bare))
    ]
    assert not problems, f"{page.relative_to(ROOT)} disagrees with the code:\n" + "\n".join(problems)


def test_the_api_page_gives_the_constructors_every_parameter_in_order() -> None:
    # The constructors are not methods: the heading of their section on the API page is their signature.
    api = (ROOT / "docs" / "api.md").read_text()
    for cls in CLASSES.values():
        heading = re.search(rf"^## `{cls.__name__}\((.*?)\)`", api, re.M)
        assert heading, f"docs/api.md has no section headed by {cls.__name__}'s signature"
        written = [part.strip().split("=")[0] for part in heading.group(1).split(",") if part.strip() != "*"]
        assert written == [p.name for p in _parameters(cls)], f"{cls.__name__}: {written}"


def test_the_api_page_lists_every_field_of_regrid() -> None:
    import dataclasses

    from hypergrid import Regrid

    api = " ".join((ROOT / "docs" / "api.md").read_text().split())
    missing = [field.name for field in dataclasses.fields(Regrid) if f"`{field.name}`" not in api]
    assert not missing, f"docs/api.md does not list Regrid's {missing}"
