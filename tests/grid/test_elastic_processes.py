"""The elastic grid with real gloo processes: a rank dies in a step, the survivors shrink (or draft a spare) and finish.

Each run trains tp=2 x dp=4 (tests/workers/elastic.py); every survivor's outcome is
checked: the error it caught, its Regrid, the new groups against a freshly
built grid of the new shape, and its final weights against a plain
single-process run (the same full-batch steps, whatever dp is).
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import HyperCommGrid, spawn
from hypergrid.launch.processes import WorkerDeath
from tests.workers import elastic

pytestmark = pytest.mark.processes

STEPS, AT = 5, 2


def _check_survivors(results: list[Any], victims: list[int], shape: list[int], retired: list[int]) -> None:
    """Every survivor caught RankFailure and agrees; the new world is the fresh grid of ``shape``, weights exact."""
    reference = elastic.reference_weights(STEPS)
    fresh = HyperCommGrid(shape, ["tp", "dp"])
    for old_rank, result in enumerate(results):
        if old_rank in victims:
            assert isinstance(result, WorkerDeath), result
            continue
        assert result["regrid"]["dead"] == sorted(victims), (old_rank, result)
        assert result["regrid"]["epoch"] == 1
        if old_rank in retired:
            assert result["regrid"]["retired"] and result["regrid"]["rank"] is None
            assert result["regrid"]["step"] is None  # a retired rank resumes nothing
            continue
        assert result["regrid"]["step"] == AT, (old_rank, result["regrid"])  # every survivor passed step=AT
        assert not result["regrid"]["retired"]
        assert result["shape"] == shape and result["world"] == fresh.size
        assert result["new_keys"] == result["old_keys"]
        rank = result["rank"]
        for key, members in result["groups"].items():
            family = key.split("@")[0]
            assert members == fresh.layout.group_ranks(family, rank), (key, rank)
        tp = result["coords"]["tp"]
        assert result["w"] == pytest.approx(reference[tp * 4 : tp * 4 + 4], rel=1e-9, abs=1e-12)
    kept = [r for r in range(len(results)) if r not in victims and r not in retired]
    assert sorted(results[r]["rank"] for r in kept) == list(range(len(kept)))


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "victim", [3, pytest.param(0, marks=[pytest.mark.slow, pytest.mark.stress])], ids=["middle-rank", "rank0"]
)
def test_one_death_drops_its_slice(victim: int) -> None:
    results = spawn(elastic.train, 8, (STEPS, [victim], AT, True), timeout_s=120, allow_deaths=True)
    survivors = [r for r in results if not isinstance(r, WorkerDeath)]
    assert {r["caught"] for r in survivors} == {"RankFailure"}
    for r in survivors:  # torch's own error from a collective with the dead rank, or the watcher's news naming it
        assert r["cause"] == "RuntimeError" or (r["cause"] == "NoneType" and r["named"] == [victim]), r
    partner = victim ^ 1  # the other tp rank of the dead rank's dp slice
    _check_survivors(results, [victim], [2, 3], [partner])


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_deaths_in_one_slice_found_by_timeout() -> None:
    """Nobody names the dead: shrink waits its timeout, finds both, and removes one slice (dp 4 -> 3)."""
    results = spawn(elastic.train, 8, (STEPS, [4, 5], AT, False), timeout_s=120, allow_deaths=True)
    _check_survivors(results, [4, 5], [2, 3], [])


@pytest.mark.slow
@pytest.mark.stress  # one death in make test (test_one_death_drops_its_slice), two here
@pytest.mark.timeout(150)
def test_two_deaths_in_two_slices() -> None:
    results = spawn(elastic.train, 8, (STEPS, [1, 4], AT, True), timeout_s=120, allow_deaths=True)
    _check_survivors(results, [1, 4], [2, 2], [0, 5])


@pytest.mark.timeout(150)
def test_a_spare_takes_over_and_the_run_matches_an_uninterrupted_one() -> None:
    results = spawn(elastic.train, 9, (STEPS, [5], AT, True, "spares", 1), timeout_s=120, allow_deaths=True)
    spare = results[8]
    assert spare["drafted"] and spare["rank"] == 5 and spare["regrid"]["policy"] == "spares"
    assert spare["regrid"]["source"] == {5: 1}  # old rank 1: tp=1 like the dead rank 5, another dp slice
    _check_survivors(results, [5], [2, 4], [])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_survivor_that_never_shrinks_is_declared_dead() -> None:
    results = spawn(elastic.absent_survivor, 8, (3.0, 8.0), timeout_s=60, allow_deaths=True)
    for rank, result in enumerate(results):
        if rank in (3, 5):
            continue
        assert result["regrid"]["dead"] == [3, 5], (rank, result)
        if not result["regrid"]["retired"]:
            assert result["world"] == 4 and result["sum"] == 4.0  # dp 4 -> 2: slices 1 and 2 removed


@pytest.mark.timeout(90)
def test_abort_returns_at_once_with_a_dead_peer() -> None:
    results = spawn(elastic.abort_with_dead_peer, 4, (30.0,), timeout_s=60, allow_deaths=True)
    for rank, result in enumerate(results):
        if rank == 3:
            assert isinstance(result, WorkerDeath)
            continue
        assert result["keys"] == []
        assert result["abort_s"] < 10.0  # a bound far below the groups' 30 s timeout, not a timing claim


@pytest.mark.timeout(90)
def test_impossible_shrinks_fail_before_anything_is_torn_down() -> None:
    for rank, result in enumerate(spawn(elastic.bad_inputs, 4, timeout_s=60)):
        assert result["outside"].startswith("RankError") and "[4]" in result["outside"]
        assert result["negative"].startswith("RankError")
        assert result["self"].startswith("RankError") and f"calling rank {rank}" in result["self"]
        assert result["dim"].startswith("DimsError") and "'cp'" in result["dim"]
        assert result["policy"].startswith("InvalidArgumentError") and "shuffle" in result["policy"]
        assert result["still_working"] == "4.0"


@pytest.mark.timeout(90)
def test_released_spares_leave_standby() -> None:
    results = spawn(elastic.released_spare, 4, timeout_s=60)
    assert results == [{"sum": 3.0}] * 3 + [{"standby": None}]
