"""The consistency guard: the ranks of a collective creation agree before any of them waits in torch.

Group creation is collective: every participating rank must ask for the same
families, on the same grid, with the same strategy and options, at the same
point of its creation sequence. When they do not, torch waits until its timeout
(or forever). The guard makes that a clear error on every participant instead:
a `DesyncError` naming the distinct requests and the ranks that sent each, or
a `GuardTimeoutError` naming the ranks that did not arrive.

One guard round runs before each ``create_pg`` and each ``create_pgs`` (one
round for the whole batch), through the default group's store
(``torch.distributed.distributed_c10d._get_default_store()``, looked up at each
call) under plain key prefixes ``hypergrid/guard/<scope>/<round>``. The
protocol is `hypergrid.agreement.protocol.Round`: every participant makes at most 7
store operations per round (most make 5), whatever the number of participants;
the round's keys are deleted by the participants themselves once everyone has
read the verdict. A waiting rank logs a warning on the ``"hypergrid"`` logger every
``progress_s`` seconds (the first after ``min(progress_s, timeout_s / 4)``).

Participants and *scopes*: world-collective creations (strategies
``enumerate`` and ``split``) take the whole world and count their rounds per
world; members-only creations (``local``) take the members of the caller's
group and count per set of member ranks. A rebuilt grid, or two grids over the
same ranks, share these counters, so they cannot confuse each other.

The guard is skipped where there is nobody to disagree with: a group of one
rank, and torch's ``fake`` backend (one process simulating one rank of a large
world).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.agreement.protocol import Round, round_keys
from hypergrid.agreement.request import CreationRequest
from hypergrid.binding.worldstate import PerWorld

__all__ = ["CreationRequest", "GuardLedger", "Scope", "agree", "members_scope", "world_scope"]

_PREFIX = "hypergrid/guard"

_counters = PerWorld()  # scope family -> rounds so far in this world
_leftovers = PerWorld()  # scope family -> prefixes of its rounds that timed out (their keys are still stored)


@dataclass(frozen=True)
class Scope:
    """One guard round: a family of rounds that the same participants count together, and its number.

    Examples:
        >>> Scope("world", 3).prefix
        'hypergrid/guard/world/3'
    """

    family: str
    number: int

    @property
    def prefix(self) -> str:
        """The round's key prefix in the store."""
        return f"{_PREFIX}/{self.family}/{self.number}"


def _next(family: str) -> Scope:
    counts = _counters.get()
    number: int = counts.get(family, 0)
    counts[family] = number + 1
    return Scope(family, number)


def world_scope() -> Scope:
    """The scope of the next world-collective creation (every rank of the world takes part)."""
    return _next("world")


def members_scope(ranks: Sequence[int]) -> Scope:
    """The scope of the next members-only creation over exactly ``ranks``."""
    digest = hashlib.sha1(",".join(map(str, ranks)).encode(), usedforsecurity=False).hexdigest()[:20]
    return _next(f"members/{digest}")


class GuardLedger:
    """The guard rounds of one grid that may have left keys in the store (those that timed out).

    Rounds that end in agreement or in a mismatch delete their own keys; a round
    that timed out keeps three until the next completed round of its scope, or
    until `release` (called by ``HyperCommGrid.destroy``).
    """

    def __init__(self) -> None:
        self.prefixes: list[str] = []

    def release(self) -> None:
        """Delete the keys of the recorded rounds from the default store (best effort)."""
        prefixes, self.prefixes = self.prefixes, []
        if not prefixes or not dist.is_initialized() or dist.get_backend() == "fake":
            return
        store = c10d._get_default_store()
        for family_rounds in _leftovers.get().values():
            family_rounds[:] = [prefix for prefix in family_rounds if prefix not in prefixes]
        for prefix in prefixes:
            for key in round_keys(prefix):
                with contextlib.suppress(RuntimeError):  # the store is gone: nothing left to delete
                    store.delete_key(key)


def agree(
    request: CreationRequest,
    participants: Sequence[int],
    scope: Scope,
    timeout_s: float,
    progress_s: float = 30.0,
    ledger: GuardLedger | None = None,
) -> None:
    """Return once every participant made the same ``request``; else raise the same error on all of them.

    Args:
        request: what this rank is about to create.
        participants: every rank that takes part (sorted; the caller among them).
        scope: from `world_scope` or `members_scope`, equal on all participants.
        timeout_s: how long to wait for the other participants.
        progress_s: how often to log a progress line while waiting.
        ledger: where to record a round that leaves keys behind (the grid's).

    Raises:
        DesyncError: the participants asked for different things.
        GuardTimeoutError: some participants did not arrive within ``timeout_s``.
    """
    if len(participants) < 2 or dist.get_backend() == "fake":
        return  # nobody to disagree with: a lone rank, or torch's one-process fake backend
    # The default group's store: torch exposes it only through this accessor, which torch's own
    # helpers and Megatron use too.
    store = c10d._get_default_store()
    leftovers = _leftovers.get().setdefault(scope.family, [])
    rank = dist.get_rank()
    verdict = Round(store, scope.prefix, rank, participants, request, timeout_s, progress_s, leftovers).run()
    if verdict.kind == "timeout":
        leftovers.append(scope.prefix)
        if ledger is not None:
            ledger.prefixes.append(scope.prefix)
    else:
        leftovers.clear()  # the decider of this completed round deleted them
    verdict.raise_if_failed()
