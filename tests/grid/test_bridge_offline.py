"""``hypergrid.Bridge``'s errors: each names the call, the value and what was expected, before any communication."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypergrid import Bridge, HyperCommGrid, InvalidArgumentError, RankError


def grids() -> tuple[HyperCommGrid, HyperCommGrid]:
    return HyperCommGrid([1, 2], ["tp", "dp"]), HyperCommGrid([3], ["dp"], rank_offset=2)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"dst": "grid"}, r"Bridge: dst='grid': expected a HyperCommGrid"),
        ({"batch_dim": -1}, r"Bridge: batch_dim=-1: expected an int in 0..7"),
        ({"seq_dim": 0}, r"Bridge: seq_dim=0: expected None or a tensor dim other than batch_dim=0"),
        ({"batch_dim": 1, "seq_dim": 1}, r"seq_dim=1: expected None or a tensor dim other than batch_dim=1"),
        ({"variable_shapes": 1}, r"Bridge: variable_shapes=1: expected True or False"),
        ({"dp": ""}, r"Bridge: dp='': expected a dim name \(an identifier\)"),
        ({"device": "gpu-7"}, r"Bridge: device='gpu-7': expected None, a torch.device or a device name"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], text: str) -> None:
    src, dst = grids()
    arguments: dict[str, Any] = {"src": src, "dst": dst, **kwargs}
    with pytest.raises(InvalidArgumentError, match=text):
        Bridge(arguments.pop("src"), arguments.pop("dst"), **arguments)


def test_a_batch_the_destination_cannot_cut_is_refused_before_any_communication() -> None:
    bridge = Bridge(*grids())  # no process group: any communication would fail another way
    with pytest.raises(
        InvalidArgumentError,
        match=r"send_forward: the global batch 4 must be a positive multiple of "
        r"the destination's dp size 3",
    ):
        bridge.send_forward(torch.zeros(2, 5))
    with pytest.raises(InvalidArgumentError, match=r"send_forward: tensor=\[1.0\]: expected a torch.Tensor"):
        bridge.send_forward([1.0])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"has no dim 1 \(batch_dim=0, seq_dim=1\)"):
        Bridge(*grids(), seq_dim=1).send_forward(torch.zeros(3))
    with pytest.raises(RankError, match=r"recv_forward: rank 0 is not on the first pipeline stage of dst"):
        bridge.recv_forward()


@pytest.mark.usefixtures("one_rank_world")
def test_a_shape_other_than_the_first_is_refused_on_the_sender() -> None:
    grid = HyperCommGrid([1], ["dp"])
    bridge = Bridge(grid, grid)
    assert bridge.send_forward(torch.ones(2, 3)).tolist() == [[1.0] * 3] * 2  # type: ignore[union-attr]
    with pytest.raises(
        InvalidArgumentError,
        match=r"send_forward: got a tensor of shape \[3, 3\] float32, expected "
        r"\[2, 3\] float32",
    ):
        bridge.send_forward(torch.ones(3, 3))
    with pytest.raises(RankError, match=r"recv_forward: rank 0 is on the boundary of both grids"):
        bridge.recv_forward()
    bridge.destroy()  # forgets the shape: the next transfer fixes another
    assert bridge.send_forward(torch.ones(3, 3)).shape == (3, 3)  # type: ignore[union-attr]
    variable = Bridge(grid, grid, variable_shapes=True, device="cpu")
    for rows in (1, 4):
        assert variable.send_forward(torch.zeros(rows, 2, dtype=torch.int64)).shape == (rows, 2)  # type: ignore[union-attr]
