"""Store connections prepared in the background: recovery's watcher never opens one on its own path."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch.distributed as dist

from hypergrid.agreement import connections


class SlowStore:
    """A store whose connect takes ``delay_s`` (torch's client looking its host name up at a slow DNS server)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.opened_by: list[str] = []

    def clone(self) -> Any:
        self.opened_by.append(threading.current_thread().name)
        time.sleep(self.delay_s)
        return object()


def test_prepared_connections_are_taken_without_a_connect_and_refilled() -> None:
    store = SlowStore(0.3)
    connections.prepare(store, 2)
    connections.settle()
    assert connections.spare_count(store) == 2 and store.opened_by == ["hypergrid-connections"] * 2
    began = time.monotonic()
    taken = connections.take(store, 2)
    assert len(taken) == 2 and len(set(map(id, taken))) == 2
    assert time.monotonic() - began < store.delay_s  # no connect in the caller: the slow one happened before
    connections.settle()
    assert connections.spare_count(store) == 2 and store.opened_by == ["hypergrid-connections"] * 4
    connections.discard(store)
    assert connections.spare_count(store) == 0


def test_what_is_missing_is_opened_by_the_caller() -> None:
    store = SlowStore(0.0)
    taken = connections.take(store, 3)  # nothing prepared yet: three connects here, then three prepared
    assert len(taken) == 3 and store.opened_by[:3] == [threading.current_thread().name] * 3
    connections.settle()
    assert connections.spare_count(store) == 3
    connections.discard(store)


def test_real_store_connections_work() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    connections.prepare(store, 1)
    connections.settle()
    (connection,) = connections.take(store, 1)
    connection.set("k", "v")
    assert store.get("k") == b"v"
    connections.discard(store)
