"""``spawn`` hands back any picklable value, refuses the rest by rank, and says where hung ranks are."""

from __future__ import annotations

import multiprocessing
import os
import re

import pytest
import torch

from hypergrid import WorkerError, spawn
from hypergrid.layout import GridLayout
from tests.workers import author as workers

pytestmark = [pytest.mark.processes]
# docs/api.md gives the 50-run figure, measured once with HYPERGRID_STRESS_RUNS=50. `make test` runs once,
# `make test-stress` the repeated runs.
STRESS_RUNS = int(os.environ.get("HYPERGRID_STRESS_RUNS", "10"))


@pytest.mark.timeout(120 * STRESS_RUNS)  # generous: 8 processes per run on 2 shared cores
@pytest.mark.parametrize("runs", [1, pytest.param(STRESS_RUNS, marks=pytest.mark.stress)], ids=["once", "repeated"])
def test_eight_ranks_return_eight_tensors_of_one_mib_every_time(runs: int) -> None:
    for run in range(runs):
        results = spawn(workers.eight_tensors, 8, timeout_s=240)
        for rank, value in enumerate(results):
            assert sorted(value) == [f"t{i}" for i in range(8)], f"run {run}, rank {rank}"
            for index in range(8):
                expected = torch.arange(workers.MIB_FLOATS, dtype=torch.float32) + 1e6 * rank + 1e4 * index
                assert torch.equal(value[f"t{index}"], expected), f"run {run}, rank {rank}, tensor {index}"
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(120)
def test_an_unpicklable_result_names_the_rank_and_quotes_pickle() -> None:
    with pytest.raises(WorkerError) as error:
        spawn(workers.unpicklable_on, 3, (1,), timeout_s=60)
    assert error.value.rank == 1
    message = str(error.value)
    assert "rank 1 of 3 returned a value that cannot be pickled" in message
    assert re.search(r"TypeError: cannot pickle '_thread\.lock' object", message), message
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(120)
def test_a_deadlock_shows_each_ranks_blocking_line() -> None:
    with pytest.raises(WorkerError) as error:
        spawn(workers.deadlock, 2, timeout_s=8)
    message = str(error.value)
    assert "timed out after 8 s waiting for rank(s) [0, 1] of 2" in message
    sections = re.split(r"\n(?=rank \d is at:)", message.split("(most recent call last):\n", 1)[1])
    assert [section.splitlines()[0] for section in sections] == ["rank 0 is at:", "rank 1 is at:"], message
    lines = [
        "dist.send(outgoing, dst=1)  # stage 0 sends its activation forward",
        "dist.send(outgoing, dst=0)  # stage 1 sends its gradient back",
    ]
    for rank, section in enumerate(sections):
        assert lines[rank] in section and lines[1 - rank] not in section, section
        assert "in deadlock" in section
        assert "multiprocessing" not in section, "the launcher's own frames are cut"
    assert multiprocessing.active_children() == []


@pytest.mark.timeout(120)
def test_coordinates_cross_processes_and_still_equal_tuples() -> None:
    results = spawn(workers.coordinates, 4, timeout_s=60)
    layout = GridLayout([2, 2], ["tp", "dp"])
    for rank, result in enumerate(results):
        assert result["mine"] == layout.coords_of(rank)  # a plain tuple
        assert result["mine"]._asdict() == dict(zip(["tp", "dp"], layout.coords_of(rank)))
        assert result["gathered"] == [layout.coords_of(r) for r in range(4)]
        assert result["type_is_shared"]
        assert type(result["mine"]) is type(layout.coord_of(0))
