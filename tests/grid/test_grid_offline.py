"""HyperCommGrid without other processes: planning offline, and a one-rank gloo world."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from hypergrid import (
    GridLayout,
    GroupExistsError,
    GroupNotFoundError,
    HyperCommGrid,
    NotInitializedError,
    WorldSizeError,
)


def test_attributes_and_repr() -> None:
    grid = HyperCommGrid([2, 3, 4], ["tp", "cp", "dp"], rank_offset=5, backend="GLOO")
    assert (grid.shape, grid.dim_names, grid.rank_offset, grid.size, grid.backend) == (
        [2, 3, 4],
        ["tp", "cp", "dp"],
        5,
        24,
        "gloo",
    )
    assert grid.layout == GridLayout([2, 3, 4], ["tp", "cp", "dp"], 5)
    assert repr(grid) == (
        "HyperCommGrid(shape=[2, 3, 4], dim_names=['tp', 'cp', 'dp'], rank_offset=5, backend='gloo', groups=[])"
    )


def test_rank_enum_is_pure_and_offline() -> None:
    assert not dist.is_initialized()
    grid = HyperCommGrid([2, 2, 2], ["a", "b", "c"])
    assert grid.get_rank_enum(["c", "a"]) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert grid.created_keys == []


def test_world_size_from_environment_refuses_a_grid_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4)
    with pytest.raises(WorldSizeError, match=r"8 ranks.*world has 4"):
        monkeypatch.setenv("WORLD_SIZE", "4")
        HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(WorldSizeError, match="rank_offset 5"):
        HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=5)
    monkeypatch.setenv("WORLD_SIZE", "eight")
    with pytest.raises(WorldSizeError, match="'eight'"):
        HyperCommGrid([2], ["dp"])


def test_collective_calls_need_an_initialized_world() -> None:
    grid = HyperCommGrid([2], ["dp"])
    with pytest.raises(NotInitializedError, match="init_process_group"):
        grid.create_pg("dp")
    with pytest.raises(NotInitializedError):
        grid.is_current_rank_in_grid()
    grid.destroy()  # nothing to destroy: no error


def test_get_pg_before_create_lists_what_exists() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    with pytest.raises(GroupNotFoundError, match=r"created so far: \[\]") as error:
        grid.get_pg(["dp", "tp"])
    assert isinstance(error.value, KeyError)
    assert "'dp-tp'" in str(error.value)


@pytest.mark.usefixtures("one_rank_world")
def test_one_rank_lifecycle() -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    assert grid.is_current_rank_in_grid()
    group = grid.create_pg(["tp", "dp"], group_desc="HG_BOTH", timeout=datetime.timedelta(seconds=77))
    assert group is not None and group.group_desc == "HG_BOTH"
    assert group._get_backend(torch.device("cpu")).options._timeout == datetime.timedelta(seconds=77)
    assert grid.get_pg("tp-dp") is group and grid.get_pg(["dp", "tp"]) is group
    with pytest.raises(GroupExistsError, match=r"already been created.*'dp-tp'") as error:
        grid.create_pg(["dp", "tp"])
    assert isinstance(error.value, KeyError)
    grid.destroy()
    with pytest.raises(KeyError):
        dist.get_process_group_ranks(group)  # torch no longer knows it
    grid.destroy()  # idempotent
    again = grid.create_pg("tp-dp", group_desc="AGAIN")  # a labelled group of its own, not the default group
    assert again is not None and again is not group and again is not dist.group.WORLD
    dist.destroy_process_group(again)
    grid.destroy()  # its group was destroyed elsewhere: skipped, no error


def test_create_rechecks_the_real_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Planned against WORLD_SIZE=2 before the world came up, then the world has one rank.
    monkeypatch.setenv("WORLD_SIZE", "2")
    grid = HyperCommGrid([2], ["dp"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(WorldSizeError, match="world has 1"):
            grid.create_pg("dp")
        # WORLD_SIZE, when set, is what a grid is planned against (Megatron's order); creation checks the live world.
        assert HyperCommGrid([2], ["dp"]).size == 2
        monkeypatch.delenv("WORLD_SIZE")
        with pytest.raises(WorldSizeError, match="world has 1"):
            HyperCommGrid([2], ["dp"])
    finally:
        dist.destroy_process_group()


def test_a_view_keeps_every_constructor_setting_of_its_root() -> None:
    # Bound views are built from the constructor's signature: a setting added later is not forgotten.
    grid = HyperCommGrid(
        [2, 2], ["tp", "dp"], guard_timeout_s=7.0, guard_progress_s=3.0, share_groups=False, check_collectives=True
    )
    expert = grid.view([4], ["ep"], name="expert")
    for name in ("guard_timeout_s", "guard_progress_s", "share_groups", "check_collectives", "strategy", "spares"):
        assert getattr(expert, name) == getattr(grid, name), name


def test_every_delegating_method_reaches_a_facet_object_the_grid_holds() -> None:
    """Each ``delegate(Facet.name)`` of the front calls a method of one of the grid's facet objects, named alike."""
    import inspect

    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    held = {type(facet) for facet in grid._facets.values()}
    delegated = {}  # every method the grid does not define itself (grid.py) is a facet's
    for name, member in inspect.getmembers(type(grid), inspect.isfunction):
        target = inspect.unwrap(member)
        if not name.startswith("__") and target.__qualname__.split(".")[0] != "HyperCommGrid":
            delegated[name] = target
    assert len(held) == 12 and len(delegated) >= 40  # the facets' public methods and Megatron's four helpers
    for name, target in delegated.items():
        assert target.__name__ == name, (name, target.__qualname__)
        assert any(getattr(facet, name, None) is target for facet in held), name
    assert grid.group_ranks("dp", rank=3) == [1, 3] and grid._gen_rank_enum(["dp"]) == [[0, 2], [1, 3]]
