"""``make gpu-check`` planned on the CPU for 0, 1, 2 and 8 GPUs, so that the script does not rot before a GPU runs it.

Every step a plan runs must be launchable as written: its script exists, torchrun
gets one process per GPU, and its arguments are accepted by the parser of the
script that will read them (benchmarks/allreduce.py's own checks included).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from benchmarks import allreduce, detection, gpu_workers
from benchmarks.gpu_check import ROOT, plan_steps

pytestmark = pytest.mark.timeout(120)


def _script_and_args(argv: tuple[str, ...]) -> tuple[str, list[str], int | None]:
    """The script a step runs, its arguments, and torchrun's processes per node (None without torchrun)."""
    assert argv[0] == sys.executable
    if argv[1:3] == ("-m", "torch.distributed.run"):
        assert "--standalone" in argv
        nproc = [a for a in argv if a.startswith("--nproc-per-node=")]
        script = next(a for a in argv[3:] if a.endswith(".py"))
        return script, list(argv[argv.index(script) + 1 :]), int(nproc[0].split("=")[1])
    return argv[1], list(argv[2:]), None


@pytest.mark.parametrize("gpus", [0, 1, 2, 8])
def test_every_planned_step_is_launchable_as_written(gpus: int) -> None:
    steps = plan_steps(gpus)
    assert [s.name for s in steps] == ["ops", "death", "allreduce"]
    for step in steps:
        if step.skipped:
            assert step.argv == () and len(step.skipped) > 20  # says why, in words
            continue
        assert step.ranks == gpus and 0 < step.share < 1
        script, args, nproc = _script_and_args(step.argv)
        assert (ROOT / script).is_file(), script
        if script.endswith("allreduce.py"):
            assert nproc == gpus
            parsed = allreduce.build_parser().parse_args(args)
            config = allreduce.config_from_args(parsed, allreduce.build_parser())
            assert parsed.backend == "nccl" and torch.Size(config["shape"]).numel() == gpus
        elif script.endswith("gpu_workers.py"):
            assert nproc == gpus and gpu_workers.build_parser().parse_args(args).worker == "ops"
        else:
            assert script.endswith("detection.py") and nproc is None  # under hypergrid.run, not torchrun
            parsed = detection.build_parser().parse_args(args)
            assert parsed.world == str(gpus) and parsed.backend == "nccl" and not parsed.without_agent
            assert ("shrink" in parsed.places.split(",")) == (gpus >= 3)
    assert sum(s.share for s in steps if not s.skipped) <= 1.0


def test_what_is_skipped_follows_the_gpus() -> None:
    assert all(s.skipped.startswith("no CUDA GPU") for s in plan_steps(0))
    one = {s.name: s for s in plan_steps(1)}
    assert one["death"].skipped.startswith("needs 2 GPUs") and not one["ops"].skipped
    assert "bridge disjoint" in one["ops"].note and "busbw is 0" in one["allreduce"].note
    for gpus in (2, 8):
        assert not any(s.skipped for s in plan_steps(gpus))
    assert "--shape 2,4 --dims tp,dp" in " ".join(plan_steps(8)[2].argv)


def _gpu_check(*args: str, tmp_path: pathlib.Path) -> tuple[int, str, dict[str, object]]:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *args, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    return done.returncode, done.stdout + done.stderr, json.loads(out.read_text())


@pytest.mark.parametrize("gpus", ["0", "1", "8"])
def test_the_dry_run_prints_the_plan_and_runs_nothing(gpus: str, tmp_path: pathlib.Path) -> None:
    code, said, data = _gpu_check("--dry-run", "--gpus", gpus, tmp_path=tmp_path)
    assert code == 0, said
    assert data["outcomes"] == [] and len(data["plan"]) == 3  # type: ignore[arg-type]
    assert ("skipped: needs 2 GPUs" in said) == (gpus == "1")
    assert ("$ " in said) == (gpus != "0")  # the commands it would run


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the real check would run")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path: pathlib.Path) -> None:
    code, said, data = _gpu_check("--limit", "30", tmp_path=tmp_path)
    assert code == 0 and "nothing ran" in said, said
    assert data["outcomes"] == []
