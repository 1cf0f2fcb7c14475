"""What the workers of ``hypergrid.run`` tell their agent, without processes: the ledger of shrinks, the error file.

Worlds are played on an in-memory store as the survivors' rank 0 writes
them at the end of each shrink: the agent must find, in the launcher's own
ranks, exactly the workers that shrinks excluded, however the ranks moved.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest
import torch.distributed as dist

from hypergrid.launch.ledger import LEDGER_ENV, parse_ranks, raised, read_shrunk, record_shrink

pytestmark = pytest.mark.timeout(120)
LEDGER = "hypergrid/run/ledger/test/"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv(LEDGER_ENV, LEDGER)
    return dist.PrefixStore("default_pg", dist.HashStore())  # a worker's store: the ledger is on the raw one


def test_deaths_are_named_in_the_launchers_ranks_however_the_ranks_moved(store: Any) -> None:
    # world 0: launcher ranks 0..5; rank 3 dies, drop: 0 1 2 4 5 -> 0 1 2 3 4
    assert record_shrink(0, 1, 0, {0: 0, 1: 1, 2: 2, 4: 3, 5: 4}, [3], store)
    # world 1: its rank 3 (launcher 4) dies; a spare-like move: 0 1 2 4 -> 0 2 1 3
    assert record_shrink(1, 2, 0, {0: 0, 1: 2, 2: 1, 4: 3}, [3], store)
    # world 2: its rank 1 is world 1's rank 2, the launcher's rank 2
    assert record_shrink(2, 3, 0, {0: 0, 2: 1, 3: 2}, [1], store)
    assert parse_ranks(read_shrunk(store, LEDGER)) == {3, 4, 2}
    raw = store.underlying_store
    assert raw.get(LEDGER + "world/3") == b"0,1,5"


def test_only_the_new_worlds_rank_0_writes(store: Any) -> None:
    for rank in (1, 2, None):
        assert not record_shrink(0, 1, rank, {0: 0, 1: 1, 2: 2}, [3], store)
    assert read_shrunk(store, LEDGER) == ""


def test_outside_hypergrid_run_nothing_is_written(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LEDGER_ENV)
    assert not record_shrink(0, 1, 0, {0: 0, 1: 1}, [2], store)
    assert read_shrunk(store, LEDGER) == ""


def test_a_world_whose_table_is_missing_accounts_for_nobody(store: Any) -> None:
    """Its rank 0 died before writing: the deaths of that world stay unaccounted (the run fails, not the shrink)."""
    assert not record_shrink(4, 5, 0, {0: 0, 1: 1}, [2], store)
    assert read_shrunk(store, LEDGER) == ""


def test_a_store_that_fails_never_fails_the_shrink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEDGER_ENV, LEDGER)

    class Broken:
        def check(self, keys: list[str]) -> bool:
            raise ConnectionError("store gone")

        def append(self, key: str, value: str) -> None:
            raise ConnectionError("store gone")

    assert not record_shrink(0, 1, 0, {0: 0}, [1], Broken())
    assert not record_shrink(1, 2, 0, {0: 0}, [1], Broken())


def _raise_in_a_worker(error_file: pathlib.Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {"TORCHELASTIC_ERROR_FILE": str(error_file), "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
    setup = "from hypergrid.launch.ledger import record_uncaught_exceptions as r; r(); r(); "
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
