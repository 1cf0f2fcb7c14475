"""Numbers at the ends of the float range: refused with the project's errors; ``plan`` never returns NaN or inf."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from hypergrid import HyperGridError, InvalidArgumentError
from hypergrid.cluster.spans import MAX_ENUMERATED_RANKS
from hypergrid.topology import Tier, Topology, Traffic, llm_step_traffic, plan
from hypergrid.topology.planner import MAX_PLAN_LISTED_RANKS, MAX_PLAN_ORDERS, MAX_PLAN_PRICES
from hypergrid.values import shown

pytestmark = pytest.mark.timeout(120)

HUGE = [10**5000, 10**400, float("inf"), float("nan"), -1.0, 0, np.float64("inf"), True]


@pytest.mark.parametrize("value", HUGE, ids=shown)
@pytest.mark.parametrize("field", ["bandwidth", "latency"])
def test_tier_figures_beyond_a_float_are_refused(field: str, value: Any) -> None:
    figures: dict[str, Any] = {"bandwidth": 1e9, "latency": 1e-6, field: value}
    with pytest.raises(InvalidArgumentError, match=field):
        Tier("net", None, **figures)


@pytest.mark.parametrize("value", HUGE, ids=shown)
def test_traffic_bytes_beyond_a_float_are_refused(value: Any) -> None:
    if value == 0 and not isinstance(value, bool):
        assert Traffic("tp", "all_reduce", value).bytes == 0.0
        return
    with pytest.raises(InvalidArgumentError, match="bytes"):
        Traffic("tp", "all_reduce", value)


@pytest.mark.parametrize("calls", [10**400, -1, 2.0, True])
def test_traffic_calls_are_ints_a_float_can_hold(calls: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="calls"):
        Traffic("tp", "all_reduce", 1.0, calls)


@pytest.mark.parametrize("size", [10**400, 10**5000, 2**31, 0, 2.0], ids=shown)
def test_tier_sizes_beyond_the_largest_world_are_refused(size: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="size must be an int from 1 to 2\\*\\*31-1"):
        Tier("node", size, 1e9, 1e-6)


@pytest.mark.parametrize(
    "make", [lambda: Tier("a", None, 10**5000, 1.0), lambda: Traffic("tp", "all_reduce", 1.0, 10**5000)]
)
def test_ints_too_long_to_print_still_give_the_projects_error(make: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="an int of 16610 bits"):
        make()


def test_numpy_numbers_are_numbers() -> None:
    assert Traffic("tp", "all_reduce", np.float32(2.0), np.int64(3)).calls == 3
    assert Tier("net", np.int64(8), np.float64(1e9), np.float32(1e-6)).size == 8


@pytest.mark.parametrize("figure", ["params", "hidden"])
def test_model_figures_beyond_a_float_are_refused(figure: str) -> None:
    figures: dict[str, Any] = {"hidden": 64, "layers": 2, "seq_len": 8, "micro_batch": 1, "params": 1e6}
    figures[figure] = 10**400
    with pytest.raises(InvalidArgumentError, match=figure):
        llm_step_traffic({"tp": 2}, **figures)


EXTREME = Topology([Tier("a", 2, 1e-300, 1e300), Tier("b", None, 1e-300, 1e300)])


@pytest.mark.parametrize(
    "traffic",
    [
        [Traffic("tp", "all_reduce", 1e300, 0)],  # 0 calls of an infinitely slow collective: was NaN
        [Traffic("tp", "all_reduce", 0.0, 5)],
        [Traffic("dp", "send_recv", 1e300, 0), Traffic("tp", "all_gather", 0.0, 10**15)],
    ],
)
def test_plan_never_returns_nan(traffic: list[Traffic]) -> None:
    for candidate in plan({"tp": 4, "dp": 2}, traffic, EXTREME):
        assert all(math.isfinite(seconds) for seconds in [candidate.seconds, *candidate.families.values()])
        assert candidate.seconds == 0.0


@pytest.mark.parametrize(
    ("topology", "traffic"),
    [
        (EXTREME, Traffic("tp", "all_reduce", 1e300, 10)),
        ("h100_8x", Traffic("tp", "all_reduce", 1e308, 10**15)),
    ],
)
def test_plan_refuses_costs_a_float_cannot_hold(topology: Any, traffic: Traffic) -> None:
    with pytest.raises(InvalidArgumentError, match="costs more seconds than a float holds"):
        plan({"tp": 4, "dp": 2}, [traffic], topology)


def test_split_over_many_dims_is_refused_above_the_limit_before_pricing() -> None:
    sizes = {"a": 720720, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1}
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_PLAN_ORDERS:,}"):
        plan(sizes, [Traffic("a", "all_reduce", 1e6)], "h100_8x", split=True)


def test_split_counts_every_order_it_prices() -> None:
    # 7 dims, a=64 has 5 proper divisors: 7! unsplit + 5 x 7! x 6 / 2 split orders, under the limit
    sizes = {"a": 64, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1}
    assert len(plan(sizes, [Traffic("a", "all_reduce", 1e6)], "h100_8x", split=True)) == 5040 + 5 * 15120


def test_size_one_dims_are_priced_once_and_cost_what_the_grid_without_them_costs() -> None:
    # a=1,048,576 split at each of its 19 proper divisors, with 5 dims of size 1: 34,920 orders, priced as the few
    # orders of a's parts (where a size-1 dim sits moves no rank). Only size-1 dims separate a_intra from a_inter
    # (intra inner), so every order lays ranks out as a alone: each costs what a alone costs.
    traffic = [Traffic("a", "all_reduce", 1e6), Traffic("b-c", "all_gather", 1e9)]
    plans = plan({"a": 2**20, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}, traffic, "h100_8x", split=True)
    assert len(plans) == 720 + 19 * 1800
    [alone] = plan({"a": 2**20}, traffic[:1], "h100_8x")
    assert alone.seconds > 0
    assert {p.seconds for p in plans} == {alone.seconds}
    assert {p.families["b-c"] for p in plans} == {0.0}  # groups of one rank cost nothing


@pytest.mark.parametrize(
    "sizes",
    [{"a": 1048575, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}, {"a": 3, "b": 5, "c": 7, "d": 9, "e": 11, "f": 13}],
    ids=["large grid, size-1 dims", "six odd dims"],
)
def test_pricing_that_lists_too_many_ranks_is_refused(sizes: dict[str, int]) -> None:
    # nodes of 8 ranks cut none of these grids along their dims: each distinct order lists its ranks
    traffic = [Traffic("a", "all_reduce", 1e6), Traffic("b-c", "all_gather", 1e9), Traffic("f", "all_reduce", 1e3)]
    with pytest.raises(InvalidArgumentError, match=f"more than {MAX_PLAN_LISTED_RANKS:,} ranks"):
        plan(sizes, traffic, "h100_8x", split=True)


def test_many_entries_over_many_orders_are_refused_before_pricing() -> None:
    # 95,760 orders (7 dims, 6 splits) x 28 entries: each order prices each entry
    sizes = {"a": 4, "b": 4, "c": 4, "d": 4, "e": 4, "f": 4, "g": 2}
    traffic = [Traffic(dim, "all_reduce", 1e6) for dim in sizes] * 4
    with pytest.raises(InvalidArgumentError, match=f"2,681,280 prices\\); at most {MAX_PLAN_PRICES:,}"):
        plan(sizes, traffic, "h100_8x", split=True)


def test_entries_on_one_family_add_up_as_before() -> None:
    # entries on the same dims are priced together: the family's seconds are their sum, in the order given
    one, two = Traffic("tp", "all_reduce", 1e6, calls=3), Traffic("tp", "all_gather", 1e8)
    both = plan({"tp": 8, "dp": 4}, [one, Traffic("dp", "all_reduce", 1e9), two], "h100_8x")
    for p in both:
        alone = [plan({"tp": 8, "dp": 4}, [t], "h100_8x") for t in (one, two)]
        parts = [next(q.seconds for q in plans if q.order == p.order) for plans in alone]
        assert p.families["tp"] == parts[0] + parts[1]


def test_a_grid_too_large_to_list_is_refused_not_allocated() -> None:
    with pytest.raises(InvalidArgumentError, match=f"at most {MAX_ENUMERATED_RANKS:,} ranks"):
        plan({"a": 2**31 - 2}, [Traffic("a", "all_reduce", 1e6)], "h100_8x")


def test_refusals_are_hypergrid_errors() -> None:
    assert issubclass(InvalidArgumentError, HyperGridError)
