"""The consistency guard with real gloo processes: mismatches and dead ranks fail loudly, never hang."""

from __future__ import annotations

import re
from typing import Any

import pytest

from hypergrid import GridLayout, WorkerDeath, spawn
from tests.workers import basic as workers
from tests.workers import guard as guard_workers

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
        assert "rank(s) 0-2,4-7 asked for create_pg('tp') on grid tp2\u00d7cp2\u00d7dp2 as its creation #0" in text
        assert "rank(s) 3 asked for create_pg('dp')" in text
        assert text.endswith("They differ in: keys.")


@pytest.mark.timeout(300)
def test_mismatched_order_fails_both_creations_everywhere(outcomes: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        first, second = outcome["order"]
        assert "rank(s) 0-3 asked for create_pg('cp')" in first and "rank(s) 4-7 asked for create_pg('dp')" in first
        assert "rank(s) 0-3 asked for create_pg('dp')" in second and "rank(s) 4-7 asked for create_pg('cp')" in second


@pytest.mark.timeout(300)
def test_mismatched_grid_is_named(outcomes: list[dict[str, Any]]) -> None:
    # Different grids are different rounds: each finds the other's ranks stuck there, and both end alike.
    for outcome in outcomes:
        text = outcome["grid"]
        assert text.startswith("OutOfStepError: ranks are out of step"), text
        assert "rank(s) 0 asked for create_pg('tp') on grid tp4\u00d7dp2" in text
        assert "rank(s) 1-7 asked for create_pg('tp') on grid tp2\u00d7dp4" in text
        assert "They differ in: grid." in text


@pytest.mark.timeout(300)
def test_lazy_accessor_is_guarded_then_works(outcomes: list[dict[str, Any]]) -> None:
    for rank, outcome in enumerate(outcomes):
        assert "rank(s) 6 asked for create_pg('cp')" in outcome["lazy"]
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
        if how == "kill":  # the world's roll call (asked at the timeout) finds it dead: the world's failure
            assert text.startswith("RankFailure: create_pg('dp') on grid "), text
            assert "failed: rank(s) 3 stopped answering" in text, text
        else:  # alive (its watcher answers): missing, never named dead
            assert text.startswith("GuardTimeoutError: rank(s) 3 of the 4 ranks that must create create_pg('dp')"), text
            assert "did not arrive within 5 s" in text  # the configured timeout, quoted exactly
            assert "rank(s) 3 still answer the world's roll call" in text, text
        seconds = float(re.search(r"after ([0-9.]+) s$", text).group(1))  # type: ignore[union-attr]
        assert seconds < 5.0 + 5.0  # within the timeout (plus a margin for a loaded host)


@pytest.mark.timeout(300)
def test_100_create_destroy_cycles_leave_no_group_behind() -> None:
    results = spawn(workers.create_destroy_cycles, 4, (100,), timeout_s=240)
    for result in results:
        assert result["peak"] == 2  # tp, dp: one group each per rank while alive (dp-tp is the default group)
        assert result["left"] == 0
        assert result["sum"] == 6


@pytest.fixture(scope="module")
def more() -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = spawn(guard_workers.ops_and_failures, 8, timeout_s=240)
    return results


@pytest.mark.timeout(300)
def test_store_operations_per_rank_are_at_most_8_at_4_and_at_8(more: list[dict[str, Any]]) -> None:
    # One creation: the guard round (4 per rank: count, roster, wait and read, or publish and delete) and the
    # commit after torch (an add, then wait and read, or publish), plus at most one of the 4 deletes of what
    # every member has read (the round's roster and verdict, the commit's count, the previous commit's
    # verdict): at most 8 per rank, at least 6, whatever the world.
    at_8 = [outcome["ops"] for outcome in more]
    at_4 = spawn(guard_workers.store_ops, 4, timeout_s=200)
    for results, families in ((at_4, 3), (at_8, 7)):
        assert all(len(result["per_family"]) == families for result in results)
        assert all(6 <= ops <= 8 for result in results for ops in result["per_family"]), results
        assert all(result["families"] == families and 6 <= result["batch"] <= 8 for result in results)
    # The batch's groups are the right ones.
    layout = GridLayout([2, 2, 2], ["tp", "cp", "dp"])
    for rank, result in enumerate(at_8):
        assert result["sums"] == {layout.key(f): sum(layout.group_ranks(f, rank)) for f in layout.all_families()}


@pytest.mark.timeout(300)
def test_a_skipped_call_fails_on_every_rank_naming_the_rank(more: list[dict[str, Any]]) -> None:
    for outcome in more:
        text = outcome["skipped"]
        assert text.startswith("DesyncError: ranks disagree"), text
        assert "rank(s) 0-2,4-7 asked for create_pg('tp')" in text and "rank(s) 3 asked for create_pg('dp')" in text


@pytest.mark.timeout(300)
def test_a_differing_guard_timeout_fails_on_every_rank_naming_the_rank(more: list[dict[str, Any]]) -> None:
    for outcome in more:
        text = outcome["timeout_differs"]
        assert "rank(s) 0 asked for create_pg('tp')" in text and text.count("guard_timeout_s=30") == 1, text
        assert "rank(s) 1-7 asked for create_pg('tp')" in text and "They differ in: guard_timeout_s." in text


@pytest.mark.timeout(300)
def test_create_pgs_agrees_whatever_the_order_and_names_a_differing_batch(more: list[dict[str, Any]]) -> None:
    layout = GridLayout([2, 2, 2], ["tp", "cp", "dp"])
    for rank, outcome in enumerate(more):
        assert outcome["batch_keys"] == [layout.key(family) for family in layout.all_families()]
        assert outcome["batch_sums"] == {
            layout.key(family): sum(layout.group_ranks(family, rank)) for family in layout.all_families()
        }
        text = outcome["batch_mismatch"]
        assert "rank(s) 5 asked for create_pgs(['tp', 'cp', 'dp', 'cp-tp', 'dp-tp', 'dp-cp'])" in text, text
        assert "rank(s) 0-4,6-7 asked for create_pgs(['tp', 'cp', 'dp', 'cp-tp', 'dp-tp', 'dp-cp', 'dp-cp-tp'])" in text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rounds", [100, pytest.param(1000, marks=pytest.mark.stress)])
def test_keys_left_in_the_store_stay_bounded_and_destroy_removes_them(rounds: int) -> None:
    results = spawn(guard_workers.store_hygiene, 2, (rounds,), timeout_s=240)
    for rank, result in enumerate(results):
        # At most one round in flight (its 4 keys and a roll call) and the two announcements.
        assert all(0 <= keys <= 7 for keys in result["during"]), result
        assert result["after_successes"] == 0
        # After the rounds: the last commit's verdict (each commit deletes the one before), and an announcement for
        # each rank that ever waited past half its probe time (none on a quiet host).
        assert all(1 <= keys <= 3 for keys in result["steady"]), result
        assert result["after_steady_destroy"] == 0
        # 5 mismatches: each failed round keeps its roster and verdict until destroy() (or the grid's next
        # completed round); every rank waited for the probe that found the mismatch, so both announced.
        assert result["after_mismatches"] == 5 * 2 + 2
        assert result["after_mismatch_destroy"] == 0
        for text in result["timeouts"]:
            assert text.startswith("GuardTimeoutError: rank(s) 1 of the 2 ranks"), (rank, text)
            assert "did not arrive within 1 s" in text
        # Each timed-out round keeps its roster, verdict and roll call; and rank 0's announcement (rank 1 came
        # after the verdict: it never waited, so it never announced).
        assert result["after_timeouts"] == 2 * 3 + 1
        assert result["after_destroy"] == 0
        assert result["after_third_timeout"] == 3 + 1
        assert result["after_next_success"] == 1 + 1  # the failed round's keys gone; the commit's verdict
        assert result["after_final_destroy"] == 0
        assert result["world_keys"] == []  # no grid holds the world: every rank left it, the last took its keys
    progress = results[0]["progress"]
    assert progress and all(line.startswith("hypergrid: waiting ") for line in progress), progress
    assert all(
        "for create_pg('dp') on grid dp2: 1/2 ranks arrived; missing 1 (timeout 1 s)" in line for line in progress
    )
    assert results[1]["progress"] == []  # rank 1 arrived after the verdict: it never waited
