"""docs/bridge.md's gradient rule across different dp sizes, on 5 gloo ranks against one process.

With a mean loss on each destination replica and gradients averaged over ``dp`` on both sides, the encoder's
gradients come out at ``dp_dst / dp_src`` of the true value (2/3 from dp 3 to dp 2, 3/2 from dp 2 to dp 3); sending
the gradient back scaled by ``dp_src / dp_dst`` makes them the true value, and so does writing each replica's loss
as its share of the global mean with sums over ``dp``. The decoder's gradients are right in all three.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypergrid import spawn
from tests.workers import bridge_gradients as worker

pytestmark = [pytest.mark.processes, pytest.mark.timeout(200)]


@pytest.fixture(scope="module")
def results() -> list[dict[str, dict[str, Any]]]:
    out: list[dict[str, dict[str, Any]]] = spawn(worker.gradients, 5, timeout_s=150)
    return out


def _sides(results: list[dict[str, dict[str, Any]]], case: str) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Each side's ranks' gradients in one case."""
    sides: dict[str, list[dict[str, torch.Tensor]]] = {"encoder": [], "decoder": []}
    for rank_results in results:
        sides[rank_results[case]["side"]].append(rank_results[case]["grads"])
    return sides


@pytest.mark.parametrize("pair", sorted(worker.PAIRS))
def test_mean_losses_leave_the_encoder_at_dp_dst_over_dp_src(results: list[Any], pair: str) -> None:
    dp_src, dp_dst = worker.PAIRS[pair]
    want = worker.one_process()
    sides = _sides(results, f"{pair}/mean")
    assert [len(sides["encoder"]), len(sides["decoder"])] == [dp_src, dp_dst]
    for grads in sides["encoder"]:
        for name, true in want["encoder"].items():
            torch.testing.assert_close(grads[name], true * dp_dst / dp_src, msg=name)
            assert not torch.allclose(grads[name], true, atol=1e-6), name  # the rule is needed: unscaled is wrong
    for grads in sides["decoder"]:
        for name, true in want["decoder"].items():
            torch.testing.assert_close(grads[name], true, msg=name)


@pytest.mark.parametrize("convention", ["mean, scaled", "share"])
@pytest.mark.parametrize("pair", sorted(worker.PAIRS))
def test_the_rule_gives_one_process_gradients(results: list[Any], pair: str, convention: str) -> None:
    want = worker.one_process()
    sides = _sides(results, f"{pair}/{convention}")
    for side in ("encoder", "decoder"):
        for grads in sides[side]:
            for name, true in want[side].items():
                torch.testing.assert_close(grads[name], true, msg=f"{side} {name}")
