"""The topology planner: hand-computed plans, plain-loop references, properties of the cost model, errors."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypergrid import DimsError, GridLayout, GridSpecError, InvalidArgumentError
from hypergrid.topology import (
    OPS,
    Tier,
    Topology,
    Traffic,
    collective_seconds,
    family_spans,
    llm_step_traffic,
    plan,
)

H100 = Topology.preset("h100_8x")
NV, IB = H100.tiers


def ring(n: int, nbytes: float, bandwidth: float, latency: float) -> float:
    """Flat ring all-reduce, written from docs/planner.md: 2(n-1) steps, 2(n-1)/n bytes per byte."""
    return 2 * (n - 1) * latency + 2 * (n - 1) / n * nbytes / bandwidth


# -- hand-computed plans ----------------------------------------------------------------------------


def test_tp_traffic_dominating_puts_tp_inside_the_node() -> None:
    traffic = [Traffic("tp", "all_reduce", 64 * 2**20, calls=200), Traffic("dp", "all_reduce", 2**30)]
    plans = plan({"tp": 8, "dp": 16}, traffic, H100)
    assert [p.order for p in plans] == [("tp", "dp"), ("dp", "tp")]
    best = plans[0]
    # tp: 8 ranks inside one node; dp: 16 ranks, one per node, over InfiniBand.
    assert best.families["tp"] == pytest.approx(200 * ring(8, 64 * 2**20, NV.bandwidth, NV.latency))
    assert best.families["dp"] == pytest.approx(ring(16, 2**30, IB.bandwidth, IB.latency))
    assert best.seconds == pytest.approx(best.families["tp"] + best.families["dp"])
    # the other order: tp crosses 8 nodes, one rank each
    assert plans[1].families["tp"] == pytest.approx(200 * ring(8, 64 * 2**20, IB.bandwidth, IB.latency))


def test_dp_traffic_dominating_puts_dp_inside() -> None:
    traffic = [Traffic("tp", "all_reduce", 2**20, calls=10), Traffic("dp", "all_reduce", 4 * 2**30)]
    plans = plan({"tp": 8, "dp": 16}, traffic, H100)
    assert plans[0].order == ("dp", "tp")
    # dp = 2 nodes x 8 ranks: the ring leaves each node once and its bytes share the 8 ranks' NICs,
    # so the slower of NVLink (370 GB/s) and 8 x 47 GB/s bounds it.
    size = 4 * 2**30
    flat = 30 * IB.latency + 30 / 16 * size / min(NV.bandwidth, 8 * IB.bandwidth)
    assert plans[0].families["dp"] == pytest.approx(flat)
    assert plans[1].families["dp"] == pytest.approx(ring(16, size, IB.bandwidth, IB.latency))


def test_hierarchical_all_reduce_wins_on_latency() -> None:
    # 4 nodes of 8 ranks, small message, slow network steps: reduce-scatter inside (7 steps),
    # all-reduce across 4 nodes (6 steps), all-gather inside (7 steps) beats 62 flat steps.
    topo = Topology([Tier("node", 8, 100e9, 1e-6), Tier("net", None, 10e9, 1e-4)])
    size = 8e3
    span = family_spans([32], ["dp"], "dp", topo.unit_ranks)
    flat = 62 * 1e-4 + 62 / 32 * size / min(100e9, 8 * 10e9)
    inside = 7 * 1e-6 + 7 / 8 * size / 100e9
    hierarchical = 2 * inside + ring(4, size / 8, 10e9, 1e-4)
    assert hierarchical < flat
    assert collective_seconds("all_reduce", size, span, topo) == pytest.approx(hierarchical)


def test_slow_network_makes_the_gap_large() -> None:
    slow = Topology([Tier("node", 8, 200e9, 1e-6), Tier("net", None, 2e9, 1e-5)])
    plans = plan({"tp": 8, "dp": 4}, [Traffic("tp", "all_reduce", 2**26, 100)], slow)
    assert plans[0].order == ("tp", "dp")
    # dp=4 innermost: each tp group has 2 ranks in each of 4 nodes. Flat, its ring shares their 2 NICs;
    # hierarchical (cheaper): reduce-scatter over the pair, all-reduce of half the bytes over 4 nodes, all-gather.
    size = 2**26
    flat = 14 * 1e-5 + 1.75 * size / (2 * 2e9)
    hierarchical = 2 * (1e-6 + 0.5 * size / 200e9) + ring(4, size / 2, 2e9, 1e-5)
    assert hierarchical < flat
    assert plans[-1].seconds == pytest.approx(100 * hierarchical)
    assert plans[-1].seconds / plans[0].seconds > 40
    fast = plan({"tp": 8, "dp": 4}, [Traffic("tp", "all_reduce", 2**26, 100)], H100)
    assert plans[-1].seconds / plans[0].seconds > fast[-1].seconds / fast[0].seconds


def test_other_ops_by_hand() -> None:
    sizes = {"ep": 16}  # two nodes of 8
    a2a = plan(sizes, [Traffic("ep", "all_to_all", 1e8)], H100)[0].families["ep"]
    # each rank sends 7/16 of its buffer over NVLink and 8/16 over its NIC, at once: the NIC is slower
    assert a2a == pytest.approx(15 * IB.latency + 8 / 16 * 1e8 / IB.bandwidth)
    p2p = plan({"pp": 16}, [Traffic("pp", "send_recv", 1e8)], H100)[0].families["pp"]
    assert p2p == pytest.approx(IB.latency + 1e8 / IB.bandwidth)
    gather = plan({"tp": 8}, [Traffic("tp", "all_gather", 1e8, calls=3)], H100)[0].families["tp"]
    assert gather == pytest.approx(3 * (7 * NV.latency + 7 / 8 * 1e8 / NV.bandwidth))


def test_gb200_keeps_72_ranks_inside_nvlink() -> None:
    topo = Topology.preset("gb200_nvl72")
    plans = plan({"tp": 8, "dp": 9, "pp": 4}, [Traffic(["dp", "tp"], "all_reduce", 1e9)], topo)
    best = plans[0]
    span = family_spans(best.shape, best.order, ["dp", "tp"], topo.unit_ranks)
    assert span.spanned == (True, False)  # all 72 ranks of each dp-tp group in one NVL72 domain


def test_same_dims_add_up_and_order_of_sizes_breaks_ties() -> None:
    traffic = [Traffic("dp", "all_gather", 1e6), Traffic("dp", "reduce_scatter", 1e6)]
    plans = plan({"a": 1, "dp": 4}, traffic, H100)
    assert len(plans) == 2 and plans[0].order == ("a", "dp")  # equal seconds: enumeration order
    assert plans[0].families == {"dp": pytest.approx(2 * (3 * NV.latency + 0.75 * 1e6 / NV.bandwidth))}


def test_split_plans_are_hybrid_meshes() -> None:
    sizes = {"tp": 2, "dp": 8, "pp": 2}
    traffic = [Traffic("dp", "all_reduce", 1e9), Traffic("tp", "all_reduce", 1e7, 50)]
    plain, hybrid = plan(sizes, traffic, H100), plan(sizes, traffic, H100, split=True)
    assert len(plain) == 6 and len(hybrid) > 6
    split = [p for p in hybrid if p.split]
    assert split and all(set(p.split) <= {"dp"} for p in split)
    for p in split:
        intra, inter = p.split["dp"]
        assert (intra, inter) == ("dp_intra", "dp_inter")
        assert p.order.index(inter) - p.order.index(intra) >= 2  # adjacent parts equal an unsplit plan
        assert p.shape[p.order.index(intra)] * p.shape[p.order.index(inter)] == 8
        again = plan(dict(zip(p.order, p.shape)), [Traffic([intra, inter], "all_reduce", 1e9)], H100)
        assert p.families["dp"] == pytest.approx(next(q for q in again if q.order == p.order).seconds)


# -- spans against a plain-loop reference -----------------------------------------------------------


def spans_reference(shape: list[int], names: list[str], dims: list[str], units: list[int]) -> tuple:
    groups = GridLayout(shape, names).rank_enum(dims)
    per_unit, touched, spanned = [], [], []
    previous = [len(g) for g in groups]
    for size in units:
        counts = [{} for _ in groups]
        for i, group in enumerate(groups):
            for rank in group:
                counts[i][rank // size] = counts[i].get(rank // size, 0) + 1
        per_unit.append(min(c for count in counts for c in count.values()))
        touched.append(max(len(count) for count in counts))
        spanned.append(any(p > len(c) for p, c in zip(previous, counts)))
        previous = [len(c) for c in counts]
    return (
        tuple([*per_unit, len(groups[0])]),
        tuple([*touched, 1]),
        tuple([*spanned, any(p > 1 for p in previous)]),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.data())
def test_family_spans_match_plain_loops(shape: list[int], data: st.DataObject) -> None:
    names = [f"d{i}" for i in range(len(shape))]
    dims = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    units = sorted(data.draw(st.lists(st.integers(1, 12), max_size=2, unique=True)))
    units = [u * (units[0] if i else 1) for i, u in enumerate(units)]  # nested: each divides the next
    span = family_spans(shape, names, dims, units)
    assert (span.per_unit, span.units, span.spanned) == spans_reference(shape, names, dims, units)
    assert span.group_size == math.prod(shape[names.index(d)] for d in dims)


# -- properties ---------------------------------------------------------------------------------------

bandwidths = st.floats(1e8, 1e12)
latencies = st.floats(1e-7, 1e-3)


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    count = draw(st.integers(1, 3))
    tiers = [Tier(f"t{k}", draw(st.integers(1, 6)), draw(bandwidths), draw(latencies)) for k in range(count - 1)]
    return Topology([*tiers, Tier("outer", None, draw(bandwidths), draw(latencies))])


@st.composite
def problems(draw: st.DrawFn) -> tuple[dict[str, int], list[Traffic]]:
    names = draw(st.lists(st.sampled_from(["tp", "cp", "pp", "dp"]), min_size=1, max_size=4, unique=True))
    sizes = {name: draw(st.integers(1, 6)) for name in names}
    traffic = [
        Traffic(
            draw(st.lists(st.sampled_from(names), min_size=1, unique=True)),
            draw(st.sampled_from(OPS)),
            draw(st.floats(0, 1e10)),
            draw(st.integers(0, 5)),
        )
        for _ in range(draw(st.integers(1, 3)))
    ]
    return sizes, traffic


def bus_bound(entry: Traffic, sizes: dict[str, int], fastest: float) -> float:
    n = math.prod(sizes[d] for d in entry.dims)
    factor = {"all_reduce": 2 * (n - 1) / n, "send_recv": 1.0, "broadcast": 1.0}.get(entry.op, (n - 1) / n)
    return entry.calls * factor * entry.bytes / fastest if n > 1 else 0.0


@settings(max_examples=80, deadline=None)
@given(problems(), topologies())
def test_every_order_once_totals_and_bus_bound(problem: tuple, topo: Topology) -> None:
    sizes, traffic = problem
    plans = plan(sizes, traffic, topo)
    assert sorted(p.order for p in plans) == sorted(itertools.permutations(sizes))
    assert [p.seconds for p in plans] == sorted(p.seconds for p in plans)
    fastest = max(t.bandwidth for t in topo.tiers)
    for p in plans:
        assert p.shape == tuple(sizes[d] for d in p.order)
        assert p.seconds == pytest.approx(sum(p.families.values()))
        assert set(p.families) == {t.key for t in traffic}
        for key in p.families:
            bound = sum(bus_bound(t, sizes, fastest) for t in traffic if t.key == key)
            assert p.families[key] >= bound * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(problems(), topologies(), st.floats(1, 100), st.data())
def test_more_bytes_never_cheaper_and_faster_tier_never_dearer(
    problem: tuple, topo: Topology, scale: float, data: st.DataObject
) -> None:
    sizes, traffic = problem
    base = {p.order: p.seconds for p in plan(sizes, traffic, topo)}
    bigger = [Traffic(t.dims, t.op, t.bytes * scale, t.calls) for t in traffic]
    for p in plan(sizes, bigger, topo):
        assert p.seconds >= base[p.order] * (1 - 1e-9)
    name = data.draw(st.sampled_from(topo.names))
    tier = topo.tiers[topo.names.index(name)]
    faster = topo.replace(**{name: {"bandwidth": tier.bandwidth * scale, "latency": tier.latency / scale}})
    for p in plan(sizes, traffic, faster):
        assert p.seconds <= base[p.order] * (1 + 1e-9)


# -- llm_step_traffic ---------------------------------------------------------------------------------


def test_llm_step_traffic_follows_the_documented_accounting() -> None:
    sizes = {"tp": 4, "cp": 2, "pp": 2, "dp": 8, "ep": 4}
    traffic = llm_step_traffic(
        sizes, hidden=1024, layers=8, seq_len=2048, micro_batch=2, params=1e9, microbatches=4, experts=8, topk=2
    )
    act = 2 * 2048 / 2 * 1024 * 2  # micro_batch * seq / cp * hidden * bytes
    got = {(t.key, t.op): (t.bytes, t.calls) for t in traffic}
    assert got == {
        ("tp", "all_reduce"): (act, 4 * 4 * 4),
        ("cp", "all_gather"): (2 * act / 4 * 2, 4 * 4),
        ("cp", "reduce_scatter"): (2 * act / 4 * 2, 4 * 4),
        ("pp", "send_recv"): (act / 4, 2 * 4),
        ("dp-cp", "all_reduce"): (1e9 / 8 * 2, 1),
        ("ep", "all_to_all"): (2 * act / 4, 4 * 4 * 4),
    }
    assert llm_step_traffic({"dp": 1}, hidden=8, layers=1, seq_len=8, micro_batch=1, params=10) == []


# -- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: plan({"tp": 2}, [Traffic("dp", "all_reduce", 1)], H100), DimsError, "'dp'"),
        (lambda: plan({"tp": 0}, [], H100), GridSpecError, "0"),
        (lambda: plan({"tp": -2}, [], H100), ValueError, "-2"),
        (lambda: plan({}, [], H100), GridSpecError, "{}"),
        (lambda: plan({"t-p": 2}, [], H100), GridSpecError, "'t-p'"),
        (lambda: plan({"tp": 2**16, "dp": 2**16}, [], H100), GridSpecError, "2**31-1"),
        (lambda: plan({f"d{i}": 2 for i in range(9)}, [], H100), InvalidArgumentError, "9"),
        (lambda: plan({f"d{i}": 2 for i in range(8)}, [], H100, split=True), InvalidArgumentError, "8"),
        (lambda: plan({"tp": 2}, [], "h200_4x"), InvalidArgumentError, "'h200_4x'"),
        (lambda: plan({"tp": 2}, ["tp"], H100), InvalidArgumentError, "'tp'"),
        (lambda: Traffic("tp", "allreduce", 1), InvalidArgumentError, "'allreduce'"),
        (lambda: Traffic("tp", "all_reduce", -1), InvalidArgumentError, "-1"),
        (lambda: Traffic("tp", "all_reduce", 1, calls=1.5), InvalidArgumentError, "1.5"),
        (lambda: Traffic("tp-tp", "all_reduce", 1), DimsError, "'tp-tp'"),
        (lambda: Traffic("", "all_reduce", 1), DimsError, "''"),
        (lambda: Tier("nv", 0, 1e9, 1e-6), InvalidArgumentError, "0"),
        (lambda: Tier("nv", 8, -1e9, 1e-6), InvalidArgumentError, "-1000000000.0"),
        (lambda: Tier("nv", 8, 1e9, 0), InvalidArgumentError, "latency"),
        (lambda: Topology([Tier("nv", 8, 1e9, 1e-6)]), InvalidArgumentError, "'nv'"),
        (lambda: Topology([Tier("a", None, 1e9, 1e-6), Tier("b", None, 1e9, 1e-6)]), InvalidArgumentError, "'a'"),
        (lambda: Topology([]), InvalidArgumentError, "[]"),
        (lambda: H100.replace(nvl={"bandwidth": 1.0}), InvalidArgumentError, "'nvl'"),
        (lambda: llm_step_traffic({"tp": 2}, hidden=0, layers=1, seq_len=1, micro_batch=1, params=1), ValueError, "0"),
    ],
)
def test_bad_input_names_the_value(call, error: type, text: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        call()
    assert text in str(info.value)
    assert isinstance(info.value, (ValueError, KeyError))


def test_unknown_preset_lists_the_known_ones() -> None:
    with pytest.raises(InvalidArgumentError, match=r"\['gb200_nvl72', 'h100_8x'\]"):
        Topology.preset("dgx")
