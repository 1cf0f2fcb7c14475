"""The job's membership log: one append-only sequence of membership events that every worker and agent reads.

Under ``python -m hypergrid.run`` the agents agree on one log per round (`agree_log`) and name it in the workers'
environment (`LOG_ENV`); it lives on the workers' raw store, which outlives every worker. Entry ``n`` is the key
``<log>e/<n>``, written once: an appender claims the first free number with ``compare_set`` (a loser moves to the
next), so no two processes hold different entries at one number and nothing is ever rewritten. Each entry is one
JSON object with its ``kind``:

- ``arrived``: a process that arrived later registered (``arrival``: its number on the job's arrivals, ``member``);
- ``formed``: a shrink or a growth formed world ``world`` (``members``: who each of its ranks is, ``excluded``: the
  members of the world before it that it left out as dead, ``retired``: those it left out alive);
- ``dead``: an agent saw members die (``members``, ``said``, ``by``).

A *member* is one process of the job, named once for its life (`member_id`): ``"3"`` for the worker the launcher
started as rank 3, ``"3.1"`` for the first worker it started in that one's place (``--replace-dead``), ``"a5"`` for
the 6th process that arrived from outside the launcher. A world's rank is never a name: ranks move at every shrink.
Every mapping the agents need is a function of the log's entries (`world_of`, `accounted`, `arrival_members`), so
no second table can be missing or stale. docs/design/membership.md.

Examples:
    >>> import torch.distributed as dist
    >>> log = MemberLog(dist.HashStore(), "L/")
    >>> log.append("arrived", arrival=0, member="3.1"), log.append("dead", members=["0"], said="x", by="agent 0")
    (0, 1)
    >>> log.append("formed", world=1, members=["1", "2", "3.1"], excluded=["0"], retired=[], once_since=0)
    2
    >>> world_of(log.entries(), 4), sorted(accounted(log.entries())), arrival_members(log.entries())
    ((1, ['1', '2', '3.1']), ['0'], {0: '3.1'})
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LOG_ENV",
    "MEMBER_ENV",
    "Entry",
    "MemberLog",
    "accounted",
    "agree_log",
    "arrival_members",
    "dead_ranks",
    "formation",
    "format_members",
    "job_log",
    "mark_formation",
    "member_id",
    "member_name",
    "members_of",
    "parse_members",
    "pin_member",
    "publish_liveness",
    "raw_store",
    "record_world",
    "world_of",
]

#: The environment variable that names the round's log (its key prefix), set by the agent for its workers.
LOG_ENV = "HYPERGRID_RUN_LOG"
#: The environment variable that names a process's member (set by the agent for a replacement; pinned from ``RANK``
#: for a worker the round started, before a shrink renumbers it).
MEMBER_ENV = "HYPERGRID_MEMBER"


def raw_store(store: Any) -> Any:
    """The store under every ``PrefixStore`` around ``store`` (the agents' TCPStore, for a worker's or agent's store).

    Examples:
        >>> import torch.distributed as dist
        >>> base = dist.HashStore()
        >>> raw_store(dist.PrefixStore("a", dist.PrefixStore("b", base))) is base
        True
    """
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


@dataclass(frozen=True)
class Entry:
    """One entry of the log: its number, its kind and what it says."""

    seq: int
    kind: str
    data: Mapping[str, Any]


class MemberLog:
    """The log under key prefix ``prefix`` on ``store`` (on its raw store: every process names the same keys).

    A `MemberLog` keeps the entries it has read (they never change), so each reader reads each entry once. It uses
    only ``compare_set``, ``check``, ``get`` and ``delete_key``: any store torch.distributed offers carries it.
    """

    def __init__(self, store: Any, prefix: str) -> None:
        self.store = raw_store(store)
        self.prefix = prefix
        self._read: list[Entry] = []

    def key(self, seq: int) -> str:
        return f"{self.prefix}e/{seq}"

    def append(self, kind: str, *, once_since: int | None = None, **data: Any) -> int:
        """Write one entry; its number. Every writer of an entry given ``once_since`` writes the same text (no
        nonce): where it stands already at a number from ``once_since`` on, that number is returned and nothing is
        written (two ranks that record one world write one entry)."""
        body = {"kind": kind, **data}
        if once_since is None:
            body["nonce"] = uuid.uuid4().hex[:12]
        text = json.dumps(body, sort_keys=True)
        seq = len(self._read) if once_since is None else min(once_since, len(self._read))
        while True:
            got = self.store.compare_set(self.key(seq), "", text)
            if (got.decode() if isinstance(got, bytes) else got) == text:
                return seq
            seq += 1

    def entries(self) -> list[Entry]:
        """Every entry written so far, in order (those read before are not read again)."""
        while self.store.check([self.key(len(self._read))]):
            seq = len(self._read)
            body = json.loads(self.store.get(self.key(seq)))
            self._read.append(Entry(seq, str(body.pop("kind")), body))
        return list(self._read)

    def cell(self, name: str, value: str) -> str:
        """A write-once cell of the log's namespace: the first writer's ``value`` stands, and every writer gets it."""
        got = self.store.compare_set(f"{self.prefix}{name}", "", value)
        return got.decode() if isinstance(got, bytes) else str(got)

    def read_cell(self, name: str) -> str | None:
        """The cell's value; None while nobody wrote it."""
        key = f"{self.prefix}{name}"
        return self.store.get(key).decode() if self.store.check([key]) else None


def agree_log(store: Any, restart: int) -> str:
    """The log's key prefix for one round of the job, the same for every agent (the first to ask picks it).

    Args:
        store: the agent's store for the round (torchelastic's ``worker_group.store``).
        restart: how many restarts the job has made (a static rendezvous keeps one store prefix).

    Examples:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> first, second = agree_log(store, 0), agree_log(store, 0)
        >>> first == second and first.startswith("hypergrid/run/log/") and agree_log(store, 1) != first
        True
    """
    token = MemberLog(store, f"hypergrid/run/{restart}/").cell("log", uuid.uuid4().hex)
    return f"hypergrid/run/log/{token}/"


def job_log(store: Any = None) -> MemberLog | None:
    """This worker's round's log under ``hypergrid.run`` (None elsewhere); ``store``: default, torch's default store.

    Examples:
        >>> job_log() is None  # no launcher named a log
        True
    """
    prefix = os.environ.get(LOG_ENV, "")
    if not prefix:
        return None
    if store is None:
        from torch.distributed import distributed_c10d as c10d

        store = c10d._get_default_store()
    return MemberLog(store, prefix)


def mark_formation(stage: str, store: Any = None) -> None:
    """Under ``hypergrid.run``, count this worker at ``stage`` of forming the job's first world: ``"forming"`` as
    ``init_from_env`` begins, ``"formed"`` once torch's ``init_process_group`` returned. A death while some worker
    formed it and not every worker has is a death before the world exists (`formation`); nothing is written
    elsewhere."""
    log = job_log(store)
    if log is not None:
        log.store.add(f"{log.prefix}first/{stage}", 1)


def formation(store: Any, prefix: str) -> tuple[int, int]:
    """How many workers of the round whose log is ``prefix`` began forming its first world, and how many formed it
    (`mark_formation`).

    Examples:
        >>> import os, torch.distributed as dist
        >>> store = dist.HashStore()
        >>> os.environ["HYPERGRID_RUN_LOG"] = "L/"; mark_formation("forming", store)
        >>> del os.environ["HYPERGRID_RUN_LOG"]
        >>> formation(store, "L/"), formation(store, "M/")
        ((1, 0), (0, 0))
    """
    raw = raw_store(store)
    return int(raw.add(f"{prefix}first/forming", 0)), int(raw.add(f"{prefix}first/formed", 0))


def pin_member() -> str:
    """Under ``hypergrid.run``, name this process's member for its life from ``RANK`` as the launcher set it (call
    before ``RANK`` changes); its member ("": none, outside the launcher, where nothing is written).

    Examples:
        >>> import os
        >>> saved = dict(os.environ)
        >>> _ = os.environ.pop(MEMBER_ENV, None); os.environ.update(RANK="3", HYPERGRID_RUN_LOG="L/")
        >>> pin_member(), member_id()
        ('3', '3')
        >>> os.environ["RANK"] = "0"; member_id()  # a shrink renumbered it: still member 3
        '3'
        >>> os.environ.clear(); os.environ.update(saved)
    """
    if MEMBER_ENV not in os.environ and "RANK" in os.environ and os.environ.get(LOG_ENV):
        os.environ[MEMBER_ENV] = os.environ["RANK"]
    return os.environ.get(MEMBER_ENV, "")


def member_id(arrival: int | None = None) -> str:
    """This process's member (`pin_member`); a process with none that arrived as ``arrival`` is ``a<arrival>``."""
    return pin_member() or (f"a{arrival}" if arrival is not None else "")


def world_of(entries: Iterable[Entry], size: int) -> tuple[int, list[str]]:
    """The latest world the log records and who each of its ranks is; the job's first world (numbered 0, ``size``
    workers, member ``str(r)`` at rank ``r``) where no shrink formed one."""
    latest = (0, [str(rank) for rank in range(size)])
    for entry in entries:
        if entry.kind == "formed" and int(entry.data["world"]) >= latest[0]:
            latest = (int(entry.data["world"]), [str(member) for member in entry.data["members"]])
    return latest


def dead_ranks(entries: Sequence[Entry], world: int, size: int) -> list[int]:
    """The ranks of world ``world`` whose member the log records dead (a launcher's agent saw it exit): what every
    roll call of that world declares gone. None of an earlier world than the latest recorded (its ranks are not
    mapped any more; a shrink left its dead behind). ``size``: the job's first world's size (`world_of`).

    Examples:
        >>> entries = [Entry(0, "dead", {"members": ["2"], "said": "SIGKILL", "world": 0})]
        >>> dead_ranks(entries, 0, 4), dead_ranks(entries, 1, 4)
        ([2], [])
    """
    epoch, ranks = world_of(entries, size)
    dead = {str(member) for entry in entries if entry.kind == "dead" for member in entry.data["members"]}
    return [rank for rank, member in enumerate(ranks) if member in dead] if epoch == world else []


def accounted(entries: Iterable[Entry]) -> set[str]:
    """The members whose death a shrink or a growth accounted for: a world formed without them, as dead."""
    return {str(member) for entry in entries if entry.kind == "formed" for member in entry.data["excluded"]}


def arrival_members(entries: Iterable[Entry]) -> dict[int, str]:
    """Each arrival's number -> the member it is."""
    return {int(entry.data["arrival"]): str(entry.data["member"]) for entry in entries if entry.kind == "arrived"}


def record_world(
    log: MemberLog | None,
    size: int,
    old_epoch: int,
    new_epoch: int,
    new_rank: int | None,
    old_to_new: Mapping[int, int],
    dead: Iterable[int],
    arrivals: Mapping[int, int],
) -> int | None:
    """After a shrink or a growth, on the new world's ranks 0 and 1: the log records world ``new_epoch``.

    Both write the same entry (written once: `MemberLog.append` with ``once_since``), so the record outlives either
    rank's death. Returns its number; None where nothing is recorded (no log, another rank, or the old world not in
    the log: its record was lost with both its writers, and its deaths stay unaccounted: the run fails, never
    succeeds by mistake). A store that fails never fails the shrink.

    Args:
        log: the job's log (`job_log`; None outside ``hypergrid.run``).
        size: the job's first world's size.
        old_epoch, new_epoch: the world the shrink started from, and the one it formed.
        new_rank: this process's rank there (None: retired).
        old_to_new: old rank -> new rank, for every rank of the new world (arrivals numbered from the old world's
            size, `hypergrid.layout.grow.plan_regrow`).
        dead: the ranks it excluded as dead: the old world's, and arrivals that died joining (numbered as above).
        arrivals: the old ranks of the arrivals it considered (taken in, or dead) -> their arrival numbers.
    """
    if log is None or new_rank not in (0, 1):
        return None
    try:
        entries = log.entries()
        world, members = world_of(entries, size)
        if world == new_epoch:  # (the other writer recorded it already)
            return next(entry.seq for entry in entries if entry.kind == "formed" and entry.data["world"] == world)
        if world != old_epoch:
            return None
        by_arrival = arrival_members(entries)

        def member(old: int) -> str:  # (old ranks from the old world's size on are arrivals)
            return members[old] if old < len(members) else by_arrival.get(arrivals.get(old, -1), "?")

        new = {rank: member(old) for old, rank in old_to_new.items()}
        excluded = sorted({member(rank) for rank in dead if rank >= 0} - {"?"})
        retired = sorted(set(members) - set(new.values()) - set(excluded))
        since = next((entry.seq for entry in reversed(entries) if entry.kind == "formed"), 0)
        listed = [new[rank] for rank in sorted(new)]
        return log.append("formed", world=new_epoch, members=listed, excluded=excluded, retired=retired,
                          once_since=since)  # fmt: skip
    except Exception:  # never fail a shrink over its record: the agent counts the deaths as unaccounted
        return None


def publish_liveness(base_store: Any) -> bool:
    """On the job's first world's rank 0 under ``hypergrid.run``: tell the agents where its roll calls' keys live.

    The workers' store is the agents' under torch's prefixes (``default_pg/0//`` under ``env://``); the agents write
    a call into a roll call when a worker dies (`hypergrid.agreement.sentinel`), so they need that prefix: found
    once by a probe key and a listing, then kept in the log's write-once cell ``liveness``. Whether it wrote (False
    outside the launcher, or where the store cannot list its keys).

    Examples:
        >>> import os, torch.distributed as dist
        >>> raw = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        >>> os.environ["HYPERGRID_RUN_LOG"] = "L/"
        >>> publish_liveness(dist.PrefixStore("default_pg/0/", raw)), raw.get("L/liveness")
        (True, b'default_pg/0//')
        >>> del os.environ["HYPERGRID_RUN_LOG"]
    """
    log = job_log(base_store)
    if log is None:
        return False
    probe = f"hypergrid/probe/{uuid.uuid4().hex}"
    try:
        if log.read_cell("liveness") is not None:
            return True  # (published by this job's first join: a world reopened finds it)
        base_store.set(probe, "")
        found = [key for key in log.store.list_keys() if key.endswith(probe)]
        base_store.delete_key(probe)
        if len(found) != 1:
            return False
        log.cell("liveness", found[0][: -len(probe)])
    except (RuntimeError, AttributeError, NotImplementedError):  # a store without a listing: the agents stay blind
        return False
    return True


def format_members(members: Iterable[str]) -> str:
    """Members as the agents pass them along: ``"0,3.1,"`` (``""``: none)."""
    return "".join(f"{member}," for member in members)


def parse_members(listed: str) -> set[str]:
    """The members of a list `format_members` wrote.

    Examples:
        >>> sorted(parse_members(format_members(["3", "0.1"]))), parse_members("")
        (['0.1', '3'], set())
    """
    return {item.strip() for item in listed.split(",") if item.strip()}


def member_name(rank: int, replacement: int = 0) -> str:
    """The member the launcher started as ``rank`` (``replacement`` 0), or the ``replacement``-th in its place.

    Examples:
        >>> member_name(3), member_name(3, 1)
        ('3', '3.1')
    """
    return f"{rank}.{replacement}" if replacement else str(rank)


def members_of(ranks: Sequence[int], replacements: int) -> list[str]:
    """Every member the launcher may have started as these ranks: the workers, and up to ``replacements`` each in
    their place (an agent's death takes all of its node's).

    Examples:
        >>> members_of([2, 3], 1)
        ['2', '2.1', '3', '3.1']
    """
    return [member_name(rank, k) for rank in ranks for k in range(replacements + 1)]
