"""A launcher's agent declares a worker dead (`hypergrid.agreement.sentinel.announce_death`, issue 46): which world,
which rank, which incident, from the round's membership log alone (`hypergrid.launch.memberlog`)."""

from __future__ import annotations

import torch.distributed as dist

from hypergrid.agreement.liveness import FAILURE
from hypergrid.agreement.rollkeys import GONE, gone_of
from hypergrid.agreement.sentinel import announce_death
from hypergrid.launch.memberlog import MemberLog

LOG = "L/"


def published(store: dist.HashStore, prefix: str = "P/") -> dist.HashStore:
    store.set(f"{LOG}liveness", prefix)  # (rank 0 of world 0 did, at its first grid)
    return store


def formed(store: dist.HashStore, world: int, members: list[str], excluded: list[str]) -> None:
    """World ``world`` as its ranks 0 and 1 record it at the end of a shrink."""
    MemberLog(store, LOG).append("formed", world=world, members=members, excluded=excluded, retired=[], once_since=0)


def call_of(store: dist.HashStore, world: int, number: int, prefix: str = "P/") -> str:
    return store.get(f"{prefix}hypergrid/live/{world}/{number}/call").decode()


def test_the_call_names_the_dead_rank_as_the_current_world_numbers_it() -> None:
    store = published(dist.HashStore())
    formed(store, 1, ["0", "1", "2", "4", "5"], ["3"])  # world 1 after a shrink: member 3 was dropped
    store.set("P/hypergrid/live/1/done", "2")  # world 1's incidents 0-2 are over
    assert announce_death(store, LOG, ["4"], 6, "died by signal SIGKILL")
    call = call_of(store, 1, 3)
    assert call.startswith(f"{FAILURE} {GONE}") and gone_of(call) == (3,), call
    assert "rank 3 died by signal SIGKILL (seen by its launcher)" in call
    (dead,) = [entry for entry in MemberLog(store, LOG).entries() if entry.kind == "dead"]
    assert dead.data["members"] == ["4"] and dead.data["world"] == 1


def test_a_renumbered_worker_and_a_replacement_are_found_by_member_not_by_rank() -> None:
    """0.4.0 mapped the launcher's ranks through a table a renumbered worker wrote from ``RANK`` (overwritten at each
    shrink): a launcher rank listed twice, and the agent declared the first match, a live rank. Members are unique:
    world 2 holds member 2 at rank 5 and the replacement of member 3 at rank 2; the death of member 2 names rank 5."""
    store = published(dist.HashStore())
    formed(store, 1, ["0", "1", "2", "4", "5"], ["3"])
    formed(store, 2, ["0", "1", "3.1", "4", "5", "2"], [])  # (rank order as a plan may leave it)
    assert announce_death(store, LOG, ["2"], 6, "died by signal SIGKILL")
    assert gone_of(call_of(store, 2, 0)) == (5,)
    store.set("P/hypergrid/live/2/done", "0")
    assert announce_death(store, LOG, ["3.1"], 6, "died by signal SIGKILL")
    assert gone_of(call_of(store, 2, 1)) == (2,)


def test_nothing_is_called_before_a_grid_or_for_a_rank_already_shrunk_away() -> None:
    store = dist.HashStore()
    assert not announce_death(store, LOG, ["1"], 4, "exited with code 1")  # no worker published the prefix yet
    formed(published(store), 1, ["0", "2", "3"], ["1"])
    assert not announce_death(store, LOG, ["1"], 4, "exited with code 1")  # world 1 left it out already
    assert not announce_death(store, LOG, ["1.1"], 4, "exited with code 1")  # its replacement never joined
    assert not store.check(["P/hypergrid/live/1/0/call"])


def test_an_open_roll_call_lists_the_dead_rank_as_gone_instead() -> None:
    store = published(dist.HashStore())
    store.set("P/hypergrid/live/0/0/call", f"{FAILURE} a peer's connection closed")  # a worker called it first
    assert announce_death(store, LOG, ["2"], 4, "died by signal SIGKILL")
    assert call_of(store, 0, 0) == f"{FAILURE} a peer's connection closed"  # the call in force stays
    assert store.get("P/hypergrid/live/0/0/gone") == b"2\n"


def test_an_agents_death_declares_its_workers_in_the_current_world_in_one_call() -> None:
    store = published(dist.HashStore())
    formed(store, 1, ["0", "1", "2", "4", "5", "6", "7"], ["3"])  # member 3 was shrunk away before its agent died
    assert announce_death(store, LOG, ["3", "2", "4", "5"], 8, "died with their agent (node 1)")
    call = call_of(store, 1, 0)
    assert gone_of(call) == (2, 3, 4), call  # world 1's numbers of launcher ranks 2, 4 and 5
    assert "ranks 2-4 died with their agent (node 1)" in call
    store.set("P/hypergrid/live/1/0/call", f"{FAILURE} opened by a worker")  # a second agent joins the open call
    store.delete_key("P/hypergrid/live/1/0/gone")
    assert announce_death(store, LOG, ["6", "7"], 8, "died with their agent (node 2)")
    assert store.get("P/hypergrid/live/1/0/gone") == b"5\n6\n"
