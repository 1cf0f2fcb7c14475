"""``FacetFront``, ``HyperCommGrid``'s base: its facet objects, and one line per method delegating to them."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from hypergrid.binding.facet import Facet
from hypergrid.grid.arrival import Growth
from hypergrid.grid.batch import GuardedCreation
from hypergrid.grid.communicators import Communicators
from hypergrid.grid.core import GridCore
from hypergrid.grid.elastic import Elastic
from hypergrid.grid.getters import CoordinateGetters
from hypergrid.grid.mesh import MeshExport
from hypergrid.grid.nodes import NodeAwareness
from hypergrid.grid.shims import MegatronShims
from hypergrid.grid.views import Views
from hypergrid.ops.collectives import Collectives
from hypergrid.ops.gradients import Gradients
from hypergrid.ops.pipeline import Pipeline

__all__ = ["FacetFront", "delegate"]

P = ParamSpec("P")
R = TypeVar("R")


def delegate(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """The grid's method that calls ``method`` (``FacetClass.name``) on the grid's object of ``FacetClass``.

    It has the facet method's signature (mypy sees it) and docstring (``help``). Only this module touches ``_facets``.
    """
    owner = vars(sys.modules[method.__module__])[method.__qualname__.rpartition(".")[0]]  # FacetClass: top level

    @functools.wraps(method)
    def front(grid: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(grid._facets[owner], *args, **kwargs)

    return front


class FacetFront:
    """The facet objects over a grid's core and the grid's methods that delegate to them (a base of the grid)."""

    def __init__(self, core: GridCore) -> None:
        facets: tuple[type[Facet], ...] = (CoordinateGetters, NodeAwareness, Views, MeshExport, Collectives, Gradients)
        facets += (Pipeline, Communicators, GuardedCreation, Elastic, Growth, MegatronShims)
        self._facets: dict[type[Facet], Facet] = {facet: facet(core) for facet in facets}

    create_pgs = delegate(GuardedCreation.create_pgs)
    coord_of = delegate(CoordinateGetters.coord_of)
    rank_of = delegate(CoordinateGetters.rank_of)
    my_coord = delegate(CoordinateGetters.my_coord)
    group_ranks = delegate(CoordinateGetters.group_ranks)
    group_rank = delegate(CoordinateGetters.group_rank)
    group_size = delegate(CoordinateGetters.group_size)
    src_rank = delegate(CoordinateGetters.src_rank)
    shift = delegate(CoordinateGetters.shift)
    is_first = delegate(CoordinateGetters.is_first)
    is_last = delegate(CoordinateGetters.is_last)
    rank_repr = delegate(CoordinateGetters.rank_repr)
    is_current_rank_in_grid = delegate(CoordinateGetters.is_current_rank_in_grid)
    node_report = delegate(NodeAwareness.node_report)
    node_ranks = delegate(NodeAwareness.node_ranks)
    check_local_rank = delegate(NodeAwareness.check_local_rank)
    node_group = delegate(NodeAwareness.node_group)
    placement_report = delegate(NodeAwareness.placement_report)
    register_view = delegate(Views.register_view)
    view = delegate(Views.view)
    to_device_mesh = delegate(MeshExport.to_device_mesh)
    to_device_meshes = delegate(MeshExport.to_device_meshes)
    own_chunk = delegate(Collectives.own_chunk)
    all_reduce = delegate(Collectives.all_reduce)
    all_gather = delegate(Collectives.all_gather)
    reduce_scatter = delegate(Collectives.reduce_scatter)
    broadcast = delegate(Collectives.broadcast)
    barrier = delegate(Collectives.barrier)
    hierarchical_all_reduce = delegate(Collectives.hierarchical_all_reduce)
    average_gradients = delegate(Gradients.average_gradients)
    prev_rank = delegate(Pipeline.prev_rank)
    next_rank = delegate(Pipeline.next_rank)
    p2p_ops = delegate(Pipeline.p2p_ops)
    exchange = delegate(Pipeline.exchange)
    communicators = delegate(Communicators.communicators)
    abort = delegate(Elastic.abort)
    shrink = delegate(Elastic.shrink)
    standby = delegate(Elastic.standby)
    release_spares = delegate(Elastic.release_spares)
    grow = delegate(Growth.grow)
    arrive = delegate(Growth.arrive)
    # Megatron-Core's private helpers, under its names
    _gen_rank_enum = delegate(MegatronShims._gen_rank_enum)
    _gen_rank_enum_for = delegate(MegatronShims._gen_rank_enum_for)
    _order_dims = delegate(MegatronShims._order_dims)
    _order_dims_for = delegate(MegatronShims._order_dims_for)
