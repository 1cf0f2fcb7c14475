"""The offline communicator economy: partition signatures against explicit partitions, the plan, the CLI table."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import GridLayout, GridSpecError
from hypergrid.cli.show import show
from hypergrid.layout.economy import partition_signature, plan_communicators
from tests.references import megatron_rank_groups
from tests.strategies import dims_of, grids, layout_of


def _partition(layout: GridLayout, dims: list[str] | tuple[str, ...]) -> frozenset[frozenset[int]]:
    """The family's groups as a set of sets, from the independent Megatron reference."""
    sizes = dict(zip(layout.dim_names, layout.shape))
    groups = megatron_rank_groups("-".join(layout.dim_names), sizes, "-".join(dims))
    return frozenset(frozenset(layout.rank_offset + r for r in group) for group in groups)


def _refactor(draw: st.DrawFn, total: int) -> list[int]:
    """A random factorization of ``total`` into 1..4 sizes (size-1 dims allowed)."""
    sizes = []
    rest = total
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        size = draw(st.sampled_from(divisors))
        sizes.append(size)
        rest //= size
    return [*sizes, rest]


@st.composite
def layout_pairs(draw: st.DrawFn) -> tuple[GridLayout, GridLayout]:
    """Two layouts over the same ranks: a random grid and a random refactorization of it."""
    first = layout_of(draw(grids(max_ranks=64)))
    shape = _refactor(draw, first.size)
    second = GridLayout(shape, [f"v{i}" for i in range(len(shape))], first.rank_offset)
    return first, second


@given(layout_pairs(), st.data())
def test_signatures_are_equal_exactly_when_partitions_are(
    pair: tuple[GridLayout, GridLayout], data: st.DataObject
) -> None:
    first, second = pair
    for a in first.all_families():
        for layout, b in [(first, f) for f in first.all_families()] + [(second, f) for f in second.all_families()]:
            same_partition = _partition(first, a) == _partition(layout, b)
            assert (partition_signature(first, a) == partition_signature(layout, b)) == same_partition, (a, b)
    dims = data.draw(dims_of(list(first.dim_names)))
    signature = partition_signature(first, dims)
    groups = _partition(first, dims)
    assert signature.num_groups == len(groups) and all(len(g) == signature.group_size for g in groups)


@given(layout_pairs(), st.data())
def test_plan_counts_match_distinct_partitions(pair: tuple[GridLayout, GridLayout], data: st.DataObject) -> None:
    grid, view = pair
    families = data.draw(st.lists(st.sampled_from(grid.all_families()), min_size=1, unique=True))
    view_families = data.draw(st.lists(st.sampled_from(view.all_families()), unique=True))
    plan = plan_communicators(grid, families, [("v", view, view_families)])
    partitions = [_partition(grid, f) for f in families] + [_partition(view, f) for f in view_families]
    assert plan.without_sharing == len(families) + len(view_families)
    assert plan.with_sharing == len(set(partitions))
    # Every communicator serves families with one partition, and no two communicators share one.
    served = [
        {_partition(grid, key.split("-")) if isinstance(key, str) else _partition(view, key[1]) for key in c.keys}
        for c in plan.communicators
    ]
    assert all(len(s) == 1 for s in served) and len({next(iter(s)) for s in served}) == len(served)
    assert plan.new_group_calls_without_sharing == sum(len(p) for p in partitions)


def test_issue_example_tp1_four_dims() -> None:
    # The issue's example: 4 dims, tp=1, all 15 families -> 7 memberships plus the single-rank group.
    plan = plan_communicators(GridLayout([1, 2, 2, 2], ["tp", "cp", "ep", "dp"]))
    assert (plan.without_sharing, plan.with_sharing) == (15, 8)
    alone = [c for c in plan.communicators if c.group_size == 1]
    assert len(alone) == 1 and alone[0].keys == ["tp"] and alone[0].num_groups == 8


def test_view_families_label_and_collapse() -> None:
    grid = GridLayout([2, 4], ["tp", "dp"])
    view = GridLayout([2, 2, 2], ["tp", "ep", "edp"])
    plan = plan_communicators(grid, ["tp", "dp"], [("expert", view, ["tp", "edp-ep"])])
    assert [c.keys for c in plan.communicators] == [["tp", ("expert", ("tp",))], ["dp", ("expert", ("edp", "ep"))]]
    assert "tp, expert:tp" in plan.render()


def test_view_over_other_ranks_is_refused() -> None:
    with pytest.raises(GridSpecError, match=r"covers ranks 0\.\.3"):
        plan_communicators(GridLayout([8], ["dp"]), ["dp"], [("v", GridLayout([4], ["x"]), ["x"])])


def test_show_communicators_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert show(["--shape", "2,1,2", "--dims", "tp,cp,dp", "--communicators"]) == 0
    out = capsys.readouterr().out
    assert "communicators per rank: 7 one per family (Megatron-style), 4 shared (hypergrid)" in out
    assert "cp  (each rank alone)" in out


def test_show_communicators_json_one_family(capsys: pytest.CaptureFixture[str]) -> None:
    assert show(["--shape", "2,1,2", "--dims", "tp,cp,dp", "--family", "cp,tp", "--communicators", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["communicators"] == [{"keys": ["cp-tp"], "group_size": 2, "num_groups": 2, "blocks": [[1, 2]]}]
    assert data["per_rank"] == {"without_sharing": 1, "with_sharing": 1}
