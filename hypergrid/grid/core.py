"""``GridCore``: the typed core of a grid, where all of its state lives.

``HyperCommGrid`` is a front over capability modules (getters, views, nodes,
mesh, collectives, gradients, pipeline, shims, communicators, elastic), each
a ``GridFacet``. None of them holds state: everything a grid keeps is here,
in the object each grid holds as ``_core``, and a facet reaches it only
through the names this class declares:

- the grid itself (``grid``), its root grid (``root``: itself unless it came
  from ``view()``) and the view it enumerates (``view_name``);
- ``registry``, a `Registry` the root and its views share: the groups by key
  (Megatron's ``_pgs``), the views, how each family enumerates, the pool of
  shared communicators, the spares' release and the DeviceMesh sources;
- where the grid's creations stand (the guard's round keys): ``ordinal``,
  ``epoch``, ``resync``, ``failures_seen``, ``creations``, and its two
  ledgers (``guard_ledger``, ``call_ledger``).

The adapters (``hypergrid.compat``) use a grid through ``grid_core(grid)``:
``root``, ``view_name``, ``rank_view(view)``, ``family_key(dims, view)`` and
``is_created(dims, view, tag)``, never a private member of the grid.

Examples:
    >>> from hypergrid.grid import HyperCommGrid
    >>> core = grid_core(HyperCommGrid([2, 2], ["tp", "dp"]))
    >>> core.view_name, core.family_key(["dp", "tp"], None) == core.family_key("tp-dp", None)
    ('base', True)
    >>> core.rank_view(None).dim_names, core.is_created("tp", None, None), core.epoch
    (['tp', 'dp'], False, 0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypergrid.agreement.guard import GuardLedger, grid_ordinal, guard_failures
from hypergrid.binding.registry import PgKey
from hypergrid.grid.communicators import GroupPool
from hypergrid.layout import Dims, GridLayout
from hypergrid.ops.checks import CallLedger

__all__ = ["BASE_VIEW", "GridCore", "RankView", "Registry", "grid_core"]

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
    """What a root grid and the grids of its views share.

    Attributes:
        groups: registry key -> the caller's group (None outside it), under Megatron's keys (its ``_pgs``).
        views: name -> every registered view, the base one included.
        families: registry key -> the layout and dims that enumerate it, and a half's node size.
        pool: the groups shared by partition, backend, options and tag, held by registry keys.
        spares_released: ``release_spares`` ran: the spares are gone.
        device_meshes: the DeviceMesh sources (``hypergrid.grid.gridmesh.MeshSources``), made on the first export.
    """

    views: dict[str, RankView]
    groups: dict[PgKey, Any] = field(default_factory=dict)
    families: dict[PgKey, tuple[GridLayout, tuple[str, ...], int | None]] = field(default_factory=dict)
    pool: GroupPool = field(default_factory=GroupPool)
    spares_released: bool = False
    device_meshes: Any = None


class GridCore:
    """The state of one grid (see the module docstring); ``description``: the grid in a few characters."""

    def __init__(self, grid: Any, layout: GridLayout, description: str) -> None:
        self.grid = grid
        self.root = grid
        self.view_name = BASE_VIEW
        self.registry = Registry(
            {BASE_VIEW: RankView(BASE_VIEW, list(layout.shape), list(layout.dim_names), [], layout)}
        )
        # Its ordinal among grids of its description built in this process, destroy() calls that ended an
        # epoch, creations in this epoch; resync: see GuardedCreation._stale_epoch.
        self.ordinal = grid_ordinal(description)
        self.epoch, self.resync, self.failures_seen, self.creations = 0, 0, guard_failures(), 0
        # The guard rounds whose keys may still be in the store (destroy() deletes them), and the checked
        # collectives' call counts in this epoch (hypergrid.ops.checks; the root's is used).
        self.guard_ledger, self.call_ledger = GuardLedger(), CallLedger()

    def bind(self, root: Any, view_name: str) -> None:
        """Make this the core of a grid bound to ``root``'s view ``view_name`` (``view()``): it shares its registry."""
        self.root, self.view_name, self.registry = root, view_name, root._core.registry

    # -- the adapters' interface ---------------------------------------------------

    def rank_view(self, view: str | None) -> RankView:
        """The record of ``view`` (None: the grid's own); ``ViewNotFoundError`` for one not registered."""
        found: RankView = self.grid._rank_view(view)
        return found

    def family_key(self, dims: Dims, view: str | None) -> PgKey:
        """The registry key of the family over ``dims`` of ``view``, untagged; ``DimsError`` for unknown dims."""
        key: PgKey = self.grid._family(dims, view)[0]
        return key

    def is_created(self, dims: Dims, view: str | None, tag: str | None) -> bool:
        """Whether the family over ``dims`` of ``view`` with ``tag`` is in the registry."""
        return self.grid._key(dims, view, tag, None, None) in self.registry.groups


def grid_core(grid: Any) -> GridCore:
    """The core of ``grid`` (a ``HyperCommGrid``)."""
    core: GridCore = grid._core
    return core
