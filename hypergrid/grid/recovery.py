"""One survivor's ``shrink``: agree on the dead, check the whole plan, tear down, then form worlds until one holds.

``grid.shrink`` (`hypergrid.grid.elastic`) hands `Recovery` the grid's world: (1) who is dead (the world's roll
calls, then `hypergrid.agreement.membership`); (2) the plan, checked whole (`hypergrid.layout.shrink`,
`hypergrid.grid.succession`: a refusal leaves the old grid and world as they were); (3) the old groups torn down;
(4) the new world formed attempt after attempt (a ready barrier, the default group, the families, the step agreed
by `Recovery.agree_step`, a commit barrier), torch's waits bounded (`hypergrid.timing.GLOO_WAITS`) and ended by a
`hypergrid.agreement.barrier.Vigil` once a member is found dead; past the commit the old world is replaced
(`World.replace`). What cannot be absorbed: a ``HyperGridError`` on every survivor. docs/design/recovery.md."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.agreement import liveness
from hypergrid.agreement.barrier import Barrier, BarrierFailed, Vigil
from hypergrid.agreement.connections import Within
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.membership import MembershipRound, Proposal, round_prefix
from hypergrid.agreement.world import World
from hypergrid.binding import reform
from hypergrid.binding.alarm import quoted
from hypergrid.binding.failures import abort_groups, communicate, sever_torch_groups
from hypergrid.binding.interruptible import Formation
from hypergrid.binding.reform import Formed, forget_keys, forget_numbered, formed, reform_world, tear_down, world_keys
from hypergrid.errors import DesyncError, FencedError, HyperGridError, RankFailure
from hypergrid.grid.batch import create_missing
from hypergrid.grid.intake import Intake
from hypergrid.grid.regrid import Phases, Regrid
from hypergrid.grid.snapshots import MAX_STEP, StepSnapshots, share_step
from hypergrid.grid.succession import Recreation, held_by_all, recreate, successor
from hypergrid.launch.processes import default_device
from hypergrid.layout.hierarchy import hierarchical_family
from hypergrid.layout.shrink import ShrinkPlan
from hypergrid.timing import GLOO_WAITS
from hypergrid.values import format_ranks

__all__ = ["Recovery", "Recreation", "families_digest"]

#: The step agreement's "no value" (the neutral element of its MIN), above every step.
_NONE = MAX_STEP + 1


def families_digest(families: Sequence[Recreation], description: str) -> str:
    """A short digest of the families a grid will re-create (equal on ranks that would create the same).

    Examples:
        >>> dp = [("dp", {"dims": ["dp"], "view": None, "tag": None, "kwargs": {}})]
        >>> families_digest(dp, "dp4") == families_digest(list(dp), "dp4") != families_digest(dp, "dp3")
        True
    """
    text = description + "|" + repr([(str(key), sorted(spec.items(), key=str)) for key, spec in families])
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


class Recovery:
    """One survivor's side of a shrink of ``grid`` (the root) over the old world of ``world`` ranks.

    Args:
        grid: the root grid being shrunk.
        world: the old world (the grid's: its number, job, watcher and alarm).
        size: the old world's size.
        timeout_s: the bound of each wait on a rank that is alive but absent, and of torch's waits.
        step: the step this rank is in (None: none, as on a spare), or taken from ``snapshots``.
        snapshots: this rank's `StepSnapshots`, brought to the agreed step (None: the caller restores).
        how: the old world's backend and its default group's timeout (default: read from torch's default group;
            an arrival, which has none, is told them in its draft).
        intake: the arrivals this shrink may take in (`hypergrid.grid.intake.Intake`; None: none).
    """

    def __init__(
        self,
        grid: Any,
        world: World,
        size: int,
        timeout_s: float,
        step: int | None = None,
        snapshots: StepSnapshots | None = None,
        how: Formed | None = None,
        intake: Intake | None = None,
    ) -> None:
        self.grid = grid
        self.world = world
        self.size = size
        self.timeout_s = timeout_s
        self.step = snapshots.step if snapshots is not None else step
        self.snapshots = snapshots
        self.agreed: int | None = None  # the step the new world resumes from (`agree_step`)
        self._mixed = False  # some members passed snapshots and others did not
        self.dim = "dp"
        self.rank, self.timing = world.rank, world.timing  # its bounds are the old world's (`hypergrid.timing`)
        self.how = formed() if how is None else how  # the old world's backend and timeout, which the new one keeps
        self.intake = Intake(world.base_store, size) if intake is None else intake
        self.forming: World | None = None  # the world an attempt is forming, once torch formed it
        self.formation: Formation | None = None  # the store torch forms an attempt's world on
        self.slices = GLOO_WAITS if self.how[0] == "gloo" else 1  # torch's waits: timeout_s in that many
        self.torch_bound_s, self.late, self.ready = timeout_s / self.slices, 0, False
        self.clock = Phases()
        self.attempts = 0
        self.last_plan: ShrinkPlan | None = None  # the plan of the world that held (`_regrid`)

    # -- 1. who is dead ---------------------------------------------------------------

    def agree(self, proposal: Proposal) -> tuple[int, ...]:
        """The dead ranks every survivor agreed on (``proposal``'s dead, plus any found meanwhile)."""
        watcher = self.world.watcher
        probe = None if watcher is None else (lambda: watcher.probe(f"rank {self.rank} waits in shrink"))
        side = None if watcher is None else watcher.side
        prefix, store, job, timing = round_prefix(self.world.number), self.world.base_store, self.world.job, self.timing
        member = MembershipRound(store, prefix, self.rank, range(self.size), proposal, self.timeout_s, probe, side, job,
                                 timing)  # fmt: skip
        member.stop = lambda: self.world.alarm.fenced is not None
        try:
            with self.world.alarm.listening(lambda: member.wake(self.world.calls), fence_only=True):
                dead = member.run()
        except FencedError as declared:  # the others went on without this rank: so does every later call
            self.world.fence(str(declared))
            raise
        self.world.alarm.check_fence("grid.shrink")
        self.clock.lap("agreement")
        return dead

    def known_dead(self, named: Sequence[int]) -> list[int]:
        """``named``, plus every rank the world's roll calls found dead (one is run now if none has been).

        That roll call is a probe: a rank it finds dead fails the world (every rank's waits end, so all come
        here); with nobody dead it changes nothing, and the others' steps go on until they call shrink too.
        """
        watcher = self.world.watcher
        if watcher is None:
            return sorted(named)
        if watcher.failure is None:
            watcher.report(liveness.PROBE, f"rank {self.rank} called shrink")
        self.world.alarm.check_fence("grid.shrink")
        return sorted({*named, *watcher.dead})

    # -- 2. the plan ----------------------------------------------------------------------

    def plan(
        self, dead: Sequence[int], policy: str, dim: str, families: Sequence[Recreation]
    ) -> tuple[ShrinkPlan, Any]:
        """The new world and the successor grid, every family checked on it; nothing is torn down here."""
        plan = self.intake.plan(self.grid, dead, policy, dim)
        new = successor(self.grid, plan)  # views checked here
        for _, spec in families:
            _, layout, view = new._core.family(spec["dims"], spec["view"])
            scope = next((half for half in ("within", "across") if half in spec["kwargs"]), None)
            if scope is not None:  # a half that no longer fits is refused now, not after the teardown
                ordered = view.layout.canonical_dims(spec["dims"])
                hierarchical_family(layout, ordered, scope, spec["kwargs"]["ranks_per_node"])
        return plan, new

    # -- 3.-4. tear down, then form worlds until one holds --------------------------------

    def carry_on(
        self,
        plan: ShrinkPlan,
        new: Any,
        families: Sequence[Recreation],
        policy: str,
        dim: str,
        first: int | None = None,
    ) -> Regrid:
        """Tear the old world down and form the new one (attempt after attempt); this rank's `Regrid`.

        The old world's watcher answers for this rank until the new world holds: it is the liveness every attempt
        asks (the new world's watcher starts once its commit passed, on the old one's connection), and it ends with
        the old world (`end_world`). Then the old world is replaced (`World.replace`): its grids refuse every call.
        ``first``: the number of the first world to form (default: the old world's next; an arrival drafted in a
        later attempt starts there).
        """
        grid, world = self.grid, self.world
        old = world.watcher
        world.reforming = True  # the teardown of its default group does not close it: its watcher answers on
        self.dim = dim
        if self.intake.survivors(plan)[:1] == [self.rank]:
            store: Any = c10d._get_default_store()
            for dead in plan.dead:  # the dead cannot release their guard announcements themselves
                store.delete_key(announce_key(dead))
        grid._core.guard_ledger.dead.update(plan.dead)  # nor count themselves out of the grid's last commits
        held = [entry.group for entry in grid._core.registry.pool.entries() if _abortable(entry.group)]
        abort_groups(held, world.job)  # never waiting on a dead peer; the world stays this grid's
        grid._core.drop_families()
        self.clock.lap("abort")
        number = world.number + 1 if first is None else first
        while True:
            self.attempts += 1
            if self.rank not in plan.old_to_new:
                tear_down(world.job)
                if old is not None:  # until the survivors end the old world (see Watcher.join), which names
                    old.join(max(60.0, 4 * self.timeout_s))  # every rank dead by then (later attempts may add)
                    if old.end_dead is not None:
                        plan = self.intake.plan(self.grid, old.end_dead, policy, dim)
                world.replace(None)
                return self._regrid(None, None, number, plan, dim)
            try:
                stale = self._form(plan, new, families, number)
            except BarrierFailed as failed:  # the attempt's outcome, the same on every member
                gone = self._failed(failed, number, plan)
                plan, new = self.plan(sorted({*plan.dead, *gone}), policy, dim, families)
                number += 1
                continue
            # Every member committed: no one reads the keys listed while all waited there (torch's rendezvous ones)
            forget_keys(world.base_store, stale)
            if plan.old_to_new[self.rank] == 0:
                # nor a key of the worlds before the old one: their last wake (a world's end woke every watcher,
                # some after they had read it and left) can land after its watcher ended
                forget_numbered(world.base_store, liveness.PREFIX, world.number - 1)
                self.intake.committed(plan, world.number)  # the arrivals taken are skipped from now on
            if old is not None:  # and its record, for a rank left behind that resumes later
                old.end_world([rank for rank in plan.dead if rank < self.size], self.size)
                old.join(self.timeout_s)
                if plan.dead and plan.old_to_new[self.rank] == 0:  # the record goes with the new grid (or next shrink)
                    new._core.guard_ledger.ended.append(liveness.ended_key(world.number))
            forming = self.forming
            assert forming is not None  # (formed: the commit passed)
            world.replace(forming)  # its watcher's connection serves the new world's watcher
            forming.join()
            gc.collect()  # the old world's groups, held by a failure's reference cycles: their sockets go now
            if self._mixed:
                raise DesyncError(
                    "grid.shrink: some survivors passed snapshots= and others did not (a drafted spare's "
                    "standby(snapshots=...) included); pass it on every rank or on none"
                )
            member = new.layout.contains(plan.old_to_new[self.rank])
            if self.snapshots is not None and self.agreed is not None and member:
                self.snapshots.restore(self.agreed)
            return self._regrid(new, plan.old_to_new[self.rank], number, plan, dim)

    def _regrid(self, grid: Any, rank: int | None, number: int, plan: ShrinkPlan, dim: str) -> Regrid:
        self.last_plan = plan
        return Regrid(
            grid,
            rank,
            number,
            tuple(dead for dead in plan.dead if dead < self.size),
            retired=rank is None,
            old_to_new=plan.old_to_new,
            source=plan.source,
            policy=plan.policy,
            dim=dim,
            seconds=self.clock.seconds,
            attempts=self.attempts,
            step=None if rank is None else self.agreed,
            arrived=tuple(plan.old_to_new[rank] for rank in plan.arrived),
        )

    def _end_forming(self, dead: list[int], text: str) -> None:
        """A member died while world is formed (the vigil heard it): end the waits of torch and of the new world."""
        if self.formation is not None:  # torch's rendezvous, where the others wait for the dead member's keys
            self.formation.interrupt(BarrierFailed(text, dead))
        sever_torch_groups()
        if self.forming is not None:
            self.forming.alarm.sound(dead, text)

    def _form(self, plan: ShrinkPlan, new: Any, families: Sequence[Recreation], number: int) -> list[str]:
        """One attempt at world ``number``: ready barrier, default group, families, step, commit.

        Returns the keys of the worlds up to ``number`` to delete, on the member whose arrival completed the commit
        (listed while every member waited there); [] on the others. The commit's verdict is the attempt's outcome on
        every member: a member that fails on the way writes the failure there and raises it, as the others will.

        Raises:
            BarrierFailed: the attempt failed (its ``dead``: the attempt's ranks found dead).
        """
        new_rank, size = plan.old_to_new[self.rank], len(plan.order)
        old, base = self.world.watcher, self.world.base_store
        probe, side = None, None
        if old is not None:
            text = f"rank {self.rank} forms world {number}"
            calls = self.world.calls

            def probe() -> list[int]:  # the old world's roll call, and the arrivals' heartbeats
                found = (*old.probe(text), *self.intake.gone(plan, calls.connection(), self.timing.arrival_window_s))
                return [plan.old_to_new[rank] for rank in found if rank in plan.old_to_new]

            side = old.side
        if self.rank in self.intake.survivors(plan)[:2]:  # (two: one may die before it wrote them)
            self.intake.send_drafts(plan, number, {"ordinal": new._core.ordinal, "ordinals": self.world.job.ordinals})

        def barrier(step: str, what: str, wait_s: float) -> Barrier:
            deadline = time.monotonic() + wait_s
            return Barrier(base, f"hypergrid/elastic/{number}/{step}", new_rank, range(size), deadline, what, probe,
                           side, job=self.world.job, timing=self.timing)  # fmt: skip

        commit = barrier("commit", f"world {number}'s families", self.timeout_s)
        stale: list[str] = []
        commit.before_ok = lambda: stale.extend(world_keys(base, number))
        vigil: Vigil | None = None
        self.formation = Formation(Within(self.world.calls, reform.world_prefix(number)))  # (the waker: per thread)
        try:
            # After a failed attempt, a member may still be inside torch's wait of that attempt (bounded by
            # timeout_s, begun before this rank saw the failure): it is alive and comes once torch gives up, so
            # it is waited for that long on top, never declared missing while it is on its way.
            self.ready = False
            barrier("ready", f"forming world {number}", self.timeout_s * min(self.attempts, 2)).run()
            self.ready = True  # (on every member alike: the barrier's outcome is written once)
            # Survivors in their old order (no spare moved in): a backend that can shrink does it in place (on the
            # first attempt only: after a failed one the old world is gone).
            kept = self.attempts == 1 and list(plan.order) == sorted(plan.order) and not plan.arrived
            excluded = [gone for gone in range(self.size) if gone not in plan.old_to_new] if kept else None
            timeout = self.grid.group_options.get("timeout")
            # Until the commit passes, the attempt asks the old world's roll call (its watcher answers on; inside torch
            # through the vigil); the new world's watcher starts on the old one's connection once it ended.
            watch, prober = (None, None) if old is None else (old.on_dead, probe if new_rank < 2 else None)
            what, period_s = f"forming world {number}", self.timing.roll_bound_s(size)
            with Vigil(watch, plan.old_to_new, what, self._end_forming, prober, period_s) as vigil:
                namespace = reform_world(
                    base, number, self.world.namespace, new_rank, size, self.how, self.world.job, timeout, excluded,
                    self.torch_bound_s, self.formation.on,
                )  # fmt: skip
                self.formation.disarm()
                self.forming = self.world.successor_world(number, new_rank, size, namespace)
                new._core.adopt(self.forming, join=False)  # joined once the commit passed (`carry_on`)
                vigil.check()
                self.clock.lap("world")
                alarm = self.forming.alarm
                held = families if self.grid.strategy != "local" else held_by_all(families, alarm, number)
                recreate(new._core, held, self.torch_bound_s)
                self.clock.lap("families")
                vigil.check()
                self.agree_step(new, new_rank, number)
        except (HyperGridError, RuntimeError) as error:  # BarrierFailed too
            if isinstance(error, FencedError):
                raise
            said = quoted(error)
            heard = [] if vigil is None else vigil.dead  # (torch may pass the interruption on as its own error)
            dead = getattr(error, "dead", None) or heard or (probe() if probe is not None else [])
            commit.give_up(f"rank {new_rank} could not form world {number}: {said}", dead)
        commit.deadline = time.monotonic() + self.timeout_s
        commit.run()
        self.clock.lap("commit")
        return stale

    def agree_step(self, successor: Any, new_rank: int, number: int) -> None:
        """The step world ``number`` resumes from, and (with snapshots) every replica brought to it.

        One all-reduce (MIN) over the new world, the non-drafted spares included: the lowest step a member passed
        (`agreed`), the newest "oldest snapshot" of the members that restore (a drafted spare holds none), and
        whether all or only some restore. Where a restoring member lacks it, they share it over ``dim`` (`share_step`).
        """
        member = bool(successor.layout.contains(new_rank))
        snapshots = self.snapshots if member else None
        restoring = snapshots is not None
        held = snapshots.steps if snapshots is not None else ()
        values = [
            _NONE if self.step is None or not member else self.step,
            (-held[0] if held else -_NONE) if restoring else _NONE,
            int(restoring) if member else 1,
            -int(restoring) if member else 0,
        ]
        agreed = torch.tensor(values, dtype=torch.int64, device=default_device())
        alarm = None if self.forming is None else self.forming.alarm
        what = f"shrink: agreeing on the step of world {number}"
        communicate(alarm, what, dist.all_reduce, agreed, op=dist.ReduceOp.MIN)
        lowest, oldest, every, some = agreed.tolist()
        self.agreed = None if lowest == _NONE else lowest
        self._mixed = every == 0 and some == -1
        if not self._mixed and self.agreed is not None and -oldest > self.agreed:  # (the same on every member)
            create_missing(successor, [self.dim])  # (a death cut the first creation short: every member is here)
            if snapshots is not None:
                share_step(successor, self.dim, snapshots, self.agreed)
        self.clock.lap("step")

    def _failed(self, failed: BarrierFailed, number: int, plan: ShrinkPlan) -> list[int]:
        """The attempt at world ``number`` failed on every member: the old ranks it found dead."""
        with contextlib.suppress(RuntimeError, ValueError):
            tear_down(self.world.job)
        if self.forming is not None:  # a world formed for an attempt that failed: nobody joined it
            self.forming.close(leave=False)
            self.forming = None
        self.world.alarm.check_fence("grid.shrink")  # this rank was declared dead by the others
        gone = [plan.order[rank] for rank in failed.dead]
        if self.rank in gone:  # the others named this rank dead in the attempt (it was stopped): they went on
            self.world.fence(f"world {number}'s attempt found rank {self.rank} dead ({failed})")
            self.world.alarm.check_fence("grid.shrink")
        if not gone and self.ready and self.late + 1 < self.slices:  # late in torch's wait (timeout_s / slices):
            self.late += 1  # the same world again, until a late member was waited for timeout_s in all
            return gone
        if not gone:
            raise RankFailure(
                f"grid.shrink: forming world {number} failed ({failed}) and every member still answers, so the "
                "survivors cannot carry on without someone they still wait for; restart from a checkpoint",
                [],
            ) from failed
        self.clock.lap(f"attempt {self.attempts} failed (dead {format_ranks(gone)})")
        return gone


def _abortable(group: Any) -> bool:
    return isinstance(group, dist.ProcessGroup) and group is not dist.GroupMember.WORLD
