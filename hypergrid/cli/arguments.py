"""What every command shares about its arguments: one-line errors, strict ints, output paths checked first.

A bad argument ends a command with exit status 2 and one line on stderr
(``python -m hypergrid plan: error: ...``), never a traceback: the line names
the value and what was expected; ``--help`` shows the usage.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pathlib
import re
import sys
from collections.abc import Iterator
from typing import NoReturn

from hypergrid.errors import InvalidArgumentError
from hypergrid.values import shown

__all__ = ["OneLineParser", "check_output", "parse_int", "parse_seconds", "require_module", "write_text", "writing"]

# ASCII digits only: str.isdigit() and int() also take "²" or "٣"; 18 digits stay below int()'s text limit.
_INT = re.compile(r"[0-9]{1,18}")
_SECONDS_PATTERN = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        """Print ``prog: error: message`` on one line and exit with status 2."""
        line = " ".join(str(message).split())
        sys.stderr.write(f"{self.prog}: error: {line} (see --help)\n")
        sys.exit(2)


def parse_int(text: str, what: str, minimum: int = 0) -> int:
    """``text`` as an int of ASCII digits (at most 18) that is at least ``minimum``.

    Raises:
        InvalidArgumentError: anything else (``"²"``, ``"-1"``, ``" 4"``, ``"1e3"``).

    Examples:
        >>> parse_int("16", "--top", 1)
        16
        >>> parse_int("²", "--top", 1)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: --top must be an int >= 1 written in digits 0-9, got '²'
    """
    if not isinstance(text, str) or not _INT.fullmatch(text) or int(text) < minimum:
        raise InvalidArgumentError(f"{what} must be an int >= {minimum} written in digits 0-9, got {shown(text)}")
    return int(text)


def parse_seconds(text: str, what: str) -> float:
    """``text`` as a number of seconds: digits with an optional fraction (``"300"``, ``"2.5"``), nothing else.

    Raises:
        InvalidArgumentError: anything else (``"nan"``, ``"inf"``, ``"-1"``, ``"1e3"``).

    Examples:
        >>> parse_seconds("2.5", "--timeout")
        2.5
        >>> parse_seconds("nan", "--timeout")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: --timeout='nan': expected seconds written in digits 0-9 ...
    """
    if not isinstance(text, str) or not _SECONDS_PATTERN.fullmatch(text):
        raise InvalidArgumentError(f"{what}={shown(text)}: expected seconds written in digits 0-9 (such as 300 or 2.5)")
    return float(text)


def check_output(path: pathlib.Path, what: str) -> None:
    """Refuse an output path that cannot be written, before any work: a directory, or no writable parent.

    Missing parent directories are fine where they can be created (the
    command creates them).

    Raises:
        InvalidArgumentError: ``path`` is a directory, or its nearest existing
            ancestor is not a writable directory.

    Examples:
        >>> check_output(pathlib.Path("/"), "--json")
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: --json '/' is a directory; give a file name
    """
    try:
        is_dir = path.is_dir()
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
    except OSError as error:  # a name too long for the file system, ...
        raise InvalidArgumentError(f"{what} {shown(str(path))}: not a path it can write ({error.strerror})") from None
    if is_dir:
        raise InvalidArgumentError(f"{what} {shown(str(path))} is a directory; give a file name")
    if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
        raise InvalidArgumentError(
            f"{what} {shown(str(path))}: cannot create it: {shown(str(ancestor))} is not a writable directory"
        )


@contextlib.contextmanager
def writing(path: pathlib.Path, what: str) -> Iterator[pathlib.Path]:
    """Create ``path``'s parents, then run the block that writes it; an OS error becomes one naming the path.

    Raises:
        InvalidArgumentError: the write failed (no space, no permission, ...).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield path
    except OSError as error:
        raise InvalidArgumentError(f"{what} {shown(str(path))}: cannot write it ({error.strerror or error})") from None


def write_text(path: pathlib.Path, text: str, what: str) -> None:
    """Write ``text`` to ``path`` (see `writing`)."""
    with writing(path, what):
        path.write_text(text)


def require_module(name: str, what: str) -> None:
    """Refuse an option whose optional dependency is missing, before any work.

    Raises:
        InvalidArgumentError: ``name`` cannot be imported.

    Examples:
        >>> require_module("json", "--json")
    """
    try:
        importlib.import_module(name)
    except ImportError:
        raise InvalidArgumentError(
            f"{what} needs {name}, which is not installed (pip install {name}, or the package's 'bench' extra)"
        ) from None
