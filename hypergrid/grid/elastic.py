"""The elastic grid: when ranks die, the survivors agree, shrink or fill from spares, and carry on.

This facet checks ``grid.shrink``'s call and hands over to `hypergrid.grid.recovery.Recovery` (whose docstring
lists its steps). See docs/elastic.md.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.agreement import diagnosis
from hypergrid.agreement.arrivals import Arrivals
from hypergrid.agreement.membership import Proposal, call_key, release_key, wait_for_call
from hypergrid.agreement.world import World
from hypergrid.binding.facet import Facet, require_initialized
from hypergrid.binding.failures import abort_groups
from hypergrid.binding.registry import SCOPE_SEPARATOR, PgKey, untagged
from hypergrid.errors import GridSpecError, GridTooLargeError, InvalidArgumentError, RankError
from hypergrid.grid.batch import create_missing
from hypergrid.grid.intake import Intake
from hypergrid.grid.recovery import Recovery, families_digest
from hypergrid.grid.regrid import Regrid
from hypergrid.grid.snapshots import MAX_STEP, StepSnapshots
from hypergrid.grid.succession import Recreation
from hypergrid.launch.memberlog import job_log, record_world
from hypergrid.layout import KEY_SEPARATOR, MAX_WORLD_SIZE, Dims
from hypergrid.layout.shrink import check_policy, check_replica_dim
from hypergrid.validation import check_int, check_ints, refuse
from hypergrid.values import check_timeout, shown

__all__ = ["Elastic", "Regrid", "check_spares"]

_SHRINK = "shrink "


def check_spares(spares: object, world: int | None, end: int) -> int:
    """Validate ``spares``: a non-negative int that fits after the grid (which ends before rank ``end``).

    Examples:
        >>> check_spares(1, 9, 8)
        1
        >>> check_spares(1, 10, 8)
        Traceback (most recent call last):
          ...
        hypergrid.errors.GridSpecError: spares=1: the grid ends at rank 7 and its spares are the last 1 of ...
    """
    count = check_int("HyperCommGrid", "spares", spares, 0, MAX_WORLD_SIZE)
    if world is not None and end + count > world:
        raise GridTooLargeError(
            f"spares={count}: the grid ends at rank {end - 1} and the world has {world} ranks, so only "
            f"{max(world - end, 0)} rank(s) are left over for spares (the last ranks of the world)"
        )
    if world is not None and count and end + count < world:  # ranks between the grid and its spares: stranded
        raise GridSpecError(
            f"spares={count}: the grid ends at rank {end - 1} and its spares are the last {count} of the world's "
            f"{world} ranks, so {_span(end, world - count)} would be in neither; an elastic grid's world is "
            f"the grid plus its spares: start {end + count} processes (--nproc-per-node), or give the grid a "
            "-1 dim to take the rest"
        )
    return count


def _span(first: int, end: int) -> str:
    return f"rank {first}" if end - first == 1 else f"ranks {first}..{end - 1}"


def _parse(key: PgKey) -> tuple[str | None, tuple[str, ...], str | None, str | None]:
    """(view or None, dims, tag, ``"within"``/``"across"`` or None) of a registry key."""
    family, tag = untagged(key)
    if isinstance(family, str):
        view, names = None, tuple(family.split(KEY_SEPARATOR))
    else:
        view, names = family[0], tuple(family[1])
    last, _, half = names[-1].partition(SCOPE_SEPARATOR)
    return view, (*names[:-1], last), tag, half.partition("=")[0] or None


def _left_behind(world: World) -> None:
    """A spare's wait woke without a call: ``FencedError`` if the others went on without it (it was stopped)."""
    if world.watcher is not None:
        world.watcher.excluded()
    world.alarm.check_fence("standby")


def check_resume(root: Any, call: str, dim: str, step: object, snapshots: object) -> int | None:
    """``step`` checked (None or a non-negative int), ``snapshots`` a `StepSnapshots` over a created ``dim`` (where it
    holds a state: the recovery creates the family where a rank that lacks the step must get it)."""
    if snapshots is not None and step is not None:
        raise InvalidArgumentError(
            f"{call}: step={step!r} and snapshots= were both passed; pass one (the snapshots' step is theirs)"
        )
    if snapshots is not None:
        if not isinstance(snapshots, StepSnapshots):
            raise refuse(call, "snapshots", snapshots, "a hypergrid.StepSnapshots or None", InvalidArgumentError)
        created = any(_parse(key) == (None, (dim,), None, None) for key in root.created_keys)
        if snapshots.holds_state and not created:  # (an empty one: a set-up a death cut short, a spare's, an arrival's)
            raise InvalidArgumentError(
                f"{call}: snapshots= needs the family over {dim!r} (a replica that lacks the agreed step gets it "
                f"from its {dim!r} group), which this grid did not create; call create_pg({dim!r}) first"
            )
        snapshots.check_matches(call)  # a restore that would fail half way is refused before anything changes
    return None if step is None else check_int(call, "step", step, 0, MAX_STEP)


def _recover(recovery: Recovery, proposal: Proposal, families: list[Recreation]) -> Regrid:
    """Agree, plan and carry on (see `hypergrid.grid.recovery`)."""
    dead = recovery.agree(proposal)
    recovery.intake = Intake.agree(recovery, proposal.policy, proposal.dim, dead, families)  # who arrived meanwhile
    plan, successor = recovery.plan(dead, proposal.policy, proposal.dim, families)
    regrid: Regrid = recovery.carry_on(plan, successor, families, proposal.policy, proposal.dim)
    record(recovery, regrid)
    return regrid


def record(recovery: Recovery, regrid: Regrid) -> None:
    """Under ``hypergrid.run``, on the new world's ranks 0 and 1: the job's log records the world the shrink formed
    (`hypergrid.launch.memberlog.record_world`)."""
    if regrid.rank not in (0, 1):
        return
    plan, log = recovery.last_plan, job_log(recovery.world.base_store)
    arrivals = dict(recovery.intake.arrivals) if plan is not None else {}  # (each agreed: taken in, or died)
    dead = plan.dead if plan is not None else regrid.dead  # (the plan's: arrivals that died joining too)
    record_world(log, recovery.size, recovery.world.number, regrid.epoch, regrid.rank, regrid.old_to_new, dead,
                 arrivals)  # fmt: skip


def _family_list(root: Any) -> list[Recreation]:
    """Every family the root grid created, in order, with what ``create_families`` needs to create it again."""
    backend_of = {key: entry.backend for entry in root._core.registry.pool.entries() for key in entry.holders}
    families = []
    for key in root.created_keys:
        view, dims, tag, scope = _parse(key)
        spec: dict[str, Any] = {"dims": list(dims), "view": view, "tag": tag, "kwargs": {}}
        if scope is not None:
            spec["kwargs"] = {scope: "node", "ranks_per_node": root._core.registry.families[key][2]}
        if tag is not None and backend_of.get(key) is not None:
            spec["kwargs"]["backend"] = backend_of[key]
        families.append((key, spec))
    return families


class Elastic(Facet):
    """Abort, shrink, spares and standby; a shrink's successor grid (a facet object; the core's ``successor``)."""

    # -- abort ----------------------------------------------------------------

    def _held_groups(self) -> list[Any]:
        return [
            entry.group for entry in self._core.registry.pool.entries() if isinstance(entry.group, dist.ProcessGroup)
        ]

    def abort(self) -> None:
        """Abort every group this grid (and its views) holds, on every backend, then forget them.

        Never blocks on a dead peer: each group is aborted (``ProcessGroup.abort``)
        before torch destroys it, so a rank stuck in nothing returns at once.
        The default group is left alone (``shrink`` re-forms it). Afterwards the
        grid holds no family, as after ``destroy``.

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> _ = grid.create_pgs(["tp", "dp"]); grid.abort(); grid.created_keys
            []
            >>> dist.destroy_process_group()
        """
        world = self._core.registry.world
        groups = [group for group in self._held_groups() if group is not dist.GroupMember.WORLD]
        abort_groups(groups, None if world is None else world.job)
        self._core.root.destroy()

    # -- shrink ---------------------------------------------------------------

    def _check_shrink(self, dead: Iterable[int] | None, world: int, rank: int) -> list[int]:
        named = [] if dead is None else check_ints("shrink", "dead", dead, 0, world - 1, limit=world, error=RankError)
        if rank in named:
            raise RankError(f"shrink: dead={shown(named)} names the calling rank {rank}; a survivor calls shrink")
        if self._core.registry.spares_released:  # released spares left: they are gone
            named += range(world - self._core.grid.spares, world)
        return sorted({int(gone) for gone in named})

    def shrink(
        self,
        dead: Iterable[int] | None = None,
        *,
        dim: str = "dp",
        policy: str = "drop",
        timeout_s: float | None = None,
        step: int | None = None,
        snapshots: StepSnapshots | None = None,
    ) -> Regrid:
        """Carry on without the dead: agree on them, re-form the world, re-create every family on a new grid.

        Collective over every surviving process of the old world (spares in
        ``standby`` join by themselves). The dead are the ranks named in
        ``dead`` and every rank the world's roll calls found dead (each rank's
        watcher answers for it, even while its main thread is blocked, so a slow
        rank is never declared dead and every survivor reads the same verdict);
        when no failure was seen yet, the call runs a roll call itself: a rank it
        finds dead ends every other rank's grid waits with ``RankFailure`` so that
        they come too, and with nobody dead the others' steps go on until they call
        ``shrink`` themselves. The survivors agree on the dead, ``policy``, ``dim`` and
        the families to re-create; the whole plan (the new layout, views, every
        family, tag and ``within``/``across`` half) is checked before anything is
        torn down. Then the old groups are aborted, the default group is
        re-formed over the survivors (contiguous new ranks, in the old order,
        under a new epoch's store prefix) and a new grid with the same dims,
        backend, strategy, options, guard settings and views re-creates every
        family the old grid had (``created_keys`` equal; on a ``"local"`` grid, whose
        groups commit alone, those every survivor holds), ending with a commit
        every survivor passes together. A rank that dies meanwhile, at any point,
        is folded in: the new world's roll call names it and the next world is
        formed without it (``Regrid.attempts``).

        Policies along ``dim`` (the replica dim): ``"drop"`` removes each slice
        of ``dim`` holding a dead rank (``dim`` shrinks; the other survivors of
        those slices are *retired*: their ``Regrid.rank`` is ``None``);
        ``"spares"`` gives each dead rank's coordinates to a spare (the shape
        stays; ``Regrid.source`` says where to copy its state from), refusing
        when spares are too few; ``"spares_then_drop"`` falls back to
        ``"drop"`` then. The store must outlive every worker (docs/elastic.md).

        **The step to resume from.** A death in the middle of a step leaves the
        survivors one step apart (a collective without the dead rank completed
        on some). Each survivor passes the step it is in (``step=``, or its
        ``snapshots``, whose newest step is that one); the new world agrees on
        the lowest (``Regrid.step``). With ``snapshots`` every rank of the new
        grid is brought to it before ``shrink`` returns: it loads its own
        snapshot of that step, or, lacking one (a drafted spare), gets a
        replica peer's over ``dim``. A death meanwhile is absorbed like any
        other (the next attempt agrees again).

        Args:
            dead: old ranks known to be gone (e.g. ``RankFailure.dead``); ``None``: none known.
            dim: the replica dim.
            policy: ``"drop"``, ``"spares"`` or ``"spares_then_drop"``.
            timeout_s: how long to wait for a survivor that is alive but does not come (then it is
                declared dead), and the bound of torch's waits while the new world forms (a death
                there costs at most this); default ``min(guard_timeout_s, HYPERGRID_PROBE_S)``, 30 s
                (`hypergrid.timing.Timing.shrink_timeout_s`).
            step: the step this rank is in (the one that failed, or the next if none began); ``Regrid.step``
                is the lowest passed.
            snapshots: this rank's `StepSnapshots` (instead of ``step``): restored at the agreed step.

        Returns:
            The `Regrid`: the new grid (``None`` when retired), this rank's new rank, the epoch, the moves
            and the agreed step.

        Raises:
            NotInitializedError: torch.distributed is not initialized.
            DimsError: ``dim`` is not a dim of the grid.
            InvalidArgumentError: an unknown ``policy``, a bad ``timeout_s`` or ``step``, both ``step`` and
                ``snapshots``, or ``snapshots`` without a created family over ``dim``.
            RankError: ``dead`` names a rank outside the world, or the caller.
            RankFailure: every slice of ``dim`` died, spares are too few, or the new world could not form
                although no further rank died; the same error on every survivor.
            FencedError: this rank was excluded by the others (it answered no roll call in time, or arrived
                after they went on), within about a second of resuming if it was stopped inside ``shrink``.
            GridReplacedError: this grid was replaced by an earlier ``shrink`` (use the grid it returned).
            DesyncError: survivors asked for different ``policy``, ``dim`` or families, or only some passed
                ``snapshots``.
            GridSpecError: a registered view no longer divides the new grid.
            InvalidArgumentError: a ``within``/``across`` half no longer fits the new grid's nodes.
        """
        grid, root = self._core.grid, self._core.root
        if root is not grid:  # a grid from view(): the root shrinks (it holds every family)
            shrunk: Regrid = root.shrink(
                dead, dim=dim, policy=policy, timeout_s=timeout_s, step=step, snapshots=snapshots
            )
            return shrunk
        # The arguments first, before torch.distributed is asked for: a bad one is named whatever the state.
        self.layout._one_dim(dim)
        check_replica_dim("shrink", dim, root.replicas)
        check_policy(policy)
        checked_timeout = None if timeout_s is None else check_timeout(timeout_s, "timeout_s")
        checked_step = check_resume(root, "shrink", dim, step, snapshots)
        require_initialized("shrink")
        world = self._core.world_for("grid.shrink")  # a replaced grid refuses: nothing reaches the new world
        world.alarm.check_fence("grid.shrink")
        default = world.timing.with_group_timeout(grid.guard_timeout_s).shrink_timeout_s
        timeout = default if checked_timeout is None else checked_timeout
        named = self._check_shrink(dead, world.size, world.rank)
        recovery = Recovery(grid, world, world.size, timeout, checked_step, snapshots)
        families = _family_list(root)
        known = recovery.known_dead(named)
        # A "local" grid's families may differ between groups after a death (each group commits alone): the
        # survivors keep those all of them hold (`succession.held_by_all`), so they are not compared here.
        compared = [] if grid.strategy == "local" else families
        proposal = Proposal(tuple(known), policy, dim, families_digest(compared, self._core.describe()))
        regrid: Regrid = _recover(recovery, proposal, families)
        return regrid

    # -- spares ---------------------------------------------------------------

    def standby(
        self,
        timeout_s: float | None = None,
        *,
        snapshots: StepSnapshots | None = None,
        families: Sequence[Dims] = (),
    ) -> Regrid | None:
        """On a spare: wait until a ``shrink`` drafts it (return its `Regrid`) or the job ends (``None``).

        Blocks on one store key (no polling). A shrink that does not draft
        this spare (``"drop"``, or other spares chosen) is joined all the same,
        and the wait goes on in the new world. Returns ``None`` once the grid's
        ranks call ``release_spares``.

        Args:
            timeout_s: the shrinks' timeout for ranks nobody named (default: as ``shrink``'s).
            snapshots: the spare's `StepSnapshots` (empty): when drafted by survivors that passed theirs, it
                returns holding the state of the agreed step (``Regrid.step``), copied from a replica peer.
            families: the families the grid's ranks create after each shrink where its new grid lacks one
                (`create_missing`: a death interrupted their first ``create_pgs``); the spare creates them with
                them (creation is collective over the world) before it waits again.

        Raises:
            InvalidArgumentError: ``snapshots`` is not a `StepSnapshots`, ``families`` not a list, or the family
                over the shrink's dim is missing.
            DimsError: ``families`` names a dim the grid lacks.
            RankError: the caller is not one of the grid's spares.
            NotInitializedError: torch.distributed is not initialized.
            StoreLostError: the job's store is gone while it waits (its host died), as on the grid's ranks.
        """
        require_initialized("standby")
        checked = None if timeout_s is None else check_timeout(timeout_s, "timeout_s")  # before any wait
        if snapshots is not None and not isinstance(snapshots, StepSnapshots):
            raise refuse("standby", "snapshots", snapshots, "a hypergrid.StepSnapshots or None", InvalidArgumentError)
        if not isinstance(families, (list, tuple)):
            raise refuse("standby", "families", families, "a list of dims (as create_pgs takes)", InvalidArgumentError)
        for dims in families:
            self.layout.key(dims)  # an unknown dim: DimsError now, not after a shrink
        grid = self._core.grid
        while True:
            world = grid._core.world_for("standby")  # (joined when the grid was built: a spare answers roll calls)
            if not world.size - grid.spares <= world.rank < world.size:
                raise RankError(
                    f"standby: rank {world.rank} is not a spare (the spares are the last {grid.spares} rank(s) of "
                    f"the world of {world.size}); only spares wait"
                )
            store, number = world.base_store, world.number
            wake = functools.partial(diagnosis.read, world.calls, call_key(number))  # a fence ends the wait
            with world.job.store_calls("standby"):  # the store's loss: StoreLostError, as on the grid's ranks
                with world.alarm.listening(wake, fence_only=True):
                    call = wait_for_call(store, number, gone=functools.partial(_left_behind, world))
                if not call.startswith(_SHRINK):
                    if store.add(release_key(number), 1) == grid.spares:
                        store.delete_key(release_key(number))
                        store.delete_key(call_key(number))
                    return None
            proposal = Proposal.decode(call[len(_SHRINK) :])
            default = world.timing.with_group_timeout(grid.guard_timeout_s).shrink_timeout_s
            timeout = default if checked is None else checked
            check_resume(grid._core.root, "standby", proposal.dim, None, snapshots)
            recovery = Recovery(grid, world, world.size, timeout, snapshots=snapshots)
            regrid = _recover(recovery, proposal, _family_list(grid._core.root))
            if regrid.rank is not None and regrid.grid.layout.contains(regrid.rank):
                return regrid
            grid = regrid.grid
            create_missing(grid, families)

    def release_spares(self) -> None:
        """Tell the spares in ``standby`` that the job ends: their ``standby`` returns ``None``; so does ``arrive``.

        Called by the grid's ranks at the end of the job (any one of them is
        enough; the others' calls change nothing). Later shrinks count the
        spares as gone.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2], ["dp"]).release_spares()  # no spares: nothing to do
        """
        self._core.registry.spares_released = True
        if self._core.grid.spares:
            require_initialized("release_spares")
        elif not dist.is_initialized():
            return
        world = self._core.world_for("release_spares")
        if world.rank == 0:  # processes that arrived and wait (`arrive`): the job ends without them
            Arrivals(world.base_store).close()
        if self._core.grid.spares:
            world.base_store.compare_set(call_key(world.number), "", "release")
