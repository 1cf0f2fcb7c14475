"""The pure layout core: rank arithmetic of a named grid, with no torch import.

A grid of ``shape = [s0, s1, ...]`` with ``dim_names = [n0, n1, ...]`` lays the
ranks ``rank_offset .. rank_offset + prod(shape) - 1`` out so that ``n0`` is the
innermost dim (stride 1), ``n1`` the next (stride ``s0``), and so on. This is
Megatron-Core's ``HyperCommGrid`` / ``RankGenerator`` convention: the rank array
is ``arange(offset, offset + size)`` reshaped C-order over the *reversed* shape.

For a combination of dims, the *family* is one group per combination of the
other dims' coordinates. Groups are ordered with the innermost remaining dim
fastest; inside a group the requested dims vary in layout order, innermost
fastest (so every group is sorted ascending).

Examples:
    >>> layout = GridLayout([2, 2, 2], ["a", "b", "c"])
    >>> layout.rank_enum(["c", "a"])
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    >>> layout.key(["c", "a"])
    'c-a'
    >>> layout.coords_of(6)
    (0, 1, 1)
    >>> layout.group_ranks("b", rank=5)
    [5, 7]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from einops import rearrange

from hypergrid.errors import DimsError, GridSpecError, RankError, public_methods
from hypergrid.layout.coordinates import NamedCoordinates, coord_type
from hypergrid.layout.spec import (
    MAX_WORLD_SIZE,
    Dims,
    check_dim_names,
    check_offset,
    check_shape,
    int_array,
    resolve_shape,
)
from hypergrid.values import as_int, is_int, shown

__all__ = ["KEY_SEPARATOR", "MAX_WORLD_SIZE", "Dims", "GridLayout", "resolve_shape"]


#: Joins dim names into a canonical key (Megatron's form); dim names cannot contain it.
KEY_SEPARATOR = "-"


@lru_cache(maxsize=1024)
def _family_pattern(ndim: int, dims: tuple[int, ...]) -> str:
    # Axis i of the grid is named "d<i>"; the array holds them outermost first.
    # Groups run over the other dims, members over the requested ones, both in
    # array order (so the innermost is fastest): Megatron's convention.
    array_axes = [f"d{i}" for i in reversed(range(ndim))]
    chosen = set(dims)
    group_axes = " ".join(axis for axis, i in zip(array_axes, reversed(range(ndim))) if i not in chosen)
    member_axes = " ".join(axis for axis, i in zip(array_axes, reversed(range(ndim))) if i in chosen)
    return f"{' '.join(array_axes)} -> ({group_axes}) ({member_axes})"


@public_methods
class GridLayout(NamedCoordinates):
    """A validated, immutable description of a named grid of ranks.

    Args:
        shape: size of each dim, innermost first; positive ints.
        dim_names: one identifier per dim (``dim_names[0]`` is innermost).
        rank_offset: the grid's first rank, when it does not start at 0.

    Raises:
        GridSpecError: a bad shape, bad or repeated names, a bad offset, or a
            grid needing a world larger than 2**31-1 ranks.

    Examples:
        >>> layout = GridLayout([2, 3, 4, 5], ["tp", "cp", "pp", "dp"])
        >>> layout.size, layout.strides
        (120, (1, 2, 6, 24))
        >>> layout.group_size(["tp", "pp"]), layout.num_groups(["tp", "pp"])
        (8, 15)
    """

    __slots__ = ("_coord_type", "_index", "dim_names", "rank_offset", "shape", "size", "strides")

    shape: tuple[int, ...]
    dim_names: tuple[str, ...]
    rank_offset: int
    size: int
    strides: tuple[int, ...]
    _index: dict[str, int]
    _coord_type: Any

    def __init__(self, shape: Sequence[int], dim_names: Sequence[str], rank_offset: int = 0) -> None:
        sizes = check_shape(shape)
        names = check_dim_names(dim_names, len(sizes))
        offset = check_offset(rank_offset)
        size = math.prod(sizes)
        if offset + size > MAX_WORLD_SIZE:
            overflow = " (more than int64 can hold)" if size >= 2**63 else ""
            raise GridSpecError(
                f"grid of shape {shown(list(sizes))} has {shown(size)} ranks{overflow}; with rank_offset {offset} it "
                f"needs a world of {shown(offset + size)} ranks, but world sizes are 32-bit: at most 2**31-1 = "
                f"{MAX_WORLD_SIZE}"
            )
        strides = tuple(math.prod(sizes[:i]) for i in range(len(sizes)))
        set_attr = object.__setattr__
        set_attr(self, "shape", sizes)
        set_attr(self, "dim_names", names)
        set_attr(self, "rank_offset", offset)
        set_attr(self, "size", size)
        set_attr(self, "strides", strides)
        set_attr(self, "_index", {name: i for i, name in enumerate(names)})
        set_attr(self, "_coord_type", coord_type(names))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"GridLayout is immutable; cannot set {shown(name)}")

    def __repr__(self) -> str:
        return f"GridLayout(shape={list(self.shape)}, dim_names={list(self.dim_names)}, rank_offset={self.rank_offset})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GridLayout):
            return NotImplemented
        return (self.shape, self.dim_names, self.rank_offset) == (other.shape, other.dim_names, other.rank_offset)

    def __hash__(self) -> int:
        return hash((self.shape, self.dim_names, self.rank_offset))

    @property
    def ndim(self) -> int:
        """Number of dims."""
        return len(self.shape)

    # -- dims ---------------------------------------------------------------

    def dim_indices(self, dims: Dims) -> tuple[int, ...]:
        """Positions of the requested dims in ``dim_names``, innermost first.

        ``dims`` is one name, a canonical key (``"dp-tp"``), or a list/tuple of
        names, in any order.

        Raises:
            DimsError: ``dims`` is empty, of the wrong type, names an unknown
                dim or repeats one.

        Examples:
            >>> GridLayout([2, 2, 2], ["tp", "cp", "dp"]).dim_indices(["dp", "tp"])
            (0, 2)
        """
        if isinstance(dims, str):
            names = dims.split(KEY_SEPARATOR)
        elif isinstance(dims, (list, tuple)):
            names = list(dims)
        else:
            raise DimsError(f"dims must be a dim name, a key like 'dp-tp', or a list/tuple of names, got {shown(dims)}")
        if not names or names == [""]:
            raise DimsError(f"dims must name at least one dim of {list(self.dim_names)}, got {shown(dims)}")
        indices = []
        for name in names:
            index = self._index.get(name) if isinstance(name, str) else None
            if index is None:
                raise DimsError(
                    f"unknown dim {shown(name)} in dims {shown(dims)}; valid dims are {list(self.dim_names)}"
                )
            indices.append(index)
        if len(set(indices)) != len(indices):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise DimsError(f"dims {shown(dims)} repeat {repeated}; name each dim once")
        return tuple(sorted(indices))

    def canonical_dims(self, dims: Dims) -> tuple[str, ...]:
        """The requested dims in canonical order: outermost first (Megatron's key order).

        Examples:
            >>> GridLayout([2, 2, 2], ["tp", "cp", "dp"]).canonical_dims(["tp", "dp"])
            ('dp', 'tp')
        """
        return tuple(self.dim_names[i] for i in reversed(self.dim_indices(dims)))

    def key(self, dims: Dims) -> str:
        """The canonical key of a combination of dims: names outermost first, joined by ``-``.

        Examples:
            >>> GridLayout([2, 2, 2], ["tp", "cp", "dp"]).key(["tp", "dp"])
            'dp-tp'
        """
        return KEY_SEPARATOR.join(self.canonical_dims(dims))

    def dim_size(self, dim: str) -> int:
        """Size of one named dim.

        Examples:
            >>> GridLayout([2, 4], ["tp", "dp"]).dim_size("dp")
            4
        """
        return self.shape[self._one_dim(dim)]

    def _one_dim(self, dim: object) -> int:
        """The position of one dim given by its name; ``DimsError`` for anything else (a list, a key of two dims)."""
        index = self._index.get(dim) if isinstance(dim, str) else None
        if index is None:
            raise DimsError(f"dim={shown(dim)}: expected one dim name of {list(self.dim_names)} (a str such as 'dp')")
        return index

    def group_size(self, dims: Dims) -> int:
        """Number of ranks in each group of the family over ``dims``.

        Examples:
            >>> GridLayout([2, 3, 4], ["tp", "cp", "dp"]).group_size("cp-tp")
            6
        """
        return math.prod(self.shape[i] for i in self.dim_indices(dims))

    def num_groups(self, dims: Dims) -> int:
        """Number of groups in the family over ``dims``.

        Examples:
            >>> GridLayout([2, 3, 4], ["tp", "cp", "dp"]).num_groups("cp-tp")
            4
        """
        return self.size // self.group_size(dims)

    def all_families(self) -> list[tuple[str, ...]]:
        """Every non-empty combination of dims, canonical, fewest dims first.

        Examples:
            >>> GridLayout([2, 2], ["tp", "dp"]).all_families()
            [('tp',), ('dp',), ('dp', 'tp')]
        """
        ndim = self.ndim
        masks = sorted(range(1, 2**ndim), key=lambda m: (bin(m).count("1"), m))
        return [tuple(self.dim_names[i] for i in reversed(range(ndim)) if m >> i & 1) for m in masks]

    # -- enumeration --------------------------------------------------------

    def rank_array(self) -> np.ndarray:
        """All ranks as an array over the reversed shape (``dim_names[-1]`` first axis).

        Examples:
            >>> GridLayout([2, 3], ["tp", "dp"]).rank_array().tolist()
            [[0, 1], [2, 3], [4, 5]]
        """
        ranks = np.arange(self.rank_offset, self.rank_offset + self.size, dtype=np.int64)
        return ranks.reshape(self.shape[::-1])

    def rank_enum_array(self, dims: Dims) -> np.ndarray:
        """The family over ``dims`` as an int64 array of shape ``(num_groups, group_size)``.

        Examples:
            >>> GridLayout([2, 2, 2], ["a", "b", "c"]).rank_enum_array("a-b").tolist()
            [[0, 1, 2, 3], [4, 5, 6, 7]]
        """
        pattern = _family_pattern(self.ndim, self.dim_indices(dims))
        return np.ascontiguousarray(rearrange(self.rank_array(), pattern))

    def rank_enum(self, dims: Dims) -> list[list[int]]:
        """The family over ``dims``: every group's ranks, in Megatron's order.

        This is exactly the list ``HyperCommGrid.create_pg`` hands to
        ``torch.distributed.new_subgroups_by_enumeration``.

        Examples:
            >>> GridLayout([2, 2, 2], ["a", "b", "c"]).rank_enum(["a", "c"])
            [[0, 1, 4, 5], [2, 3, 6, 7]]
        """
        enum: list[list[int]] = self.rank_enum_array(dims).tolist()
        return enum

    # -- single ranks -------------------------------------------------------

    def _check_rank(self, rank: object) -> int:
        value = as_int(rank)
        if value is None:
            raise RankError(f"rank must be an int, got {shown(rank)}")
        local = value - self.rank_offset
        if not 0 <= local < self.size:
            raise RankError(
                f"rank {shown(rank)} is outside the grid: expected {self.rank_offset} <= rank < "
                f"{self.rank_offset + self.size}"
            )
        return local

    def contains(self, rank: int) -> bool:
        """Whether ``rank`` is one of the grid's ranks.

        Examples:
            >>> GridLayout([2, 2], ["tp", "dp"], rank_offset=4).contains(3)
            False
        """
        return is_int(rank) and self.rank_offset <= rank < self.rank_offset + self.size

    def coords_of(self, rank: int) -> tuple[int, ...]:
        """Coordinates of ``rank``, one per dim in ``dim_names`` order. O(ndim).

        Examples:
            >>> GridLayout([2, 3, 4], ["tp", "cp", "dp"]).coords_of(11)
            (1, 2, 1)
        """
        local = self._check_rank(rank)
        return tuple(local // stride % size for stride, size in zip(self.strides, self.shape))

    def rank_of(self, coords: Sequence[int]) -> int:
        """The rank at ``coords`` (one per dim, ``dim_names`` order). O(ndim).

        Raises:
            RankError: wrong number of coordinates, or one out of its dim's range.

        Examples:
            >>> GridLayout([2, 3, 4], ["tp", "cp", "dp"]).rank_of((1, 2, 1))
            11
        """
        if isinstance(coords, (str, bytes)) or not isinstance(coords, (Sequence, np.ndarray)):
            raise RankError(f"coords must be a sequence of {self.ndim} ints, got {shown(coords)}")
        values = list(coords)
        if len(values) != self.ndim:
            raise RankError(
                f"coords {shown(values)} has {len(values)} values; expected one per dim of {list(self.dim_names)}"
            )
        rank = self.rank_offset
        for name, value, size, stride in zip(self.dim_names, values, self.shape, self.strides):
            if not is_int(value) or not 0 <= value < size:
                raise RankError(f"coordinate {name}={shown(value)} is out of range: expected 0 <= {name} < {size}")
            rank += int(value) * stride
        return rank

    def coords_array(self, ranks: Sequence[int] | np.ndarray) -> np.ndarray:
        """Coordinates of many ranks at once: an int64 array of shape ``(len(ranks), ndim)``.

        Examples:
            >>> GridLayout([2, 3], ["tp", "dp"]).coords_array([0, 3, 5]).tolist()
            [[0, 0], [1, 1], [1, 2]]
        """
        local = int_array(ranks, 1, f"ranks must be a 1-D sequence of ints, got {shown(ranks)}")
        local = local.astype(np.int64) - self.rank_offset
        bad = (local < 0) | (local >= self.size)
        if bad.any():
            raise RankError(
                f"rank {int(local[bad][0]) + self.rank_offset} is outside the grid: expected "
                f"{self.rank_offset} <= rank < {self.rank_offset + self.size}"
            )
        strides = np.asarray(self.strides, dtype=np.int64)
        return local[:, None] // strides % np.asarray(self.shape, dtype=np.int64)

    def ranks_array(self, coords: Sequence[Sequence[int]] | np.ndarray) -> np.ndarray:
        """Ranks of many coordinates at once (rows in ``dim_names`` order).

        Examples:
            >>> GridLayout([2, 3], ["tp", "dp"]).ranks_array([[0, 0], [1, 2]]).tolist()
            [0, 5]
        """
        values = int_array(coords, 2, f"coords must be an (n, {self.ndim}) array of ints, got {shown(coords)}")
        if values.shape[1] != self.ndim:
            raise RankError(f"coords must be an (n, {self.ndim}) array of ints, got {shown(coords)}")
        shape = np.asarray(self.shape, dtype=np.int64)
        bad_rows = ((values < 0) | (values >= shape)).any(axis=1)
        if bad_rows.any():
            raise RankError(f"coordinates {values[bad_rows][0].tolist()} are out of range for shape {list(self.shape)}")
        return values.astype(np.int64) @ np.asarray(self.strides, dtype=np.int64) + self.rank_offset

    def group_ranks(self, dims: Dims, rank: int) -> list[int]:
        """The ranks of the group over ``dims`` that contains ``rank``.

        Computed in O(group size) from the rank's coordinates, without building
        the world array; equals the member of ``rank_enum`` holding ``rank``.

        Examples:
            >>> GridLayout([2, 2, 2], ["a", "b", "c"]).group_ranks(["a", "c"], rank=6)
            [2, 3, 6, 7]
        """
        local = self._check_rank(rank)
        members = [self.rank_offset + local]
        for i in self.dim_indices(dims):
            stride, size = self.strides[i], self.shape[i]
            base = [m - (local // stride % size) * stride for m in members]
            # Each outer dim repeats the block built so far: innermost fastest.
            members = [m + step * stride for step in range(size) for m in base]
        return members

    def group_index(self, dims: Dims, rank: int) -> int:
        """Position, in ``rank_enum``, of the group over ``dims`` holding ``rank``.

        Examples:
            >>> GridLayout([2, 2, 2], ["a", "b", "c"]).group_index(["a", "c"], rank=6)
            1
        """
        local = self._check_rank(rank)
        chosen = set(self.dim_indices(dims))
        index = 0
        for i in reversed(range(self.ndim)):  # outermost first: innermost fastest
            if i not in chosen:
                index = index * self.shape[i] + local // self.strides[i] % self.shape[i]
        return index
