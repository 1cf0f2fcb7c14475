"""torch's C++ log quieted in a running process (`hypergrid.binding.cpplog.quiet_cpp_log`): a real TCPStore whose
server dies under a client, in a child process, its stderr read whole."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hypergrid.binding.cpplog import LEVEL_ENV

CHILD = r"""
import datetime, subprocess, sys, time
import torch.distributed as dist
from hypergrid.binding.cpplog import quiet_cpp_log
server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
client = dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=datetime.timedelta(seconds=10))
client.set("a", "1")
if sys.argv[1] == "quiet":
    print("quieted", quiet_cpp_log(), file=sys.stderr)
del server  # the server's end closes under the client
try:
    client.get("a")
except Exception as error:
    print("raised", type(error).__name__, file=sys.stderr)
"""


def _child(mode: str, **env: str) -> str:
    environ = {key: value for key, value in os.environ.items() if key != LEVEL_ENV} | env
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, env=environ, check=True
    )
    return done.stderr


@pytest.mark.timeout(300)
def test_a_lost_store_logs_its_cpp_frames_until_quieted_and_a_level_the_user_set_stands() -> None:
    plain, quiet = _child("plain"), _child("quiet")
    assert "raised DistNetworkError" in plain and "raised DistNetworkError" in quiet, (plain, quiet)
    assert "frame #" in plain and "[W" in plain, plain  # torch's own warning, its C++ stack with it
    assert "quieted True" in quiet and "frame #" not in quiet and "[W" not in quiet, quiet
    chosen = _child("quiet", **{LEVEL_ENV: "WARNING"})
    assert "quieted False" in chosen and "frame #" in chosen, chosen
