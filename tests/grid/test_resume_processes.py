"""Agreed resumption (issue 32, item 1): a rank SIGKILLed at every point of a step, the survivors resume as one.

examples/elastic_tp_dp.py runs as written in spawned gloo processes (its loop
is docs/elastic.md's recipe; tests/workers/resume.py); ``--kill`` makes rank 3
kill itself at a point of step 2: before each collective (its partners wait
in it), inside one (a timer fires while it runs), between two, inside the
optimizer's update, between two steps. Some points leave the survivors one
step apart (a dp all-reduce without the dead rank completes on the other tp
shard's replicas). Every survivor must end at the final step, the dp replicas
of each shard bitwise equal, every shard equal to the one-process replay.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from hypergrid.launch.processes import WorkerDeath
from tests.workers import resume

pytestmark = pytest.mark.processes

STEPS = 5
#: A step's points (examples/elastic_tp_dp.py): "+MS" arms a timer that kills MS ms later, inside what runs then.
POINTS = ["begin", "forward", "forward+1", "backward", "average", "average+1", "optimizer+0", "loss", "loss+1", "end"]


def _run(world: int, victim: int, point: str, *extra: str) -> dict[int, Any]:
    flags = ["--steps", str(STEPS), "--kill", f"{victim}:2:{point}", *extra]
    results = spawn(resume.train, world, (flags,), timeout_s=150, allow_deaths=True)
    assert isinstance(results[victim], WorkerDeath) and results[victim].exitcode == -9, results[victim]
    return dict(enumerate(results))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("point", POINTS)
def test_a_death_at_any_point_of_a_step_resumes_every_survivor_at_one_step(point: str) -> None:
    """tp=2 x dp=3, rank 3 (tp 1, dp 1) dies: dp 3 -> 2, rank 2 retires, four survivors finish as one."""
    outcomes = _run(6, 3, point)
    resume.check_trial(outcomes, [3], STEPS, context=point)
    assert outcomes[2]["retired"] and outcomes[2]["resumed"] == [], outcomes[2]
    kept = [outcomes[first] for first in (0, 1, 4, 5)]
    assert all(seen["shape"] == {"tp": 2, "dp": 2} and seen["dead"] == [3] for seen in kept), kept
    assert {seen["resumed"][0] for seen in kept} <= {2, 3}, kept  # the step it died in, or the next (end)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("point", ["average", "loss+1", "end"])
def test_a_spare_takes_over_at_the_agreed_step_with_a_replicas_state(point: str) -> None:
    """tp=2 x dp=2 and one spare: the spare is drafted in rank 3's place and gets tp shard 1 from rank 1."""
    outcomes = _run(5, 3, point, "--spares", "1")
    resume.check_trial(outcomes, [3], STEPS, context=point)
    spare = outcomes[4]
    assert spare["rank"] == 3 and spare["tp"] == 1 and spare["shape"] == {"tp": 2, "dp": 2}, spare
    assert spare["resumed"] == outcomes[0]["resumed"], (spare, outcomes[0])


@pytest.mark.timeout(200)
def test_rank_0_dies_inside_a_dp_all_reduce() -> None:
    outcomes = _run(6, 0, "loss+1")
    resume.check_trial(outcomes, [0], STEPS, context="rank 0")
