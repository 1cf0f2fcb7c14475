"""One rank's way through the elastic loop: set-up, the steps, every death absorbed, the finish line.

`Course` holds what changes while the loop runs on one rank (its grid, its state, its `StepSnapshots`, the step,
its history); `hypergrid.loop.ElasticLoop.run` builds one per call and drops it at the end. Every world change
goes through one path: a shrink (or a draft, an arrival, a growth) hands over a `Regrid`, `_placed` puts this rank
in the new grid (or retires it), and `_settle` agrees with the new grid's ranks on whether every one of them holds
the agreed step's state. A rank whose set-up had not finished holds an empty snapshot of step 0 (`begin` takes it
before anything communicates), so the shrink agrees on step 0 and `_settle` sends every rank back to ``setup``:
no rank can have started step 0, since set-up ends with a barrier over the whole grid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.errors import RankFailure
from hypergrid.grid import StepSnapshots
from hypergrid.grid.batch import create_missing
from hypergrid.grid.regrid import Regrid
from hypergrid.grid.snapshots import share_step
from hypergrid.launch.processes import default_device
from hypergrid.loop.result import LoopResult, WorldChange, replicas_equal

__all__ = ["Course", "holders_of"]


def holders_of(state: Any) -> list[Any]:
    """The holders ``StepSnapshots`` takes from what ``setup`` returned: the object itself, or the items of a
    tuple, list or dict (its values, in order)."""
    if isinstance(state, dict):
        return list(state.values())
    if isinstance(state, (list, tuple)):
        return list(state)
    return [state]


class Course:
    """One rank's run of an `ElasticLoop` (built by ``ElasticLoop.run``, which owns its lifetime; ``loop`` is it: its
    settings, and ``say``)."""

    def __init__(self, loop: Any, grid: Any, first_rank: int, setup: Callable[..., Any], step: Callable[..., Any]):
        self.loop, self.grid = loop, grid
        self.setup, self.step_fn = setup, step
        self.result = LoopResult(first_rank)
        self.state: Any = None  # what setup returned; None until set-up finished on this rank
        self.snapshots = StepSnapshots(keep=loop.keep)  # no holders until set-up (or a received state)
        self.step = 0

    # -- the ways in -------------------------------------------------------------------------------------------

    def begin(self) -> None:
        """A rank of the launched world: create the families (every rank, spares included), then set up and run the
        steps, or wait as a spare."""
        self.snapshots.take(0)  # empty: a set-up that does not finish (see the module's docstring)
        failed = None
        try:
            self.grid.create_pgs(self.loop.families)
        except RankFailure as failure:
            failed = failure
        if not self.grid.is_current_rank_in_grid():
            joined = self._enter(self._wait(self.grid.standby, families=self.loop.families), "released")
        else:
            joined = failed is None or self._enter(self._shrink(failed), "retired")
        if joined:
            self._steps()

    def arrive(self) -> None:
        """A process started in place of a dead one (``hypergrid.run --replace-dead``): join the running job."""
        if self._enter(self._wait(self.grid.arrive), "released"):
            self._steps()

    def release(self, error: BaseException) -> None:
        """This rank leaves on ``error`` (a step's, or a failure nothing absorbs): release the spares and the
        arrivals, which would otherwise wait for a job that no longer needs them (best effort: the store may be
        gone, or this rank outside the grid)."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            return
        with contextlib.suppress(Exception):  # (a replaced grid, a lost store: nothing to release through)
            if self.grid.is_current_rank_in_grid():
                self.grid.release_spares()

    # -- the steps ---------------------------------------------------------------------------------------------

    def _steps(self) -> None:
        steps = self.loop.steps
        while self.step <= steps:  # step == steps: the finish line, crossed together
            try:
                if self.state is None:
                    self._set_up()
                self.snapshots.take(self.step)
                if self.step < steps:
                    self.result.last = self.step_fn(self.grid, self.state, self.step)
                else:
                    self._finish()
                self.step += 1
            except RankFailure as failure:
                if not self._enter(self._shrink(failure), "retired"):
                    return
        self.grid.release_spares()
        me = self.grid.my_coord()
        shape = dict(zip(self.grid.dim_names, self.grid.shape))
        self.result.rank, self.result.coord, self.result.shape = dist.get_rank(), me, shape
        self.result.step, self.result.state, self.result.world = steps, self.state, dist.get_world_size()

    def _set_up(self) -> None:
        """``setup`` on this grid, the replicas made equal (the lowest member of each replica group gives its state
        to the others, as DDP broadcasts at construction), then a barrier over the whole grid: nobody starts step 0
        before every rank's set-up is done."""
        state = self.setup(self.grid)
        snapshots = StepSnapshots(*holders_of(state), keep=self.loop.keep)
        if self.grid.group_rank(self.loop.dim) == 0:
            snapshots.take(0)
        if share_step(self.grid, self.loop.dim, snapshots, 0):
            snapshots.restore(0)
        self.grid.barrier(self.grid.dim_names)
        self.state, self.snapshots = state, snapshots  # (a death before here: this rank's set-up did not finish)

    def _finish(self) -> None:
        equal = replicas_equal(self.grid, self.loop.dim, self.snapshots.holders)
        self.grid.barrier(self.grid.dim_names)  # the last collective: every rank of the grid takes part
        self.result.replicas_equal = equal

    # -- a world change ----------------------------------------------------------------------------------------

    def _shrink(self, failure: RankFailure) -> Regrid:
        loop = self.loop
        regrid: Regrid = self.grid.shrink(
            dead=failure.dead or None, dim=loop.dim, policy=loop.policy, snapshots=self.snapshots
        )
        return regrid

    def _wait(self, call: Callable[..., Regrid | None], **extra: Any) -> Regrid | None:
        """Wait in ``standby`` or ``arrive`` until a shrink or a growth makes this process a member of the grid."""
        self.snapshots = StepSnapshots(keep=self.loop.keep)  # empty: it gets the agreed step's state from a replica
        regrid = call(snapshots=self.snapshots, **extra)
        while regrid is not None and not regrid.grid.layout.contains(regrid.rank):  # an arrival taken as a spare
            regrid = regrid.grid.standby(snapshots=self.snapshots, families=self.loop.families)
        return regrid

    def _enter(self, regrid: Regrid | None, otherwise: str) -> bool:
        """Take the new world in and settle it (shrinking again when a rank dies meanwhile); False when this rank
        leaves the job: ``otherwise`` (``"released"``, ``"retired"``) says how, when ``regrid`` is None."""
        while True:
            regrid = self._placed(regrid)
            if regrid is None:
                setattr(self.result, otherwise if not self.result.retired else "retired", True)
                self.result.step = self.step
                return False
            try:
                self._settle(regrid)
                return True
            except RankFailure as failure:
                regrid = self._shrink(failure)

    def _placed(self, regrid: Regrid | None) -> Regrid | None:
        """This rank in the new grid; a retired rank waits to come back while replacements may arrive."""
        if regrid is not None and regrid.retired:
            self.result.retired = True
            if not self.loop.regrow:
                return None
            self.loop.say(self.result.first_rank, "retired: waits to come back when replacements arrive")
            self.state = None
            regrid = self._wait(self.grid.arrive, wake_ranks=False)  # (waking nobody: it was just there)
            self.result.retired = regrid is None
        if regrid is not None:
            self.grid, self.step = regrid.grid, 0 if regrid.step is None else regrid.step
        return regrid

    def _settle(self, regrid: Regrid) -> None:
        """On every rank of the new grid: the families a death in set-up left out, the received state taken over,
        and one all-reduce: does every rank hold the agreed step's state? If not, all set up again at step 0."""
        create_missing(self.grid, self.loop.families)  # (collective exactly when one is missing, on every rank)
        if not self.snapshots.holders and self.snapshots.holds_state:  # received from a replica: build, then load
            state = self.setup(self.grid)
            self.snapshots = self.snapshots.handed_to(*holders_of(state))
            self.state = state
        holds = torch.tensor([int(self.snapshots.holds_state)], dtype=torch.int64, device=default_device())
        self.grid.all_reduce(holds, self.grid.dim_names, op=dist.ReduceOp.MIN)
        again = not bool(holds.item())
        if again:
            self.state, self.snapshots, self.step = None, StepSnapshots(keep=self.loop.keep), 0
            self.snapshots.take(0)
        shape = dict(zip(self.grid.dim_names, self.grid.shape))
        change = WorldChange(
            self.step, dist.get_world_size(), shape, regrid.dead, regrid.arrived, dist.get_rank(), again
        )
        self.result.history.append(change)
        self.loop.say(self.result.first_rank, describe(change))
        if self.loop.on_change is not None:
            self.loop.on_change(change)


def describe(change: WorldChange) -> str:
    """One line for a world change, as the loop prints it."""
    what = [f"dead {list(change.dead)}"] if change.dead else []
    what += [f"{len(change.arrived)} arrived"] if change.arrived else []
    where = "set-up again" if change.setup_again else f"resuming at step {change.step}"
    return f"{', '.join(what) or 'world re-formed'}; {where} on {change.shape} as rank {change.rank}"
