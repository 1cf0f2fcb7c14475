"""Sharing identical groups, tags, per-family options and backends, in one process (one-rank gloo or fake)."""

from __future__ import annotations

import datetime
import itertools
import json
import pathlib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed import distributed_c10d as c10d
from torch.testing._internal.distributed.fake_pg import FakeStore

from benchmarks import creation
from benchmarks.creation import counting_new_group
from hypergrid import (
    BackendError,
    GroupExistsError,
    GroupNotFoundError,
    HyperCommGrid,
    InvalidArgumentError,
    UnexpectedArgumentError,
)
from tests.references import megatron_rank_groups
from tests.strategies import dims_of, grids


@contextmanager
def fake_world(rank: int, world: int) -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def reference_group(shape: list[int], names: list[str], offset: int, dims: list[str], rank: int) -> list[int] | None:
    """The ranks of ``rank``'s group in the family over ``dims`` (Megatron's reference), None outside."""
    groups = megatron_rank_groups("-".join(names), dict(zip(names, shape)), "-".join(dims))
    mine = [[offset + r for r in group] for group in groups if rank - offset in group]
    return mine[0] if mine else None


def _timeout(group: dist.ProcessGroup) -> datetime.timedelta:
    timeout: datetime.timedelta = group._get_backend(torch.device("cpu")).options._timeout
    return timeout


SHAPE, NAMES = [1, 4, 1, 8], ["tp", "cp", "ep", "dp"]  # tp = ep = 1


@pytest.mark.parametrize("rank", [0, 13, 31])
def test_every_family_of_a_size1_grid_at_scale(rank: int) -> None:
    with fake_world(rank, 32), counting_new_group() as calls:
        grid = HyperCommGrid(SHAPE, NAMES)
        families = grid.layout.all_families()
        groups = {family: grid.create_pg(family) for family in families}
        memberships = {}
        for family, group in groups.items():
            ranks = dist.get_process_group_ranks(group)
            assert ranks == reference_group(SHAPE, NAMES, 0, list(family), rank), family
            memberships.setdefault(tuple(ranks), []).append(family)
        # Shared exactly when the members are the same: the very same object.
        for members in memberships.values():
            assert all(groups[family] is groups[members[0]] for family in members)
        assert len({id(group) for group in groups.values()}) == len(memberships) == 4
        # enumerate: one new_group per group of each *distinct* family only; none for a family of one-rank groups
        # (each rank makes its own fake-backend group: one call) or one group of the whole world (the default group).
        assert len(calls) == 1 + 8 + 4 + 0  # single-rank, cp, dp, cp-dp
        assert grid.get_pg(["cp", "dp"]) is dist.group.WORLD and dist.get_backend(grid.get_pg("tp")) == "fake"
        assert grid.get_pg(["tp", "cp"]) is grid.get_pg("cp") is grid.pg(["ep", "cp", "tp"])
        grid.destroy()


def test_size1_families_share_one_single_rank_group(one_rank_world: None) -> None:
    grid = HyperCommGrid([1, 1, 1], ["tp", "cp", "dp"])
    groups = [grid.create_pg(family) for family in grid.layout.all_families()]
    assert all(group is groups[0] for group in groups) and dist.get_process_group_ranks(groups[0]) == [0]
    report = grid.communicators()
    assert len(report) == 1 and report[0]["keys"] == grid.created_keys and report[0]["size"] == 1
    grid.destroy()


def test_share_groups_false_gives_one_group_per_family(one_rank_world: None) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"], share_groups=False)
    groups = [grid.create_pg(family) for family in grid.layout.all_families()]
    assert len({id(group) for group in groups}) == 3 == len(grid.communicators())
    with pytest.raises(InvalidArgumentError, match=r"HyperCommGrid: share_groups=.*: expected True or False"):
        HyperCommGrid([1], ["dp"], share_groups=1)  # type: ignore[arg-type]
    grid.destroy()


def test_tags_are_separate_retrievable_and_checked(one_rank_world: None) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    plain = grid.create_pg("dp")
    tagged = grid.create_pg("dp", tag="ag")
    assert tagged is not plain
    assert dist.get_process_group_ranks(tagged) == dist.get_process_group_ranks(plain)
    assert grid.get_pg("dp", tag="ag") is grid.pg("dp", tag="ag") is tagged and grid.get_pg("dp") is plain
    # Same tag, same members: shared; another tag: another communicator.
    assert grid.create_pg("dp-tp", tag="ag") is tagged and grid.create_pg("tp", tag="rs") is not tagged
    with pytest.raises(GroupExistsError, match="with tag 'ag'"):
        grid.create_pg("dp", tag="ag")
    with pytest.raises(GroupNotFoundError, match="tag='zz'"):
        grid.get_pg("dp", tag="zz")
    with pytest.raises(InvalidArgumentError, match="short identifier"):
        grid.create_pg("dp", tag="all gather")
    assert grid.created_keys == ["dp", "dp@ag", "dp-tp@ag", "tp@rs"]
    tags = sorted((c["tag"] or "", c["keys"]) for c in grid.communicators())
    assert tags == [("", ["dp"]), ("ag", ["dp@ag", "dp-tp@ag"]), ("rs", ["tp@rs"])]
    grid.destroy()


def test_backend_twin_needs_a_tag(one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"], backend="nccl")  # an NCCL grid; its gloo twin works on CPU
    with pytest.raises(BackendError, match="give the family a tag"):
        grid.create_pg("dp", backend="gloo")
    twin = grid.create_pg("dp", backend="gloo", tag="cpu")
    assert dist.get_backend(twin) == "gloo"
    assert [(c["backend"], c["tag"], c["keys"]) for c in grid.communicators()] == [("gloo", "cpu", ["dp@cpu"])]
    tensor = torch.ones(3)
    dist.all_reduce(tensor, group=twin)
    assert tensor.tolist() == [1.0, 1.0, 1.0]
    grid.destroy()


def test_grid_defaults_are_inherited_and_overridden(one_rank_world: None) -> None:
    minute, hour = datetime.timedelta(minutes=1), datetime.timedelta(hours=1)
    grid = HyperCommGrid([1, 1], ["tp", "dp"], group_options={"timeout": minute, "group_desc": "GRID"})
    inherited = grid.create_pg("tp")
    assert inherited.group_desc == "GRID" and _timeout(inherited) == minute
    # group_desc only labels: another one still shares; another timeout does not.
    assert grid.create_pg("dp", group_desc="OTHER") is inherited
    overridden = grid.create_pg("dp-tp", timeout=hour)
    assert overridden is not inherited and _timeout(overridden) == hour and overridden.group_desc == "GRID"
    view = grid.view([1, 1], ["ep", "edp"], shared_dims=[])
    assert view.create_pg("ep") is inherited  # the view inherits the defaults, and shares with its grid
    assert [c["options"] for c in grid.communicators()] == [
        "timeout=60s group_desc='GRID'",
        "timeout=3600s group_desc='GRID'",
    ]
    with pytest.raises(UnexpectedArgumentError, match=r"\['device'\]; accepted: \['timeout', 'pg_options'"):
        HyperCommGrid([1], ["dp"], group_options={"device": 0})
    with pytest.raises(UnexpectedArgumentError, match="unexpected keyword argument"):
        grid.create_pg("dp", device=0)
    view.destroy()
    grid.destroy()


def test_destroy_releases_each_group_once(one_rank_world: None) -> None:
    before = len(c10d._world.pg_names)
    grid = HyperCommGrid([1, 1, 1], ["tp", "cp", "dp"])
    view = grid.view([1, 1, 1], ["ep", "edp", "dp"])
    for family in grid.layout.all_families():
        grid.create_pg(family)
    grid.create_pg("dp", tag="ag")
    assert view.create_pg("edp-ep") is grid.get_pg("tp")  # a view's own family, shared with the grid's
    assert view.pg("dp") is grid.get_pg("dp")  # over the shared dim: the grid's own key
    view.create_pg("ep", tag="x")
    # In a one-rank world every untagged family is the default group: only the two tagged ones are new groups.
    assert grid.get_pg("tp") is dist.group.WORLD
    assert len(c10d._world.pg_names) == before + 2
    view.destroy()  # its own families only: the tagged one goes, the shared one stays with the grid
    assert len(c10d._world.pg_names) == before + 1
    assert grid.get_pg("tp") is not None and len(grid.communicators()) == 2
    grid.destroy()
    assert len(c10d._world.pg_names) == before
    grid.destroy()  # idempotent
    assert len(c10d._world.pg_names) == before and grid.communicators() == []


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[int], list[str], int, int, list[tuple[list[str], str | None]]]:
    case = draw(grids(max_ndim=4, max_size=3, max_ranks=48))
    world = case.rank_offset + int(torch.tensor(case.shape).prod())
    rank = draw(st.integers(0, world - 1))
    calls = draw(
        st.lists(st.tuples(dims_of(case.dim_names), st.sampled_from([None, None, "ag", "cpu"])), min_size=1, max_size=8)
    )
    return case.shape, case.dim_names, case.rank_offset, rank, calls


@given(requests())
def test_distinct_groups_equal_distinct_memberships_and_tags(
    case: tuple[list[int], list[str], int, int, list[tuple[list[str], str | None]]],
) -> None:
    shape, names, offset, rank, calls = case
    with fake_world(rank, offset + int(torch.tensor(shape).prod())):
        grid = HyperCommGrid(shape, names, offset)
        held = {}
        for dims, tag in calls:
            key = (grid.layout.key(dims), tag)
            if key not in held:
                held[key] = (grid.create_pg(dims, tag=tag), dims, tag)
        expected = set()
        for group, dims, tag in held.values():
            members = reference_group(shape, names, offset, dims, rank)
            assert (group is None) == (members is None)
            if group is not None:
                assert dist.get_process_group_ranks(group) == members
                expected.add((tuple(members), tag))
        distinct = {id(group) for group, _, _ in held.values() if group is not None}
        assert len(distinct) == len(expected) == len(grid.communicators())
        grid.destroy()


def test_sharing_benchmark_counts(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "sharing.json"
    assert creation.main(["--sharing", "--fake", "--world", "64", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())
    shape = [1, 1, 16, 4]
    partitions = {
        "-".join(family): frozenset(
            frozenset(group) for group in megatron_rank_groups("tp-cp-ep-dp", dict(zip(NAMES, shape)), "-".join(family))
        )
        for family in itertools.chain.from_iterable(itertools.combinations(NAMES, n) for n in range(1, 5))
    }
    distinct = set(partitions.values())

    def shared_calls(partition: frozenset[frozenset[int]], per_group: int) -> int:
        # Shared families need no real communicator when their groups have one rank (each rank makes its own
        # fake-backend group: one call) or are one group of the whole world (the default group: none).
        if all(len(group) == 1 for group in partition):
            return 1
        return 0 if len(partition) == 1 else per_group

    expected = {
        ("enumerate", False): (15, sum(len(p) for p in partitions.values())),
        ("enumerate", True): (len(distinct), sum(shared_calls(p, len(p)) for p in distinct)),
        ("local", False): (15, 15),
        ("local", True): (len(distinct), sum(shared_calls(p, 1) for p in distinct)),
    }
    seen = {
        (row["strategy"], row["share_groups"]): (row["distinct_groups_per_rank"], row["new_group_calls_per_rank"])
        for row in rows
    }
    assert seen == expected and all(row["shape"] == shape for row in rows)


def test_registered_views_share_with_the_grid_and_take_tags() -> None:
    with fake_world(5, 8):
        grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
        grid.register_view("expert", [4, 1, 2], ["ep", "edp", "dp"], shared_dims=["dp"])
        dense = grid.create_pg("cp-tp")
        assert grid.create_pg("ep", view="expert") is dense  # same members: the same object
        assert grid.create_pg(["ep", "edp"], view="expert") is dense  # edp has size 1
        tagged = grid.create_pg("ep", view="expert", tag="ag")
        assert tagged is not dense and dist.get_process_group_ranks(tagged) == [4, 5, 6, 7]
        assert grid.get_pg("ep", view="expert", tag="ag") is tagged
        assert ("expert", ("ep",), "ag") in grid._pgs
        with pytest.raises(GroupExistsError, match="tag 'ag'"):
            grid.create_pg("ep", view="expert", tag="ag")
        assert [c["keys"] for c in grid.communicators()] == [["cp-tp", "expert:ep", "expert:edp-ep"], ["expert:ep@ag"]]
        bound = grid.view([4, 1, 2], ["ep", "edp", "dp"], name="expert")
        bound.pg("dp", tag="cpu")
        assert bound.created_keys == ["ep", "edp-ep", "ep@ag", "dp@cpu"]
        bound.destroy()  # its own families: the tagged ep goes; dp@cpu is the grid's key (shared dim)
        assert grid.created_keys == ["cp-tp", "dp@cpu"]
        grid.destroy()
        assert grid.communicators() == []
