"""The job-wide health count of ``hypergrid.run``, kept on the agents' rendezvous store.

Every agent (one per node) watches its own workers; the minimum-healthy rule is job-wide, so the agents share
their failures, the verdict and the end of the round through the store of their rendezvous round, under
``hypergrid/run/<restart>/`` (`HealthRound`). The keys and their store operations: docs/design/launcher.md
("Counting failures across agents").
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

from torch.distributed import DistStoreError

from hypergrid.launch.memberlog import formation
from hypergrid.timing import FOREVER_S

__all__ = ["UNFORMED", "HealthRound"]

#: In a round's verdict: a worker died before every worker had formed the job's first world.
UNFORMED = "before the job's first world formed"


class HealthRound:
    """The shared count of one rendezvous round (and restart): failures, the verdict, the exit barrier.

    Args:
        store: the agent's store for this round (torchelastic's ``worker_group.store``).
        restart: how many restarts the job has made (part of the key prefix, so a
            restart under a static rendezvous, whose store prefix never changes,
            starts from a clean count).
        workers: the job's number of workers.
        agents: the job's number of agents (nodes).
        min_healthy: the minimum number of healthy workers.

    Examples:
        >>> import torch.distributed as dist
        >>> health = HealthRound(dist.HashStore(), 0, workers=4, agents=1, min_healthy=3)
        >>> health.record_failure()  # 3 of 4 healthy: still at the minimum
        False
        >>> health.record_failure(), health.below_minimum()
        (True, True)
    """

    def __init__(self, store: Any, restart: int, *, workers: int, agents: int, min_healthy: int) -> None:
        self.store = store
        self.prefix = f"hypergrid/run/{restart}/"
        self.workers, self.agents, self.min_healthy = workers, agents, min_healthy
        self.failed = 0  # the job-wide count, as last seen by this agent
        self.verdict = ""  # the verdict's text once one is known: "<failed> of <workers> workers failed"
        self._fired = threading.Event()
        self._watcher: threading.Thread | None = None
        self._waiter: Any = None  # the barriers' own connection (`_wait`)
        self._suspects: list[tuple[str, str, float]] = []  # deaths that may have come before the world formed
        self._workers: Any = None  # `unformed`'s connection to the workers' store

    def _key(self, name: str) -> str:
        return self.prefix + name

    def healthy(self) -> int:
        """Workers of the job not known to have failed (running, or exited 0)."""
        return self.workers - self.failed

    def record_failure(self) -> bool:
        """Count one failed worker of this agent's; True when that takes the job below the minimum.

        The agent that crosses the line sets the verdict (and releases the
        exit barrier), so every other agent learns it.
        """
        self.failed = int(self.store.add(self._key("failed"), 1))
        if self.healthy() >= self.min_healthy:
            return False
        self.declare(f"{self.failed} of {self.workers} workers failed")
        return True

    def declare(self, verdict: str) -> None:
        """End the round job-wide with ``verdict`` whatever the count (a death before the job's world formed): every
        agent learns it as it learns a count below the minimum, and restarts or stops its workers."""
        self.verdict = verdict
        self.store.set(self._key("verdict"), verdict)
        self.store.set(self._key("done"), "verdict")
        self._fired.set()

    def suspect(self, log: str, what: str, within_s: float) -> None:
        """A worker died (``what``) in the round whose log is ``log``: `unformed` looks, for ``within_s``, whether
        the job's first world was still forming (the others begin forming it a little later, or have formed it)."""
        self._suspects.append((log, what, time.monotonic() + within_s))

    def unformed(self, workers_store: Callable[[], Any]) -> bool:
        """Whether a suspect death came before every worker formed the job's first world (`formation`, on the
        workers' store, which ``workers_store()`` connects to): then the round ends job-wide (`declare`), since
        nothing can shrink a world that never formed. A suspect is dropped once every worker formed it, or after its
        span with nobody forming it (a script that forms it its own way)."""
        for suspect in list(self._suspects):
            log, what, until = suspect
            try:
                if self._workers is None:  # (a connection of its own: no lock shared with the agent's other calls)
                    self._workers = workers_store()
                forming, formed = formation(self._workers, log)
            except Exception:  # no store: the round ends its usual way
                forming, formed = 0, self.workers
            if formed >= self.workers or (not forming and time.monotonic() > until):
                self._suspects.remove(suspect)
            elif forming:
                self._suspects.clear()
                self.declare(f"{what} {UNFORMED} ({formed} of {self.workers} workers had formed it)")
                return True
        return False

    def below_minimum(self) -> bool:
        """Whether any agent has declared the job below the minimum (what the watcher saw, no store call)."""
        return self._fired.is_set()

    def start_watching(self) -> None:
        """Start the thread that waits for the round's end (``done``), on a store connection of its own."""
        if self._watcher is not None:
            return
        clone = self.store.clone()
        self._watcher = threading.Thread(target=self._watch, args=(clone,), name="hypergrid-run-watch", daemon=True)
        self._watcher.start()

    def _watch(self, store: Any) -> None:
        while True:
            try:
                # (a day, then it waits again: torch logs each wait that times out; a daemon thread, not waited for)
                store.wait([self._key("done")], datetime.timedelta(seconds=FOREVER_S))
            except DistStoreError as error:
                if "timeout" in str(error).lower():
                    continue
                return  # the store is gone (the job is ending): nothing more to learn
            except Exception:  # a closed connection raises other errors; same meaning
                return
            self._settle(store)
            return

    def _settle(self, store: Any) -> bool:
        """``done`` is set: was it a verdict? If so, read its text and tell the agent's loop."""
        if not store.check([self._key("verdict")]):
            return False
        try:
            self.verdict = store.get(self._key("verdict")).decode()
        except Exception:  # the text is for the report only
            self.verdict = "another agent's count"
        self._fired.set()
        return True

    def stop_watching(self, join_s: float = 5.0) -> bool:
        """Wait up to ``join_s`` for the watcher to end (it does once ``done`` is set); whether it has."""
        if self._watcher is None:
            return True
        self._watcher.join(join_s)
        return not self._watcher.is_alive()

    def claim(self, rank: int, by: str) -> bool:
        """Whether this is the first account of worker ``rank``'s end: by its agent, or (``by`` another name) by the
        agent that found its agent dead (`count_dead_agent`). One ``compare_set``: no end is counted twice."""
        return bool(self.store.compare_set(self._key(f"ended/{rank}"), "", by).decode() == by)

    def count_dead_agent(self, index: int, ranks: list[int], by: str, read_shrunk: Callable[[], str] | None) -> bool:
        """Agent ``index`` died with its workers ``ranks`` (`hypergrid.launch.ring`): each one whose end its agent did
        not account for counts as failed, and the agent as arrived at the exit barrier (nobody waits for it).
        Whether the job fell below the minimum."""
        below = False
        for rank in ranks:
            if self.claim(rank, by):
                below = self.record_failure() or below
        self._arrive(index, by, read_shrunk)
        if self.agents > 1 and self._count("left", index, by):
            self.store.set(self._key("gone"), "all")  # (the others wait in `leave` for it)
        return below

    def _arrive(self, index: int | None, by: str, read_shrunk: Callable[[], str] | None) -> None:
        """Count agent ``index`` at the exit barrier, once (None: uncounted by name); the last one releases it."""
        if not self._count("arrived", index, by):
            return
        if read_shrunk is not None and int(self.store.add(self._key("failed"), 0)) > 0:
            try:
                listed = read_shrunk()
            except Exception:  # unread: every death counts as unaccounted
                listed = ""
            self.store.set(self._key("shrunk"), listed)
        self.store.set(self._key("done"), "all")

    def _count(self, name: str, index: int | None, by: str) -> bool:
        """Add agent ``index`` to the count ``name`` once (by itself, or by the agent that found it dead; None:
        uncounted by name); whether this call made it complete (every agent counted: its caller acts on it)."""
        if index is not None and self.store.compare_set(self._key(f"{name}/{index}"), "", by).decode() != by:
            return False  # counted already
        return int(self.store.add(self._key(name), 1)) == self.agents

    def exit_barrier(
        self, timeout_s: float, read_shrunk: Callable[[], str] | None = None, index: int | None = None
    ) -> str:
        """Wait until every agent's workers have exited, or a verdict; ``"done"``, ``"verdict"`` or ``"timeout"``.

        ``read_shrunk``: called by the last agent to arrive (every worker of the job has exited then, and every agent
        still waits) when any worker failed; what it returns (the members whose deaths the round's log accounts for,
        `hypergrid.launch.memberlog`) reaches every agent through ``shrunk``. ``index``: this agent's place, so that an
        agent found dead that had arrived already is not counted twice (`count_dead_agent`).
        """
        self._arrive(index, f"agent {index}", read_shrunk)
        try:
            self._wait("done", timeout_s)
        except DistStoreError:
            return "timeout"
        return "verdict" if self._settle(self.store) else "done"

    def _wait(self, name: str, timeout_s: float) -> None:
        """Wait for a key on a connection of its own: torch's client holds its lock through a wait, and the ring's
        thread (`count_dead_agent`) must reach the store meanwhile."""
        if self._waiter is None:
            self._waiter = self.store.clone()
        self._waiter.wait([self._key(name)], datetime.timedelta(seconds=timeout_s))

    def shrunk(self) -> str:
        """After an exit barrier that ended ``"done"``: the list the last agent read (``""``: none, or unread)."""
        key = self._key("shrunk")
        return self.store.get(key).decode() if self.store.check([key]) else ""

    def leave(self, timeout_s: float = 10.0, index: int | None = None) -> None:
        """Wait (at most ``timeout_s``) until every agent has read what the barrier handed out, before exiting.

        An agent may host the store the others still read; nothing is lost
        when it cannot be reached any more (the others are done with it). ``index``: this agent's place (an agent
        found dead is counted as gone by the one that found it, `count_dead_agent`).
        """
        if self.agents < 2:
            return
        try:
            if self._count("left", index, f"agent {index}"):
                self.store.set(self._key("gone"), "all")
                return
            self._wait("gone", timeout_s)
        except Exception:  # the host left first, or the wait timed out: nothing more to wait for
            return
