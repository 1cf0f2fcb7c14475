"""The agents of a job watch each other: each holds a TCP connection to the next, so an agent's death is seen at once.

An agent SIGKILLed (or a node that crashes) takes its workers with it (the parent-death signal,
`hypergrid.launch.orphans`), and nothing of theirs is left to tell the others; under NCCL, which reports no
closed connection, their peers would wait for the probe. `AgentRing`: every agent of a round listens on a
port of its own and connects to the next agent's (agent ``i`` to ``i + 1``, the last to the first). The kernel
closes a dead process's sockets, so the agent before it reads the end of its connection at once; one that
ends without the ``bye`` of an agent leaving in order is a death (one that cannot be reached at all is no proof
of one: it is reported on stderr and skipped), and the agent reports the dead agent's
workers (``on_lost``: the agent calls the survivors' roll call) and watches the next agent instead. A node
that vanishes without closing anything (power, network) is found by TCP keepalive after `KEEPALIVE_S`
silent seconds and `KEEPALIVE_PROBES` unanswered probes. Keys and costs: docs/design/launcher.md ("The
agents watch each other").
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from hypergrid.launch.ledger import parse_ranks

__all__ = ["BYE", "KEEPALIVE_PROBES", "KEEPALIVE_S", "AgentRing"]

#: What an agent leaving in order writes to the agent watching it before it closes the connection.
BYE = b"bye\n"
#: Seconds of silence before the kernel probes a connection, and between probes (a node gone without a close).
KEEPALIVE_S = 1
#: Unanswered probes after which the kernel ends the connection: a vanished node is found in about 4 s.
KEEPALIVE_PROBES = 3
#: How long an agent tries to connect to the next one's port.
CONNECT_S = 10.0
#: How long one wait for the next agent's address lasts before the watcher looks at its stop flag again.
_ADDRESS_SLICE_S = 5.0


def _keepalive(connection: socket.socket) -> None:
    """Have the kernel probe an idle connection, so a peer gone without a close ends it (Linux's options)."""
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_S),
        ("TCP_KEEPINTVL", KEEPALIVE_S),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
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
    ) -> None:
        if not 0 <= index < agents:
            raise ValueError(f"AgentRing: index={index!r}; expected 0 <= index < agents={agents}")
        self.store, self.prefix, self.index, self.agents = store, prefix, index, agents
        self.ranks, self.on_lost, self.host, self.report = list(ranks), on_lost, host, report
        self.lost: list[int] = []  # the agents found dead, in the order found
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._watched: socket.socket | None = None
        self._accepted: list[socket.socket] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._own: Any = None  # the watcher thread's connection (`start`)

    def _key(self, index: int) -> str:
        return f"{self.prefix}ring/{index}"

    def start(self) -> bool:
        """Listen, publish this agent's address and ranks, and start watching the next agent; False alone."""
        if self.agents < 2:
            return False
        listener = socket.create_server((self.host, 0), backlog=self.agents)
        self._listener = listener
        self.store.set(
            self._key(self.index),
            f"{self.host} {listener.getsockname()[1]} {','.join(str(rank) for rank in self.ranks)}",
        )
        self._own = self.store.clone()  # the watcher's (its waits block: torch's client holds its lock through them)
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
            _keepalive(connection)
            with self._lock:
                if self._stop.is_set():
                    connection.close()
                    return
                self._accepted.append(connection)

    def _watch(self, store: Any) -> None:
        """Watch the next agent; when it dies, report its workers and watch the one after it, until this one."""
        target = (self.index + 1) % self.agents
        while target != self.index and not self._stop.is_set():
            address = self._address(store, target)
            if address is None:
                return  # stopped, or the store is gone
            host, port, ranks = address
            ended = self._follow(target, host, port)
            if self._stop.is_set():
                return
            if ended == "died":
                self.lost.append(target)
                with contextlib.suppress(Exception):  # (the agent reports what it could not do)
                    self.on_lost(
                        target, ranks, f"died with their agent (node {target}), found dead by node {self.index}'s agent"
                    )
            target = (target + 1) % self.agents

    def _address(self, store: Any, target: int) -> tuple[str, int, list[int]] | None:
        """The next agent's address and ranks, once it published them; None when stopped or the store is gone."""
        while not self._stop.is_set():
            try:
                store.wait([self._key(target)], datetime.timedelta(seconds=_ADDRESS_SLICE_S))
                host, port, listed = store.get(self._key(target)).decode().split(" ", 2)
            except Exception as error:  # a timed-out slice: look at the stop flag; anything else: no store
                if "timeout" in str(error).lower():
                    continue
                return None
            return host, int(port), sorted(parse_ranks(listed))
        return None

    def _follow(self, target: int, host: str, port: int) -> str:
        """Connect and read until the connection ends: ``"left"`` (it said bye, or this one stops), ``"died"`` (this
        agent is the first to find it dead: it reports it), ``"known"`` (found dead by another agent before) or
        ``"unwatched"`` (no connection: nothing proves a death, so nothing is reported)."""
        try:
            connection = socket.create_connection((host, port), timeout=CONNECT_S)
        except OSError as error:  # gone before we came, or unreachable (a firewall): no proof of a death
            self.report(f"could not watch node {target}'s agent at {host}:{port} ({error}); watching the next one")
            return "unwatched"
        connection.settimeout(None)
        _keepalive(connection)
        with self._lock:
            self._watched = connection
        said = b""
        try:
            while chunk := connection.recv(64):
                said += chunk
        except OSError:
            pass
        finally:
            with self._lock:
                self._watched = None
            connection.close()
        return "left" if BYE in said or self._stop.is_set() else self._first_to_find(target)

    def _first_to_find(self, target: int) -> str:
        """``"died"`` where no other agent reported ``target`` dead before (one ``compare_set``), else ``"known"``: an
        agent that watches past the one it watched (that one left in order) meets the dead it reported."""
        mine = f"found by {self.index}"
        try:
            first = self._own.compare_set(f"{self._key(target)}/dead", "", mine).decode() == mine
        except Exception:  # no store: nobody to tell
            return "known"
        return "died" if first else "known"

    def close(self) -> None:
        """Leave in order: say bye to the agent watching this one, stop watching; idempotent."""
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
