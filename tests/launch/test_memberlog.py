"""The round's membership log of ``hypergrid.run`` (`hypergrid.launch.memberlog`), without the launcher: entries
written once on a real store, worlds recorded as the survivors' ranks 0 and 1 record them at the end of each shrink,
and what the agents derive from the log alone (who each rank is, which deaths a shrink accounted for); the workers'
error file.

Each world is played as the survivors' shrink writes it: the agent must find, by member, exactly the processes that
shrinks excluded, however the ranks moved, whoever arrived, and whichever of the two writers died.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import threading

import pytest
import torch.distributed as dist

from hypergrid.launch.errorfile import raised
from hypergrid.launch.memberlog import (
    MEMBER_ENV,
    MemberLog,
    accounted,
    member_id,
    members_of,
    pin_member,
    record_world,
    world_of,
)
from hypergrid.launch.outcomes import WorkerOutcome

pytestmark = pytest.mark.timeout(120)
PREFIX = "hypergrid/run/log/test/"


@pytest.fixture
def log() -> MemberLog:
    return MemberLog(dist.PrefixStore("default_pg", dist.HashStore()), PREFIX)  # (a worker's store: raw under it)


def shrink(log: MemberLog, size: int, old: int, old_to_new: dict[int, int], dead: list[int],
           arrivals: dict[int, int] | None = None, writers: tuple[int, ...] = (0, 1)) -> list[int | None]:  # fmt: skip
    """What the new world's ranks write at the end of a shrink (each rank of ``writers`` with a log of its own)."""
    return [
        record_world(MemberLog(log.store, log.prefix), size, old, old + 1, rank, old_to_new, dead, arrivals or {})
        for rank in writers
    ]


def test_deaths_are_named_by_member_however_the_ranks_moved(log: MemberLog) -> None:
    # world 0: members 0..5; rank 3 dies, drop: 0 1 2 4 5 -> 0 1 2 3 4
    assert shrink(log, 6, 0, {0: 0, 1: 1, 2: 2, 4: 3, 5: 4}, [3]) == [0, 0]  # two writers, one entry
    # world 1: its rank 3 (member 4) dies; a spare-like move: 0 1 2 4 -> 0 2 1 3
    shrink(log, 6, 1, {0: 0, 1: 2, 2: 1, 4: 3}, [3])
    # world 2: its rank 1 is world 1's rank 2, member 2
    shrink(log, 6, 2, {0: 0, 2: 1, 3: 2}, [1])
    entries = log.entries()
    assert [entry.kind for entry in entries] == ["formed"] * 3
    assert accounted(entries) == {"3", "4", "2"}
    assert world_of(entries, 6) == (3, ["0", "1", "5"])


def test_a_growth_names_its_arrivals_and_a_later_death_is_accounted_for(log: MemberLog) -> None:
    """The fault of 0.4.0: the new rank 0 read an arrival's launcher rank from a key the arrival had deleted, the
    world's table went missing, and every later death of the job was reported unaccounted (exit 1)."""
    shrink(log, 4, 0, {0: 0, 1: 1, 2: 2}, [3])  # member 3 dies; drop to 3 ranks (one retired in a real tp2 grid)
    log.append("arrived", arrival=0, member="3.1", pid=1)  # its replacement arrives
    log.append("arrived", arrival=1, member="a1", pid=2)  # and a process from outside the launcher
    shrink(log, 4, 1, {0: 0, 1: 1, 2: 2, 3: 3, 4: 4}, [], arrivals={3: 0, 4: 1})  # the grid grows back
    assert world_of(log.entries(), 4) == (2, ["0", "1", "2", "3.1", "a1"])
    shrink(log, 4, 2, {1: 0, 2: 1, 3: 2, 4: 3}, [0])  # then an original dies: member 0
    shrink(log, 4, 3, {0: 0, 1: 1, 3: 2}, [2])  # and the replacement: member 3.1
    assert accounted(log.entries()) == {"3", "0", "3.1"}
    assert world_of(log.entries(), 4) == (4, ["1", "2", "a1"])


def test_an_arrival_that_dies_while_it_joins_is_accounted_for(log: MemberLog) -> None:
    """A growth takes two arrivals in (the replacement of member 3, and member 2 that the first shrink retired);
    member 2 dies while the world forms, and the plan's next attempt goes on without it. 0.4.0's accounting, and
    this log's first version, listed only the old world's dead: the job recovered and the launcher exited 1."""
    shrink(log, 4, 0, {0: 0, 1: 1}, [3])  # tp2 x dp2 -> tp2 x dp1: member 3 dead, member 2 retired
    log.append("arrived", arrival=0, member="3.1", pid=1)
    log.append("arrived", arrival=1, member="2", pid=2)
    assert shrink(log, 4, 1, {0: 0, 1: 1}, [3], arrivals={2: 0, 3: 1}) == [3, 3]  # old rank 3: arrival 1
    assert accounted(log.entries()) == {"3", "2"}
    assert world_of(log.entries(), 4) == (2, ["0", "1"])


def test_a_replacement_is_accounted_for_by_its_own_member_not_its_launcher_rank() -> None:
    """0.4.0 matched a replacement by launcher rank: its death after the finish line read as "shrunk away" whenever
    an earlier worker of that rank had been."""
    shrunk = {"3"}
    original, replacement = WorkerOutcome(3, 3, 10, -9), WorkerOutcome(3, 3, 11, -9, replacement=1)
    assert original.member in shrunk and replacement.member not in shrunk
    assert members_of([3], 2) == ["3", "3.1", "3.2"]


def test_one_writer_suffices_and_a_missing_world_accounts_for_nobody(log: MemberLog) -> None:
    assert shrink(log, 4, 0, {0: 0, 1: 1, 2: 2}, [3], writers=(1,)) == [0]  # rank 0 died before writing
    assert shrink(log, 4, 1, {0: 0, 1: 1}, [2], writers=(2, 3)) == [None, None]  # only ranks 0 and 1 write
    assert shrink(log, 4, 5, {0: 0}, [1]) == [None, None]  # world 5 was never recorded: nothing to map its ranks by
    assert accounted(log.entries()) == {"3"}


def test_outside_hypergrid_run_or_on_a_failing_store_nothing_is_written(log: MemberLog) -> None:
    assert record_world(None, 4, 0, 1, 0, {0: 0}, [1], {}) is None

    class Broken:
        def check(self, keys: list[str]) -> bool:
            raise ConnectionError("store gone")

    assert record_world(MemberLog(Broken(), PREFIX), 4, 0, 1, 0, {0: 0}, [1], {}) is None


def test_racing_appenders_on_a_real_store_each_write_once_with_no_hole() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
    port, got, errors = store.port, [], []

    def append(writer: int) -> None:
        try:
            client = dist.TCPStore("127.0.0.1", port, is_master=False)  # type: ignore[attr-defined]
            mine = MemberLog(client, PREFIX)
            for number in range(10):
                got.append((mine.append("dead", members=[f"{writer}.{number}"], said="", by=str(writer)), writer))
        except Exception as error:  # (reported below)
            errors.append(error)

    threads = [threading.Thread(target=append, args=(writer,)) for writer in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    entries = MemberLog(store, PREFIX).entries()
    assert sorted(seq for seq, _ in got) == list(range(60)) == [entry.seq for entry in entries]
    assert sorted(entry.data["members"][0] for entry in entries) == sorted(
        f"{w}.{n}" for w in range(6) for n in range(10)
    )
    for seq, writer in got:
        assert entries[seq].data["by"] == str(writer)


def test_a_process_keeps_its_member_when_a_shrink_renumbers_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.4.0 read the launcher's rank from ``RANK``, which every re-formation overwrites: a renumbered process
    claimed another's rank, and the agent fenced a live one."""
    monkeypatch.setenv("HYPERGRID_RUN_LOG", PREFIX)
    monkeypatch.delenv(MEMBER_ENV, raising=False)
    monkeypatch.setenv("RANK", "5")
    assert pin_member() == "5"
    monkeypatch.setenv("RANK", "2")  # (binding.reform: pin_member, then the new world's rank)
    assert member_id(7) == "5"
    monkeypatch.delenv(MEMBER_ENV)
    monkeypatch.delenv("RANK")
    assert member_id(7) == "a7"  # an arrival from outside the launcher


def _raise_in_a_worker(error_file: pathlib.Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {"TORCHELASTIC_ERROR_FILE": str(error_file), "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    setup = "from hypergrid.launch.errorfile import record_uncaught_exceptions as r; r(); r(); "
    return subprocess.run([sys.executable, "-c", setup + code], env=env, capture_output=True, text=True, timeout=100)


def test_an_uncaught_exception_is_written_for_the_agent(tmp_path: pathlib.Path) -> None:
    error_file = tmp_path / "error.json"
    done = _raise_in_a_worker(error_file, "raise ValueError('bad value 7\\nsecond line')")
    assert done.returncode == 1 and "Traceback" in done.stderr  # printed as before, once
    assert done.stderr.count("Traceback") == 1
    assert raised(str(error_file)) == "ValueError: bad value 7"
    data = json.loads(error_file.read_text())
    assert data["message"]["extraInfo"]["py_callstack"].startswith("Traceback (most recent call last)")


def test_an_error_file_already_written_is_kept(tmp_path: pathlib.Path) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": "RuntimeError: from @record", "extraInfo": {}}}))
    _raise_in_a_worker(error_file, "raise ValueError('later')")
    assert raised(str(error_file)) == "RuntimeError: from @record"


@pytest.mark.parametrize("content", ["", "not json", "[1, 2]", '{"message": 3}', '{"message": {"message": " "}}'])
def test_an_error_file_that_says_nothing_gives_nothing(tmp_path: pathlib.Path, content: str) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text(content)
    assert raised(str(error_file)) is None
