"""process_groups in one call (and from a grid) against an independent reference of Megatron-Core 0.19's groups.

The one call runs in a one-process fake world (torch's ``fake`` backend, one
rank at a time: no guard round, real enumeration of every group); members are
compared with ``tests/compat/megatron_reference.py``, written from Megatron's
documented rank generation without hypergrid. The same comparison against
Megatron's own ``initialize_model_parallel`` runs in ``make test-megatron``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch.testing._internal.distributed.fake_pg import FakeStore

from hypergrid import HyperCommGrid
from hypergrid.compat.megatron import (
    PG_FIELDS,
    collection_class,
    destroy_process_groups,
    grid_of,
    process_groups,
    setup_model_state,
)
from hypergrid.errors import (
    DependencyError,
    GridSpecError,
    GroupNotFoundError,
    NotInitializedError,
    UnexpectedArgumentError,
)
from tests.compat.megatron_reference import accepted, members, mine, reference


def _fields_at(rank: int, world: int, **kwargs: Any) -> dict[str, Any]:
    """Every field's members on ``rank`` of a fake world, through the one call."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        pgs = process_groups(**kwargs)
        out = {name: members(getattr(pgs, name)) for name in PG_FIELDS}
        destroy_process_groups(pgs)
        return out
    finally:
        dist.destroy_process_group()


SIZES = st.sampled_from([1, 1, 2, 2, 3, 4])


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


@st.composite
def megatron_sizes(draw: st.DrawFn) -> dict[str, Any]:
    """Sizes initialize_model_parallel accepts (the reference's rules), world at most 96."""
    tp, pp, cp, gtp = draw(SIZES), draw(SIZES), draw(SIZES), draw(st.sampled_from([1, 1, 1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    world = tp * pp * cp * gtp * dp
    rest = world // pp
    etp = draw(st.sampled_from(_divisors(rest)))
    ep = draw(st.sampled_from(_divisors(rest // etp)))
    egtp = draw(st.sampled_from([d for d in (1, 1, 2) if (rest // etp // ep) % d == 0]))
    edp = rest // etp // ep // egtp
    n = 1 if gtp > 1 or egtp > 1 else draw(st.sampled_from(_divisors(math.gcd(dp * cp, edp))))
    names = draw(st.permutations(["tp", "cp", "ep", "dp"]))
    names.insert(len(names) if draw(st.booleans()) else draw(st.integers(0, len(names))), "pp")
    if draw(st.booleans()):
        names.insert(draw(st.integers(0, len(names))), "gtp_remat")
    order = "-".join(names)
    hcp = draw(st.sampled_from([None, [cp], *([[2, cp // 2]] if cp % 2 == 0 else [])]))
    if not accepted(world, tp, pp, cp, ep, etp, gtp, egtp, n, order, hcp):
        draw(st.nothing())  # hypothesis rejects the example (Megatron would refuse these sizes)
    return dict(
        world=world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, gtp_remat=gtp, egtp_remat=egtp,
        distributed_optimizer_instances=n, order=order, hierarchical_cp=hcp, all_gather=draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(megatron_sizes(), st.data())
def test_one_call_gives_megatrons_members_for_any_accepted_sizes(sizes: dict[str, Any], data: st.DataObject) -> None:
    world = sizes.pop("world")
    for feature in ("gtp_remat", "egtp_remat", "ep", "distributed_optimizer_instances"):
        event(f"{feature} > 1: {sizes[feature] > 1}")
    event(f"hierarchical_cp: {sizes['hierarchical_cp'] is not None}")
    expected = reference(
        world, sizes["tp"], sizes["pp"], sizes["cp"], sizes["ep"], sizes["etp"], sizes["gtp_remat"],
        sizes["egtp_remat"], sizes["distributed_optimizer_instances"], sizes["order"], sizes["hierarchical_cp"],
        sizes["all_gather"],
    )  # fmt: skip
    for rank in sorted({0, world - 1, data.draw(st.integers(0, world - 1))}):
        got = _fields_at(rank, world, **sizes)
        for name in PG_FIELDS:
            assert got[name] == mine(expected[name], rank), (name, rank, sizes)


def test_the_reference_and_the_one_call_disagree_when_they_should() -> None:
    # The comparison can fail: Megatron's mp is tp-pp, not tp-dp.
    expected = reference(8, 2, 2, 1, 1, 2, 1, 1, 1, "tp-cp-ep-dp-pp", None, False)
    got = _fields_at(0, 8, tp=2, pp=2)
    assert got["mp"] == mine(expected["mp"], 0) == [0, 1, 4, 5]
    assert got["tp_dp_cp"] == mine(expected["tp_dp_cp"], 0) != got["mp"]


# -- one call: what Megatron hands out as one object, what it leaves None ------------------


@pytest.fixture
def world8() -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=8)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_same_objects_where_megatron_hands_out_one_even_without_sharing(world8: None) -> None:
    pgs = process_groups(tp=2, pp=2, share_groups=False)
    assert pgs.dp_cp_gtp_remat is pgs.dp_cp and pgs.intra_dp_cp is pgs.dp_cp
    assert pgs.expt_dp_gtp_remat is pgs.expt_dp and pgs.intra_expt_dp is pgs.expt_dp
    assert pgs.embd is not pgs.pp and members(pgs.embd) == members(pgs.pp) == [3, 7]  # sharing off: its own
    assert pgs.inter_dist_opt is None and pgs.hcp is None and pgs.dp_cp_ag is None and pgs.expt_dp_ag is None
    assert type(pgs) is collection_class()
    destroy_process_groups(pgs)


def test_sharing_gives_embedding_groups_from_the_grid(world8: None) -> None:
    pgs = process_groups(tp=2, pp=2)
    assert pgs.embd is pgs.pp and members(pgs.pos_embd) == [3]  # rank 3 is on the first stage (of [3, 7])
    grid = grid_of(pgs)
    assert grid.dim_names == ["tp", "gtp_remat", "cp", "dp", "pp"] and grid.shape == [2, 1, 1, 2, 2]
    assert grid._views["expert"].dim_names == ["etp", "ep", "egtp_remat", "edp", "pp"]
    destroy_process_groups(pgs)
    with pytest.raises(GroupNotFoundError, match="did not make"):
        grid_of(pgs)


def test_distributed_optimizer_views_and_a_run_that_is_no_family() -> None:
    # Runs of 6 of (cp 4 fastest, dp 3) are no product family; cp and dp adjacent: one merged dim, cut.
    got = _fields_at(5, 12, cp=4, distributed_optimizer_instances=2)
    expected = reference(12, 1, 1, 4, 1, 1, 1, 1, 2, "tp-cp-ep-dp-pp", None, False)
    assert got["intra_dp_cp"] == mine(expected["intra_dp_cp"], 5) == [0, 1, 2, 3, 4, 5]
    # Not adjacent (tp between cp and dp): groups of their own, made by enumeration.
    args = (24, 2, 1, 4, 1, 2, 1, 1, 2, "cp-tp-dp-ep-pp")
    assert accepted(*args, None)
    got = _fields_at(5, 24, tp=2, cp=4, order="cp-tp-dp-ep-pp", distributed_optimizer_instances=2)
    assert got["intra_dp_cp"] == mine(reference(*args, None, False)["intra_dp_cp"], 5) == [4, 5, 6, 7, 12, 13]


# -- errors, before any communication ---------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "phrase"),
    [
        (dict(tp=3), GridSpecError, "cannot infer"),
        (dict(tp=0), GridSpecError, "tp must be a positive int, got 0"),
        (dict(tp=2, order="cp-dp-pp"), GridSpecError, r"leaves out \['tp'\]"),
        (dict(ep=3), GridSpecError, "does not divide the 8 ranks"),
        (dict(pp=2, cp=2, order="tp-cp-ep-pp-dp"), GridSpecError, "does not end with pp"),
        (dict(distributed_optimizer_instances=3), GridSpecError, "does not divide dp\\*cp = 8"),
        (dict(distributed_optimizer_instances=2, gtp_remat=2), GridSpecError, "without weight rematerialisation"),
        (dict(cp=4, hierarchical_cp=[2, 3]), GridSpecError, r"hierarchical_cp=\[2, 3\] must multiply to .* 4"),
        (dict(cp=4, hierarchical_cp=4), GridSpecError, "hierarchical_cp must be a list of positive ints, .* got 4"),
        (dict(distributed_optimizer_instances=0), GridSpecError, "distributed_optimizer_instances must be a positive"),
        (dict(order="tp-xp"), Exception, "'xp'"),
        (dict(strategi="local"), UnexpectedArgumentError, "strategi"),
    ],
)
def test_sizes_megatron_refuses_raise_before_any_group(
    world8: None, kwargs: dict[str, Any], error: type[Exception], phrase: str
) -> None:
    created: list[Any] = []
    real = dist.new_subgroups_by_enumeration
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dist, "new_subgroups_by_enumeration", lambda *a, **k: created.append(1) or real(*a, **k))
        with pytest.raises(error, match=phrase):
            process_groups(**kwargs)
    assert created == []


def test_needs_an_initialized_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(NotInitializedError, match="init_process_group") as error:
        process_groups(tp=2)
    assert isinstance(error.value, RuntimeError)


def test_grid_form_refuses_sizes_and_keeps_working(world8: None) -> None:
    grid = HyperCommGrid([2, 1, 2, 2], ["tp", "cp", "dp", "pp"])
    with pytest.raises(UnexpectedArgumentError, match=r"\['pp', 'tp'\] belong to the one-call form"):
        process_groups(grid, tp=2, pp=2)
    pgs = process_groups(grid)  # no expert view: Megatron's (ep 1, etp = tp), so DDP needs no fallback
    assert members(pgs.expt_dp) == members(pgs.dp_cp) == [1, 3] and members(pgs.ep) == [3]
    assert members(pgs.intra_dist_opt) == list(range(8)) and pgs.gtp_remat is pgs.cp  # single-rank families
    assert "megatron.expert" in grid._views
    destroy_process_groups(pgs)


def test_setup_model_state_needs_megatron(world8: None) -> None:
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("megatron-core is installed: make test-megatron tests setup_model_state itself")
    with pytest.raises(DependencyError, match="needs megatron-core") as error:
        setup_model_state(object(), seed=1)
    assert isinstance(error.value, ImportError)


def test_field_tables_cover_megatrons_fields() -> None:
    from hypergrid.compat.megatron_fields import DENSE_FAMILIES, EXPERT_FAMILIES, SAME_WHEN_UNIT

    built_elsewhere = {"embd", "pos_embd", "hcp", "dp_cp_ag", "expt_dp_ag", "intra_dp_cp", "intra_expt_dp",
                       "inter_dist_opt", "intra_dist_opt"}  # fmt: skip
    tables = set(DENSE_FAMILIES) | set(EXPERT_FAMILIES) | set(SAME_WHEN_UNIT) | built_elsewhere
    assert tables == set(PG_FIELDS) and len(PG_FIELDS) == 27
    assert list(itertools.chain(PG_FIELDS)) == [f.name for f in __import__("dataclasses").fields(collection_class())]
