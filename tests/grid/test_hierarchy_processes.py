"""Hierarchical families on 8 real gloo ranks with LOCAL_WORLD_SIZE=4: membership, all_reduce, the guard.

Expected groups come from each rank's coordinates in the [2, 2, 2] (tp, cp, dp)
grid and its node (``rank // 4``), written out here, not from the grid.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.references import node_halves
from tests.workers import hierarchy as hierarchy_workers
from tests.workers.hierarchy import FAMILIES

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]
WORLD, PER_NODE = 8, 4


def coords(rank: int) -> dict[str, int]:
    return {"tp": rank % 2, "cp": rank // 2 % 2, "dp": rank // 4}


def family(rank: int, dims: list[str]) -> list[int]:
    mine = coords(rank)
    return [q for q in range(WORLD) if all(coords(q)[d] == mine[d] for d in mine if d not in dims)]


def within(rank: int, dims: list[str]) -> list[int]:
    return next(part for part in node_halves(family(rank, dims), PER_NODE)[0] if rank in part)


def across(rank: int, dims: list[str]) -> list[int]:
    return next(part for part in node_halves(family(rank, dims), PER_NODE)[1] if rank in part)


@pytest.fixture(scope="module", params=["enumerate", "local"])
def results(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(hierarchy_workers.halves_scenarios, WORLD, (request.param,), timeout_s=240)
    return out


def test_every_half_has_the_expected_members_and_reduces_through_them(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        for key in FAMILIES:
            dims = key.split("-")
            for scope, expected in (("within", within(rank, dims)), ("across", across(rank, dims))):
                got = result["halves"][f"{key}|{scope}"]
                assert got["ranks"] == expected, (rank, key, scope)
                assert got["sum"] == sum(q + 1 for q in expected), (rank, key, scope)
                assert got["lookup"] is True


def test_a_view_s_own_family_has_halves_too(results: list[dict[str, Any]]) -> None:
    # view [2, 4] (ep, edp): edp groups are the ranks with the same ep = rank % 2; nodes of 4.
    for rank, result in enumerate(results):
        edp = [q for q in range(WORLD) if q % 2 == rank % 2]
        on_node = [q for q in edp if q // PER_NODE == rank // PER_NODE]
        position = on_node.index(rank)
        assert result["halves"]["expert:edp|within"] == on_node
        assert result["halves"]["expert:edp|across"] == [q for q in edp if q % PER_NODE == on_node[position] % PER_NODE]
        assert "('expert', ('edp|within=node',))" in result["created_keys"]


def test_node_group_and_hierarchical_all_reduce(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        node = [q for q in range(WORLD) if q // PER_NODE == rank // PER_NODE]
        assert result["node"] == {"ranks": node, "sum": sum(q + 1 for q in node)}
        assert result["hierarchical"] == result["flat"] == sum((q + 1) ** 2 for q in family(rank, ["dp", "tp"]))
        assert result["tp_shared"] is True
        assert "dp|within=node" in result["created_keys"] and "dp-cp-tp|within=node" in result["created_keys"]


def test_hierarchical_all_reduce_equals_the_flat_one(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        for key, got in result["hier_allreduce"].items():
            group = family(rank, key.split("-"))
            base = [[float(3 * j + i) for j in range(7)] for i in range(3)]  # arange(21).reshape(7, 3).t()
            assert got["sum"] == [[v * sum(q + 1 for q in group) for v in row] for row in base], (rank, key)
            assert got["sum"] == got["flat"]
            assert got["max"] == [max(q * 7 % 5 for q in group), max(group)] == got["flat_max"]


def test_explicit_ranks_per_node(results: list[dict[str, Any]]) -> None:
    # [2, 4] (tp, dp) on nodes of 2: a node is one tp pair, so across nodes is the whole family.
    for rank, result in enumerate(results):
        dp = [q for q in range(WORLD) if q % 2 == rank % 2]
        assert result["explicit"] == {"dp|across=node": dp, "dp-tp|across=node": [q for q in dp]}


def test_errors_name_the_value(results: list[dict[str, Any]]) -> None:
    errors = results[0]["errors"]
    assert errors["exists"].startswith("GroupExistsError") and "dp|within=node" in errors["exists"]
    assert errors["both"].startswith("InvalidArgumentError") and "not both" in errors["both"]
    assert errors["level"].startswith("InvalidArgumentError") and "'rack'" in errors["level"]


@pytest.mark.parametrize("strategy", ["enumerate", "local"])
def test_ranks_that_disagree_on_the_node_size_raise(strategy: str) -> None:
    # [2, 2] (tp, dp) on 4 ranks; rank 0 alone believes in nodes of 2. "enumerate" agrees over the world;
    # "local" over each unsplit dp group: {0, 2} must raise, {1, 3} agree and go on.
    outcomes = spawn(hierarchy_workers.mismatch_scenario, 4, (strategy,), timeout_s=120)
    raising = range(4) if strategy == "enumerate" else (0, 2)
    for rank, outcome in enumerate(outcomes):
        if rank in raising:
            assert outcome.startswith("DesyncError") and "ranks_per_node" in outcome, (rank, outcome)
        else:
            assert outcome == "no error", (rank, outcome)


def test_a_half_is_cut_once_and_outsiders_take_part() -> None:
    outcomes = spawn(hierarchy_workers.node_size_scenarios, 4, timeout_s=120)
    for rank, out in enumerate(outcomes):
        for case in ("explicit", "pg"):
            assert out[case].startswith("InvalidArgumentError"), (rank, case, out[case])
            assert "created with ranks_per_node=4, not 2" in out[case]
        assert out["no_half"].startswith("UnexpectedArgumentError") and "ranks_per_node=2" in out["no_half"]
        assert out["mixed"].startswith("InvalidArgumentError") and "within: 4" in out["mixed"]
        assert "across: 2" in out["mixed"]
        if rank < 2:  # the sub-grid's ranks: the sum over ranks 0 and 1
            assert out["sub"] == "no error" and out["sub_value"] == str([3.0] * 5)
        else:
            assert out["sub"].startswith("RankError") and out["sub_value"] == str([float(rank + 1)] * 5)


HOSTS = {"blocks": lambda rank: rank // 4, "round_robin": lambda rank: rank % 2, "real": lambda rank: 0}
REPORTED = {"tp": ["tp"], "dp": ["dp"], "dp-tp": ["dp", "tp"]}


def _groups(dims: list[str], half: str | None = None) -> list[list[int]]:
    pick = {None: family, "across": across, "within": within}[half]
    return sorted({tuple(pick(rank, dims)) for rank in range(WORLD)})  # type: ignore[arg-type]


@pytest.fixture(scope="module", params=sorted(HOSTS))
def placement(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    out = spawn(hierarchy_workers.placement_scenario, WORLD, (request.param,), timeout_s=240)
    return request.param, out


def test_placement_reports_the_real_host_spans(placement: tuple[str, list[dict[str, Any]]]) -> None:
    mode, results = placement
    host = HOSTS[mode]
    expected_groups = {key: _groups(dims) for key, dims in REPORTED.items()}
    expected_groups["dp|across=node"] = _groups(["dp"], "across")
    for result in results:
        assert result["plain"] == results[0]["plain"]  # every rank gets the same report
        families = {entry["key"]: entry for entry in result["plain"]["families"]}
        assert set(families) == set(expected_groups)
        for key, groups in expected_groups.items():
            spans = [len({host(rank) for rank in group}) for group in groups]
            entry = families[key]
            assert (entry["min_hosts"], entry["max_hosts"]) == (min(spans), max(spans)), (mode, key)
            assert entry["groups_inside_one_host"] == spans.count(1), (mode, key)
            assert entry["num_groups"] == len(groups) and entry["group_size"] == len(groups[0])


def test_placement_checks_the_assumed_nodes(placement: tuple[str, list[dict[str, Any]]]) -> None:
    mode, results = placement
    report = results[0]
    hosts = {entry["host"] for entry in report["plain"]["hosts"]}
    if mode == "real":  # spawn's LOCAL_WORLD_SIZE=8 on this one host: the assumption holds
        assert hosts == {report["host"]} and report["plain"]["node_blocks_match"] is True
        assert report["plain"]["warnings"] == []
        assert report["assume_2"]["node_blocks_match"] is False
        assert any("2 ranks per node" in text and "0-7" in text for text in report["assume_2"]["warnings"])
    elif mode == "blocks":  # hosts are the assumed blocks of 4
        assert report["plain"]["node_blocks_match"] is True and report["plain"]["warnings"] == []
        assert report["priced"]["warnings"] == []
        tiers = {entry["key"]: entry["tier"] for entry in report["priced"]["families"]}
        assert tiers == {"tp": "nvlink", "dp": "ib", "dp-tp": "ib", "dp|across=node": "ib"}
        # h100_8x prices everything on 8-rank NVLink units, which here span two 4-rank hosts: noted, not verifiable
        assert {entry["tier"] for entry in report["h100"]["families"]} == {"nvlink"}
        assert any("cannot be verified" in text for text in report["h100"]["notes"])
        assert report["assume_2"]["node_blocks_match"] is False
    else:  # round-robin hosts against LOCAL_WORLD_SIZE=4: every check must object
        plain, priced = report["plain"], report["priced"]
        assert plain["node_blocks_match"] is False
        assert any("LOCAL_RANK" in text for text in plain["warnings"])
        assert any(text.startswith("tp:") for text in plain["warnings"])  # fits an assumed node, crosses hosts
        assert any(text.startswith("tp:") and "'nvlink'" in text for text in priced["warnings"])
        assert "warning: tp:" in report["text"]
