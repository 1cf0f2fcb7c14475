"""`hypergrid.ElasticLoop` in spawned gloo processes (torch.distributed initialized by the launcher, as mp.spawn
does): a rank SIGKILLed in set-up, at the finish line, or with a spare to draft, and every survivor ends right.

examples/elastic_tp_dp.py runs on the loop as written (tests/workers/resume.py); ``create+MS`` kills the victim MS
ms after its loop begins creating the families (`resume.train_dying_in_creation`; at 0 it never reaches the guard
round, and a roll call finds it at the probe without a launcher to announce it), ``RANK:s:setup`` inside the set-up
function, and `resume.train_dying_at_the_finish` at the finish line. Each trial checks every rank's outcome: the
survivors at the final step, dp replicas bitwise equal, every shard equal to the one-process replay; the retired and
released ranks say so.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hypergrid
from hypergrid import spawn
from hypergrid.launch.processes import WorkerDeath
from tests.workers import resume

pytestmark = pytest.mark.processes

STEPS = 4


def _run(world: int, victim: int, spec: str, *extra: str) -> dict[int, Any]:
    flags = ["--steps", str(STEPS), "--kill", f"{victim}:{spec}", *extra]
    results = spawn(resume.train, world, (flags,), timeout_s=150, allow_deaths=True)
    assert isinstance(results[victim], WorkerDeath) and results[victim].exitcode == -9, results[victim]
    return dict(enumerate(results))


def _creation(world: int, victim: int, delay_ms: float, *extra: str) -> dict[int, Any]:
    flags = ["--steps", str(STEPS), *extra]
    results = spawn(resume.train_dying_in_creation, world, (flags, victim, delay_ms), timeout_s=150,
                    allow_deaths=True)  # fmt: skip
    assert isinstance(results[victim], WorkerDeath) and results[victim].exitcode == -9, results[victim]
    return dict(enumerate(results))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("spec", ["create+0", "s:setup"])
def test_a_death_in_set_up_is_absorbed(spec: str) -> None:
    """tp=2 x dp=3, rank 3 dies before the first step (while the families are created, or in the set-up function):
    dp 3 -> 2 (rank 2 retires), the others finish as one."""
    outcomes = _creation(6, 3, float(spec.split("+")[1])) if spec.startswith("create") else _run(6, 3, spec)
    resume.check_trial(outcomes, [3], STEPS, context=spec)
    assert outcomes[2].get("retired"), outcomes[2]
    kept = [outcomes[first] for first in (0, 1, 4, 5)]
    assert all(seen["shape"] == {"tp": 2, "dp": 2} and seen["dead"] == [3] for seen in kept), kept
    assert all(seen["resumed"] == [0] for seen in kept), kept  # nobody had begun a step


@pytest.mark.timeout(200)
def test_a_spare_drafted_in_set_up_builds_its_shard_and_takes_a_replicas_state() -> None:
    outcomes = _run(5, 1, "s:setup", "--spares", "1")
    resume.check_trial(outcomes, [1], STEPS)
    spare = outcomes[4]
    assert spare["rank"] == 1 and spare["tp"] == 1 and spare["shape"] == {"tp": 2, "dp": 2}, spare


@pytest.mark.timeout(200)
def test_a_death_at_the_finish_line_is_absorbed() -> None:
    """Rank 3 dies as it reaches the finish line: the others, waiting in the replica check, shrink (rank 2
    retires) and cross it again at the last step."""
    flags = ["--steps", str(STEPS)]
    results = spawn(resume.train_dying_at_the_finish, 6, (flags, 3), timeout_s=150, allow_deaths=True)
    assert isinstance(results[3], WorkerDeath) and results[3].exitcode == -9, results[3]
    outcomes = dict(enumerate(results))
    resume.check_trial(outcomes, [3], STEPS)
    assert outcomes[2].get("retired"), outcomes[2]
    assert all(outcomes[first]["resumed"] == [STEPS] for first in (0, 1, 4, 5)), outcomes


@pytest.mark.timeout(200)
def test_every_rank_reports_its_world_changes() -> None:
    """The result's history on each survivor: one change, the dead rank named, at one agreed step."""
    outcomes = _run(5, 0, "1:average", "--spares", "1")
    resume.check_trial(outcomes, [0], STEPS)
    finished = [seen for seen in outcomes.values() if isinstance(seen, dict) and "rank" in seen]
    assert len(finished) == 4 and {tuple(seen["resumed"]) for seen in finished} == {(1,)}, finished
    assert all(seen["dead"] == [0] and seen["replicas_equal"] for seen in finished), finished


def _a_job_whose_step_raises() -> dict[str, Any]:
    """dp=2 and a spare; every grid rank's step raises at step 2 (a bug, not a death)."""

    def step(grid: Any, state: Any, step: int) -> None:
        grid.all_reduce(state, "dp")
        if step == 2:
            raise ValueError(f"a bug in step {step}")

    loop = hypergrid.ElasticLoop([-1], ["dp"], steps=5, spares=1, verbose=False)
    try:
        result = loop.run(lambda grid: torch.zeros(1), step)
    except ValueError as error:
        return {"raised": str(error)}
    return {"released": result.released, "finished": result.finished}


@pytest.mark.timeout(120)
def test_a_step_that_raises_releases_the_spares_instead_of_leaving_them_waiting() -> None:
    results = spawn(_a_job_whose_step_raises, 3, timeout_s=60)
    assert results == [{"raised": "a bug in step 2"}] * 2 + [{"released": True, "finished": False}], results
