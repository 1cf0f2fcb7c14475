"""The agents of a job watch each other: each holds a TCP connection to the next, so an agent's death is seen at once.

An agent SIGKILLed (or a node that crashes) takes its workers with it (the parent-death signal,
`hypergrid.launch.orphans`), and nothing of theirs is left to tell the others; under NCCL, which reports no closed
connection, their peers would wait for the probe. `AgentRing`: every agent of a round listens on a port of its own
and connects to the next agent's (agent ``i`` to ``i + 1``, the last to the first). The kernel closes a dead
process's sockets, so the agent before it reads the end of its connection at once; one that ends without the ``bye``
of an agent leaving in order (or its record of leaving) is a death, and the agent reports the dead agent's workers
(``on_lost``: the agent calls the survivors' roll call) and watches the next agent instead. A node that vanishes
without closing anything (power, network) is found by TCP keepalive after 10 x liveness silent seconds and
`hypergrid.timing.KEEPALIVE_PROBES` unanswered probes, 4 x liveness apart (about 15 s: `hypergrid.timing.Timing`).
Keys and costs: docs/design/launcher.md ("The agents watch each other").
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypergrid.launch.memberlog import parse_members
from hypergrid.timing import CONNECT_TRIES, KEEPALIVE_PROBES, Timing
from hypergrid.values import described

__all__ = ["BYE", "AgentRing", "local_address"]

#: What an agent leaving in order writes to the agent watching it before it closes the connection.
BYE = b"bye\n"


def _keepalive(connection: socket.socket, timing: Timing) -> None:
    """Have the kernel probe an idle connection, so a peer gone without a close ends it (Linux's options): after
    ``timing``'s keepalive idle span, `KEEPALIVE_PROBES` probes its keepalive interval apart (a network that stalls
    for less is not a death)."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = (
        ("TCP_KEEPIDLE", timing.keepalive_idle_s),
        ("TCP_KEEPINTVL", timing.keepalive_interval_s),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    )
    for name, value in options:
        if hasattr(socket, name):
            connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def local_address(toward: str) -> str:
    """The address of this host on the route to ``toward`` (the store's host): where the other agents reach it.

    Examples:
        >>> local_address("127.0.0.1")
        '127.0.0.1'
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((toward, 9))  # (a datagram socket sends nothing on connect: the route only)
            return str(probe.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


class AgentRing:
    """One agent's place in the ring of a round's agents: it listens, and watches the next agent.

    Args:
        store: the agents' store (a connection of its own is cloned for the watcher).
        prefix: the round's key prefix, equal on every agent (``hypergrid/run/<restart>/``).
        index: this agent's place (its group rank), ``0 <= index < agents``.
        agents: the round's number of agents.
        ranks: this agent's workers' global ranks (what its death costs the job).
        on_lost: ``on_lost(index, ranks, said)``, called from the watcher's thread when an agent this one watches
            died: its place, its workers' ranks and how it was found. Not called for an agent that left in order.
        host: the address the others connect to (the agent passes `local_address`).
        report: ``report(text)``, for what the ring could not do (an agent it could not connect to).
        timing: the agent's `hypergrid.timing.Timing` (default: read from the environment now): the keepalive, how
            long it tries to connect (`hypergrid.timing.Timing.connect_s`, `CONNECT_TRIES` times) and how long it
            waits for the next agent's address (`hypergrid.timing.Timing.address_s`).

    Examples:
        >>> import torch.distributed as dist
        >>> ring = AgentRing(dist.HashStore(), "R/", 0, 1, [0, 1], lambda index, ranks, said: None)
        >>> ring.start(), ring.close()  # one agent: nothing to watch
        (False, None)
    """

    def __init__(
        self,
        store: Any,
        prefix: str,
        index: int,
        agents: int,
        ranks: Sequence[int],
        on_lost: Callable[[int, list[int], str], object],
        host: str = "127.0.0.1",
        report: Callable[[str], object] = lambda text: None,
        timing: Timing | None = None,
    ) -> None:
        if not 0 <= index < agents:
            raise ValueError(f"AgentRing: index={index!r}; expected 0 <= index < agents={agents}")
        self.store, self.prefix, self.index, self.agents = store, prefix, index, agents
        self.ranks, self.on_lost, self.host, self.report = list(ranks), on_lost, host, report
        self.timing = Timing.from_env() if timing is None else timing
        self.lost: list[int] = []  # the agents found dead, in the order found
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._watched: socket.socket | None = None
        self._target: int | None = None  # the agent whose connection is open now (`watching`)
        self._accepted: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._own: Any = None  # the watcher thread's connection (`start`)

    @property
    def watching(self) -> int | None:
        """The agent this one holds a connection to now (None: none yet, or between two)."""
        with self._lock:
            return self._target

    def _key(self, index: int) -> str:
        return f"{self.prefix}ring/{index}"

    def start(self) -> bool:
        """Listen, publish this agent's address and ranks, and start watching the next agent; False alone."""
        if self.agents < 2:
            return False
        self._own = self.store.clone()  # the watcher's (its waits block: torch's client holds its lock through them)
        listener = socket.create_server((self.host, 0), backlog=self.agents)
        self._listener = listener
        self.store.set(
            self._key(self.index),
            f"{self.host} {listener.getsockname()[1]} {','.join(str(rank) for rank in self.ranks)}",
        )
        for target, name, args in ((self._accept, "accept", ()), (self._watch, "watch", (self._own,))):
            thread = threading.Thread(target=target, args=args, name=f"hypergrid-ring-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return True

    def _accept(self) -> None:
        """Hold every connection the agent before this one opens (its watch), until `close` says bye on it."""
        listener = self._listener
        assert listener is not None
        while not self._stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed by `close`
            with contextlib.suppress(OSError):
                _keepalive(connection, self.timing)
            with self._lock:
                if not self._stop.is_set():
                    self._accepted.append(connection)
                    continue
            with contextlib.suppress(OSError):  # (came after `close`: it leaves in order all the same)
                connection.sendall(BYE)
            connection.close()
            return

    def _watch(self, store: Any) -> None:
        """Watch the next agent; when it dies, report its workers and watch the one after it, until this one."""
        target = (self.index + 1) % self.agents
        while target != self.index and not self._stop.is_set():
            address = self._address(store, target)
            if address is None:
                return  # stopped, or the store is gone
            host, port, ranks = address
            ended = self._follow(target, host, port) if host else "unwatched"
            if self._stop.is_set():
                return
            if ended == "died":
                self.lost.append(target)
                said = f"died with their agent (node {target}), found dead by node {self.index}'s agent"
                try:
                    self.on_lost(target, ranks, said)
                except Exception as error:  # (a daemon thread: say it, never lose it)
                    self.report(f"the ring could not act on node {target}'s death ({described(error)})")
            target = (target + 1) % self.agents

    def _address(self, store: Any, target: int) -> tuple[str, int, list[int]] | None:
        """The next agent's address and ranks, once it published them; None when stopped or the store is gone, and
        ``("", 0, [])`` where it did not publish within the address span (its ring never started: it is said, and the
        watcher watches the one after). Each wait lasts the stop span, then it looks at its stop flag again."""
        until = time.monotonic() + self.timing.address_s
        while not self._stop.is_set():
            try:
                store.wait([self._key(target)], datetime.timedelta(seconds=self.timing.stop_s))
                host, port, listed = store.get(self._key(target)).decode().split(" ", 2)
            except Exception as error:  # a timed-out slice: look at the stop flag; anything else: no store
                if "timeout" not in str(error).lower():
                    return None
                if time.monotonic() >= until:
                    self.report(
                        f"node {target}'s agent did not join the agents' ring within {self.timing.address_s:g} s"
                    )
                    return "", 0, []
                continue
            return host, int(port), sorted(int(rank) for rank in parse_members(listed))
        return None

    def _follow(self, target: int, host: str, port: int) -> str:
        """Connect and read until the connection ends: ``"left"`` (it said bye or recorded that it left, or this one
        stops), ``"died"`` (this agent is the first to find it dead: it reports it) or ``"known"`` (found dead by
        another agent before). A port that refuses `CONNECT_TRIES` times, 0.2 s apart (or does not answer within the
        connect span) without a record of leaving is a death: the agents reach each other's ports as gloo and NCCL
        do."""
        connection = None
        for _ in range(CONNECT_TRIES):
            try:
                connection = socket.create_connection((host, port), timeout=self.timing.connect_s)
                break
            except OSError:
                if self._stop.wait(0.2):
                    return "left"
        if connection is None:
            return self._ended(target)
        connection.settimeout(None)
        with contextlib.suppress(OSError):
            _keepalive(connection, self.timing)
        with self._lock:
            if self._stop.is_set():  # (`close` came while it connected: it would not end this read)
                connection.close()
                return "left"
            self._watched, self._target = connection, target
        said = b""
        try:
            while chunk := connection.recv(64):
                said += chunk
        except OSError:
            pass
        finally:
            with self._lock:
                self._watched = self._target = None
            connection.close()
        return "left" if BYE in said or self._stop.is_set() else self._ended(target)

    def _ended(self, target: int) -> str:
        """``target``'s connection ended (or never came) without a bye: ``"left"`` where it recorded leaving (`close`
        writes the record before it closes anything), else ``"died"`` where no other agent reported it dead before
        (one ``compare_set``: an agent that watches past a departed neighbour meets the dead it reported), else
        ``"known"``. Nothing to report where the store is gone (the agent that hosted it died: every worker raises
        ``StoreLostError``)."""
        mine = f"found by {self.index}"
        try:
            if self._own.check([f"{self._key(target)}/left"]):
                return "left"
            first = self._own.compare_set(f"{self._key(target)}/dead", "", mine).decode() == mine
        except Exception:
            return "known"
        return "died" if first else "known"

    def close(self) -> None:
        """Leave in order: record it, say bye to the agent watching this one, stop watching; idempotent."""
        if self._listener is not None and not self._stop.is_set():
            with contextlib.suppress(Exception):  # (first: an end the watcher meets from now on is no death)
                self.store.set(f"{self._key(self.index)}/left", "")
        self._stop.set()
        with self._lock:
            accepted, self._accepted = self._accepted, []
            watched = self._watched
        for connection in accepted:
            with contextlib.suppress(OSError):
                connection.sendall(BYE)
            connection.close()
        if watched is not None:
            with contextlib.suppress(OSError):
                watched.shutdown(socket.SHUT_RDWR)  # ends our read (not a death: we stop)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        for thread in self._threads:
            thread.join(1.0)
