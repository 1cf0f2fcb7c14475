"""``Coord`` values cross processes: pickle, copy and deepcopy give equal values of the same type."""

from __future__ import annotations

import copy
import pickle

import pytest

from hypergrid import GridLayout, HyperCommGrid
from hypergrid.layout.coordinates import coord_type

LAYOUTS = [GridLayout([2, 3, 4], ["tp", "cp", "dp"]), GridLayout([8], ["pp"], rank_offset=8)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
@pytest.mark.parametrize(
    "trip",
    [
        lambda c: pickle.loads(pickle.dumps(c)),
        lambda c: pickle.loads(pickle.dumps(c, protocol=0)),
        copy.copy,
        copy.deepcopy,
    ],
    ids=["pickle", "pickle-protocol-0", "copy", "deepcopy"],
)
def test_every_coordinate_survives_the_round_trip(layout: GridLayout, trip: object) -> None:
    for rank in range(layout.rank_offset, layout.rank_offset + layout.size):
        coord = layout.coord_of(rank)
        back = trip(coord)  # type: ignore[operator]
        assert back == coord == layout.coords_of(rank)  # equal to the plain tuple
        assert type(back) is type(coord)
        assert back._fields == layout.dim_names
        assert repr(back) == repr(coord)


def test_one_type_per_tuple_of_names() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    assert type(grid.coord_of(3)) is type(GridLayout([4, 1], ["tp", "dp"]).coord_of(0)) is coord_type(["tp", "dp"])
    assert type(grid.coord_of(3)) is not type(GridLayout([2, 2], ["dp", "tp"]).coord_of(0))
    assert pickle.loads(pickle.dumps([grid.coord_of(r) for r in range(4)])) == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_a_grid_without_views_does_not_mention_views() -> None:
    from hypergrid import DimsError

    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    with pytest.raises(DimsError) as error:
        grid.get_rank_enum("xp")
    assert "view" not in str(error.value) and "'xp'" in str(error.value) and "['tp', 'dp']" in str(error.value)
    grid.view([4], ["ep"])
    with pytest.raises(DimsError, match="'xp' is not in view 'base'"):
        grid.get_rank_enum("xp")
