"""A phase every rank of a set must reach, its outcome decided once: all passed, or it failed (and who is dead).

`Barrier` closes a collective step that torch cannot make atomic: the commit after group creation and the phases
of ``shrink``. The outcome is written once with ``compare_set``, so two ranks never see different outcomes: a rank
that reaches the barrier after the others gave up (stopped by SIGSTOP, say, and resumed) gets the failure too,
never success. `Prober` asks the world's roll call who is dead while the others are awaited; `Vigil` ends a
shrink's attempt that waits inside torch once a member is found dead. Keys and costs: docs/design/recovery.md
("Barriers").
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hypergrid.agreement import diagnosis
from hypergrid.binding.alarm import Job
from hypergrid.timing import Timing

__all__ = ["Barrier", "BarrierFailed", "Prober", "Vigil"]


class BarrierFailed(RuntimeError):
    """The barrier failed: ``dead`` (members found dead, possibly none) and why (the message)."""

    def __init__(self, message: str, dead: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.dead = sorted(dead)


class Barrier:
    """One member's side of a barrier of ``members`` under ``prefix`` (see the module's docstring).

    Args:
        store: any ``torch.distributed.Store`` (or an object with its methods).
        prefix: the barrier's key prefix, equal on every member, new for each barrier.
        rank: this member.
        members: every member (sorted), the caller among them.
        deadline: when to give up waiting (``time.monotonic()``).
        what: the step, as failures should name it.
        probe: runs a roll call and returns every rank found dead so far (None: none).
        side: a store connection the probing thread may use while this rank's is blocked (needed with ``probe``).
        linger: on success, leave the count and the verdict (``count_key``, ``verdict_key``) for the caller to
            delete once every member is known to have read it (one operation less per member).
        before_ok: run by the member whose arrival completes the barrier, before it writes ``ok``: while every
            other member waits in the barrier.
        job: the job whose store this is (a lost store raises ``StoreLostError``; None: torch's error as it is).
        timing: the world's `hypergrid.timing.Timing` (default: the defaults): the first two members ask ``probe``
            every `hypergrid.timing.Timing.roll_bound_s` of the members while they wait.
    """

    def __init__(
        self,
        store: Any,
        prefix: str,
        rank: int,
        members: Sequence[int],
        deadline: float,
        what: str,
        probe: Callable[[], Sequence[int]] | None = None,
        side: Any = None,
        linger: bool = False,
        before_ok: Callable[[], object] | None = None,
        job: Job | None = None,
        timing: Timing | None = None,
    ) -> None:
        self.store = store
        self.side = side
        self.prefix = prefix
        self.rank = rank
        self.members = members
        self.deadline = deadline
        self.what = what
        self.probe = probe
        self._count = f"{prefix}/count"
        self._verdict = f"{prefix}/verdict"
        self._read = f"{prefix}/read"
        self.linger = linger
        self.position = 0  # this member's arrival order (1 for the first), once `run` counted it
        self.before_ok = before_ok
        self.job = job
        self.timing = Timing() if timing is None else timing

    def run(self) -> None:
        """Reach the barrier; return once every member did, else raise `BarrierFailed` (the same on every member).

        Raises:
            StoreLostError: the job's store is gone.
        """
        with contextlib.nullcontext() if self.job is None else self.job.store_calls(self.what):
            self._run()

    def _run(self) -> None:
        arrived = self.position = self.store.add(self._count, 1)
        if arrived >= len(self.members):
            if self.before_ok is not None:
                self.before_ok()
            self._conclude(self._publish("ok"))
            return
        prober = None
        if arrived <= 2 and self.probe is not None and self.side is not None:
            prober = Prober(self.timing.roll_bound_s(len(self.members)), self.probe, self._dead_found).start()
        try:
            data = self._await()
        finally:
            if prober is not None:
                prober.stop()
        self._conclude(data)

    @property
    def count_key(self) -> str:
        """The arrivals' counter."""
        return self._count

    @property
    def verdict_key(self) -> str:
        """Where the outcome is written."""
        return self._verdict

    def fail(self, store: Any, message: str, dead: Sequence[int] = ()) -> None:
        """Fail the barrier from outside (another thread's ``store`` connection): its waiters wake at once."""
        store.compare_set(self._verdict, "", json.dumps({"failed": message, "dead": sorted(dead)}))

    def give_up(self, message: str, dead: Sequence[int] = ()) -> None:
        """This member cannot reach the barrier: fail it (unless an outcome is in) and raise the outcome in force.

        Always raises `BarrierFailed`: the verdict written first, by this
        member or another, so that every member reads the same one.
        """
        data = self._publish(json.dumps({"failed": message, "dead": sorted(dead)}))
        self._conclude(data)
        raise BarrierFailed(f"{self.what}: the barrier passed without a member that gave up")  # unreachable

    def _dead_found(self, found: set[int]) -> bool:
        dead = sorted(found & set(self.members))
        if dead:
            self.fail(self.side, f"a member died before {self.what}", dead)
        return bool(dead)

    def _await(self) -> bytes:
        # A wait woken without the verdict, once the count is gone too, means the others concluded without this
        # member (a failure naming it dead, read and deleted while it was stopped): it is left behind.
        data = diagnosis.await_value(self.store, self._verdict, self.deadline, self._gone)
        if data is not None:
            return data
        if self._gone():
            raise BarrierFailed(
                f"{self.what}: the others went on without rank {self.rank} (declared dead)", [self.rank]
            )
        dead = [member for member in self.probe() if member in set(self.members)] if self.probe is not None else []
        return self._publish(json.dumps({"failed": f"not every member reached {self.what} in time", "dead": dead}))

    def _gone(self) -> bool:
        return not self.store.check([self._count])

    def _publish(self, text: str) -> bytes:
        data: bytes = self.store.compare_set(self._verdict, "", text)
        return data

    def _conclude(self, data: bytes) -> None:
        if data == b"ok":  # every member arrived: the count goes on to 2N with the reads, the last deletes
            if self.linger:
                return  # the caller deletes the keys once every member read the outcome (`keys`)
            if self.store.add(self._count, 1) >= 2 * len(self.members):
                self.store.delete_key(self._count)
                self.store.delete_key(self._verdict)
            return
        failure = json.loads(data)
        dead = failure["dead"]
        if self.rank not in dead and self.store.add(self._read, 1) >= len(self.members) - len(dead):
            for key in (self._count, self._verdict, self._read):
                self.store.delete_key(key)
        raise BarrierFailed(failure["failed"], dead)


class Prober:
    """A thread that asks ``probe`` every ``period_s`` who is dead and hands a non-empty answer to ``on_dead``.

    ``on_dead(found)`` returns True when it acted (the prober then ends); it never runs after `stop` returned, so a
    prober cannot write into a step that has ended (a lock orders the two).
    """

    def __init__(
        self, period_s: float, probe: Callable[[], Sequence[int]], on_dead: Callable[[set[int]], bool]
    ) -> None:
        self.period_s = period_s
        self.probe = probe
        self.on_dead = on_dead
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="hypergrid-prober", daemon=True)

    def start(self) -> Prober:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.period_s):
            try:
                found = set(self.probe())
            except RuntimeError:  # the store is gone: nothing to probe with
                return
            with self._lock:
                if self._stopped.is_set():
                    return
                if found and self.on_dead(found):
                    return


class Vigil:
    """A step whose members wait inside torch, where no wait of ours listens: a member found dead ends it at once.

    What ``shrink`` keeps while it forms a new world (the default group, the families, the step's all-reduce).
    Every member listens to the old world's watcher (``watch``: `hypergrid.agreement.watcher.Watcher.on_dead`):
    once a verdict names a member dead, every member's waits there end (``end``) and `check` raises; the first two
    members (``probe`` given) ask the roll call every ``period_s`` meanwhile (`Prober`). docs/design/recovery.md
    ("Attempts: forming the new world").

    Args:
        watch: registers a callback run with every rank found dead so far, at each verdict naming dead ranks;
            returns what unregisters it (None: no liveness, nothing is heard).
        members: the roll call's rank -> member, for the step's members.
        what: the step, as the failure names it.
        end: ``end(dead, text)`` ends the step's waits (on the watcher's thread).
        probe: runs a roll call, returns the members found dead (None: this member does not probe).
        period_s: how often ``probe`` is asked (default: `hypergrid.timing.Timing.roll_bound_s` of the members, at
            the default settings).
    """

    def __init__(
        self,
        watch: Callable[[Callable[[tuple[int, ...]], None]], Callable[[], object]] | None,
        members: Mapping[int, int],
        what: str,
        end: Callable[[list[int], str], None],
        probe: Callable[[], Sequence[int]] | None = None,
        period_s: float | None = None,
    ) -> None:
        self.watch = watch
        self.members = members
        self.what = what
        self.end = end
        self.dead: list[int] = []  # the members found dead (set once)
        period_s = Timing().roll_bound_s(len(members)) if period_s is None else period_s
        self._prober = None if probe is None or watch is None else Prober(period_s, probe, self._found)
        self._forget: Callable[[], object] | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> Vigil:
        if self.watch is not None:
            self._forget = self.watch(self._heard)
        if self._prober is not None:
            self._prober.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._prober is not None:
            self._prober.stop()
        if self._forget is not None:
            self._forget()

    def check(self) -> None:
        """Raise `BarrierFailed` naming the members found dead, if any (the main thread, between torch's calls)."""
        if self.dead:
            raise BarrierFailed(f"member(s) {self.dead} died while {self.what} (a roll call found them)", self.dead)

    def _heard(self, dead: tuple[int, ...]) -> None:
        self._found(sorted(self.members[rank] for rank in dead if rank in self.members))

    def _found(self, found: Iterable[int]) -> bool:
        """Members found dead (by a verdict, or by the prober: a member the roll call does not cover, an arrival
        whose heartbeat stood still): the step's waits end once; whether they did."""
        found = sorted(found)
        with self._lock:
            if not found or self.dead:
                return bool(self.dead)
            self.dead = found
        with contextlib.suppress(RuntimeError):  # (on the watcher's thread: an error here would end it)
            self.end(found, f"member(s) {found} died while {self.what}")
        return True
