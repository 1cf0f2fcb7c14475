"""A pp x tp x dp job on `hypergrid.ElasticLoop` (issue 54): a death in the last pipeline stage.

"drop" removes the dead rank's whole dp slice: every stage and tp shard of that replica of the pipeline (the
survivors of the slice retire). A spare takes the dead rank's stage and tp shard and gets that stage's state from a
replica. Every rank that finishes holds its stage's shard equal to the one-process replay.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from hypergrid.launch.processes import WorkerDeath
from tests.workers import pipeline

pytestmark = [pytest.mark.processes, pytest.mark.timeout(200)]

STEPS = 4


def _finished(results: list[Any]) -> list[dict[str, Any]]:
    return [seen for seen in results if isinstance(seen, dict) and "rank" in seen]


def test_a_death_in_the_last_stage_drops_its_whole_pipeline_replica() -> None:
    """tp2 x pp2 x dp2 (8 ranks); rank 7 (tp 1, pp 1, dp 1) dies in step 2: its dp slice (ranks 4-7) goes."""
    results = spawn(pipeline.train, 8, (2, 0, STEPS, "7:2:backward"), timeout_s=150, allow_deaths=True)
    assert isinstance(results[7], WorkerDeath) and results[7].exitcode == -9, results[7]
    assert [results[first].get("retired") for first in (4, 5, 6)] == [True, True, True], results[4:7]
    finished = _finished(results)
    assert sorted(seen["first_rank"] for seen in finished) == [0, 1, 2, 3], results
    for seen in finished:
        assert seen["shape"] == {"tp": 2, "pp": 2, "dp": 1} and seen["step"] == STEPS, seen
        assert seen["max_abs"] < 1e-9 and seen["dead"] == [[7]], seen


def test_a_spare_takes_the_last_stage_of_a_dead_rank_and_its_state() -> None:
    """tp1 x pp2 x dp3 and a spare (7 ranks); rank 3 (pp 1, dp 1) dies: the spare holds stage 1 at the end."""
    results = spawn(pipeline.train, 7, (1, 1, STEPS, "3:2:average"), timeout_s=150, allow_deaths=True)
    assert isinstance(results[3], WorkerDeath), results[3]
    finished = _finished(results)
    assert len(finished) == 6, results
    spare = results[6]
    assert spare["rank"] == 3 and spare["coord"] == (0, 1, 1), spare
    for seen in finished:
        assert seen["shape"] == {"tp": 1, "pp": 2, "dp": 3} and seen["max_abs"] < 1e-9 and seen["equal"], seen
    for stage in (0, 1):
        assert len({seen["digest"] for seen in finished if seen["coord"][1] == stage}) == 1, finished
