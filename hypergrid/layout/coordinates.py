"""Named coordinates, neighbours, names and node spans of a grid layout (no torch).

``GridLayout`` takes these from ``NamedCoordinates``: they build on its rank
arithmetic (``coords_of``, ``rank_of``, ``rank_enum_array``) and add the
vocabulary frameworks use — coordinates as named tuples, keyword coordinates,
``MPI_Cart_shift`` neighbours, DeepSpeed-style rank names, node spans.

A coordinate is a ``Coord``: a named tuple whose fields are the dim names,
one type per tuple of names (``coord_type``). It pickles by the names and the
values, so it survives ``pickle``, ``copy``, ``all_gather_object`` and
``spawn``'s results, and it equals the plain tuple of its values.

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> GridLayout([2, 4], ["tp", "pp"]).shift("pp", rank=3)
    (1, 5)
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from hypergrid.errors import DimsError, GridSpecError, RankError
from hypergrid.layout.spec import MAX_WORLD_SIZE, Dims
from hypergrid.validation import check_bool, check_int, check_str
from hypergrid.values import as_int, shown

__all__ = ["NamedCoordinates", "coord_type"]

_coord_types: dict[tuple[str, ...], type[Any]] = {}
_coord_types_lock = threading.Lock()


def coord_type(dim_names: Sequence[str]) -> type[Any]:
    """The ``Coord`` named-tuple type with ``dim_names`` as fields: one type per tuple of names.

    Its values pickle as ``(dim names, values)`` and are rebuilt through this
    function, so they cross processes although each type is made at run time.

    Examples:
        >>> import pickle
        >>> Coord = coord_type(["tp", "dp"])
        >>> c = pickle.loads(pickle.dumps(Coord(1, 0)))
        >>> c, c == (1, 0), type(c) is Coord, c.dp
        (Coord(tp=1, dp=0), True, True, 0)
    """
    names = tuple(dim_names)
    found = _coord_types.get(names)
    if found is None:
        with _coord_types_lock:
            found = _coord_types.get(names)
            if found is None:
                base = namedtuple("Coord", names)  # type: ignore[misc]  # fields known at run time only
                namespace = {"__slots__": (), "__reduce__": _reduce_coord, "__module__": __name__}
                found = _coord_types[names] = type("Coord", (base,), namespace)
    return found


def _rebuild_coord(dim_names: tuple[str, ...], values: tuple[int, ...]) -> tuple[int, ...]:
    """What an unpickled ``Coord`` is made by (module level, so pickle finds it by name)."""
    coord: tuple[int, ...] = coord_type(dim_names)(*values)
    return coord


def _reduce_coord(self: Any) -> tuple[Any, tuple[tuple[str, ...], tuple[int, ...]]]:
    return _rebuild_coord, (tuple(self._fields), tuple(self))


class NamedCoordinates:
    """The named-coordinate half of ``GridLayout`` (a mixin: it holds no state of its own)."""

    __slots__ = ()

    if TYPE_CHECKING:  # provided by GridLayout
        shape: tuple[int, ...]
        strides: tuple[int, ...]
        rank_offset: int
        size: int
        dim_names: tuple[str, ...]
        _index: dict[str, int]
        _coord_type: Any

        def coords_of(self, rank: int) -> tuple[int, ...]: ...
        def rank_of(self, coords: Sequence[int]) -> int: ...
        def dim_indices(self, dims: Dims) -> tuple[int, ...]: ...
        def all_families(self) -> list[tuple[str, ...]]: ...
        def rank_enum_array(self, dims: Dims) -> np.ndarray: ...
        def key(self, dims: Dims) -> str: ...
        def group_size(self, dims: Dims) -> int: ...
        def num_groups(self, dims: Dims) -> int: ...
        def _one_dim(self, dim: object) -> int: ...

    def coord_of(self, rank: int) -> Any:
        """Coordinates of ``rank`` as a named tuple with the dim names as fields. O(ndim).

        Examples:
            >>> from hypergrid import GridLayout
            >>> GridLayout([2, 3, 4], ["tp", "cp", "dp"]).coord_of(11)
            Coord(tp=1, cp=2, dp=1)
        """
        return self._coord_type(*self.coords_of(rank))

    def rank_at(self, **coords: int) -> int:
        """The rank at the named coordinates; every dim is required.

        Raises:
            RankError: a dim missing, an unknown dim, or a coordinate out of range.

        Examples:
            >>> from hypergrid import GridLayout
            >>> GridLayout([2, 3, 4], ["tp", "cp", "dp"]).rank_at(tp=1, cp=2, dp=1)
            11
        """
        unknown = sorted(set(coords) - set(self.dim_names))
        missing = [name for name in self.dim_names if name not in coords]
        if unknown or missing:
            raise RankError(
                f"coordinates must name each dim of {list(self.dim_names)} once: missing {missing}, unknown "
                f"{shown(unknown)} (got {shown(coords)})"
            )
        return self.rank_of([coords[name] for name in self.dim_names])

    def replace(self, rank: int, **coords: int) -> int:
        """The rank whose coordinates are ``rank``'s with some replaced (DeepSpeed's ``stage_to_global``).

        Examples:
            >>> from hypergrid import GridLayout
            >>> GridLayout([2, 2, 2], ["tp", "pp", "dp"]).replace(5, pp=1)
            7
        """
        unknown = sorted(set(coords) - set(self.dim_names))
        if unknown:
            raise RankError(f"unknown dim(s) {shown(unknown)} in {shown(coords)}; valid dims: {list(self.dim_names)}")
        return self.rank_at(**{**self.coord_of(rank)._asdict(), **coords})

    def shift(self, dim: str, rank: int, disp: int = 1, periodic: bool = False) -> tuple[int | None, int | None]:
        """``(source, dest)`` along ``dim``, like ``MPI_Cart_shift``.

        ``dest`` is the rank ``disp`` steps ahead of ``rank`` along ``dim``,
        ``source`` the one ``disp`` steps behind; ``None`` past an open edge,
        wrapped around when ``periodic``.

        Examples:
            >>> from hypergrid import GridLayout
            >>> layout = GridLayout([2, 4], ["tp", "pp"])
            >>> layout.shift("pp", rank=1), layout.shift("pp", rank=7), layout.shift("pp", rank=7, periodic=True)
            ((None, 3), (5, None), (5, 1))
        """
        i = self._one_dim(dim)
        step = as_int(disp)
        if step is None:
            raise RankError(f"disp={shown(disp)}: expected an int")
        periodic = check_bool("shift", "periodic", periodic)
        size, stride = self.shape[i], self.strides[i]
        here = self.coords_of(rank)[i]
        ends = []
        for target in (here - step, here + step):
            if periodic:
                target %= size
            ends.append(None if not 0 <= target < size else rank + (target - here) * stride)
        return ends[0], ends[1]

    def rank_repr(self, rank: int, omit: Iterable[str] = (), inner_sep: str = "_", outer_sep: str = "-") -> str:
        """A name for ``rank`` from its coordinates, outermost dim first (checkpoint file names).

        The form of DeepSpeed's ``get_rank_repr``: ``{dim}{inner_sep}{coord:02d}``
        joined by ``outer_sep``, leaving out the dims in ``omit``.

        Examples:
            >>> from hypergrid import GridLayout
            >>> layout = GridLayout([2, 2, 4], ["tp", "pp", "dp"])
            >>> layout.rank_repr(7), layout.rank_repr(7, omit=["dp"])
            ('dp_01-pp_01-tp_01', 'pp_01-tp_01')
        """
        if isinstance(omit, str):
            omitted = [omit]
        elif isinstance(omit, (list, tuple, set, frozenset)):
            omitted = list(omit)
        else:
            raise DimsError(f"omit must be a list of dim names, got {shown(omit)}")
        unknown = [name for name in omitted if not isinstance(name, str) or name not in self._index]
        if unknown:
            raise DimsError(f"omit names unknown dim(s) {shown(unknown)}; valid dims are {list(self.dim_names)}")
        check_str("rank_repr", "inner_sep", inner_sep)
        check_str("rank_repr", "outer_sep", outer_sep)
        coords = self.coords_of(rank)
        parts = [
            f"{name}{inner_sep}{coords[i]:02d}"
            for i, name in reversed(list(enumerate(self.dim_names)))
            if name not in omitted
        ]
        return outer_sep.join(parts)

    def node_report(self, ranks_per_node: int) -> list[dict[str, Any]]:
        """For each family: how many nodes its groups span, with ``ranks_per_node`` consecutive ranks a node.

        Node of a rank: ``rank // ranks_per_node`` (global ranks, offset included).
        Computed from the group holding the grid's first rank and, for the
        maximum, every group (O(world) per family).

        Examples:
            >>> from hypergrid import GridLayout
            >>> [(r["key"], r["max_nodes"]) for r in GridLayout([4, 2], ["tp", "dp"]).node_report(4)]
            [('tp', 1), ('dp', 2), ('dp-tp', 2)]
        """
        per_node = check_int("node_report", "ranks_per_node", ranks_per_node, 1, MAX_WORLD_SIZE, GridSpecError)
        # A node larger than the world holds every rank: the same as one of the world's size.
        per_node = min(per_node, self.rank_offset + self.size)
        report = []
        for family in self.all_families():
            nodes = np.sort(self.rank_enum_array(family) // per_node, axis=1)
            spans = 1 + (np.diff(nodes, axis=1) != 0).sum(axis=1)
            report.append(
                {
                    "key": self.key(family),
                    "group_size": self.group_size(family),
                    "num_groups": self.num_groups(family),
                    "max_nodes": int(spans.max()),
                    "min_nodes": int(spans.min()),
                    "intra_node": bool(spans.max() == 1),
                }
            )
        return report
