"""A griffe extension for the API reference: a grid method ``name = delegate(Facet.name)`` shows as that method.

``hypergrid.grid.front.delegate`` makes a function with the facet method's
signature and docstring at run time (``help``); mkdocstrings reads the source,
where it is an attribute, so this puts a copy of the facet's method (its
``self`` dropped, as for a bound method) in its place (mkdocs.yml names it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


def _classes(obj: Any) -> Iterator[Any]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            yield member
        if member.is_class or member.is_module:
            yield from _classes(member)


class DelegatingDocstrings(griffe.Extension):
    """After the package is loaded, replace each ``delegate(X.y)`` attribute of a class by a copy of ``X.y``."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for cls in list(_classes(pkg)):
            for name, member in list(cls.members.items()):
                call = getattr(member, "value", None) if member.is_attribute else None
                if not str(call).startswith("delegate("):
                    continue
                target = pkg.modules_collection[call.arguments[0].canonical_path]
                function = griffe.Function(
                    name,
                    lineno=member.lineno,
                    endlineno=member.endlineno,
                    parameters=griffe.Parameters(*list(target.parameters)[1:]),
                    returns=target.returns,
                )
                cls.set_member(name, function)
                if target.docstring is not None:
                    function.docstring = griffe.Docstring(
                        target.docstring.value,
                        parent=function,
                        parser=target.docstring.parser,
                        parser_options=target.docstring.parser_options,
                    )
