"""``--replace-dead``: the agent starts a new worker in place of each one that died, and the grid grows back.

A replacement runs the dead worker's command with its environment (its ``RANK`` and ``LOCAL_RANK``: the launcher's
rank is reused), ``HYPERGRID_MEMBER=<rank>.<k>`` for the ``k``-th started in that rank's place (its name in the
round's log: `hypergrid.launch.memberlog`) and ``HYPERGRID_ARRIVAL=1``: the script builds its grid as the others
did and calls ``grid.arrive`` instead of initializing torch.distributed (docs/elastic.md, "Growing back"). The agent
holds one `Replacements` per round: it starts at most ``limit`` of them over the round, watches them as it watches its
workers (`exits`), and stops them with the round. docs/launcher.md ("Replacing the dead").
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypergrid.launch.memberlog import MEMBER_ENV, Entry, arrival_members, member_name
from hypergrid.launch.outcomes import WorkerOutcome
from hypergrid.timing import Timing

__all__ = ["ARRIVAL_ENV", "REPLACING_ENV", "Replacements"]

#: Set to ``1`` in a replacement's environment: the script joins the running job (``grid.arrive``).
ARRIVAL_ENV = "HYPERGRID_ARRIVAL"
#: Set in every worker's environment under ``--replace-dead`` (the most replacements per round): a rank a shrink
#: retires may wait for replacements to come and grow the grid back (the elastic loop does).
REPLACING_ENV = "HYPERGRID_REPLACE_DEAD"


class Replacements:
    """The workers one agent started in place of dead ones, in one round.

    Args:
        limit: how many it may start in the round (``--max-replacements``).
        timing: the agent's `hypergrid.timing.Timing` (default: read from the environment now): `stop` waits
            `hypergrid.timing.Timing.stop_s` after SIGTERM before it SIGKILLs.

    Examples:
        >>> replacements = Replacements(0)
        >>> replacements.start(None, 3, 3), replacements.running, replacements.exits()
        (None, {}, [])
    """

    def __init__(self, limit: int, timing: Timing | None = None) -> None:
        self.limit = limit
        self.timing = Timing.from_env() if timing is None else timing
        self.started: list[tuple[int, int, int]] = []  # (launcher rank, local rank, pid), in order
        self.running: dict[int, tuple[subprocess.Popen[bytes], int, int]] = {}  # pid -> (process, rank, how many)
        self.ended: list[WorkerOutcome] = []

    def start(self, pcontext: Any, local_rank: int, rank: int) -> int | None:
        """Start a replacement of worker ``rank`` (``local_rank`` here) with its command; its pid, or None where the
        limit is reached (or there is no worker command to repeat)."""
        if len(self.started) >= self.limit or pcontext is None:
            return None
        command = [pcontext.entrypoint, *pcontext.args[local_rank]]
        count = 1 + sum(1 for started, _, _ in self.started if started == rank)
        env = {**os.environ, **pcontext.envs[local_rank], ARRIVAL_ENV: "1", MEMBER_ENV: member_name(rank, count)}
        process = subprocess.Popen(command, env=env)
        self.started.append((rank, local_rank, process.pid))
        self.running[process.pid] = (process, rank, count)
        return process.pid

    def exits(self, stopped: bool = False) -> list[WorkerOutcome]:
        """The replacements seen exited since the last call (every one still running, stopped, when ``stopped``)."""
        found = []
        for pid, (process, rank, count) in list(self.running.items()):
            code = process.poll()
            if code is None and not stopped:
                continue
            local = next(local for started, local, each in self.started if each == pid)
            outcome = WorkerOutcome(rank, local, pid, code, stopped, replacement=count)
            del self.running[pid]
            self.ended.append(outcome)
            found.append(outcome)
        return found

    def stop(self) -> list[WorkerOutcome]:
        """Stop every replacement still running (SIGTERM, then SIGKILL after the stop span); their outcomes."""
        processes = [process for process, _, _ in self.running.values()]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.timing.stop_s
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return self.exits(stopped=True)

    def end_unjoined(self, entries: Sequence[Entry], report: Callable[[str], None]) -> list[WorkerOutcome]:
        """The round's workers have all exited: unless a replacement that joined the job (``arrived`` in the log's
        ``entries``) still runs it, the job has ended, and the replacements still running never joined it (one is
        still starting, or its script never calls ``arrive``): stop them, one ``report`` line each; their outcomes
        (stopped: not failures)."""
        joined = set(arrival_members(entries).values())
        if any(member_name(rank, count) in joined for _, rank, count in self.running.values()):
            return []
        stopped = self.stop()
        for outcome in stopped:
            report(f"worker {outcome.name} never joined the job, which has ended: stopped it")
        return stopped
