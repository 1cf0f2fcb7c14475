"""Workers that end with the process that started them: no orphan keeps training after its launcher is killed.

On Linux the kernel's parent-death signal (`die_with_parent`: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``); elsewhere a
watchdog that kills the worker once its parent is gone (`main`, run by path: ``python -I orphans.py PARENT_PID
COMMAND...``). This file imports nothing of hypergrid's, and nothing outside the standard library: the launcher
runs it before the worker's interpreter starts. How each launcher uses it: docs/design/launcher.md ("Workers end
with their agent").
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

__all__ = ["die_with_parent", "main", "tie_to_parent", "wrap"]

_PR_SET_PDEATHSIG = 1
#: How often the watchdog (where the kernel cannot do it) looks for its parent.
WATCH_INTERVAL_S = 0.2
#: The exit code of a worker whose parent was gone before it started (as if the parent-death signal had come).
ORPHANED = 128 + signal.SIGKILL


def die_with_parent(parent_pid: int) -> bool:
    """Have the kernel SIGKILL this process when ``parent_pid`` (its parent) dies; False where it cannot (not Linux).

    Exits at once (code 137) when the parent is already gone.

    Examples:
        >>> import subprocess  # in a child: the signal would stay set on this process
        >>> child = f"import os, sys; sys.path[:0] = [{os.path.dirname(__file__)!r}]; import orphans; "
        >>> child += f"print(orphans.die_with_parent({os.getpid()}))"
        >>> tied = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True).stdout
        >>> tied.strip() == str(sys.platform.startswith("linux"))
        True
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent_pid:  # the parent died before the signal was set
        os._exit(ORPHANED)
    return True


def tie_to_parent(parent_pid: int) -> str:
    """End this process when ``parent_pid`` dies: the kernel's signal, else a watchdog thread; which one.

    For a worker that runs Python code of ours from its start (``spawn``'s).

    Examples:
        >>> import subprocess
        >>> child = f"import os, sys; sys.path[:0] = [{os.path.dirname(__file__)!r}]; import orphans; "
        >>> child += f"print(orphans.tie_to_parent({os.getpid()}))"
        >>> how = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True).stdout
        >>> how.strip() in ("signal", "watchdog")
        True
    """
    if die_with_parent(parent_pid):
        return "signal"
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(WATCH_INTERVAL_S)
        os._exit(ORPHANED)

    threading.Thread(target=watch, name="hypergrid-parent-watch", daemon=True).start()
    return "watchdog"


def wrap(command: Sequence[str]) -> list[str]:
    """``command`` run so that it ends with this process (see the module's docstring).

    Examples:
        >>> import subprocess
        >>> subprocess.run(wrap([sys.executable, "-c", "print('tied')"]), capture_output=True, text=True).stdout.strip()
        'tied'
    """
    return [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), *command]


def _watch(parent_pid: int, command: Sequence[str]) -> int:
    """Run ``command`` as a child; kill it when our parent is gone; its exit code (a signal: ours too)."""
    child = subprocess.Popen(list(command))
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a signal to the process group reaches the child:
        signal.signal(sig, lambda *_: None)  # outlive it, to hand back how it ended
    while True:
        try:
            code = child.wait(WATCH_INTERVAL_S)
            break
        except subprocess.TimeoutExpired:
            if os.getppid() != parent_pid:
                child.kill()
    if code < 0:  # end by the same signal (SIGKILL and SIGSTOP keep their default action anyway)
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """``orphans.py [--watch] PARENT_PID COMMAND...``: run COMMAND tied to PARENT_PID (``--watch``: the watchdog)."""
    args = list(sys.argv[1:] if argv is None else argv)
    watch = bool(args) and args[0] == "--watch"
    args = args[1:] if watch else args
    if len(args) < 2 or not args[0].isdigit():
        print("usage: orphans.py [--watch] PARENT_PID COMMAND...", file=sys.stderr)
        return 2
    parent, command = int(args[0]), args[1:]
    try:
        if not watch and die_with_parent(parent):
            os.execvp(command[0], command)
        if os.getppid() != parent:
            return ORPHANED
        return _watch(parent, command)
    except OSError as error:  # no such program, not executable: the shell's codes, one line
        print(f"hypergrid.run: cannot run {command[0]!r}: {error.strerror}", file=sys.stderr)
        return 127 if isinstance(error, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main())
