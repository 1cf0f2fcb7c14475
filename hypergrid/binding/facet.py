"""``Facet``: the base of the grid's facet objects, and what they may use of the grid's core.

A facet (one capability of ``HyperCommGrid``, made over its core ``hypergrid.grid.core.GridCore`` by
``hypergrid.grid.front.FacetFront``) holds no state and uses of the core only what `FacetCore` declares (mypy and
``tests/layering.py`` check it); see docs/architecture.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist

from hypergrid.errors import NotInitializedError, RankError

if TYPE_CHECKING:
    from hypergrid.binding.registry import PgKey
    from hypergrid.layout import Dims, GridLayout

__all__ = ["Facet", "FacetCore", "FacetRegistry", "caller_rank", "member_pg", "require_initialized"]


class FacetRegistry(Protocol):
    """What a facet uses of the registry a root grid shares with its views (``hypergrid.grid.core.Registry``)."""

    views: dict[str, Any]  # name -> its view's RankView (hypergrid.grid.core)
    groups: dict[PgKey, Any]
    families: dict[PgKey, tuple[GridLayout, tuple[str, ...], int | None]]
    pool: Any  # hypergrid.grid.communicators.GroupPool
    spares_released: bool
    device_meshes: Any
    world: Any  # hypergrid.agreement.world.World, or None


class FacetCore(Protocol):
    """What a facet uses of the grid's core (``hypergrid.grid.core.GridCore``, which documents each member)."""

    grid: Any  # the grid, a HyperCommGrid: its public members
    root: Any  # the root grid, a HyperCommGrid
    view_name: str
    ordinal: int | None
    epoch: int
    resync: int
    creations: int
    guard_ledger: Any  # hypergrid.agreement.guard.GuardLedger
    origin: tuple[tuple[int, ...], int, int]  # the grid as built: (shape, spares, rank_offset)

    @property
    def registry(self) -> FacetRegistry: ...
    def bind(self, root: Any, view_name: str) -> None: ...
    def world_for(self, what: str) -> Any: ...  # the grid's World, checked (hypergrid.grid.core)
    def checked(self, what: str) -> Any: ...
    def ordinal_in(self, world: Any) -> int: ...
    def take_ordinal(self, ordinal: int | None) -> None: ...
    def inherit_origin(self, origin: tuple[tuple[int, ...], int, int]) -> None: ...
    def count_creation(self) -> int: ...
    def seen_epoch(self, epoch: int) -> None: ...
    def describe(self) -> str: ...
    def init_kwargs(self) -> dict[str, Any]: ...
    def family(self, dims: Dims, view: str | None) -> tuple[PgKey, GridLayout, Any]: ...
    def key(self, dims: Dims, view: str | None, tag: str | None, within: object, across: object) -> PgKey: ...
    def node_size_of(self, key: PgKey | None, given: object, half: object) -> int | None: ...


def require_initialized(what: str) -> None:
    """Raise ``NotInitializedError`` naming ``what`` unless torch.distributed is initialized."""
    if not (dist.is_available() and dist.is_initialized()):
        raise NotInitializedError(
            f"{what} needs torch.distributed to be initialized: call "
            "torch.distributed.init_process_group first (get_rank_enum works offline)"
        )


def member_pg(grid: Any, dims: Dims, what: str, **half: Any) -> dist.ProcessGroup:
    """The caller's group of ``grid`` over ``dims`` (created on first use); ``RankError`` outside the grid.

    Every rank calls ``pg`` first, members or not, so that a creation that
    needs the whole world (strategy ``"enumerate"``) completes on the
    members before a non-member raises.
    """
    group: dist.ProcessGroup | None = grid.pg(dims, **half)
    if group is None:
        raise RankError(
            f"{what}: rank {dist.get_rank()} is outside the grid of shape {grid.shape} {grid.dim_names} "
            f"(ranks {grid.rank_offset}..{grid.rank_offset + grid.size - 1}), so it has no group over "
            f"dims {dims!r}; only the grid's ranks may call it"
        )
    return group


def caller_rank(rank: int | None) -> int:
    """``rank``, or without one the calling rank (``NotInitializedError`` when torch.distributed is not initialized)."""
    if rank is not None:
        return rank
    require_initialized("a getter without an explicit rank")
    return dist.get_rank()


class Facet:
    """Base of the grid's facet objects: one holds the grid's core, ``HyperCommGrid`` delegates to it."""

    def __init__(self, core: FacetCore) -> None:
        self._core = core

    def _alarm(self, what: str) -> Any:
        """The alarm (``hypergrid.binding.alarm.Alarm``) of the grid's world, for the call ``what`` (checked)."""
        return self._core.world_for(what).alarm

    @property
    def layout(self) -> GridLayout:
        """The grid's layout (``_core.grid.layout``; a grid's returned by ``view()``: its view's)."""
        layout: GridLayout = self._core.grid.layout
        return layout
