"""Workers end with the process that started them, even when it is SIGKILLed (``hypergrid.launch.orphans``).

A parent process starts a long sleeper through ``orphans.wrap`` (the kernel's
parent-death signal, then ``exec``) or the watchdog (``--watch``, the path
for systems without one); the test SIGKILLs the parent and waits (bounded)
for the sleeper to be gone. The same for ``hypergrid.spawn``'s workers.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from hypergrid.launch import orphans

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]
ROOT = pathlib.Path(__file__).resolve().parents[2]
SLEEPER = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(600)"]


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its new parent to reap it counts as ended)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    """The pids still running after ``within_s`` (bounded wait, no timing asserted)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and not all(gone(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if not gone(pid)]


def _parent_of_a_sleeper(watch: bool) -> tuple[subprocess.Popen[str], int]:
    """A parent that starts the sleeper tied to it; (the parent, the sleeper's pid)."""
    command = f"import sys; sys.path[:0] = [{str(ROOT)!r}]; from hypergrid.launch import orphans; "
    command += f"w = orphans.wrap({SLEEPER!r}); w = w[:3] + ['--watch'] + w[3:] if {watch} else w; "
    command += "import subprocess; subprocess.Popen(w).wait()"
    parent = subprocess.Popen([sys.executable, "-c", command], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@pytest.mark.parametrize("watch", [False, True], ids=["parent-death signal, exec", "watchdog"])
def test_the_command_dies_with_the_parent(watch: bool) -> None:
    if not watch and not sys.platform.startswith("linux"):
        pytest.skip("the kernel's parent-death signal is Linux's")
    parent, sleeper = _parent_of_a_sleeper(watch)
    try:
        if not watch:  # exec'd: the command is the parent's own child, no process in between
            assert pathlib.Path(f"/proc/{sleeper}/stat").read_text().split()[3] == str(parent.pid)
        assert not gone(sleeper)
        parent.kill()
        parent.wait()
        assert wait_gone([sleeper]) == []
    finally:
        if not gone(sleeper):
            os.kill(sleeper, signal.SIGKILL)


def test_the_watchdog_hands_back_how_the_command_ended() -> None:
    exits = [sys.executable, "-c", "raise SystemExit(3)"]
    wrapped = orphans.wrap(exits)
    assert subprocess.run([*wrapped[:3], "--watch", *wrapped[3:]], timeout=60).returncode == 3
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    wrapped = orphans.wrap(killed)
    assert subprocess.run([*wrapped[:3], "--watch", *wrapped[3:]], timeout=60).returncode == -signal.SIGKILL
    assert subprocess.run(orphans.wrap(exits), timeout=60).returncode == 3  # the exec path: the command's own


def test_a_parent_gone_before_the_tie_leaves_no_worker() -> None:
    wrapped = orphans.wrap(SLEEPER)
    wrapped[3] = "1"  # a parent that is not ours: as if ours died before the signal was set
    done = subprocess.run(wrapped, capture_output=True, text=True, timeout=60)
    assert done.returncode == orphans.ORPHANED and done.stdout == ""


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_spawns_workers_end_when_the_spawning_parent_is_sigkilled(tmp_path: pathlib.Path, start_method: str) -> None:
    """Under a forkserver, the workers' parent is the server, which the workers alone must not keep alive."""
    code = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}]; import hypergrid; from tests.workers import launched; "
        f"hypergrid.spawn(launched.sleep_forever, 2, ({str(tmp_path)!r},), timeout_s=300, "
        f"start_method={start_method!r})"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("rank*.pid"))) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.1)
        workers = [int(path.read_text()) for path in sorted(tmp_path.glob("rank*.pid"))]
        assert len(workers) == 2, parent.poll()
        parents = {int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) for pid in workers}
        assert (parents == {parent.pid}) == (start_method == "spawn"), parents  # else the launcher's forkserver
        parent.kill()
        parent.wait()
        assert wait_gone(workers + sorted(parents - {parent.pid})) == []  # the workers and the server
    finally:
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("watch", [False, True], ids=["exec", "watchdog"])
def test_a_program_that_does_not_exist_is_one_line(watch: bool) -> None:
    wrapped = orphans.wrap(["no-such-program-hypergrid", "--flag"])
    done = subprocess.run(
        [*wrapped[:3], *(["--watch"] if watch else []), *wrapped[3:]], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 127
    assert done.stderr.strip() == "hypergrid.run: cannot run 'no-such-program-hypergrid': No such file or directory"
