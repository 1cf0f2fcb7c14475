"""Where is each rank? Python stacks dumped on a signal, read back and cut to the frames that matter.

Each rank registers ``faulthandler`` on ``SIGUSR1`` with a file of its own, ``rank{RANK}.stack`` in a directory;
``faulthandler`` writes from a C signal handler, so a rank blocked inside a collective (the GIL released or not)
still answers. ``spawn`` does this for every worker and quotes the stacks of the ranks still running at its
timeout; under ``torchrun``, docs/api.md ("When a rank hangs") says how. A report keeps the caller's own frames,
the first library call they made (``torch.distributed`` and hypergrid count as library) and the innermost frame,
each with its source line (`cut_frames`).
"""

from __future__ import annotations

import faulthandler
import linecache
import os
import pathlib
import re
import signal
import sysconfig
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from hypergrid.errors import InvalidArgumentError, public
from hypergrid.validation import check_int, check_ints, refuse
from hypergrid.values import as_int

__all__ = ["STACK_DIR_ENV", "enable_stack_dumps", "read_stack_dumps", "request_stack_dumps"]

#: The environment variable naming the directory ``init_from_env`` enables stack dumps into.
STACK_DIR_ENV = "HYPERGRID_STACK_DIR"
#: The function each spawned rank starts in; frames from it outward are the launcher's, not the user's.
_ENTRY = ("hypergrid/launch/processes.py", "_worker")
_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_LIBRARY_DIRS = tuple(
    {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {str(pathlib.Path(__file__).resolve().parents[1])}  # hypergrid itself
)
_LIBRARY_PATH = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python[\d.]*[/\\]")
_open_files: dict[int, IO[str]] = {}  # signal number -> the dump file, kept open for the handler


@dataclass(frozen=True)
class _Frame:
    file: str
    line: int
    function: str

    @property
    def library(self) -> bool:
        return self.file.startswith((*_LIBRARY_DIRS, "<")) or _LIBRARY_PATH.search(self.file) is not None

    def render(self) -> str:
        source = linecache.getline(self.file, self.line).strip()
        text = f'  File "{self.file}", line {self.line}, in {self.function}'
        return f"{text}\n    {source}" if source else text


def stack_file(directory: str | os.PathLike[str], rank: int) -> pathlib.Path:
    """The file rank ``rank`` dumps its stacks into, in ``directory``.

    Examples:
        >>> stack_file("/tmp/stacks", 3).name
        'rank3.stack'
    """
    return pathlib.Path(directory) / f"rank{rank}.stack"


@public
def enable_stack_dumps(
    directory: str | os.PathLike[str] | None = None, rank: int | None = None, signum: int | None = None
) -> pathlib.Path | None:
    """Make this process dump every thread's Python stack to a file of its own when it gets ``signum``.

    Args:
        directory: where to write; default ``$HYPERGRID_STACK_DIR`` (nothing is
            enabled when neither is given). Created if missing.
        rank: the rank in the file name; default ``$RANK`` (else 0).
        signum: the signal; default ``SIGUSR1``.

    Returns:
        The dump file (``directory/rank{rank}.stack``), or ``None`` when no directory is given.

    Raises:
        InvalidArgumentError: a ``rank`` that is not a non-negative int, or no
            ``SIGUSR1`` on this platform.

    Examples:
        >>> import tempfile
        >>> enable_stack_dumps(tempfile.mkdtemp(), rank=0).name
        'rank0.stack'
        >>> _ = disable_stack_dumps()
    """
    if directory is not None:
        _check_directory("enable_stack_dumps", directory)
    chosen = directory if directory is not None else os.environ.get(STACK_DIR_ENV)
    if not chosen:
        return None
    if rank is None:
        number = int(os.environ.get("RANK", "0"))
    else:
        number = check_int("enable_stack_dumps", "rank", rank, 0, 2**31 - 2)
    sig = _signal(signum)
    path = stack_file(chosen, number)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a", encoding="utf-8")  # appends: a reader may empty the file between dumps
    except OSError as error:
        raise refuse(
            "enable_stack_dumps", "directory", chosen, f"a directory it can write ({error.strerror})"
        ) from None
    disable_stack_dumps(sig)
    _open_files[sig] = handle
    faulthandler.register(sig, file=handle, all_threads=True, chain=False)
    return path


def disable_stack_dumps(signum: int | None = None) -> bool:
    """Undo ``enable_stack_dumps`` for ``signum`` (default ``SIGUSR1``); ``True`` if it was enabled.

    Examples:
        >>> disable_stack_dumps()
        False
    """
    sig = _signal(signum)
    handle = _open_files.pop(sig, None)
    if handle is None:
        return False
    faulthandler.unregister(sig)
    handle.close()
    return True


def _check_directory(call: str, directory: object) -> None:
    """A directory argument: a non-empty str or path (``os.PathLike``)."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise refuse(call, "directory", directory, "a directory's path (a non-empty str or pathlib.Path)")


def _signal(signum: int | None) -> int:
    if signum is not None:
        number = as_int(signum)
        if number is None or number not in signal.valid_signals():
            raise refuse("enable_stack_dumps", "signum", signum, "a signal number such as signal.SIGUSR1")
        return number
    if not hasattr(signal, "SIGUSR1"):
        raise InvalidArgumentError("stack dumps need SIGUSR1, which this platform does not have")
    return int(signal.SIGUSR1)


def request_stack_dumps(
    pids: dict[int, int], directory: str | os.PathLike[str], wait_s: float = 3.0, signum: int | None = None
) -> str:
    """Signal each rank's process and return ``read_stack_dumps`` of their answers.

    Args:
        pids: rank -> process id of the ranks to ask.
        directory: where they dump (``enable_stack_dumps``).
        wait_s: how long to wait for the dumps to appear.
        signum: the signal they listen on; default ``SIGUSR1``.
    """
    sig = _signal(signum)
    for rank, pid in pids.items():
        stack_file(directory, rank).write_text("")  # only what this request produces
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + wait_s
    sizes: dict[int, int] = {}
    while time.monotonic() < deadline:  # until every dump has appeared and stopped growing
        now = {rank: _size(stack_file(directory, rank)) for rank in pids}
        if all(now.values()) and now == sizes:
            break
        sizes = now
        time.sleep(0.1)
    return read_stack_dumps(directory, sorted(pids))


def _size(path: pathlib.Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@public
def read_stack_dumps(directory: str | os.PathLike[str], ranks: Iterable[int] | None = None) -> str:
    """The stacks dumped in ``directory`` as one report, each rank cut to the frames that matter.

    Args:
        directory: the directory given to ``enable_stack_dumps``.
        ranks: which ranks; default every ``rank*.stack`` file there.

    Returns:
        One section per rank: ``rank R is at:`` then its frames, outermost
        first and with their source lines, as in a Python traceback.

    Examples:
        >>> import tempfile
        >>> directory = tempfile.mkdtemp()
        >>> _ = stack_file(directory, 1).write_text('Current thread 0x1 (most recent call first):\\n'
        ...                                         '  File "train.py", line 7 in step\\n')
        >>> print(read_stack_dumps(directory))
        rank 1 is at:
          File "train.py", line 7, in step
    """
    _check_directory("read_stack_dumps", directory)
    try:
        found = [path.stem[4:] for path in pathlib.Path(directory).glob("rank*.stack")] if ranks is None else []
    except OSError as error:
        raise refuse(
            "read_stack_dumps", "directory", directory, f"a directory it can read ({error.strerror})"
        ) from None
    chosen = (
        sorted(int(number) for number in found if number.isdigit())
        if ranks is None
        else check_ints("read_stack_dumps", "ranks", ranks, 0, 2**31 - 2, limit=2**20)
    )
    sections = []
    for rank in chosen:
        path = stack_file(directory, rank)
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        frames = cut_frames(text)
        if frames:
            sections.append(f"rank {rank} is at:\n" + "\n".join(frames))
        else:
            sections.append(f"rank {rank}: no Python stack came back (no dump in {path})")
    return "\n".join(sections)


def _threads(text: str) -> list[list[_Frame]]:
    """The threads of the last ``faulthandler`` dump in ``text``, current thread first, frames outermost first.

    A file may hold several dumps (one per signal); a thread seen again starts the next one.
    """
    threads: list[tuple[bool, list[_Frame]]] = []
    seen: set[str] = set()
    for line in text.splitlines():
        header = _THREAD.match(line)
        if header:
            if header.group(2) in seen:
                threads, seen = [], set()
            seen.add(header.group(2))
            threads.append((header.group(1) == "Current thread", []))
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1][1].append(_Frame(frame["file"], int(frame["line"]), frame["function"].strip()))
    threads.sort(key=lambda thread: not thread[0])
    return [list(reversed(frames)) for _, frames in threads]


def cut_frames(text: str) -> list[str]:
    """The frames of a ``faulthandler`` dump that say where the rank is, rendered, outermost first.

    The thread running the rank's function (below ``spawn``'s entry point) is
    chosen, else the current thread; kept are its frames below the entry
    point that are not library code, the first library frame each of them
    calls, and the innermost frame. Runs of frames left out are counted.

    Examples:
        >>> dump = '''Current thread 0x1 (most recent call first):
        ...   File "/usr/lib/python3/threading.py", line 320 in wait
        ...   File "/usr/lib/python3/threading.py", line 310 in _wait
        ...   File "/usr/lib/python3/threading.py", line 300 in join
        ...   File "train.py", line 9 in step
        ...   File "train.py", line 3 in main'''
        >>> print("\\n".join(cut_frames(dump)))
          File "train.py", line 3, in main
          File "train.py", line 9, in step
          File "/usr/lib/python3/threading.py", line 300, in join
          (1 library frame left out)
          File "/usr/lib/python3/threading.py", line 320, in wait
    """
    threads = _threads(text)
    if not threads:
        return []
    started = [thread for thread in threads if any(_is_entry(frame) for frame in thread)]
    frames = started[0] if started else threads[0]
    entries = [i for i, frame in enumerate(frames) if _is_entry(frame)]
    if entries:
        frames = frames[entries[-1] + 1 :]
    if not frames:
        return []
    kept = set()
    for i, frame in enumerate(frames):
        if not frame.library:
            kept.add(i)
            if i + 1 < len(frames):
                kept.add(i + 1)  # the call it made, library or not
    kept.add(len(frames) - 1)
    out: list[str] = []
    skipped = 0
    for i, frame in enumerate(frames):
        if i not in kept:
            skipped += 1
            continue
        if skipped:
            out.append(f"  ({skipped} library frame{'s' if skipped > 1 else ''} left out)")
            skipped = 0
        out.append(frame.render())
    return out


def _is_entry(frame: _Frame) -> bool:
    return frame.file.replace(os.sep, "/").endswith(_ENTRY[0]) and frame.function == _ENTRY[1]
