"""Checked collectives on 4 real gloo ranks: every mismatch kind raises on every rank, matching calls are unchanged.

Without the check these calls are undefined in torch (garbage, a hang, or
SIGABRT: float64 against float32 aborts rank 0); with it, every rank raises
``CollectiveMismatchError`` naming each distinct call and its ranks. Expected
results of matching calls come from the unchecked grid in a separate run.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypergrid import CollectiveMismatchError, HyperCommGrid, InvalidArgumentError, spawn
from hypergrid.ops.checks import signature
from tests.workers import checks as workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]
WORLD = 4


@pytest.fixture(scope="module", params=[False, True], ids=["keyword", "environment"])
def outcomes(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers.mismatch_scenarios, WORLD, (request.param,), timeout_s=200)
    return out


KINDS = sorted(workers.mismatches(0))


@pytest.mark.parametrize("kind", KINDS)
def test_each_mismatch_raises_on_every_rank_naming_both_calls(outcomes: list[dict[str, Any]], kind: str) -> None:
    field = workers.mismatches(0)[kind][1]
    for rank, outcome in enumerate(outcomes):
        assert outcome["checking"] is True
        seen = outcome[kind]
        assert seen["error"] == "CollectiveMismatchError", (rank, kind, seen)
        signatures = seen["signatures"]
        assert sorted(signatures.values()) == [[0, 1, 2], [workers.ODD]], (rank, signatures)
        odd = next(text for text, ranks in signatures.items() if ranks == [workers.ODD])
        usual = next(text for text, ranks in signatures.items() if ranks != [workers.ODD])
        assert f"{field}=" in odd and odd != usual, (odd, usual)
        assert "rank(s) 0-2" in seen["message"] and f"rank(s) {workers.ODD}" in seen["message"]


def test_the_groups_still_work_after_the_mismatches(outcomes: list[dict[str, Any]]) -> None:
    expected = sum(torch.arange(4.0) + 100 * rank for rank in range(WORLD)).tolist()
    assert [outcome["after"] for outcome in outcomes] == [expected] * WORLD


def test_matching_calls_give_the_results_of_unchecked_ones() -> None:
    both = spawn(workers.matching_calls_both, WORLD, timeout_s=200)  # one world, a checked grid then an unchecked
    checked, unchecked = [pair[0] for pair in both], [pair[1] for pair in both]
    assert checked == unchecked
    # and the unchecked results are right: all_reduce over every rank sums every rank's data
    total = sum(torch.arange(6.0) + 100 * rank for rank in range(WORLD)).tolist()
    assert all(result[workers.FAMILY]["all_reduce"] == total for result in checked)


def test_checking_is_off_by_default_and_the_flag_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYPERGRID_CHECK_COLLECTIVES", raising=False)
    assert HyperCommGrid([2], ["dp"]).check_collectives is False
    monkeypatch.setenv("HYPERGRID_CHECK_COLLECTIVES", "1")
    assert HyperCommGrid([2], ["dp"]).check_collectives is True
    assert HyperCommGrid([2], ["dp"], check_collectives=False).check_collectives is False
    with pytest.raises(InvalidArgumentError, match="check_collectives"):
        HyperCommGrid([2], ["dp"], check_collectives=1)  # type: ignore[arg-type]


def test_signatures_tell_every_field_apart() -> None:
    base = signature("all_reduce", torch.ones(2, 3), torch.distributed.ReduceOp.SUM)
    others = [
        signature("all_reduce", torch.ones(3, 2), torch.distributed.ReduceOp.SUM),
        signature("all_reduce", torch.ones(2, 3, dtype=torch.float64), torch.distributed.ReduceOp.SUM),
        signature("all_reduce", torch.ones(2, 3), torch.distributed.ReduceOp.MAX),
        signature("all_reduce", torch.ones(2, 3).to_sparse(), torch.distributed.ReduceOp.SUM),
        signature("all_reduce", torch.ones(1, 1, 1, 1, 1, 1, 2, 3), torch.distributed.ReduceOp.SUM),
        signature("all_reduce", [1.0], torch.distributed.ReduceOp.SUM),
        signature("all_gather", torch.ones(2, 3), torch.distributed.ReduceOp.SUM),
    ]
    assert all(other != base and len(other) == len(base) for other in others)
    deep = [signature("all_gather", torch.ones(1, 1, 1, 1, 1, 1, n, 2)) for n in (2, 3)]
    assert deep[0] != deep[1]  # dims beyond the sixth still count


def test_error_class() -> None:
    assert issubclass(CollectiveMismatchError, RuntimeError)


def test_a_rank_with_another_setting_is_refused_at_creation_on_every_rank() -> None:
    outcomes = spawn(workers.one_rank_checks, WORLD, timeout_s=200)
    assert all(outcome.startswith("DesyncError") and "check_collectives" in outcome for outcome in outcomes), outcomes


# -- calls that can never meet: another family, a skipped or an extra call (600 s group timeouts) ----------

#: Seconds within which every rank must raise: a few ticks of hypergrid.ops.deadlocks, far below any timeout.
NEVER_MEET_BOUND_S = 30


MISMATCHED_ARGUMENTS = ["average_gradients parameters", "average_gradients buckets", "exchange shapes"]


@pytest.fixture(scope="module")
def never_meeting() -> list[dict[str, dict[str, Any]]]:
    """One world of ``WORLD`` ranks for every case of calls that never meet, one after the other."""
    out: list[dict[str, dict[str, Any]]] = spawn(
        workers.each, WORLD, (workers.never_meet, list(workers.NEVER_MEET)), timeout_s=240
    )
    return out


@pytest.fixture(scope="module")
def mismatching() -> list[dict[str, dict[str, Any]]]:
    """One world of ``WORLD`` ranks for every case of mismatched arguments, one after the other."""
    out: list[dict[str, dict[str, Any]]] = spawn(
        workers.each, WORLD, (workers.mismatched_arguments, MISMATCHED_ARGUMENTS), timeout_s=240
    )
    return out


@pytest.mark.parametrize("case", workers.NEVER_MEET)
def test_calls_that_never_meet_raise_a_mismatch_on_every_rank_soon(
    never_meeting: list[dict[str, dict[str, Any]]], case: str
) -> None:
    outcomes = [per_rank[case] for per_rank in never_meeting]
    for rank, outcome in enumerate(outcomes):
        assert outcome["error"] == "CollectiveMismatchError", (rank, outcome)
        assert outcome["seconds"] < NEVER_MEET_BOUND_S, (rank, outcome)
        assert "never meet" in outcome["message"] and "destroy()" in outcome["message"], outcome["message"]
        assert outcome["after"] == [4.0, 4.0], (rank, outcome)  # after destroy() the grid works again


@pytest.mark.parametrize("case", MISMATCHED_ARGUMENTS)
def test_average_gradients_and_exchange_are_checked(mismatching: list[dict[str, dict[str, Any]]], case: str) -> None:
    outcomes = [per_rank[case] for per_rank in mismatching]
    raised = [rank for rank, outcome in enumerate(outcomes) if outcome["error"] == "CollectiveMismatchError"]
    if case.startswith("exchange"):
        # Stage 3 receives a tensor of another shape than stage 2 sends: every stage of the pipeline raises.
        assert raised == [0, 1, 2, 3], outcomes
        assert "recv_prev of stage 3 (rank 3)" in outcomes[0]["message"], outcomes[0]["message"]
    else:
        # dp groups are [0, 2] and [1, 3]: rank 3's group raises; the other group's gradients matched.
        assert raised == [1, 3] and outcomes[0]["error"] is None and outcomes[2]["error"] is None, outcomes
        assert "average_gradients(" in outcomes[1]["message"], outcomes[1]["message"]
    assert all(outcome["seconds"] < NEVER_MEET_BOUND_S for outcome in outcomes), outcomes
