"""A spare's wait in ``standby``: until the world's round is called, this spare is fenced, or no grid rank is left.

The grid's ranks call the round (a shrink's proposal, or ``release``). When none of them is left to call it (each
was declared dead by a roll call, or left the world's watch without ``release_spares``), nobody ever will: the spare
ends with `RankFailure` instead of waiting forever. Each death wakes the wait (the watcher's `on_dead`), and so does
each grid rank's leave (`hypergrid.agreement.world.World.close`, while the world counts spares); a woken spare reads
the watch's member list once (docs/elastic.md, "Spares"). Where no launcher's agent reports deaths (a plain
``env://`` launch, ``spawn``), the first spare asks for a roll call every `hypergrid.timing.Timing.probe_s`, as a
grid rank's long wait does; with or without, it wakes every spare's wait then (a wake that came before the wait
began is not lost).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from hypergrid.agreement import diagnosis
from hypergrid.agreement.barrier import Prober
from hypergrid.agreement.liveness import members_key
from hypergrid.agreement.membership import call_key, wait_for_call
from hypergrid.agreement.rollkeys import member_status
from hypergrid.agreement.world import World
from hypergrid.errors import FencedError, RankFailure
from hypergrid.values import format_ranks

__all__ = ["no_grid_rank_left", "wait_as_spare"]


def wait_as_spare(world: World, spares: int) -> str:
    """Block until ``world``'s round is called (``shrink <proposal>`` or ``release``); the call.

    Raises:
        FencedError: the others went on without this spare (it was stopped through their shrink).
        RankFailure: no rank of the grid is left to call the round (`no_grid_rank_left`).
    """
    wake = functools.partial(_wake, world)
    watcher = world.watcher
    undo = None if watcher is None else watcher.on_dead(lambda dead: wake())
    prober = None
    if watcher is not None and world.rank == world.size - spares:  # the first spare: a tick every probe_s
        asks = watcher.relay is None  # (no agent reports deaths: it asks for a roll call)
        text = f"spare {world.rank} waits in standby"

        def tick() -> tuple[int, ...]:
            found = watcher.probe(text) if asks else ()
            wake()  # every spare checks again: a leave or a death whose wake came before its wait began
            return found

        prober = Prober(world.timing.probe_s, tick, lambda found: False).start()
    try:
        with world.alarm.listening(wake, fence_only=True):  # a fence ends the wait
            return wait_for_call(world.base_store, world.number, gone=functools.partial(_check, world, spares))
    finally:
        if prober is not None:
            prober.stop()
        if undo is not None:
            with contextlib.suppress(ValueError):  # (the watcher forgot its callbacks: it ended)
                undo()


def _wake(world: World) -> None:
    """End the spare's wait on the call key (a read of the absent key wakes its waiters); a lost store is no error
    here (the wait ends with the loss)."""
    with contextlib.suppress(RuntimeError):
        diagnosis.read(world.calls, call_key(world.number))


def _check(world: World, spares: int) -> None:
    """The wait woke without a call: ``FencedError`` if the others went on without this spare, `RankFailure` if no
    grid rank is left.

    A roll call that only spares answered puts them on the minority side (they fence themselves): its silent grid
    ranks count as dead here, so that the spare learns why, not that it was excluded.
    """
    watcher, grid_ranks = world.watcher, world.size - spares
    status = member_status(diagnosis.read(world.calls, members_key(world.number)))
    dead = set() if watcher is None else set(watcher.dead)
    for verdict in [] if watcher is None else list(watcher.verdicts.values()):
        if verdict.kind == "minority" and min(verdict.alive, default=grid_ranks) >= grid_ranks:
            dead |= {rank for rank in range(grid_ranks) if rank not in verdict.alive and status.get(rank) is not False}
    error = no_grid_rank_left(world.number, grid_ranks, dead, status)
    try:
        if watcher is not None:
            watcher.excluded()
        world.alarm.check_fence("standby")
    except FencedError as fenced:
        if error is None:
            raise
        raise error from fenced
    if error is not None:
        raise error


def no_grid_rank_left(number: int, grid_ranks: int, dead: Any, status: dict[int, bool]) -> RankFailure | None:
    """The error of a spare of world ``number`` whose grid (ranks ``0 .. grid_ranks - 1``) has no rank left, or None.

    A grid rank is gone when a roll call declared it dead (``dead``) or it left the world's watch (``status``:
    `hypergrid.agreement.rollkeys.member_status`, False for a rank whose last line is a leave).

    Examples:
        >>> no_grid_rank_left(0, 2, [0], {0: True, 1: True, 2: True}) is None
        True
        >>> print(no_grid_rank_left(0, 2, [0], {0: True, 1: False, 2: True}))  # doctest: +NORMALIZE_WHITESPACE
        standby: no rank of the grid is left to draft or release this spare (world 0: rank(s) 0 died, rank(s) 1
        left without release_spares()); the grid's ranks call release_spares() before they end (hypergrid.ElasticLoop
        does)
    """
    died = sorted(rank for rank in set(dead) if rank < grid_ranks)
    left = sorted(rank for rank, watching in status.items() if not watching and rank < grid_ranks and rank not in died)
    if len(died) + len(left) < grid_ranks:
        return None
    parts = [f"rank(s) {format_ranks(died)} died"] if died else []
    parts += [f"rank(s) {format_ranks(left)} left without release_spares()"] if left else []
    return RankFailure(
        f"standby: no rank of the grid is left to draft or release this spare (world {number}: {', '.join(parts)}); "
        "the grid's ranks call release_spares() before they end (hypergrid.ElasticLoop does)",
        dead=died,
    )
