"""Creation strategies give identical membership; 'local' copes with its naming trap; 'split' is refused clearly."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from benchmarks.creation import counting_new_group
from hypergrid import BackendError, GridLayout, HyperCommGrid, InvalidArgumentError, spawn
from tests.workers import basic as workers

LAYOUT = GridLayout([2, 2, 2], ["tp", "cp", "dp"])
OFFSET = GridLayout([2, 2], ["tp", "dp"], rank_offset=4)


@pytest.fixture(scope="module")
def by_strategy() -> dict[str, list[dict[str, Any]]]:
    return {
        strategy: spawn(workers.strategy_families, 8, (strategy,), timeout_s=180) for strategy in ("enumerate", "local")
    }


@pytest.mark.processes
@pytest.mark.timeout(400)
@pytest.mark.parametrize("strategy", ["enumerate", "local"])
def test_every_family_has_the_enumerated_membership(strategy: str, by_strategy: dict[str, Any]) -> None:
    for rank, result in enumerate(by_strategy[strategy]):
        for family in LAYOUT.all_families():
            expected = LAYOUT.group_ranks(family, rank)
            assert result[LAYOUT.key(family)] == (expected, sum(expected)), (strategy, rank, family)
        for family in OFFSET.all_families():
            expected = sum(OFFSET.group_ranks(family, rank)) if rank >= 4 else None
            assert result[f"offset {OFFSET.key(family)}"] == expected


@pytest.mark.processes
@pytest.mark.timeout(400)
def test_local_and_enumerate_agree_exactly(by_strategy: dict[str, Any]) -> None:
    strip = [{k: v for k, v in result.items() if k != "recreate"} for result in by_strategy["local"]]
    assert strip == [{k: v for k, v in r.items() if k != "recreate"} for r in by_strategy["enumerate"]]


@pytest.mark.processes
@pytest.mark.timeout(400)
def test_recreating_a_local_family_after_destroy_is_refused_not_hung(by_strategy: dict[str, Any]) -> None:
    for rank, result in enumerate(by_strategy["local"]):
        assert result["recreate"].startswith("CreationRefusedError"), result["recreate"]
        assert f"over ranks {LAYOUT.group_ranks('tp', rank)}" in result["recreate"]
        assert "strategy='enumerate'" in result["recreate"]
    for rank, result in enumerate(by_strategy["enumerate"]):
        assert result["recreate"] == f"ok {LAYOUT.group_ranks('tp', rank)}"


@pytest.mark.processes
@pytest.mark.timeout(200)
def test_local_with_an_extra_unrelated_group_is_refused_before_waiting() -> None:
    outcomes = spawn(workers.local_with_extra_group, 4, (True, 30.0), timeout_s=150)
    for rank, outcome in enumerate(outcomes):
        assert outcome.startswith("DesyncError"), (rank, outcome)
        assert "hold different numbers of process groups" in outcome
        partner = rank ^ 2  # dp groups are [0, 2] and [1, 3]
        assert f"rank(s) {min(rank, partner)} asked" in outcome and f"rank(s) {max(rank, partner)} asked" in outcome
        assert "holding 2 process groups" in outcome and "holding 1 process groups" in outcome


@pytest.mark.processes
@pytest.mark.timeout(200)
def test_without_the_guard_the_trap_is_real() -> None:
    # The same program with the guard off: torch's members wait on different keys until its timeout.
    outcomes = spawn(workers.local_with_extra_group, 4, (False, 5.0), timeout_s=150)
    assert all(outcome.startswith("torch ") for outcome in outcomes), outcomes


@pytest.mark.usefixtures("one_rank_world")
def test_split_is_refused_on_gloo_with_a_clear_error() -> None:
    grid = HyperCommGrid([1], ["dp"], strategy="split")
    with pytest.raises(BackendError, match=r"'split' needs the default group to be NCCL.*'gloo' without"):
        grid.create_pg("dp")
    with pytest.raises(BackendError, match="cannot make 'nccl' groups"):  # the name decides, not this machine
        HyperCommGrid([1], ["dp"], backend="nccl").create_pg("dp", strategy="split")
    assert grid.created_keys == []


@pytest.mark.parametrize("strategy", ["scatter", "", None, 3])
def test_unknown_strategy_is_refused(strategy: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=repr(strategy).replace("'", ".")):
        HyperCommGrid([2], ["dp"], strategy=strategy)
    if strategy is not None:  # create_pg(strategy=None) means "the grid's strategy"
        with pytest.raises(InvalidArgumentError, match="strategy must be one of"):
            HyperCommGrid([2], ["dp"]).create_pg("dp", strategy=strategy)


@pytest.mark.parametrize(
    ("argument", "value"), [("guard", 1), ("guard", None), ("guard_timeout_s", 0), ("guard_timeout_s", "5")]
)
def test_bad_guard_arguments_are_refused(argument: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=repr(value)):
        HyperCommGrid([2], ["dp"], **{argument: value})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rank", [0, 31_337, 65_535])
def test_fake_backend_local_and_enumerate_agree_at_65536(rank: int) -> None:
    world = 65_536
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        grids = {
            s: HyperCommGrid([8, 4, 2, 1024], ["tp", "cp", "pp", "dp"], strategy=s) for s in ("enumerate", "local")
        }
        for family in (["tp"], ["dp"], ["cp", "tp"], ["pp", "dp"]):
            members = {s: dist.get_process_group_ranks(g.create_pg(family)) for s, g in grids.items()}
            assert members["local"] == members["enumerate"] == grids["local"].layout.group_ranks(family, rank)
        for grid in grids.values():
            grid.destroy()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="split needs NCCL on GPUs")
def test_split_membership_on_gpus() -> None:  # pragma: no cover - runs where GPUs are
    outcomes = spawn(workers.strategy_families, min(torch.cuda.device_count(), 8), ("split",), backend="nccl")
    assert outcomes


def test_local_on_the_fake_backend_makes_one_new_group_call_per_family() -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=9, world_size=4096)
    try:
        with counting_new_group() as calls:  # the benchmark's counter of torch's new_group calls
            grid = HyperCommGrid([8, 512], ["tp", "dp"], strategy="local")
            grid.create_pg("tp", timeout=datetime.timedelta(seconds=30))
            assert len(calls) == 1
            grid.create_pg("dp", strategy="enumerate")
            assert len(calls) == 1 + 8  # one call per dp group
    finally:
        dist.destroy_process_group()
