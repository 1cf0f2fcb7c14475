"""One survivor's ``shrink``: agree on the dead, check the whole plan, tear down, then form worlds until one holds.

``grid.shrink`` (`hypergrid.grid.elastic`) validates its arguments and hands
over to `Recovery`:

1. **Who is dead**, as ``shrink``'s docstring says: the world's roll calls (`hypergrid.agreement.watcher`), then
   the membership round (`hypergrid.agreement.membership`), whose liveness probes find a rank dying meanwhile.
2. **The plan, checked whole** (`hypergrid.layout.shrink`): a refusal leaves the old grid and world as they were.
3. **Tear down** the old groups (never waiting on a dead peer).
4. **Form the new world**, attempt after attempt: a barrier where every member shows up, the default group under
   the new epoch's store prefix, the families re-created, and a commit barrier whose outcome is written once. Before
   the commit, the members agree on the step to resume from (one all-reduce over the new world: the lowest step a
   survivor passed, `Recovery.agree_step`) and, with `hypergrid.grid.snapshots.StepSnapshots`, bring every replica
   to it. torch's waits are bounded so that none lasts over ``timeout_s`` (gloo's wait for a member that died
   mid-handshake is 5 times its timeout: `GLOO_WAITS`), and a `hypergrid.agreement.barrier.Vigil` ends them on
   every member as soon as the old world's roll call finds a member dead (the first two members ask it every
   0.5 s meanwhile). Once the commit passes, the old world ends and its watcher's store connection serves the new
   world's watcher (`hypergrid.agreement.world.World.take_over`: no connection is opened on the way), and the
   member that completed the commit deletes torch's rendezvous keys of every world up to it, listed while every
   member waited in the commit (`hypergrid.binding.reform.world_keys`: keys written after it, by a creation on
   the new world, stay). A death anywhere in an attempt ends it on every member, through the old world's roll
   call: its verdict names the dead, who join the dead set, and the next attempt forms the next epoch's world from
   the same old layout. Retired ranks (``"drop"``) only ever grow, so a rank retired by one attempt stays retired.

Every failure that cannot be absorbed (no complete replica, a view that no longer fits, an attempt in which nobody
new died yet not every member arrived, torch's waits for a late member retried until they added up to ``timeout_s``)
is a ``HyperGridError`` on every survivor.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.agreement.barrier import Barrier, BarrierFailed, Vigil, probe_every_s
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.liveness import FAILURE, ended_key
from hypergrid.agreement.liveness import PREFIX as LIVE_PREFIX
from hypergrid.agreement.membership import MembershipRound, Proposal, round_prefix
from hypergrid.agreement.world import World, adopt, current_watcher, current_world, register
from hypergrid.binding import alarm
from hypergrid.binding.failures import communicate
from hypergrid.binding.reform import (
    Epoch,
    current_epoch,
    forget_keys,
    forget_numbered,
    reform_world,
    retire,
    tear_down,
    world_keys,
)
from hypergrid.binding.registry import PgKey, guard_key
from hypergrid.errors import DesyncError, FencedError, HyperGridError, RankFailure
from hypergrid.grid.regrid import Phases, Regrid
from hypergrid.grid.snapshots import MAX_STEP, StepSnapshots, share_step
from hypergrid.launch.processes import default_device
from hypergrid.layout.hierarchy import hierarchical_family
from hypergrid.layout.shrink import ShrinkPlan, plan_shrink
from hypergrid.values import format_ranks

__all__ = ["Recovery", "families_digest"]

#: A recreation (one family to re-create): its key, and what ``create_families`` needs (dims, view, tag, kwargs).
Recreation = tuple[PgKey, dict[str, Any]]

#: The step agreement's "no value" (the neutral element of its MIN), above every step.
_NONE = MAX_STEP + 1
#: gloo (torch 2.13) waits 5 x its timeout for a member that published its address and died before connecting.
GLOO_WAITS = 5


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
        epoch: the old world's epoch (its number and the base store).
        world: the old world's size.
        timeout_s: the bound of each wait on a rank that is alive but absent, and of torch's waits.
        step: the step this rank is in (None: none, as on a spare), or taken from ``snapshots``.
        snapshots: this rank's `StepSnapshots`, brought to the agreed step (None: the caller restores).
    """

    def __init__(
        self,
        grid: Any,
        epoch: Epoch,
        world: int,
        timeout_s: float,
        step: int | None = None,
        snapshots: StepSnapshots | None = None,
    ) -> None:
        self.grid = grid
        self.epoch = epoch
        self.world = world
        self.timeout_s = timeout_s
        self.step = snapshots.step if snapshots is not None else step
        self.snapshots = snapshots
        self.agreed: int | None = None  # the step the new world resumes from (`agree_step`)
        self._mixed = False  # some members passed snapshots and others did not
        self.dim = "dp"
        self.rank = dist.get_rank()
        self.slices = GLOO_WAITS if dist.get_backend() == "gloo" else 1  # torch's waits: timeout_s in that many
        self.torch_bound_s, self.late, self.ready = timeout_s / self.slices, 0, False
        self.clock = Phases()
        self.attempts = 0

    # -- 1. who is dead ---------------------------------------------------------------

    def agree(self, proposal: Proposal) -> tuple[int, ...]:
        """The dead ranks every survivor agreed on (``proposal``'s dead, plus any found meanwhile)."""
        watcher = current_watcher()
        probe = None if watcher is None else (lambda: watcher.probe(f"rank {self.rank} waits in shrink"))
        side = None if watcher is None else watcher.side
        prefix = round_prefix(self.epoch.number)
        dead = MembershipRound(
            self.epoch.base_store, prefix, self.rank, range(self.world), proposal, self.timeout_s, probe, side
        ).run()
        self.clock.lap("agreement")
        return dead

    def known_dead(self, named: Sequence[int]) -> list[int]:
        """``named``, plus every rank the world's roll calls found dead (one is run now if none has been)."""
        watcher = current_watcher()
        if watcher is None:
            return sorted(named)
        if watcher.failure is None:
            watcher.report(FAILURE, f"rank {self.rank} called shrink")  # every rank's waits end: all come here
        alarm.check_fence("grid.shrink")
        return sorted({*named, *watcher.dead})

    # -- 2. the plan ----------------------------------------------------------------------

    def plan(
        self, dead: Sequence[int], policy: str, dim: str, families: Sequence[Recreation]
    ) -> tuple[ShrinkPlan, Any]:
        """The new world and the successor grid, every family checked on it; nothing is torn down here."""
        grid = self.grid
        plan = plan_shrink(grid.layout, self.world, grid.spares, dead, dim, policy)
        successor = grid._core.successor(plan)  # views checked here (the grid's Elastic's)
        for _, spec in families:
            _, layout, view = successor._core.family(spec["dims"], spec["view"])
            scope = next((half for half in ("within", "across") if half in spec["kwargs"]), None)
            if scope is not None:  # a half that no longer fits is refused now, not after the teardown
                ordered = view.layout.canonical_dims(spec["dims"])
                hierarchical_family(layout, ordered, scope, spec["kwargs"]["ranks_per_node"])
        return plan, successor

    # -- 3.-4. tear down, then form worlds until one holds --------------------------------

    def carry_on(
        self, plan: ShrinkPlan, successor: Any, families: Sequence[Recreation], policy: str, dim: str
    ) -> Regrid:
        """Tear the old world down and form the new one (attempt after attempt); this rank's `Regrid`.

        The old world's watcher answers for this rank until the new world holds: it is the liveness every attempt
        asks (the new world's watchers start once its commit passed), and it ends with the old world (`end_world`).
        """
        grid, world = self.grid, current_world()
        old = None if world is None else world.watcher
        if world is not None:
            world.reforming = True  # the teardown of its default group does not close it: its watcher answers on
        self.dim = dim
        if plan.order and self.rank == plan.order[0]:
            store: Any = c10d._get_default_store()
            for dead in plan.dead:  # the dead cannot release their guard announcements themselves
                store.delete_key(announce_key(dead))
        grid._core.root._core.guard_ledger.dead.update(plan.dead)  # nor count themselves out of the grid's last commits
        grid.abort()
        self.clock.lap("abort")
        number = self.epoch.number + 1
        while True:
            self.attempts += 1
            if self.rank not in plan.old_to_new:
                retire()
                if old is not None:  # until the survivors end the old world (see Watcher.join), which names
                    old.join(max(60.0, 4 * self.timeout_s))  # every rank dead by then (later attempts may add)
                    if old.end_dead is not None:
                        plan = plan_shrink(self.grid.layout, self.world, self.grid.spares, old.end_dead, dim, policy)
                if world is not None:
                    world.close(leave=False)
                return self._regrid(None, None, number, plan, dim)
            try:
                stale = self._form(plan, successor, families, number, old)
            except BarrierFailed as failed:  # the attempt's outcome, the same on every member
                gone = self._failed(failed, number, plan)
                plan, successor = self.plan(sorted({*plan.dead, *gone}), policy, dim, families)
                number += 1
                continue
            # Every member committed: no one reads the keys listed while all waited there (torch's rendezvous ones)
            forget_keys(self.epoch.base_store, stale)
            if plan.old_to_new[self.rank] == 0:
                # nor a key of the worlds before the old one: their last wake (a world's end woke every watcher,
                # some after they had read it and left) can land after its watcher ended
                forget_numbered(self.epoch.base_store, LIVE_PREFIX, self.epoch.number - 1)
            if old is not None:
                old.end_world(plan.dead, self.world)  # and its record, for a rank left behind that resumes later
                old.join(self.timeout_s)
                if plan.dead and plan.old_to_new[self.rank] == 0:  # the record goes with the new grid (or next shrink)
                    successor._core.guard_ledger.ended.append(ended_key(self.epoch.number))
            self._watch(world, number, plan.old_to_new[self.rank], len(plan.order))
            if self._mixed:
                raise DesyncError(
                    "grid.shrink: some survivors passed snapshots= and others did not (a drafted spare's "
                    "standby(snapshots=...) included); pass it on every rank or on none"
                )
            member = successor.layout.contains(plan.old_to_new[self.rank])
            if self.snapshots is not None and self.agreed is not None and member:
                self.snapshots.restore(self.agreed)
            return self._regrid(successor, plan.old_to_new[self.rank], number, plan, dim)

    def _regrid(self, grid: Any, rank: int | None, number: int, plan: ShrinkPlan, dim: str) -> Regrid:
        return Regrid(
            grid,
            rank,
            number,
            plan.dead,
            retired=rank is None,
            old_to_new=plan.old_to_new,
            source=plan.source,
            policy=plan.policy,
            dim=dim,
            seconds=self.clock.seconds,
            attempts=self.attempts,
            step=None if rank is None else self.agreed,
        )

    def _watch(self, old: World | None, number: int, rank: int, size: int) -> None:
        """Adopt the new world ``number``: its watcher on the old world's connection (or a new one without it)."""
        world = current_world() or World(number, rank, size, self.epoch.base_store, namespace=current_epoch().namespace)
        if old is not None:
            world.take_over(old)
        world.start_watching()
        adopt(world)

    def _form(
        self, plan: ShrinkPlan, successor: Any, families: Sequence[Recreation], number: int, old: Any
    ) -> list[str]:
        """One attempt at world ``number``: ready barrier, default group, families, step, commit (``old``: watcher).

        Returns the keys of the worlds up to ``number`` to delete, on the member whose arrival completed the commit
        (it listed them while every member waited there, so none written after the commit is among them); [] on the
        others. The commit barrier's verdict is the attempt's outcome on every member: a member that fails on the
        way (a dead member found by the old world's roll call, torch giving up in a bounded wait) writes the
        failure there and raises it, as the members waiting there will.

        Raises:
            BarrierFailed: the attempt failed (its ``dead``: the attempt's ranks found dead).
        """
        new_rank, size = plan.old_to_new[self.rank], len(plan.order)
        probe, side = None, None
        if old is not None:
            text = f"rank {self.rank} forms world {number}"
            probe = lambda: [plan.old_to_new[r] for r in old.probe(text) if r in plan.old_to_new]  # noqa: E731
            side = old.side

        def barrier(step: str, what: str, wait_s: float) -> Barrier:
            deadline = time.monotonic() + wait_s
            return Barrier(self.epoch.base_store, f"hypergrid/elastic/{number}/{step}", new_rank, range(size),
                           deadline, what, probe, side)  # fmt: skip

        commit = barrier("commit", f"world {number}'s families", self.timeout_s)
        stale: list[str] = []
        commit.before_ok = lambda: stale.extend(world_keys(self.epoch.base_store, number))
        try:
            # After a failed attempt, a member may still be inside torch's wait of that attempt (bounded by
            # timeout_s, begun before this rank saw the failure): it is alive and comes once torch gives up, so
            # it is waited for that long on top, never declared missing while it is on its way.
            self.ready = False
            barrier("ready", f"forming world {number}", self.timeout_s * min(self.attempts, 2)).run()
            self.ready = True  # (on every member alike: the barrier's outcome is written once)
            # Survivors in their old order (no spare moved in): a backend that can shrink does it in place (on the
            # first attempt only: after a failed one the old world is gone).
            kept = self.attempts == 1 and list(plan.order) == sorted(plan.order)
            excluded = [gone for gone in range(self.world) if gone not in plan.old_to_new] if kept else None
            timeout = self.grid.group_options.get("timeout")
            # Until the commit passes, the attempt asks the old world's roll call (its watcher answers on; inside torch
            # through the vigil); the new world's watcher starts on the old one's connection once it ended (`_watch`).
            watch, prober = (None, None) if old is None else (old.on_dead, probe if new_rank < 2 else None)
            with Vigil(watch, plan.old_to_new, f"forming world {number}", prober, probe_every_s(size)) as vigil:
                formed = reform_world(self.epoch, new_rank, size, timeout, excluded, number, self.torch_bound_s)
                register(World(number, new_rank, size, self.epoch.base_store, namespace=formed.namespace))
                vigil.check()
                self.clock.lap("world")
                successor._core.recreate(self.held_by_all(families, number), self.torch_bound_s)
                self.clock.lap("families")
                vigil.check()
                self.agree_step(successor, new_rank, number)
        except (HyperGridError, RuntimeError) as error:  # BarrierFailed too
            if isinstance(error, FencedError):
                raise
            said = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            dead = getattr(error, "dead", None) or (probe() if probe is not None else [])
            commit.give_up(f"rank {new_rank} could not form world {number}: {said}", dead)
        commit.deadline = time.monotonic() + self.timeout_s
        commit.run()
        self.clock.lap("commit")
        return stale

    def held_by_all(self, families: Sequence[Recreation], number: int) -> list[Recreation]:
        """The families to re-create in world ``number``: on a ``"local"`` grid, those every member holds.

        Members-only creation commits each group alone: a death while one group was made rolls the family back on
        that group's members, and the other groups keep it. Such a grid's survivors agree on the dead without
        comparing families (`families_digest`), and here keep the families all of them hold, in their order: one
        all-reduce (MAX, the longest list) and one all-gather of a 60-bit hash per family. Any other grid's
        families were compared already (its failed creations roll back on every rank).
        """
        if self.grid.strategy != "local":
            return list(families)
        device = default_device()
        hashes = [
            int(hashlib.sha1(guard_key(key).encode(), usedforsecurity=False).hexdigest()[:15], 16)
            for key, _ in families
        ]
        longest = torch.tensor([len(hashes)], dtype=torch.int64, device=device)
        communicate(f"shrink: the families of world {number}", dist.all_reduce, longest, op=dist.ReduceOp.MAX)
        if not longest.item():
            return []
        mine = torch.full((int(longest.item()),), -1, dtype=torch.int64, device=device)
        mine[: len(hashes)] = torch.tensor(hashes, dtype=torch.int64, device=device)
        held = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        communicate(f"shrink: the families of world {number}", dist.all_gather, held, mine)
        common = set.intersection(*(set(each.tolist()) for each in held))
        return [family for family, value in zip(families, hashes) if value in common]

    def agree_step(self, successor: Any, new_rank: int, number: int) -> None:
        """The step world ``number`` resumes from, and (with snapshots) every replica brought to it.

        One all-reduce (MIN) over the new world, the non-drafted spares
        included: the lowest step a member passed (`agreed`), the newest
        "oldest snapshot" of the members that restore (a drafted spare holds
        none), and whether all or only some of the grid's members restore.
        When some restoring member lacks the agreed step, every one of them
        shares it over its ``dim`` group (`share_step`).
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
        communicate(f"shrink: agreeing on the step of world {number}", dist.all_reduce, agreed, op=dist.ReduceOp.MIN)
        lowest, oldest, every, some = agreed.tolist()
        self.agreed = None if lowest == _NONE else lowest
        self._mixed = every == 0 and some == -1
        if snapshots is not None and not self._mixed and self.agreed is not None and -oldest > self.agreed:
            share_step(successor, self.dim, snapshots, self.agreed)
        self.clock.lap("step")

    def _failed(self, failed: BarrierFailed, number: int, plan: ShrinkPlan) -> list[int]:
        """The attempt at world ``number`` failed on every member: the old ranks it found dead."""
        with contextlib.suppress(RuntimeError, ValueError):
            tear_down()
        alarm.check_fence("grid.shrink")  # this rank was declared dead by the others
        gone = [plan.order[rank] for rank in failed.dead]
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
