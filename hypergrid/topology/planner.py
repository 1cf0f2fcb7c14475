"""`plan`: price every order of the dims on a `Topology` and rank the orders, fastest first."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypergrid.cluster.spans import listed_ranks, span_at, span_key
from hypergrid.cluster.tiers import Topology
from hypergrid.errors import DimsError, GridSpecError, InvalidArgumentError, public
from hypergrid.layout import GridLayout
from hypergrid.topology.cost import seconds_of
from hypergrid.topology.traffic import Traffic
from hypergrid.validation import check_bool
from hypergrid.values import is_int, shown

__all__ = ["MAX_PLAN_DIMS", "MAX_PLAN_LISTED_RANKS", "MAX_PLAN_ORDERS", "MAX_PLAN_PRICES", "Plan", "plan"]

#: ``plan`` prices n! orders: it refuses more dims than this (8! = 40,320 orders).
MAX_PLAN_DIMS = 8

#: ``plan`` refuses to price more orders than this in one call (split orders included): about
#: 2 s on one core (22 us per order with three traffic entries, measured on the 2-core box).
MAX_PLAN_ORDERS = 100_000

#: Where a tier's units do not cut the grid along its dims, a family's span is found by listing its
#: ranks, once per distinct order of the dims larger than 1: ``plan`` refuses to list more ranks than
#: this in one call (0.3 to 2 s at 20 to 120 ns a rank on the shared 2-core box; a listing counts 4,096 at least).
MAX_PLAN_LISTED_RANKS = 2**24

#: ``plan`` refuses to price more than this many (order, traffic entry) pairs in one call: 1 to 5 s
#: on the shared 2-core box.
MAX_PLAN_PRICES = 2**21

#: Suffixes of the two parts of a dim split across a tier boundary (``split=True``).
INTRA, INTER = "_intra", "_inter"


@dataclass(frozen=True)
class Plan:
    """One order of the dims and what the traffic costs in it.

    Attributes:
        order: dim names, innermost first (``HyperCommGrid``'s ``dim_names``).
        shape: their sizes, in the same order.
        seconds: the sum of ``families``.
        families: each traffic entry's dims (as written, lists joined with ``-``) to its
            seconds (entries on the same dims add up).
        split: for a hybrid plan, the split dim to its two parts (``{"dp": ("dp_intra",
            "dp_inter")}``); traffic on ``dp`` runs over both. Empty otherwise.
    """

    order: tuple[str, ...]
    shape: tuple[int, ...]
    seconds: float
    families: dict[str, float]
    split: dict[str, tuple[str, str]] = field(default_factory=dict)

    def to_grid(self, **kwargs: Any) -> Any:
        """Build the ``HyperCommGrid`` of this order (imports torch).

        Args:
            **kwargs: passed to ``HyperCommGrid`` (``rank_offset``, ``backend``, ...).

        Returns:
            ``HyperCommGrid(list(self.shape), list(self.order), **kwargs)``.

        Examples:
            >>> best = plan({"tp": 2, "dp": 2}, [Traffic("tp", "all_reduce", 1e6)], "h100_8x")[0]
            >>> best.to_grid().shape
            [2, 2]
        """
        from hypergrid.grid import HyperCommGrid

        return HyperCommGrid(list(self.shape), list(self.order), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON: order, shape, seconds, families, split.

        Examples:
            >>> plan({"tp": 2}, [], "h100_8x")[0].to_dict()
            {'order': ['tp'], 'shape': [2], 'seconds': 0.0, 'families': {}, 'split': {}}
        """
        return {
            "order": list(self.order),
            "shape": list(self.shape),
            "seconds": self.seconds,
            "families": dict(self.families),
            "split": {dim: list(parts) for dim, parts in self.split.items()},
        }


def _check_sizes(sizes: object) -> dict[str, int]:
    if not isinstance(sizes, Mapping) or not sizes:
        raise GridSpecError(f"sizes must be a non-empty dict of dim name to size, got {shown(sizes)}")
    for name, size in sizes.items():
        if not is_int(size) or size < 1:
            raise GridSpecError(f"size of dim {shown(name)} must be a positive int, got {shown(size)}")
    if len(sizes) > MAX_PLAN_DIMS:
        raise InvalidArgumentError(
            f"plan prices every order of the dims (n!): at most {MAX_PLAN_DIMS} dims, got {len(sizes)} ({list(sizes)})"
        )
    checked = {name: int(size) for name, size in sizes.items()}
    GridLayout(list(checked.values()), list(checked))  # dim names, and a world of at most 2**31-1 ranks
    return checked


def _check_traffic(traffic: object, sizes: Mapping[str, int]) -> list[Traffic]:
    entries = [traffic] if isinstance(traffic, Traffic) else traffic
    if isinstance(entries, (str, bytes)) or not isinstance(entries, Iterable):
        raise InvalidArgumentError(f"traffic must be a Traffic or a list of Traffic, got {shown(traffic)}")
    out = []
    for entry in entries:
        if not isinstance(entry, Traffic):
            raise InvalidArgumentError(f"traffic entries must be Traffic objects, got {shown(entry)}")
        unknown = [d for d in entry.dims if d not in sizes]
        if unknown:
            raise DimsError(f"traffic on {shown(entry.key)} names dim(s) {unknown} not in sizes {list(sizes)}")
        out.append(entry)
    return out


@dataclass
class _Pricing:
    """One ``plan`` call's prices: the entries on each family summed, on each distinct `span_key` priced once.

    Also counts the ranks listed to price unaligned grids (at most `MAX_PLAN_LISTED_RANKS`).
    """

    sizes: dict[str, int]
    traffic: list[Traffic]
    topology: Topology
    seconds: dict[tuple[int, tuple[tuple[int, ...], tuple[int, ...]]], float] = field(default_factory=dict)
    grids: set[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=set)
    listed: int = 0

    def __post_init__(self) -> None:
        by_key: dict[str, list[Traffic]] = {}
        for entry in self.traffic:
            by_key.setdefault(entry.key, []).append(entry)
        #: The families traffic runs on: key (as written), dims, entries (entries on one key are summed).
        self.groups = [(key, entries[0].dims, entries) for key, entries in by_key.items()]

    def families(self, position: dict[str, int], shape: tuple[int, ...], members: list[list[str]]) -> dict[str, float]:
        """Each family's key to its seconds in an order (``position``: each dim's place in it).

        ``members``: each of ``groups``' dims in this grid (a split dim stands for its two parts).
        """
        families: dict[str, float] = {}
        for index, (name, _, entries) in enumerate(self.groups):
            key = span_key(shape, tuple(sorted(position[dim] for dim in members[index])))
            seconds = self.seconds.get((index, key))
            if seconds is None:
                seconds = self.seconds[index, key] = self._price(entries, key)
            families[name] = seconds
        return families

    def _price(self, entries: list[Traffic], key: tuple[tuple[int, ...], tuple[int, ...]]) -> float:
        units = self.topology.unit_ranks
        span = span_at(*key, units)  # refuses a grid too large to list before listing it
        if key not in self.grids:  # one listing serves every family over the same dims of the same grid
            self.grids.add(key)
            listed = listed_ranks(*key, units)
            self.listed += max(listed, 4096) if listed else 0
            if self.listed > MAX_PLAN_LISTED_RANKS:
                raise InvalidArgumentError(
                    f"plan would list more than {MAX_PLAN_LISTED_RANKS:,} ranks to price the orders of {self.sizes}: "
                    f"the units of {list(units)} ranks do not cut these grids along their dims; give sizes "
                    "that the units divide, fewer dims larger than 1, or plan without split=True (--split)"
                )
        total = 0.0
        for entry in entries:
            total += entry.calls * seconds_of(entry.op, entry.bytes, span, self.topology) if entry.calls else 0.0
            if not math.isfinite(total):  # figures at the ends of the float range (1e300 bytes over 1e-300 B/s)
                raise InvalidArgumentError(
                    f"traffic {entry.op} on {shown(entry.key)} ({entry.bytes:g} bytes, {entry.calls} calls) costs "
                    f"more seconds than a float holds on tiers "
                    f"{[(t.name, t.bandwidth, t.latency) for t in self.topology.tiers]}; "
                    "check the units of bytes, bandwidth (bytes/s) and latency (s)"
                )
        return total


def _proper_divisors(size: int) -> list[int]:
    """The divisors of ``size`` other than 1 and itself, ascending (O(sqrt(size)) steps)."""
    small = [d for d in range(2, math.isqrt(size) + 1) if size % d == 0]
    return sorted({*small, *(size // d for d in small)} - {size})


def _splits(sizes: dict[str, int]) -> Iterable[tuple[str, dict[str, int]]]:
    """Each dim split in two (``<dim>_intra`` x ``<dim>_inter``) at each proper divisor."""
    for dim, size in sizes.items():
        for inner in _proper_divisors(size):
            parts = {f"{dim}{INTRA}": inner, f"{dim}{INTER}": size // inner}
            clash = sorted(set(parts) & set(sizes))
            if clash:
                raise DimsError(f"split=True names the parts of {shown(dim)} {clash}, which are already dims in sizes")
            yield dim, {**{d: s for d, s in sizes.items() if d != dim}, **parts}


def _count_orders(sizes: dict[str, int], split: bool) -> int:
    """How many orders ``plan`` would price: n!, plus n!(n-1)/2 per split (intra at least two places inside inter)."""
    n = len(sizes)
    splits = sum(len(_proper_divisors(size)) for size in sizes.values()) if split else 0
    return math.factorial(n) + splits * math.factorial(n) * (n - 1) // 2


@public
def plan(
    sizes: Mapping[str, int], traffic: Traffic | Iterable[Traffic], topology: Topology | str, split: bool = False
) -> list[Plan]:
    """Price every order of the dims on ``topology`` and return the plans, fastest first.

    Args:
        sizes: dim name to size, in the grid's dim order (ties keep the order given).
        traffic: the `Traffic` entries to price (e.g. `llm_step_traffic`).
        topology: a `Topology` or a preset name (``"h100_8x"``).
        split: also consider each dim split into ``<dim>_intra`` (inner) and
            ``<dim>_inter`` (outer) at each proper divisor of its size: hybrid meshes.

    Returns:
        One `Plan` per order (n!, plus the split orders), sorted by ``seconds``; equal
        seconds keep the enumeration order (unsplit orders first).

    Raises:
        GridSpecError: empty sizes, a size that is not a positive int, a bad dim name.
        InvalidArgumentError: more than 8 dims (9 with a split dim), more than
            `MAX_PLAN_ORDERS` orders or `MAX_PLAN_PRICES` (order, entry) pairs to
            price, more than `MAX_PLAN_LISTED_RANKS` ranks
            to list (tiers whose units do not cut the grids along their dims), a bad
            topology or traffic, or figures whose cost a float cannot hold.
        DimsError: traffic on a dim not in ``sizes``.

    Examples:
        >>> traffic = [Traffic("tp", "all_reduce", 64e6, calls=200), Traffic("dp", "all_reduce", 1e9)]
        >>> plans = plan({"tp": 8, "dp": 16}, traffic, "h100_8x")
        >>> [(p.order, round(p.seconds, 3)) for p in plans]
        [(('tp', 'dp'), 0.109), (('dp', 'tp'), 0.504)]
    """
    split = check_bool("plan", "split", split)
    dims = _check_sizes(sizes)
    topo = Topology.preset(topology) if isinstance(topology, str) else topology
    if not isinstance(topo, Topology):
        raise InvalidArgumentError(f"topology must be a Topology or a preset name, got {shown(topology)}")
    entries = _check_traffic(traffic, dims)
    candidates: list[tuple[dict[str, int], dict[str, list[str]]]] = [(dims, {})]
    if split and len(dims) + 1 > MAX_PLAN_DIMS:
        raise InvalidArgumentError(
            f"split=True adds a dim: at most {MAX_PLAN_DIMS - 1} dims, got {len(dims)} ({list(dims)})"
        )
    orders = _count_orders(dims, split)
    if orders > MAX_PLAN_ORDERS:
        raise InvalidArgumentError(
            f"plan would price {orders:,} orders of {list(dims)}{' with every split' if split else ''}; at most "
            f"{MAX_PLAN_ORDERS:,}: drop dims of size 1, or plan without split=True (--split)"
        )
    if split:
        candidates += [(parted, {dim: [dim + INTRA, dim + INTER]}) for dim, parted in _splits(dims)]
    pricing = _Pricing(dims, entries, topo)
    if orders * len(entries) > MAX_PLAN_PRICES:
        raise InvalidArgumentError(
            f"plan would price {orders:,} orders of {list(dims)}{' with every split' if split else ''} for "
            f"{len(entries):,} traffic entries ({orders * len(entries):,} prices); at most {MAX_PLAN_PRICES:,}: "
            "give fewer entries (one per family and collective), drop dims of size 1, or plan without split=True"
        )
    plans: list[Plan] = []
    for grid_sizes, parts in candidates:
        split_of = {dim: (pair[0], pair[1]) for dim, pair in parts.items()}
        members = [[part for dim in dims for part in parts.get(dim, [dim])] for _, dims, _ in pricing.groups]
        # Where the size-1 dims sit moves no rank: the orders that differ only there cost the same, priced once.
        ones = {dim for dim, size in grid_sizes.items() if size == 1}
        priced: dict[tuple[str, ...], tuple[dict[str, float], float]] = {}
        for order in itertools.permutations(grid_sizes):
            position = {dim: index for index, dim in enumerate(order)}
            if any(position[inter] - position[intra] < 2 for intra, inter in parts.values()):
                continue  # intra is inner; adjacent parts would lay ranks out as the unsplit dim
            shape = tuple(grid_sizes[d] for d in order)
            moving = tuple(d for d in order if d not in ones) if ones else order
            if moving not in priced:
                families = pricing.families(position, shape, members)
                priced[moving] = families, sum(families.values(), 0.0)
            families, seconds = priced[moving]
            plans.append(Plan(order, shape, seconds, dict(families), split_of))
    return sorted(plans, key=lambda p: p.seconds)
