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
from hypergrid.agreement import protocol
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.protocol import Round, round_keys
from hypergrid.agreement.request import CreationRequest, Verdict

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
def test_agreement_costs_at_most_10_operations_per_rank_and_leaves_only_announcements(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "PROBE_S", 3600.0)  # the success path only, however loaded the host
    baseline = _clean(server)
    for size in (2, 5, 16):
        verdicts, ops = play(server, f"t/agree/{size}", {rank: _request() for rank in range(size)}, size)
        assert {verdict.kind for verdict in verdicts.values()} == {"ok"}
        # 4 to announce and arrive; the decider writes the verdict and deletes 2 keys; the others wait, read
        # the verdict and count themselves done, and the last of them deletes 3 keys.
        assert sorted(ops.values()) == [7] * (size - 1) + [10], ops
        assert server.num_keys() == baseline + size  # each rank's announcement, overwritten by its next round


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
    assert server.num_keys() == baseline + 12  # announcements only


@pytest.mark.timeout(120)
def test_long_lists_are_cut_after_20_runs_and_20_requests(server: Any) -> None:
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
    # Everyone read the verdict (the late rank last, which deleted the counter, verdict and roll call); the
    # roster stays for the next round of the scope.
    left = [key for key in round_keys("t/missing/0") if server.check([key])]
    assert left == ["t/missing/0/roster"]
    assert server.num_keys() == baseline + len(left) + 4  # and the announcements
    # The next completed round of the same scope deletes them.
    everyone = {rank: _request() for rank in range(4)}
    verdicts, _ = play(server, "t/missing/1", everyone, 4, stale=("t/missing/0",))
    assert {verdict.kind for verdict in verdicts.values()} == {"ok"}
    assert server.num_keys() == baseline + 4


@pytest.mark.timeout(120)
def test_the_simulation_counts_operations_the_same_at_1024_and_2048(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "guard.json"
    assert bench.main(["--participants", "1024,2048", "--threads", "4", "--repeats", "1", "--json", str(path)]) == 0
    rows = {(row["impl"], row["participants"]): row for row in json.loads(path.read_text())["rows"]}
    assert set(rows) == {(impl, size) for impl in bench.IMPLS for size in (1024, 2048)}
    for size in (1024, 2048):
        ours, theirs = rows["hypergrid", size], rows["leader-reads-all", size]
        assert ours["store_ops_busiest_rank"] == 10
        assert ours["store_ops_total"] == 7 * size + 3  # 7 each; the last reader 3 more
        assert theirs["store_ops_busiest_rank"] == size + 4  # the leader: write, wait, multi_get, N deletes, verdict
        assert theirs["store_ops_total"] == 5 * size + 2
        assert ours["seconds"] > 0 and theirs["seconds"] > 0


@pytest.mark.parametrize("argv", [["--participants", "1,8"], ["--participants", "x"], ["--threads", "0"]])
def test_guard_benchmark_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert exit_info.value.code == 2
