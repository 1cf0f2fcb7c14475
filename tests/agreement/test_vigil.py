"""An attempt's vigil (issue 31, item 8): a member found dead while the others are inside torch ends the step.

`Watcher.on_dead` runs at every verdict naming dead ranks (not only the
world's first failure), and `Vigil` turns the ones among a step's members
into the step's failure on every member, probing meanwhile on the first two.
The processes case (a member dies in the new world's first all-reduce, which
nothing else probes) is ``tests/grid/test_recovery_processes.py`` (``step``).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from hypergrid.agreement.barrier import BarrierFailed, Vigil
from hypergrid.agreement.liveness import FAILURE, PROBE, record_member
from hypergrid.agreement.watcher import Watcher

TIMEOUT = datetime.timedelta(seconds=30)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def _client(server: Any) -> Any:
    return TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT)


@pytest.mark.timeout(60)
def test_on_dead_runs_at_every_verdict_naming_dead_not_only_the_first_failure(server: Any) -> None:
    """Rank 3 dies first (the world's failure), rank 2 later (found by a probe): both reach an on_dead callback."""
    size, world = 5, 41
    watchers = {
        rank: Watcher(_client(server), _client(server), world, rank, size, liveness_s=0.3) for rank in range(size)
    }
    record_member(_client(server), world, 3, joined=True)  # it joined the watch, then died
    for rank in (0, 1, 2, 4):
        watchers[rank].start()
    heard: list[tuple[int, ...]] = []
    failures: list[tuple[int, ...]] = []
    watchers[1].on_failure(lambda verdict: failures.append(verdict.dead))
    forget = watchers[1].on_dead(heard.append)
    assert watchers[0].report(FAILURE, "a peer's connection closed") is not None
    time.sleep(0.3)
    assert heard == [(3,)] and failures == [(3,)]
    assert watchers[2].halt(watchers[2].side, 5.0)  # rank 2 stops answering
    assert watchers[0].report(PROBE, "a long wait") is not None
    time.sleep(0.3)
    assert heard == [(3,), (2, 3)] and failures == [(3,)]  # on_failure: once; on_dead: at each verdict
    late: list[tuple[int, ...]] = []
    watchers[4].on_dead(late.append)
    assert late == [(2, 3)]  # registered after: run at once with the dead so far
    forget()
    watchers[0].report(PROBE, "another wait")
    time.sleep(0.3)
    assert heard == [(3,), (2, 3)]  # unregistered
    for live in (0, 1, 4):
        watchers[live].end_world([2, 3], size)
    for live in (0, 1, 4):
        assert watchers[live].join(5.0)


class _Liveness:
    """A stand-in for a watcher's `on_dead`: the test plays the verdicts."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def on_dead(self, callback: Any) -> Any:
        self.callbacks.append(callback)
        return lambda: self.callbacks.remove(callback)

    def verdict(self, dead: tuple[int, ...]) -> None:
        for callback in list(self.callbacks):
            callback(dead)


def test_a_vigil_fails_its_step_on_a_dead_member_only() -> None:
    """Members are old ranks 2, 4, 5 (new 0, 1, 2): an old death (3) changes nothing, rank 4's fails the step."""
    liveness, ended = _Liveness(), []
    with Vigil(liveness.on_dead, {2: 0, 4: 1, 5: 2}, "forming world 1", lambda *end: ended.append(end)) as vigil:
        liveness.verdict((3,))
        vigil.check()  # rank 3 is no member
        assert ended == []
        liveness.verdict((3, 4))
        with pytest.raises(BarrierFailed) as failed:
            vigil.check()
        assert failed.value.dead == [1]  # the member, as the step numbers it
    assert liveness.callbacks == []  # it stopped listening
    assert ended == [([1], "member(s) [1] died while forming world 1")]  # the step's waits were ended, once


def test_a_probing_vigil_asks_until_a_member_is_found_dead() -> None:
    """The first two members probe every period while the step lasts, and stop once a member is found dead."""
    liveness = _Liveness()
    asked = threading.Event()
    calls: list[float] = []

    def probe() -> list[int]:
        calls.append(time.monotonic())
        if len(calls) < 3:
            return []
        liveness.verdict((5,))  # the roll call the probe ran named old rank 5 (new 2)
        asked.set()
        return [2]

    with Vigil(liveness.on_dead, {2: 0, 4: 1, 5: 2}, "forming world 1", lambda *end: None, probe, 0.05) as vigil:
        assert asked.wait(5.0)
        time.sleep(0.2)
        assert len(calls) == 3  # stopped after the death was found
        with pytest.raises(BarrierFailed):
            vigil.check()
    with Vigil(None, {2: 0}, "no liveness", probe, period_s=0.05) as quiet:
        time.sleep(0.2)
        quiet.check()  # without liveness nothing is heard, nothing probed
    assert len(calls) == 3
