"""The optional frameworks the adapters drive, imported on first use, with one clear error when absent.

Examples:
    >>> import_or_refuse("json", "loads", "Python", "").__name__
    'json'
    >>> import_or_refuse("no_such.api", "build", "NoSuch", "pip install no-such")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    hypergrid.errors.DependencyError: build needs NoSuch (no_such.api does not import: ...); pip install no-such
"""

from __future__ import annotations

import importlib
from typing import Any

from hypergrid.errors import DependencyError

__all__ = ["import_or_refuse"]


def import_or_refuse(module: str, call: str, package: str, install: str) -> Any:
    """``module``, imported; if it does not import, ``DependencyError`` (an ``ImportError``) naming ``call``.

    ``package`` is what the user installs (``"DeepSpeed"``), ``install`` how.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise DependencyError(f"{call} needs {package} ({module} does not import: {error}); {install}") from error
