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
    path = out / f"lost{index}"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30))


def start(store: dist.TCPStore, agents: int, out: pathlib.Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(WORKER), str(store.port)]
    procs = [subprocess.Popen([*command, str(i), str(agents), str(out)], env=env) for i in range(agents)]
    assert eventually(lambda: all((out / f"ready{i}").exists() for i in range(agents)), 60)
    time.sleep(0.3)  # every watcher connected to the next
    return procs


def stop(procs: list[subprocess.Popen[bytes]], out: pathlib.Path, index: int) -> None:
    (out / f"stop{index}").write_text("")
    assert procs[index].wait(30) == 0


def test_a_killed_agent_is_reported_by_the_one_before_it_alone_and_the_ring_closes_over_it(
    store: dist.TCPStore, tmp_path: pathlib.Path
) -> None:
    procs = start(store, 4, tmp_path)
    try:
        procs[2].send_signal(signal.SIGKILL)
        killed = time.time()
        assert eventually(lambda: lost_of(tmp_path, 1), BOUND_S), "agent 1 did not report agent 2's death"
        (report,) = lost_of(tmp_path, 1)
        assert report["agent"] == 2 and report["ranks"] == [4, 5]
        assert float(report["at"]) - killed < BOUND_S  # type: ignore[arg-type]
        procs[3].send_signal(signal.SIGKILL)  # a second death: agent 1 watches agent 3 now
        assert eventually(lambda: len(lost_of(tmp_path, 1)) == 2, BOUND_S), "the ring did not close over agent 2"
        assert lost_of(tmp_path, 1)[1]["ranks"] == [6, 7]
        for index in (1, 0):  # leaving in order is no death
            stop(procs, tmp_path, index)
        assert [lost_of(tmp_path, index) for index in (0, 3)] == [[], []]
        assert len(lost_of(tmp_path, 1)) == 2
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_agents_leaving_in_order_in_any_order_report_nothing(store: dist.TCPStore, tmp_path: pathlib.Path) -> None:
    procs = start(store, 3, tmp_path)
    try:
        for index in (1, 0, 2):
            stop(procs, tmp_path, index)
        assert [lost_of(tmp_path, index) for index in range(3)] == [[], [], []]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def test_an_agent_that_cannot_be_reached_is_no_proof_of_a_death(store: dist.TCPStore) -> None:
    """Published, then unreachable (gone before its watcher came, or a firewall): said on the report, not a death;
    the watcher goes on to the next agent (here: itself, and stops)."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # (nobody listens there any more)
    store.set("U/ring/1", f"127.0.0.1 {port} 2,3")
    found: list[tuple[int, list[int]]] = []
    said: list[str] = []
    ring = AgentRing(
        store, "U/", 0, 2, [0, 1], lambda index, ranks, text: found.append((index, ranks)), report=said.append
    )
    ring.start()
    assert eventually(lambda: not ring._threads[1].is_alive(), 10)  # it tried agent 1, then came back to itself
    ring.close()
    assert found == [] and len(said) == 1 and f"could not watch node 1's agent at 127.0.0.1:{port}" in said[0]


def test_a_bad_place_is_refused_by_name(store: dist.TCPStore) -> None:
    with pytest.raises(ValueError, match=r"index=2; expected 0 <= index < agents=2"):
        AgentRing(store, "R/", 2, 2, [0], lambda index, ranks, said: None)
