"""Recovery holds at the Nth failure (issue 31): successive SIGKILLs, a shrink after each, nothing grows.

Real gloo processes with 600 s group timeouts under a hard wall-clock limit. In
each round the last rank of the world dies; every survivor must end the round
with a working grid (a real reduction over it), and its hypergrid threads, open
file descriptors and the store's keys must not grow from round to round.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import WorkerDeath, spawn
from tests.workers import successive

pytestmark = [pytest.mark.processes]


def _check(results: list[Any], size: int, deaths: int) -> None:
    survivors = size - deaths
    for rank in range(survivors, size):
        assert isinstance(results[rank], WorkerDeath) and results[rank].exitcode == -9, (rank, results[rank])
    for rank in range(survivors):
        seen = results[rank]
        assert "error" not in seen, (rank, seen)
        rounds = seen["rounds"]
        assert len(rounds) == deaths + 1, (rank, seen)
        for number, now in enumerate(rounds[1:], start=1):
            world = size - number
            assert now["caught"] == [world] and now["dead"] == [world], (rank, number, now)
            assert now["world"] == world and now["first"] == float(world), (rank, number, now)
        first = rounds[0]
        for now in rounds[1:]:
            assert len(now["threads"]) == len(first["threads"]) == 1, (rank, rounds)  # the one watcher, handed on
            assert now["fds"] <= first["fds"], (rank, rounds)  # fewer peers, never more sockets
            assert now["keys"] <= first["keys"], (rank, rounds)  # nothing of an old world is left
            assert not [key for key in now["ours"] if "/world/" in key], (rank, rounds)  # torch's rendezvous keys


@pytest.mark.timeout(150)
def test_six_ranks_through_three_successive_deaths() -> None:
    """6 -> 5 -> 4 -> 3: each survivor recovers three times with a working grid and a flat footprint."""
    _check(spawn(successive.successive_deaths, 6, (3,), timeout_s=120, allow_deaths=True), 6, 3)


@pytest.mark.stress
@pytest.mark.timeout(240)
def test_eight_ranks_through_four_successive_deaths() -> None:
    """8 -> 7 -> 6 -> 5 -> 4."""
    _check(spawn(successive.successive_deaths, 8, (4,), timeout_s=200, allow_deaths=True), 8, 4)
