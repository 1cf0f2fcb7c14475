"""A griffe extension for the API reference: a method ``@delegating(Facet.method)`` shows that method's docstring.

``hypergrid.binding.facet.delegating`` copies the docstring at run time (``help``);
mkdocstrings reads the source, so this copies it there too (mkdocs.yml names it).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import griffe


def _functions(obj: Any) -> Iterator[Any]:
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_function:
            yield member
        elif member.is_class or member.is_module:
            yield from _functions(member)


class DelegatingDocstrings(griffe.Extension):
    """After the package is loaded, give each ``@delegating(X.y)`` method without a docstring ``X.y``'s."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for function in _functions(pkg):
            for decorator in function.decorators:
                call = decorator.value
                if function.docstring is None and str(call).startswith("delegating("):
                    docstring = pkg.modules_collection[call.arguments[0].canonical_path].docstring
                    function.docstring = griffe.Docstring(
                        docstring.value,
                        parent=function,
                        parser=docstring.parser,
                        parser_options=docstring.parser_options,
                    )
