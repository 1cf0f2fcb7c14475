"""The arrivals one ``shrink`` (or ``grow``) takes in: agreed by the survivors, drafted, watched while they join.

`Intake.agree` runs on every survivor once the dead are agreed: the arrivals waiting for a grid of the same origin
(`origin_digest`) are agreed with one ``compare_set`` (`hypergrid.agreement.arrivals.Arrivals.decide`), numbered as
old ranks from the old world's size, and `hypergrid.layout.grow.plan_regrow` takes those it needs. The first two
survivors draft each one taken (`send_drafts`: the plan's inputs, so that it computes the same plan), a prober
that waits for one asks its heartbeat (`gone`), and the new world's rank 0 marks them taken once it holds
(`committed`). A drafted arrival runs the same attempts (`hypergrid.grid.arrival`). docs/design/recovery.md
("Growing back").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from hypergrid.agreement.arrivals import Arrivals, absent
from hypergrid.binding.registry import PgKey
from hypergrid.grid.succession import Recreation
from hypergrid.layout.grow import plan_regrow
from hypergrid.layout.shrink import ShrinkPlan

__all__ = ["Intake", "decode_families", "encode_families", "origin_digest"]


def origin_digest(grid: Any) -> str:
    """A digest of what a grid was built as: its dims, origin (shape, spares, offset) and every setting.

    An arrival is taken in only by survivors whose grid has its digest (the same script, the same arguments).

    Examples:
        >>> from hypergrid import HyperCommGrid
        >>> origin_digest(HyperCommGrid([2, 2], ["tp", "dp"])) == origin_digest(HyperCommGrid([2, 2], ["tp", "dp"]))
        True
        >>> origin_digest(HyperCommGrid([2, 2], ["tp", "dp"])) == origin_digest(HyperCommGrid([1, 4], ["tp", "dp"]))
        False
    """
    core = grid._core.root._core
    settings = sorted((name, repr(value)) for name, value in core.init_kwargs().items() if name != "spares")
    text = repr((list(grid.dim_names), core.origin, settings))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


def _tuples(value: Any) -> Any:
    return tuple(_tuples(item) for item in value) if isinstance(value, list) else value


def encode_families(families: Sequence[Recreation]) -> list[Any]:
    """The families a shrink re-creates, as JSON (keys' tuples become lists; `decode_families` turns them back)."""
    return [[key, spec] for key, spec in families]


def decode_families(data: Sequence[Any]) -> list[Recreation]:
    """`encode_families`'s families again: each key as the grid's registry has it.

    Examples:
        >>> families = [(("expert", ("ep", "tp")), {"dims": ["ep", "tp"], "view": "expert", "tag": None, "kwargs": {}})]
        >>> decode_families(json.loads(json.dumps(encode_families(families)))) == families
        True
    """
    decoded: list[Recreation] = []
    for key, spec in data:
        typed: PgKey = _tuples(key)
        decoded.append((typed, dict(spec)))
    return decoded


class Intake:
    """The arrivals of one shrink, on the job's ``store`` (its base store), for an old world of ``size`` ranks.

    Args:
        store: the job's base store.
        size: the old world's size (the agreed arrivals are its old ranks ``size``, ``size + 1``, ...).
        arrivals: old rank -> arrival number, for every agreed arrival.
        draft: what a drafted arrival is told (the plan's inputs; None on an arrival itself).
    """

    def __init__(
        self, store: Any, size: int, arrivals: dict[int, int] | None = None, draft: dict[str, Any] | None = None
    ) -> None:
        self.store = store
        self.size = size
        self.arrivals = dict(arrivals or {})
        self.draft = draft
        self.considered = max(self.arrivals.values(), default=-1) + 1

    @classmethod
    def agree(cls, recovery: Any, policy: str, dim: str, dead: Sequence[int], families: Sequence[Recreation]) -> Intake:
        """On every survivor, once ``dead`` are agreed: the arrivals this shrink considers (the same on every one)."""
        world, grid = recovery.world, recovery.grid
        arrivals = Arrivals(world.base_store)
        decided = arrivals.decide(world.number, arrivals.waiting(origin_digest(grid)))
        draft = {
            "old": world.number,
            "size": recovery.size,
            "namespace": world.namespace,
            "arrivals": decided,
            "policy": policy,
            "dim": dim,
            "dims": list(grid.dim_names),
            "shape": list(grid.shape),
            "rank_offset": grid.rank_offset,
            "spares": grid.spares,
            "origin": [list(grid._core.origin[0]), *grid._core.origin[1:]],
            "families": encode_families(families),
            "backend": recovery.how[0],
            "timeout_s": recovery.how[1].total_seconds(),
            "shrink_timeout_s": recovery.timeout_s,
            "agreed_dead": list(dead),
        }
        return cls(world.base_store, recovery.size, {recovery.size + i: a for i, a in enumerate(decided)}, draft)

    def plan(self, grid: Any, dead: Sequence[int], policy: str, dim: str) -> ShrinkPlan:
        """The plan alone (`hypergrid.layout.grow.plan_regrow`) of ``grid``'s shrink: the agreed arrivals taken in up
        to its origin."""
        origin = grid._core.origin
        return plan_regrow(grid.layout, self.size, grid.spares, dead, dim, policy, sorted(self.arrivals), origin[:2])

    def survivors(self, plan: ShrinkPlan) -> list[int]:
        """The plan's ranks that come from the old world, in the new world's order (arrivals left out)."""
        return [rank for rank in plan.order if rank < self.size]

    def gone(self, plan: ShrinkPlan, connection: Any, window_s: float) -> list[int]:
        """The plan's arrivals whose heartbeat stood still for ``window_s`` (dead or stopped: the world's
        `hypergrid.timing.Timing.arrival_window_s`), as old ranks; asked through ``connection`` (the calling
        thread's: a prober's, while the main thread waits on its own)."""
        if not plan.arrived:
            return []
        numbers = {self.arrivals[rank]: rank for rank in plan.arrived}
        return [numbers[number] for number in absent(connection, sorted(numbers), window_s)]

    def send_drafts(self, plan: ShrinkPlan, number: int, grids: dict[str, Any]) -> None:
        """Draft each arrival the plan takes into world ``number`` (the first draft stands: an arrival drafted by an
        earlier attempt follows the attempts itself). ``grids``: the successor's ordinal and the job's counts of
        grids built (an arrival takes them on: the guard compares ordinals)."""
        if self.draft is None or not plan.arrived:
            return
        arrivals = Arrivals(self.store)
        text = json.dumps({**self.draft, **grids, "number": number, "dead": list(plan.dead)})
        for rank in plan.arrived:
            arrivals.send_draft(self.arrivals[rank], text)

    def committed(self, plan: ShrinkPlan, old: int) -> None:
        """On the new world's rank 0 once it holds: the arrivals considered are done with (those taken joined; the
        others are not woken for again: a later shrink or ``grow`` takes them), the decision forgotten."""
        arrivals = Arrivals(self.store)
        if self.arrivals:
            arrivals.mark_taken([self.arrivals[rank] for rank in plan.arrived], self.considered)
        arrivals.forget_decision(old)
