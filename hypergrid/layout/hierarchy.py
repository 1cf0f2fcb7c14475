"""Hierarchical families: each group of a family cut by node, as a family of a finer layout (pure).

A node is a block of ``ranks_per_node`` consecutive global ranks. When node boundaries cut the grid along its dims,
the grid is the same ranks as a finer layout in which one dim is split in two (`node_split`), and a family's
``within`` (its members on one node) and ``across`` (those with the same position on each node) halves are
ordinary families of it, created, guarded and shared like any other: docs/hierarchy.md ("How they are built").

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> grid = GridLayout([2, 4], ["tp", "dp"])  # 2 nodes of 4 ranks: dp splits 2 x 2
    >>> fine, dims = hierarchical_family(grid, ["dp"], "within", 4)
    >>> fine.rank_enum(dims)
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    >>> fine, dims = hierarchical_family(grid, ["dp"], "across", 4)
    >>> fine.rank_enum(dims)
    [[0, 4], [1, 5], [2, 6], [3, 7]]
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from functools import lru_cache

from hypergrid.errors import InvalidArgumentError, WorldSizeError
from hypergrid.layout import MAX_WORLD_SIZE, Dims, GridLayout
from hypergrid.validation import check_choice, check_int, refuse
from hypergrid.values import shown

__all__ = ["SCOPES", "NodeSplit", "hierarchical_family", "node_size", "node_split", "resolve_scope"]

#: The two halves of a hierarchical family: ``within`` a node and ``across`` nodes.
SCOPES = ("within", "across")

#: The only level a hierarchy is cut at today: the node (``ranks_per_node`` consecutive ranks).
LEVELS = ("node",)


def resolve_scope(within: object, across: object) -> str | None:
    """``"within"``, ``"across"`` or ``None`` from the ``within=`` / ``across=`` arguments.

    Raises:
        InvalidArgumentError: both given, or a level other than ``"node"``.

    Examples:
        >>> resolve_scope("node", None), resolve_scope(None, "node"), resolve_scope(None, None)
        ('within', 'across', None)
    """
    if within is not None and across is not None:
        raise InvalidArgumentError(
            f"give within= or across=, not both (got within={shown(within)}, across={shown(across)}): "
            "they are the two halves of one hierarchy, created as two families"
        )
    for scope, level in (("within", within), ("across", across)):
        if level is None:
            continue
        if not isinstance(level, str) or level not in LEVELS:
            raise refuse("", scope, level, " or ".join(repr(name) for name in LEVELS) + " (a level's name) or None")
        return scope
    return None


def node_size(value: int | None) -> int:
    """Ranks per node: ``value``, or ``LOCAL_WORLD_SIZE`` (set by ``torchrun``) when ``value`` is None.

    Raises:
        WorldSizeError: neither is given, ``LOCAL_WORLD_SIZE`` is not an int, or
            the result is not a positive int.

    Examples:
        >>> import numpy as np
        >>> node_size(4), node_size(np.int64(4))
        (4, 4)
    """
    if value is None:
        text = os.environ.get("LOCAL_WORLD_SIZE")
        if text is None:
            raise WorldSizeError("ranks_per_node not given and LOCAL_WORLD_SIZE is not set")
        try:
            value = int(text)
        except ValueError:
            raise WorldSizeError(f"LOCAL_WORLD_SIZE={shown(text)} is not an int") from None
        if value < 1:
            raise WorldSizeError(f"LOCAL_WORLD_SIZE={shown(text)} is not a positive int (ranks per node)")
    return check_int("", "ranks_per_node", value, 1, MAX_WORLD_SIZE, WorldSizeError)


class NodeSplit:
    """A layout with node boundaries made explicit: one dim split into its intra- and inter-node parts.

    Attributes:
        layout: the finer layout (same ranks, same order).
        inner: for each dim of the original layout, its dims in the finer layout inside a node.
        outer: the same, across nodes.
        single: a size-1 dim of the finer layout (what a half with no dims enumerates: one rank per group).
    """

    def __init__(self, layout: GridLayout, inner: dict[str, tuple[str, ...]], outer: dict[str, tuple[str, ...]]):
        self.layout = layout
        self.inner = inner
        self.outer = outer
        self.single = layout.dim_names[-1]


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "x"
    taken.add(name)
    return name


def node_split(layout: GridLayout, ranks_per_node: int) -> NodeSplit:
    """Split the dim of ``layout`` that node boundaries cut, so that nodes are blocks of the finer layout.

    Raises:
        InvalidArgumentError: ``ranks_per_node`` is not a positive int, or node
            boundaries do not cut the grid along its dims (the grid starts inside
            a node and spans several, or a node ends part-way through a step of a
            dim): groups would sit on nodes unevenly.

    Examples:
        >>> split = node_split(GridLayout([2, 2, 4], ["tp", "cp", "dp"]), 8)
        >>> split.layout.dim_names, split.layout.shape
        (('tp', 'cp', 'dp_intra', 'dp_inter', 'single'), (2, 2, 2, 2, 1))
        >>> split.inner["dp"], split.outer["dp"], split.outer["tp"]
        (('dp_intra',), ('dp_inter',), ())
    """
    per_node = check_int("", "ranks_per_node", ranks_per_node, 1, MAX_WORLD_SIZE)
    return _node_split(layout, per_node)  # validated first: the cache would take True for 1


@lru_cache(maxsize=64)
def _node_split(layout: GridLayout, per_node: int) -> NodeSplit:
    first, last = layout.rank_offset, layout.rank_offset + layout.size - 1
    if first // per_node == last // per_node:
        per_node = layout.size  # the whole grid sits on one node
    elif first % per_node:
        raise InvalidArgumentError(
            f"the grid starts at rank {first}, inside a node of {per_node} ranks, and spans several nodes: "
            f"node boundaries do not cut it along its dims; start it at a multiple of {per_node}"
        )
    taken = set(layout.dim_names)
    names: list[str] = []
    shape: list[int] = []
    inner: dict[str, tuple[str, ...]] = {}
    outer: dict[str, tuple[str, ...]] = {}
    below = 1  # ranks per step of the current dim
    for name, size in zip(layout.dim_names, layout.shape):
        if below * size <= per_node:  # wholly inside a node
            inner[name], outer[name] = (name,), ()
            names.append(name)
            shape.append(size)
        elif below >= per_node:  # wholly across nodes
            inner[name], outer[name] = (), (name,)
            names.append(name)
            shape.append(size)
        else:  # the node boundary falls inside this dim
            q = per_node // below
            if per_node % below or size % q:
                raise InvalidArgumentError(
                    f"nodes of {per_node} ranks do not cut grid {list(layout.shape)} {list(layout.dim_names)} "
                    f"along its dims: a node holds {per_node / below:g} steps of {shown(name)} (size {size}), "
                    f"which needs a whole number dividing {size}; groups would sit on nodes unevenly"
                )
            intra, inter = _fresh(f"{name}_intra", taken), _fresh(f"{name}_inter", taken)
            inner[name], outer[name] = (intra,), (inter,)
            names += [intra, inter]
            shape += [q, size // q]
        below *= size
    names.append(_fresh("single", taken))
    shape.append(1)
    assert math.prod(shape) == layout.size
    return NodeSplit(GridLayout(shape, names, layout.rank_offset), inner, outer)


def hierarchical_family(
    layout: GridLayout, dims: Dims, scope: str, ranks_per_node: int
) -> tuple[GridLayout, tuple[str, ...]]:
    """The finer layout and its dims whose family is the ``scope`` half of the family over ``dims``.

    ``within``: each group's members on one node; ``across``: the members with
    the same position on each node. A half with no dims is one rank per group.

    Raises:
        DimsError: unknown, repeated or no dims.
        InvalidArgumentError: a bad ``scope`` or ``ranks_per_node`` (see ``node_split``).

    Examples:
        >>> grid = GridLayout([4, 2], ["tp", "dp"])
        >>> fine, dims = hierarchical_family(grid, "tp-dp", "across", 4)
        >>> dims, fine.rank_enum(dims)
        (('dp',), [[0, 4], [1, 5], [2, 6], [3, 7]])
        >>> hierarchical_family(grid, "tp", "across", 4)[0].rank_enum(("single",))[:2]
        [[0], [1]]
    """
    check_choice("", "scope", scope, SCOPES)
    ordered = layout.canonical_dims(dims)
    split = node_split(layout, ranks_per_node)
    parts = split.inner if scope == "within" else split.outer
    chosen: Sequence[str] = [name for dim in ordered for name in parts[dim]]
    return split.layout, tuple(chosen) or (split.single,)
