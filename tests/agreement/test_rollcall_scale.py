"""The roll call at scale (`benchmarks.rollcall`), small: its simulated ranks send what a real watcher sends.

The benchmark replays, for each simulated rank, `benchmarks.rollcall.SCRIPT`;
these tests check that script against a real `Watcher`'s store operations for
one incident it does not close, and run the simulation with 1,024 ranks
(16,384 under ``-m stress``), one dead: every rank reads the same verdict, no
live rank is named dead, the busiest rank's operations stay constant, and no
key is left. Nothing here is timed.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks import rollcall
from benchmarks.guard import CountingStore
from hypergrid.agreement.liveness import FAILURE, INCIDENT_KEYS, PROBE, record_member, world_keys
from hypergrid.agreement.watcher import Watcher
from hypergrid.timing import QUIET_READS

TIMEOUT = datetime.timedelta(seconds=60)
#: A closer's store operations at most, whatever the number of ranks (see the 1,024-rank test).
CLOSER_OPS = 25 + 2 * QUIET_READS + 5


class Recording(CountingStore):
    """A counting store that also names each operation and its first key."""

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.names: list[tuple[str, str]] = []

    def _count(self, name: str, *args: Any) -> Any:
        key = args[0] if args and isinstance(args[0], str) else (args[0][0] if args and args[0] else "")
        self.names.append((name, str(key)))
        return super()._count(name, *args)


def _kinds(name: str, key: str) -> tuple[str, ...]:
    """The `SCRIPT` entries of one recorded operation (torch's ``get`` is two requests: its WAIT, then the GET)."""
    if name == "get":
        return ("wait verdict", "read verdict")
    if name == "compare_set":
        return ("read call" if key.endswith("/call") else "read verdict",)
    if name == "check":
        return ("check verdict",)
    if name == "wait":
        return ("wait wake" if "/wake/" in key else "wait verdict",)
    if name == "delete_key":
        return ("delete wake",)
    if name == "set":
        return ("set done",)
    if name == "append":
        return ("append alive",)
    return ("add count" if key.endswith("/count") else "add read",)


@pytest.mark.timeout(60)
def test_the_simulated_script_is_what_a_real_watcher_sends() -> None:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)

    def connection() -> Any:
        return TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT)

    # Ranks 5 (joined the watch, never answered) and 4 (stopped after the first incident) are dead: nobody's answer
    # completes either roll call. The second is compared: the first found the rank that never answered.
    world, size = 9, 6
    record_member(connection(), world, 5, joined=True)
    recorded = [Recording(connection()) for _ in range(5)]
    watchers = [Watcher(recorded[rank], connection(), world, rank, size) for rank in range(5)]
    for watcher in watchers:
        watcher.start()
    first = watchers[0].report(PROBE, "test")
    assert first is not None and first.dead == (5,)
    assert watchers[4].halt(watchers[4].side, 10.0)
    time.sleep(0.5)  # every live watcher waits on its next wake key
    for store in recorded:
        store.names.clear()
    verdict = watchers[0].report(FAILURE, "test")
    assert verdict is not None and verdict.dead == (4, 5)
    time.sleep(0.5)  # rank 3 read the verdict and waits again
    for watcher in watchers[:4]:
        assert watcher.halt(watcher.side, 10.0)
    assert sorted(server.list_keys()) == sorted(world_keys(world))  # every wake and incident key gone: the world's
    incidents = [tuple(kind for name, key in store.names for kind in _kinds(name, key)) for store in recorded[:4]]
    # The non-closers (they wait for the verdict right after their answer); rank 0 is the first of the wake block
    others = {
        rank: _without_cleanup(ops)
        for rank, ops in enumerate(incidents)
        if ops[3:5] == ("wait verdict", "read verdict")
    }
    assert len(others) >= 2, "; ".join(",".join(one) for one in incidents)
    for rank, ops in others.items():
        script = rollcall.script(first_of_block=rank == 0)
        assert ops[: len(script)] == script, (rank, ",".join(ops))


def _without_cleanup(ops: tuple[str, ...]) -> tuple[str, ...]:
    """``ops`` without the last reader's clean-up (`Incident.conclude`), if it is there.

    It writes the world's ``done``, then deletes the incident's keys (`INCIDENT_KEYS`: 7, ``gone`` among them) and the
    dead ranks' block's wake key.
    """
    if "set done" not in ops:
        return ops
    at, deletes = ops.index("set done"), len(INCIDENT_KEYS) + 1
    assert ops[at + 1 : at + 1 + deletes] == ("delete wake",) * deletes, ops
    return ops[:at] + ops[at + 1 + deletes :]


@pytest.mark.timeout(240)
def test_a_roll_call_of_1024_ranks_with_one_dead_in_constant_operations_per_rank() -> None:
    rows = rollcall.run([1024], processes=2, connections=64, repeats=1)  # raises unless all read the same verdict
    row = rows[0]
    assert row["store_ops_simulated_rank"] == len(rollcall.SCRIPT) == 8  # the first of a block; the others 7
    assert row["live_named_dead"] == 0
    # Closers, whatever the number of ranks: 18 calls at most measured (their wait for I/woken included); one that
    # is also the last reader deletes the incident's 8 keys more (``gone`` since issue 46); then the count of
    # answers, read at the wake's end and at most QUIET_READS + 1 times after the bound, each with a check for the
    # verdict, and one more get of the verdict (a wait and a read) once a check found it: 2 * QUIET_READS + 5.
    assert row["store_ops_closers"] and max(row["store_ops_closers"]) <= CLOSER_OPS


@pytest.mark.timeout(240)
def test_a_roll_call_answered_by_node_agents_of_8_names_only_the_dead_rank_declared_or_not() -> None:
    """`hypergrid.agreement.nodewatch`'s share of the store: one participant per 8 ranks (its answer, its reads and
    its block's deletion in one request each), every count still per rank; raises unless every simulated node and
    the real watcher read the same verdict, which names the dead rank alone."""
    for declared in (False, True):
        (row,) = rollcall.run([1024], processes=2, connections=64, repeats=1, per_node=[8], declared=declared)
        assert (row["per_node"], row["answering"], row["declared"]) == (8, 1 + 1023 // 8 + 1, declared), row
        assert row["live_named_dead"] == 0 and max(row["store_ops_closers"]) <= CLOSER_OPS
        assert row["store_ops_simulated_rank_mean"] == pytest.approx((len(rollcall.SCRIPT) - 1 + 1 / 8) / 8)


@pytest.mark.stress
@pytest.mark.timeout(600)
def test_a_roll_call_of_16384_ranks_names_only_the_dead_rank() -> None:
    rows = rollcall.run([16384], processes=2, connections=256, repeats=1)  # raises unless all read the same verdict
    assert rows[0]["live_named_dead"] == 0
    assert max(rows[0]["store_ops_closers"]) <= CLOSER_OPS
