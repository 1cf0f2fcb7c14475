"""Stack dumps: a torchrun-style process found hung through ``HYPERGRID_STACK_DIR``, and the frames a report keeps."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from benchmarks.common import free_port
from hypergrid.launch import STACK_DIR_ENV, read_stack_dumps
from hypergrid.launch.stacks import cut_frames

ROOT = pathlib.Path(__file__).resolve().parents[2]
HUNG = """
import time
from hypergrid import init_from_env
init_from_env()
print("ready", flush=True)
time.sleep(120)  # the line this rank hangs on
"""


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_torchrun_rank_with_the_env_variable_says_where_it_hangs(tmp_path: pathlib.Path) -> None:
    env = {
        **os.environ,
        STACK_DIR_ENV: str(tmp_path),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "CUDA_VISIBLE_DEVICES": "",
    }
    script = tmp_path / "train.py"
    script.write_text(HUNG)
    process = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        for _ in range(2):  # asked twice: the file holds two dumps, the report shows one
            os.kill(process.pid, signal.SIGUSR1)
            time.sleep(0.5)
        deadline = time.monotonic() + 30
        while "in <module>" not in read_stack_dumps(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        report = read_stack_dumps(tmp_path)
    finally:
        process.kill()
        process.wait()
    assert report.splitlines()[0] == "rank 0 is at:", report
    assert f'File "{script}", line 6, in <module>' in report
    assert report.count("time.sleep(120)  # the line this rank hangs on") == 1, report
    assert (tmp_path / "rank0.stack").read_text().count("in <module>") == 2


DUMP = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/usr/lib/python3.11/multiprocessing/queues.py", line 231 in _feed

Current thread 0x00007f0000000002 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2753 in send
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1789 in _call_impl
  File "/home/me/model.py", line 40 in forward
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1789 in _call_impl
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1778 in _wrapped_call_impl
  File "/home/me/train.py", line 12 in step
  File "/src/hypergrid/launch/processes.py", line 133 in _worker
  File "/usr/lib/python3.11/multiprocessing/process.py", line 108 in run
"""


def test_a_report_keeps_the_users_frames_their_calls_and_the_innermost() -> None:
    assert cut_frames(DUMP) == [
        '  File "/home/me/train.py", line 12, in step',
        '  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1778, in _wrapped_call_impl',
        "  (1 library frame left out)",
        '  File "/home/me/model.py", line 40, in forward',
        '  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1789, in _call_impl',
        "  (1 library frame left out)",
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2753, in send',
    ]


def test_of_several_dumps_in_one_file_the_last_is_read() -> None:
    earlier = DUMP.replace("line 12 in step", "line 11 in step").replace("line 40 in forward", "line 39 in forward")
    assert cut_frames(earlier + DUMP) == cut_frames(DUMP)
    assert cut_frames(DUMP + earlier) == cut_frames(earlier) != cut_frames(DUMP)


def test_a_dump_without_frames_or_a_missing_rank_is_said_plainly(tmp_path: pathlib.Path) -> None:
    assert cut_frames("") == []
    assert read_stack_dumps(tmp_path, [2]) == f"rank 2: no Python stack came back (no dump in {tmp_path}/rank2.stack)"
