"""`hypergrid.ElasticLoop` without processes: every bad argument refused with its name, a world that does not fit
refused with the numbers and the fix, and the pieces the loop stands on (`StepSnapshots.handed_to`, the digest)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import hypergrid
from hypergrid.errors import DimsError, GridSpecError, InvalidArgumentError
from hypergrid.loop.course import holders_of
from hypergrid.loop.result import state_digest


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"steps": -1}, "steps=-1"),
        ({"steps": 2, "spares": -1}, "spares=-1"),
        ({"steps": 2, "keep": 0}, "keep=0"),
        ({"steps": 2, "policy": "bad"}, "'bad'"),
        ({"steps": 2, "families": "tp"}, "families='tp'"),
        ({"steps": 2, "grid_options": {"spares": 1}}, "['spares']"),
        ({"steps": 2, "grid_options": 3}, "grid_options=3"),
        ({"steps": 2, "regrow": "yes"}, "regrow='yes'"),
        ({"steps": 2, "on_change": 5}, "on_change=5"),
        ({"steps": 2, "verbose": 1}, "verbose=1"),
    ],
)
def test_a_bad_argument_is_refused_with_its_name(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named.replace("[", r"\[").replace("]", r"\]")):
        hypergrid.ElasticLoop([2, -1], ["tp", "dp"], **kwargs)


def test_a_family_over_an_unknown_dim_is_refused_before_anything_runs() -> None:
    with pytest.raises(DimsError, match="pp"):
        hypergrid.ElasticLoop([2, -1], ["tp", "dp"], steps=1, families=["tp", "pp"])


def test_the_whole_grid_family_is_added_once() -> None:
    loop = hypergrid.ElasticLoop([2, -1], ["tp", "dp"], steps=1, families=[["dp", "tp"], "tp"])
    assert loop.families == [["dp", "tp"], "tp"]
    assert hypergrid.ElasticLoop([2, -1], ["tp", "dp"], steps=1).families == ["tp", "dp", ["tp", "dp"]]


@pytest.mark.parametrize(
    ("world", "spares", "message"),
    [(5, 0, "has 4 ranks and spares=0, but the world has 5: start 4"), (7, 2, "rank 4 would be in neither")],
)
def test_a_world_that_is_not_the_grid_plus_its_spares_is_refused(
    world: int, spares: int, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    loop = hypergrid.ElasticLoop([2, 2], ["tp", "dp"], steps=1, spares=spares)
    with pytest.raises(GridSpecError, match=message) as raised:
        loop.grid(world)
    assert "--nproc-per-node" in str(raised.value)


def test_a_minus_one_dim_takes_the_world_less_the_spares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "6")
    grid = hypergrid.ElasticLoop([2, -1], ["tp", "dp"], steps=1, spares=2).grid(6)
    assert grid.shape == [2, 2] and grid.spares == 2 and grid.replicas == ("dp",)


def test_a_grid_without_a_replica_dim_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(InvalidArgumentError, match="no replica dim"):
        hypergrid.ElasticLoop([2], ["tp"], steps=1).grid(2)


def test_run_refuses_what_is_not_callable() -> None:
    loop = hypergrid.ElasticLoop([-1], ["dp"], steps=1)
    with pytest.raises(InvalidArgumentError, match="setup=3"):
        loop.run(3, lambda grid, state, step: None)  # type: ignore[arg-type]
    assert not torch.distributed.is_initialized()  # refused before joining anything


def test_a_received_state_is_handed_to_the_model_built_later() -> None:
    sender = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(sender.parameters())
    sender(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    sent = hypergrid.StepSnapshots(sender, optimizer)
    sent.take(7)
    received = hypergrid.StepSnapshots()
    newest = sent._get(7)
    assert newest is not None
    received._adopt(7, newest.skeleton, [tensor.clone() for tensor in newest.tensors])  # (what share_step does)
    assert received.holds_state and not received.holders
    model = torch.nn.Linear(3, 2)
    fresh = torch.optim.Adam(model.parameters())
    handed = received.handed_to(model, fresh)
    assert handed.steps == (7,) and state_digest([model, fresh]) == state_digest([sender, optimizer])
    with pytest.raises(InvalidArgumentError, match="1 holder"):
        received.handed_to(model)
    with pytest.raises(InvalidArgumentError, match="nothing was received"):
        hypergrid.StepSnapshots().handed_to(model)


def test_an_empty_snapshot_holds_no_state() -> None:
    empty = hypergrid.StepSnapshots()
    assert not empty.holds_state
    empty.take(0)
    assert not empty.holds_state and empty.steps == (0,)


def test_holders_of_a_tuple_a_dict_and_one_object() -> None:
    model = torch.nn.Linear(1, 1)
    assert holders_of((model, 1)) == [model, 1] and holders_of({"m": model}) == [model] and holders_of(model) == [model]


def test_the_digest_sees_one_changed_bit() -> None:
    weights = torch.zeros(4)
    before = state_digest([weights])
    weights.view(torch.int32)[2] = 1  # the smallest subnormal: equal to 0 as a float almost everywhere
    assert state_digest([weights]) != before
