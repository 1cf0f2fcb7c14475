"""``ElasticLoop``: the training loop the library owns. The user gives the grid, a set-up and a step; a death anywhere
is absorbed (docs/elastic.md, "The elastic loop")."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.binding.cpplog import quiet_cpp_log
from hypergrid.errors import GridSpecError, HyperGridError, InvalidArgumentError
from hypergrid.grid import HyperCommGrid
from hypergrid.launch.processes import init_from_env
from hypergrid.launch.replacements import ARRIVAL_ENV, REPLACING_ENV
from hypergrid.layout import Dims, GridLayout
from hypergrid.layout.shrink import POLICIES, check_replicas
from hypergrid.loop.course import Course
from hypergrid.loop.result import LoopResult, WorldChange
from hypergrid.validation import check_bool, check_int, refuse
from hypergrid.values import is_int, shown

__all__ = ["ElasticLoop"]

#: HyperCommGrid arguments the loop sets itself.
_OWN = ("shape", "dim_names", "rank_offset", "spares", "replicas")
#: Every HyperCommGrid argument (``grid_options`` may name those the loop does not set).
_GRID_ARGUMENTS = frozenset(inspect.signature(HyperCommGrid.__init__).parameters) - {"self"}


def _families(families: object, dims: tuple[str, ...]) -> list[Dims]:
    """The families to create: the given ones (each dim alone by default) and the whole grid's."""
    if families is None:
        chosen: list[Dims] = list(dims)
    elif isinstance(families, (list, tuple)):
        chosen = list(families)
    else:
        raise refuse("ElasticLoop", "families", families, "a list of dims (as create_pgs takes) or None",
                     InvalidArgumentError)  # fmt: skip
    layout = GridLayout([1] * len(dims), dims)
    try:
        keys = [layout.key(each) for each in chosen]  # an unknown dim: DimsError now
    except HyperGridError as error:
        raise type(error)(f"ElasticLoop: families: {error}") from None
    if layout.key(list(dims)) not in keys:
        chosen.append(list(dims))  # the loop's barriers and its agreement run over the whole grid
    return chosen


class ElasticLoop:
    """A training loop over an N-D grid that survives deaths: set-up, steps, shrink or draft, grow back, finish.

    ``run(setup, step)`` joins the job (``init_from_env`` where torch.distributed is not initialized; a process
    that ``hypergrid.run --replace-dead`` started in place of a dead one joins the running job instead), builds the
    grid (its world must be the grid plus its spares; a ``-1`` dim takes the rest), creates ``families`` on every
    rank, then on each grid rank calls ``setup(grid)`` (the state: a module, an optimizer, a tuple or dict of them)
    and ``step(grid, state, step)`` for ``step`` in ``range(steps)``; the spares wait. The replicas start equal (the
    lowest member of each replica group gives its state to the others) and every step's start is kept
    (`StepSnapshots`). When a rank dies, in set-up, in a step or at the finish line, every survivor's grid call
    raises ``RankFailure``; the loop shrinks along the replica dim (a spare takes the dead rank's place, or the dead
    rank's slice is dropped), brings every rank to the agreed step with the agreed state and carries on. A rank
    whose slice was dropped retires, or, under ``--replace-dead``, waits for the replacements to grow the grid back.
    The loop ends with a check that the replicas are bitwise equal, a barrier, and the spares released.

    ``setup`` runs on one rank without the others (no collectives in it): a drafted spare or an arrival calls it
    for the coordinates it was given, then takes a replica's state. ``step`` must communicate over the whole grid
    each step (a loss all-reduce, the gradient average) so that no rank runs more than ``keep - 1`` steps ahead.

    Args:
        shape: the grid's sizes, innermost first; one may be ``-1`` (the world less the spares).
        dim_names: a name per dim.
        steps: how many steps to run.
        spares: the last ranks of the world wait to take a dead rank's place.
        replicas: the replica dims (as ``HyperCommGrid``'s); the loop shrinks along the first.
        families: the families ``step`` uses (default: each dim alone); the whole grid's is added.
        policy: ``"drop"``, ``"spares"`` or ``"spares_then_drop"`` (default: ``"spares_then_drop"`` with spares,
            ``"drop"`` without).
        keep: how many steps' starts to keep (``StepSnapshots``).
        grid_options: more ``HyperCommGrid`` arguments (``backend``, ``group_options``, ``guard_timeout_s``, ...).
        regrow: a rank whose slice was dropped waits (``arrive``) for arrivals to grow the grid back instead of
            retiring; ``None``: under ``hypergrid.run --replace-dead`` (which starts the arrivals).
        on_change: called on each rank of the new grid after every world change, with its `WorldChange`
            (before the steps go on: e.g. to rescale the learning rate to the new dp size).
        verbose: print one line per world change on each rank (``rank R: dead [3]; resuming at step 8 ...``).

    Raises:
        InvalidArgumentError: a bad ``steps``, ``spares``, ``keep``, ``policy``, ``families``, ``grid_options``,
            ``regrow`` or ``on_change``.
        GridSpecError: a bad shape or dim names.
        DimsError: ``families`` names an unknown dim; a replica dim is not a dim.

    Examples:
        >>> import torch, torch.distributed as dist
        >>> import hypergrid
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> def setup(grid):
        ...     return torch.nn.Linear(2, 1)
        >>> def step(grid, model, step):
        ...     loss = model(torch.ones(1, 2)).sum()
        ...     loss.backward()
        ...     grid.average_gradients(model, "dp")
        ...     return loss.item()
        >>> result = hypergrid.ElasticLoop([-1], ["dp"], steps=3, verbose=False).run(setup, step)
        >>> result.finished, result.step, result.coord, result.replicas_equal
        (True, 3, Coord(dp=0), True)
        >>> dist.destroy_process_group()
        >>> hypergrid.ElasticLoop([2, -1], ["tp", "dp"], steps=-1)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: ElasticLoop: steps=-1: expected an int in 0..4611686018427387903
    """

    def __init__(
        self,
        shape: Sequence[int],
        dim_names: Sequence[str],
        *,
        steps: int,
        spares: int = 0,
        replicas: str | Sequence[str] | None = None,
        families: Sequence[Dims] | None = None,
        policy: str | None = None,
        keep: int = 2,
        grid_options: Mapping[str, Any] | None = None,
        regrow: bool | None = None,
        on_change: Callable[[WorldChange], object] | None = None,
        verbose: bool = True,
    ) -> None:
        from hypergrid.grid.snapshots import MAX_STEP

        self.steps = check_int("ElasticLoop", "steps", steps, 0, MAX_STEP)
        self.spares = check_int("ElasticLoop", "spares", spares, 0, 2**31 - 1)
        self.keep = check_int("ElasticLoop", "keep", keep, 1, 1024)
        self.verbose = check_bool("ElasticLoop", "verbose", verbose)
        if policy is not None and (not isinstance(policy, str) or policy not in POLICIES):
            raise refuse("ElasticLoop", "policy", policy, f"None or one of {list(POLICIES)}", InvalidArgumentError)
        self.policy = policy if policy is not None else "spares_then_drop" if spares else "drop"
        if grid_options is not None and not isinstance(grid_options, Mapping):
            raise refuse("ElasticLoop", "grid_options", grid_options, "a dict of HyperCommGrid arguments or None",
                         InvalidArgumentError)  # fmt: skip
        self.grid_options = dict(grid_options or {})
        owned = [name for name in _OWN if name in self.grid_options]
        if owned:
            raise InvalidArgumentError(
                f"ElasticLoop: grid_options names {owned}; the loop sets those itself (give them as its own arguments)"
            )
        unknown = [shown(name) for name in self.grid_options if name not in _GRID_ARGUMENTS]
        if unknown:
            raise InvalidArgumentError(
                f"ElasticLoop: grid_options names {', '.join(unknown)}; expected HyperCommGrid arguments: "
                f"{sorted(_GRID_ARGUMENTS - set(_OWN))}"
            )
        if not isinstance(shape, (list, tuple)):
            raise refuse("ElasticLoop", "shape", shape, "a list of sizes (one may be -1)", GridSpecError)
        self.shape = list(shape)
        try:  # the names, the sizes and the replica dims, before anything runs (a -1 counts as 1 here)
            probe = GridLayout([1 if is_int(size) and size == -1 else size for size in self.shape], dim_names)
            check_replicas(replicas, probe.dim_names, probe.shape, 0)
        except HyperGridError as error:
            raise type(error)(f"ElasticLoop: {error}") from None
        self.dim_names, self.replicas = probe.dim_names, replicas
        self.families = _families(families, tuple(self.dim_names))
        under_replacing = os.environ.get(REPLACING_ENV, "0") not in ("", "0")  # hypergrid.run --replace-dead
        self.regrow = under_replacing if regrow is None else check_bool("ElasticLoop", "regrow", regrow)
        if on_change is not None and not callable(on_change):
            raise refuse("ElasticLoop", "on_change", on_change, "a callable or None", InvalidArgumentError)
        self.on_change = on_change
        self.dim = ""  # the replica dim shrinks go along: the grid's first (set by `grid`)

    def say(self, first_rank: int, text: str) -> None:
        """One line of the loop's own output, named by the rank the process started as."""
        if self.verbose:
            sys.stdout.write(f"hypergrid.loop: rank {first_rank}: {text}\n")  # (one write: lines do not interleave)
            sys.stdout.flush()

    def grid(self, world: int) -> HyperCommGrid:
        """The grid over a world of ``world`` ranks: refused unless the world is the grid plus its spares."""
        grid = HyperCommGrid(self.shape, self.dim_names, spares=self.spares, replicas=self.replicas,
                             **self.grid_options)  # fmt: skip
        if grid.size + self.spares != world:
            raise GridSpecError(
                f"ElasticLoop: the grid {dict(zip(grid.dim_names, grid.shape))} has {grid.size} ranks and "
                f"spares={self.spares}, but the world has {world}: start {grid.size + self.spares} processes "
                "(--nproc-per-node), or give the grid a -1 dim to take the rest"
            )
        if not grid.replicas:
            raise InvalidArgumentError(
                f"ElasticLoop: the grid {grid.dim_names} has no replica dim to shrink along; name one (replicas=...)"
            )
        self.dim = grid.replicas[0]
        return grid

    def run(self, setup: Callable[[Any], Any], step: Callable[[Any, Any, int], Any]) -> LoopResult:
        """Run the loop on this process (collective over the job); this rank's `LoopResult`.

        Args:
            setup: ``setup(grid) -> state``: builds this rank's state for its coordinates, without collectives.
            step: ``step(grid, state, step) -> anything``: one training step (its last value: ``LoopResult.last``).

        Raises:
            InvalidArgumentError: ``setup`` or ``step`` is not callable.
            RankFailure: the job cannot go on (every slice of the replica dim died, ...): the same on every survivor.
            StoreLostError: the job's store is gone.
            (and whatever ``setup`` or ``step`` raise, which end this rank.)
        """
        for name, value in (("setup", setup), ("step", step)):
            if not callable(value):
                raise refuse("ElasticLoop.run", name, value, "a callable", InvalidArgumentError)
        quiet_cpp_log()  # torch's C++ warnings about the failures the loop absorbs are noise (as under hypergrid.run)
        arriving = os.environ.get(ARRIVAL_ENV) == "1"
        owned = not arriving and not dist.is_initialized()
        if owned:
            init_from_env()
        world = int(os.environ["WORLD_SIZE"]) if arriving else dist.get_world_size()
        first = int(os.environ.get("RANK", "0")) if arriving else dist.get_rank()
        course = Course(self, self.grid(world), first, setup, step)
        try:
            if arriving:
                self.say(first, f"arrives to join the running job (pid {os.getpid()})")
                course.arrive()
            else:
                course.begin()
        except BaseException as error:  # the job cannot go on here: the spares and arrivals must not wait for it
            course.release(error)
            raise
        result = course.result
        if (owned or arriving) and dist.is_initialized():
            dist.destroy_process_group()  # (the loop joined the job: it leaves it)
        if result.finished:
            self.say(first, f"finished {result.step} steps as {result.coord}; replicas equal: {result.replicas_equal}")
        elif result.released:
            self.say(first, "released: the job ended without needing it")
        else:
            self.say(first, f"retired at step {result.step}: its slice of {self.dim!r} was dropped")
        return result
