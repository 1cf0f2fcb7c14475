"""The store a shrink forms its world on (`hypergrid.binding.interruptible`): its waits end when told, on a real
TCPStore, from another thread through another connection (as the vigil does when a member dies there)."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding.interruptible import Formation, InterruptibleStore

TIMEOUT = datetime.timedelta(seconds=60)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def client(server: Any, prefix: str) -> Any:
    connection = TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT)
    return dist.PrefixStore(prefix, connection)  # type: ignore[attr-defined]


def later(seconds: float, function: Any, *args: Any) -> threading.Timer:
    timer = threading.Timer(seconds, function, args)
    timer.start()
    return timer


@pytest.mark.timeout(30)
def test_an_interruption_ends_a_wait_at_once_with_the_error_given(server: Any) -> None:
    store = InterruptibleStore(client(server, "w1"), client(server, "w1"))
    later(0.3, store.interrupt, RuntimeError("member 3 died while forming world 1"))
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="member 3 died while forming world 1"):
        store.wait(["rank_3"], datetime.timedelta(seconds=20))
    assert time.monotonic() - started < 2.0  # (not the wait's 20 s)
    with pytest.raises(RuntimeError, match="member 3 died"):  # and every wait after it
        store.get("rank_4")


@pytest.mark.timeout(30)
def test_a_wait_woken_without_an_interruption_waits_on_until_its_key_comes(server: Any) -> None:
    store = InterruptibleStore(client(server, "w2"), client(server, "w2"))
    other = client(server, "w2")
    later(0.2, other.compare_set, "rank_1", "\x00absent", "\x00absent")  # a read of the absent key wakes the waiter
    later(0.6, other.set, "rank_1", "address")
    started = time.monotonic()
    assert store.get("rank_1") == b"address"
    assert 0.5 < time.monotonic() - started < 5.0


@pytest.mark.timeout(30)
def test_a_disarmed_store_ignores_interruptions_and_its_waits_time_out_as_torch_s(server: Any) -> None:
    formation = Formation(client(server, "w3"))
    formation.interrupt(RuntimeError("before the world forms: nothing to end"))  # no store yet: nothing
    store = formation.on(client(server, "w3"))
    store.set("rank_0", "a")
    assert store.get("rank_0") == b"a" and store.check(["rank_0"]) and store.add("n", 2) == 2
    formation.disarm()
    formation.interrupt(RuntimeError("after the world formed"))
    with pytest.raises(dist.DistStoreError):
        store.wait(["rank_9"], datetime.timedelta(seconds=0.3))


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_torch_forms_a_gloo_world_on_it_and_an_interruption_ends_the_rendezvous(server: Any) -> None:
    """One process of a world of two: the other never comes; torch's ``init_process_group`` waits for its keys
    (timeout 60 s) until the interruption, 0.5 s in."""
    formation = Formation(client(server, "w4"))
    later(0.5, formation.interrupt, RuntimeError("rank 1 died while forming world 4"))
    started, count = time.monotonic(), c10d._world.group_count
    try:
        with pytest.raises(Exception, match="rank 1 died while forming world 4"):
            dist.init_process_group(
                "gloo", store=formation.on(client(server, "w4")), rank=0, world_size=2, timeout=TIMEOUT
            )
    finally:
        c10d._world.group_count = count  # (torch counted the group it did not form: the next test's names)
    assert time.monotonic() - started < 5.0
    assert not dist.is_initialized()
