"""A shrink's successor grid: the old grid's settings and views on the new shape, and its families again.

`successor` builds the new grid (no group yet) for a shrink's plan, its views scaled along the shrunk dim (a view
that cannot follow is refused before anything is torn down); `recreate` creates the old grid's families on it once
the new world formed, with no guard round (the shrink's agreement compared them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypergrid.binding.facet import FacetCore
from hypergrid.binding.registry import PgKey
from hypergrid.errors import GridSpecError
from hypergrid.grid.batch import create_families
from hypergrid.layout.shrink import ShrinkPlan

__all__ = ["Recreation", "recreate", "successor"]

#: A recreation (one family to re-create): its key, and what ``create_families`` needs (dims, view, tag, kwargs).
Recreation = tuple[PgKey, dict[str, Any]]


def successor(root: Any, plan: ShrinkPlan) -> Any:
    """The new grid (no group yet) with ``root``'s settings and views, for a shrink's ``plan``."""
    new = type(root)(
        list(plan.shape), root.dim_names, plan.rank_offset, **{**root._core.init_kwargs(), "spares": plan.spares}
    )
    for name, view in root._core.registry.views.items():
        if name == "base":
            continue
        shape = list(view.shape)
        if tuple(plan.shape) != tuple(root.shape):
            shape = _shrunk_view_shape(root, name, view, plan)
        new.register_view(name, shape, view.dim_names, view.shared_dims)
    return new


def _shrunk_view_shape(root: Any, name: str, view: Any, plan: ShrinkPlan) -> list[int]:
    """A view's shape once the grid lost slices of one dim: that dim (if the view has it) shrinks alike."""
    (index,) = [i for i, (old, new) in enumerate(zip(root.shape, plan.shape)) if old != new]
    dim, old, new = root.dim_names[index], root.shape[index], plan.shape[index]
    shape = list(view.shape)
    if dim not in view.dim_names or (shape[view.dim_names.index(dim)] * new) % old:
        raise GridSpecError(
            f"shrink: view {name!r} {view.shape} {view.dim_names} cannot follow the grid's {dim!r} from {old} to "
            f"{new}: it has no dim {dim!r} whose size scales to a whole number; a view must cover the new grid"
        )
    shape[view.dim_names.index(dim)] = shape[view.dim_names.index(dim)] * new // old
    return shape


def recreate(core: FacetCore, families: Sequence[Recreation], bound_s: float) -> None:
    """Create ``families`` again on a successor grid's core, in their order (the shrink's agreement compared them:
    no guard round). torch waits at most ``bound_s`` for the other members of each group (a death there fails
    the creation instead of hanging it)."""
    for _, spec in families:
        dims, view, tag, kwargs = spec["dims"], spec["view"], spec["tag"], dict(spec["kwargs"])
        create_families(core, [dims], view, None, tag, kwargs, "shrink", bound_s=bound_s, guarded=False)
