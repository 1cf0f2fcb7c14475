"""Any field of the guard's request that differs between ranks is named in the mismatch (property test).

The request is what decides membership, sharing and creation; the reference
for "which field differs" is the dataclass's own field list, changed one field
(or one setting/option) at a time.
"""

from __future__ import annotations

import dataclasses
import inspect

from hypothesis import given
from hypothesis import strategies as st

from hypergrid import HyperCommGrid
from hypergrid.agreement.request import CreationRequest, mismatch_verdict
from hypergrid.grid.settings import LOCAL_SETTINGS, settings

NAMES = st.sampled_from(["tp", "cp", "dp", "ep", "pp", "dp-tp", "expert:ep"])
TEXT = st.text(alphabet="abcdefgh0123456789=.'", min_size=1, max_size=6)
PAIRS = st.lists(st.tuples(st.sampled_from(["timeout", "backend", "share_groups", "strategy"]), TEXT), max_size=3)

requests = st.builds(
    CreationRequest,
    grid=st.sampled_from(["tp2\u00d7dp4", "tp4\u00d7dp2"]),
    keys=st.lists(NAMES, min_size=1, max_size=3, unique=True).map(tuple),
    strategy=st.sampled_from(["enumerate", "local", "split"]),
    grid_sequence=st.integers(0, 50),
    held_groups=st.none() | st.integers(0, 9),
    options=PAIRS.map(lambda pairs: tuple(dict(pairs).items())),
    grid_ordinal=st.integers(0, 3),
    epoch=st.integers(0, 3),
    settings=PAIRS.map(lambda pairs: tuple(dict(pairs).items())),
    views=st.lists(TEXT, max_size=2).map(tuple),
    reuses=st.lists(st.sampled_from(["", "tp", "dp"]), max_size=3).map(tuple),
)
FIELDS = [item.name for item in dataclasses.fields(CreationRequest)]


def _changed(request: CreationRequest, name: str, data: st.DataObject) -> tuple[CreationRequest, str]:
    """``request`` with field ``name`` changed (for options/settings: one entry), and the name to expect."""
    if name in ("options", "settings"):
        pairs = dict(getattr(request, name))
        key = data.draw(st.sampled_from(sorted({*pairs, "group_desc"})))
        pairs[key] = pairs.get(key, "") + "x"
        return dataclasses.replace(request, **{name: tuple(pairs.items())}), key
    value = getattr(request, name)
    if isinstance(value, bool) or value is None:
        new: object = 1 if value is None else None
    elif isinstance(value, int):
        new = value + 1
    elif isinstance(value, tuple):
        new = (*value, "extra") if name != "keys" else (*value, "zz")
    else:
        new = value + "x"
    return dataclasses.replace(request, **{name: new}), name


@given(requests, st.sampled_from(FIELDS), st.data())
def test_a_request_differing_in_one_field_is_a_mismatch_naming_that_field(
    request: CreationRequest, name: str, data: st.DataObject
) -> None:
    other, expected = _changed(request, name, data)
    assert other != request and other.digest != request.digest
    digests = {0: request.digest, 1: other.digest, 2: request.digest}
    verdict = mismatch_verdict(3, digests, {request.digest: request.encoded, other.digest: other.encoded})
    assert verdict.kind in ("mismatch", "outofstep")
    differ = verdict.message.rsplit("They differ in: ", 1)[1].split(".")[0].split(", ")
    assert expected in differ, (expected, verdict.message)
    assert sorted(verdict.about) == sorted({request.digest, other.digest})


def test_every_constructor_setting_takes_part_in_the_request_or_is_declared_local() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    taking_part = {name for name, _ in settings(grid)}  # what guarded creation puts in the request
    parameters = set(inspect.signature(HyperCommGrid).parameters) - {"shape", "dim_names", "rank_offset"}
    assert taking_part == parameters - LOCAL_SETTINGS
    assert parameters >= LOCAL_SETTINGS  # nothing declared local that does not exist
