"""Placement reports: hand-computed layouts, a plain-set reference, bad input, and the report's text and data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid.cluster.placement import FamilyPlacement, PlacementReport, build_report
from hypergrid.errors import InvalidArgumentError
from hypergrid.topology import Tier, Topology

H100 = Topology.preset("h100_8x")
NVL72 = Topology.preset("gb200_nvl72")


def blocks(world: int, size: int, offset: int = 0) -> list[list[int]]:
    """Consecutive groups of ``size`` ranks from ``offset``: the groups of the innermost dim."""
    return [list(range(start, start + size)) for start in range(offset, offset + world, size)]


def strided(world: int, stride: int, offset: int = 0) -> list[list[int]]:
    """Groups of ranks ``stride`` apart: the outer dim of a 2-dim grid whose inner dim is ``stride``."""
    return [list(range(offset + first, offset + world, stride)) for first in range(stride)]


def family(report: PlacementReport, key: str) -> FamilyPlacement:
    (found,) = [f for f in report.families if f.key == key]
    return found


# -- hand-computed layouts --------------------------------------------------------------------------


def test_tp4_dp4_on_hosts_of_8() -> None:
    # tp=4 x dp=4: tp = {0-3}, {4-7}, ...; dp = {0,4,8,12}, ...; hosts a: 0-7, b: 8-15.
    hosts = ["a"] * 8 + ["b"] * 8
    tp, dp = blocks(16, 4), strided(16, 4)
    report = build_report(hosts, [r % 8 for r in range(16)], [("tp", np.array(tp)), ("dp", np.array(dp))], 8)
    assert report.hosts == (("a", tuple(range(8))), ("b", tuple(range(8, 16))))
    assert report.ranks_per_host == 8 and report.ranks_per_node == 8
    assert report.node_blocks_match and report.problems == () and report.warnings == ()
    tp_row, dp_row = family(report, "tp"), family(report, "dp")
    assert (tp_row.group_size, tp_row.num_groups, tp_row.min_hosts, tp_row.max_hosts) == (4, 4, 1, 1)
    assert tp_row.groups_inside_one_host == 4 and tp_row.groups_crossing_hosts == 0
    assert (dp_row.group_size, dp_row.num_groups, dp_row.min_hosts, dp_row.max_hosts) == (4, 4, 2, 2)
    assert dp_row.groups_inside_one_host == 0 and dp_row.groups_crossing_hosts == 4
    assert "inside one host" in tp_row.line and "across 2 hosts" in dp_row.line
    assert tp_row.tier is None and dp_row.tier is None  # no topology

    priced = build_report(hosts, [r % 8 for r in range(16)], [("tp", np.array(tp)), ("dp", np.array(dp))], 8, H100)
    assert family(priced, "tp").tier == "nvlink" and family(priced, "dp").tier == "ib"
    assert family(priced, "dp").line.endswith("priced on tier 'ib'")
    assert priced.warnings == () and priced.topology == ("nvlink", "ib")


def test_four_per_node_assumed_on_hosts_of_8() -> None:
    hosts = ["a"] * 8 + ["b"] * 8
    report = build_report(hosts, [r % 8 for r in range(16)], [("tp", np.array(blocks(16, 4)))], 4)
    assert not report.node_blocks_match
    assert len(report.problems) == 2  # hosts hold two assumed nodes; LOCAL_RANK is rank % 8, not % 4
    hosts_line, local_line = report.problems
    assert hosts_line.startswith("assumed 4 ranks per node, but ")
    assert "host 'a' holds ranks 0-7 (2 assumed nodes)" in hosts_line
    assert "host 'b' holds ranks 8-15 (2 assumed nodes)" in hosts_line
    assert "on 8 ranks" in local_line and "rank 4 on host 'a' has 4, expected 0" in local_line
    assert "... and 5 more ranks" in local_line  # 3 of the 8 named
    assert report.warnings[:2] == report.problems
    assert "mismatch" in str(report).splitlines()[0]


def test_eight_per_node_assumed_on_hosts_of_4_warns_for_a_family_that_fits_a_node() -> None:
    hosts = ["h0"] * 4 + ["h1"] * 4 + ["h2"] * 4 + ["h3"] * 4
    report = build_report(hosts, [r % 4 for r in range(16)], [("tp", np.array(blocks(16, 8)))], 8)
    split = report.problems[0]
    assert "assumed node 0 (ranks 0-7) is on hosts 'h0', 'h1'" in split
    assert "assumed node 1 (ranks 8-15) is on hosts 'h2', 'h3'" in split
    assert report.warnings[-1] == "tp: every group fits one assumed node of 8 ranks, but 2 of its 2 groups cross hosts"


def test_many_hosts_are_compressed() -> None:
    hosts = [f"n{r // 8}" for r in range(64)]
    report = build_report(hosts, [None] * 64, [], 4)
    (line,) = report.problems
    assert "host 'n0' holds ranks 0-7" in line and "host 'n2'" in line and "'n3'" not in line
    assert line.endswith("... and 5 more hosts")
    assert report.notes == ("LOCAL_RANK unknown on 64 ranks: not checked there",)


def test_local_rank_wrong_on_one_rank() -> None:
    local: list[int | None] = [r % 8 for r in range(16)]
    local[5], local[9] = 2, None
    report = build_report(["a"] * 8 + ["b"] * 8, local, [("tp", np.array(blocks(16, 8)))], 8)
    assert not report.node_blocks_match
    assert report.problems == ("LOCAL_RANK is not rank % 8 on 1 rank: rank 5 on host 'a' has 2, expected 5",)
    assert "LOCAL_RANK unknown on 1 rank: not checked there" in report.notes


def test_no_node_size_assumed() -> None:
    report = build_report(["a", "a", "b", "b"], [None] * 4, [("dp", np.array([[0, 2], [1, 3]]))], None)
    assert report.ranks_per_node is None and not report.node_blocks_match and report.problems == ()
    assert any("not assumed" in note for note in report.notes)
    assert "node size not assumed" in str(report).splitlines()[0]
    assert family(report, "dp").max_hosts == 2 and report.warnings == ()  # no blocks: no fit-a-node warning


def test_nvl72_on_hosts_of_4() -> None:
    # 144 ranks, 4 GPUs a host: an NVL72 domain is 18 hosts; tp=8 inside a domain, dp=18 across two.
    hosts = [f"n{r // 4}" for r in range(144)]
    families = [("tp", np.array(blocks(144, 8))), ("dp", np.array(strided(144, 8))), ("ep", np.array(blocks(144, 72)))]
    report = build_report(hosts, [r % 4 for r in range(144)], families, 4, NVL72)
    assert report.node_blocks_match and report.ranks_per_host == 4
    assert [(f.key, f.tier, f.min_hosts, f.max_hosts) for f in report.families] == [
        ("tp", "nvlink", 2, 2),
        ("dp", "ib", 18, 18),
        ("ep", "nvlink", 18, 18),
    ]
    assert report.warnings == ()  # the domain is larger than a host: crossing hosts is expected
    (note,) = [n for n in report.notes if "nvlink" in n]  # noted once, for two families on the tier
    assert "72 ranks" in note and "cannot be verified from hostnames" in note

    shifted = [f"n{(r + 2) // 4}" for r in range(144)]  # host n18 holds ranks 70-73: two domains
    report = build_report(shifted, [None] * 144, families, 4, NVL72)
    straddle = [w for w in report.warnings if "straddle" in w]
    assert straddle == ["hosts straddle two units of tier 'nvlink' (72 ranks each): host 'n18' holds ranks 70-73"]


def test_tier_that_fits_a_host_but_groups_cross_hosts() -> None:
    # hosts of 12 ranks, NVLink units of 8: the tp group 8-15 is priced on NVLink but spans hosts.
    hosts = ["a"] * 12 + ["b"] * 12
    report = build_report(hosts, [None] * 24, [("tp", np.array(blocks(24, 8)))], None, H100)
    assert family(report, "tp").tier == "nvlink"
    assert report.warnings == (
        "tp: priced on tier 'nvlink' (units of 8 ranks, inside one host) but 1 of its 3 groups crosses hosts",
    )
    # round-robin hostnames: hosts hold 8 ranks each but none consecutive
    report = build_report(["a", "b"] * 8, [None] * 16, [("tp", np.array(blocks(16, 8)))], None, H100)
    assert report.ranks_per_host is None
    assert report.warnings[0].endswith("but 2 of its 2 groups cross hosts")


def test_grid_at_a_rank_offset() -> None:
    # world of 12 on hosts of 4; a tp=2 x dp=4 grid on ranks 4-11.
    hosts = ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    families = [("tp", np.array(blocks(8, 2, offset=4))), ("dp", np.array(strided(8, 2, offset=4)))]
    report = build_report(hosts, [r % 4 for r in range(12)], families, 4, H100)
    assert [h for h, _ in report.hosts] == ["a", "b", "c"] and report.node_blocks_match
    assert [(f.num_groups, f.max_hosts, f.groups_inside_one_host, f.tier) for f in report.families] == [
        (4, 1, 4, "nvlink"),
        (2, 2, 0, "ib"),  # dp {4, 6, 8, 10} crosses the NVLink unit 0-7
    ]
    # an offset that cuts a host: tp=4 at offset 2 on hosts of 4
    report = build_report(["a"] * 4 + ["b"] * 4, [r % 4 for r in range(8)], [("tp", np.array([[2, 3, 4, 5]]))], 4)
    assert family(report, "tp").line == "tp: 1 group of 4 ranks, across 2 hosts"
    assert report.warnings == ()  # the group does not fit one assumed node either


def test_single_rank_groups_have_no_tier() -> None:
    report = build_report(["a"] * 4, [None] * 4, [("pp", np.arange(4).reshape(4, 1))], 4, H100)
    assert (
        family(report, "pp").tier is None
        and family(report, "pp").line == "pp: 4 groups of 1 rank, each inside one host"
    )


def test_lines_with_some_groups_crossing() -> None:
    hosts = ["a"] * 4 + ["b"] * 2 + ["c"] * 2 + ["d"] * 4
    groups = np.array([[0, 1, 2, 3], [4, 5, 6, 7], [2, 3, 4, 6], [0, 4, 6, 8]])
    row = family(build_report(hosts, [None] * 12, [("x", groups)], None), "x")
    assert (row.min_hosts, row.max_hosts, row.groups_inside_one_host) == (1, 4, 1)
    assert row.line == "x: 4 groups of 4 ranks, 3 of them across 2 to 4 hosts"


# -- a reference in plain sets ----------------------------------------------------------------------


@st.composite
def placements(draw: st.DrawFn) -> tuple[list[str], list[int | None], np.ndarray, int, tuple[int, int]]:
    world = draw(st.integers(1, 40))
    hosts = [f"h{draw(st.integers(0, 5))}" for _ in range(world)]
    size = draw(st.integers(1, world))
    count = draw(st.integers(1, world // size))
    ranks = draw(st.permutations(range(world)))[: size * count]
    per_node = draw(st.integers(1, world + 2))
    local = [draw(st.one_of(st.none(), st.just(r % per_node), st.integers(0, 3))) for r in range(world)]
    units = (draw(st.integers(1, world + 2)), draw(st.integers(1, 4)))
    return hosts, local, np.array(ranks).reshape(count, size), per_node, units


@given(placements())
def test_against_plain_sets(case: tuple[list[str], list[int | None], np.ndarray, int, tuple[int, int]]) -> None:
    hosts, local, groups, per_node, (gpus, boards) = case
    tiers = [Tier("gpu", gpus, 1e10, 1e-6), Tier("board", boards, 1e9, 1e-6), Tier("net", None, 1e8, 1e-5)]
    topology = Topology(tiers)
    report = build_report(hosts, local, [("f", groups)], per_node, topology)
    spans = [len({hosts[r] for r in group}) for group in groups.tolist()]
    row = report.families[0]
    assert (row.min_hosts, row.max_hosts) == (min(spans), max(spans))
    assert row.groups_inside_one_host == spans.count(1)
    assert (row.group_size, row.num_groups) == (groups.shape[1], groups.shape[0])
    if groups.shape[1] == 1:
        assert row.tier is None
    else:
        # the outermost tier whose units a group spans: crossing tier-k units means tier k+1
        tier = "gpu"
        for name, unit in (("board", gpus), ("net", gpus * boards)):
            if any(len({r // unit for r in group}) > 1 for group in groups.tolist()):
                tier = name
        assert row.tier == tier
    # node blocks: each block on one host, each host in one block, LOCAL_RANK right where known
    world = len(hosts)
    hosts_of_block: dict[int, set[str]] = {}
    blocks_of_host: dict[str, set[int]] = {}
    for r in range(world):
        hosts_of_block.setdefault(r // per_node, set()).add(hosts[r])
        blocks_of_host.setdefault(hosts[r], set()).add(r // per_node)
    local_ok = all(value is None or value == r % per_node for r, value in enumerate(local))
    blocks_ok = all(len(s) == 1 for s in hosts_of_block.values()) and all(len(s) == 1 for s in blocks_of_host.values())
    assert report.node_blocks_match == (local_ok and blocks_ok)
    assert len(report.problems) == (not local_ok) + any(len(s) > 1 for s in hosts_of_block.values()) + any(
        len(s) > 1 for s in blocks_of_host.values()
    )
    # hosts in first-rank order; ranks_per_host when every host holds the same count of consecutive ranks
    order = list(dict.fromkeys(hosts))
    assert report.hosts == tuple((h, tuple(r for r in range(world) if hosts[r] == h)) for h in order)
    runs = [hosts[0]] + [hosts[r] for r in range(1, world) if hosts[r] != hosts[r - 1]]
    sizes = {hosts.count(h) for h in order}
    assert report.ranks_per_host == (sizes.pop() if len(runs) == len(order) and len(sizes) == 1 else None)
    assert json.loads(json.dumps(report.to_dict())) == report.to_dict()


# -- bad input --------------------------------------------------------------------------------------

GOOD = np.array([[0, 1], [2, 3]])


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (([], [], [], 4), "hosts must be a non-empty list"),
        (("abcd", [None] * 4, [], 4), "hosts must be a non-empty list"),
        ((["a"] * 4, [None] * 3, [], 4), "local_ranks must hold one LOCAL_RANK (or None) per host (4)"),
        ((["a", "a", 3, "a"], [None] * 4, [], 4), "hosts[2] must be a str"),
        ((["a"] * 4, [0, 1, "2", 3], [], 4), "local_ranks[2] must be an int or None, got '2'"),
        ((["a"] * 4, [0, 1, True, 3], [], 4), "local_ranks[2] must be an int or None, got True"),
        ((["a"] * 4, [None] * 4, [("tp", np.array([[0, 4]]))], 4), "family 'tp': rank 4 is outside the world of 4"),
        ((["a"] * 4, [None] * 4, [("tp", np.array([[-1, 0]]))], 4), "family 'tp': rank -1 is outside"),
        ((["a"] * 4, [None] * 4, [("tp", np.array([0, 1]))], 4), "family 'tp': groups must be a non-empty 2-D int"),
        ((["a"] * 4, [None] * 4, [("tp", np.zeros((0, 2), int))], 4), "non-empty 2-D int"),
        ((["a"] * 4, [None] * 4, [("tp", np.array([[0.0, 1.0]]))], 4), "non-empty 2-D int"),
        ((["a"] * 4, [None] * 4, [("tp", [[0, 1], [2]])], 4), "non-empty 2-D int"),
        ((["a"] * 4, [None] * 4, [(3, GOOD)], 4), "each family must be a (str key, groups) pair"),
        ((["a"] * 4, [None] * 4, [GOOD], 4), "each family must be a (str key, groups) pair"),
        ((["a"] * 4, [None] * 4, "tp", 4), "families must be a list"),
        ((["a"] * 4, [None] * 4, [], 0), "ranks_per_node must be a positive int or None, got 0"),
        ((["a"] * 4, [None] * 4, [], -4), "got -4"),
        ((["a"] * 4, [None] * 4, [], True), "ranks_per_node must be a positive int or None, got True"),
        ((["a"] * 4, [None] * 4, [], 4.0), "got 4.0"),
        ((["a"] * 4, [None] * 4, [], "4"), "got '4'"),
        ((["a"] * 4, [None] * 4, [], 4, "h100_8x"), "topology must be a Topology or None, got 'h100_8x'"),
    ],
)
def test_bad_input(args: tuple[object, ...], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        build_report(*args)  # type: ignore[arg-type]
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_numpy_ints_are_accepted() -> None:
    report = build_report(["a"] * 4, [np.int64(r) for r in range(4)], [("tp", GOOD.astype(np.uint8))], np.int64(4))
    assert report.ranks_per_node == 4 and type(report.ranks_per_node) is int and report.node_blocks_match


# -- the report's text and data ---------------------------------------------------------------------


def test_str_reads_as_a_report() -> None:
    hosts = ["a"] * 8 + ["b"] * 8
    local: list[int | None] = [r % 8 for r in range(16)]
    local[3] = 0
    families = [("tp", np.array(blocks(16, 4))), ("dp", np.array(strided(16, 4)))]
    lines = str(build_report(hosts, local, families, 8, H100)).splitlines()
    assert lines == [
        "placement: 16 ranks on 2 hosts (8 ranks per host); assumed 8 ranks per node: mismatch; "
        "topology tiers 'nvlink', 'ib'",
        "  host 'a': ranks 0-7",
        "  host 'b': ranks 8-15",
        "  tp: 4 groups of 4 ranks, each inside one host; priced on tier 'nvlink'",
        "  dp: 4 groups of 4 ranks, each across 2 hosts; priced on tier 'ib'",
        "warning: LOCAL_RANK is not rank % 8 on 1 rank: rank 3 on host 'a' has 0, expected 3",
    ]


def test_str_compresses_hosts_and_scattered_ranks() -> None:
    hosts = [f"h{r % 10}" for r in range(80)]  # round robin: h0 holds 0, 10, ..., 70
    text = str(build_report(hosts, [None] * 80, [], None))
    assert "  host 'h0': ranks 0, 10, 20, 30, ... and 4 more" in text.splitlines()
    assert "  ... and 2 more hosts" in text.splitlines()
    assert "host 'h8'" not in text


def test_to_dict_is_plain_json() -> None:
    families = [("tp", np.array(blocks(8, 4))), ("dp", np.array(strided(8, 4)))]
    report = build_report(["a"] * 4 + ["b"] * 4, [r % 4 for r in range(8)], families, 4, H100)
    data = report.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["world_size"] == 8 and data["topology"] == ["nvlink", "ib"]
    assert data["hosts"] == [{"host": "a", "ranks": [0, 1, 2, 3]}, {"host": "b", "ranks": [4, 5, 6, 7]}]
    assert (data["ranks_per_node"], data["ranks_per_host"], data["node_blocks_match"]) == (4, 4, True)
    assert data["families"][1] == {
        "key": "dp",
        "group_size": 2,
        "num_groups": 4,
        "min_hosts": 2,
        "max_hosts": 2,
        "groups_inside_one_host": 0,
        "tier": "nvlink",  # {0, 4} lies in NVLink unit 0-7
        "line": "dp: 4 groups of 2 ranks, each across 2 hosts; priced on tier 'nvlink'",
    }
    assert data["problems"] == [] and data["notes"] == [
        "tier 'nvlink' units of 8 ranks span hosts: cannot be verified from hostnames"
    ]
    assert data["warnings"] == []
