"""examples/megatron_gpt.py as a user runs it: a GPTModel at tp 2 x pp 2 on 4 gloo ranks against one process."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core", reason="megatron-core is not installed: run make test-megatron (Python 3.12)")

pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_example_trains_and_matches_one_process(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "losses.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "megatron_gpt.py"), "--steps", "3", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=840,
        env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    parallel, single = result["parallel"], result["single"]
    assert result["agree"] is True and "losses agree" in run.stdout
    assert len(parallel) == 2 and parallel[0] == parallel[1]  # both tensor-parallel ranks of the last stage
    assert len(single) == 3 and all(abs(a - b) < 1e-4 for a, b in zip(parallel[0], single))
    assert single[0] > 4.0  # about ln(128): the model starts near uniform, so the loss is a real cross entropy
