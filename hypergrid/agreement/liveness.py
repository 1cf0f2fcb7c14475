"""Who is alive, settled once for the whole world: the roll call behind every failure, O(1) store operations each.

An `Incident` is one roll call of a world: a rank that sees a failure calls it (`Incident.call`), every watcher
(`hypergrid.agreement.watcher`) answers for its rank, and the first two to answer close it with one verdict (one
``compare_set``, so every survivor reads the same): the ranks that did not answer within the liveness bound
(`bound_s`) are dead, when those that answered are a majority (`majority`). A rank joins and leaves the world's
watch with `record_member`; the keys are named in `hypergrid.agreement.rollkeys`. The protocol, its keys, the
majority, fencing and what each rank pays: docs/design/rollcall.md ("Keys and costs").
"""

from __future__ import annotations

import bisect
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypergrid.agreement import diagnosis
from hypergrid.agreement.rollkeys import (
    END,
    PREFIX,
    WAKE_BLOCK,
    done_key,
    end_text,
    ended_key,
    gone_of,
    incident_prefix,
    member_status,
    members_key,
    said_of,
    wake_key,
    wake_keys,
)
from hypergrid.agreement.rollverdict import FAILURE, PROBE, Verdict, majority
from hypergrid.timing import QUIET_READS, Timing

__all__ = [
    "END",
    "FAILURE",
    "PREFIX",
    "PROBE",
    "WAKE_BLOCK",
    "Incident",
    "Verdict",
    "bound_s",
    "done_key",
    "end_text",
    "ended_ranks",
    "ended_key",
    "incident_prefix",
    "left_behind",
    "majority",
    "members_key",
    "record_member",
    "wake_key",
    "watching_enabled",
]

#: Wake keys per ``multi_set``: torch 2.13's server parses one in time quadratic in its keys (docs/design/rollcall.md).
MULTI_SET_KEYS = 256


#: The keys of an incident, in the order its last reader deletes them (the call before ``woken``: see `Incident.call`).
INCIDENT_KEYS = ("call", "woken", "alive", "count", "verdict", "read", "gone")


def bound_s(ranks: int, liveness_s: float | None = None) -> float:
    """How long after the call the roll call waits for answers: ``max(liveness_s, 0.1 ms per rank)``.

    Examples:
        >>> bound_s(8, 0.5), bound_s(131072, 0.5)
        (0.5, 13.1072)
    """
    return _timing(liveness_s).roll_bound_s(ranks)


def _timing(liveness_s: float | None) -> Timing:
    """The roll call's `Timing`: the environment's, read at each roll call (a forkserver worker imported this before
    its call's environment), or ``liveness_s`` as given."""
    return Timing.from_env() if liveness_s is None else Timing(liveness_s=liveness_s)


class Incident:
    """One rank's side of incident ``number`` of a world whose live ranks are ``expected``.

    A watcher runs `answer`, `close` and `conclude` in turn; `call` opens
    the incident from any rank (separate steps: one thread can play many ranks).

    Args:
        store: any ``torch.distributed.Store`` (or an object with its methods).
        prefix: `incident_prefix` of the world and incident number, equal on every rank.
        rank: this rank.
        expected: the world's ranks not found dead by an earlier incident (sorted).
        ranks: the ranks this side answers and reads for (default: ``rank`` alone): a node's agent answers for its
            workers with one request of each kind (`hypergrid.agreement.nodewatch`); every count stays one per rank.
    """

    def __init__(
        self, store: Any, prefix: str, rank: int, expected: Sequence[int], ranks: Sequence[int] | None = None
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.expected = expected
        self.ranks: tuple[int, ...] = (rank,) if ranks is None else tuple(sorted(ranks))
        self._complete = False
        self._order = 0  # the place of this side's last answer among the answers (0: it answered none)
        self._first = 0  # ...and of its first
        self.gone: tuple[int, ...] = ()  # expected ranks the call declares dead (a launcher's agent saw them exit)
        self.stop: Callable[[], bool] = lambda: False  # whether to give up (the watcher stopped: `interrupt`)
        self.waker: Any = None  # a second connection: ends a wait for ``I/woken`` at its deadline (`diagnosis`)

    @classmethod
    def next_of(cls, store: Any, world: int) -> Incident:
        """The incident a caller outside world ``world`` opens (a launcher's agent, a process that arrives): the one
        after the last that every live rank read (``done``), as no rank of the world (-1, expecting nobody)."""
        done = diagnosis.read(store, done_key(world))
        return cls(store, incident_prefix(world, 0 if done is None else int(done) + 1), -1, ())

    @property
    def world(self) -> int:
        """The world number, read from the prefix (`incident_prefix`)."""
        return int(self.prefix.rsplit("/", 2)[-2])

    @property
    def number(self) -> int:
        return int(self.prefix.rsplit("/", 1)[-1])  # the incident's, read from the prefix

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def call(self, kind: str, text: str, wake: Sequence[int] = ()) -> str:
        """Open the incident (unless someone did first) and wake the watchers of ``wake``; the call in force.

        The rank whose call opened the incident writes the wake keys of ``wake``'s blocks (`wake`), then ``I/woken``.
        Written after the incident ended (every rank answered and read the verdict first), ``I/woken`` is deleted
        again: the last reader deletes the call before ``woken``, so one of the two deletions finds it.
        """
        mine = f"{kind} {text}"
        current: bytes = self.store.compare_set(self.key("call"), "", mine)
        if wake and current == mine.encode():
            self.wake(wake)
            self.store.set(self.key("woken"), "")
            if not self.store.check([self.key("call")]):
                self.store.delete_key(self.key("woken"))
        return current.decode()

    def wake(self, ranks: Sequence[int]) -> None:
        """Write the wake keys of ``ranks``' blocks (`wake_key`): one ``multi_set`` per `MULTI_SET_KEYS` keys."""
        keys = wake_keys(self.world, self.number, ranks)
        for start in range(0, len(keys), MULTI_SET_KEYS):
            chunk = keys[start : start + MULTI_SET_KEYS]
            self.store.multi_set(chunk, [""] * len(chunk))  # (no value: fewer bytes for the server to read)

    def answer(self) -> str | None:
        """Answer the roll call for this rank; the call, or None where there is none.

        None when the call is gone (the live ranks read the verdict and deleted it: the world went on without this rank)
        or was never written (a wake by the rank's own close); an ``end`` call (`end_text`) is returned as it is,
        unanswered.
        """
        data = diagnosis.read(self.store, self.key("call"))
        if data is not None and not data.startswith(END.encode()) and self.ranks:  # an end is no roll call (`end_text`)
            self.store.append(self.key("alive"), "".join(f"{rank}\n" for rank in self.ranks))
            self._order = self.store.add(self.key("count"), len(self.ranks))
            self._first = self._order - len(self.ranks) + 1
            mine = set(self.ranks)
            self.gone = tuple(sorted({rank for rank in gone_of(data.decode()) if self._expects(rank)} - mine))
            self._complete = self._order >= len(self.expected) - len(self.gone) and self._majority_without_gone()
        return None if data is None else data.decode()

    def close(self, call: str, seen: float, liveness_s: float | None = None) -> Verdict | None:
        """The verdict: published here when this answer completed the roll call or at the deadline; None if gone.

        The deadline: ``liveness_s`` after the caller's ``I/woken`` and after the last answer (`_settle`), at the
        latest as long again as the wake took, and at the latest `bound_s` after ``seen`` (``time.monotonic()``, when
        this rank saw the call: the fallback where the caller died while it woke the others). The first two ranks
        to answer close it; the others wait `Timing.backup_s` past the fallback and close it only if both of those died.
        """
        kind, _, text = call.partition(" ")
        fallback = seen + bound_s(len(self.expected), liveness_s)
        if self._complete:  # published after the wake's end (`wake_key`), which every answer needed anyway
            diagnosis.wait_for(self.store, self.key("woken"), fallback, self.stop, self.waker)
            return None if self.stop() else self._publish(Verdict(kind, self.gone, said_of(text)))
        if self._first > 2 or not self._order:
            until = fallback + _timing(liveness_s).backup_s
        elif diagnosis.wait_for(self.store, self.key("woken"), fallback, self.stop, self.waker):
            until = self._settle(seen, fallback, bound_s(0, liveness_s))  # (the bound alone: no per-rank part)
        else:
            until = fallback
        data = diagnosis.get_until(self.store, self.key("verdict"), until, self.stop)
        if data is not None:
            return Verdict.decode(data)
        if self.stop() or diagnosis.read(self.store, self.key("call")) is None:
            return None  # stopped, or an answer too late: the others read the verdict that names it and went on
        return self._publish(self.judge(kind, text))

    def judge(self, kind: str, text: str) -> Verdict:
        """The verdict from the roster: who answered, who is in the watch (`members_key`). One read of each.

        A missing rank is dead only if it joined the world's watch and did not leave it; a late one (never
        joined) or one that left is *absent*: neither dead nor a reader. The majority is counted among the ranks
        in the watch and those that answered, less those a launcher's agent declared dead that did not answer (its
        word and their silence: they are on no side).
        """
        status = member_status(diagnosis.read(self.store, members_key(self.world)))
        answered = diagnosis.alive_of(self.store, self.prefix)  # one set, not one per rank (O(N^2))
        alive = tuple(rank for rank in self.expected if rank in answered)
        gone = set(self.declared(f"{kind} {text}"))  # declared dead by a launcher's agent: dead, joined or not
        counted = [rank for rank in self.expected if rank in answered or rank in gone or status.get(rank, False)]
        if not majority(alive, [rank for rank in counted if rank in answered or rank not in gone]):
            return Verdict("minority", (), said_of(text), alive, readers=len(alive))
        dead = tuple(rank for rank in counted if rank not in answered)
        absent = tuple(rank for rank in self.expected if rank not in answered and rank not in counted)
        return Verdict(kind, dead, said_of(text), absent=absent, readers=len(alive))

    def declared(self, call: str = "") -> set[int]:
        """The expected ranks declared dead: by ``call`` (`gone_of`), or, once the incident was open, in ``I/gone``
        (a launcher's agent that saw a worker exit while another rank's roll call was open). One read."""
        listed = {int(line) for line in (diagnosis.read(self.store, self.key("gone")) or b"").decode().split()}
        return {rank for rank in listed | set(gone_of(call)) | set(self.gone) if self._expects(rank)}

    def _expects(self, rank: int) -> bool:
        """Whether ``rank`` is among the expected (sorted: a binary search, not a set of N ranks per answer)."""
        at = bisect.bisect_left(self.expected, rank)
        return at < len(self.expected) and self.expected[at] == rank

    def _majority_without_gone(self) -> bool:
        """Whether the expected ranks the call does not declare gone, all answering, are a majority (`judge`'s rule:
        the declared ranks that do not answer are on no side): whether any is left."""
        return len(self.expected) > len(self.gone)

    def _settle(self, seen: float, fallback: float, liveness: float) -> float:
        """A closer that saw ``I/woken`` just now: when to stop waiting for the verdict (then it publishes one).

        Once ``liveness`` passed since the wake's end and since the last answer (between the read that saw the count
        change and the one that saw it unchanged), at the latest as long again as the wake took, and ``fallback``:
        the count read `QUIET_READS` times per span, each with a ``check`` of the verdict (docs/design/rollcall.md,
        "The closers close once the answers stop").
        """
        woken = time.monotonic()
        cap = min(fallback, woken + liveness + (woken - seen))
        count = diagnosis.read(self.store, self.key("count"))
        since = time.monotonic()  # (after the read: an answer counted during it may be the last)
        pace = max(liveness, woken - seen) / QUIET_READS
        self._pause(min(pace, cap - since))
        while (now := time.monotonic()) < cap and not self.stop():
            current = diagnosis.read(self.store, self.key("count"))
            if current is None:
                return now  # over: its verdict read by the others (this rank was too late)
            if int(current) >= len(self.expected) - len(self.gone) or self.store.check([self.key("verdict")]):
                return cap  # complete (its last answer publishes the verdict), or the other closer published it
            if current != count:
                count, since = current, time.monotonic()  # an answer came in since the last read
            elif now - since >= liveness or int(current) >= len(self.expected) - len(self.declared()):
                return now  # quiet for a bound, or quiet with every rank that is not declared gone answered
            self._pause(min(pace, cap - now))
        return time.monotonic() if self.stop() else cap

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or until `stop` says so (looked at every 0.1 s: `Watcher.halt` wakes as often)."""
        until = time.monotonic() + seconds
        while not self.stop() and (left := until - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def read_end(self, call: str, deadline: float) -> tuple[int, ...]:
        """This rank read the world's end (`end_text`): count it; the last reader deletes it. The dead.

        The last reader deletes the call, the world's ``done`` (a rank the end left behind is fenced by its record,
        `ended_key`) and every block's wake key of the end, not before the caller's ``I/woken`` (or ``deadline``,
        ``time.monotonic()``: a caller that died while it woke the others). N / 8 deletes on one rank, once per world.
        """
        dead, readers = json.loads(call[len(END) :])[:2]
        reading = [rank for rank in self.ranks if rank not in dead]
        if not reading:
            return tuple(dead)
        if self.store.add(self.key("read"), len(reading)) >= readers:
            diagnosis.wait_for(self.store, self.key("woken"), deadline)
            keys = [self.key(name) for name in ("call", "woken", "read")] + world_keys(self.world)
            for key in keys + wake_keys(self.world, self.number, self.expected):
                self.store.delete_key(key)
        return tuple(dead)

    def conclude(self, verdict: Verdict) -> None:
        """This rank read ``verdict``: count it; the last reader deletes the incident's keys.

        The readers are the ranks that answered in time: a rank declared dead, or absent (its answer came after
        the roster was read), takes no part in the clean-up (the others may be done already).
        """
        reading = [rank for rank in self.ranks if rank not in verdict.dead and rank not in verdict.absent]
        if not reading or not self._order:
            return
        readers = len(self.expected) - len(verdict.dead) if verdict.readers is None else verdict.readers
        last = self.store.add(self.key("read"), len(reading)) >= readers
        for rank in reading:
            if self._first_of_block(verdict, rank):  # after I/woken, as the verdict
                self.store.delete_key(wake_key(self.world, self.number, rank))
        if last:
            # First: a rank woken without a call (its block's key, written for this incident) finds it over
            self.store.set(done_key(self.world), str(self.number))
            for name in INCIDENT_KEYS:
                self.store.delete_key(self.key(name))
            for key in wake_keys(self.world, self.number, (*verdict.dead, *verdict.absent)):  # (maybe no reader)
                self.store.delete_key(key)

    def _first_of_block(self, verdict: Verdict, rank: int) -> bool:
        """Whether no lower rank of ``rank``'s wake block reads ``verdict``: one of a minority's ``alive``, else
        expected (sorted: a binary search, O(`WAKE_BLOCK` log N)) and not dead."""
        lower = range(rank - rank % WAKE_BLOCK, rank)
        if verdict.kind == "minority":
            return not set(lower) & set(verdict.alive)
        dead = {*verdict.dead, *verdict.absent}
        return not any(self._expects(rank) and rank not in dead for rank in lower)

    def over(self) -> bool:
        """Whether every live rank read this incident's verdict (``done``): one read. A rank woken without a call
        in an incident not over was woken by a neighbour's close (`wake_key`)."""
        data = diagnosis.read(self.store, done_key(self.world))
        return data is not None and int(data) >= self.number

    def interrupt(self, store: Any) -> None:
        """End this incident's waits on an absent key from ``store`` (torch wakes the waiters of a key that
        ``compare_set`` finds absent): a stopped rank gives up (`stop`), the others wait again (`Watcher.halt`)."""
        for name in ("woken", "verdict"):
            diagnosis.read(store, self.key(name))

    def _publish(self, verdict: Verdict) -> Verdict:
        text = verdict.encode()
        current: bytes = self.store.compare_set(self.key("verdict"), "", text)
        return verdict if current == text.encode() else Verdict.decode(current)


def world_keys(world: int) -> list[str]:
    """The keys a world keeps beside its incidents' while it is watched (its end's last reader deletes them)."""
    return [done_key(world), members_key(world), f"{members_key(world)}-count"]


#: The watch's count while its last live member deletes its keys: a join that meets it waits for them to go.
CLOSING = -(2**40)


def record_member(store: Any, world: int, rank: int, joined: bool, dead: int = 0) -> int:
    """``rank`` joins (``joined``) or leaves world ``world``'s watch (`members_key`); the count after it.

    The last live rank to leave (``dead``: how many of the world's members the roll calls found dead, which never
    leave) deletes the world's keys (`world_keys`), after marking the count `CLOSING` with one ``compare_set`` that
    fails where a rank joined since (then the watch stays). A rank that joins while the keys are deleted finds
    the mark, waits until the count is gone and joins the new watch: it is listed only after its count went in,
    so no deletion can take its entry away. Two requests to join or leave, four more for the last.
    """
    count_key = f"{members_key(world)}-count"
    if not joined:
        store.append(members_key(world), f"-{rank}\n")
        count = int(store.add(count_key, -1))
        if count <= dead and store.compare_set(count_key, str(count), str(CLOSING)) == str(CLOSING).encode():
            for key in world_keys(world):  # (the count last: a join that met the mark waits for it to go)
                store.delete_key(key)
        return count
    while (count := int(store.add(count_key, 1))) < 0:  # a deletion of the watch's keys is under way
        while (data := diagnosis.read(store, count_key)) is not None and int(data) < 0:
            time.sleep(Timing.from_env().closing_poll_s)  # (a few ms: the deletion is 4 requests)
    store.append(members_key(world), f"+{rank}\n")
    return count


def left_behind(store: Any, world: int, rank: int, joined: Callable[[], bool]) -> bool:
    """Whether world ``world`` went on without ``rank``: its end's record names it (`ended_key`), or its watch is
    gone although the rank is in it (``joined()``, asked before and after the check: a rank whose own leave deleted
    the watch meanwhile is not behind) and never left (`members_key`: deleted once the world ended, or once every
    live member left, so it was named dead). One read, one check."""
    return rank in ended_ranks(store, world) or (joined() and not store.check([members_key(world)]) and joined())


def ended_ranks(store: Any, world: int) -> set[int]:
    """The ranks world ``world``'s end left behind, as its record says (`ended_key`); none before its end. One read."""
    data = diagnosis.read(store, ended_key(world))
    return set() if data is None else set(json.loads(data))


def watching_enabled() -> bool:
    """Whether ``HYPERGRID_WATCH`` allows watchers (anything but ``0``, the default on).

    Examples:
        >>> watching_enabled() in (True, False)
        True
    """
    return os.environ.get("HYPERGRID_WATCH", "1") != "0"
