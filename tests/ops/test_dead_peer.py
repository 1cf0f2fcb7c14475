"""Every grid operation after a peer's death raises ``RankFailure`` (torch's error as ``__cause__``), never a raw error.

4 gloo ranks; rank 3 leaves with ``os._exit`` once every group exists; each
survivor runs each operation on a grid of its own, with 2 s group timeouts,
under a hard limit for the whole run.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import WorkerDeath, spawn
from tests.workers import dead_peer

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

SURVIVORS = [rank for rank in range(dead_peer.WORLD) if rank != dead_peer.VICTIM]
#: The dead rank's pipeline neighbour: point-to-point transfers between live ranks may complete.
NEIGHBOUR = dead_peer.VICTIM - 1
POINT_TO_POINT = {"exchange", "checked exchange"}


@pytest.fixture(scope="module")
def outcomes() -> list[Any]:
    results: list[Any] = spawn(dead_peer.after_a_death, dead_peer.WORLD, timeout_s=200, allow_deaths=True)
    return results


def test_the_victim_died(outcomes: list[Any]) -> None:
    assert isinstance(outcomes[dead_peer.VICTIM], WorkerDeath)


@pytest.mark.parametrize("operation", sorted(dead_peer.operations(0)))
def test_every_survivor_sees_rank_failure_from_torchs_error(outcomes: list[Any], operation: str) -> None:
    for rank in SURVIVORS:
        seen = outcomes[rank][operation]
        if operation in POINT_TO_POINT and rank != NEIGHBOUR and seen["error"] is None:
            continue  # a transfer between two live ranks completed: nothing was lost
        assert seen["error"] == "RankFailure", (rank, operation, seen)
        assert seen["cause"] is not None and seen["cause"] != "RankFailure", (rank, operation, seen)
        assert seen["seconds"] < 4 * dead_peer.GROUP_TIMEOUT_S, (rank, operation, seen)


def test_the_neighbour_fails_in_point_to_point(outcomes: list[Any]) -> None:
    for operation in sorted(POINT_TO_POINT):
        assert outcomes[NEIGHBOUR][operation]["error"] == "RankFailure", outcomes[NEIGHBOUR][operation]
