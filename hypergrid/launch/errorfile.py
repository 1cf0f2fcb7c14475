"""What a worker of a torchelastic launcher raised, in torchelastic's error file: written by the worker
(`record_uncaught_exceptions`), quoted by ``hypergrid.run``'s agent (`raised`)."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from types import TracebackType

__all__ = ["raised", "record_uncaught_exceptions"]

_ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def record_uncaught_exceptions() -> bool:
    """Make an uncaught exception write torchelastic's error file, as ``@record`` would; whether one is set up.

    Only under a torchelastic launcher (``TORCHELASTIC_ERROR_FILE`` set); the previous ``sys.excepthook`` still runs
    (the traceback is printed as before). An error file already written (by ``@record``) is kept. Calling it again
    changes nothing.

    Examples:
        >>> import os
        >>> record_uncaught_exceptions() == ("TORCHELASTIC_ERROR_FILE" in os.environ)
        True
    """
    path = os.environ.get(_ERROR_FILE_ENV, "")
    if not path:
        return False
    if getattr(sys.excepthook, "hypergrid_error_file", None) == path:
        return True
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if not os.path.exists(path):
            _write_error_file(path, kind, error, trace)
        previous(kind, error, trace)

    hook.hypergrid_error_file = path  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True


def _write_error_file(path: str, kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    message = {
        "message": f"{kind.__name__}: {error}",
        "extraInfo": {
            "py_callstack": "".join(traceback.format_exception(kind, error, trace)),
            "timestamp": str(int(time.time())),
        },
    }
    try:
        with open(path, "w") as out:
            json.dump({"message": message}, out)
    except OSError:  # the report is a courtesy; the exit code says the rest
        pass


def raised(error_file: str) -> str | None:
    """The first line of what a worker raised, from its error file (None: no file, or not one of torch's).

    Examples:
        >>> raised("/nonexistent") is None
        True
    """
    try:
        with open(error_file) as source:
            data = json.load(source)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    return message.strip().splitlines()[0]
