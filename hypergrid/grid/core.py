"""``GridCore``: the typed core of a grid, where all of its state lives, and the `World` it holds.

A facet uses only what ``hypergrid.binding.facet.FacetCore`` declares of it (see docs/architecture.md); the
adapters (``hypergrid.compat``) use the read-only `FamilyIndex` (`family_index`): ``root``, ``view_name``,
``rank_view``, ``family_key`` and ``is_created``.

A grid holds its world (``hypergrid.agreement.world.World``), shared with its views through the registry: it gets
it when built on an initialized world, or at its first call that needs one (`GridCore.world_for`, the one place),
and every call that communicates checks it there: a grid a shrink replaced refuses (``GridReplacedError``).

Examples:
    >>> from hypergrid.grid import HyperCommGrid
    >>> index = family_index(HyperCommGrid([2, 2], ["tp", "dp"]))
    >>> index.view_name, index.family_key(["dp", "tp"], None) == index.family_key("tp-dp", None)
    ('base', True)
    >>> index.rank_view(None).dim_names, index.is_created("tp", None, None)
    (['tp', 'dp'], False)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hypergrid.agreement.guard import GuardLedger
from hypergrid.agreement.world import CLOSED, REPLACED, World
from hypergrid.binding.options import check_tag
from hypergrid.binding.registry import SCOPE_SEPARATOR, PgKey, scoped, tagged, untagged
from hypergrid.errors import (
    DimsError,
    GridTooLargeError,
    InvalidArgumentError,
    UnexpectedArgumentError,
    ViewNotFoundError,
)
from hypergrid.grid.communicators import GroupPool
from hypergrid.grid.settings import describe, init_kwargs
from hypergrid.layout import KEY_SEPARATOR, Dims, GridLayout
from hypergrid.layout.hierarchy import node_size, resolve_scope
from hypergrid.ops.checks import CallLedger
from hypergrid.values import shown

__all__ = ["BASE_VIEW", "FamilyIndex", "GridCore", "RankView", "Registry", "check_fits", "family_index"]

#: Name of the factorization a grid is constructed with (Megatron's name for it).
BASE_VIEW = "base"


@dataclass
class RankView:
    """A named factorization of the grid's ranks (Megatron's view record: name, shape, dim_names, shared_dims)."""

    name: str
    shape: list[int]
    dim_names: list[str]
    shared_dims: list[str]
    layout: GridLayout = field(repr=False, compare=False)


@dataclass
class Registry:
    """What a root grid and the grids of its views share."""

    views: dict[str, RankView]  # name -> every registered view, the base one included
    groups: dict[PgKey, Any] = field(default_factory=dict)  # key -> the caller's group: Megatron's _pgs
    # key -> the layout and dims that enumerate it, and a half's node size
    families: dict[PgKey, tuple[GridLayout, tuple[str, ...], int | None]] = field(default_factory=dict)
    pool: GroupPool = field(default_factory=GroupPool)  # groups shared by partition, backend, options, tag
    spares_released: bool = False  # release_spares ran: the spares are gone
    device_meshes: Any = None  # the DeviceMesh sources (gridmesh.MeshSources), made on the first export
    world: World | None = None  # the world its groups are in, held by the root grid (None: none yet)


class GridCore:
    """The state of one grid and the registry's operations on it (see the module docstring)."""

    def __init__(self, grid: Any, layout: GridLayout) -> None:
        self.grid = grid
        self.root = grid
        self.view_name = BASE_VIEW
        self.registry = Registry(
            {BASE_VIEW: RankView(BASE_VIEW, list(layout.shape), list(layout.dim_names), [], layout)}
        )
        # Its ordinal among grids of its description built on this rank's worlds (taken when it is built on an
        # initialized world, else at its first creation: `ordinal_in`), destroy() calls that ended an epoch,
        # creations in this epoch; resync: see stale_epoch.
        self.ordinal: int | None = None
        self.epoch, self.resync, self.failures_seen, self.creations = 0, 0, 0, 0
        # The guard rounds whose keys may still be in the store (destroy() deletes them), and the checked
        # collectives' call counts in this epoch (hypergrid.ops.checks; the root's is used).
        self.guard_ledger, self.call_ledger = GuardLedger(), CallLedger()
        #: The grid as it was built: (shape, spares, rank_offset). A shrink's successor keeps its predecessor's;
        #: growing back (`hypergrid.layout.grow`) aims at this shape, never past it.
        self.origin: tuple[tuple[int, ...], int, int] = (
            tuple(layout.shape),
            int(getattr(grid, "spares", 0)),
            layout.rank_offset,
        )
        if dist.is_available() and dist.is_initialized():  # built on a world: this rank joins its watch now
            self.adopt(World.current())
            self.ordinal_in(self.registry.world)  # type: ignore[arg-type]  # (adopted just now)

    def bind(self, root: Any, view_name: str) -> None:
        """Make this the core of a grid bound to ``root``'s view ``view_name`` (``view()``): it shares its registry
        (and the world its root holds)."""
        world = self.registry.world
        if world is not None:
            world.release(self.grid, close=False)
            if self.ordinal is not None:  # a view creates through its root: its ordinal is handed back
                world.job.ordinal(self.describe(), forget=self.ordinal)
        self.root, self.view_name, self.registry = root, view_name, root._core.registry

    def inherit_origin(self, origin: tuple[tuple[int, ...], int, int]) -> None:
        """Take ``origin`` as this grid's (a shrink's successor: its predecessor's; `origin`)."""
        self.origin = (tuple(origin[0]), int(origin[1]), int(origin[2]))

    # -- its world ----------------------------------------------------------------------

    def adopt(self, world: World, join: bool = True) -> None:
        """Hold ``world`` (the root grid does, for its views too) in place of the one held before, if any; with
        ``join``, this rank joins its watch (a shrink's new world is joined once its commit passed)."""
        held = self.registry.world
        if held is world:
            return
        if held is not None:
            held.release(self.root, close=False)
        self.registry.world = world
        world.hold(self.root, join)
        self.failures_seen = world.job.guard_failures

    def world_for(self, what: str) -> World:
        """The grid's world for the call ``what``, checked: a world a shrink replaced refuses it.

        Got on first need (`World.current`), and again once it closed (its grids destroyed, or torch's default
        group). Raises ``NotInitializedError`` without torch.distributed, ``GridReplacedError`` on a replaced one.
        """
        world = self.registry.world
        if world is None or world.state == CLOSED:
            world = World.current()
            self.adopt(world)
        world.check(what)
        return world

    def checked(self, what: str) -> World | None:
        """`world_for` where torch.distributed is initialized or a world is held; None offline (nothing to check).

        A fenced rank raises ``FencedError`` here (its news does not count: the call may be a shrink).
        """
        if self.registry.world is None and not (dist.is_available() and dist.is_initialized()):
            return None
        world = self.world_for(what)
        world.alarm.check_fence(what)
        return world

    def take_ordinal(self, ordinal: int | None) -> None:
        """Take ``ordinal`` as the grid's (an arrival's successor: the one the survivors' has; None: at its first
        creation, as theirs)."""
        self.ordinal = ordinal

    def ordinal_in(self, world: World) -> int:
        """The grid's ordinal (`hypergrid.agreement.guard`): taken from ``world``'s job now if not yet (a grid
        built before torch.distributed was initialized: at its first creation, so a call refused meanwhile, or a
        grid never used, changes nothing)."""
        if self.ordinal is None:
            self.ordinal = world.job.ordinal(self.describe())
        return self.ordinal

    # -- what the grid is -------------------------------------------------------------

    def describe(self) -> str:
        """The grid in a few characters (`hypergrid.grid.settings.describe`)."""
        grid = self.grid
        return describe(grid.dim_names, grid.shape, grid.rank_offset, grid.backend)

    def init_kwargs(self) -> dict[str, Any]:
        """Every constructor argument but the shape, names and offset, as the root grid holds it.

        Read from the constructor's signature: a grid built from another (a view,
        a successor after ``shrink``) keeps every setting, including one added later.
        """
        return init_kwargs(self.root)

    def count_creation(self) -> int:
        """This creation's number in the grid's epoch (the guard's sequence); the next one's is one more."""
        self.creations += 1
        return self.creations - 1

    def seen_epoch(self, epoch: int) -> None:
        """A guard error showed a rank in ``epoch``: ``destroy()`` starts the epoch after it (`stale_epoch`)."""
        self.resync = max(self.resync, epoch)

    def stale_epoch(self) -> bool:
        """Whether a guard round failed in this process (on any grid) since this grid's epoch began; now noted.

        ``resync`` is the latest epoch another rank was seen in, by a guard
        error on this grid: ``destroy()`` starts the epoch after it.
        """
        world = self.registry.world
        if world is None:
            return False
        seen, self.failures_seen = self.failures_seen, world.job.guard_failures
        return seen < self.failures_seen

    def drop_families(self) -> None:
        """``destroy()``'s part on the groups: release this grid's families, destroy the groups nothing holds.

        On the root grid it also ends the guard's epoch (see ``destroy``) and counts this rank out of the guard's
        leftover rounds (`GuardLedger.release`).
        """
        world = self.registry.world
        self.guard_ledger.release(world if world is not None and world.state != REPLACED else None)
        mine = self.view_keys(own_only=True)
        freed = self.registry.pool.release_registry(self.registry.groups, mine)
        if self.root is self.grid and (self.stale_epoch() or self.creations or mine):
            self.epoch, self.creations = max(self.epoch, self.resync) + 1, 0
        for group in freed:
            # torch no longer knows this group (destroyed elsewhere), or it is no group of this world.
            with contextlib.suppress(ValueError, RuntimeError):
                dist.destroy_process_group(group)

    # -- registry keys --------------------------------------------------------

    def rank_view(self, view: str | None) -> RankView:
        """The record of ``view`` (None: the grid's own); ``ViewNotFoundError`` for one not registered."""
        name = self.view_name if view is None else view
        views = self.registry.views
        if not isinstance(name, str):
            raise InvalidArgumentError(f"view={shown(view)}: expected None or a registered view's name {sorted(views)}")
        if name not in views:
            raise ViewNotFoundError(f"View {shown(name)} is not registered. Registered views: {sorted(views)}")
        return views[name]

    def family(self, dims: Dims, view: str | None) -> tuple[PgKey, GridLayout, RankView]:
        """The registry key of a family, the layout that enumerates it, and its view."""
        spec = self.rank_view(view)
        for dim in _names_of(dims):
            if isinstance(dim, str) and dim and dim not in spec.dim_names:
                where = f"view {shown(spec.name)} with" if len(self.registry.views) > 1 else "the grid's"  # no views
                raise DimsError(f"{shown(dim)} is not in {where} dim_names {spec.dim_names} (in dims {shown(dims)})")
        ordered = spec.layout.canonical_dims(dims)
        if spec.name == BASE_VIEW:
            return KEY_SEPARATOR.join(ordered), spec.layout, spec
        if set(ordered) <= set(spec.shared_dims):
            base = self.root.layout
            return base.key(list(ordered)), base, spec
        return (spec.name, ordered), spec.layout, spec

    def family_key(self, dims: Dims, view: str | None) -> PgKey:
        """The registry key of the family over ``dims`` of ``view``, untagged; ``DimsError`` for unknown dims."""
        return self.family(dims, view)[0]

    def key(self, dims: Dims, view: str | None, tag: str | None, within: object, across: object) -> PgKey:
        """The registry key of a family (or of one half of its hierarchy), with ``tag``; never on a fenced rank."""
        family, checked = self.family(dims, view)[0], check_tag(tag)  # argument errors first
        self.checked("pg" if checked is None else f"pg(tag={checked!r})")
        return tagged(scoped(family, resolve_scope(within, across)), checked)

    def is_created(self, dims: Dims, view: str | None, tag: str | None) -> bool:
        """Whether the family over ``dims`` of ``view`` with ``tag`` is in the registry."""
        return self.key(dims, view, tag, None, None) in self.registry.groups

    def node_size_of(self, key: PgKey | None, given: object, half: object) -> int | None:
        """The node size the half ``key`` was cut with; refuses a ``given`` one that differs or has no ``half``."""
        if given is not None and half is None:
            raise UnexpectedArgumentError(
                f"ranks_per_node={shown(given)} without within= or across=; it sets the node size of a hierarchy's "
                "half only"
            )
        stored: int | None = self.registry.families.get(key, (None, None, None))[2]  # type: ignore[arg-type]
        if given is not None and stored is not None and node_size(given) != stored:  # type: ignore[arg-type]
            raise InvalidArgumentError(
                f"{key!r} was created with ranks_per_node={stored}, not {shown(given)}: a half is cut once; destroy() "
                "the grid's groups to cut it again"
            )
        return stored

    def view_keys(self, own_only: bool) -> list[PgKey]:
        """Registry keys of this grid's families: all of them on a root grid.

        On a grid returned by ``view()``: with ``own_only``, the registry keys of
        its private families (what its ``destroy`` may tear down); otherwise its
        created families as canonical strings of its dims, shared ones included.
        """
        registry = self.registry.groups
        if self.root is self.grid:
            return list(registry)
        shared = set(self.grid.shared_dims)
        keys: list[PgKey] = []
        for key in registry:
            family, tag = untagged(key)
            if isinstance(family, tuple) and family[0] == self.view_name:
                keys.append(key if own_only else tagged(KEY_SEPARATOR.join(family[1]), tag))
            elif not own_only and isinstance(family, str):
                base, separator, half = family.partition(SCOPE_SEPARATOR)  # "dp|within=node": a hierarchy's half
                if set(base.split(KEY_SEPARATOR)) <= shared:
                    keys.append(tagged(self.grid.layout.key(base) + separator + half, tag))
        return keys


def check_fits(grid: Any, world: int | None) -> None:
    """Refuse a grid that does not fit in a world of ``world`` ranks (None: unknown)."""
    if world is not None and grid.rank_offset + grid.size > world:
        raise GridTooLargeError(
            f"Grid shape {grid.shape} is over sized with world size {world} and rank offset "
            f"{grid.rank_offset}: its {grid.size} ranks with rank_offset {grid.rank_offset} need ranks up to "
            f"{grid.rank_offset + grid.size - 1}, but the world has {world} ranks (0..{world - 1})"
        )


class FamilyIndex:
    """What the adapters (``hypergrid.compat``) read of a grid: its root and view, views, families (read-only).

    Args:
        core: the grid's core.
    """

    def __init__(self, core: GridCore) -> None:
        self._of = core

    @property
    def root(self) -> Any:
        """The root grid (the grid itself unless it came from ``view()``)."""
        return self._of.root

    @property
    def view_name(self) -> str:
        """The grid's view (``"base"`` for a root grid)."""
        return self._of.view_name

    def rank_view(self, view: str | None) -> RankView:
        """The record of ``view`` (None: the grid's own); ``ViewNotFoundError`` for one not registered."""
        return self._of.rank_view(view)

    def family_key(self, dims: Dims, view: str | None) -> PgKey:
        """The registry key of the family over ``dims`` of ``view``, untagged."""
        return self._of.family_key(dims, view)

    def is_created(self, dims: Dims, view: str | None, tag: str | None) -> bool:
        """Whether that family (with ``tag``) was created."""
        return self._of.is_created(dims, view, tag)


def family_index(grid: Any) -> FamilyIndex:
    """The read-only `FamilyIndex` of ``grid`` (a ``HyperCommGrid``)."""
    return FamilyIndex(grid._core)


def _names_of(dims: Dims) -> list[object]:
    if isinstance(dims, str):
        return list(dims.split(KEY_SEPARATOR))
    if isinstance(dims, (list, tuple)):
        return list(dims)
    return [dims]
