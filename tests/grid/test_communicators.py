"""Building blocks of the communicator economy: tags, group options, pg_options descriptions, the pool."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import InvalidArgumentError, UnexpectedArgumentError
from hypergrid.binding.options import (
    GROUP_OPTIONS,
    check_group_options,
    check_tag,
    describe_options,
    describe_pg_options,
)
from hypergrid.grid.communicators import GroupPool


@pytest.mark.parametrize("tag", ["ag", "cpu", "_x", "A" * 32, "dp2"])
def test_good_tags(tag: str) -> None:
    assert check_tag(tag) == tag


@pytest.mark.parametrize("tag", ["", "2nd", "all gather", "a-b", "a" * 33, 3, b"ag", "é"])
def test_bad_tags_are_named(tag: object) -> None:
    with pytest.raises(InvalidArgumentError, match="tag must be None or a short identifier") as caught:
        check_tag(tag)
    assert repr(tag) in str(caught.value)


def test_unknown_option_names_list_the_accepted_ones() -> None:
    with pytest.raises(UnexpectedArgumentError) as caught:
        check_group_options({"timeout": datetime.timedelta(seconds=5), "backend": "gloo", "device": 0})
    message = str(caught.value)
    assert "['backend', 'device']" in message and all(name in message for name in GROUP_OPTIONS)
    with pytest.raises(UnexpectedArgumentError, match="must be a dict"):
        check_group_options([("timeout", 5)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"timeout": 30}, "timeout must be a positive datetime.timedelta"),
        ({"timeout": datetime.timedelta(0)}, "timeout must be a positive"),
        ({"group_desc": 7}, "group_desc must be a str"),
    ],
)
def test_bad_option_values(options: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        check_group_options(options)


def test_options_description_is_by_value_not_identity() -> None:
    first, second = dist.ProcessGroupGloo._Options(), dist.ProcessGroupGloo._Options()
    assert describe_pg_options(first) == describe_pg_options(second)
    second._threads = first._threads + 3
    assert describe_pg_options(first) != describe_pg_options(second)
    assert describe_options({"pg_options": first}) != describe_options({"pg_options": second})
    minute = {"timeout": datetime.timedelta(minutes=1)}
    assert describe_options(minute) == describe_options({"timeout": datetime.timedelta(seconds=60)})
    assert describe_options(minute) != describe_options({}) == "defaults"


def test_description_ignores_what_torch_writes_at_creation() -> None:
    # torch (NCCL) writes these into the options object a group is created with.
    options = dist.ProcessGroupGloo._Options()
    before = describe_pg_options(options)
    options.global_ranks_in_group = [0, 1]
    options.group_name = "7"
    options._timeout = datetime.timedelta(seconds=42)
    assert describe_pg_options(options) == before


def test_pool_destroys_each_group_once_and_never_the_default(one_rank_world: None) -> None:
    held_before = len(c10d._world.pg_names)
    pool = GroupPool()
    shared, alone = dist.new_group([0]), dist.new_group([0])
    pool.add("A", shared, "dp", backend=None, tag=None, options="defaults")
    pool.hold("A", "cp-dp")
    pool.hold("A", ("expert", ("edp",)))
    pool.add("B", alone, "tp", backend="gloo", tag="cpu", options="defaults")
    pool.add("W", dist.group.WORLD, "all", backend=None, tag=None, options="defaults")
    pool.add("N", None, "outside", backend=None, tag=None, options="defaults")
    assert pool.find("A") is not None and pool.keys_of("A") == ["dp", "cp-dp", ("expert", ("edp",))]
    assert pool.release(["dp", "cp-dp", "unknown"]) == []
    freed = pool.release([("expert", ("edp",)), "tp", "all", "outside"])
    assert len(freed) == 2 and freed[0] is shared and freed[1] is alone
    assert pool.entries() == [] and pool.release(["dp"]) == []
    for group in freed:
        dist.destroy_process_group(group)
    assert len(c10d._world.pg_names) == held_before
