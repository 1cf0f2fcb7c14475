"""HyperCommGrid.create_pgs: many families behind one guard round, checked before anything is created."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from hypergrid import (
    DimsError,
    GridLayout,
    GroupExistsError,
    HyperCommGrid,
    NotInitializedError,
    UnexpectedArgumentError,
    spawn,
)
from tests.workers import guard as guard_workers

LAYOUT = GridLayout([2, 2, 2], ["tp", "cp", "dp"])


@pytest.mark.usefixtures("one_rank_world")
@pytest.mark.parametrize(
    ("dims_list", "error", "match"),
    [
        ([], DimsError, "at least one family"),
        ("tp", DimsError, "a list of dims"),
        (None, DimsError, "a list of dims"),
        ([["tp", "dp"], "cp", ["dp", "tp"]], DimsError, r"\['tp', 'dp'\] and \['dp', 'tp'\].*same family 'dp-tp'"),
        (["dp-tp", "tp-dp"], DimsError, "'dp-tp' and 'tp-dp'.*same family"),
        (["tp", "xp"], DimsError, "'xp' is not in the grid's dim_names"),
        (["tp", ["cp", "cp"]], DimsError, "repeat"),
        (["tp", []], DimsError, "at least one dim"),
    ],
)
def test_bad_batches_are_refused_before_anything_is_created(dims_list: Any, error: type, match: str) -> None:
    grid = HyperCommGrid([1, 1, 1], ["tp", "cp", "dp"])
    with pytest.raises(error, match=match):
        grid.create_pgs(dims_list)
    assert grid.created_keys == []


@pytest.mark.usefixtures("one_rank_world")
def test_an_existing_family_or_a_bad_option_refuses_the_whole_batch() -> None:
    grid = HyperCommGrid([1, 1, 1], ["tp", "cp", "dp"], share_groups=False)  # one group per family: own descs
    grid.create_pg("cp")
    with pytest.raises(GroupExistsError, match=r"'cp'.* has already been created on this grid \(key 'cp'\)"):
        grid.create_pgs(["tp", "cp", "dp"])
    with pytest.raises(UnexpectedArgumentError, match=r"create_pgs? got unexpected keyword argument"):
        grid.create_pgs(["tp"], colour="red")
    assert grid.created_keys == ["cp"]
    groups = grid.create_pgs(["dp-cp-tp", "dp", "tp"], group_desc="BATCH")
    assert list(groups) == ["tp", "dp", "dp-cp-tp"]  # canonical order: fewest dims first
    assert grid.created_keys == ["cp", "tp", "dp", "dp-cp-tp"]
    assert all(group is grid.get_pg(key) and group.group_desc == "BATCH" for key, group in groups.items())
    grid.destroy()


@pytest.mark.usefixtures("one_rank_world")
def test_a_view_takes_its_shared_families_from_its_grid() -> None:
    dense = HyperCommGrid([1, 1, 1], ["tp", "dp", "pp"])
    expert = dense.view([1, 1, 1], ["ep", "edp", "pp"])
    groups = expert.create_pgs(["pp", "ep"])
    assert groups["pp"] is dense.get_pg("pp") and "pp" in dense.created_keys
    assert expert.created_keys == ["ep", "pp"]
    expert.destroy()
    dense.destroy()


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_create_pgs_with_each_strategy_gives_the_enumerated_groups() -> None:
    results = spawn(guard_workers.create_pgs_strategies, 8, timeout_s=240)
    offset = GridLayout([2, 2], ["tp", "dp"], rank_offset=4)
    for rank, by_strategy in enumerate(results):
        for strategy, result in by_strategy.items():
            for family in LAYOUT.all_families():
                expected = LAYOUT.group_ranks(family, rank)
                assert result[LAYOUT.key(family)] == (expected, sum(expected)), (strategy, rank, family)
            for family in offset.all_families():
                if offset.key(family) in ("tp", "dp"):
                    expected_sum = sum(offset.group_ranks(family, rank)) if rank >= 4 else None
                    assert result[f"offset {offset.key(family)}"] == expected_sum, (strategy, rank, family)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="split needs NCCL on GPUs")
def test_create_pgs_with_split_on_gpus() -> None:  # pragma: no cover - runs where GPUs are
    count = min(torch.cuda.device_count(), 8)
    if count < 8:
        pytest.skip("needs 8 GPUs for the [2, 2, 2] grid")
    results = spawn(guard_workers.create_pgs_with, 8, ("split",), backend="nccl")
    for rank, result in enumerate(results):
        for family in LAYOUT.all_families():
            assert result[LAYOUT.key(family)][0] == LAYOUT.group_ranks(family, rank)


def test_create_pgs_needs_an_initialized_world() -> None:
    assert not dist.is_initialized()
    with pytest.raises(NotInitializedError, match=r"^create_pgs: .* needs torch\.distributed"):
        HyperCommGrid([2], ["dp"]).create_pgs(["dp"])
