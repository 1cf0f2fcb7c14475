"""A shrink's successor grid: the old grid's settings and views on the new shape, and its families again.

`successor` builds the new grid (no group yet) for a shrink's plan, its views scaled along the shrunk dim (a view
that cannot follow is refused before anything is torn down); `recreate` creates the old grid's families on it once
the new world formed, with no guard round (the shrink's agreement compared them).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.binding.facet import FacetCore
from hypergrid.binding.failures import communicate
from hypergrid.binding.registry import PgKey, guard_key
from hypergrid.binding.worldsize import planned_world
from hypergrid.errors import GridSpecError
from hypergrid.grid.batch import create_families
from hypergrid.launch.processes import default_device
from hypergrid.layout.shrink import ShrinkPlan

__all__ = ["Recreation", "held_by_all", "recreate", "successor"]

#: A recreation (one family to re-create): its key, and what ``create_families`` needs (dims, view, tag, kwargs).
Recreation = tuple[PgKey, dict[str, Any]]


def successor(root: Any, plan: ShrinkPlan) -> Any:
    """The new grid (no group yet) with ``root``'s settings and views, for a shrink's ``plan``."""
    with planned_world(len(plan.order)) if plan.order else contextlib.nullcontext():  # (it may grow: `grow`)
        # Built without spares, then given the plan's: the rule on spares (a replica dim of size 2 or more) is the
        # user's grid's, and a shrink that dropped a replica slice may leave spares waiting (policy "drop").
        new = type(root)(
            list(plan.shape), root.dim_names, plan.rank_offset, **{**root._core.init_kwargs(), "spares": 0}
        )
        new.spares = plan.spares
    new._core.inherit_origin(root._core.origin)
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


def held_by_all(families: Sequence[Recreation], alarm: Any, number: int) -> list[Recreation]:
    """The families to re-create in world ``number`` on a ``"local"`` grid: those every member holds.

    Members-only creation commits each group alone: a death while one group was made rolls the family back on
    that group's members, and the other groups keep it. Such a grid's survivors agree on the dead without
    comparing families (`hypergrid.grid.recovery.families_digest`), and here keep the families all of them hold,
    in their order: one all-reduce (MAX, the longest list) and one all-gather of a 60-bit hash per family, over
    the new world (``alarm``: its alarm). Any other grid's families were compared already (its failed creations
    roll back on every rank).
    """
    device = default_device()
    hashes = [
        int(hashlib.sha1(guard_key(key).encode(), usedforsecurity=False).hexdigest()[:15], 16) for key, _ in families
    ]
    longest = torch.tensor([len(hashes)], dtype=torch.int64, device=device)
    what = f"shrink: the families of world {number}"
    communicate(alarm, what, dist.all_reduce, longest, op=dist.ReduceOp.MAX)
    if not longest.item():
        return []
    mine = torch.full((int(longest.item()),), -1, dtype=torch.int64, device=device)
    mine[: len(hashes)] = torch.tensor(hashes, dtype=torch.int64, device=device)
    held = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    communicate(alarm, what, dist.all_gather, held, mine)
    common = set.intersection(*(set(each.tolist()) for each in held))
    return [family for family, value in zip(families, hashes) if value in common]
