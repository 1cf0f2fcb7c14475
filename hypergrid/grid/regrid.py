"""``Regrid``: what a shrink returns — the new grid, this rank's place in it, and how the ranks moved."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Phases", "Regrid"]


@dataclass(frozen=True)
class Regrid:
    """What ``shrink`` (or a drafted spare's ``standby``) returns: the new grid and how the ranks moved.

    Attributes:
        grid: the new grid (``None`` on a retired rank).
        rank: this process's rank in the new world (``None`` when retired).
        epoch: the new world's number (the job's first world is 0).
        dead: the old world's dead ranks, sorted.
        retired: this process left the world (the rest of a slice ``"drop"`` removed); it may exit.
        old_to_new: old rank -> new rank, for every rank of the new world.
        source: new rank of each spare that took over a dead rank's coordinates -> an old rank, alive,
            with the same coordinates on every dim but the shrink's ``dim`` (it holds the same model
            shard): copy state from ``old_to_new[source[new]]``, e.g. with `broadcast_from_sources`.
        policy: what was applied: ``"drop"`` or ``"spares"``.
        dim: the replica dim of the shrink.
        seconds: how long this rank spent in each phase of the shrink: ``agreement``, ``abort``,
            ``world`` (the default group re-formed), ``families`` (re-created), ``step`` (the step agreed,
            replicas brought to it) and ``commit`` (every survivor has them), each of the last attempt; an
            attempt that failed (a death while the new world formed) adds a line of its own.
        attempts: how many worlds were formed until one held (1 unless a rank died during the shrink).
        arrived: the new ranks of the processes that arrived after the job began and joined here (growing back:
            ``grid.arrive``; their state is the agreed step's when ranks passed ``snapshots``, else copy it from
            ``source``); empty for a plain shrink.
        step: the step every rank of the new grid resumes from: the lowest step the survivors passed to
            ``shrink`` (``step=`` or their ``snapshots``), agreed inside it; ``None`` when nobody passed one
            (and on a retired rank). With ``snapshots`` the holders are at this step already; without,
            load your own snapshot of this step, then `broadcast_from_sources` to the drafted spares.
    """

    grid: Any
    rank: int | None
    epoch: int
    dead: tuple[int, ...]
    retired: bool
    old_to_new: dict[int, int] = field(default_factory=dict)
    source: dict[int, int] = field(default_factory=dict)
    policy: str = "drop"
    dim: str = "dp"
    seconds: dict[str, float] = field(default_factory=dict, compare=False)
    attempts: int = 1
    step: int | None = None
    arrived: tuple[int, ...] = ()

    def broadcast_from_sources(self, tensors: Iterable[torch.Tensor]) -> None:
        """Copy ``tensors`` from each source to the spares that took over, over the grid's ``dim`` family.

        Called by every rank of the new grid (the family over ``dim`` must be
        created: it is when the old grid had it), once each rank holds the
        state of `step`; groups with no new spare in them do nothing.
        (``shrink(snapshots=...)`` does this itself: see `StepSnapshots`.)

        Examples:
            >>> Regrid(None, None, 1, (3,), True).broadcast_from_sources([])  # a retired rank: nothing to do
        """
        if self.grid is None or not self.source or self.rank is None or not self.grid.layout.contains(self.rank):
            return
        members = self.grid.layout.group_ranks([self.dim], self.rank)
        drafted = [rank for rank in members if rank in self.source]
        if not drafted:
            return
        holder = self.old_to_new[self.source[drafted[0]]]
        for tensor in tensors:
            self.grid.broadcast(tensor, self.dim, group_src=members.index(holder))


class Phases:
    """Wall-clock seconds per phase, lap by lap."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase], self._last = now - self._last, now
