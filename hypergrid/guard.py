"""The consistency guard: the ranks of a collective creation agree before any waits in torch.

Group creation is collective: every participating rank must ask for the same
family, on the same grid, with the same strategy, at the same point of its
creation sequence. When they do not, torch waits until its timeout (or
forever). The guard makes that a clear error instead:

1. each participant writes its request under a key of its own in the default
   group's store, ``hypergrid/guard/<scope>/request/<rank>``;
2. the first participant (the *leader*) waits for all of them, bounded by the
   guard's timeout, compares them and writes one verdict;
3. every participant reads the verdict and raises the same
   :class:`~hypergrid.errors.DesyncError` (naming the ranks and what each asked
   for) or :class:`~hypergrid.errors.GuardTimeoutError` (naming the ranks that
   did not arrive); on agreement they all go on to create.

The *scope* numbers the creations: world-collective creations (strategies
``enumerate`` and ``split``) count per world; members-only creations
(``local``) count per set of member ranks. A rebuilt grid, or two grids over
the same ranks, share these counters, so they cannot confuse each other.

Cost: one store write and one read per rank; the leader reads one key per
participant. Keys are deleted once read. The guard is skipped where there is
nobody to disagree with: a group of one rank, and torch's ``fake`` backend
(one process simulating one rank of a large world).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.errors import DesyncError, GuardTimeoutError
from hypergrid.values import format_ranks
from hypergrid.worldstate import PerWorld

__all__ = ["CreationRequest", "agree", "world_scope", "members_scope"]

_PREFIX = "hypergrid/guard"


@dataclass(frozen=True)
class CreationRequest:
    """What one rank is about to create; equal on every participant, or the guard refuses."""

    grid: str
    key: str
    strategy: str
    grid_sequence: int
    held_groups: int | None = None
    options: str = ""  # backend and options description (tag: in the key)

    def describe(self) -> str:
        """The request in words, for error messages."""
        text = f"key {self.key!r} with strategy {self.strategy!r} as creation #{self.grid_sequence} of {self.grid}"
        if self.options:
            text += f", options {self.options}"
        if self.held_groups is not None:
            text += f", holding {self.held_groups} process groups"
        return text

    def encode(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def decode(cls, data: bytes) -> CreationRequest:
        return cls(**json.loads(data))


_counters = PerWorld()  # scope name -> creations so far in this world


def _next(name: str) -> int:
    counts = _counters.get()
    value: int = counts.get(name, 0)
    counts[name] = value + 1
    return value


def world_scope() -> str:
    """The scope of the next world-collective creation (every rank of the world takes part)."""
    return f"world/{_next('world')}"


def members_scope(ranks: list[int]) -> str:
    """The scope of the next members-only creation over exactly ``ranks``."""
    digest = hashlib.sha1(",".join(map(str, ranks)).encode(), usedforsecurity=False).hexdigest()[:20]
    return f"members/{digest}/{_next(digest)}"


def agree(request: CreationRequest, participants: list[int], scope: str, timeout_s: float) -> None:
    """Return once every participant made the same ``request``; else raise on all of them.

    Args:
        request: what this rank is about to create.
        participants: every rank that takes part (sorted; the caller among them).
        scope: from :func:`world_scope` or :func:`members_scope`, equal on all participants.
        timeout_s: how long to wait for the other participants.

    Raises:
        DesyncError: the participants asked for different things.
        GuardTimeoutError: some participants did not arrive within ``timeout_s``.
    """
    if len(participants) < 2 or dist.get_backend() == "fake":
        return  # nobody to disagree with: a lone rank, or torch's one-process fake backend
    # The default group's store: torch exposes it only through this accessor, which torch's own
    # helpers and Megatron use too.
    store = c10d._get_default_store()
    me = dist.get_rank()
    prefix = f"{_PREFIX}/{scope}"
    store.set(f"{prefix}/request/{me}", request.encode())
    if me == participants[0]:
        verdict = _judge(store, prefix, request, participants, timeout_s)
        store.set(f"{prefix}/verdict", json.dumps(verdict))
    else:
        verdict = _await_verdict(store, prefix, request, participants, timeout_s)
    if "missing" in verdict:
        raise GuardTimeoutError(verdict["message"], missing=verdict["missing"])
    if "requests" in verdict:
        raise DesyncError(verdict["message"], requests=verdict["requests"])


def _request_keys(prefix: str, participants: list[int]) -> list[str]:
    return [f"{prefix}/request/{rank}" for rank in participants]


def _absent(store: Any, keys: list[str], participants: list[int]) -> list[int]:
    return [rank for rank, key in zip(participants, keys) if not store.check([key])]


def _judge(store: Any, prefix: str, mine: CreationRequest, participants: list[int], timeout_s: float) -> dict[str, Any]:
    keys = _request_keys(prefix, participants)
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except (dist.DistStoreError, RuntimeError):
        missing = _absent(store, keys, participants)
        if missing:
            return {
                "missing": missing,
                "message": (
                    f"rank(s) {format_ranks(missing)} of the {len(participants)} ranks that must create "
                    f"{mine.describe()} did not arrive within {timeout_s:g} s: dead, hung, or creating "
                    "something else"
                ),
            }
    requests = [CreationRequest.decode(value) for value in store.multi_get(keys)]
    for key in keys:
        store.delete_key(key)
    return _compare(dict(zip(participants, requests)))


def _compare(requests: dict[int, CreationRequest]) -> dict[str, Any]:
    by_text: dict[str, list[int]] = {}
    for rank, request in requests.items():
        by_text.setdefault(request.describe(), []).append(rank)
    if len(by_text) == 1:
        return {}
    groups = sorted(by_text.items(), key=lambda item: item[1][0])
    lines = [f"ranks disagree on a collective group creation ({len(requests)} ranks take part; none waited in torch):"]
    lines += [f"  rank(s) {format_ranks(ranks)} asked for {text}" for text, ranks in groups]
    if len({replace(request, held_groups=None) for request in requests.values()}) == 1:
        lines.append(
            "They agree on the family but hold different numbers of process groups: torch names a "
            "members-only group (use_local_synchronization=True) from that count, so they would wait on "
            "different keys and hang. Create 'local' families before groups that only some ranks hold, "
            "or use strategy='enumerate' for this family."
        )
    return {"message": "\n".join(lines), "requests": dict(groups)}


def _await_verdict(
    store: Any, prefix: str, mine: CreationRequest, participants: list[int], timeout_s: float
) -> dict[str, Any]:
    leader = participants[0]
    verdict_key = f"{prefix}/verdict"
    # The leader may take the whole timeout before it writes a verdict naming the missing.
    grace = max(2.0, 0.25 * timeout_s)
    try:
        store.wait([verdict_key], datetime.timedelta(seconds=timeout_s + grace))
    except (dist.DistStoreError, RuntimeError):
        missing = _absent(store, _request_keys(prefix, participants), participants)
        if leader not in missing:
            missing.append(leader)  # it arrived but never judged: it died or hung since
        return {
            "missing": sorted(missing),
            "message": (
                f"no verdict from rank {leader} (the first of {len(participants)} ranks that must create "
                f"{mine.describe()}) within {timeout_s + grace:g} s; rank(s) {format_ranks(missing)} did not "
                "arrive or stopped: dead, hung, or creating something else"
            ),
        }
    verdict: dict[str, Any] = json.loads(store.get(verdict_key))
    if store.add(f"{prefix}/read", 1) == len(participants) - 1:
        store.delete_key(verdict_key)
        store.delete_key(f"{prefix}/read")
    return verdict
