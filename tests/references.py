"""Independent references, one per seed system, in plain Python loops.

Each function re-derives a peer's groups from that peer's documented algorithm.
None of them imports hypergrid, numpy or einops: they share no code with the
library, so agreement is evidence and not an echo.
"""

from __future__ import annotations

import itertools


def _product(values: list[int]) -> int:
    total = 1
    for value in values:
        total *= value
    return total


# -- Megatron-Core RankGenerator: masked orthogonal rank groups (mixed radix) --------------


def megatron_rank_groups(order: str, sizes: dict[str, int], token: str) -> list[list[int]]:
    """Megatron's ``RankGenerator(order=...).get_ranks(token)``.

    ``order`` lists the dims innermost first (``"tp-cp-ep-dp-pp"``); ``token``
    names the dims of the family (``"tp-dp"``, any order). Ranks are mixed-radix
    numbers over the order; the token's dims form the digits inside a group
    (first digit fastest), the others number the groups (first fastest).
    """
    names = order.split("-")
    wanted = set(token.split("-"))
    place_values = []
    value = 1
    for name in names:
        place_values.append(value)
        value *= sizes[name]
    world = value
    inside = [(sizes[n], place_values[i]) for i, n in enumerate(names) if n in wanted]
    outside = [(sizes[n], place_values[i]) for i, n in enumerate(names) if n not in wanted]
    group_size = _product([size for size, _ in inside])

    def digits(index: int, radices: list[tuple[int, int]]) -> int:
        # Decompose ``index`` over the radices (first fastest), re-weight by place value.
        total = 0
        for size, place in radices:
            total += (index % size) * place
            index //= size
        return total

    groups = []
    for group_index in range(world // group_size):
        base = digits(group_index, outside)
        groups.append([base + digits(member, inside) for member in range(group_size)])
    return groups


# -- seed 000: hand-written tp/pp/dp triple loops (tp innermost) -------------------------


def seed000_groups(tp: int, pp: int, dp: int) -> dict[str, list[list[int]]]:
    """The three families of the hand-written ``ProcessGroups`` class."""
    families: dict[str, list[list[int]]] = {"tp": [], "pp": [], "dp": []}
    for d in range(dp):
        for p in range(pp):
            families["tp"].append([d * pp * tp + p * tp + t for t in range(tp)])
    for d in range(dp):
        for t in range(tp):
            families["pp"].append([d * pp * tp + p * tp + t for p in range(pp)])
    for p in range(pp):
        for t in range(tp):
            families["dp"].append([d * pp * tp + p * tp + t for d in range(dp)])
    return families


# -- seed 001: nanotron's 5-D array (ep, pp, dp, cp, tp) with cyclic transposes ----------


def nanotron_groups(ep: int, pp: int, dp: int, cp: int, tp: int) -> dict[str, list[list[int]]]:
    """nanotron's families, in nanotron's own group order.

    The rank at (e, p, d, c, t) is ``(((e*pp + p)*dp + d)*cp + c)*tp + t``. A
    single-dim family comes from a cyclic transpose that moves the dim last, so
    its groups run over the other axes in cyclic order; composite families loop
    as nanotron's list comprehensions do.
    """
    sizes = {"ep": ep, "pp": pp, "dp": dp, "cp": cp, "tp": tp}
    axes = ["ep", "pp", "dp", "cp", "tp"]

    def rank(coord: dict[str, int]) -> int:
        value = 0
        for axis in axes:
            value = value * sizes[axis] + coord[axis]
        return value

    def family(outer: list[str], members: list[str]) -> list[list[int]]:
        # ``outer``: the axes numbering the groups, slowest first;
        # ``members``: the axes inside a group, slowest first.
        groups = []
        for outer_values in itertools.product(*(range(sizes[a]) for a in outer)):
            group = []
            for member_values in itertools.product(*(range(sizes[a]) for a in members)):
                coord = dict(zip(outer, outer_values))
                coord.update(zip(members, member_values))
                group.append(rank(coord))
            groups.append(group)
        return groups

    families = {}
    for shift, name in enumerate(["tp", "cp", "dp", "pp", "ep"]):
        # transpose((4,0,1,2,3)) etc.: the axis order rotated right ``shift`` times.
        rotated = axes[len(axes) - shift :] + axes[: len(axes) - shift]
        families[name] = family([a for a in rotated if a != name], [name])
    families["mp"] = family(["cp", "dp"], ["ep", "pp", "tp"])
    families["dp_cp"] = family(["tp", "pp", "ep"], ["dp", "cp"])
    families["tp_and_ep"] = family(["cp", "pp", "dp"], ["ep", "tp"])
    return families


# -- seed 002: fairscale / ezpz, a (dp, pp, cp, tp) array with index loops ---------------


def ezpz_groups(tp: int, pp: int, cp: int, dp: int) -> dict[str, list[list[int]]]:
    """ezpz's ``initialize_tensor_parallel`` families over ``range(world).reshape(dp, pp, cp, tp)``."""

    def at(d: int, p: int, c: int, t: int) -> int:
        return ((d * pp + p) * cp + c) * tp + t

    families: dict[str, list[list[int]]] = {"dp": [], "tp": [], "pp": [], "cp": []}
    for i in range(pp):
        for j in range(cp):
            for k in range(tp):
                families["dp"].append([at(d, i, j, k) for d in range(dp)])
    for i in range(dp):
        for j in range(pp):
            for k in range(cp):
                families["tp"].append([at(i, j, k, t) for t in range(tp)])
    for i in range(dp):
        for j in range(cp):
            for k in range(tp):
                families["pp"].append([at(i, p, j, k) for p in range(pp)])
    for i in range(dp):
        for j in range(pp):
            for k in range(tp):
                families["cp"].append([at(i, j, c, k) for c in range(cp)])
    return families


# -- seed 004: DeepSpeed ProcessTopology, row-major, last axis fastest --------------------


def deepspeed_axis_comm_lists(axes: list[str], dims: list[int], axis: str) -> list[list[int]]:
    """DeepSpeed's ``ProcessTopology(axes, dims).get_axis_comm_lists(axis)``."""
    mapping = {}
    for global_rank, coord in enumerate(itertools.product(*(range(d) for d in dims))):
        mapping[coord] = global_rank
    position = axes.index(axis)
    others = [i for i in range(len(axes)) if i != position]
    lists = []
    for other_values in itertools.product(*(range(dims[i]) for i in others)):
        sub_list = []
        for value in range(dims[position]):
            coord = [0] * len(axes)
            for i, v in zip(others, other_values):
                coord[i] = v
            coord[position] = value
            sub_list.append(mapping[tuple(coord)])
        lists.append(sub_list)
    return lists


def deepspeed_get_coord(axes: list[str], dims: list[int], rank: int) -> dict[str, int]:
    """DeepSpeed's ``get_coord``: a scan over the row-major mapping."""
    for global_rank, coord in enumerate(itertools.product(*(range(d) for d in dims))):
        if global_rank == rank:
            return dict(zip(axes, coord))
    raise ValueError(f"rank {rank} not in topology")


def deepspeed_mapping(axes: list[str], dims: list[int]) -> dict[tuple[int, ...], int]:
    """DeepSpeed's coordinate -> rank mapping: the cartesian product, last axis fastest."""
    return {coord: rank for rank, coord in enumerate(itertools.product(*(range(d) for d in dims)))}


def deepspeed_filter_match(axes: list[str], dims: list[int], **criteria: int) -> list[int]:
    """DeepSpeed's ``filter_match``: scan every coordinate, keep the matching ranks."""
    return [
        rank
        for coord, rank in deepspeed_mapping(axes, dims).items()
        if all(coord[axes.index(axis)] == value for axis, value in criteria.items())
    ]


def deepspeed_rank_repr(axes: list[str], dims: list[int], rank: int, omit: list[str], inner: str, outer: str) -> str:
    """DeepSpeed's ``get_rank_repr``: ``axis{inner}{coord:02d}`` over the kept axes, outermost first."""
    coord = deepspeed_get_coord(axes, dims, rank)
    return outer.join(f"{axis}{inner}{coord[axis]:02d}" for axis in axes if axis not in omit)


def cart_shift(shape: list[int], rank: int, dim: int, disp: int, periodic: bool) -> tuple[int | None, int | None]:
    """MPI_Cart_shift by search: among all ranks, the one whose coordinates differ only along ``dim``."""
    world = _product(shape)

    def coords(r: int) -> list[int]:
        out = []
        for size in shape:
            out.append(r % size)
            r //= size
        return out

    mine = coords(rank)
    ends: list[int | None] = []
    for step in (-disp, disp):
        target = mine[dim] + step
        if periodic:
            target %= shape[dim]
        found = None
        for other in range(world):
            theirs = coords(other)
            if theirs[dim] == target and all(theirs[i] == mine[i] for i in range(len(shape)) if i != dim):
                found = other
        ends.append(found)
    return ends[0], ends[1]


def nodes_spanned(groups: list[list[int]], ranks_per_node: int) -> list[int]:
    """How many distinct nodes each group touches (node = rank // ranks_per_node)."""
    return [len({rank // ranks_per_node for rank in group}) for group in groups]


def node_halves(group: list[int], per_node: int) -> tuple[list[list[int]], list[list[int]]]:
    """A group's hierarchy by definition (nodes: ``rank // per_node``), as Megatron's hierarchical groups cut it.

    Within: its members on each node (ascending). Across: for each position, the
    members at that position among their node's members (only positions every
    node's part has).
    """
    parts: dict[int, list[int]] = {}
    for rank in sorted(group):
        parts.setdefault(rank // per_node, []).append(rank)
    within = list(parts.values())
    width = min(len(part) for part in within)
    return within, [[part[index] for part in within] for index in range(width)]
