"""The consistency guard with real gloo processes: mismatches and dead ranks fail loudly, never hang."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hypergrid import WorkerDeath, spawn
from tests import workers

pytestmark = [pytest.mark.processes]


@pytest.fixture(scope="module")
def outcomes() -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = spawn(workers.guard_scenarios, 8, timeout_s=240)
    return results


@pytest.mark.timeout(300)
def test_mismatched_family_names_the_odd_rank_on_every_rank(outcomes: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        text = outcome["family"]
        assert text.startswith("DesyncError: ranks disagree"), text
        assert "rank(s) 0-2,4-7 asked for key 'tp'" in text
        assert "rank(s) 3 asked for key 'dp'" in text


@pytest.mark.timeout(300)
def test_mismatched_order_fails_both_creations_everywhere(outcomes: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        first, second = outcome["order"]
        assert "rank(s) 0-3 asked for key 'cp'" in first and "rank(s) 4-7 asked for key 'dp'" in first
        assert "rank(s) 0-3 asked for key 'dp'" in second and "rank(s) 4-7 asked for key 'cp'" in second


@pytest.mark.timeout(300)
def test_mismatched_grid_is_named(outcomes: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        text = outcome["grid"]
        assert "rank(s) 0 asked for key 'tp'" in text and "shape=[4, 2]" in text
        assert "rank(s) 1-7 asked for key 'tp'" in text and "shape=[2, 4]" in text


@pytest.mark.timeout(300)
def test_lazy_accessor_is_guarded_then_works(outcomes: list[dict[str, Any]]) -> None:
    for rank, outcome in enumerate(outcomes):
        assert "rank(s) 6 asked for key 'cp'" in outcome["lazy"]
        assert outcome["after"].startswith("ok ")
        assert outcome["after_sum"] == rank // 2 * 4 + 1  # tp pairs (2k, 2k+1)
        assert outcome["lazy_same"] is True


@pytest.mark.timeout(300)
def test_two_grids_and_a_rebuilt_grid_keep_their_sequence(outcomes: list[dict[str, Any]]) -> None:
    for rank, outcome in enumerate(outcomes):
        assert outcome["rebuilt"].startswith("ok "), outcome["rebuilt"]
        assert outcome["two_sum"] == sum(r for r in range(8) if r // 4 == rank // 4)  # tp of [4,2]
        assert outcome["recreate_after_uneven_destroy"] == rank // 2 * 4 + 1


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["kill", "absent"])
def test_a_dead_or_absent_rank_is_named_within_the_timeout(how: str) -> None:
    results = spawn(workers.dead_rank_during_creation, 4, (3, how, 5.0), timeout_s=150, allow_deaths=True)
    if how == "kill":
        assert isinstance(results[3], WorkerDeath) and results[3].exitcode != 0
    for rank in range(3):
        text = results[rank]
        assert text.startswith("GuardTimeoutError: rank(s) 3 of the 4 ranks"), text
        seconds = float(re.search(r"after ([0-9.]+) s$", text).group(1))  # type: ignore[union-attr]
        assert seconds < 5.0 + 5.0  # the timeout, plus the grace for the verdict


@pytest.mark.timeout(300)
def test_100_create_destroy_cycles_leave_no_group_behind() -> None:
    results = spawn(workers.create_destroy_cycles, 4, (100,), timeout_s=240)
    for result in results:
        assert result["peak"] == 3  # tp, dp, dp-tp: one group each per rank while alive
        assert result["left"] == 0
        assert result["sum"] == 6
