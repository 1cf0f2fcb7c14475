"""Which tiers the groups of a family span: pure rank arithmetic over a layout and tier unit sizes.

A *unit* of tier ``k`` is a block of ``unit_ranks[k]`` consecutive ranks (a node
for the innermost tier of ``h100_8x``); the outermost tier has one unit holding
every rank. This module is the shared ground of the planner's cost model and of
placement reports: it says, for one family, how many units of each tier its
groups touch and how many members share one unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from hypergrid.errors import InvalidArgumentError, public
from hypergrid.layout import MAX_WORLD_SIZE, Dims, GridLayout
from hypergrid.validation import check_ints

__all__ = ["MAX_ENUMERATED_RANKS", "Span", "family_spans", "listed_ranks", "span_at", "span_key"]


@dataclass(frozen=True)
class Span:
    """How one family's groups sit on the tiers (one entry per tier, innermost first).

    Attributes:
        group_size: ranks per group.
        per_unit: the fewest members one group has inside one unit of each tier it
            touches (the last tier's entry is ``group_size``).
        units: the most units of each tier one group touches (the last entry is 1).
        spanned: whether some group has members in two different units of the tier
            below that share one unit of this tier: its messages cross this tier's
            links. For the innermost tier: whether a group has two members in one unit.

    Examples:
        >>> span = family_spans([4, 4], ["tp", "dp"], "dp", (8,))  # nodes of 8: dp has 2 members per node
        >>> span.per_unit, span.units, span.spanned, span.outermost
        ((2, 4), (2, 1), (True, True), 1)
    """

    group_size: int
    per_unit: tuple[int, ...]
    units: tuple[int, ...]
    spanned: tuple[bool, ...]

    @property
    def outermost(self) -> int | None:
        """Index of the outermost tier the groups span (``None`` for single-rank groups)."""
        spanned = [k for k, flag in enumerate(self.spanned) if flag]
        return spanned[-1] if spanned else None


def _aligned(shape: tuple[int, ...], chosen: tuple[int, ...], ranks: int) -> tuple[int, int] | None:
    """``(members per unit, units per group)`` when units of ``ranks`` ranks cut the grid along its dims.

    That is when ``ranks = shape[0] * ... * shape[p-1] * q`` with ``q`` dividing ``shape[p]``:
    a unit then holds the inner dims whole and ``q`` consecutive values of dim ``p``,
    the same for every group. ``None`` otherwise (the caller enumerates).
    """
    inner = 1  # ranks per step of dim p: the product of the inner sizes
    for p, size in enumerate(shape):
        if ranks <= inner * size:  # the unit boundary falls inside dim p
            q = ranks // inner
            if ranks % inner or size % q:
                return None
            members = math.prod(shape[i] for i in chosen if i < p) * (q if p in chosen else 1)
            units = math.prod(shape[i] for i in chosen if i > p) * (size // q if p in chosen else 1)
            return members, units
        inner *= size
    return math.prod(shape[i] for i in chosen), 1  # one unit holds the whole grid


def _analytic(shape: tuple[int, ...], chosen: tuple[int, ...], unit_ranks: tuple[int, ...]) -> Span | None:
    n = math.prod(shape[i] for i in chosen)
    cuts = [_aligned(shape, chosen, ranks) for ranks in unit_ranks]
    if any(cut is None for cut in cuts):
        return None
    per_unit = [cut[0] for cut in cuts if cut is not None]
    units = [cut[1] for cut in cuts if cut is not None]
    touched = [n, *units, 1]  # units of tier k-1 and of tier k each group touches
    spanned = tuple(touched[k] > touched[k + 1] for k in range(len(unit_ranks) + 1))
    return Span(n, (*per_unit, n), (*units, 1), spanned)


#: A grid whose tier units do not cut it along its dims is priced by listing its ranks: at most this many.
MAX_ENUMERATED_RANKS = 2**20


def span_key(shape: tuple[int, ...], chosen: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` and ``chosen`` without the dims of size 1, which change no rank's place (nor any span).

    The orders of a grid that differ only in where its size-1 dims sit have one
    key, so they share one `span_at` (the planner prices n! orders, and each
    distinct one may list up to `MAX_ENUMERATED_RANKS` ranks).

    Examples:
        >>> span_key((1, 4, 1, 2), (0, 1, 3))
        ((4, 2), (0, 1))
    """
    if 1 not in shape:
        return shape, chosen
    kept = [i for i, size in enumerate(shape) if size > 1]
    position = {i: k for k, i in enumerate(kept)}
    return tuple(shape[i] for i in kept), tuple(position[i] for i in chosen if i in position)


def listed_ranks(shape: tuple[int, ...], chosen: tuple[int, ...], unit_ranks: tuple[int, ...]) -> int:
    """How many ranks `span_at` lists for a `span_key` (0 where the units cut the grid along its dims).

    Examples:
        >>> listed_ranks((8, 4), (1,), (8,)), listed_ranks((3, 5), (1,), (8,))
        (0, 15)
    """
    return 0 if not chosen or _analytic(shape, chosen, unit_ranks) is not None else math.prod(shape)


@lru_cache(maxsize=65536)
def span_at(shape: tuple[int, ...], chosen: tuple[int, ...], unit_ranks: tuple[int, ...]) -> Span:
    """`family_spans` for validated input: the family over dim positions ``chosen`` (sorted) of ``shape``."""
    if not chosen:  # groups of one rank (every dim of the family has size 1)
        return Span(1, (1,) * (len(unit_ranks) + 1), (1,) * (len(unit_ranks) + 1), (False,) * (len(unit_ranks) + 1))
    fast = _analytic(shape, chosen, unit_ranks)
    if fast is not None:
        return fast
    if math.prod(shape) > MAX_ENUMERATED_RANKS:
        raise InvalidArgumentError(
            f"the units of {list(unit_ranks)} ranks do not cut the grid {list(shape)} along its dims, so pricing it "
            f"means listing every rank: at most {MAX_ENUMERATED_RANKS:,} ranks, got {math.prod(shape):,}"
        )
    names = [f"d{i}" for i in range(len(shape))]
    groups = GridLayout(shape, names).rank_enum_array([names[i] for i in chosen])
    count, n = groups.shape
    per_unit, units, spanned = [], [], []
    previous = np.full(count, n)  # units of "tier -1" a group touches: one per member
    for ranks in unit_ranks:
        ids = np.sort(groups // ranks, axis=1)
        change = np.diff(ids, axis=1) != 0
        current = 1 + change.sum(axis=1)  # units of this tier each group touches
        starts = np.flatnonzero(np.concatenate([np.ones((count, 1), bool), change], axis=1).ravel())
        per_unit.append(int(np.diff(np.append(starts, ids.size)).min()))  # shortest run of one unit id
        units.append(int(current.max()))
        # a group spans tier k when it touches more units of tier k-1 than of tier k
        spanned.append(bool((previous > current).any()))
        previous = current
    per_unit.append(n)
    units.append(1)
    spanned.append(bool((previous > 1).any()))
    return Span(n, tuple(per_unit), tuple(units), tuple(spanned))


@public
def family_spans(sizes: Sequence[int], dim_names: Sequence[str], dims: Dims, unit_ranks: Sequence[int]) -> Span:
    """Which tiers the family over ``dims`` spans in the grid ``sizes``/``dim_names`` (innermost first).

    Args:
        sizes: the grid's shape, innermost first.
        dim_names: the grid's dim names, innermost first (``HyperCommGrid``'s order).
        dims: the family: a dim name, a key such as ``"dp-tp"``, or a list of names.
        unit_ranks: ranks in one unit of each bounded tier, innermost first
            (`Topology.unit_ranks`, e.g. ``(8,)`` for 8-GPU nodes).

    Returns:
        A `Span` with one entry per tier (``len(unit_ranks) + 1`` tiers).

    Raises:
        GridSpecError: a bad grid.
        DimsError: ``dims`` not in the grid.

    Examples:
        >>> family_spans([8, 4], ["tp", "dp"], "tp", (8,)).spanned
        (True, False)
        >>> span = family_spans([8, 4], ["tp", "dp"], "dp", (8,))
        >>> span.spanned, span.units, span.per_unit
        ((False, True), (4, 1), (1, 4))
    """
    layout = GridLayout(sizes, dim_names)
    units = check_ints("family_spans", "unit_ranks", unit_ranks, 1, MAX_WORLD_SIZE, limit=64, ordered=True)
    return span_at(*span_key(layout.shape, layout.dim_indices(dims)), tuple(units))
