"""Every wait hears the verdict, and the stopped are fenced (issue 31 items 1 and 4).

Real gloo processes, production-like timeouts (guard rounds 300 s, groups
600 s) under a hard wall-clock limit: a wait that ends within seconds heard
the world's roll call, nothing else could end it. One spawned world per
scenario lives through every failure of the scenario, each absorbed by a
``shrink``; every survivor checks a real reduction on its new grid.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import WorkerDeath, spawn
from tests.workers import waits

pytestmark = [pytest.mark.processes]

#: How soon after the failure every waiting survivor must raise (the guard's own timeout is 300 s).
BOUND_S = 8.0


@pytest.mark.timeout(150)
def test_a_verdict_ends_every_guard_round_naming_the_dead() -> None:
    """A rank exiting on an error, then a SIGKILLed one: the ranks waiting in a guard round raise at once."""
    results: list[Any] = spawn(waits.verdicts_in_guard_rounds, 4, timeout_s=120, allow_deaths=True)
    assert isinstance(results[3], WorkerDeath) and results[3].exitcode == 1, results[3]
    assert isinstance(results[2], WorkerDeath) and results[2].exitcode == -9, results[2]
    for rank in (0, 1):
        seen = results[rank]
        assert seen["first"] == 4.0, seen
        assert seen["round1"]["type"] == "RankFailure" and seen["round1"]["dead"] == [3], seen
        assert seen["round1"]["seconds"] < BOUND_S, seen
        assert seen["after1"] == {"dead": [3], "world": 3, "sum": 3.0}, seen
        assert seen["after2"] == {"dead": [2], "world": 2, "sum": 2.0}, seen
        assert seen["keys"] == [], seen  # the failed rounds, the roll calls, the worlds' records: all gone
    # Round 2: rank 0 waited in create_pgs' round, rank 1 shrank (its roll call is the verdict).
    assert results[0]["round2"]["dead"] == [2] and results[0]["round2"]["seconds"] < BOUND_S, results[0]


@pytest.mark.timeout(180)
def test_stopped_p2p_senders_are_found_and_fenced_when_they_resume(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGSTOPped sender in exchange, then in a Bridge: the others raise within seconds, shrink past it, and
    the stopped rank, resumed after the shrink, gets FencedError on its next calls."""
    monkeypatch.setenv("HYPERGRID_PROBE_S", "1")  # a wait probes after 1 s, as a collective's does
    results: list[Any] = spawn(waits.stopped_p2p_senders, 6, timeout_s=150)
    assert [results[rank]["first"] for rank in (1, 3, 5)] == [1.0, 2.0, 3.0], results  # each dp slice's step
    assert results[0]["resumed"] == ["FencedError", "FencedError"], results[0]
    seen = results[1]  # the one rank waiting on rank 0, in exchange: its own probe found it
    assert seen["round1"] == {"where": "exchange", "dead": [0], "seconds": seen["round1"]["seconds"],
                              "type": "RankFailure"}, seen  # fmt: skip
    assert seen["round1"]["seconds"] < BOUND_S, seen
    for rank in range(1, 6):
        assert results[rank]["after1"]["dead"] == [0], (rank, results[rank])
    assert results[1]["after1"]["retired"], results[1]  # dp slice 0
    # Round 2 on the world of 4 (old ranks 2-5): new rank 0 (old 2) stops inside the bridge.
    assert results[2]["resumed2"] == ["FencedError", "FencedError"], results[2]
    for old in (3, 4, 5):
        seen = results[old]
        assert seen["after1"] == {"dead": [0], "retired": False, "world": 4, "sum": 4.0}, (old, seen)
        assert seen["round2"]["dead"] == [0] and seen["round2"]["seconds"] < BOUND_S, (old, seen)
        assert seen["round2"]["where"] == "bridge", (old, seen)
    for old in (4, 5):  # the last world: old 4, 5; old 3 retired with the dropped slice
        assert results[old]["after2"] == {"dead": [0], "retired": False, "world": 2, "sum": 2.0}, results[old]
        assert results[old]["keys"] == [], results[old]
    assert results[3]["after2"]["retired"], results[3]


@pytest.mark.timeout(120)
def test_a_spare_stopped_through_a_shrink_is_fenced_in_standby() -> None:
    """A SIGSTOPped spare, resumed after the others shrank past it: its standby raises FencedError, never waits."""
    results: list[Any] = spawn(waits.stopped_spare, 4, timeout_s=90)
    assert results[3] == {"standby": "FencedError"}, results[3]
    for rank in (0, 1, 2):
        assert results[rank] == {"dead": [3], "world": 3, "sum": 3.0}, (rank, results[rank])


@pytest.mark.timeout(120)
def test_a_rank_fenced_inside_a_receive_whose_peer_never_closes_raises_fenced() -> None:
    """Rank 1 blocks in a receive from a live rank that never sends; the world's end names it: FencedError.

    Only fencing's own severing can end that wait (no peer closes a connection, the group's timeout is 600 s).
    """
    results: list[Any] = spawn(waits.fenced_inside_a_receive, 3, timeout_s=90)
    assert results[1]["error"] == "FencedError", results[1]
    assert results[1]["seconds"] < BOUND_S, results[1]
