"""Processes that arrive after the job began: their keys on the job's store, their heartbeat, and their wake.

An *arrival* (a replacement started by ``hypergrid.run --replace-dead``, or any process pointed at the job's
store: ``grid.arrive``) registers here and waits. The running ranks pay nothing for it on a healthy step: the
arrival wakes them as a failure does (a roll call in their current world, `wake`), and the next ``shrink`` (or
``grow``) agrees on the arrivals waiting (`Arrivals.decide`) and drafts those its plan takes
(`hypergrid.layout.grow.plan_regrow`): each gets a *draft* (the plan's inputs, JSON) and forms the new world with
the survivors. While it waits and joins, an arrival's `Heartbeat` counts up; `absent` tells a survivor that waits
for it whether it is still there (it answers no roll call of the old world: it is not in it). Keys and costs:
docs/design/recovery.md ("Growing back").

Examples:
    >>> import torch.distributed as dist
    >>> store = dist.HashStore()
    >>> arrivals = Arrivals(store)
    >>> arrivals.register("d1", {"pid": 7}), arrivals.register("d1", {"pid": 8}), arrivals.waiting("d1")
    (0, 1, [0, 1])
    >>> arrivals.decide(3, [0, 1]), arrivals.decide(3, [1])  # the first proposal stands
    ([0, 1], [0, 1])
    >>> arrivals.mark_taken([0], 2); arrivals.waiting("d1"), arrivals.considered(1)
    ([1], True)
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from hypergrid.agreement import diagnosis
from hypergrid.agreement.liveness import FAILURE, Incident
from hypergrid.timing import Timing

__all__ = ["RELEASE", "Arrivals", "Heartbeat", "absent", "wake"]

PREFIX = "hypergrid/arrivals"
#: A draft that tells an arrival the job ended without it (``release_spares``).
RELEASE = "release"


class Arrivals:
    """The job's arrivals on ``store`` (the job's base store: every world's keys live there)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    @staticmethod
    def key(name: str, arrival: int | None = None) -> str:
        return f"{PREFIX}/{name}" if arrival is None else f"{PREFIX}/{arrival}/{name}"

    # -- the arrival's side -----------------------------------------------------------------

    def register(self, digest: str, info: dict[str, Any]) -> int | None:
        """Register an arrival for a grid whose origin has ``digest``; its number, or None once the job ended."""
        number = int(self.store.add(self.key("count"), 1)) - 1
        self.store.set(self.key("info", number), json.dumps({**info, "digest": digest}))
        if self.closed():  # (release sets it before it reads the count: never both missed)
            return None
        return number

    def draft(self, arrival: int) -> str | None:
        """The arrival's draft, if written (None: it still waits)."""
        data = diagnosis.read(self.store, self.key("draft", arrival))
        return None if data is None else data.decode()

    def depart(self, arrival: int, joined: bool) -> None:
        """The arrival leaves the waiting list (it joined, or gave up, or the job ended): its info and heartbeat go,
        and its draft once it joined (a withdrawal or a release stays: a late draft must meet it)."""
        for name in ("info", "beat", *(("draft",) if joined else ())):
            self.store.delete_key(self.key(name, arrival))

    def closed(self) -> bool:
        """Whether the job ended (`close`): an arrival still waiting then is not taken."""
        return bool(self.store.check([self.key("closed")]))

    def withdraw(self, arrival: int) -> None:
        """Forget the arrival's draft (a plan that drafted it went on without it: it waits again)."""
        self.store.delete_key(self.key("draft", arrival))

    def running_world(self) -> tuple[int, int] | None:
        """The running job's current world: (number, size), as its rank 0 published it; None before."""
        data = diagnosis.read(self.store, self.key("world"))
        if data is None:
            return None
        number, size = data.decode().split()
        return int(number), int(size)

    # -- the running ranks' side ---------------------------------------------------------------

    def publish_world(self, number: int, size: int) -> None:
        """On a world's rank 0 once it holds: where an arrival wakes the ranks (`wake`)."""
        self.store.set(self.key("world"), f"{number} {size}")

    def unpublish_world(self, number: int, size: int) -> None:
        """On its rank 0 when world ``number`` ends for good (its grids destroyed): forget its wake key, unless a
        later world's is there."""
        if diagnosis.read(self.store, self.key("world")) == f"{number} {size}".encode():
            self.store.delete_key(self.key("world"))

    def waiting(self, digest: str) -> list[int]:
        """The arrivals not taken yet whose grid has this origin ``digest`` (others are refused: `refuse`)."""
        found = []
        for arrival in self._pending():
            info = diagnosis.read(self.store, self.key("info", arrival))
            if info is not None and json.loads(info).get("digest") == digest:
                found.append(arrival)
        return found

    def _pending(self) -> range:
        """The arrivals registered and not taken (two reads, never a write: a job without arrivals keeps no key)."""
        count = int(diagnosis.read(self.store, self.key("count")) or 0)
        return range(int(diagnosis.read(self.store, self.key("taken")) or 0), count)

    def info(self, arrival: int) -> dict[str, Any]:
        """What the arrival said of itself (its pid, host, and its grid's digest)."""
        data = diagnosis.read(self.store, self.key("info", arrival))
        return {} if data is None else dict(json.loads(data))

    def decide(self, number: int, proposal: Sequence[int]) -> list[int]:
        """The arrivals the shrink that forms world ``number`` considers: the first survivor's ``proposal`` stands."""
        data = self.store.compare_set(self.key(f"decided/{number}"), "", json.dumps(list(proposal)))
        return [int(arrival) for arrival in json.loads(data)]

    def forget_decision(self, number: int) -> None:
        self.store.delete_key(self.key(f"decided/{number}"))

    def send_draft(self, arrival: int, text: str) -> None:
        """Draft ``arrival`` (the first writer's draft stands: every writer writes the same)."""
        self.store.compare_set(self.key("draft", arrival), "", text)

    def mark_taken(self, arrivals: Sequence[int], considered: int) -> None:
        """A world took ``arrivals`` in (later shrinks skip them, and those below them); the arrivals below
        ``considered`` were weighed (an arrival weighed and not taken wakes nobody again: `considered`)."""
        if arrivals:
            self.store.set(self.key("taken"), str(max(arrivals) + 1))
        self.store.set(self.key("considered"), str(considered))

    def considered(self, arrival: int) -> bool:
        """Whether a shrink weighed ``arrival`` (and did not need it): it waits for a later one without waking."""
        return arrival < int(diagnosis.read(self.store, self.key("considered")) or 0)

    def close(self) -> list[int]:
        """The job ends: every arrival still waiting is released (its ``arrive`` returns None); those released."""
        self.store.set(self.key("closed"), "")
        released = []
        for arrival in self._pending():
            if self.store.compare_set(self.key("draft", arrival), "", RELEASE) == RELEASE.encode():
                released.append(arrival)
        return released


def describe_arrival() -> dict[str, Any]:
    """What an arrival says of itself on the waiting list: its pid and host (who it is for the launcher is in the
    job's log: `hypergrid.launch.memberlog`)."""
    return {"pid": os.getpid(), "host": socket.gethostname()}


class Heartbeat:
    """An arrival's sign of life while it waits and joins: a counter it adds to every pulse (``timing``'s
    `hypergrid.timing.Timing.pulse_s`; default: read from the environment) on its own thread and store connection
    ``link``, until `stop`."""

    def __init__(self, link: Any, arrival: int, timing: Timing | None = None) -> None:
        self.link = link
        self.timing = Timing.from_env() if timing is None else timing
        self.key = Arrivals.key("beat", arrival)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"hypergrid-arrival-{arrival}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.link.add(self.key, 1)
            except RuntimeError:  # the store is gone: the job is, too
                return
            self._stop.wait(self.timing.pulse_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timing.stop_s)


def absent(store: Any, arrivals: Sequence[int], window_s: float) -> list[int]:
    """The ``arrivals`` whose heartbeat did not move in ``window_s`` (dead, or stopped): they do not come.

    Examples:
        >>> import torch.distributed as dist
        >>> absent(dist.HashStore(), [4], 0.01)  # never beat
        [4]
    """
    if not arrivals:
        return []
    keys = [Arrivals.key("beat", arrival) for arrival in arrivals]
    first = [store.add(key, 0) for key in keys]
    time.sleep(window_s)
    return [arrival for arrival, key, seen in zip(arrivals, keys, first) if store.add(key, 0) == seen]


def wake(store: Any, world: int, size: int, text: str) -> bool:
    """Call a roll call in world ``world`` (of ``size`` ranks) whose verdict fails it with nobody dead: every
    rank's grid waits end with ``RankFailure`` and its ``shrink`` takes the arrivals in. Whether the call was ours
    (False: another incident is open; the caller tries again)."""
    incident = Incident.next_of(store, world)
    mine = f"{FAILURE} {text}"
    return incident.call(FAILURE, text, range(size)) == mine
