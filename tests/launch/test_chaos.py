"""Random kills under ``python -m hypergrid.run`` (issue 53), through `benchmarks/chaos.py`: the small version here,
30 runs of each case in ``make chaos``.

Each run is one of the benchmark's: a hard wall-clock limit, a SIGKILL at a moment drawn from the seed, and every
process's outcome read (the launcher's exit code and summary, each rank's report). The seeds here are fixed so that
a failure repeats: ``python benchmarks/chaos.py --cases CASE --seed SEED --runs 1``.
"""

from __future__ import annotations

import pytest

from benchmarks import chaos

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]


@pytest.mark.parametrize(
    ("case", "seed"),
    [
        ("churn", 11),
        ("resume", 11),
        *[pytest.param(case, seed, marks=pytest.mark.stress) for case in chaos.CASES for seed in (21, 22, 23)],
    ],
)
def test_a_random_kill_is_absorbed_and_every_process_ends_right(case: str, seed: int) -> None:
    """``churn``: 8 workers creating, using and destroying groups in a loop; at 0.4.0 a survivor waited 120 s in a
    guard round for the dead, a survivor exited without its result, or the agent named a live rank dead (4 of 9 runs
    held). The other cases kill `examples/elastic_tp_dp.py` mid-run, after a growth, twice at once, or during a
    growth: exit 0, every rank at one step, replicas bitwise equal."""
    run = chaos.one_run(case, seed)
    assert run.passed, f"{case} seed {seed}: {run.why} (kills: {run.kills})"
