"""A job in which nothing fails ends with every rank's exit code 0, under every way users launch one (issue 30).

Before the world object (`hypergrid.agreement.world`) every process that used a
grid under ``env://`` with rank 0 hosting the store ended by SIGABRT: the
watcher thread, still blocked in the store, woke while the interpreter
finalized. Each test checks every rank's exit code and the hypergrid threads
left after ``destroy_process_group()``.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch.multiprocessing as mp

from benchmarks.common import free_port
from hypergrid import spawn
from tests.workers import clean_exit

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]
WORLD = 3


def _reports(out: pathlib.Path, world: int = WORLD) -> list[dict[str, object]]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(world)]


def _check(out: pathlib.Path, destroyed: bool, world: int = WORLD) -> None:
    for report in _reports(out, world):
        assert report["sum"] == world
        if destroyed:
            assert report["hypergrid_threads"] == [], report


@pytest.mark.parametrize("destroy", [True, False], ids=["destroy", "no-destroy"])
@pytest.mark.parametrize("last", [0, WORLD - 1], ids=["store-host-last", "store-host-first"])
@pytest.mark.parametrize("owned", [False, True], ids=["env", "user-store"])
def test_multiprocessing_env_with_rank0_hosting_the_store(
    tmp_path: pathlib.Path, destroy: bool, last: int, owned: bool
) -> None:
    context = mp.get_context("spawn")
    port = free_port()
    processes = [
        context.Process(target=clean_exit.run_env_rank, args=(rank, WORLD, port, str(tmp_path), destroy, last, owned))
        for rank in range(WORLD)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    codes = [process.exitcode for process in processes]
    for process in processes:
        if process.exitcode is None:
            process.kill()
    assert codes == [0] * WORLD, codes
    _check(tmp_path, destroy)


def _environment() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize(
    "launcher",
    [["torch.distributed.run", "--standalone"], ["hypergrid.run", "--standalone"]],
    ids=["torchrun", "hypergrid.run"],
)
def test_launchers_report_every_worker_exits_zero(tmp_path: pathlib.Path, launcher: list[str]) -> None:
    command = [sys.executable, "-m", *launcher, "--nproc-per-node", str(WORLD), "-m", "tests.workers.clean_exit"]
    done = subprocess.run(
        [*command, "--out", str(tmp_path), "--destroy"],
        cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr and "SIGABRT" not in done.stderr, done.stderr[-3000:]
    _check(tmp_path, destroyed=True)


def test_hypergrid_spawn_leaves_no_thread_after_destroy_process_group() -> None:
    for report in spawn(clean_exit.spawned, WORLD, timeout_s=120):
        assert report == {"sum": WORLD, "hypergrid_threads": []}


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="counts connections from /proc/net/tcp (Linux)")
def test_store_connections_per_rank_are_torchs_own_plus_one() -> None:
    """Counted on the store's side: each rank's own connection (torch's) and its watcher's; the parent's one."""
    world = 4
    reports = spawn(clean_exit.store_connections, world, (3,), timeout_s=120)
    assert {report["connections"] for report in reports} <= set(range(world + 1, 2 * world + 2)), reports
