"""Bad input: each case raises the documented exception, and its message names the value."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hypergrid import (
    BackendError,
    DimsError,
    GridLayout,
    GridSpecError,
    HyperCommGrid,
    HyperGridError,
    RankError,
    UnexpectedArgumentError,
)

# (shape, dim_names, rank_offset, text the message must contain)
BAD_GRIDS: list[tuple[Any, Any, Any, str]] = [
    ([2, 2], ["tp"], 0, "['tp']"),  # length mismatch
    ([2], ["tp", "dp"], 0, "['tp', 'dp']"),
    ([2, 2], ["tp", "tp"], 0, "'tp'"),  # duplicate
    ([2], [""], 0, "''"),  # empty name
    ([2], [3], 0, "3"),  # non-string name
    ([2], [None], 0, "None"),
    ([2], ["t-p"], 0, "'t-p'"),  # would break keys
    ([2], ["for"], 0, "'for'"),  # keyword: cannot be a keyword argument
    ([2], ["_tp"], 0, "'_tp'"),
    ([0], ["tp"], 0, "0"),  # sizes
    ([-2], ["tp"], 0, "-2"),
    ([2.0], ["tp"], 0, "2.0"),
    ([True], ["tp"], 0, "True"),
    ([None], ["tp"], 0, "None"),
    (["2"], ["tp"], 0, "'2'"),
    ([], [], 0, "empty"),
    ("22", ["tp", "dp"], 0, "'22'"),  # shape as a string
    (None, ["tp"], 0, "None"),
    (2, ["tp"], 0, "2"),
    ([2], "tp", 0, "'tp'"),  # names as a string
    ([2], ["tp"], -1, "-1"),  # offsets
    ([2], ["tp"], 1.5, "1.5"),
    ([2], ["tp"], None, "None"),
    ([2], ["tp"], True, "True"),
    ([2**20, 2**20, 2**20], ["a", "b", "c"], 0, "1152921504606846976"),  # 2**60: too many ranks
    ([2**40], ["a"], 0, "1099511627776"),
    ([2**31 - 1], ["a"], 1, "2147483648"),  # fits alone, not after the offset
    ([2**62, 2**62, 4], ["a", "b", "c"], 0, "2147483647"),  # a size no world holds (the product overflows int64)
]


@pytest.mark.parametrize(("shape", "names", "offset", "text"), BAD_GRIDS)
@pytest.mark.parametrize("build", [GridLayout, HyperCommGrid], ids=["layout", "grid"])
def test_bad_grid_is_refused_naming_the_value(build: Any, shape: Any, names: Any, offset: Any, text: str) -> None:
    with pytest.raises(GridSpecError) as error:
        build(shape, names, offset)
    assert text in str(error.value)


def test_numpy_ints_are_accepted() -> None:
    layout = GridLayout(np.array([2, 3]), ["tp", "dp"], np.int64(2))
    assert layout.shape == (2, 3) and layout.rank_offset == 2
    assert all(type(size) is int for size in layout.shape)


LAYOUT = GridLayout([2, 2, 2], ["tp", "cp", "dp"])

# (dims, text the message must contain)
BAD_DIMS: list[tuple[Any, str]] = [
    ("xp", "'xp'"),  # unknown
    (["tp", "xp"], "'xp'"),
    (["tp", "tp"], "'tp'"),  # repeated
    ("tp-tp", "'tp'"),
    ([], "[]"),  # empty
    ("", "''"),
    ((), "()"),
    (None, "None"),
    (3, "3"),
    ([3], "3"),
    ({"tp"}, "{'tp'}"),
    ("TP", "'TP'"),  # names are case-sensitive
]


@pytest.mark.parametrize(("dims", "text"), BAD_DIMS)
@pytest.mark.parametrize(
    "call",
    ["rank_enum", "key", "group_size", "num_groups", "canonical_dims", "group_ranks", "group_index"],
)
def test_bad_dims_are_refused_naming_the_value(call: str, dims: Any, text: str) -> None:
    method = getattr(LAYOUT, call)
    args = (dims, 0) if call in ("group_ranks", "group_index") else (dims,)
    with pytest.raises(DimsError) as error:
        method(*args)
    assert text in str(error.value)
    assert "tp" in str(error.value)  # the valid choices are listed, or the bad name quoted


@pytest.mark.parametrize(("rank", "text"), [(8, "8"), (-1, "-1"), (2.0, "2.0"), ("1", "'1'"), (None, "None")])
def test_bad_rank_is_refused(rank: Any, text: str) -> None:
    with pytest.raises(RankError) as error:
        LAYOUT.coords_of(rank)
    assert text in str(error.value)
    with pytest.raises(RankError):
        LAYOUT.group_ranks("tp", rank)


@pytest.mark.parametrize(
    ("coords", "text"),
    [((0, 0), "(0, 0)"), ((0, 0, 2), "dp=2"), ((0, -1, 0), "cp=-1"), ((0.0, 0, 0), "tp=0.0"), ("000", "'000'")],
)
def test_bad_coords_are_refused(coords: Any, text: str) -> None:
    with pytest.raises(RankError) as error:
        LAYOUT.rank_of(coords)
    assert text in str(error.value).replace("[", "(").replace("]", ")")


def test_bad_vectorized_input_is_refused() -> None:
    with pytest.raises(RankError, match="rank 9"):
        LAYOUT.coords_array([0, 9])
    with pytest.raises(RankError, match="ints"):
        LAYOUT.coords_array([0.5])
    with pytest.raises(RankError, match=r"\[0, 5, 0\]"):
        LAYOUT.ranks_array([[0, 5, 0]])


def test_bad_dim_size_lookup() -> None:
    with pytest.raises(DimsError, match="'pp'"):
        LAYOUT.dim_size("pp")


@pytest.mark.parametrize("backend", [3, "", ["gloo"]])
def test_bad_backend_is_refused(backend: Any) -> None:
    with pytest.raises(BackendError) as error:
        HyperCommGrid([2], ["dp"], backend=backend)
    assert repr(backend) in str(error.value)


def test_create_pg_kwargs_are_checked_before_anything_else() -> None:
    grid = HyperCommGrid([2], ["dp"], backend="gloo")
    with pytest.raises(BackendError, match=r"'nccl'.*'gloo'"):
        grid.create_pg("dp", backend="nccl")
    with pytest.raises(UnexpectedArgumentError, match="ranks"):
        grid.create_pg("dp", ranks=[0, 1])


def test_every_error_is_a_hypergrid_error_and_a_builtin() -> None:
    for error_type, builtin in [(GridSpecError, ValueError), (DimsError, ValueError), (RankError, ValueError)]:
        assert issubclass(error_type, HyperGridError) and issubclass(error_type, builtin)


def test_layout_is_immutable() -> None:
    with pytest.raises(AttributeError, match="immutable"):
        LAYOUT.shape = (4,)  # type: ignore[misc]
