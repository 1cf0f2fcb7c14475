"""Why a guard round does not end: who is missing, where they are, who stopped answering.

Read only on the slow paths of `hypergrid.agreement.protocol.Round` (a round still open after its probe time, or
past its timeout), so the success path keeps its O(1) store operations per participant. A rank announces where it
waits (`announce_key`); `waiting_elsewhere` finds the missing ranks stuck in another open round that waits for a
rank here. Also the store reads and waits the agreement shares (`read`, `wait_for`, `get_until`). How a stuck
round is told apart: docs/design/reliability.md ("The guard round").
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hypergrid.agreement.request import SHOWN, CreationRequest, Verdict
from hypergrid.timing import FOREVER_S

__all__ = [
    "ABSENT",
    "ANNOUNCE_PREFIX",
    "Announcement",
    "alive_of",
    "announce_key",
    "await_value",
    "get_until",
    "is_open",
    "last_seen",
    "parse_runs",
    "read",
    "roster_of",
    "runs_text",
    "wait_for",
    "waiting_elsewhere",
]

#: Where each rank announces the round it is in (one key per rank, overwritten at each round).
ANNOUNCE_PREFIX = "hypergrid/guard/at"

#: compare_set's expected value in a read that must never write (no key of the guard holds it).
ABSENT = "\x00absent\x00"


def announce_key(rank: int) -> str:
    """The key of ``rank``'s announcement.

    Examples:
        >>> announce_key(3)
        'hypergrid/guard/at/3'
    """
    return f"{ANNOUNCE_PREFIX}/{rank}"


def runs_text(ranks: Sequence[int]) -> str:
    """Ranks as comma-separated runs (``0-7``, ``0,4,8``), the whole list.

    O(1) for a ``range`` of step 1 (a world's participants), O(len) otherwise.

    Examples:
        >>> runs_text(range(8)), runs_text([0, 4, 8, 9])
        ('0-7', '0,4,8-9')
    """
    if isinstance(ranks, range) and ranks.step == 1 and len(ranks) > 0:
        return str(ranks.start) if len(ranks) == 1 else f"{ranks.start}-{ranks.stop - 1}"
    parts: list[str] = []
    first = last = None
    for rank in ranks:
        if last is not None and rank == last + 1:
            last = rank
            continue
        if first is not None:
            parts.append(str(first) if first == last else f"{first}-{last}")
        first = last = rank
    if first is not None:
        parts.append(str(first) if first == last else f"{first}-{last}")
    return ",".join(parts)


def parse_runs(text: str) -> list[int]:
    """The ranks of `runs_text`.

    Examples:
        >>> parse_runs("0,4,8-9")
        [0, 4, 8, 9]
    """
    ranks: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks.extend(range(int(first), int(last or first) + 1))
    return ranks


@dataclass(frozen=True)
class Announcement:
    """Where a rank said it is: a round (its prefix and participants) and its request there."""

    prefix: str
    participants: str  # runs_text
    request: CreationRequest

    def encode(self) -> str:
        return f"{self.prefix}\n{self.participants}\n{self.request.encoded}"

    @classmethod
    def decode(cls, data: bytes) -> Announcement:
        prefix, participants, encoded = data.decode().split("\n", 2)
        return cls(prefix, participants, CreationRequest.decode(encoded))


def read(store: Any, key: str) -> bytes | None:
    """The value of ``key``, or None where it is absent, without blocking or writing."""
    data: bytes = store.compare_set(key, ABSENT, ABSENT)
    return None if data == ABSENT.encode() else data


def roster_of(store: Any, prefix: str) -> tuple[dict[int, str], dict[str, str]]:
    """(rank -> digest, digest -> encoded request) from a round's roster."""
    data = read(store, f"{prefix}/roster")
    entries: dict[int, str] = {}
    requests: dict[str, str] = {}
    for line in (data or b"").decode().splitlines():
        rank, digest, *request = line.split(" ", 2)
        entries[int(rank)] = digest
        if request:
            requests[digest] = request[0]
    return entries, requests


def wait_for(store: Any, key: str, deadline: float, stop: Callable[[], bool] | None = None, waker: Any = None) -> bool:
    """Wait until ``key`` exists (True) or ``deadline`` (``time.monotonic()``) passes (False).

    torch's store client can return from ``wait`` without the key when its timeout ends as another client writes: each
    return is checked. ``stop``: False as soon as it says so after a return (`read` of the absent key, from another
    connection, makes the wait return: `hypergrid.agreement.liveness.Incident.interrupt`). ``waker``: a connection other
    than ``store``'s; the wait then does not time out (torch would log it; it lasts `hypergrid.timing.FOREVER_S`): at
    the deadline a timer reads the absent key through ``waker``, which ends the wait of every waiter of that key (for a
    key few wait on: the others look again and wait on).
    """
    while (left := deadline - time.monotonic()) > 0:
        timer = None if waker is None else threading.Timer(left, _wake, (waker, key))
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            with contextlib.suppress(dist.DistStoreError):  # the slice ended
                store.wait([key], datetime.timedelta(seconds=FOREVER_S if timer is not None else left))
        finally:
            if timer is not None:
                timer.cancel()
        if store.check([key]):
            return True
        if stop is not None and stop():
            return False
    return bool(store.check([key]))


def _wake(waker: Any, key: str) -> None:
    with contextlib.suppress(RuntimeError):  # the store is gone: the wait ends with its loss
        read(waker, key)


def get_until(store: Any, key: str, until: float, stop: Callable[[], bool] | None = None) -> bytes | None:
    """``key``'s value once it exists, or None at ``until`` (``time.monotonic()``) or once ``stop()`` says so.

    torch's ``get``: a ``wait`` (bounded by ``until`` through the client's timeout, restored after), then the read,
    two requests. A wait that returns without the key (woken by a `read` of it while absent, as
    `hypergrid.agreement.liveness.Incident.interrupt` does) reads ``b""``, torch's answer for an absent key, and
    wakes no other waiter (a `read` would wake them all: a storm where many wait): for keys never written empty.
    """
    previous = store.timeout
    try:
        while (left := until - time.monotonic()) > 0:
            store.set_timeout(datetime.timedelta(seconds=left))
            try:
                data = bytes(store.get(key))
            except dist.DistStoreError:  # ``until`` passed (any other error is the caller's)
                return None
            if data:
                return data
            if stop is not None and stop():
                return None
        return None
    finally:
        store.set_timeout(previous)


def await_value(store: Any, key: str, until: float, stop: Callable[[], bool] | None = None) -> bytes | None:
    """``key``'s value once it exists, or None at ``until`` (``time.monotonic()``): one ``wait``, one read.

    For a key whose arrival ends a wait (a verdict): the read that follows is needed anyway, so a success costs two
    operations; a return of torch's ``wait`` without the key is checked, as in `wait_for`. ``stop``: None as soon as it
    says so after a return (a `read` of the absent key wakes the wait).
    """
    while True:
        left = until - time.monotonic()
        if left > 0:
            with contextlib.suppress(dist.DistStoreError):  # ``until`` passed
                store.wait([key], datetime.timedelta(seconds=left))
        data = read(store, key)
        if data is not None or time.monotonic() >= until or (stop is not None and stop()):
            return data


def is_open(store: Any, prefix: str) -> bool:
    """A round has begun (its roster exists) and has no verdict yet."""
    return read(store, f"{prefix}/verdict") is None and read(store, f"{prefix}/roster") is not None


def alive_of(store: Any, prefix: str) -> set[int]:
    """The ranks that marked themselves alive (still waiting) in a round."""
    data = read(store, f"{prefix}/alive")
    return {int(line) for line in (data or b"").decode().split()}


def announcements(store: Any, ranks: Iterable[int]) -> dict[int, Announcement]:
    """The announcements of up to `SHOWN` of ``ranks`` (those that made one)."""
    found: dict[int, Announcement] = {}
    for rank in list(ranks)[:SHOWN]:
        data = read(store, announce_key(rank))
        if data is not None:
            found[rank] = Announcement.decode(data)
    return found


def waiting_elsewhere(
    store: Any, prefix: str, here: dict[int, str], missing: Sequence[int], digest: str
) -> tuple[dict[int, Announcement], Verdict | None]:
    """The missing ranks (up to `SHOWN`) stuck in another round because of this one, and its verdict if any.

    A missing rank is stuck when its announced round is open and waits for a rank that arrived here (each round waits
    for the other), or when that round already ended with a mismatch or out-of-step verdict about ``digest`` (this
    round's request: the other round found us first). That verdict is returned too: both rounds must end with the same
    one.

    Args:
        store: the guard's store.
        prefix: this round's prefix.
        here: this round's roster (rank -> digest): the ranks that arrived.
        missing: this round's participants that did not arrive.
        digest: the digest of this participant's request.
    """
    stuck: dict[int, Announcement] = {}
    found: Verdict | None = None
    for rank, seen in announcements(store, missing).items():
        if seen.prefix == prefix:
            continue  # arriving here now
        data = read(store, f"{seen.prefix}/verdict")
        if data is not None:
            verdict = Verdict.decode(data)
            if verdict.kind in ("mismatch", "outofstep") and digest in verdict.about:
                stuck[rank], found = seen, verdict
            continue
        if read(store, f"{seen.prefix}/roster") is None:
            continue  # that round ended well: between rounds, not stuck
        there = roster_of(store, seen.prefix)[0]
        if any(other in here and other not in there for other in parse_runs(seen.participants)):
            stuck[rank] = seen
    return stuck, found


def last_seen(store: Any, prefix: str, missing: Sequence[int]) -> dict[int, str]:
    """For up to `SHOWN` missing ranks, the creation each last announced, and whether it still waits there."""
    seen_text: dict[int, str] = {}
    for rank, seen in announcements(store, missing).items():
        if seen.prefix == prefix:
            continue
        state = " (still waiting there)" if is_open(store, seen.prefix) else " (ended)"
        seen_text[rank] = seen.request.describe() + state
    return seen_text
