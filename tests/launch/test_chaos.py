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


#: The cases that hold in every run measured (``make chaos``: 30 of 30). ``churn`` is left out: a survivor whose
#: gloo connection to a member that published its address and then died is still held inside torch (about 1 run in
#: 7; issue 53, left open); ``during-growth`` was measured in a few runs only.
HOLDING = ("resume", "grow-death", "two-at-once")


@pytest.mark.parametrize(
    ("case", "seed"),
    [
        ("resume", 11),
        ("grow-death", 11),
        *[pytest.param(case, seed, marks=pytest.mark.stress) for case in HOLDING for seed in (21, 22, 23)],
    ],
)
def test_a_random_kill_is_absorbed_and_every_process_ends_right(case: str, seed: int) -> None:
    """`examples/elastic_tp_dp.py` killed mid-run, after a growth, or twice at once: exit 0, every rank at one step,
    replicas bitwise equal (at 0.4.0 growth then a death exited 1 in 3 of 4 runs)."""
    run = chaos.one_run(case, seed)
    assert run.passed, f"{case} seed {seed}: {run.why} (kills: {run.kills})"
