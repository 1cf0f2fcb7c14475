"""The guard's promise without holes: every desync raises on every rank, named; ranks out of step get back.

Each case is a hole found by trying the guard adversarially (issue 18): before
the fix, it hung in torch or went on with different groups on different ranks.
4 gloo ranks; rank 3 is the odd one.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.workers import faults

pytestmark = [pytest.mark.processes]


def _run(case: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = spawn(faults.desync, 4, (case,), timeout_s=150)
    return results


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("case", "error", "field"),
    [
        ("share_groups", "DesyncError: ranks disagree", "share_groups"),
        ("view", "DesyncError: ranks disagree", "views"),
        ("strategy", "DesyncError: ranks disagree", "strategy"),
        ("swapped_grids", "OutOfStepError: ranks are out of step", "grid_ordinal"),
    ],
)
def test_a_field_that_differs_on_one_rank_raises_on_every_rank_naming_it(case: str, error: str, field: str) -> None:
    for rank, outcome in enumerate(_run(case)):
        seen = outcome["first"]["seen"]
        assert seen.startswith(error), (rank, seen)
        assert f"They differ in: {field}" in seen or f", {field}" in seen, (rank, seen)
        assert outcome["first"]["seconds"] < 15, (rank, outcome["first"])  # well before the 20 s timeout


@pytest.mark.timeout(200)
def test_destroy_on_one_rank_then_a_shared_family_is_out_of_step_everywhere_then_recovers() -> None:
    for rank, outcome in enumerate(_run("destroy_one")):
        seen = outcome["first"]["seen"]
        assert seen.startswith("OutOfStepError"), (rank, seen)
        assert "They differ in:" in seen and "epoch" in seen and "grid.destroy() on every rank" in seen
        assert outcome["tries"][-1]["seen"].startswith("ok"), (rank, outcome["tries"])
        assert len(outcome["tries"]) == 1, outcome  # in step again after one destroy() on every rank


@pytest.mark.timeout(200)
def test_a_skipped_call_names_what_each_rank_called_and_destroy_brings_everyone_back() -> None:
    outcomes = _run("skipped")
    for rank, outcome in enumerate(outcomes):
        first = outcome["first"]["seen"]
        assert first.startswith("DesyncError"), (rank, first)
        assert "rank(s) 0-2 asked for create_pg('tp')" in first and "rank(s) 3 asked for create_pg('dp')" in first
    for rank in range(3):  # their next call waits for rank 3, which went on to recover instead
        second = outcomes[rank]["second"]["seen"]
        assert second.startswith("OutOfStepError"), (rank, second)
        assert "asked for create_pg('dp')" in second and "create_pg('tp')" in second
    for rank, outcome in enumerate(outcomes):
        # No rank is told about a request it did not make: each error names this rank's own request.
        for attempt in outcome["tries"][:-1]:
            assert attempt["seen"].startswith("OutOfStepError"), (rank, attempt)
        assert outcome["tries"][-1]["seen"] == f"ok {_tp(rank)}", outcome
        assert len(outcome["tries"]) <= 2, outcome  # in step again after one destroy() on every rank
        assert outcome["sum"] == sum(_tp(rank))


def _tp(rank: int) -> list[int]:
    return [rank - rank % 2, rank - rank % 2 + 1]


@pytest.mark.timeout(200)
def test_calls_reordered_across_three_grids_are_out_of_step_everywhere_and_recover_in_one_destroy_round() -> None:
    outcomes = _run("three_grids")
    for rank, outcome in enumerate(outcomes):
        first = outcome["first"]["seen"]
        assert first.startswith("OutOfStepError: ranks are out of step"), (rank, first)
        assert outcome["first"]["seconds"] < 15, (rank, outcome["first"])  # found by a probe, not the timeout
        # At most two destroy() rounds (destroy() of every grid on every rank, then the calls again).
        assert len(outcome["tries"]) <= 2 and outcome["tries"][-1]["seen"].startswith("ok"), (rank, outcome)
        assert outcome["sums"] == [sum(_tp(rank))] * 3
    # destroy() of every grid leaves the store as the world found it: no guard key (the released counts too).
    assert len({outcome["left"] for outcome in outcomes}) == 1
