"""The node's agent answers the roll call for its workers (issue 46): `NodeWatch`, one per launcher round.

Under ``python -m hypergrid.run`` each worker's watcher joins its agent through a FIFO (`hypergrid.agreement.relay`)
instead of answering on the store. The agent follows each world its workers are in (one thread and one store
connection per world, `Follow`): woken by a call, it answers for every worker of its node that is alive (not
stopped, its pulse fresh) with one ``append`` and one ``add`` (`Incident` with ``ranks``), closes the roll call
where its answer came first or second, reads the verdict once for them all, and writes it to each worker's FIFO. A
roll call then has one participant per node instead of one per GPU; every count (answers, readers) stays one per
rank, so workers answered by an agent and ranks that answer for themselves share one roll call. A worker the agent
does not answer for is named dead as one whose watcher did not answer; its verdict waits in its FIFO, and it fences
itself when it resumes. docs/design/rollcall.md ("The node's agent answers").
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hypergrid.agreement import diagnosis
from hypergrid.agreement.liveness import END, Incident, bound_s, ended_ranks, incident_prefix, wake_key
from hypergrid.agreement.relay import CONTROL, runs, send
from hypergrid.binding.alarm import is_store_loss
from hypergrid.launch.memberlog import MemberLog, dead_ranks
from hypergrid.timing import FOREVER_S, Timing
from hypergrid.values import described, first_line

__all__ = ["Follow", "NodeWatch"]

LOGGER = logging.getLogger("hypergrid")


@dataclass(frozen=True)
class Member:
    """One worker's rank in a world this agent follows: its process and its FIFO."""

    pid: int
    path: str

    def answers(self, window_s: float | None = None) -> bool:
        """Whether the agent answers for it: its process runs (not stopped, not a zombie: ``/proc``) and its pulse
        is younger than ``window_s`` (default: `Timing.pulse_window_s`)."""
        if not runs(self.pid):  # (gone: its FIFO stays, nobody unlinked it)
            return False
        try:
            window = Timing.from_env().pulse_window_s if window_s is None else window_s
            return time.time() - os.stat(self.path).st_mtime <= window
        except OSError:  # its FIFO went: it left
            return False


class NodeWatch:
    """The roll-call answerer of one launcher round's workers on this node (see the module's docstring).

    Args:
        connect: opens a new connection to the workers' store (the agents' TCPStore, without prefix).
        log: the round's membership log (`hypergrid.launch.memberlog`): where rank 0 publishes its roll calls' prefix.
        directory: where the FIFOs live (created by `start`, removed by `stop`): the workers find it in their
            environment (`hypergrid.agreement.relay.NODE_WATCH_ENV`).
        liveness_s: the roll call's liveness bound (default: ``HYPERGRID_LIVENESS_S``, as the workers read it).
        report: where a line about a failure of the watch goes (the launcher's stderr).

    Examples:
        >>> import tempfile, torch.distributed as dist
        >>> server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        >>> connect = lambda: dist.TCPStore("127.0.0.1", server.port, is_master=False)
        >>> watch = NodeWatch(connect, "L/", tempfile.mkdtemp() + "/watch").start()
        >>> sorted(os.listdir(watch.directory)), watch.follows
        (['agent'], {})
        >>> watch.stop(); os.path.exists(watch.directory)
        False
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        log: str,
        directory: str,
        *,
        liveness_s: float | None = None,
        report: Callable[[str], None] = LOGGER.warning,
    ) -> None:
        self.connect = connect
        self.log = log
        self.directory = directory
        self.liveness_s = liveness_s
        self.report = report
        self.follows: dict[int, Follow] = {}  # world -> its follow
        self.answered = 0  # roll calls it answered (for one worker or more)
        self.stopped = False
        self.lost = False  # a follow met the store's loss: no connection is opened again (each waits out 30 s)
        self._lock = threading.Lock()  # the follows, the idle connections
        self._opening = threading.Lock()  # one connection opened at a time
        self._waking = threading.Lock()  # the waker's one user at a time (`wake`)
        self._waker: Any = None
        self._idle: list[Any] = []  # connections of follows that ended, for the next world's
        self._prefix: str | None = None
        self._control = -1
        self._listener = threading.Thread(target=self._listen, name="hypergrid-node-watch", daemon=True)

    def start(self) -> NodeWatch:
        """Make the directory and the agent's FIFO, and listen to the workers' joins and leaves."""
        os.makedirs(self.directory, exist_ok=True)
        path = os.path.join(self.directory, CONTROL)
        os.mkfifo(path, 0o600)
        self._control = os.open(path, os.O_RDWR)  # (keeps a writer: the listener never reads an end of file)
        self._listener.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every follow and the listener (the round ended); the directory goes."""
        self.stopped = True
        with contextlib.suppress(OSError):
            os.write(self._control, b"{}\n")
        with self._lock:
            follows = list(self.follows.values())
        for follow in follows:
            follow.halt(timeout_s)
        self._listener.join(timeout_s)
        with contextlib.suppress(OSError):
            os.close(self._control)
        shutil.rmtree(self.directory, ignore_errors=True)

    # -- the workers' joins and leaves ------------------------------------------------

    def _listen(self) -> None:
        buffer = b""
        while not self.stopped:
            try:
                chunk = os.read(self._control, 65536)
            except OSError:
                return
            buffer += chunk
            while b"\n" in buffer and not self.stopped:
                line, _, buffer = buffer.partition(b"\n")
                try:
                    self._on(json.loads(line))
                except Exception as error:  # never expected: said, and the listener goes on
                    said = described(error)
                    self.report(f"the node's watch could not handle {line[:200]!r} ({said})")

    def _on(self, message: dict[str, Any]) -> None:
        if "join" in message:
            world, rank, size, first = (int(value) for value in message["join"])
            with self._lock:
                follow = self.follows.get(world)
                if follow is None or follow.ended or follow.stopped:  # (one halted: its thread may not have ended)
                    follow = self.follows[world] = Follow(self, world, size)
                    follow.thread.start()
            number = follow.add(rank, Member(int(message["pid"]), str(message["path"])), first)
            send(str(message["path"]), {"ack": number})
        elif "leave" in message:
            world, rank = (int(value) for value in message["leave"])
            with self._lock:
                follow = self.follows.get(world)
            if follow is not None and follow.remove(rank):
                follow.halt(1.0)

    # -- what the follows share -------------------------------------------------------

    def connection(self) -> Any:
        """A connection to the workers' store under their roll calls' prefix: an idle one, or a new one (opened one
        at a time: torch's client can stall 5 s when two threads of a process connect at once,
        docs/design/rollcall.md). Waits until rank 0 published the prefix (`hypergrid.launch.memberlog`)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
        with self._opening:
            raw = self.connect()
            if self._prefix is None:
                key = f"{self.log}liveness"
                waited = Timing.from_env().publish_timeout_s
                deadline = time.monotonic() + waited
                while not self.stopped and not raw.check([key]):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the workers never published {key!r} in {waited:g} s")
                    time.sleep(0.05)
                self._prefix = raw.get(key).decode()
        return dist.PrefixStore(self._prefix[:-1], raw) if self._prefix else raw  # type: ignore[attr-defined]

    def count_answer(self) -> None:
        """A follow answered a roll call for its workers (`answered`: the follows of several worlds may at once)."""
        with self._lock:
            self.answered += 1

    def wake(self, call: Callable[[Any], object]) -> None:
        """``call(connection)`` on the watch's waker: the connection that ends a follow's waits from another thread
        (a halt, a join that moves a follow on), one thread at a time (a torch client shared by two threads at once
        can hang both). Opened on first need; a store gone is no error, and none is opened once it was lost."""
        with self._waking, contextlib.suppress(RuntimeError):
            if self._waker is None and self.lost:
                return
            if self._waker is None:
                self._waker = self.connection()
            call(self._waker)

    def idle(self, *connections: Any) -> None:
        """A follow ended: its connections serve the next world's."""
        with self._lock:
            self._idle.extend(connection for connection in connections if connection is not None)


class Follow:
    """The agent's watch of one world its workers are in: a thread that answers each incident for them.

    Args:
        watch: the node's watch (its connections, its report).
        world: the world's number; size: its size.
    """

    def __init__(self, watch: NodeWatch, world: int, size: int) -> None:
        self.watch = watch
        self.world = world
        self.size, self.expected = size, list(range(size))
        self.number = -1  # the incident it waits on (set by the first join)
        self.members: dict[int, Member] = {}
        self.ended = self.stopped = False
        self.store: Any = None  # the thread's connection (blocking waits)
        self.side: Any = None  # the thread's short calls (a torch client serves one thread at a time)
        self.incident: Incident | None = None
        self.waiting = ""  # the wake key the thread waits on
        self.log_read: MemberLog | None = None  # the round's log, as the thread read it (`_declare`)
        self.late: list[int] = []  # members that joined while `incident` was answered, answered by `add`
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"hypergrid-node-follow-{world}", daemon=True)

    def add(self, rank: int, member: Member, first: int) -> int:
        """``rank`` joins (its watcher waits from incident ``first`` on, the one after ``done`` as it read it); the
        incident the follow waits on. A join whose ``first`` is ahead (an incident closed since the follow began
        waiting) moves an idle follow past it. A join into the incident the follow answers now (for the members it
        had then) is answered at once: the roll call counts the rank from its join on, and would find it silent."""
        late = None
        with self._lock:
            self.members[rank] = member
            if self.number < 0:
                self.number = first
            elif first > self.number and self.incident is None:
                self.number = first
                self._wake()
            elif (
                self.incident is not None
                and first <= self.incident.number
                and rank not in (*self.incident.ranks, *self.late)  # (each answered once)
            ):
                late = self.incident
                self.late.append(rank)  # (a reader of its verdict too: `_handle`)
            number = self.number
        if late is not None:
            prefix, expected = late.prefix, late.expected
            self.watch.wake(lambda connection: Incident(connection, prefix, rank, expected).answer())
        return number

    def remove(self, rank: int) -> bool:
        """``rank`` left the world (its watcher stopped): no longer answered for; whether none is left."""
        with self._lock:
            self.members.pop(rank, None)
            return not self.members

    def halt(self, timeout_s: float) -> None:
        """Stop: wake the thread (its wait, an incident's waits) and join it, at most ``timeout_s``."""
        self.stopped = True
        deadline = time.monotonic() + timeout_s
        while True:
            self._wake()
            incident = self.incident
            if incident is not None:
                self.watch.wake(incident.interrupt)
            self.thread.join(min(0.1, max(deadline - time.monotonic(), 0.0)))
            if not self.thread.is_alive() or time.monotonic() >= deadline:
                return

    def _wake(self) -> None:
        """End the thread's wait on its wake key (a read of an absent key wakes its waiters)."""
        if self.waiting:
            key = self.waiting
            self.watch.wake(lambda connection: diagnosis.read(connection, key))

    # -- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.store, self.side = self.watch.connection(), self.watch.connection()
            while not self.stopped:
                with self._lock:
                    number, ranks = self.number, sorted(self.members)
                    self.waiting = wake_key(self.world, number, ranks[0]) if ranks else ""
                if not ranks:
                    break
                with contextlib.suppress(dist.DistStoreError):  # (the slice ended: it waits again)
                    self.store.wait([self.waiting], datetime.timedelta(seconds=FOREVER_S))
                    if not self.stopped and number == self.number and not self._handle(number):
                        break
        except RuntimeError as error:  # the store is gone (the job is over), or never expected
            if self.stopped:
                return
            if is_store_loss(error):  # its workers' grid waits end with StoreLostError, as a watcher's loss does
                self.watch.lost = True
                self._tell({"lost": first_line(error)[:500]})
            else:  # said aloud: the node's workers are answered for no more, the others find them dead
                self.watch.report(f"the node's watch of world {self.world} stops ({described(error)})")
            return
        finally:
            self.ended = True
        self.watch.idle(self.store, self.side)

    def _handle(self, number: int) -> bool:
        """Answer incident ``number`` for the members that answer, relay its outcome to every member; False once
        none is left (the world ended, the members were fenced or left)."""
        seen = time.monotonic()
        with self._lock:  # (with the incident set: a member that joins from now on is answered by `add`)
            members, expected = dict(self.members), list(self.expected)
            if not members:  # every worker left while it waited
                return False
            window = Timing.from_env().pulse_window_s
            answering = [rank for rank, member in members.items() if member.answers(window)]
            incident = Incident(self.store, incident_prefix(self.world, number), min(members), expected, answering)
            self.incident, self.late = incident, []
        incident.stop, incident.waker = (lambda: self.stopped), self.side
        call = incident.answer()
        if answering and call is not None and not call.startswith(END):
            self.watch.count_answer()
            self._declare(incident, expected)
        if call is None:  # a halt's or a neighbour's wake, or the others finished this incident without the node
            self.incident = None
            return self._unanswered(incident)
        if call.startswith(END):
            dead, _ = json.loads(call[len(END) :])[:2]
            self._tell({"n": number, "end": dead})  # (first: a worker's end is known before the world's keys go)
            Incident(self.store, incident.prefix, min(members), expected, list(members)).read_end(
                call, seen + bound_s(len(expected), self.watch.liveness_s)
            )
            return False
        verdict = incident.close(call, seen, self.watch.liveness_s)
        self.incident = None
        if verdict is None:  # halted, or the others went on without this node's answer
            if not self.stopped:
                self._tell({"fence": f"world {self.world} went on without this rank (incident {number} ended "
                                     "without it)"})  # fmt: skip
            return False
        with self._lock:  # the ranks answered since they joined read the verdict too (the last reader cleans up)
            incident.ranks, self.late = tuple(sorted({*incident.ranks, *self.late})), []
        incident.conclude(verdict)
        with self._lock:
            self.number = number + 1
            gone = {*verdict.dead, *(verdict.alive if verdict.kind == "minority" else ())}
            self.expected = [rank for rank in self.expected if rank not in set(verdict.dead)]
        self._tell({"n": number, "verdict": verdict.encode()})
        with self._lock:
            for rank in gone:
                self.members.pop(rank, None)
            return bool(self.members)

    def _declare(self, incident: Incident, expected: list[int]) -> None:
        """Declare gone in this roll call the ranks the round's log records dead (`dead_ranks`): one decision path,
        whichever incident the agent's announcement went into (one the others never looked at, where every rank
        had left the watch between two grids, and joined it again from incident 0). One check without news."""
        if self.log_read is None:
            self.log_read = MemberLog(self.side, self.watch.log)
        gone = set(dead_ranks(self.log_read.entries(), self.world, self.size)) & set(expected)
        if gone - set(incident.gone):
            self.side.append(incident.key("gone"), "".join(f"{rank}\n" for rank in sorted(gone)))

    def _unanswered(self, incident: Incident) -> bool:
        """Woken without a call: wait again, unless the world went on without the node (its members are fenced)."""
        if self.stopped:
            return False
        for rank in ended_ranks(self.side, self.world) & set(self.members):
            send(self.members[rank].path, {"fence": f"world {self.world} ended without this rank"})
            self.remove(rank)
        if not incident.over():
            return bool(self.members)
        self._tell({"fence": f"world {self.world} went on without this rank (incident {incident.number} ended "
                             "without it)"})  # fmt: skip
        return False

    def _tell(self, message: dict[str, Any]) -> None:
        """Write ``message`` to every member's FIFO (one that nobody reads any more left the world)."""
        with self._lock:
            members = list(self.members.items())
        for rank, member in members:
            if not send(member.path, message) and not os.path.exists(member.path):
                self.remove(rank)
