"""Joining and leaving a world's watch (`hypergrid.agreement.liveness.record_member`) on a real TCPStore.

A world whose last grid every rank destroyed is left by all (its last live leaver deletes the watch's keys), and a
rank that builds a grid again joins at once: the join must never be lost to that deletion (a joined rank whose
entry vanished is left behind: fenced). Threads stand for ranks, each on its own connection.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from hypergrid.agreement import diagnosis
from hypergrid.agreement.liveness import CLOSING, left_behind, record_member, world_keys
from hypergrid.agreement.rollkeys import member_status, members_key

TIMEOUT = datetime.timedelta(seconds=60)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def client(server: Any) -> Any:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT)


def left(server: Any, world: int) -> list[str]:
    """The keys of world ``world``'s watch still in the store."""
    return [key for key in world_keys(world) if server.check([key])]


@pytest.mark.timeout(120)
def test_joins_racing_the_last_leavers_deletion_are_never_lost(server: Any) -> None:
    """6 ranks join and leave 150 times each, at random moments: every joined rank is listed while it is in,
    and once all left, no key of the watch is left."""
    world, ranks, cycles = 101, 6, 150
    lost: list[tuple[int, int]] = []

    def rank_life(rank: int) -> None:
        store = client(server)
        for cycle in range(cycles):
            record_member(store, world, rank, joined=True)
            time.sleep(0.0005 * (rank % 3))
            if not member_status(diagnosis.read(store, members_key(world))).get(rank):
                lost.append((rank, cycle))
            record_member(store, world, rank, joined=False)

    threads = [threading.Thread(target=rank_life, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(100)
    assert not lost, f"joined ranks whose entry a deletion took away (rank, cycle): {lost[:10]} of {len(lost)}"
    assert left(server, world) == []


@pytest.mark.timeout(60)
def test_a_join_that_meets_a_deletion_waits_for_it_and_joins_the_new_watch(server: Any) -> None:
    world = 102
    store = client(server)
    record_member(store, world, 0, joined=True)
    store.set(f"{members_key(world)}-count", str(CLOSING))  # rank 0's last leave is deleting the keys
    joined: list[int] = []
    thread = threading.Thread(target=lambda: joined.append(record_member(client(server), world, 1, joined=True)))
    thread.start()
    time.sleep(0.3)
    assert joined == [] and thread.is_alive(), "the join did not wait for the deletion under way"
    for key in world_keys(world):
        store.delete_key(key)
    thread.join(10)
    assert joined == [1]
    assert member_status(diagnosis.read(store, members_key(world))) == {1: True}


class _JoinAfterAdd:
    """A store whose first ``add`` (a leave's count) lets rank 9 join before the leaver reads it back."""

    def __init__(self, store: Any, joiner: Any, world: int) -> None:
        self.store, self.joiner, self.world, self.done = store, joiner, world, False

    def add(self, key: str, value: int) -> int:
        count: int = self.store.add(key, value)
        if not self.done:
            self.done = True
            record_member(self.joiner, self.world, 9, joined=True)
        return count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


@pytest.mark.timeout(60)
def test_the_last_leaver_deletes_nothing_when_a_rank_joined_after_its_count(server: Any) -> None:
    world = 103
    record_member(client(server), world, 0, joined=True)
    assert record_member(_JoinAfterAdd(client(server), client(server), world), world, 0, joined=False) == 0
    assert member_status(diagnosis.read(client(server), members_key(world))) == {0: False, 9: True}
    assert left(server, world) == world_keys(world)[1:]  # the watch stays (no incident: no done key)
    assert record_member(client(server), world, 9, joined=False) == 0
    assert left(server, world) == []


def test_dead_members_never_leave_so_the_last_live_leaver_counts_them(server: Any) -> None:
    world = 104
    for rank in range(3):
        record_member(client(server), world, rank, joined=True)  # rank 2 dies without leaving
    assert record_member(client(server), world, 0, joined=False, dead=1) == 2
    assert left(server, world) != []
    assert record_member(client(server), world, 1, joined=False, dead=1) == 1
    assert left(server, world) == []


class _LeavesDuringCheck:
    """A connection whose first ``check`` runs ``leave()`` first: this rank's own leave (on its main thread) lands
    between its watcher's read of ``joined`` and the store's answer."""

    def __init__(self, store: Any, leave: Any) -> None:
        self.store, self.leave = store, leave

    def check(self, keys: list[str]) -> bool:
        if self.leave is not None:
            self.leave, leave = None, self.leave
            leave()
        return bool(self.store.check(keys))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_rank_whose_own_leave_deletes_the_watch_during_its_check_is_not_left_behind(server: Any) -> None:
    """The last rank of a world leaves (its leave deletes the watch's keys) while its watcher, woken by another
    rank's close, asks whether it was left behind: it must not be (before, the watcher read ``joined`` once, found
    the watch gone and fenced its own live rank, severing its connections under a peer still reading the last
    collective: gloo's "Connection closed by peer" on that peer, 1 run in about 20 of the toolkit's 8-rank test)."""
    world, rank = 105, 0
    record_member(client(server), world, rank, joined=True)
    state = {"joined": True}

    def leave() -> None:  # what `Watcher.leave` does: not joined from now on, then the leave (it deletes the watch)
        state["joined"] = False
        record_member(client(server), world, rank, joined=False)

    racing = _LeavesDuringCheck(client(server), leave)
    assert not left_behind(racing, world, rank, lambda: state["joined"])
    assert left(server, world) == []  # the leave did delete the watch: the check met it
    record_member(client(server), world, rank, joined=True)  # a rank still in a world whose watch went: behind
    server.delete_key(members_key(world))
    assert left_behind(client(server), world, rank, lambda: True)
    assert not left_behind(client(server), world, rank, lambda: False)  # (a rank never in it is only late)
