"""Growing back: a process that arrives after the job began joins it (``arrive``), and the grid grows (``grow``).

An arrival registers on the job's store (`hypergrid.agreement.arrivals`), wakes the running ranks (their grid waits
end with ``RankFailure`` naming nobody, and their recovery loop calls ``shrink``), and waits for a draft. The
survivors' ``shrink`` (or ``grow``, at a boundary of their choosing) agrees on the arrivals waiting and plans the
grid back towards the shape it was built with (`hypergrid.layout.grow.plan_regrow`); a drafted arrival computes
the same plan from its draft and forms the new world with them (`hypergrid.grid.recovery.Recovery`), the state of
the agreed step copied to it from a replica of its shard when it passed ``snapshots``. docs/elastic.md
("Growing back"), docs/design/recovery.md ("Growing back").
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from typing import Any

import torch.distributed as dist

from hypergrid.agreement.arrivals import RELEASE, Arrivals, Heartbeat, describe_arrival, wake
from hypergrid.agreement.barrier import BarrierFailed
from hypergrid.agreement.world import World
from hypergrid.binding.alarm import Job
from hypergrid.binding.facet import Facet
from hypergrid.errors import DesyncError, FencedError, InvalidArgumentError, RankFailure, UnexpectedArgumentError
from hypergrid.grid.elastic import check_resume, record
from hypergrid.grid.intake import Intake, decode_families, origin_digest
from hypergrid.grid.recovery import Recovery
from hypergrid.grid.regrid import Regrid
from hypergrid.grid.snapshots import StepSnapshots
from hypergrid.grid.succession import successor
from hypergrid.launch.envstore import job_store
from hypergrid.launch.memberlog import job_log, member_id
from hypergrid.layout.shrink import ShrinkPlan, check_policy, check_replica_dim
from hypergrid.timing import Timing
from hypergrid.validation import check_bool, refuse
from hypergrid.values import check_timeout, shown

__all__ = ["Growth"]

#: The draft an arrival writes when it gives up (``timeout_s``): a survivor's draft after it is not taken.
WITHDRAWN = "withdrawn"


class Growth(Facet):
    """``grow`` on the running ranks, ``arrive`` on a process that joins later (a facet object)."""

    def grow(
        self,
        *positional: object,
        snapshots: StepSnapshots | None = None,
        step: int | None = None,
        dim: str = "dp",
        policy: str = "drop",
        timeout_s: float | None = None,
    ) -> Regrid:
        """Take in the processes waiting in ``arrive``, at a step boundary every rank of the world chose.

        ``shrink`` with nobody named dead (its arguments are ``shrink``'s): collective over every rank of the world,
        spares included. The survivors agree on the arrivals waiting for a grid built as this one; the grid grows
        along ``dim`` towards the shape it was built with (never past it), one whole slice of ``dim`` per group of
        arrivals (spares first), and holes a death left are filled; arrivals left over become spares up to the
        number the grid was built with. A rank found dead meanwhile is absorbed as in ``shrink``. With nobody
        waiting it re-forms the world as it is (about a ``shrink``'s cost): call it where a step boundary is cheap,
        or let ``shrink`` take arrivals in (it does, after every death), or let an arrival's wake end the ranks' waits
        (``arrive``). ``Regrid.arrived`` lists the new ranks of those that joined.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> from hypergrid.errors import InvalidArgumentError
            >>> try:
            ...     HyperCommGrid([2], ["dp"]).grow(policy="bad")
            ... except InvalidArgumentError as error:
            ...     print(error)
            grow: policy must be one of ['drop', 'spares', 'spares_then_drop'], got 'bad'
            >>> try:  # doctest: +ELLIPSIS
            ...     HyperCommGrid([2], ["dp"]).grow(1)  # an UnexpectedArgumentError, a TypeError
            ... except TypeError as error:
            ...     print(error)
            grow: takes keyword arguments only (snapshots=, step=, dim=, policy=, timeout_s=), got 1 positional: ...
        """
        if positional:  # (keyword-only: a number would be read as a count of arrivals, which grow does not take)
            raise UnexpectedArgumentError(
                f"grow: takes keyword arguments only (snapshots=, step=, dim=, policy=, timeout_s=), got "
                f"{len(positional)} positional: {shown(list(positional))}; it takes in every arrival that waits"
            )
        self.layout._one_dim(dim)  # the arguments, refused here before torch.distributed is asked for
        check_replica_dim("grow", dim, self._core.root.replicas)
        check_policy(policy)
        if timeout_s is not None:
            check_timeout(timeout_s, "timeout_s")
        check_resume(self._core.root, "grow", dim, step, snapshots)
        regrid: Regrid = self._core.root.shrink(
            None, dim=dim, policy=policy, timeout_s=timeout_s, step=step, snapshots=snapshots
        )
        return regrid

    def arrive(
        self,
        timeout_s: float | None = None,
        *,
        snapshots: StepSnapshots | None = None,
        store: Any = None,
        wake_ranks: bool = True,
    ) -> Regrid | None:
        """On a process started after the job began: join the running job's grid; its `Regrid` (None: not taken).

        Call it on a grid built as the job's ranks built theirs (the same shape, dims and settings: the shape it
        was built with, whatever shrinks did since), before ``torch.distributed`` is initialized here. The process
        registers on the job's store, wakes the running ranks (``wake_ranks``: a roll call that ends their grid
        waits with ``RankFailure`` naming nobody; their recovery loop's ``shrink`` takes it in), and waits until a
        ``shrink`` or ``grow`` drafts it. It then forms the new world with them: ``torch.distributed`` is initialized
        on return, ``Regrid.grid`` is the grid to use, and with ``snapshots`` (empty, over this process's model) it
        holds the state of the agreed step (``Regrid.step``), copied from a replica of its shard. A running job
        pays nothing for arrivals on a healthy step. An arrival that dies or stops while it joins is dropped
        (its heartbeat stands still) and the others carry on.

        Args:
            timeout_s: how long to wait for a draft (None: until the job ends, ``release_spares``).
            snapshots: this process's `StepSnapshots` (empty): restored at the agreed step.
            store: the job's store, as its ranks' default group holds it (default: on a rank a shrink retired, its
                job's; else `hypergrid.launch.job_store`, from ``MASTER_ADDR``/``MASTER_PORT`` as ``hypergrid.run``
                and torchrun set them).
            wake_ranks: end the running ranks' waits so that they take it in now (False: at their next
                ``shrink`` or ``grow``).

        Returns:
            The `Regrid` (``rank``: this process's rank in the new world), or None: the job ended
            (``release_spares``) or ``timeout_s`` passed without a draft.

        Raises:
            InvalidArgumentError: torch.distributed is initialized here already (a member calls ``grow``), a bad
                ``timeout_s``, ``snapshots``, ``store`` or ``wake_ranks``, or a bad ``HYPERGRID_LIVENESS_S`` or
                ``HYPERGRID_PROBE_S``.
            DesyncError: the draft's grid is not this one (its dims differ).
            FencedError: the others went on without it (it stopped while it joined).
            RankFailure: as ``shrink`` (the new world could not form).
            StoreLostError: the job's store is gone (its host died), as on the job's ranks.

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2], ["dp"]).arrive(0.1, store=dist.HashStore())  # nobody drafts it
        """
        deadline = None if timeout_s is None else time.monotonic() + check_timeout(timeout_s, "timeout_s")
        if snapshots is not None and not isinstance(snapshots, StepSnapshots):
            raise refuse("arrive", "snapshots", snapshots, "a hypergrid.StepSnapshots or None", InvalidArgumentError)
        waking = check_bool("arrive", "wake_ranks", wake_ranks)
        if store is not None and not isinstance(store, dist.Store):  # type: ignore[attr-defined]
            raise refuse("arrive", "store", store, "a torch.distributed.Store or None", InvalidArgumentError)
        if dist.is_available() and dist.is_initialized():
            raise InvalidArgumentError(
                f"arrive: torch.distributed is initialized in this process (rank {dist.get_rank()} of "
                f"{dist.get_world_size()}); arrive is for a process started after the job began: a member calls "
                "grow() or shrink()"
            )
        timing = Timing.from_env(self._core.root.guard_timeout_s)  # (a bad setting is refused before registering)
        held = self._core.registry.world  # a rank a shrink retired: the job it was in
        store = store if store is not None else held.base_store if held is not None else job_store()
        job = held.job if held is not None else Job(store)
        with job.store_calls("arrive"):  # the store's loss: StoreLostError, as on the job's ranks
            arrivals = Arrivals(store)
            grid = self._core.root
            number = arrivals.register(origin_digest(grid), describe_arrival())
            if number is None:  # the job ended already
                return None
            log = job_log(store)
            if log is not None:  # under hypergrid.run: who it is, before any shrink can take it in
                log.append("arrived", arrival=number, member=member_id(number), pid=os.getpid())
            heartbeat = Heartbeat(_connection(store), number, timing).start()
            regrid = None
            try:
                while True:
                    text = _await_draft(arrivals, store, number, deadline, waking, timing.arrival_window_s)
                    if text is None:
                        return None
                    regrid = _join(grid, store, number, json.loads(text), snapshots)
                    if regrid is not None:
                        return regrid
                    arrivals.withdraw(number)  # drafted, then a later attempt went on without it: it waits again
            finally:
                heartbeat.stop()
                arrivals.depart(number, joined=regrid is not None)


def _connection(store: Any) -> Any:
    """A second connection to ``store`` for the heartbeat's thread (the store itself where it has none)."""
    try:
        return store.clone()
    except (AttributeError, RuntimeError):
        return store


def _await_draft(
    arrivals: Arrivals, store: Any, number: int, deadline: float | None, waking: bool, look_s: float
) -> str | None:
    """The arrival's draft (None: released, or the deadline passed and it withdrew); wakes each new world that did
    not weigh it yet. It waits on its draft key ``look_s`` at a time between two looks at the running job."""
    woken: tuple[int, int] | None = None
    while True:
        text = arrivals.draft(number)
        if text is None and deadline is not None and time.monotonic() >= deadline:
            text = store.compare_set(Arrivals.key("draft", number), "", WITHDRAWN).decode()
            return None if text == WITHDRAWN else text
        if text is not None:
            return None if text == RELEASE else text
        if arrivals.closed():  # the job ended while it was drafted then left out (its draft withdrawn since)
            return None
        world = arrivals.running_world() if waking else None
        if world is not None and world != woken and not arrivals.considered(number):
            said = f"a process arrived to join the grid (arrival {number})"
            woken = world if wake(store, world[0], world[1], said) else woken
        with contextlib.suppress(dist.DistStoreError):  # (torch's timeout: look again; a lost store raises)
            store.wait([Arrivals.key("draft", number)], datetime.timedelta(seconds=look_s))


def _join(grid: Any, store: Any, number: int, draft: dict[str, Any], snapshots: StepSnapshots | None) -> Regrid | None:
    """Form the new world with the survivors, as ``draft`` says; None where the plan went on without this one."""
    if list(draft["dims"]) != list(grid.dim_names):
        raise DesyncError(
            f"arrive: the running grid's dims are {draft['dims']} and this grid's are {list(grid.dim_names)}; build "
            "the grid as the job's ranks built theirs"
        )
    size, old = int(draft["size"]), int(draft["old"])
    now = ShrinkPlan("drop", tuple(draft["shape"]), int(draft["rank_offset"]), int(draft["spares"]), (), (), ())
    current = successor(grid, now)  # the running grid, as this process has it (no group)
    current._core.inherit_origin((tuple(draft["origin"][0]), draft["origin"][1], draft["origin"][2]))
    me = size + list(draft["arrivals"]).index(number)
    job = Job(store)
    job.ordinals.update(draft["ordinals"])  # the grids the survivors built: the guard compares ordinals
    world = World(old, me, size, job, draft["namespace"])
    how = (str(draft["backend"]), datetime.timedelta(seconds=float(draft["timeout_s"])))
    intake = Intake(store, size, {size + i: arrival for i, arrival in enumerate(draft["arrivals"])})
    if snapshots is not None:  # (a rank a shrink retired held steps of its own: they are behind the others')
        snapshots.clear()
    timeout = float(draft["shrink_timeout_s"])
    recovery = Recovery(current, world, size, timeout, snapshots=snapshots, how=how, intake=intake)
    families = decode_families(draft["families"])
    plan, new = recovery.plan(draft["dead"], draft["policy"], draft["dim"], families)
    new._core.take_ordinal(draft["ordinal"])
    if me not in plan.old_to_new:
        world.close(leave=False)
        return None
    arrivals = Arrivals(store)
    weighed = arrivals.considered(number)  # (by an earlier shrink that did not need it)
    try:
        regrid = recovery.carry_on(plan, new, families, draft["policy"], draft["dim"], first=int(draft["number"]))
    except (BarrierFailed, RankFailure) as failed:
        running = arrivals.running_world()  # (None once the job ended)
        formed = running is not None and running[0] >= int(draft["number"])  # its world, or a later one, formed
        if not formed and (weighed or not arrivals.considered(number)):  # ...or weighed it since: it went on without
            raise
        raise FencedError(  # the others formed the world it was drafted for (or a later one) without it
            f"arrive: the others formed a later world without arrival {number} (it did not keep up while it "
            f"joined: {failed}); start a new process to join again"
        ) from failed
    if regrid.rank is None:
        return None
    record(recovery, regrid)
    return regrid
