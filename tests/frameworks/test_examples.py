"""The tier runs the torchtitan example: HSDP + TP on TitanMeshes at world 8 equals one process."""

from __future__ import annotations

import pathlib
import sys

import pytest

pytest.importorskip("torchtitan")

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def test_hsdp_tp_example_equals_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import torchtitan_hsdp_tp as example

    out = example.run(steps=3)
    assert out["difference"] < 3e-7  # float32: the distributed sums run in another order
    assert len(out["losses"]) == 3 and out["losses"][0] != out["losses"][-1]
    # Behind all of torchtitan's meshes: tp, dp_replicate, dp_shard, one group for batch = loss = dp
    # (dp_replicate x dp_shard), efsdp (without ep: dp_shard x tp), the default group, one fake one-rank group.
    assert out["groups"] == 7
    del sys.modules["torchtitan_hsdp_tp"]
