"""Pure planning of a DeviceMesh over a grid and its views (no torch).

The mesh dims are those ``HyperCommGrid.to_device_mesh`` takes (its docstring says how they are named, ordered
and combined). A dim is looked up in the exporting grid's own factorization first, then in the base grid and its
registered views, in order; a view's shared dims belong to both.

Each mesh dim is also an *axis* over the grid's ranks: the ``(size, stride)``
of each of its dims, outermost first, strides counted from the grid's first
rank. That is what torch's ``DeviceMesh`` layouts hold, so every mesh of one
grid can derive from one root mesh over the grid's ranks. The axes of one mesh
must not overlap (torch's orthogonality rule).

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> layout = GridLayout([2, 2, 2], ["tp", "pp", "dp"])
    >>> plan = MeshPlan(layout, ["dp", ("pp", "tp")])
    >>> plan.names, plan.members, plan.axes
    (('dp', 'pp_tp'), (('dp',), ('pp', 'tp')), (((2, 4),), ((2, 2), (2, 1))))
    >>> plan.ranks(rank=0).tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> expert = GridLayout([4, 2], ["ep", "edp"])
    >>> MeshPlan(layout, {"dp": "dp", "ep": "ep"}, others=[("expert", expert)]).spaces
    ('base', 'expert')
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from hypergrid.errors import DimsError
from hypergrid.layout import KEY_SEPARATOR, GridLayout
from hypergrid.layout.economy import PartitionSignature, partition_signature
from hypergrid.values import shown

__all__ = ["MESH_NAME_SEPARATOR", "Axis", "MeshDims", "MeshPlan", "axis_signature", "family_of_axis"]

#: Joins the grid dims of a combined mesh dim into its default name.
MESH_NAME_SEPARATOR = "_"

MeshDims = str | Sequence[str | Sequence[str]] | Mapping[str, str | Sequence[str]]

#: One mesh dim over the grid's ranks: ``(size, stride)`` of each of its dims, outermost first.
Axis = tuple[tuple[int, int], ...]

#: A factorization of the grid's ranks: its view name and its layout.
Space = tuple[str, GridLayout]


def _elements(dims: MeshDims, layout: GridLayout) -> list[tuple[str | None, object]]:
    """``(mesh dim name or None for the default, element)`` for each mesh dim requested."""
    if isinstance(dims, str):
        return [(None, name) for name in dims.split(KEY_SEPARATOR)]
    if isinstance(dims, Mapping):
        for name in dims:
            if not isinstance(name, str) or not name:
                raise DimsError(f"mesh dim names must be non-empty str, got {shown(name)} in {shown(dims)}")
        return list(dims.items())
    if isinstance(dims, (list, tuple)):
        return [(None, element) for element in dims]
    raise DimsError(
        f"mesh dims must be a key like 'dp-tp', a list of names and tuples, or a mapping of mesh dim names "
        f"to them, got {shown(dims)} (grid dims: {list(layout.dim_names)})"
    )


def _space_of(group: tuple[str, ...], spaces: Sequence[Space], dims: object) -> Space:
    """The first factorization holding every dim of ``group``."""
    for space in spaces:
        if all(name in space[1].dim_names for name in group):
            return space
    known = {name for _, layout in spaces for name in layout.dim_names}
    unknown = [name for name in group if name not in known]
    if unknown:
        where = ", ".join(f"{view} {list(layout.dim_names)}" for view, layout in spaces)
        raise DimsError(f"unknown dim {shown(unknown[0])} in mesh dims {shown(dims)}; valid dims are {where}")
    homes = {name: [view for view, layout in spaces if name in layout.dim_names] for name in group}
    raise DimsError(
        f"combined mesh dim {shown(group)} mixes dims of different factorizations ({homes}): a combined mesh dim's "
        "groups are one family, so its dims must all belong to the grid or all to one view"
    )


def _check_orthogonal(axes: Sequence[Axis], names: Sequence[str], dims: object) -> None:
    """Refuse mesh dims whose ranks overlap (torch's rule: sorted by stride, each fits in the next one's stride)."""
    atoms = sorted(((stride, size) for axis in axes for size, stride in axis if size > 1), reverse=True)
    for (outer, _), (inner, inner_size) in itertools.pairwise(atoms):
        if outer % (inner * inner_size):
            raise DimsError(
                f"mesh dims {list(names)} from {shown(dims)} overlap: their dims (stride, size) {atoms} do not nest, "
                "so some ranks would appear twice in the mesh; take each rank's dims from one factorization"
            )


class MeshPlan:
    """The validated mesh dims of an export: names, grid dims and factorization of each, sizes, axes, ranks.

    Args:
        layout: the exporting grid's layout.
        dims: a key like ``"dp-tp"`` (one mesh dim per grid dim), a list whose
            elements are dim names or tuples of them, or a mapping from mesh
            dim names to dim names or tuples.
        others: the other factorizations of the same ranks (view name,
            layout), searched in order for dims ``layout`` lacks.
        space: the name of ``layout``'s factorization (``"base"`` for a grid's own).

    Raises:
        DimsError: an unknown or repeated dim, an empty element, a combined
            dim not named outermost first or mixing factorizations, two mesh
            dims with one name, or mesh dims whose ranks overlap.
    """

    __slots__ = ("axes", "layout", "members", "names", "shape", "spaces")

    def __init__(
        self, layout: GridLayout, dims: MeshDims, others: Sequence[Space] = (), *, space: str = "base"
    ) -> None:
        elements = _elements(dims, layout)
        if not elements:
            raise DimsError(f"mesh dims must name at least one dim of {list(layout.dim_names)}, got {shown(dims)}")
        spaces: list[Space] = [(space, layout), *others]
        names, members, homes, axes = [], [], [], []
        for given, element in elements:
            group = (element,) if isinstance(element, str) else element
            if not isinstance(group, (list, tuple)) or not group or not all(isinstance(n, str) for n in group):
                raise DimsError(
                    f"mesh dim {shown(element)} in {shown(dims)} must be a dim name or a non-empty tuple of names"
                )
            view, home = _space_of(tuple(group), spaces, dims)
            canonical = home.canonical_dims(list(group))  # known and distinct inside the element
            if tuple(group) != canonical:
                raise DimsError(
                    f"combined mesh dim {shown(tuple(group))} must name its dims outermost first, {shown(canonical)}: "
                    "its process groups are the grid's family over those dims, whose ranks torch orders "
                    f"ascending (dims innermost first: {list(home.dim_names)})"
                )
            names.append(MESH_NAME_SEPARATOR.join(canonical) if given is None else given)
            members.append(canonical)
            homes.append(view)
            axes.append(tuple((home.dim_size(n), home.strides[home.dim_indices(n)[0]]) for n in canonical))
        flat = [name for group in members for name in group]
        repeated = sorted({name for name in flat if flat.count(name) > 1})
        if repeated:
            raise DimsError(f"mesh dims {shown(dims)} repeat {repeated}; name each dim once")
        if len(set(names)) != len(names):
            raise DimsError(f"mesh dims {shown(dims)} give two mesh dims the same name: {names}")
        _check_orthogonal(axes, names, dims)
        self.layout = layout
        self.names: tuple[str, ...] = tuple(names)
        self.members: tuple[tuple[str, ...], ...] = tuple(members)
        self.spaces: tuple[str, ...] = tuple(homes)
        self.axes: tuple[Axis, ...] = tuple(axes)
        self.shape: tuple[int, ...] = tuple(math.prod(size for size, _ in axis) for axis in axes)

    def ranks(self, rank: int) -> np.ndarray:
        """The mesh holding ``rank``: global ranks, one array axis per mesh dim.

        Along each mesh dim its dims vary, the first-named outermost; every
        other rank of the grid keeps ``rank``'s position.

        Raises:
            RankError: ``rank`` is outside the grid.
        """
        layout = self.layout
        layout.coords_of(rank)  # RankError outside the grid
        local = rank - layout.rank_offset
        atoms = [atom for axis in self.axes for atom in axis]
        corner = local - sum((local // stride % size) * stride for size, stride in atoms)
        mesh = np.full(self.shape, layout.rank_offset + corner, dtype=np.int64)
        for index, axis in enumerate(self.axes):
            offsets = np.zeros(1, dtype=np.int64)
            for size, stride in axis:  # outermost first: C order
                offsets = (offsets[:, None] + np.arange(size, dtype=np.int64) * stride).reshape(-1)
            shape = [1] * len(self.axes)
            shape[index] = offsets.size
            mesh = mesh + offsets.reshape(shape)
        return mesh


def axis_signature(layout: GridLayout, axis: Axis) -> PartitionSignature:
    """The partition of ``layout``'s ranks into the groups along ``axis`` (as ``partition_signature`` names it).

    Examples:
        >>> layout = GridLayout([2, 2, 2], ["tp", "pp", "dp"])
        >>> axis_signature(layout, ((2, 4), (2, 1))) == partition_signature(layout, "dp-tp")
        True
    """
    blocks: list[tuple[int, int]] = []
    for stride, size in sorted((stride, size) for size, stride in axis if size > 1):
        if blocks and blocks[-1][0] * blocks[-1][1] == stride:
            blocks[-1] = (blocks[-1][0], blocks[-1][1] * size)
        else:
            blocks.append((stride, size))
    return PartitionSignature(layout.rank_offset, layout.size, tuple(blocks))


def family_of_axis(spaces: Sequence[Space], axis: Axis) -> tuple[str, tuple[str, ...]] | None:
    """The first factorization and dims whose family has exactly the groups along ``axis``; None if none has.

    A dim belongs to the family when its ranks lie inside one block of the
    axis; the family fits when its partition equals the axis's. An axis of
    one rank is any dim of size 1.

    Examples:
        >>> grid, expert = GridLayout([2, 4], ["tp", "dp"]), GridLayout([4, 2], ["ep", "edp"])
        >>> family_of_axis([("base", grid), ("expert", expert)], ((4, 1),))
        ('expert', ('ep',))
        >>> family_of_axis([("base", grid), ("expert", expert)], ((2, 4), (4, 1)))  # every rank: the grid's first
        ('base', ('dp', 'tp'))
    """
    for view, layout in spaces:
        target = axis_signature(layout, axis)
        if not target.blocks:
            ones = [name for name, size in zip(layout.dim_names, layout.shape) if size == 1]
            if ones:
                return view, (ones[0],)
            continue
        chosen = [
            name
            for name, size, stride in zip(layout.dim_names, layout.shape, layout.strides)
            if size > 1 and any(start <= stride and stride * size <= start * span for start, span in target.blocks)
        ]
        if chosen and partition_signature(layout, chosen) == target:
            return view, layout.canonical_dims(chosen)
    return None
