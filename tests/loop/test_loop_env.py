"""The docs' quick start under a plain ``env://`` launch (six processes, rank 0 hosting the store, as a user's own
launcher or ``mp.spawn`` with ``env://`` does): a death is absorbed, and rank 0's death ends every process with one
``StoreLostError`` line and no torch warning (issue 54: the same script under every launcher)."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.loop.test_loop_launch import _quick_start

pytestmark = [pytest.mark.processes, pytest.mark.timeout(200)]


def _launch(script: pathlib.Path, victim: int) -> tuple[list[int], list[str], list[str]]:
    """Start 6 ranks; SIGKILL ``victim`` once rank 0 prints step 5; every rank's exit code, stdout and stderr."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = []
    for rank in range(6):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
               "WORLD_SIZE": "6", "LOCAL_RANK": str(rank)}  # fmt: skip
        processes.append(subprocess.Popen([sys.executable, str(script)], env=env, cwd=script.parent,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))  # fmt: skip
    outs, errs = [""] * 6, [""] * 6

    def read(rank: int) -> None:
        lines = []
        for line in processes[rank].stdout or []:
            lines.append(line)
            if rank == 0 and line.startswith("step 5:"):
                processes[victim].send_signal(signal.SIGKILL)
        outs[rank] = "".join(lines)

    def read_errors(rank: int) -> None:
        stream = processes[rank].stderr
        assert stream is not None
        errs[rank] = stream.read()

    readers = [threading.Thread(target=read, args=(r,)) for r in range(6)]
    readers += [threading.Thread(target=read_errors, args=(r,)) for r in range(6)]
    for reader in readers:
        reader.start()
    try:
        codes = [process.wait(timeout=150) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for reader in readers:
        reader.join(10)
    return codes, outs, errs


def test_a_death_is_absorbed(tmp_path: pathlib.Path) -> None:
    codes, outs, errs = _launch(_quick_start(tmp_path), 2)
    assert codes == [0, 0, -9, 0, 0, 0], (codes, [err.splitlines()[-2:] for err in errs])
    finished = [out for out in outs if "replicas equal: True" in out]
    assert len(finished) == 4 and "rank 4: dead [2]; resuming at step" in outs[4], outs
    assert "released" in outs[5] and not any("[W" in err or "Traceback" in err for err in errs), errs


def test_rank_0_hosting_the_store_dies_and_every_process_says_so_in_one_line(tmp_path: pathlib.Path) -> None:
    codes, _, errs = _launch(_quick_start(tmp_path), 0)
    assert codes == [-9, 1, 1, 1, 1, 1], (codes, [err.splitlines()[-2:] for err in errs])
    for err in errs[1:]:  # the grid's ranks and the spares in standby alike
        assert err.count("hypergrid.errors.StoreLostError:") == 1 and "the job's store is gone" in err, err
        assert "[W" not in err and "frame #" not in err, err
