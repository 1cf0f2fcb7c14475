"""``arrive`` and the arrivals' store protocol without a running job (issue 47): refusals, the job's end, timeouts.

The joins themselves, with real processes, are in ``tests/grid/test_regrow.py``.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from benchmarks.common import free_port
from hypergrid import HyperCommGrid, StepSnapshots
from hypergrid.agreement.arrivals import RELEASE, Arrivals, Heartbeat, absent
from hypergrid.errors import InvalidArgumentError
from hypergrid.grid.arrival import WITHDRAWN
from hypergrid.grid.intake import origin_digest
from hypergrid.launch import job_store


def test_arrive_refuses_a_process_in_a_world_already() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(InvalidArgumentError, match=r"arrive: torch.distributed is initialized .*rank 0 of 1"):
            HyperCommGrid([1], ["dp"]).arrive(1.0, store=dist.HashStore())
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout_s": -1}, "timeout_s"),
        ({"snapshots": 3}, "snapshots"),
        ({"wake_ranks": 1}, "wake_ranks"),
        ({"store": "host:port"}, "store"),
    ],
)
def test_arrive_refuses_bad_arguments_by_name_before_touching_a_store(kwargs: dict, match: str) -> None:
    store = dist.HashStore()
    with pytest.raises(InvalidArgumentError, match=match):
        HyperCommGrid([2], ["dp"]).arrive(**{"timeout_s": 1.0, "store": store, **kwargs})
    assert not store.check([Arrivals.key("count")])  # nothing registered


def test_an_arrival_nobody_drafts_withdraws_at_its_timeout_and_a_late_draft_is_refused() -> None:
    store = dist.HashStore()
    started = time.monotonic()
    assert HyperCommGrid([2], ["dp"]).arrive(0.3, store=store, wake_ranks=False) is None
    assert 0.3 <= time.monotonic() - started < 5
    assert store.get(Arrivals.key("draft", 0)) == WITHDRAWN.encode()
    Arrivals(store).send_draft(0, "{}")  # a survivor's draft after it: the withdrawal stands
    assert store.get(Arrivals.key("draft", 0)) == WITHDRAWN.encode()


def test_the_jobs_end_releases_a_waiting_arrival_and_refuses_a_later_one() -> None:
    store, grid = dist.HashStore(), HyperCommGrid([2], ["dp"])
    result: list[object] = []
    waiter = threading.Thread(target=lambda: result.append(grid.arrive(30, store=store, wake_ranks=False)))
    waiter.start()
    while not store.check([Arrivals.key("info", 0)]):
        time.sleep(0.01)
    assert Arrivals(store).close() == [0]
    waiter.join(10)
    assert result == [None] and store.get(Arrivals.key("draft", 0)) == RELEASE.encode()
    started = time.monotonic()
    assert grid.arrive(30, store=store) is None and time.monotonic() - started < 5  # closed: at once


def test_the_end_of_a_job_without_arrivals_leaves_one_key() -> None:
    store = dist.HashStore()
    assert Arrivals(store).close() == [] and Arrivals(store).waiting("d") == []
    assert store.num_keys() == 1 and store.check([Arrivals.key("closed")])


def test_only_arrivals_of_a_grid_built_the_same_way_are_waiting_for_it() -> None:
    store = dist.HashStore()
    arrivals = Arrivals(store)
    same, other = HyperCommGrid([2, 2], ["tp", "dp"]), HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=10)
    arrivals.register(origin_digest(other), {})
    arrivals.register(origin_digest(same), {})
    assert arrivals.waiting(origin_digest(same)) == [1]


def test_a_heartbeat_is_present_while_it_beats_and_absent_once_stopped() -> None:
    store = dist.HashStore()
    heartbeat = Heartbeat(store, 4).start()
    assert absent(store, [4], 0.5) == []
    heartbeat.stop()
    assert absent(store, [4], 0.5) == [4]


def test_job_store_names_the_missing_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(InvalidArgumentError, match=r"job_store: MASTER_ADDR=''"):
        job_store(1.0)


def test_job_store_reaches_the_keys_of_the_jobs_first_default_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same keys a rank's default group has after ``init_from_env`` (``env://``, no torchelastic restart)."""
    host = dist.TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(host.port))
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    job_store(5.0).set("probe", "here")
    assert host.get("default_pg/0//probe") == b"here"


def test_snapshots_cleared_hold_no_step() -> None:
    import torch

    snapshots = StepSnapshots(torch.zeros(2))
    snapshots.take(0)
    snapshots.take(1)
    snapshots.clear()
    assert snapshots.steps == () and snapshots.step is None
