"""A worker's line to its node's agent, which answers the roll call for it (issue 46): the worker's side, `Relay`.

Under ``python -m hypergrid.run`` the agent names a directory in its workers' environment
(`hypergrid.launch.answerer.NODE_WATCH_ENV`, taken out of it by the job: `hypergrid.binding.alarm.Job.node_watch`).
There, each watcher of a worker (one per world) makes a FIFO named ``<world>.<rank>.<pid>``, tells the agent it
joined (a line on the agent's FIFO, `CONTROL`), and from then on reads its roll calls' outcomes from its FIFO
instead of answering on the store: the agent (`hypergrid.agreement.nodewatch.NodeWatch`) answers for every worker
of its node with one request of each kind, and relays each verdict. While it watches, a thread of the worker
touches the FIFO's modification time every `Timing.pulse_s` (its *pulse*): a worker whose pulse stopped (an interpreter
that holds its lock in a C call) or that is stopped (``T`` in ``/proc``) is not answered for, as a watcher thread
that cannot run does not answer. Messages are JSON lines (`send`: one longer than ``PIPE_BUF`` goes in pieces; a
line torn by a writer that gave up on a full FIFO is skipped).
docs/design/rollcall.md ("The node's agent answers").
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from hypergrid.agreement.rollverdict import Verdict
from hypergrid.binding.alarm import Job
from hypergrid.timing import Timing

__all__ = ["CONTROL", "Relay", "runs", "send"]

#: The agent's own FIFO in that directory: the workers' joins and leaves.
CONTROL = "agent"


def runs(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not stopped, traced, a zombie or dead (``/proc/<pid>/stat``).

    Examples:
        >>> import os
        >>> runs(os.getpid()), runs(2**22 + 1)  # (above the largest pid Linux gives)
        (True, False)
    """
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("T", "t", "Z", "X", "x")
    except (FileNotFoundError, IndexError):  # gone
        return False


def send(path: str, message: dict[str, Any]) -> bool:
    """Write one message (a JSON line) to the FIFO at ``path`` without blocking for long; whether it went (False:
    nobody reads it, or its buffer stayed full for `Timing.send_s`: a reader stopped for long, which skips the
    torn line)."""
    line = memoryview((json.dumps(message, separators=(",", ":")) + "\n").encode())
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader; ENOENT: gone
        return False
    deadline = time.monotonic() + Timing.from_env().send_s
    try:
        while line:  # (a line longer than PIPE_BUF may go in pieces)
            try:
                line = line[os.write(descriptor, line) :]
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.001)
        return True
    except OSError:  # EPIPE (the reader closed)
        return False
    finally:
        os.close(descriptor)


class Relay:
    """One watcher's FIFO from its node's agent (see the module's docstring).

    Args:
        directory: the agent's directory (`node_watch_directory`).
        world: the world's number; rank: this rank in it; size: the world's size.
    """

    def __init__(self, directory: str, world: int, rank: int, size: int, agent: int | None = None) -> None:
        self.directory = directory
        self.world, self.rank, self.size = world, rank, size
        self.agent = os.getppid() if agent is None else agent  # (the agent started this worker)
        self.timing = Timing.from_env()
        self.path = os.path.join(directory, f"{world}.{rank}.{os.getpid()}")
        os.mkfifo(self.path, 0o600)
        self._descriptor = os.open(self.path, os.O_RDWR)  # (never blocks, and keeps a writer: no end of file)
        self._buffer = b""
        self._closed = threading.Event()
        self._pulse = threading.Thread(target=self._beat, name=f"hypergrid-pulse-{world}-{rank}", daemon=True)

    @classmethod
    def open(cls, directory: str | None, world: int, rank: int, size: int) -> Relay | None:
        """The relay of ``rank`` in ``world`` where the agent of ``directory`` answers for it (``Job.node_watch``);
        None where none does, it does not run (stopped, gone: `runs`), or the FIFO cannot be made (the watcher
        answers itself)."""
        if directory is None or not os.path.exists(os.path.join(directory, CONTROL)) or not runs(os.getppid()):
            return None
        try:
            return cls(directory, world, rank, size)
        except OSError as error:
            logging.getLogger("hypergrid").warning("hypergrid: no relay from the node's agent (%s)", error)
            return None

    def join(self, first: int, timeout_s: float | None = None) -> int | None:
        """Ask the agent to answer for this rank from incident ``first`` on; the incident it waits on (its
        acknowledgement), or None where it did not answer within ``timeout_s`` (the watcher answers for itself)."""
        self._pulse.start()
        message = {"join": [self.world, self.rank, self.size, first], "pid": os.getpid(), "path": self.path}
        if not send(os.path.join(self.directory, CONTROL), message):
            return None
        deadline = time.monotonic() + (self.timing.connect_s if timeout_s is None else timeout_s)
        while (left := deadline - time.monotonic()) > 0 and runs(self.agent):
            got = self.receive(min(left, self.timing.agent_check_s))
            if got is not None and "ack" in got:
                return int(got["ack"])
        return None

    def attach(self, first: int) -> tuple[int, Relay | None]:
        """`join`: the incident to wait on and this relay; where the agent did not acknowledge, ``first`` and None
        (this relay is released, and a warning says that the watcher answers itself)."""
        number = self.join(first)
        if number is not None:
            return number, self
        self.release()
        logging.getLogger("hypergrid").warning(
            "hypergrid: the node's agent did not acknowledge rank %s of world %s: it answers its roll calls itself",
            self.rank, self.world,
        )  # fmt: skip
        return first, None

    def follow(
        self,
        number: Callable[[], int],
        verdict: Callable[[Verdict], bool],
        ended: Callable[[tuple[int, ...]], None],
        fence: Callable[[str], None],
        job: Job | None = None,
    ) -> bool:
        """The watcher's thread with a relay: act on the agent's messages until the rank is out or leaves; whether
        the agent stopped running instead (True: the relay is closed, and the watcher answers for itself).

        ``verdict(v)`` for the incident the watcher waits on (``number()``; False: out), ``ended(dead)`` for the
        world's end, ``fence(reason)`` where the agent found the others went on without this rank, and the job's
        store lost (``job.lose_store``) where the agent lost it: every grid wait ends with ``StoreLostError``.

        No wait on the agent is unbounded: every `Timing.agent_check_s` without a message, the agent's process is looked
        at; one stopped (SIGSTOP) or gone answers for nobody, so the rank leaves it (`release`: its FIFO goes, so an
        agent resumed later does not answer for it too) and answers its roll calls itself from the incident it
        waits on: within about that long it is neither blocked nor named dead for its agent's sake.
        """
        while (message := self.receive(self.timing.agent_check_s)) is not None or not self._closed.is_set():
            if message is None:
                if runs(self.agent):
                    continue
                self.release()  # (this is the reading thread)
                logging.getLogger("hypergrid").warning(
                    "hypergrid: the node's agent (pid %s) does not run (stopped or gone): rank %s of world %s answers "
                    "its roll calls itself", self.agent, self.rank, self.world,
                )  # fmt: skip
                return True
            if "verdict" in message and int(message["n"]) == number():
                if not verdict(Verdict.decode(str(message["verdict"]).encode())):
                    return False
            elif "end" in message:
                ended(tuple(message["end"]))
                return False
            elif "fence" in message:
                fence(str(message["fence"]))
                return False
            elif "lost" in message:
                if job is not None:
                    job.lose_store(RuntimeError(f"the node's agent lost the job's store: {message['lost']}"))
                return False
        return False

    def catch_up(self, first: int) -> None:
        """An incident closed between this rank's read of ``done`` and its join: the agent moves past it."""
        send(os.path.join(self.directory, CONTROL), {"join": [self.world, self.rank, self.size, first],
                                                      "pid": os.getpid(), "path": self.path})  # fmt: skip

    def receive(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next message (blocking; at most ``timeout_s``), or None: none came, or the relay was closed."""
        while b"\n" not in self._buffer:
            if self._closed.is_set():
                return None
            try:
                ready, _, _ = select.select([self._descriptor], [], [], timeout_s)
                if not ready:
                    return None
                chunk = os.read(self._descriptor, 65536)
            except OSError as error:  # closed under it (`close`)
                if error.errno in (errno.EBADF, errno.EINTR) and not self._closed.is_set():
                    continue
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            message: dict[str, Any] = json.loads(line)
        except ValueError:  # a line torn by a writer that gave up (`send`): skipped
            return {}
        return message

    def wake(self) -> None:
        """End a `receive` that blocks (another thread's): it returns a message that says nothing."""
        with contextlib.suppress(OSError):
            os.write(self._descriptor, b"{}\n")

    def close(self) -> None:
        """This rank leaves: the agent no longer answers for it; the pulse stops and the FIFO goes."""
        if self._closed.is_set():
            return
        send(os.path.join(self.directory, CONTROL), {"leave": [self.world, self.rank], "pid": os.getpid()})
        self._closed.set()
        self.wake()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def release(self) -> None:
        """Close the FIFO's descriptor (after the reading thread ended)."""
        self.close()
        with contextlib.suppress(OSError):
            os.close(self._descriptor)

    def _beat(self) -> None:
        while not self._closed.wait(self.timing.pulse_s):
            try:
                os.utime(self.path)
            except OSError:  # the agent's directory went (its round ended): nobody reads the pulse
                return
