"""DeepSpeed's ``ProcessTopology`` family, computed by hypergrid's layout.

DeepSpeed numbers ranks row-major with the **last** axis fastest, so a
topology's ``axes`` are hypergrid's ``dim_names`` reversed. Answers match
DeepSpeed's, including its lenient ones (an absent axis gives ``0`` / ``[]``);
the differences are listed in ``hypergrid.compat.deepspeed``.

Examples:
    >>> topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    >>> topo.get_axis_comm_lists("pipe")
    [[0, 4], [1, 5], [2, 6], [3, 7]]
    >>> topo.filter_match(pipe=0, data=1), topo.get_coord(rank=1)
    ([2, 3], ProcessCoord(pipe=0, data=0, model=1))
    >>> topo.get_dim("tensor"), topo.get_axis_comm_lists("tensor")
    (0, [])
"""

from __future__ import annotations

import itertools
import keyword
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

import numpy as np

from hypergrid.errors import DimsError, GridSpecError, InvalidArgumentError
from hypergrid.layout import GridLayout
from hypergrid.layout.spec import MAX_WORLD_SIZE
from hypergrid.validation import check_int, check_ints, public, public_methods, refuse
from hypergrid.values import is_int, shown

__all__ = ["PipeDataParallelTopology", "PipeModelDataParallelTopology", "ProcessTopology", "_prime_factors"]


def _check_axes(axes: object) -> list[str]:
    """``axes`` as a list of distinct axis names (identifiers), else refused naming ``axes``."""
    if not isinstance(axes, (list, tuple)):
        raise refuse("", "axes", axes, "a list of axis names", DimsError)
    for axis in axes:
        if not (isinstance(axis, str) and axis.isidentifier()) or keyword.iskeyword(axis) or axis.startswith("_"):
            raise refuse("", "axes", axes, f"a list of axis names (identifiers); {shown(axis)} is not", GridSpecError)
    if len(set(axes)) != len(axes):
        raise refuse("", "axes", axes, "distinct axis names", GridSpecError)
    return list(axes)


@public_methods
class ProcessTopology:
    """Named Cartesian coordinates over ranks with DeepSpeed's API (row-major, last axis fastest).

    Args:
        axes: axis names, outermost first (DeepSpeed's order).
        dims: size of each axis.

    Raises:
        DimsError: ``axes`` or ``dims`` is not a list (a string, a set, ...).
        GridSpecError: bad sizes or names (DeepSpeed accepts them and fails later).

    Examples:
        >>> topo = ProcessTopology(axes=["x", "y"], dims=[2, 3])
        >>> topo.world_size(), topo.layout.dim_names
        (6, ('y', 'x'))
    """

    def __init__(self, axes: Sequence[str], dims: Sequence[int]) -> None:
        self.axes = _check_axes(axes)
        if not isinstance(dims, (list, tuple, range, np.ndarray)):
            raise refuse("", "dims", dims, "a list of sizes, one per axis", DimsError)
        self.dims = check_ints("", "dims", dims, 1, MAX_WORLD_SIZE, ordered=True, error=GridSpecError)
        if len(self.dims) != len(self.axes):
            raise refuse("", "dims", dims, f"{len(self.axes)} sizes, one per axis of {shown(self.axes)}", GridSpecError)
        self.layout = GridLayout(self.dims[::-1], self.axes[::-1])
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)  # type: ignore[misc]

    def _known(self, axis: str) -> str:
        if axis not in self.axes:
            raise DimsError(f"unknown axis {shown(axis)}; this topology has axes {self.axes}")
        return axis

    @property
    def mapping(self) -> dict[Any, int]:
        """DeepSpeed's ``ProcessCoord -> rank`` dict, built on each access (O(world)).

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[1, 2]).mapping
            {ProcessCoord(x=0, y=0): 0, ProcessCoord(x=0, y=1): 1}
        """
        ranges = [range(size) for size in self.dims]
        return {
            self.ProcessCoord(**dict(zip(self.axes, coord))): rank
            for rank, coord in enumerate(itertools.product(*ranges))
        }

    def get_rank(self, **coord_kwargs: int) -> int:
        """The rank at the given coordinates (every axis required; ``filter_match`` takes slices).

        Raises:
            RankError: (a ``ValueError``) an axis missing or unknown, or a coordinate out of range.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_rank(x=0, y=1)
            1
        """
        return self.layout.rank_at(**coord_kwargs)

    def get_axis_names(self) -> list[str]:
        """The axis names, outermost first.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_axis_names()
            ['x', 'y']
        """
        return list(self.axes)

    def get_rank_repr(
        self, rank: int, omit_axes: Sequence[str] = ("data", "pipe"), inner_sep: str = "_", outer_sep: str = "-"
    ) -> str:
        """A name for ``rank`` for checkpoint files, e.g. ``'model_01'``.

        Axes in ``omit_axes`` that this topology lacks are ignored, as in DeepSpeed.

        Examples:
            >>> ProcessTopology(axes=["a", "b"], dims=[2, 2]).get_rank_repr(rank=3)
            'a_01-b_01'
        """
        omit = [axis for axis in omit_axes if axis in self.axes]
        return self.layout.rank_repr(rank, omit, inner_sep, outer_sep)

    def get_dim(self, axis: str) -> int:
        """The number of processes along ``axis``; ``0`` for an axis the topology lacks.

        Examples:
            >>> topo = ProcessTopology(axes=["x", "y"], dims=[2, 3])
            >>> topo.get_dim("y"), topo.get_dim("model")
            (3, 0)
        """
        return self.layout.dim_size(axis) if axis in self.axes else 0

    def get_coord(self, rank: int) -> Any:
        """The coordinates of ``rank`` as a ``ProcessCoord`` (fields in axis order). O(ndim).

        Raises:
            RankError: (a ``ValueError``, as in DeepSpeed) ``rank`` is not in the topology.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_coord(rank=4)
            ProcessCoord(x=1, y=1)
        """
        named = self.layout.coord_of(rank)._asdict()
        return self.ProcessCoord(**{axis: named[axis] for axis in self.axes})

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """The groups of ranks that differ only along ``axis``; ``[]`` for an axis the topology lacks.

        Examples:
            >>> topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2])
            >>> topo.get_axis_comm_lists("model"), topo.get_axis_comm_lists("jeff")
            ([[0, 1], [2, 3], [4, 5], [6, 7]], [])
        """
        return self.layout.rank_enum(axis) if axis in self.axes else []

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        """The ranks whose coordinates match every given axis value, ascending. O(matches).

        A value outside its axis matches nothing (``[]``), as in DeepSpeed.

        Raises:
            DimsError: an axis the topology lacks (DeepSpeed raises ``AttributeError``).

        Examples:
            >>> topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2])
            >>> topo.filter_match(model=1), topo.filter_match(pipe=5)
            ([1, 3, 5, 7], [])
        """
        for axis, value in filter_kwargs.items():
            if not (is_int(value) and 0 <= value < self.get_dim(self._known(axis))):
                return []
        free = [axis for axis in self.axes if axis not in filter_kwargs]
        ranks = []
        for values in itertools.product(*(range(self.get_dim(axis)) for axis in free)):
            ranks.append(self.layout.rank_at(**filter_kwargs, **dict(zip(free, values))))
        return sorted(ranks)

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """The ranks whose coordinate along ``axis`` is ``idx`` (``[]`` when ``idx`` is out of range).

        Raises:
            DimsError: (a ``ValueError``, as in DeepSpeed) an axis the topology lacks.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_axis_list(axis="y", idx=0)
            [0, 3]
        """
        return self.filter_match(**{self._known(axis): idx})

    def world_size(self) -> int:
        """The number of ranks.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).world_size()
            6
        """
        return self.layout.size

    def __str__(self) -> str:
        return f"ProcessTopology(axes={self.axes}, dims={self.dims})"


@public
def _prime_factors(N: int) -> list[int]:
    """The prime factors of ``N`` in ascending order, with repeats (``[]`` for 1).

    Raises:
        InvalidArgumentError: (a ``ValueError``, as in DeepSpeed) ``N`` is not a positive int.

    Examples:
        >>> _prime_factors(12), _prime_factors(1)
        ([2, 2, 3], [])
    """
    if not is_int(N) or N <= 0:
        raise InvalidArgumentError(f"_prime_factors needs a strictly positive int, got {shown(N)}")
    factors, rest, candidate = [], int(N), 2
    while candidate * candidate <= rest:
        while rest % candidate == 0:
            factors.append(candidate)
            rest //= candidate
        candidate += 1
    if rest > 1:
        factors.append(rest)
    return factors


@public_methods
class PipeDataParallelTopology(ProcessTopology):
    """DeepSpeed's pipe x data topology: axes ``["pipe", "data"]`` (data fastest).

    Examples:
        >>> PipeDataParallelTopology(num_pp=2, num_dp=3).get_axis_comm_lists("pipe")
        [[0, 3], [1, 4], [2, 5]]
    """

    def __init__(self, num_pp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data"], dims=[_size("num_pp", num_pp), _size("num_dp", num_dp)])


@public_methods
class PipeModelDataParallelTopology(ProcessTopology):
    """DeepSpeed's pipe x data x model topology: axes ``["pipe", "data", "model"]`` (model fastest).

    Examples:
        >>> PipeModelDataParallelTopology(num_pp=1, num_mp=2, num_dp=2).dims
        [1, 2, 2]
    """

    def __init__(self, num_pp: int, num_mp: int, num_dp: int) -> None:
        sizes = [_size("num_pp", num_pp), _size("num_dp", num_dp), _size("num_mp", num_mp)]
        super().__init__(axes=["pipe", "data", "model"], dims=sizes)


def _size(argument: str, value: object) -> int:
    return check_int("", argument, value, 1, MAX_WORLD_SIZE, GridSpecError)
