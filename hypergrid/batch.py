"""Guarded creation: the one guard round behind each ``create_pg`` or ``create_pgs`` call.

``HyperCommGrid`` (the registry) decides what to create; this mixin orders a
batch of families canonically and runs the consistency guard
(``hypergrid.guard``) once for the whole batch, with every family's key and
options in one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from hypergrid.errors import DimsError
from hypergrid.facet import GridFacet
from hypergrid.guard import CreationRequest, GuardLedger, agree, members_scope, world_scope
from hypergrid.layout import Dims, GridLayout
from hypergrid.registry import PgKey, guard_key

if TYPE_CHECKING:
    from hypergrid.views import RankView

__all__ = ["GuardedCreation"]

_TIMES = "\u00d7"  # the multiplication sign (U+00D7) between the dims of a grid's short name

#: One family of a batch: its registry key, the layout that enumerates it, its dims in canonical order.
Plan = tuple[PgKey, GridLayout, tuple[str, ...]]


class GuardedCreation(GridFacet):
    """Batch ordering and the guard round of a creation (a mixin of ``HyperCommGrid``)."""

    if TYPE_CHECKING:  # provided by HyperCommGrid
        guard_progress_s: float
        _creations: int
        _guard_ledger: GuardLedger

        def _family(self, dims: Dims, view: str | None) -> tuple[PgKey, GridLayout, RankView]: ...

    def _batch(self, dims_list: object, view: str | None) -> list[Dims]:
        """The families of ``dims_list`` in canonical order (fewest dims first); refuses empty lists and repeats."""
        if isinstance(dims_list, (str, bytes)) or not isinstance(dims_list, (list, tuple)):
            raise DimsError(
                f"create_pgs takes a list of dims (each a dim name, a key like 'dp-tp' or a list of names), "
                f"got {dims_list!r}"
            )
        if not dims_list:
            raise DimsError("create_pgs needs at least one family, got an empty list")
        seen: dict[PgKey, Dims] = {}
        order: dict[PgKey, tuple[int, int]] = {}
        for dims in dims_list:
            key, _, spec = self._family(dims, view)
            if key in seen:
                raise DimsError(
                    f"create_pgs got {seen[key]!r} and {dims!r}, which name the same family {key!r}; "
                    "list each family once"
                )
            seen[key] = dims
            mask = sum(1 << index for index in spec.layout.dim_indices(dims))
            order[key] = (bin(mask).count("1"), mask)
        return [seen[key] for key in sorted(seen, key=lambda key: order[key])]

    def _describe(self) -> str:
        """The grid in a few characters: ``tp2``, ``dp4`` joined by U+00D7 (``name=size`` after a final digit)."""
        sizes = (
            f"{name}={size}" if name[-1].isdigit() else f"{name}{size}"
            for name, size in zip(self.dim_names, self.shape)
        )
        text = _TIMES.join(sizes)
        if self.rank_offset:
            text += f" from rank {self.rank_offset}"
        return text if self.backend is None else f"{text} ({self.backend})"

    def _guard_round(
        self,
        plans: Sequence[Plan],
        strategy: str,
        options: tuple[tuple[str, str], ...],
        held_groups: int | None,
        member: int | None,
    ) -> None:
        """Count the creation and (guard on) agree on it with the ranks that take part, in one round.

        ``member``: for ``"local"``, the calling rank when it is in the grid
        (the participants are its group over all the batch's dims of one
        layout); ``None`` otherwise.
        """
        sequence = self._creations
        self._creations += 1
        if not self.guard:
            return
        options = (*options, ("guard_timeout_s", f"{self.guard_timeout_s:g}"))
        rounds: list[tuple[Sequence[int], Any, Sequence[Plan]]] = []
        if strategy == "local":
            if member is None:
                return  # outside the grid: this rank creates nothing and takes part in nothing
            by_layout: dict[int, list[Plan]] = {}
            for plan in plans:
                by_layout.setdefault(id(plan[1]), []).append(plan)
            for same_layout in by_layout.values():
                dims = sorted({name for _, _, ordered in same_layout for name in ordered})
                members: Sequence[int] = same_layout[0][1].group_ranks(dims, member)
                rounds.append((members, members_scope(members), same_layout))
        else:
            rounds.append((range(dist.get_world_size()), world_scope(), plans))
        for participants, scope, batch in rounds:
            request = CreationRequest(
                grid=self._describe(),
                keys=tuple(guard_key(key) for key, _, _ in batch),
                strategy=strategy,
                grid_sequence=sequence,
                held_groups=held_groups,
                options=options,
            )
            agree(request, participants, scope, self.guard_timeout_s, self.guard_progress_s, self._guard_ledger)
