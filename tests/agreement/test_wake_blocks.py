"""Wake keys shared by blocks of 8 ranks (`hypergrid.agreement.rollkeys.wake_key`): real watchers on a real TCPStore.

A roll call writes one wake key per block of `WAKE_BLOCK` consecutive ranks
(N / 8 keys, not N); a rank whose world closes wakes its block's other
watchers with a read of the absent key, and they wait again: no rank outside
the block hears of it, no rank is fenced, the next roll call finds only the
closed rank gone. A watcher woken without a call is fenced only when the
world's ``done`` says its incident is over (the others finished it without it).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.guard import CountingStore
from hypergrid.agreement import diagnosis
from hypergrid.agreement.liveness import (
    FAILURE,
    PROBE,
    WAKE_BLOCK,
    Incident,
    done_key,
    incident_prefix,
    wake_key,
    world_keys,
)
from hypergrid.agreement.watcher import Watcher

TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def _client(server: Any) -> CountingStore:
    return CountingStore(TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT))


def _watchers(server: Any, world: int, size: int, fenced: dict[int, str]) -> list[Watcher]:
    def one(rank: int) -> Watcher:
        record = lambda why, r=rank: fenced.setdefault(r, why)  # noqa: E731
        return Watcher(_client(server), _client(server), world, rank, size, liveness_s=0.5, on_fence=record)

    watchers = [one(rank) for rank in range(size)]
    for watcher in watchers:
        watcher.start()
    time.sleep(0.3)  # every thread waits on its block's key
    return watchers


@pytest.mark.timeout(60)
def test_a_call_writes_one_wake_key_per_block_of_8_ranks(server: Any) -> None:
    world, ranks = 60, [0, 1, 7, 8, 9, 23, 40]  # blocks 0, 1, 2 and 5
    before = set(server.list_keys())
    Incident(_client(server), incident_prefix(world, 0), 0, ()).call(FAILURE, "test", ranks)
    wakes = {key for key in set(server.list_keys()) - before if "/wake/" in key}
    assert wakes == {wake_key(world, 0, rank) for rank in (0, 8, 16, 40)}
    assert len({wake_key(world, 0, rank) for rank in range(WAKE_BLOCK)}) == 1
    for key in set(server.list_keys()) - before:
        server.delete_key(key)


@pytest.mark.timeout(60)
def test_a_close_wakes_only_its_block_which_waits_again_and_the_next_roll_call_finds_it_gone(server: Any) -> None:
    world, size = 61, 2 * WAKE_BLOCK
    before = set(server.list_keys())
    fenced: dict[int, str] = {}
    watchers = _watchers(server, world, size, fenced)
    ops = [watcher.store.ops for watcher in watchers]
    assert watchers[3].halt(watchers[3].side, 5.0)  # its process ends without leaving (as if it died)
    time.sleep(0.5)
    spent = [watcher.store.ops - before_ops for watcher, before_ops in zip(watchers, ops)]
    assert spent[WAKE_BLOCK:] == [0] * WAKE_BLOCK  # the other block heard nothing
    # its block's other watchers: a look for the call, the world's end, its watch and its done, then the wait again
    assert all(1 <= spent[rank] <= 5 for rank in range(WAKE_BLOCK) if rank != 3), spent
    assert all(watcher._thread.is_alive() for rank, watcher in enumerate(watchers) if rank != 3)
    verdict = watchers[0].report(FAILURE, "test")
    assert verdict is not None and verdict.dead == (3,)
    time.sleep(0.3)
    assert all(watchers[rank].dead == [3] for rank in range(size) if rank != 3) and not fenced
    for watcher in watchers:
        assert watcher.halt(watcher.side, 5.0)
    assert set(server.list_keys()) - before == set(world_keys(world))  # every wake key gone: the world's stay
    for key in world_keys(world):
        server.delete_key(key)


@pytest.mark.timeout(60)
def test_a_watcher_woken_without_a_call_is_fenced_only_once_its_incident_is_over(server: Any) -> None:
    world, size = 62, 3
    fenced: dict[int, str] = {}
    watchers = _watchers(server, world, size, fenced)
    reader = _client(server)
    diagnosis.read(reader, wake_key(world, 0, 0))  # wakes the block, writes nothing: no incident
    time.sleep(0.5)
    assert not fenced and all(watcher._thread.is_alive() for watcher in watchers)
    reader.set(done_key(world), "0")  # as the others' last reader writes it once incident 0 is over without them
    diagnosis.read(reader, wake_key(world, 0, 0))
    time.sleep(0.5)
    assert sorted(fenced) == [0, 1, 2]
    assert all("incident 0 ended without it" in why for why in fenced.values()), fenced
    assert all(watcher.join(5.0) for watcher in watchers)
    reader.delete_key(done_key(world))


class _Behind(Watcher):
    """A watcher slow to wait again after an incident (its thread descheduled): it waits on the next key 1 s late."""

    def _sleep(self, wake: str) -> bool:
        if self.number > 0:
            time.sleep(1.0)
        return super()._sleep(wake)


@pytest.mark.timeout(60)
def test_a_watcher_that_waits_on_the_ends_key_after_the_others_read_it_still_reads_it(server: Any) -> None:
    # The end is read without answers: had the block's first rank deleted the block's key once it read the end,
    # rank 2 (still on its way back from the probe) would wait on a deleted key for ever.
    world, size = 63, 4
    before = set(server.list_keys())
    fenced: list[str] = []
    watchers = [
        (_Behind if rank == 2 else Watcher)(_client(server), _client(server), world, rank, size, on_fence=fenced.append)
        for rank in range(size)
    ]
    for watcher in watchers:
        watcher.start()
    time.sleep(0.3)
    verdict = watchers[0].report(PROBE, "test")
    assert verdict is not None and verdict.dead == ()
    watchers[0].end_world([], size)  # at once: rank 2 waits on the end's key a second later
    assert all(watcher.join(5.0) for watcher in watchers)
    assert all(watcher.end_dead == () for watcher in watchers) and not fenced
    assert set(server.list_keys()) - before == set()  # the end's last reader deleted its keys and the world's done
