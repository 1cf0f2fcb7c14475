"""The job's store dies (issue 31, item 5): every survivor's next grid call raises `StoreLostError`, not torch's error.

A plain ``env://`` job whose rank 0 hosts the TCPStore; rank 0 SIGKILLs
itself after a grid (tp2 x dp2) is made. Each survivor then tries a
collective over ``dp``, a creation (a guard round on the store) and a
collective over ``tp`` (rank 1 shares ``tp`` with rank 0, rank 2 ``dp``, rank 3
neither): each must raise ``StoreLostError`` (a ``HyperGridError``) with
torch's error as its cause, under a hard timeout. Before, the collectives
without rank 0 went through and the others raised torch's ``DistNetworkError``.
Without watchers (``HYPERGRID_WATCH=0``) only the main thread's store calls
meet the loss: the creation's guard round must translate it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from benchmarks.common import free_port
from tests.workers import store_death

pytestmark = [pytest.mark.processes]

SIZE = 4


def _run(tmp_path: Path, watch: str, spares: int = 0) -> dict[int, dict[str, dict[str, Any]]]:
    """Run the job (``spares`` more ranks, in ``standby``); what each survivor's calls raised."""
    context = mp.get_context("spawn")
    port = free_port()
    size = SIZE + spares
    workers = [
        context.Process(target=store_death.run, args=(rank, size, port, str(tmp_path), watch, spares))
        for rank in range(size)
    ]
    if spares:  # and an arrival waiting to join
        workers.append(context.Process(target=store_death.arrival, args=(port, str(tmp_path))))
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join(90)
    finally:
        alive = [worker for worker in workers if worker.is_alive()]
        for worker in alive:
            worker.kill()
    assert not alive, "a survivor hung"
    assert workers[0].exitcode == -9
    seen = {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(1, size)}
    if spares:
        seen[size] = json.loads((tmp_path / "arrival.json").read_text())
    return seen


@pytest.mark.timeout(120)
def test_the_store_host_dying_is_a_store_lost_error_on_every_survivor(tmp_path: Path) -> None:
    for rank, seen in _run(tmp_path, "1").items():
        for call, raised in seen.items():
            assert raised["type"] == "StoreLostError", (rank, call, raised)
            assert "the job's store is gone" in raised["message"], (rank, call, raised)
        assert seen["all_reduce"]["cause"] is not None, (rank, seen)  # torch's error, kept


@pytest.mark.timeout(120)
def test_without_watchers_a_guard_round_translates_the_store_loss(tmp_path: Path) -> None:
    for rank, seen in _run(tmp_path, "0").items():
        raised = seen["create_pg"]
        assert raised["type"] == "StoreLostError" and raised["cause"] == "DistNetworkError", (rank, raised)


@pytest.mark.timeout(120)
def test_a_spare_in_standby_and_an_arrival_get_store_lost_error_too(tmp_path: Path) -> None:
    """Issue 54: the spares in ``standby`` raised torch's raw ``DistNetworkError`` where the grid's ranks raised
    ``StoreLostError``, and an arrival waiting in ``arrive`` did too."""
    seen = _run(tmp_path, "1", spares=2)
    for rank, call in ((4, "standby"), (5, "standby"), (6, "arrive")):
        raised = seen[rank][call]
        assert raised["type"] == "StoreLostError" and raised["cause"] == "DistNetworkError", (rank, raised)
        assert "the job's store is gone" in raised["message"], (rank, raised)
    for rank in (1, 2, 3):
        assert {raised["type"] for raised in seen[rank].values()} == {"StoreLostError"}, (rank, seen[rank])
