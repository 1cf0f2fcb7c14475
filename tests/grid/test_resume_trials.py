"""docs/elastic.md's recipe as written, under ``python -m hypergrid.run``: a random rank SIGKILLed at a random moment.

Each trial launches examples/elastic_tp_dp.py (tp x dp, the autograd mappings,
``average_gradients``, Adam; with spares or without) on local gloo workers;
one rank of the grid kills itself at a random point of a random step, a
random fraction of a millisecond to 3 ms later (a timer: the death lands
inside whatever runs then). Every trial must end with the launcher's success,
every survivor at the final step, the dp replicas of each tp shard bitwise
equal, and every shard equal to the one-process replay
(`tests.workers.resume.check_trial`). Three trials at 4 ranks here; the twenty
at 4 to 8 ranks are marked ``stress`` (``pytest -m stress``).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from tests.launch.test_run_launcher import _finish, _summary_lines
from tests.workers import resume

pytestmark = [pytest.mark.processes]

STEPS = 6
POINTS = ("begin", "forward", "backward", "average", "optimizer", "loss", "end")


def trial(seed: int, world: int, tp: int, spares: int, path: pathlib.Path) -> None:
    """One launch, its kill drawn from ``seed``; every check of the module's docstring."""
    rng = random.Random(seed)
    victim = rng.randrange(world - spares)
    kill = f"{victim}:{rng.randrange(1, STEPS - 2)}:{rng.choice(POINTS)}+{rng.uniform(0, 3):.2f}"
    context = f"seed {seed}: world {world}, tp {tp}, spares {spares}, --kill {kill}"
    report = path / f"report-{seed}.jsonl"
    flags = ["--tp", str(tp), "--steps", str(STEPS), "--spares", str(spares), "--kill", kill, "--quiet"]
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [sys.executable, "-m", "hypergrid.run", "--standalone", "--nproc-per-node", str(world),
               str(resume.SCRIPT), *flags, "--report", str(report)]  # fmt: skip
    launched = subprocess.Popen(
        command, cwd=resume.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    code, _, err = _finish(launched, timeout_s=200)[0]
    assert code == 0, (context, err[-3000:])
    summary = _summary_lines(err)
    assert summary[victim].startswith("died by signal SIGKILL"), (context, summary)
    assert all(line.startswith("exited 0") for rank, line in summary.items() if rank != victim), (context, summary)
    lines = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    outcomes = {seen["first_rank"]: seen for seen in lines}
    assert len(outcomes) == len(lines), (context, lines)
    resume.check_trial(outcomes, [victim], STEPS, context=context, complete=False)
    shape = next(iter(outcomes.values()))["shape"]
    assert shape["tp"] == tp and len(outcomes) == shape["tp"] * shape["dp"], (context, outcomes)
    resumed = sorted({step for seen in outcomes.values() for step in seen["resumed"]})
    print(f"{context}: ok, {len(outcomes)} survivors on {shape}, resumed at {resumed}")


@pytest.mark.timeout(250)
@pytest.mark.parametrize("spares", [0, 1, 0], ids=["drop", "spares", "drop-again"])
def test_a_random_death_under_the_launcher_resumes_every_survivor(spares: int, tmp_path: pathlib.Path) -> None:
    trial(random.randrange(2**32), 4 + spares, 2, spares, tmp_path)


@pytest.mark.stress
@pytest.mark.timeout(3600)
def test_twenty_random_deaths_at_4_to_8_ranks(tmp_path: pathlib.Path) -> None:
    rng = random.Random()
    for _ in range(20):
        world, spares = rng.choice([(4, 0), (5, 1), (6, 0), (7, 1), (8, 0), (8, 2)])
        tp = rng.choice([tp for tp in (2, 4) if (world - spares) % tp == 0 and (world - spares) // tp > 1])
        trial(rng.randrange(2**32), world, tp, spares, tmp_path)
