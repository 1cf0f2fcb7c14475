"""The agents watch each other (`hypergrid.launch.ring.AgentRing`, issue 46): real processes, SIGKILLed or leaving
in order, on a real ``TCPStore``; what every other agent reports."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from hypergrid.launch.ring import AgentRing
from tests.launch.waiting import eventually

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
WORKER = ROOT / "tests" / "workers" / "ringed.py"
#: Generous for a loaded 2-core host: the kernel closes a killed process's sockets at once.
BOUND_S = 3.0

pytestmark = pytest.mark.timeout(120)


def lost_of(out: pathlib.Path, index: int) -> list[dict[str, object]]:
    """The deaths agent ``index`` reported (a line still being written is left for the next look)."""
    path = out / f"lost{index}"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def watching(out: pathlib.Path, index: int) -> str:
    path = out / f"watching{index}"
    return path.read_text() if path.exists() else ""


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def start(store: dist.TCPStore, agents: int, out: pathlib.Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """``agents`` ring members, each holding its connection to the next."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(WORKER), str(store.port)]
    procs.extend(subprocess.Popen([*command, str(i), str(agents), str(out)], env=env) for i in range(agents))
    ring = [str((i + 1) % agents) for i in range(agents)]
    assert eventually(lambda: [watching(out, i) for i in range(agents)] == ring, 60), "the ring did not form"


def stop(procs: list[subprocess.Popen[bytes]], out: pathlib.Path, *indices: int) -> None:
    """These agents leave in order, all at once."""
    for index in indices:
        (out / f"stop{index}").write_text("")
    for index in indices:
        assert procs[index].wait(30) == 0


def test_a_killed_agent_is_reported_by_the_one_before_it_alone_and_the_ring_closes_over_it(
    store: dist.TCPStore, tmp_path: pathlib.Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    start(store, 4, tmp_path, procs)
    procs[2].send_signal(signal.SIGKILL)
    killed = time.time()
    assert eventually(lambda: lost_of(tmp_path, 1), BOUND_S), "agent 1 did not report agent 2's death"
    (report,) = lost_of(tmp_path, 1)
    assert report["agent"] == 2 and report["ranks"] == [4, 5]
    assert float(report["at"]) - killed < BOUND_S  # type: ignore[arg-type]
    assert eventually(lambda: watching(tmp_path, 1) == "3", BOUND_S), "agent 1 does not watch agent 3"
    procs[3].send_signal(signal.SIGKILL)  # a second death, found by the same agent
    assert eventually(lambda: len(lost_of(tmp_path, 1)) == 2, BOUND_S), "the ring did not close over agent 2"
    assert lost_of(tmp_path, 1)[1]["ranks"] == [6, 7]
    stop(procs, tmp_path, 1, 0)  # leaving in order is no death
    assert [lost_of(tmp_path, index) for index in (0, 2, 3)] == [[], [], []]
    assert len(lost_of(tmp_path, 1)) == 2


def test_two_neighbours_killed_at_once_are_both_reported(
    store: dist.TCPStore, tmp_path: pathlib.Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Agent 1 watched agent 2 alone, and agent 2 alone watched agent 3: agent 1 finds both (agent 3's port
    refuses it, and agent 3 recorded no leaving)."""
    start(store, 4, tmp_path, procs)
    procs[2].send_signal(signal.SIGKILL)
    procs[3].send_signal(signal.SIGKILL)
    assert eventually(lambda: len(lost_of(tmp_path, 1)) == 2, BOUND_S + 2), lost_of(tmp_path, 1)
    assert [report["ranks"] for report in lost_of(tmp_path, 1)] == [[4, 5], [6, 7]]
    stop(procs, tmp_path, 0, 1)
    assert lost_of(tmp_path, 0) == [] and len(lost_of(tmp_path, 1)) == 2


@pytest.mark.parametrize("order", ["one by one", "all at once"])
def test_agents_leaving_in_order_report_nothing(
    store: dist.TCPStore, tmp_path: pathlib.Path, procs: list[subprocess.Popen[bytes]], order: str
) -> None:
    """Every agent's round ends (the job's end, a restart): whatever the order, nobody is reported dead, also an
    agent whose watcher connects to a neighbour that is closing (its record of leaving comes first)."""
    start(store, 4, tmp_path, procs)
    if order == "one by one":
        for index in (1, 0, 3, 2):
            stop(procs, tmp_path, index)
    else:
        stop(procs, tmp_path, 0, 1, 2, 3)
    assert [lost_of(tmp_path, index) for index in range(4)] == [[], [], [], []]


@pytest.mark.parametrize("left", [False, True])
def test_an_agent_that_refuses_its_watcher_is_dead_unless_it_recorded_leaving(store: dist.TCPStore, left: bool) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # (nobody listens there any more)
    store.set("U/ring/1", f"127.0.0.1 {port} 2,3")
    if left:
        store.set("U/ring/1/left", "")
    found: list[tuple[int, list[int]]] = []
    ring = AgentRing(store, "U/", 0, 2, [0, 1], lambda index, ranks, text: found.append((index, ranks)))
    ring.start()
    assert eventually(lambda: not ring._threads[1].is_alive(), 10)  # it watched agent 1, then came back to itself
    ring.close()
    assert found == ([] if left else [(1, [2, 3])])
    assert store.check(["U/ring/0/left"])  # its own record of leaving


def test_a_bad_place_is_refused_by_name(store: dist.TCPStore) -> None:
    with pytest.raises(ValueError, match=r"index=2; expected 0 <= index < agents=2"):
        AgentRing(store, "R/", 2, 2, [0], lambda index, ranks, said: None)
