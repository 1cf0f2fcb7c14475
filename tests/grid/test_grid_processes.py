"""Real processes: 8 gloo ranks create every family of a [2,2,2] grid and all-reduce in it."""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import GridLayout, spawn
from tests.workers import basic as workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

LAYOUT = GridLayout([2, 2, 2], ["tp", "cp", "dp"])


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers.grid_scenarios, 8, timeout_s=180)
    return out


def test_every_family_all_reduces_to_its_group_sum(results: list[dict[str, Any]]) -> None:
    assert len(LAYOUT.all_families()) == 7
    for result in results:
        rank = result["rank"]
        assert set(result["families"]) == {LAYOUT.key(f) for f in LAYOUT.all_families()}
        for key, seen in result["families"].items():
            expected = LAYOUT.group_ranks(key, rank)
            assert seen["ranks"] == expected, (rank, key)
            assert seen["sum"] == sum(expected), (rank, key)
            assert seen["group_rank"] == expected.index(rank)


def test_groups_match_the_enumeration_on_every_rank(results: list[dict[str, Any]]) -> None:
    for key in results[0]["families"]:
        seen = sorted({tuple(r["families"][key]["ranks"]) for r in results})
        assert [list(g) for g in seen] == sorted(LAYOUT.rank_enum(key))


def test_get_pg_in_another_order_returns_the_same_object(results: list[dict[str, Any]]) -> None:
    assert all(seen["same_object"] for r in results for seen in r["families"].values())


def test_kwargs_reach_torch(results: list[dict[str, Any]]) -> None:
    assert all(seen["desc"] == f"HG_{key}" for r in results for key, seen in r["families"].items())


def test_recreating_a_family_raises_key_error(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert "'cp-tp'" in result["recreate"] and "has already been created" in result["recreate"]


def test_offset_grid_gives_non_members_none(results: list[dict[str, Any]]) -> None:
    offset = GridLayout([2, 2], ["tp", "dp"], rank_offset=4)
    for result in results:
        rank = result["rank"]
        assert result["in_offset_grid"] == (rank >= 4)
        assert result["offset_get_pg_none"] == (rank < 4)
        for key, total in result["offset"].items():
            assert total == (sum(offset.group_ranks(key, rank)) if rank >= 4 else None)


def test_destroy_then_create_again(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert result["after_destroy_keys"] == []
        assert result["old_still_registered"] is False
        assert result["recreated_is_new"]
        assert result["recreated_sum"] == sum(LAYOUT.group_ranks("tp", result["rank"]))
