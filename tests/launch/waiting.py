"""Waiting for what another process does, in the launcher's tests: `eventually`."""

from __future__ import annotations

import time
from collections.abc import Callable


def eventually(condition: Callable[[], object], within_s: float = 10.0, pause_s: float = 0.01) -> bool:
    """Whether ``condition()`` became true within ``within_s`` (looked at every ``pause_s``)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(pause_s)
    return False
