"""The guard's store protocol in one process: simulated participants on a real TCPStore, one thread each."""

from __future__ import annotations

import datetime
import json
import logging
import pathlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks import guard as bench
from benchmarks.guard import CountingStore
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.protocol import Round, round_keys
from hypergrid.agreement.request import CreationRequest, Verdict, timeout_verdict
from hypergrid.timing import Timing

TIMEOUT = datetime.timedelta(seconds=60)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    yield store


def _clean(server: Any, ranks: int = 64) -> int:
    """Forget every rank's announcement (one key per rank, kept between rounds); the keys left."""
    for rank in range(ranks):
        server.delete_key(announce_key(rank))
    return int(server.num_keys())


def _request(key: str = "tp", **changes: Any) -> CreationRequest:
    return CreationRequest(
        **{"grid": "tp2\u00d7dp4", "keys": (key,), "strategy": "enumerate", "grid_sequence": 0, **changes}
    )


def play(
    server: Any,
    prefix: str,
    requests: dict[int, CreationRequest],
    size: int,
    timeout_s: float = 30.0,
    progress_s: float = 30.0,
    stale: tuple[str, ...] = (),
) -> tuple[dict[int, Verdict], dict[int, int]]:
    """One round: each rank in ``requests`` on its own thread and store connection; the others never come."""
    verdicts: dict[int, Verdict] = {}
    ops: dict[int, int] = {}

    def participant(rank: int) -> None:
        store = CountingStore(TCPStore("127.0.0.1", server.port, is_master=False, timeout=TIMEOUT))
        side = Round(store, prefix, rank, range(size), requests[rank], timeout_s, progress_s, stale)
        verdicts[rank] = side.run()
        ops[rank] = store.ops

    threads = [threading.Thread(target=participant, args=(rank,)) for rank in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return verdicts, ops


@pytest.mark.timeout(120)
def test_agreement_costs_4_operations_per_rank_and_leaves_the_roster_and_verdict_for_the_commit(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The success path only, however loaded the host: no probe, and no announcement (at half the probe time,
    # which is at most a quarter of timeout_s: 3.75 s with the default 30 s, once passed by 16 threads at load 5).
    monkeypatch.setattr(Timing, "round_probe_s", lambda self, participants: 3600.0)
    baseline = _clean(server)
    for size in (2, 5, 16):
        requests = {rank: _request() for rank in range(size)}
        verdicts, ops = play(server, f"t/agree/{size}", requests, size, timeout_s=14400.0)
        assert {verdict.kind for verdict in verdicts.values()} == {"ok"}
        # Count and roster; the decider publishes and deletes the count, the others wait and read: 4 each,
        # and no announcement (a round that ends in time needs none).
        assert sorted(ops.values()) == [4] * size, ops
        left = [key for key in round_keys(f"t/agree/{size}") if server.check([key])]
        assert left == [f"t/agree/{size}/roster", f"t/agree/{size}/verdict"]  # the commit's members delete them
        for key in left:
            server.delete_key(key)
        assert server.num_keys() == baseline


@pytest.mark.timeout(120)
def test_a_mismatch_names_every_request_and_its_ranks_on_every_rank(server: Any) -> None:
    baseline = _clean(server)
    requests = {rank: _request("dp" if rank in (3, 9) else "tp") for rank in range(12)}
    verdicts, _ = play(server, "t/mismatch", requests, 12)
    messages = {verdict.message for verdict in verdicts.values()}
    assert len(messages) == 1 and {verdict.kind for verdict in verdicts.values()} == {"mismatch"}
    message = messages.pop()
    assert "rank(s) 0-2,4-8,10-11 asked for create_pg('tp') on grid tp2\u00d7dp4" in message
    assert "rank(s) 3,9 asked for create_pg('dp')" in message
    assert "They differ in: keys." in message
    # The failed round keeps its roster and verdict for the next completed round of its scope or destroy(). When
    # it is found depends on the host's load: at the first participants' probe (no count reached 12, by then every
    # rank had announced where it waits), or at the count (all 12 came before the probe, few or none announced).
    # Whichever it was, the keys left are the roster, the verdict and announcements of the round's own ranks.
    left = [key for key in round_keys("t/mismatch") if server.check([key])]
    assert left == ["t/mismatch/roster", "t/mismatch/verdict"]
    announced = [rank for rank in range(64) if server.check([announce_key(rank)])]
    assert set(announced) <= set(range(12)), announced
    assert server.num_keys() == baseline + len(announced) + 2


@pytest.mark.timeout(120)
def test_long_lists_are_cut_after_20_runs_and_20_requests(server: Any) -> None:
    _clean(server)  # no rank was last seen in an earlier test's round about the same request
    size = 60  # the even ranks agree; every odd rank asks for its own creation number
    requests = {rank: _request(grid_sequence=rank % 2 * rank) for rank in range(size)}
    verdicts, _ = play(server, "t/long", requests, size)
    message = verdicts[0].message
    assert "rank(s) 0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,34,36,38 ... and 10 more asked" in message
    assert "... and 11 more distinct requests" in message  # 31 requests
    assert "ranks are out of step" in message and "They differ in: grid_sequence." in message
    with pytest.raises(Exception, match="ranks are out of step") as error:
        verdicts[7].raise_if_failed()
    assert sorted(r for ranks in error.value.requests.values() for r in ranks) == list(range(size))  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_a_missing_rank_is_named_then_cleaned_up_by_the_next_round(
    server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    baseline = _clean(server)
    caplog.set_level(logging.WARNING, logger="hypergrid")
    requests = {rank: _request() for rank in (0, 1, 3)}
    verdicts, _ = play(server, "t/missing/0", requests, 4, timeout_s=1.0, progress_s=0.2)
    assert {verdict.kind for verdict in verdicts.values()} == {"timeout"}
    assert {verdict.message for verdict in verdicts.values()} == {
        "rank(s) 2 of the 4 ranks that must create create_pg('tp') on grid tp2\u00d7dp4 did not arrive within 1 s: "
        "dead, hung, or creating something else (3 arrived)"
    }
    lines = [record.getMessage() for record in caplog.records if record.name == "hypergrid"]
    assert any(line.endswith("3/4 ranks arrived; missing 2 (timeout 1 s)") for line in lines), lines
    assert any(line.endswith("3/4 ranks arrived (timeout 1 s)") for line in lines), lines  # the others count only
    # The late rank gets the same verdict.
    late, _ = play(server, "t/missing/0", {2: _request()}, 4, timeout_s=1.0)
    assert late[2] == verdicts[0]
    # A failed round keeps its roster, verdict and roll call for the next completed round of the scope (or
    # destroy()); each participant deleted its count, and announced where it waited.
    left = [key for key in round_keys("t/missing/0") if server.check([key])]
    assert left == ["t/missing/0/roster", "t/missing/0/verdict", "t/missing/0/alive"]
    assert server.num_keys() == baseline + len(left) + 3  # and the announcements of the ranks that waited
    # The next completed round of the same scope deletes them.
    everyone = {rank: _request() for rank in range(4)}
    verdicts, _ = play(server, "t/missing/1", everyone, 4, stale=("t/missing/0",))
    assert {verdict.kind for verdict in verdicts.values()} == {"ok"}
    # The announcements (the three that waited; rank 2's too if this round was slow enough to announce under
    # load), this round's roster and verdict.
    announced = {rank for rank in range(64) if server.check([announce_key(rank)])}
    assert {0, 1, 3} <= announced <= {0, 1, 2, 3}, announced
    assert server.num_keys() == baseline + len(announced) + 2


@pytest.mark.timeout(120)
def test_the_simulation_counts_operations_the_same_at_1024_and_2048(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No slow-path announcement, however loaded the host.
    monkeypatch.setattr(Timing, "round_probe_s", lambda self, participants: 3600.0)
    path = tmp_path / "guard.json"
    assert bench.main(["--participants", "1024,2048", "--threads", "4", "--repeats", "1", "--json", str(path)]) == 0
    rows = {(row["impl"], row["participants"]): row for row in json.loads(path.read_text())["rows"]}
    assert set(rows) == {(impl, size) for impl in bench.IMPLS for size in (1024, 2048)}
    for size in (1024, 2048):
        ours, theirs = rows["hypergrid", size], rows["leader-reads-all", size]
        assert ours["store_ops_busiest_rank"] == 4  # count, roster, then wait and read (or publish and delete)
        assert ours["store_ops_total"] == 4 * size
        assert theirs["store_ops_busiest_rank"] == size + 4  # the leader: write, wait, multi_get, N deletes, verdict
        assert theirs["store_ops_total"] == 5 * size + 2
        assert ours["seconds"] > 0 and theirs["seconds"] > 0


@pytest.mark.parametrize("argv", [["--participants", "1,8"], ["--participants", "x"], ["--threads", "0"]])
def test_guard_benchmark_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2


def test_a_timeout_names_missing_spares_as_spares_and_says_they_create_too() -> None:
    """Issue 54: spares that skipped ``create_pgs`` were named only by number, after 300 s."""
    request = CreationRequest("tp2 dp2", ("dp",), "enumerate", 0, settings=(("spares", "2"),))
    said = timeout_verdict(request, 6, [4, 5], 3.0).message
    assert "rank(s) 4-5 are the grid's spares" in said and "spares included, creates every family" in said, said
    assert "spares" not in timeout_verdict(request, 6, [3], 3.0).message.split("did not arrive")[1]  # not a spare
    local = CreationRequest("tp2 dp2", ("dp",), "local", 0, settings=(("spares", "2"),))
    assert "grid's spares" not in timeout_verdict(local, 2, [1], 3.0).message  # a group's members, no spare
