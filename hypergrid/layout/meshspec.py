"""Pure planning of a DeviceMesh over a grid: mesh dims made of one or several grid dims (no torch).

A mesh dim is one grid dim (``"dp"``) or a tuple of grid dims (``("pp", "tp")``)
forming one mesh dim named by joining them with ``_`` (``"pp_tp"``), the
first-named outermost inside it. A combined dim's groups are the grid's family
over its dims, whose ranks torch orders ascending, so its dims must be named
outermost first (the grid's canonical order); mesh dims themselves may come in
any order.

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> layout = GridLayout([2, 2, 2], ["tp", "pp", "dp"])
    >>> plan = MeshPlan(layout, ["dp", ("pp", "tp")])
    >>> plan.names, plan.members
    (('dp', 'pp_tp'), (('dp',), ('pp', 'tp')))
    >>> plan.ranks(rank=0).tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hypergrid.errors import DimsError
from hypergrid.layout import KEY_SEPARATOR, GridLayout
from hypergrid.values import shown

__all__ = ["MeshDims", "MeshPlan", "MESH_NAME_SEPARATOR"]

#: Joins the grid dims of a combined mesh dim into its name.
MESH_NAME_SEPARATOR = "_"

MeshDims = str | Sequence[str | Sequence[str]]


class MeshPlan:
    """The validated mesh dims of an export: names, grid dims of each, sizes, and the mesh's ranks.

    Args:
        layout: the grid's layout.
        dims: a key like ``"dp-tp"`` (one mesh dim per grid dim), or a list
            whose elements are grid dim names or tuples of them.

    Raises:
        DimsError: an unknown or repeated grid dim, an empty element, a
            combined dim not named outermost first, or two mesh dims with one name.
    """

    __slots__ = ("layout", "members", "names", "shape")

    def __init__(self, layout: GridLayout, dims: MeshDims) -> None:
        if isinstance(dims, str):
            elements: list[str | Sequence[str]] = list(dims.split(KEY_SEPARATOR))
        elif isinstance(dims, (list, tuple)):
            elements = list(dims)
        else:
            raise DimsError(f"mesh dims must be a key like 'dp-tp' or a list of names and tuples, got {shown(dims)}")
        if not elements:
            raise DimsError(f"mesh dims must name at least one dim of {list(layout.dim_names)}, got {shown(dims)}")
        members = []
        for element in elements:
            group = (element,) if isinstance(element, str) else element
            if not isinstance(group, (list, tuple)) or not group:
                raise DimsError(
                    f"mesh dim {shown(element)} in {shown(dims)} must be a dim name or a non-empty tuple of names"
                )
            try:
                layout.dim_indices(list(group))  # known and distinct inside the element
            except DimsError as error:
                raise DimsError(f"mesh dims {shown(dims)}: {error}") from None
            canonical = layout.canonical_dims(list(group))
            if tuple(group) != canonical:
                raise DimsError(
                    f"combined mesh dim {shown(tuple(group))} must name its dims outermost first, {shown(canonical)}: "
                    "its process groups are the grid's family over those dims, whose ranks torch orders "
                    f"ascending (grid dims innermost first: {list(layout.dim_names)})"
                )
            members.append(canonical)
        layout.dim_indices([name for group in members for name in group])  # no grid dim twice
        names = tuple(MESH_NAME_SEPARATOR.join(group) for group in members)
        if len(set(names)) != len(names):
            raise DimsError(f"mesh dims {shown(dims)} give two mesh dims the same name: {list(names)}")
        self.layout = layout
        self.members: tuple[tuple[str, ...], ...] = tuple(members)
        self.names: tuple[str, ...] = names
        self.shape: tuple[int, ...] = tuple(layout.group_size(list(group)) for group in members)

    def ranks(self, rank: int) -> np.ndarray:
        """The mesh holding ``rank``: global ranks, one axis per mesh dim, other grid dims at ``rank``'s coordinates.

        Raises:
            RankError: ``rank`` is outside the grid.
        """
        layout = self.layout
        flat = [name for group in self.members for name in group]
        sizes = [layout.dim_size(name) for name in flat]
        points = np.indices(sizes).reshape(len(flat), -1)  # C order: the first-named dim outermost
        coords = np.tile(np.asarray(layout.coords_of(rank), dtype=np.int64), (points.shape[1], 1))
        for row, name in enumerate(flat):
            coords[:, layout.dim_indices(name)[0]] = points[row]
        return layout.ranks_array(coords).reshape(self.shape)
