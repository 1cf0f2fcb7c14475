"""hypergrid.run without processes: the job-wide count between agents, and its command line as torchrun's.

``HealthRound`` is played by several "agents" (threads) on one in-memory
store, as real agents play it on the rendezvous store: the failure count,
the verdict that reaches every agent through its watcher, the exit barrier.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist
from torch.distributed.run import get_args_parser

from hypergrid.launch.health import HealthRound
from hypergrid.launch.launcher import parser
from tests.launch.waiting import eventually

pytestmark = pytest.mark.timeout(60)


def _agents(count: int, workers: int, min_healthy: int, restart: int = 0) -> list[HealthRound]:
    store = dist.HashStore()
    rounds = [HealthRound(store, restart, workers=workers, agents=count, min_healthy=min_healthy) for _ in range(count)]
    for health in rounds:
        health.start_watching()
    return rounds


def test_failures_above_the_minimum_raise_no_verdict_and_the_barrier_lets_everyone_go() -> None:
    a, b = _agents(2, workers=4, min_healthy=2)
    assert a.record_failure() is False and b.record_failure() is False  # 2 of 4 healthy: at the minimum
    assert (a.failed, b.failed) == (1, 2)  # the count is job-wide: b saw a's failure
    outcomes: list[str] = []
    waiter = threading.Thread(target=lambda: outcomes.append(a.exit_barrier(30)))
    waiter.start()
    time.sleep(0.2)
    assert outcomes == []  # a waits for b, whose workers still run
    assert b.exit_barrier(30) == "done"
    waiter.join(10)
    assert outcomes == ["done"]
    assert not a.below_minimum() and not b.below_minimum()
    assert a.stop_watching() and b.stop_watching()  # ``done`` ended both watchers


def test_the_failure_that_crosses_the_minimum_reaches_every_agent() -> None:
    a, b, c = _agents(3, workers=6, min_healthy=4)
    assert c.record_failure() is False  # 5 of 6
    assert a.record_failure() is False  # 4 of 6
    assert not b.below_minimum()
    assert b.record_failure() is True  # 3 of 6: below, known to the agent that crossed at once
    assert b.below_minimum() and b.verdict == "3 of 6 workers failed"
    assert eventually(lambda: a.below_minimum() and c.below_minimum())  # through the watchers, no polling
    assert a.verdict == c.verdict == "3 of 6 workers failed"
    assert all(health.stop_watching() for health in (a, b, c))


def test_a_verdict_releases_an_agent_waiting_in_the_exit_barrier() -> None:
    a, b = _agents(2, workers=4, min_healthy=4)
    outcomes: list[str] = []
    waiter = threading.Thread(target=lambda: outcomes.append(a.exit_barrier(30)))
    waiter.start()
    time.sleep(0.2)
    assert b.record_failure() is True
    waiter.join(10)
    assert outcomes == ["verdict"] and a.below_minimum()
    assert a.stop_watching() and b.stop_watching()


def test_the_exit_barrier_gives_up_after_its_timeout() -> None:
    a, b = _agents(2, workers=2, min_healthy=1)
    began = time.monotonic()
    assert a.exit_barrier(0.3) == "timeout"
    assert time.monotonic() - began >= 0.3
    assert b.exit_barrier(5) == "done"  # the second arrival still completes the round: the watchers end
    assert a.stop_watching() and b.stop_watching()


def test_each_restart_counts_afresh() -> None:
    store = dist.HashStore()
    first = HealthRound(store, 0, workers=2, agents=1, min_healthy=2)
    assert first.record_failure() is True
    second = HealthRound(store, 1, workers=2, agents=1, min_healthy=2)  # the same store (static rendezvous)
    assert not second.below_minimum() and second.healthy() == 2
    assert second.exit_barrier(5) == "done"


def test_every_torchrun_flag_parses_as_under_torchrun() -> None:
    argv = [
        "--nnodes", "1:2", "--nproc-per-node", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "host:1234",
        "--rdzv-id", "job", "--rdzv-conf", "join_timeout=5", "--max-restarts", "2", "--monitor-interval", "0.5",
        "--role", "trainer", "--log-dir", "/tmp/logs", "--tee", "3", "--local-addr", "127.0.0.1",
        "--no-python", "--module", "train", "--lr", "0.1",
    ]  # fmt: skip
    ours, torchrun = vars(parser().parse_args(argv)), vars(get_args_parser().parse_args(argv))
    assert {key: ours[key] for key in torchrun} == torchrun
    assert ours["min_healthy"] == 1 and ours["exit_barrier_timeout"] > 0


def test_the_last_agent_reads_the_ledger_once_and_every_agent_gets_the_list() -> None:
    a, b = _agents(2, workers=4, min_healthy=1)
    assert a.record_failure() is False and b.record_failure() is False
    reads: list[str] = []

    def read() -> str:
        reads.append("read")
        return "3,1,"

    outcomes: list[str] = []
    waiter = threading.Thread(target=lambda: outcomes.append(a.exit_barrier(30, read)))
    waiter.start()
    assert eventually(lambda: a.store.add(a.prefix + "arrived", 0) == 1)
    assert reads == []  # a arrived first: b's workers may still shrink some away
    assert b.exit_barrier(30, read) == "done"
    waiter.join(10)
    assert outcomes == ["done"] and reads == ["read"]
    assert a.shrunk() == b.shrunk() == "3,1,"
    leaving = threading.Thread(target=a.leave)
    leaving.start()
    b.leave()
    leaving.join(10)
    assert not leaving.is_alive()


def test_without_a_failure_the_ledger_is_not_read() -> None:
    (a,) = _agents(1, workers=2, min_healthy=1)
    assert a.exit_barrier(5, lambda: pytest.fail("read without a failure")) == "done"
    assert a.shrunk() == ""


def test_a_ledger_that_cannot_be_read_accounts_for_nobody() -> None:
    (a,) = _agents(1, workers=2, min_healthy=1)
    a.record_failure()

    def unreachable() -> str:
        raise ConnectionError("the workers' store is gone")

    assert a.exit_barrier(5, unreachable) == "done"
    assert a.shrunk() == ""


def test_an_agent_found_dead_counts_its_unaccounted_workers_once_and_is_not_waited_for() -> None:
    """Agent 1 of 3 (workers 2, 3) is found dead by the ring: worker 2's end its own agent had counted already, so
    one failure more; the exit barrier no longer waits for agent 1, and a second finder counts nothing again."""
    a, b, c = _agents(3, workers=6, min_healthy=1)
    assert b.claim(2, "agent 1")  # (agent 1 saw worker 2 exit 0 before it died)
    assert a.count_dead_agent(1, [2, 3], "ring 0", None) is False
    assert a.count_dead_agent(1, [2, 3], "ring 2", None) is False  # (found again: counted once)
    assert int(a.store.add(a.prefix + "failed", 0)) == 1
    assert not a.claim(3, "agent 1")  # its agent, had it lived, would not count it again
    outcomes: list[str] = []
    waiter = threading.Thread(target=lambda: outcomes.append(a.exit_barrier(30, index=0)))
    waiter.start()
    assert c.exit_barrier(30, index=2) == "done"  # agents 0 and 2 arrived, agent 1 counted by the ring
    waiter.join(10)
    assert outcomes == ["done"]


def test_an_agent_that_arrived_then_died_is_not_counted_twice() -> None:
    a, b, c = _agents(3, workers=3, min_healthy=1)
    outcomes: list[str] = []
    waiters = [
        threading.Thread(target=lambda r=r, i=i: outcomes.append(r.exit_barrier(30, index=i)))
        for r, i in ((a, 0), (b, 1))
    ]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.2)
    c.count_dead_agent(1, [1], "ring 0", None)  # agent 1 was at the barrier when it died
    time.sleep(0.2)
    assert outcomes == []  # agent 2 has not arrived: two of three, not three
    assert c.exit_barrier(30, index=2) == "done"
    for waiter in waiters:
        waiter.join(10)
    assert sorted(outcomes) == ["done", "done"]
