"""The local launcher: results by rank, failures re-raised with the rank, nothing left running."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

from hypergrid import BackendError, InvalidArgumentError, WorkerError, spawn
from tests.workers import basic as workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]


@pytest.mark.parametrize("start_method", [None, "spawn"])  # None: the forkserver where it exists
def test_results_come_back_by_rank_with_the_environment_set(start_method: str | None) -> None:
    results = spawn(workers.environment, 3, timeout_s=120, start_method=start_method)
    assert results == [
        {"RANK": str(r), "WORLD_SIZE": "3", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "3", "dist_rank": str(r)}
        for r in range(3)
    ]


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_workers_get_the_environment_of_the_call(start_method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A variable set between two calls reaches the second call's workers (a forkserver's own is older)."""
    name = "HYPERGRID_TEST_VARIABLE"
    monkeypatch.setenv(name, "first")
    assert spawn(workers.variable, 2, (name,), start_method=start_method) == ["first"] * 2
    monkeypatch.setenv(name, "second")
    assert spawn(workers.variable, 1, (name,), start_method=start_method) == ["second"]
    monkeypatch.delenv(name)
    assert spawn(workers.variable, 1, (name,), start_method=start_method) == [None]


def test_an_exception_on_one_rank_names_it_with_its_traceback() -> None:
    with pytest.raises(WorkerError) as error:
        spawn(workers.fail_on_rank, 4, (2,), timeout_s=120)
    assert error.value.rank == 2
    assert "rank 2 of 4 failed" in str(error.value)
    assert "deliberate failure on rank 2" in error.value.remote_traceback
    assert "fail_on_rank" in error.value.remote_traceback
    assert multiprocessing.active_children() == []


def test_a_rank_dying_silently_is_named_with_its_exit_code() -> None:
    with pytest.raises(WorkerError, match=r"rank 1 of 3 died with exit code 17") as error:
        spawn(workers.exit_on_rank, 3, (1,), timeout_s=120)
    assert error.value.rank == 1
    assert multiprocessing.active_children() == []


def test_a_hang_is_stopped_at_the_timeout_naming_the_ranks() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"timed out after 8 s waiting for rank\(s\) \[0, 1\] of 2"):
        spawn(workers.sleep_forever, 2, timeout_s=8)
    assert time.monotonic() - start < 60
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"nprocs": 0}, InvalidArgumentError, "0"),
        ({"nprocs": 2.0}, InvalidArgumentError, "2.0"),
        ({"nprocs": 2, "timeout_s": 0}, InvalidArgumentError, "0"),
        ({"nprocs": 2, "timeout_s": "1"}, InvalidArgumentError, "'1'"),
        ({"nprocs": 2, "backend": "mpi"}, BackendError, "'mpi'"),
        ({"nprocs": 2, "start_method": "fork"}, InvalidArgumentError, "start_method='fork': expected one of"),
        ({"nprocs": 2, "start_method": 1}, InvalidArgumentError, "start_method=1"),
    ],
)
def test_bad_arguments_are_refused_before_any_process_starts(kwargs: dict[str, Any], error: type, text: str) -> None:
    with pytest.raises(error, match=text):
        spawn(workers.environment, **kwargs)
    assert multiprocessing.active_children() == []
