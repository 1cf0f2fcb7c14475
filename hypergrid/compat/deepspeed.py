"""DeepSpeed's ``ProcessTopology``, on hypergrid's layout.

DeepSpeed lays ranks out row-major with the **last** axis fastest, so its
``axes`` are hypergrid's ``dim_names`` reversed. Same results as DeepSpeed's
docstring examples; ``get_coord`` is O(ndim) instead of a scan of every rank,
``filter_match`` O(matches), and unknown axes raise instead of answering ``[]``/``0``.

Examples:
    >>> topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    >>> topo.get_axis_comm_lists("pipe")
    [[0, 4], [1, 5], [2, 6], [3, 7]]
    >>> topo.filter_match(pipe=0, data=1)
    [2, 3]
    >>> topo.get_coord(rank=1)
    ProcessCoord(pipe=0, data=0, model=1)
    >>> topo.get_rank_repr(rank=3)
    'model_01'
"""

from __future__ import annotations

import itertools
from collections import namedtuple
from collections.abc import Sequence
from typing import Any

from hypergrid.errors import DimsError, RankError
from hypergrid.layout import GridLayout

__all__ = ["ProcessTopology", "PipeDataParallelTopology", "PipeModelDataParallelTopology"]


class ProcessTopology:
    """Named Cartesian coordinates over ranks, DeepSpeed's API (row-major, last axis fastest).

    Args:
        axes: axis names, outermost first (DeepSpeed's order).
        dims: size of each axis.
    """

    def __init__(self, axes: Sequence[str], dims: Sequence[int]) -> None:
        if isinstance(axes, str) or isinstance(dims, (str, bytes)):
            raise DimsError(f"axes and dims must be lists, got axes={axes!r}, dims={dims!r}")
        self.axes = list(axes)
        self.dims = list(dims)
        self.layout = GridLayout(self.dims[::-1], self.axes[::-1])
        self.ProcessCoord = namedtuple("ProcessCoord", self.axes)  # type: ignore[misc]

    def _axis(self, axis: str) -> str:
        if axis not in self.axes:
            raise DimsError(f"unknown axis {axis!r}; this topology has axes {self.axes}")
        return axis

    def get_rank(self, **coord_kwargs: int) -> int:
        """The rank at the given coordinates (every axis required; use ``filter_match`` for slices).

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_rank(x=0, y=1)
            1
        """
        return self.layout.rank_at(**coord_kwargs)

    def get_axis_names(self) -> list[str]:
        """The axis names, outermost first."""
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
        """The number of processes along ``axis``.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_dim("y")
            3
        """
        return self.layout.dim_size(self._axis(axis))

    def get_coord(self, rank: int) -> Any:
        """The coordinates of ``rank`` as a ``ProcessCoord`` (fields in axis order). O(ndim).

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_coord(rank=4)
            ProcessCoord(x=1, y=1)
        """
        named = self.layout.coord_of(rank)._asdict()
        return self.ProcessCoord(**{axis: named[axis] for axis in self.axes})

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """The groups of ranks that differ only along ``axis``.

        Examples:
            >>> ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2]).get_axis_comm_lists("model")
            [[0, 1], [2, 3], [4, 5], [6, 7]]
        """
        return self.layout.rank_enum(self._axis(axis))

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        """The ranks whose coordinates match every given axis value, ascending. O(matches).

        Examples:
            >>> ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2]).filter_match(model=1)
            [1, 3, 5, 7]
        """
        for axis, value in filter_kwargs.items():
            size = self.get_dim(axis)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
                raise RankError(f"coordinate {axis}={value!r} is out of range: expected 0 <= {axis} < {size}")
        free = [axis for axis in self.axes if axis not in filter_kwargs]
        ranks = []
        for values in itertools.product(*(range(self.get_dim(axis)) for axis in free)):
            ranks.append(self.layout.rank_at(**filter_kwargs, **dict(zip(free, values))))
        return sorted(ranks)

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        """The ranks whose coordinate along ``axis`` is ``idx``.

        Examples:
            >>> ProcessTopology(axes=["x", "y"], dims=[2, 3]).get_axis_list(axis="y", idx=0)
            [0, 3]
        """
        return self.filter_match(**{self._axis(axis): idx})

    def world_size(self) -> int:
        """The number of ranks."""
        return self.layout.size

    def __str__(self) -> str:
        return f"ProcessTopology(axes={self.axes}, dims={self.dims})"


class PipeDataParallelTopology(ProcessTopology):
    """DeepSpeed's pipe x data topology (data fastest)."""

    def __init__(self, num_pp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """DeepSpeed's pipe x data x model topology (model fastest)."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])
