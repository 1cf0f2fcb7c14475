"""The torchrun (env://) paths, run for real on CPU: the demo and the all_reduce benchmark under torchrun."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

from hypergrid import BackendError, init_from_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]


def _torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", *args]
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)


def test_demo_under_torchrun_uses_env_and_checks_every_family() -> None:
    done = _torchrun("-m", "hypergrid", "demo", "--shape", "2,2", "--dims", "tp,dp")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 of 3 families correct" in done.stdout
    assert done.stdout.count("grid [2, 2]") == 1  # only rank 0 reports


def test_allreduce_benchmark_under_torchrun(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "rows.json"
    done = _torchrun(
        "benchmarks/allreduce.py", "--shape", "2,2", "--dims", "tp,dp", "--minbytes", "1K", "--maxbytes", "1K",
        "--iters", "2", "--warmup", "1", "--quiet", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "# total #wrong: 0" in done.stdout and out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: NCCL is allowed")
def test_nccl_without_cuda_is_refused_clearly() -> None:
    with pytest.raises(BackendError, match="needs CUDA"):
        init_from_env("nccl")
