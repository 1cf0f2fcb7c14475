"""hypergrid's families equal each seed system's, computed by independent references.

How each seed maps onto a grid (``dim_names`` innermost first):

- seed 000 (tp/pp/dp loops): ``[tp, pp, dp]``.
- seed 001 (nanotron, array ``(ep, pp, dp, cp, tp)``): ``[tp, cp, dp, pp, ep]``; nanotron
  orders its groups by cyclic transposes, so families match as sets of groups with
  identical member order, and exactly where nanotron's order is the canonical one.
- seed 002 (ezpz/fairscale, array ``(dp, pp, cp, tp)``): ``[tp, cp, pp, dp]``.
- Megatron ``RankGenerator``: ``order="tp-cp-ep-dp-pp"`` is ``dim_names`` as written.
- seed 004 (DeepSpeed ``ProcessTopology``, last axis fastest): ``dim_names`` = axes reversed.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hypergrid.layout import GridLayout
from tests.references import (
    deepspeed_axis_comm_lists,
    deepspeed_get_coord,
    ezpz_groups,
    megatron_rank_groups,
    nanotron_groups,
    seed000_groups,
)
from tests.strategies import dims_of

sizes = st.integers(1, 4)


@given(sizes, sizes, sizes)
def test_seed000_triple_loops(tp: int, pp: int, dp: int) -> None:
    layout = GridLayout([tp, pp, dp], ["tp", "pp", "dp"])
    for name, groups in seed000_groups(tp, pp, dp).items():
        assert layout.rank_enum(name) == groups


def test_seed000_docstring_example() -> None:
    layout = GridLayout([2, 2, 2], ["tp", "pp", "dp"])
    assert layout.rank_enum("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.rank_enum("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.rank_enum("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


NANOTRON_FAMILIES = {
    "tp": ["tp"],
    "cp": ["cp"],
    "dp": ["dp"],
    "pp": ["pp"],
    "ep": ["ep"],
    "mp": ["ep", "pp", "tp"],
    "dp_cp": ["dp", "cp"],
    "tp_and_ep": ["ep", "tp"],
}


@given(sizes, sizes, sizes, sizes, sizes)
def test_seed001_nanotron_cyclic_transposes(ep: int, pp: int, dp: int, cp: int, tp: int) -> None:
    layout = GridLayout([tp, cp, dp, pp, ep], ["tp", "cp", "dp", "pp", "ep"])
    reference = nanotron_groups(ep, pp, dp, cp, tp)
    for name, dims in NANOTRON_FAMILIES.items():
        ours = layout.rank_enum(dims)
        assert sorted(ours) == sorted(reference[name]), name
    # tp is the identity transpose: nanotron's group order is the canonical one.
    assert layout.rank_enum("tp") == reference["tp"]


@given(sizes, sizes, sizes, sizes)
def test_seed002_ezpz_loops(tp: int, pp: int, cp: int, dp: int) -> None:
    layout = GridLayout([tp, cp, pp, dp], ["tp", "cp", "pp", "dp"])
    for name, groups in ezpz_groups(tp, pp, cp, dp).items():
        assert layout.rank_enum(name) == groups


def test_seed002_docstring_example_16_gpus() -> None:
    layout = GridLayout([2, 2, 2, 2], ["tp", "cp", "pp", "dp"])
    assert layout.rank_enum("dp") == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    assert layout.rank_enum("cp") == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]


@given(st.data())
def test_megatron_order_string(data: st.DataObject) -> None:
    names = ["tp", "cp", "ep", "dp", "pp"]
    shape = [data.draw(sizes) for _ in names]
    order = data.draw(st.permutations(names))
    layout = GridLayout([shape[names.index(n)] for n in order], list(order))
    token = data.draw(dims_of(list(order)))
    expected = megatron_rank_groups("-".join(order), dict(zip(names, shape)), "-".join(token))
    assert layout.rank_enum(token) == expected


def test_megatron_spec_example_world_120() -> None:
    # HyperCommGrid([2,3,4,5], [tp,cp,pp,dp]) == initialize_model_parallel(2, cp=3, pp=4, order=tp-cp-pp-dp)
    layout = GridLayout([2, 3, 4, 5], ["tp", "cp", "pp", "dp"])
    sizes_ = {"tp": 2, "cp": 3, "pp": 4, "dp": 5}
    for family in layout.all_families():
        assert layout.rank_enum(family) == megatron_rank_groups("tp-cp-pp-dp", sizes_, "-".join(family))


def test_reference_md_example() -> None:
    layout = GridLayout([2, 2, 2], ["a", "b", "c"])
    assert layout.rank_enum(["a", "b"]) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.rank_enum(["a", "c"]) == [[0, 1, 4, 5], [2, 3, 6, 7]]


@given(st.data())
def test_seed004_deepspeed_axes_reversed(data: st.DataObject) -> None:
    ndim = data.draw(st.integers(1, 4))
    axes = data.draw(st.permutations(["pipe", "data", "model", "expert"]))[:ndim]
    dims = [data.draw(sizes) for _ in axes]
    layout = GridLayout(dims[::-1], axes[::-1])
    for axis in axes:
        assert layout.rank_enum(axis) == deepspeed_axis_comm_lists(axes, dims, axis)
    rank = data.draw(st.integers(0, layout.size - 1))
    coord = deepspeed_get_coord(axes, dims, rank)
    assert dict(zip(layout.dim_names, layout.coords_of(rank))) == coord


def test_seed004_docstring_example() -> None:
    layout = GridLayout([2, 2, 2], ["model", "data", "pipe"])
    assert layout.rank_enum("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
