"""Creation is atomic under failure (issue 31): a death at any point of a creation leaves equal registries.

Real gloo processes, 8 ranks, 600 s group timeouts, under a hard wall-clock
limit (`tests.workers.atomic`). In each round rank 3 of the current world dies
at one point of a creation; every survivor must raise ``RankFailure`` naming
it, hold the same registry as every other survivor (the failed call's
families rolled back everywhere, or, once the commit passed, kept everywhere),
then ``shrink`` and get the right sum from a real all-reduce over the new grid.
Before the fix a death inside torch's enumeration left the ranks outside the
victim's group holding ``dp`` and its members not, and ``shrink`` raised
``DesyncError`` on every survivor after its timeout.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import WorkerDeath, spawn
from tests.workers import atomic

pytestmark = [pytest.mark.processes]

#: What every survivor holds after the failed creation of each point, and on the grid ``shrink`` returns.
HELD = {"before": ["tp"], "torch": ["tp"], "registered": ["tp"], "committed": ["tp", "dp", "dp-tp"]}


def _check(results: list[Any], points: list[str], strategy: str = "enumerate") -> None:
    """Every survivor of every round: the failure, equal registries, a shrink, the right all-reduce."""
    alive = {index: result for index, result in enumerate(results) if not isinstance(result, WorkerDeath)}
    deaths = [result for result in results if isinstance(result, WorkerDeath)]
    assert len(deaths) == len(points), results
    assert all(death.exitcode in (17, -9) for death in deaths), deaths
    for number, point in enumerate(points):
        # The survivors of round `number`: every rank that recorded it (the victim never returns one).
        here = {index: out["rounds"][number] for index, out in alive.items() if len(out["rounds"]) > number}
        assert here, (point, results)
        for index, seen in here.items():
            assert "error" not in seen, (point, index, seen)
            assert seen["caught"] == "RankFailure" or seen["caught"].endswith("Error"), (point, index, seen)
            assert seen["dead"] == [atomic.VICTIM], (point, index, seen)
            if strategy == "enumerate":  # the same registry on every survivor
                assert seen["keys"] == HELD[point], (point, index, seen)
            else:  # each group commits alone: the victim's group rolled "dp" back, the other kept it
                assert seen["keys"] in (HELD[point], ["tp", "dp"]), (point, index, seen)
            assert seen["shrunk"] == [atomic.VICTIM], (point, index, seen)
            if not seen["retired"]:
                assert seen["new_keys"] == HELD[point], (point, index, seen)
                assert seen["sum"] == seen["expected"], (point, index, seen)


@pytest.mark.timeout(240)
def test_a_death_inside_torch_then_after_registering_leaves_equal_registries_and_shrink_works() -> None:
    """8 -> 6 -> 4: a death inside torch's enumeration, then one after every rank registered its families."""
    points = ["torch", "registered"]
    _check(spawn(atomic.creation_deaths, 8, (points,), timeout_s=200, allow_deaths=True), points)


@pytest.mark.stress
@pytest.mark.timeout(300)
def test_a_death_before_the_guard_then_after_the_commit_then_inside_torch() -> None:
    """8 -> 6 -> 4 -> 2: a death before the guard round, then after the commit, then inside torch."""
    points = ["before", "committed", "torch"]
    _check(spawn(atomic.creation_deaths, 8, (points,), timeout_s=260, allow_deaths=True), points)


@pytest.mark.timeout(200)
def test_under_local_a_death_inside_torch_leaves_the_groups_apart_and_shrink_keeps_what_all_hold() -> None:
    """8 -> 6 under "local": the victim's group rolls "dp" back, the other keeps it; shrink re-creates "tp" only."""
    results = spawn(atomic.creation_deaths, 8, (["torch"], "local"), timeout_s=160, allow_deaths=True)
    _check(results, ["torch"], "local")
    held = {tuple(out["rounds"][0]["keys"]) for out in results if isinstance(out, dict)}
    assert held == {("tp",), ("tp", "dp")}, held  # both kinds seen: the groups did part
