"""The roll call (`hypergrid.agreement.liveness`), the barrier and the watcher: threads on a real TCPStore.

Each simulated rank has its own store connection (``CountingStore`` counts its
operations). Ranks that "die" simply never answer.
"""

from __future__ import annotations

import datetime
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

import hypergrid.timing
from benchmarks.guard import CountingStore
from hypergrid.agreement import diagnosis, liveness
from hypergrid.agreement.barrier import Barrier, BarrierFailed
from hypergrid.agreement.liveness import (
    END,
    FAILURE,
    MULTI_SET_KEYS,
    PROBE,
    WAKE_BLOCK,
    Incident,
    Verdict,
    end_text,
    incident_prefix,
    majority,
    record_member,
    wake_key,
    world_keys,
)
from hypergrid.agreement.rollkeys import gone_text
from hypergrid.agreement.watcher import Watcher
from hypergrid.timing import Timing

TIMEOUT = datetime.timedelta(seconds=60)
BOUND = 0.5


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


def client(server: Any) -> CountingStore:
    return CountingStore(TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT))


def added(server: Any, before: set[str]) -> set[str]:
    """The keys in the store that are not in ``before`` (``set(server.list_keys())`` earlier)."""
    return set(server.list_keys()) - before


def roll_call(
    server: Any,
    world: int,
    size: int,
    answering: list[int],
    number: int = 0,
    bound: float = BOUND,
    late: dict[int, float] | None = None,
    woken_at: float | None = None,
    joined: bool = True,
) -> tuple[dict[int, Any], dict[int, int]]:
    """Incident ``number`` of world ``world``: ``answering`` ranks answer (one thread each); the verdicts they read.

    A rank in ``late`` answers that many seconds after the call (the others at once). With ``woken_at``, the
    caller says every rank is woken (``I/woken``) that many seconds after the call; without, it never does
    (a caller that died before the end of its wake). ``joined``: every rank joined the world's watch first (a rank
    that did not is late: never dead).
    """
    prefix = incident_prefix(world, number)
    caller = client(server)
    if joined and number == 0:
        for rank in range(size):
            record_member(caller, world, rank, joined=True)
    caller.compare_set(f"{prefix}/call", "", f"{FAILURE} test")
    if woken_at is not None:
        timer = threading.Timer(woken_at, lambda: caller.set(f"{prefix}/woken", ""))
        timer.start()
    verdicts, ops = roll_call_answers(server, prefix, size, answering, bound, late)
    if woken_at is not None:
        timer.join()
        caller.delete_key(f"{prefix}/woken")  # (the caller's own check finds the call gone: `Incident.call`)
    return verdicts, ops


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size", [2, 16, 64])
def test_everyone_answers_nobody_dead_in_o1_ops_no_key_left(server: Any, size: int) -> None:
    before = set(server.list_keys())
    # It closes on the count, once the caller woke every rank (at once here: the woken key's wait is the last's).
    verdicts, ops = roll_call(server, 100 + size, size, list(range(size)), bound=30.0, woken_at=0.0)
    assert {verdict for verdict in verdicts.values()} == {Verdict(FAILURE, (), "test")}
    # whatever the size: read, append, count, get the verdict (one call: torch's wait, then its read), count the
    # read; the first rank of each block of 8 deletes its block's wake key; the two first to answer (the closers)
    # and the last also wait for the wake's end (``I/woken``), the last reader writes ``done`` and deletes 6 keys;
    # a closer reads the count and checks the verdict at its pace (`Incident._settle`: no store wait that times
    # out), at most 2 x QUIET_READS times
    assert max(ops.values()) <= 17 + 2 * hypergrid.timing.QUIET_READS
    if size > 4:  # (at 2 ranks both are closers)
        assert statistics.median_low(ops.values()) <= 5
    assert added(server, before) == set(world_keys(100 + size))  # the world's last incident read by all: one key


@pytest.mark.timeout(60)
def test_ranks_that_do_not_answer_are_dead_for_every_survivor(server: Any) -> None:
    before = set(server.list_keys())
    verdicts, _ = roll_call(server, 1, 8, [0, 1, 2, 4, 5, 7])
    assert {verdict.dead for verdict in verdicts.values()} == {(3, 6)}
    assert added(server, before) == set(world_keys(1))


@pytest.mark.timeout(60)
def test_a_rank_that_answers_before_the_bound_is_never_dead_however_long_the_others_heard_nothing(
    server: Any,
) -> None:
    # Ranks 0 to 2 answer at once, rank 3 after 0.6 of the 1 s bound (no answer comes in meanwhile), rank 4 never:
    # only rank 4 is dead. A closer that ended the wait once the answers seemed to stop would fence rank 3.
    before = set(server.list_keys())
    verdicts, _ = roll_call(server, 12, 5, [0, 1, 2, 3], bound=1.0, late={3: 0.6})
    assert {verdict.dead for verdict in verdicts.values()} == {(4,)}
    assert added(server, before) == set(world_keys(12))


@pytest.mark.timeout(60)
def test_the_bound_runs_from_the_end_of_the_wake_not_from_the_call(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wake that takes 1 s (as 131,072 wake keys do): rank 3 is woken by its end and answers 1.3 s after the call,
    # past the 1 s bound counted from the call, yet within 1 s of the wake's end: only rank 4 is dead, and the
    # closers close 1 s after the wake's end, not at the fallback (10 s per rank here: 50 s).
    monkeypatch.setattr(hypergrid.timing, "PER_PARTICIPANT_S", 10.0)
    before = set(server.list_keys())
    started = time.monotonic()
    verdicts, _ = roll_call(server, 13, 5, [0, 1, 2, 3], bound=1.0, late={3: 1.3}, woken_at=1.0)
    assert {verdict.dead for verdict in verdicts.values()} == {(4,)}
    assert time.monotonic() - started < 10.0  # the fallback would be 50 s
    assert added(server, before) == set(world_keys(13))


@pytest.mark.timeout(60)
def test_without_the_end_of_the_wake_the_closers_wait_the_fallback(server: Any) -> None:
    # The caller died before it said everyone is woken: the closers wait `bound_s` from the call (here 1 s for 5
    # ranks), so rank 3 answering 0.8 s after the call is alive.
    verdicts, _ = roll_call(server, 14, 5, [0, 1, 2, 3], bound=1.0, late={3: 0.8})
    assert {verdict.dead for verdict in verdicts.values()} == {(4,)}


@pytest.mark.timeout(60)
def test_a_minority_never_declares_the_others_dead(server: Any) -> None:
    before = set(server.list_keys())
    verdicts, _ = roll_call(server, 2, 8, [5, 6, 7])
    assert {(verdict.kind, verdict.dead, verdict.alive) for verdict in verdicts.values()} == {
        ("minority", (), (5, 6, 7))
    }
    assert all(verdict.excludes(rank) for rank, verdict in verdicts.items())
    assert added(server, before) == set(world_keys(2))  # the minority cleans up after itself


def test_majority_rule() -> None:
    assert majority([0, 1, 2], range(5)) and not majority([3, 4], range(5))
    assert majority([0, 1], range(4)) and not majority([2, 3], range(4))  # a tie goes to the side with rank 0
    assert majority([0], range(2)) and not majority([1], range(2))


@pytest.mark.timeout(60)
def test_a_rank_that_comes_back_after_the_verdict_finds_the_incident_gone(server: Any) -> None:
    verdicts, _ = roll_call(server, 3, 4, [0, 1, 2])
    assert {verdict.dead for verdict in verdicts.values()} == {(3,)}
    late = Incident(client(server), incident_prefix(3, 0), 3, [0, 1, 2, 3])
    assert late.answer() is None  # the live ranks read the verdict and deleted it: rank 3 was left behind


@pytest.mark.timeout(60)
def test_ranks_that_left_are_not_dead_and_do_not_make_a_minority(server: Any) -> None:
    size, world = 6, 4
    for rank in range(size):
        record_member(client(server), world, rank, joined=True)
    for rank in (2, 3, 4, 5):  # their processes ended normally
        record_member(client(server), world, rank, joined=False)
    verdicts, _ = roll_call(server, world, size, [0, 1], joined=False)
    assert {(verdict.kind, verdict.dead) for verdict in verdicts.values()} == {(FAILURE, ())}


@pytest.mark.timeout(60)
def test_the_end_of_a_world_is_read_once_by_each_live_rank_then_gone(server: Any) -> None:
    before = server.num_keys()
    prefix = incident_prefix(5, 2)
    # Written as a survivor's end_world writes it: the call, the live ranks' wake keys, then I/woken.
    text = end_text([3], 4)
    Incident(client(server), prefix, 0, ()).call(END.strip(), text[len(END) :], [0, 1, 2])
    assert server.num_keys() == before + 1 + 1 + 1  # the call, one wake key (ranks 0 to 2: one block), I/woken
    seen = [Incident(client(server), prefix, rank, [0, 1, 2, 3]) for rank in range(4)]
    deadline = time.monotonic() + 10.0
    assert [incident.read_end(incident.answer() or "", deadline) for incident in seen[:3]] == [(3,)] * 3
    assert server.num_keys() == before  # the call, I/woken, the count of reads and every wake key
    assert seen[3].answer() is None  # the rank it names, coming late: gone


@pytest.mark.timeout(60)
def test_no_rank_deletes_its_wake_key_before_the_caller_says_every_rank_is_woken(server: Any) -> None:
    # torch's server writes again the first keys of a multi_set that arrives in parts: a wake key deleted before the
    # caller's I/woken (its last multi_set returned) can come back. So no verdict, and no deletion, before it.
    before, world, size = set(server.list_keys()), 43, 3
    watchers = [Watcher(client(server), client(server), world, rank, size, liveness_s=5.0) for rank in range(size)]
    for watcher in watchers:
        watcher.start()
    caller = Incident(client(server), incident_prefix(world, 0), 0, ())
    caller.store.compare_set(caller.key("call"), "", f"{PROBE} test")
    caller.wake(range(size))  # a caller whose last multi_set is still arriving: no I/woken yet
    time.sleep(1.0)  # every rank answered (the count is complete)
    assert int(server.add(caller.key("count"), 0)) == size
    assert not server.check([caller.key("verdict")])
    assert all(server.check([wake_key(world, 0, rank)]) for rank in range(size))
    caller.store.set(caller.key("woken"), "")
    assert all(watcher._await(0) == Verdict(PROBE, (), "test") for watcher in watchers)
    for watcher in watchers:
        assert watcher.halt(watcher.side, 10.0)
    assert added(server, before) == set(world_keys(world))  # the wake key and the incident's keys gone


@pytest.mark.timeout(60)
def test_an_answer_that_came_after_the_roster_was_read_gives_up_and_publishes_nothing(server: Any) -> None:
    # Rank 3 read the call and answered, but only after the closers read the roster (a thread descheduled for
    # longer than the bound): the others read the verdict naming it and deleted the incident before it waited.
    before, world = set(server.list_keys()), 44
    prefix = incident_prefix(world, 0)
    late = Incident(client(server), prefix, 3, list(range(4)))
    late._order = 4  # (as the answer's count returned: not a closer, so it waits the fallback and its backup)
    verdicts, _ = roll_call(server, world, 4, [0, 1, 2])
    assert {verdict.dead for verdict in verdicts.values()} == {(3,)}
    started = time.monotonic()
    assert late.close(f"{FAILURE} test", started, BOUND) is None  # not a verdict of its own: the call is gone
    assert time.monotonic() - started < BOUND + Timing().backup_s + 2.0
    assert added(server, before) == set(world_keys(world))  # nothing written into the incident the others ended


@pytest.mark.timeout(60)
def test_halt_ends_a_watcher_that_waits_for_a_verdict_at_once_and_fools_no_other_rank(server: Any) -> None:
    # A rank's process ends while its watcher waits for a verdict (rank 2 does not answer; a 30 s bound): the thread
    # must end before the interpreter does, without a verdict, and without ending the other ranks' waits.
    world, size = 45, 3
    fenced: list[int] = []

    def watcher(rank: int) -> Watcher:
        record = lambda _, r=rank: fenced.append(r)  # noqa: E731
        return Watcher(client(server), client(server), world, rank, size, liveness_s=30.0, on_fence=record)

    watchers = [watcher(rank) for rank in range(2)]
    for watcher in watchers:
        watcher.start()
    caller = Incident(client(server), incident_prefix(world, 0), 0, ())
    caller.call(FAILURE, "test", range(size))
    time.sleep(0.5)  # both answered and wait for the verdict
    assert int(server.add(caller.key("count"), 0)) == 2
    started = time.monotonic()
    assert watchers[1].halt(watchers[1].side, 10.0)
    assert time.monotonic() - started < 2.0
    time.sleep(0.3)
    assert not server.check([caller.key("verdict")]) and watchers[0]._thread.is_alive() and not fenced
    assert watchers[0].halt(watchers[0].side, 10.0) and not fenced
    for key in [caller.key(name) for name in liveness.INCIDENT_KEYS] + [wake_key(world, 0, 2)]:
        server.delete_key(key)


@pytest.mark.timeout(60)
def test_get_until_reads_a_key_once_written_gives_up_at_its_deadline_or_when_stopped(server: Any) -> None:
    key, reader, writer = "test/get-until/0", client(server), client(server)
    previous = reader.store.timeout
    threading.Timer(0.3, lambda: writer.set(key, "verdict")).start()
    assert diagnosis.get_until(reader, key, time.monotonic() + 10.0) == b"verdict"
    assert reader.ops == 1 and reader.store.timeout == previous  # one get; the client's timeout restored
    started = time.monotonic()
    assert diagnosis.get_until(reader, key + "-never", started + 0.3) is None
    assert 0.25 < time.monotonic() - started < 5.0 and reader.store.timeout == previous
    # Woken without the key (a read of the absent key wakes every waiter): a stopped one gives up, the other waits on.
    stopped, results = threading.Event(), {}

    def waiter(name: str, stop: Any) -> None:
        results[name] = diagnosis.get_until(client(server), key + "-late", time.monotonic() + 10.0, stop)

    threads = [
        threading.Thread(target=waiter, args=(name, stop)) for name, stop in (("a", stopped.is_set), ("b", None))
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    stopped.set()
    diagnosis.read(writer, key + "-late")
    threads[0].join(5.0)
    assert not threads[0].is_alive() and results == {"a": None}
    writer.set(key + "-late", "later")
    threads[1].join(5.0)
    assert results == {"a": None, "b": b"later"}
    for name in (key, key + "-late"):
        writer.delete_key(name)


def play_barrier(
    server: Any, prefix: str, members: int, arriving: list[int], probe: Any = None, deadline_s: float = 30.0
) -> dict[int, Any]:
    outcomes: dict[int, Any] = {}

    def member(rank: int) -> None:
        store = client(server)
        barrier = Barrier(
            store, prefix, rank, range(members), time.monotonic() + deadline_s, "the test", probe, client(server)
        )
        try:
            barrier.run()
            outcomes[rank] = "ok"
        except BarrierFailed as failed:
            outcomes[rank] = ("failed", tuple(failed.dead))

    threads = [threading.Thread(target=member, args=(rank,)) for rank in arriving]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


@pytest.mark.timeout(60)
def test_a_barrier_passes_when_all_arrive_and_leaves_no_key(server: Any) -> None:
    before = server.num_keys()
    assert set(play_barrier(server, "test/barrier/0", 8, list(range(8))).values()) == {"ok"}
    assert server.num_keys() == before


@pytest.mark.timeout(60)
def test_a_barrier_with_a_dead_member_fails_alike_on_all_and_a_late_one_never_passes(server: Any) -> None:
    outcomes = play_barrier(server, "test/barrier/1", 4, [0, 1, 2], probe=lambda: [3])
    assert set(outcomes.values()) == {("failed", (3,))}
    late = play_barrier(server, "test/barrier/1", 4, [3], deadline_s=0.5)  # resumed: it may not pass alone
    assert late[3][0] == "failed"


class Frozen(Watcher):
    """A watcher whose process was stopped (SIGSTOP) when an incident was called: it handles it 3 s late."""

    def _handle(self, prefix: str) -> bool:
        time.sleep(3.0)
        return super()._handle(prefix)


@pytest.mark.timeout(90)
def test_watchers_agree_on_the_dead_and_fence_the_late(server: Any) -> None:
    """Six watchers: rank 3 joined the watch, then never answers (dead); rank 5 is frozen, answers too late and is
    fenced."""
    size, world = 6, 7
    record_member(client(server), world, 3, joined=True)  # its watcher started, and its process died
    fenced: dict[int, str] = {}

    def watcher(rank: int, kind: type[Watcher] = Watcher) -> Watcher:
        record = lambda why, r=rank: fenced.setdefault(r, why)  # noqa: E731
        return kind(client(server), client(server), world, rank, size, liveness_s=BOUND, on_fence=record)

    watchers = {rank: watcher(rank, Frozen if rank == 5 else Watcher) for rank in range(size)}
    for rank in (0, 1, 2, 4, 5):
        watchers[rank].start()
    verdict = watchers[0].report(FAILURE, "a peer's connection closed")
    assert verdict is not None and verdict.dead == (3, 5)
    time.sleep(0.5)
    assert {watchers[rank].failure.dead for rank in (0, 1, 2, 4)} == {(3, 5)}  # type: ignore[union-attr]
    time.sleep(3.5)  # rank 5 wakes: the incident it missed is over
    assert set(fenced) == {5}
    assert watchers[1].report(PROBE, "a long wait") is not None  # the live ones still agree (no new dead)
    assert watchers[1].dead == [3, 5]
    for live in (0, 1, 2, 4):  # end the world: every thread wakes and ends (none left blocked at exit)
        watchers[live].end_world([3, 5], size)
    for live in (0, 1, 2, 4, 5):
        assert watchers[live].join(5.0)


class _MultiSets:
    """A store that records each ``multi_set``'s key count and each ``set`` in order (``compare_set``: empty)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.writes: list[str] = []

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return desired.encode()

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        self.sizes.append(len(keys))
        self.writes.append("wake")

    def set(self, key: str, value: str) -> None:
        self.writes.append(key.rsplit("/", 1)[-1])

    def check(self, keys: list[str]) -> bool:
        return True


def test_a_call_wakes_many_ranks_in_bounded_multi_sets_then_says_every_rank_is_woken() -> None:
    """torch's server parses one ``multi_set`` in time quadratic in its keys: a call wakes in chunks, one key
    per block of `WAKE_BLOCK` ranks (the last block partial)."""
    store = _MultiSets()
    ranks = range((2 * MULTI_SET_KEYS + 4) * WAKE_BLOCK + 3)
    Incident(store, incident_prefix(0, 0), 0, ranks).call(FAILURE, "x", ranks)
    assert store.sizes == [MULTI_SET_KEYS, MULTI_SET_KEYS, 5]
    assert store.writes == ["wake", "wake", "wake", "woken"]  # the closers' bound runs from the last wake
    assert MULTI_SET_KEYS <= 8192


class _Desynced:
    """A watcher's store whose client fails as a desynced one does ("Stop_waiting response is expected")."""

    def wait(self, keys: list[str], timeout: Any) -> None:
        raise RuntimeError("Stop_waiting response is expected")

    def append(self, key: str, value: str) -> None:  # (joining the watch works: the waits fail)
        pass

    def add(self, key: str, value: int) -> int:
        return 1

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return expected.encode()  # (a read: the key is absent)

    def check(self, keys: list[str]) -> bool:
        return True


@pytest.mark.timeout(60)
def test_a_watcher_that_stops_on_an_unexpected_error_says_so_aloud(caplog: pytest.LogCaptureFixture) -> None:
    # Its rank no longer answers roll calls: the others will name it dead, so the log says why, above debug.
    watcher = Watcher(_Desynced(), _Desynced(), 30, 1, 4).start()
    assert watcher.join(10.0)
    warned = [record for record in caplog.records if record.levelname == "WARNING"]
    assert warned and "Stop_waiting response is expected" in warned[0].getMessage()
    assert "world 30 rank 1" in warned[0].getMessage()


@pytest.mark.timeout(60)
def test_a_rank_that_never_joined_the_watch_is_late_not_dead_and_reads_nothing(server: Any) -> None:
    """Issue 44: a rank still setting up (no grid yet: it never joined) misses a roll call: it is *absent*, never
    dead, and the ranks that answered (the only readers) clean the incident up. A joined rank that does not answer
    is dead as before."""
    size, world = 5, 60
    before = set(server.list_keys())
    for rank in (0, 1, 2, 3):  # rank 4 is late: it never joined
        record_member(client(server), world, rank, joined=True)
    verdicts, _ = roll_call(server, world, size, [0, 1, 2], joined=False)  # rank 3 joined and died
    assert {(verdict.dead, verdict.absent, verdict.readers) for verdict in verdicts.values()} == {((3,), (4,), 3)}
    assert added(server, before) == set(world_keys(world))  # every reader counted: the incident's keys are gone


@pytest.mark.timeout(60)
def test_a_rank_its_launcher_saw_exit_is_dead_without_waiting_for_the_bound(server: Any) -> None:
    """Issue 46: a call that declares a rank gone (a launcher's agent saw its process exit) completes once every
    other rank answered: no wait for the bound (30 s here), every rank reads the same verdict naming it dead."""
    prefix = called(server, 70, 6, f"{FAILURE} {gone_text([4], 'rank 4 died by signal SIGKILL')}")
    started = time.monotonic()
    verdicts, _ = roll_call_answers(server, prefix, 6, [0, 1, 2, 3, 5], bound=30.0)
    assert time.monotonic() - started < 5.0
    assert {(verdict.kind, verdict.dead) for verdict in verdicts.values()} == {(FAILURE, (4,))}


@pytest.mark.timeout(60)
def test_a_death_its_launcher_saw_during_an_open_roll_call_closes_it_without_waiting(server: Any) -> None:
    """The agent's call found another rank's roll call open: it lists the rank in ``I/gone``, and the closers close
    as soon as every other rank answered instead of at the bound (30 s here)."""
    prefix = called(server, 71, 5, f"{FAILURE} a peer's connection closed", gone=[3])
    started = time.monotonic()
    verdicts, _ = roll_call_answers(server, prefix, 5, [0, 1, 2, 4], bound=30.0)
    assert time.monotonic() - started < 10.0
    assert {verdict.dead for verdict in verdicts.values()} == {(3,)}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("listed", [False, True])
def test_the_lowest_rank_its_launcher_saw_die_leaves_no_minority_behind(server: Any, listed: bool) -> None:
    """A world of two whose rank 0 dies: the survivor alone is half, without the lowest rank, which the majority rule
    read as the cut-off side (0.4.0: the live rank 1 fenced itself, and the job hung with its arrivals waiting). A
    rank the agent declared dead that does not answer is on no side: rank 1 goes on, and reads rank 0 dead. The same
    in a world of four that loses ranks 0 and 1 together (two declared, both silent)."""
    for world, size, dead in ((72 + listed, 2, [0]), (74 + listed, 4, [0, 1])):
        said = gone_text(dead, "died by signal SIGKILL")
        prefix = called(server, world, size, f"{FAILURE} {'a wake' if listed else said}", gone=dead if listed else ())
        alive = [rank for rank in range(size) if rank not in dead]
        verdicts, _ = roll_call_answers(server, prefix, size, alive, bound=2.0)
        assert {(verdict.kind, verdict.dead) for verdict in verdicts.values()} == {(FAILURE, tuple(dead))}, verdicts


@pytest.mark.timeout(60)
def test_a_declared_rank_that_answers_still_counts_toward_the_majority(server: Any) -> None:
    """The agent's word alone moves nobody out of the count: a rank declared dead that answers is on the side it
    answered with (an agent cut off from its neighbour by the network declares live workers). Ranks 2 and 3 of four
    are declared; rank 3 answers; rank 0 and 1 stay silent: 2 and 3 are half without rank 0, the cut-off side."""
    prefix = called(server, 76, 4, f"{FAILURE} {gone_text([2, 3], 'died with their agent')}")
    verdicts, _ = roll_call_answers(server, prefix, 4, [2, 3], bound=1.0)
    assert {verdict.kind for verdict in verdicts.values()} == {"minority"}, verdicts


def called(server: Any, world: int, size: int, call: str, gone: Sequence[int] = ()) -> str:
    """Incident 0 of world ``world`` (``size`` ranks, all in its watch) called with ``call``, every rank woken, and
    ``gone`` listed as an agent lists a death during an open roll call; its prefix."""
    caller = client(server)
    for rank in range(size):
        record_member(caller, world, rank, joined=True)
    prefix = incident_prefix(world, 0)
    caller.compare_set(f"{prefix}/call", "", call)
    caller.set(f"{prefix}/woken", "")
    for rank in gone:
        caller.append(f"{prefix}/gone", f"{rank}\n")
    return prefix


def roll_call_answers(
    server: Any, prefix: str, size: int, answering: list[int], bound: float, late: dict[int, float] | None = None
) -> tuple[dict[int, Any], dict[int, int]]:
    """``answering`` ranks answer an incident already called (one thread each, a rank in ``late`` that many
    seconds late); the verdicts they read, and each one's store operations."""
    verdicts: dict[int, Any] = {}
    ops: dict[int, int] = {}
    # Connected here, one at a time: torch's clients opened by threads of one process at once wait 5 s now and then
    # (docs/design/rollcall.md, "Connections opened on the way"), which would make their ranks late.
    stores = {rank: client(server) for rank in answering}

    def rank_side(rank: int) -> None:
        store = stores[rank]
        incident = Incident(store, prefix, rank, list(range(size)))
        time.sleep((late or {}).get(rank, 0.0))
        call = incident.answer()
        verdict = None if call is None else incident.close(call, time.monotonic(), bound)
        if verdict is not None:
            incident.conclude(verdict)
        verdicts[rank], ops[rank] = verdict, store.ops

    threads = [threading.Thread(target=rank_side, args=(rank,)) for rank in answering]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return verdicts, ops
