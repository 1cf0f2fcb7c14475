"""Every death is bounded and named: a rank killed at each point of a creation, under each strategy.

4 gloo ranks, grid tp=2 x dp=2, every rank creates ``dp``; rank 3 (dp group
[1, 3]) dies with ``os._exit`` at one point. Each survivor must raise a
``RankFailure`` naming rank 3 within the documented bound (guard timeout T):
T + grace while the guard decides, T + grace for a death while torch creates
(the issue allows 2T + 5 s). Under ``local`` only the members of the dead
rank's group take part; the other group is created and works.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import WorkerDeath, spawn
from hypergrid.timing import Timing
from tests.workers import faults

pytestmark = [pytest.mark.processes]

T = 3.0
SLACK = 5.0  # process scheduling on a loaded 2-core host (6.27 s seen for "before" at a load average over 10)
GRACE = Timing(group_timeout_s=T).guard_grace_s
BOUND = {"before": T + SLACK, "waiting": T + GRACE + SLACK, "decider": T + GRACE + SLACK}
BOUND["creating"] = T + GRACE + SLACK  # within the 2T + 5 s


# Each point and each strategy once in `make test` (one strategy per point, alternating); the other four
# combinations are stress runs.
CASES = [
    pytest.param(point, strategy, id=f"{point}-{strategy}", marks=[pytest.mark.stress] if (i + j) % 2 else [])
    for i, point in enumerate(["before", "waiting", "decider", "creating"])
    for j, strategy in enumerate(["enumerate", "local"])
]


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("point", "strategy"), CASES)
def test_a_death_at_any_point_raises_on_every_survivor_naming_the_dead_rank(point: str, strategy: str) -> None:
    results: list[Any] = spawn(faults.death, 4, (point, strategy, T), timeout_s=120, allow_deaths=True)
    assert isinstance(results[faults.VICTIM], WorkerDeath) and results[faults.VICTIM].exitcode == 17
    involved = [0, 1, 2] if strategy == "enumerate" else [1]  # under local, only the dead rank's group
    for rank in (0, 1, 2):
        outcome = results[rank]
        if rank not in involved:
            assert outcome["seen"] == "ok [0, 2]", (rank, outcome)
            continue
        seen = outcome["seen"]
        assert seen.startswith(("GuardTimeoutError", "RankFailure")), (point, rank, seen)
        assert outcome["dead"] == [faults.VICTIM], (point, rank, outcome)
        assert "rank(s) 3" in seen, (point, rank, seen)
        assert outcome["seconds"] <= BOUND[point], (point, rank, outcome["seconds"])


@pytest.mark.timeout(120)
def test_the_near_deadline_race_ends_ok_and_leaves_no_key() -> None:
    # Rank 1's wait is made to end without the verdict just as 'ok' lands; before the fix, the round's
    # arrived/verdict/readers keys stayed behind, even after destroy().
    for outcome in spawn(faults.near_deadline_race, 2, timeout_s=90):
        assert outcome["seen"].startswith("ok"), outcome
        # The last commit's verdict (kept for the next commit or destroy()), and rank 1's announcement where it
        # was the one that waited (the decider, whichever rank counted last, never waits).
        assert 1 <= outcome["during"] <= 2, outcome
        assert outcome["after"] == 0, outcome


def test_guard_timeouts_are_rank_failures() -> None:
    assert faults.rank_failure_is_caught()
