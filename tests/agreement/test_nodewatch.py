"""The node's agent answers the roll call for its workers (`hypergrid.agreement.nodewatch`, issue 46).

Real watchers (`Watcher` with a `Relay`) and a real `NodeWatch` on a real TCPStore, in one process: the agent
answers an incident for all of its workers with one ``append`` and one ``add``, reads the verdict once, and each
worker reads it from its FIFO (its own store connection is not used). A worker whose pulse stopped is not answered
for: the roll call names it dead, and it fences itself when it reads the verdict. A stopped process is not
answered for. Ranks that answer for themselves share the roll call with the agent's. A world's end reaches every
worker, and the follow ends with its last worker.
"""

from __future__ import annotations

import datetime
import logging
import os
import pathlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.guard import CountingStore
from hypergrid.agreement import relay as relay_module
from hypergrid.agreement import watcher as watcher_module
from hypergrid.agreement.liveness import FAILURE, PROBE, members_key
from hypergrid.agreement.nodewatch import Member, NodeWatch
from hypergrid.agreement.relay import CONTROL, Relay
from hypergrid.agreement.watcher import Watcher
from hypergrid.launch.memberlog import MemberLog

TIMEOUT = datetime.timedelta(seconds=30)
pytestmark = pytest.mark.timeout(60)


class Recording(CountingStore):
    """A counting client that also records each request's name and key."""

    def __init__(self, store: Any, calls: list[tuple[str, str]]) -> None:
        super().__init__(store)
        self.calls = calls

    def _count(self, name: str, *args: Any) -> Any:
        self.calls.append((name, str(args[0]) if args else ""))
        return super()._count(name, *args)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    store.set("L/liveness", "")  # the workers' roll calls live at the store's root here
    yield store


def _client(server: Any, calls: list[tuple[str, str]] | None = None) -> CountingStore:
    raw = TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT)
    return CountingStore(raw) if calls is None else Recording(raw, calls)


@pytest.fixture
def agent(server: Any, tmp_path: pathlib.Path) -> Iterator[tuple[NodeWatch, list[tuple[str, str]]]]:
    calls: list[tuple[str, str]] = []
    watch = NodeWatch(lambda: _client(server, calls), "L/", str(tmp_path / "node"), liveness_s=0.5).start()
    yield watch, calls
    watch.stop()


def _watchers(
    server: Any, directory: str | None, world: int, size: int, relayed: range | list[int]
) -> tuple[list[Watcher], dict[int, str]]:
    """``size`` watchers of world ``world``, those of ``relayed`` answered for by the agent of ``directory``; and
    the reasons each rank was fenced for, as they come."""
    fenced: dict[int, str] = {}

    def one(rank: int) -> Watcher:
        relay = Relay.open(directory, world, rank, size) if rank in relayed else None
        record = lambda why, r=rank: fenced.setdefault(r, why)  # noqa: E731
        return Watcher(_client(server), _client(server), world, rank, size, liveness_s=0.5, on_fence=record,
                       relay=relay)  # fmt: skip

    watchers = [one(rank) for rank in range(size)]
    for watcher in watchers:
        watcher.start()
    time.sleep(0.3)  # every thread waits: on its FIFO, the agent's on its workers' block's key
    return watchers, fenced


def _until(done: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(done())


def _close(watchers: list[Watcher]) -> None:
    for watcher in watchers:
        watcher.leave()
        watcher.halt(watcher.side, 5.0)
        watcher.forget()


def test_the_agent_answers_for_its_workers_once_and_each_reads_the_verdict_from_its_fifo(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]]
) -> None:
    watch, calls = agent
    watchers, fenced = _watchers(server, watch.directory, 11, 4, range(4))
    assert all(watcher.relay is not None for watcher in watchers)  # acknowledged: the agent answers for them
    before = [watcher.store.ops for watcher in watchers]
    verdict = watchers[0].report(FAILURE, "rank 0 saw a failure")
    assert verdict is not None and (verdict.kind, verdict.dead, verdict.text) == (FAILURE, (), "rank 0 saw a failure")
    assert _until(lambda: all(watcher.failure is not None for watcher in watchers))
    assert all(watcher.verdicts[0] == watchers[0].verdicts[0] for watcher in watchers)
    answers = [call for call in calls if call[1].startswith("hypergrid/live/11/0/") and call[0] in ("append", "add")]
    assert [name for name, _ in answers] == ["append", "add", "add"]  # alive, count; then the readers' count, once
    assert [watcher.store.ops for watcher in watchers] == before  # no worker answered on its own connection
    assert watch.answered == 1 and not fenced
    time.sleep(0.3)
    assert not [key for key in server.list_keys() if key.startswith("hypergrid/live/11/0/")]  # the incident's keys
    _close(watchers)


def test_a_worker_whose_pulse_stopped_is_named_dead_and_fences_itself_when_it_reads_the_verdict(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    watch, _ = agent
    watchers, fenced = _watchers(server, watch.directory, 12, 4, range(4))
    wedged = watchers[3].relay
    assert wedged is not None
    real = os.utime
    monkeypatch.setattr(relay_module.os, "utime", lambda path, *a, **k: None if path == wedged.path else real(path))
    old = time.time() - 10
    real(wedged.path, (old, old))  # its pulse stopped 10 s ago (an interpreter wedged in a C call)
    verdict = watchers[1].report(PROBE, "a wait took long")
    assert verdict is not None and verdict.dead == (3,), verdict
    assert _until(lambda: 3 in fenced)
    assert "declared dead" in fenced[3] and sorted(fenced) == [3], fenced
    assert _until(lambda: [watcher.dead for watcher in watchers[:3]] == [[3]] * 3)
    _close(watchers)


def test_a_stopped_or_dead_process_is_not_answered_for(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    child = subprocess.Popen(["sleep", "30"])
    try:
        member = Member(child.pid, str(fifo))
        assert member.answers()
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(0.1)
        assert not member.answers()  # state T in /proc
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.1)
        assert member.answers()
        old = time.time() - 3
        os.utime(fifo, (old, old))
        assert not member.answers()  # its pulse is older than the window
        assert member.answers(window_s=5.0)
        child.kill()
        time.sleep(0.1)
        assert not member.answers(window_s=5.0)  # a zombie
        child.wait()
        assert not member.answers(window_s=5.0)  # gone, its FIFO still there
    finally:
        child.kill()
        child.wait()


def test_ranks_that_answer_for_themselves_share_the_roll_call_with_the_agents(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]]
) -> None:
    watch, _ = agent
    watchers, fenced = _watchers(server, watch.directory, 13, 4, [0, 1])
    assert [watcher.relay is not None for watcher in watchers] == [True, True, False, False]
    for number, reporter in enumerate((2, 0)):  # called by a rank answering itself, then by one the agent answers for
        verdict = watchers[reporter].report(PROBE, f"rank {reporter} asks")
        assert verdict is not None and verdict.dead == () and verdict.text == f"rank {reporter} asks", verdict
        # (every rank read it before the next call: a probe that meets the incident its watcher is in joins it)
        assert _until(lambda n=number: all(n in watcher.verdicts for watcher in watchers)), fenced
    assert not fenced
    time.sleep(0.3)
    assert not [key for key in server.list_keys() if key.startswith(("hypergrid/live/13/0/", "hypergrid/live/13/1/"))]
    _close(watchers)


def test_a_worlds_end_reaches_every_worker_and_its_follow_ends_with_its_connections_kept(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]]
) -> None:
    watch, _ = agent
    watchers, fenced = _watchers(server, watch.directory, 14, 4, range(4))
    follow = watch.follows[14]
    watchers[3].relay.close()  # type: ignore[union-attr]  # (its process is gone: the agent answers no more)
    watchers[0].end_world([3], 4)
    assert _until(lambda: all(watcher.stopped or watcher.fenced for watcher in watchers[:3]))
    assert [watcher.end_dead for watcher in watchers[:3]] == [(3,)] * 3 and not fenced
    follow.thread.join(5)
    kept = len(watch._idle) + (watch._waker is not None)  # (a halt's waker may have taken one of them)
    assert not follow.thread.is_alive() and kept >= 2, kept  # its connections serve the next world's
    assert not server.check([members_key(14)])  # the world's keys: the end's last reader (the agent) deleted them
    for watcher in watchers:
        watcher.halt(watcher.side, 5.0)


def test_a_message_longer_than_a_pipe_buffer_arrives_whole_and_a_torn_line_is_skipped(tmp_path: pathlib.Path) -> None:
    os.mkfifo(tmp_path / CONTROL)
    control = os.open(tmp_path / CONTROL, os.O_RDWR)  # (an agent's FIFO that someone reads)
    relay = Relay(str(tmp_path), 3, 1, 2)
    try:
        dead = list(range(0, 40000, 3))  # a verdict naming many dead: ~70 KB, more than the FIFO holds at once
        sent: list[bool] = []
        writer = threading.Thread(target=lambda: sent.append(relay_module.send(relay.path, {"n": 0, "dead": dead})))
        writer.start()
        assert relay.receive(5.0) == {"n": 0, "dead": dead}
        writer.join(5)
        assert sent == [True]
        fd = os.open(relay.path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b'{"n": 1, "verd')  # a writer that gave up half-way
        os.close(fd)
        assert relay_module.send(relay.path, {"n": 1, "verdict": "x"})
        assert relay.receive(5.0) == {}  # the torn line, merged with the next one up to its end: skipped
        assert relay_module.send(relay.path, {"n": 2})
        assert relay.receive(5.0) == {"n": 2}
    finally:
        relay.release()
        os.close(control)


def test_a_relay_without_an_agent_is_none_and_one_not_acknowledged_answers_for_itself(
    server: Any, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert Relay.open(None, 0, 0, 2) is None and Relay.open(str(tmp_path), 0, 0, 2) is None  # no agent's FIFO
    os.mkfifo(tmp_path / CONTROL)  # an agent's FIFO that nobody reads (its agent is gone)
    with caplog.at_level(logging.WARNING, logger="hypergrid"):
        watchers, fenced = _watchers(server, str(tmp_path), 15, 2, range(2))
    assert [watcher.relay for watcher in watchers] == [None, None]
    assert "did not acknowledge rank 0 of world 15" in caplog.text
    verdict = watchers[0].report(PROBE, "x")  # they answer for themselves
    assert verdict is not None and verdict.dead == () and not fenced
    assert not [path for path in os.listdir(tmp_path) if path != CONTROL]  # their FIFOs went
    _close(watchers)


def test_a_worker_that_joins_again_while_a_roll_call_is_open_is_answered_for_and_never_named_dead(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]]
) -> None:
    """Churn (issue 53): a rank leaves the watch and joins again (its grid destroyed, the next made) after its agent
    answered an open roll call for the others. The call counts it from its join on; its agent answers it at once."""
    watch, _ = agent
    watchers, fenced = _watchers(server, watch.directory, 16, 4, range(4))
    _close(watchers[3:])  # rank 3 left the watch (its last grid destroyed)
    found: list[Any] = []
    caller = threading.Thread(target=lambda: found.append(watchers[0].report(PROBE, "a wait took long")))
    caller.start()
    assert _until(lambda: watch.answered == 1)  # the agent answered for ranks 0-2; the closers wait for rank 3
    again = Watcher(_client(server), _client(server), 16, 3, 4, liveness_s=0.5, on_fence=fenced.setdefault,
                    relay=Relay.open(watch.directory, 16, 3, 4)).start()  # fmt: skip
    caller.join(10)
    assert found and found[0] is not None and found[0].dead == (), found
    assert _until(lambda: 0 in again.verdicts) and not fenced, fenced  # it read the verdict from its FIFO
    # ...and counts among its readers: the last one deletes the incident's keys (the next call goes to incident 1)
    assert _until(lambda: not [key for key in server.list_keys() if key.startswith("hypergrid/live/16/0/")])
    _close([*watchers[:3], again])


def test_a_worker_that_leaves_is_answered_for_until_the_watch_no_longer_lists_it(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Churn (issue 53): a roll call called while a rank leaves the watch never finds it listed and unanswered."""
    watch, _ = agent
    watchers, fenced = _watchers(server, watch.directory, 17, 4, range(4))
    found: list[Any] = []
    real = watcher_module.record_member

    def leaving(store: Any, world: int, rank: int, joined: bool, dead: int = 0) -> int:
        if world == 17 and rank == 3 and not joined:  # a roll call just before the watch hears that rank 3 left
            found.append(watchers[0].report(PROBE, "a wait took long"))
        return real(store, world, rank, joined, dead)

    monkeypatch.setattr(watcher_module, "record_member", leaving)
    watchers[3].leave()
    assert found and found[0] is not None and found[0].dead == (), found
    assert not fenced, fenced
    _close(watchers)


def test_a_roll_call_declares_the_members_the_log_records_dead_even_where_they_never_joined(
    server: Any, agent: tuple[NodeWatch, list[tuple[str, str]]]
) -> None:
    """One decision path (issue 53): the agent's announcement is first an entry of the round's log, and every roll
    call the agent answers declares it. Here the call went nowhere (rank 3 died before it joined the watch, as when
    every rank was between two grids): a later probe names rank 3 dead, where it was merely late before."""
    watch, _ = agent
    log = MemberLog(server, "L/")
    log.append("formed", world=18, members=["0", "1", "2", "3"], excluded=[], retired=[])
    log.append("dead", members=["3"], said="died by signal SIGKILL", world=18)
    fenced: dict[int, str] = {}

    def one(rank: int) -> Watcher:
        relay = Relay.open(watch.directory, 18, rank, 4)
        return Watcher(_client(server), _client(server), 18, rank, 4, liveness_s=0.5, on_fence=fenced.setdefault,
                       relay=relay).start()  # fmt: skip

    watchers = [one(rank) for rank in range(3)]
    verdict = watchers[1].report(PROBE, "a guard round waits for rank 3")
    assert verdict is not None and verdict.dead == (3,), verdict
    assert _until(lambda: all(watcher.failure is not None for watcher in watchers)) and not fenced
    _close(watchers)
