"""One rule for arguments, walked over the whole public surface (issue 25, item 1).

Every public function and method, with one argument at a time made hostile:
a ``HyperGridError`` whose message is one line naming the call, and no torch
call (no communication, no group, no process, no store), in a one-rank gloo
world. The table is `tests.project.hostile` (``python -m tests.project.hostile``
counts it); hypothesis draws the hostile values, the table's fixed ones are
tried each.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.project import hostile

SURFACE = json.loads(pathlib.Path(__file__).with_name("public_surface.json").read_text())


@pytest.fixture(scope="module")
def table(one_rank_world_module: None) -> list[hostile.Entry]:
    return hostile.entries()


def _covered(table: list[hostile.Entry]) -> list[hostile.Entry]:
    """The entries the drawn values go into: the core's and the adapters' (parameters in ``pending`` left out)."""
    return [entry for entry in table if entry.owner in ("core", "compat") and set(entry.kwargs) - set(entry.pending)]


def test_the_table_covers_the_public_surface(table: list[hostile.Entry]) -> None:
    named = {entry.name.rpartition(".")[2] for entry in table} | {entry.name for entry in table}
    # Callables that take nothing hostile: no arguments, result records, exceptions, predicates by design.
    no_arguments = {"abort", "communicators", "destroy", "is_current_rank_in_grid", "my_coord", "release_spares",
                    "all_families", "rank_array", "default_device", "world_size_hint", "collection_class",
                    "hypergrid_grid"}  # fmt: skip
    # Command lines: their rule is the CLI's (status 2, one line), tested with them (tests/launch/test_run_health.py).
    no_arguments |= {"main"}
    records = {
        "Regrid",
        "LoopResult",
        "WorkerDeath",
        "Plan",
        "Span",
        "PipelineParallelGrid",
        "ProcessGroupCollection",
        "Dims",
    }
    predicates = {"contains", "as_int", "as_number", "is_int", "shown", "first_line", "described", "_prime_factors"}
    missing = []
    for qualname, members in SURFACE["classes"].items():
        cls = qualname.rpartition(".")[2]
        for member in members:
            public = callable(getattr(_class(qualname), member, None)) and member not in no_arguments | predicates
            if public and f"{cls}.{member}" not in named:
                missing.append(f"{cls}.{member}")
    for module, names in SURFACE["modules"].items():
        mod = __import__(module, fromlist=["_"])
        for name in names:
            value = getattr(mod, name)
            if (isinstance(value, type) and issubclass(value, BaseException)) or not callable(value):
                continue
            if name not in named and name not in no_arguments | records | predicates:
                missing.append(f"{module}.{name}")
    assert not missing, f"public callables with no hostile cases: {missing}"


def _class(qualname: str) -> Any:
    module, _, name = qualname.rpartition(".")
    return getattr(__import__(module, fromlist=["_"]), name)


@pytest.mark.parametrize("owner", ["core", "mesh", "lead", "compat"])
def test_every_fixed_hostile_value_is_refused_cleanly(table: list[hostile.Entry], owner: str) -> None:
    failures = []
    for case in (case for case in hostile.cases(table) if case.owner == owner):
        kind, detail = hostile.outcome(case.entry, case.parameter, hostile.HOSTILE[case.label])
        if kind != "clean":
            failures.append(f"{kind} {case.entry.name}({case.parameter}={case.label}): {detail}")
    assert not failures, f"{len(failures)} hostile calls not refused cleanly:\n" + "\n".join(failures[:40])


# -- drawn values: each kind is invalid for every argument that does not list its label as valid ----------------

_HUGE = st.one_of(st.integers(min_value=2**1100), st.integers(max_value=-(2**1100)))  # beyond a float and a rank
_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "huge int": _HUGE,
    "nan": st.sampled_from([float("nan"), float("inf"), -float("inf"), np.float64("nan")]),
    "complex": st.complex_numbers(min_magnitude=1, allow_nan=False).filter(lambda z: z.imag != 0),
    "bytes": st.binary(min_size=1, max_size=16),
    "object": st.builds(object),
    "lambda": st.just(lambda: None),
    "list of a huge int": st.lists(st.one_of(_HUGE, st.builds(object)), min_size=1, max_size=4),
    "dict": st.dictionaries(st.text(max_size=4), st.builds(object), min_size=1, max_size=3),
    "long string": st.text(min_size=257, max_size=400).map(lambda text: text + "\n"),
    "numpy array": st.builds(np.zeros, st.tuples(st.integers(2, 4), st.integers(2, 4))),
    "tensor": st.builds(torch.zeros, st.integers(2, 5)),
}


@st.composite
def _hostile_call(draw: st.DrawFn, entries: list[hostile.Entry]) -> tuple[hostile.Entry, str, Any]:
    entry = draw(st.sampled_from(entries))
    parameter = draw(st.sampled_from([name for name in entry.kwargs if name not in entry.pending]))
    allowed = entry.skip.get(parameter, set()) | hostile._valid_by_annotation(entry, parameter)
    kinds = [kind for kind in _KINDS if kind not in allowed]
    value = draw(st.one_of(*(_KINDS[kind] for kind in kinds)))
    return entry, parameter, value


_TABLE: list[hostile.Entry] = []


@pytest.mark.usefixtures("one_rank_world_module")
@settings(max_examples=400)
@given(data=st.data())
def test_drawn_hostile_values_are_refused_cleanly(data: st.DataObject) -> None:
    if not _TABLE:
        _TABLE.extend(_covered(hostile.entries()))
    entry, parameter, value = data.draw(_hostile_call(_TABLE))
    kind, detail = hostile.outcome(entry, parameter, value)
    assert kind == "clean", f"{kind} {entry.name}({parameter}={hostile._short(ValueError(repr(value)))}): {detail}"
