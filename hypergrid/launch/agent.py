"""``MinHealthyAgent``: torchelastic's local agent with a monitoring policy that keeps the survivors running.

torchrun's ``LocalElasticAgent`` stops every worker when one fails; an elastic grid needs the survivors to shrink
past the dead and carry on. This agent is the same agent (rendezvous, worker environment, the store hosted by the
agents, logs, restarts) with three methods replaced: monitoring, the run loop (the minimum-healthy rule, job-wide:
``hypergrid.launch.health``) and the exit barrier, after which the run is judged (``hypergrid.launch.outcomes``,
from the round's membership log, ``hypergrid.launch.memberlog``). docs/launcher.md describes each.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

from torch.distributed import DistNetworkError, TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from hypergrid.launch.answerer import NodeAnswerer, NodeWatchFactory
from hypergrid.launch.errorfile import raised
from hypergrid.launch.health import HealthRound
from hypergrid.launch.memberlog import (
    LOG_ENV,
    MemberLog,
    accounted,
    agree_log,
    format_members,
    members_of,
    parse_members,
)
from hypergrid.launch.outcomes import WorkerOutcome, judge, summary
from hypergrid.launch.replacements import Replacements
from hypergrid.launch.ring import AgentRing, local_address
from hypergrid.timing import Timing
from hypergrid.validation import check_int, refuse
from hypergrid.values import described, format_ranks

__all__ = ["MinHealthyAgent", "WorkerOutcome", "report"]

PREFIX = "hypergrid.run: "


def report(message: str) -> None:
    """One line of the launcher's own, on stderr (the workers' output keeps stdout)."""
    print(PREFIX + message, file=sys.stderr, flush=True)


class MinHealthyAgent(LocalElasticAgent):
    """torchelastic's ``LocalElasticAgent`` whose monitoring keeps the surviving workers running.

    Args:
        spec: the worker spec (a command: ``entrypoint`` is a program, as under torchrun).
        logs_specs: where the workers' output goes (torchrun's ``--log-dir``, ``--tee``, ...).
        min_healthy: the job-wide minimum of workers that have not failed; below it the agent restarts every
            worker (``spec.max_restarts`` allowing) or stops them and fails.
        exit_barrier_timeout_s: how long an agent whose workers have all exited waits for the other agents'
            workers before it exits anyway.
        replace_dead: how many workers it may start in place of dead ones per round (``--replace-dead``,
            ``--max-replacements``; `hypergrid.launch.replacements`); 0: none.
        on_death: ``on_death(store, log, members, world_size, said)``, run the moment a worker is seen failed,
            or another agent watched through the ring (`hypergrid.launch.ring`) is seen dead, with its workers
            (``hypergrid.agreement.sentinel.announce_death``: the survivors' roll call); ``members`` as the round's
            log names them (`hypergrid.launch.memberlog`); never raises out.
        node_watch: ``node_watch(connect, log, directory, report)``: each round's answerer of the roll call for
            this node's workers (`hypergrid.launch.answerer`); None: each worker answers for itself.
        start_method, log_line_prefix_template, shutdown_timeout: as for ``LocalElasticAgent``.

    Raises:
        InvalidArgumentError: ``entrypoint`` is not a command, or ``min_healthy`` is not a positive int.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        logs_specs: LogsSpecs,
        *,
        min_healthy: int,
        exit_barrier_timeout_s: float,
        start_method: str = "spawn",
        log_line_prefix_template: str | None = None,
        shutdown_timeout: int = 30,
        on_death: Callable[[Any, str, list[str], int, str], object] | None = None,
        replace_dead: int = 0,
        node_watch: NodeWatchFactory | None = None,
    ) -> None:
        if not isinstance(spec.entrypoint, str):
            raise refuse("MinHealthyAgent", "entrypoint", spec.entrypoint, "a command (str), as torchrun runs")
        check_int("MinHealthyAgent", "min_healthy", min_healthy, 1)
        super().__init__(
            spec,
            logs_specs,
            start_method,
            exit_barrier_timeout=exit_barrier_timeout_s,
            log_line_prefix_template=log_line_prefix_template,
            shutdown_timeout=shutdown_timeout,
        )
        self.min_healthy, self.exit_barrier_timeout_s = min_healthy, exit_barrier_timeout_s
        self.outcomes: dict[int, WorkerOutcome] = {}  # global rank -> how it ended (this round)
        self.restarts_used = 0
        self.job_failed = self.job_workers = 0  # the last round's job-wide failed workers, as last read; its workers
        self.health: HealthRound | None = None
        self.ring: AgentRing | None = None  # this round's watch of the next agent (several nodes only)
        self.log = self.verdict = ""  # the round's membership log (memberlog: in the workers' environment); the end
        self.on_death, self.replace_dead = on_death, replace_dead
        self.timing = Timing.from_env()  # (the agent's bounds: its ring, its replacements, its waits on the store)
        self.replacements = Replacements(0, self.timing)  # this round's workers started in place of dead ones
        self.answerer = NodeAnswerer(node_watch, report)  # who answers the roll call for this node's workers
        self._store_client: Any = None
        self._client_lock = threading.Lock()

    def _start_workers(self, worker_group: Any) -> dict[int, Any]:
        """torchelastic's start, with the round's log named in the workers' environment (they inherit ours)."""
        self.log = agree_log(worker_group.store, self.restarts_used)
        with self._client_lock:
            self._store_client = None  # (a new round may have a new store)
        os.environ[LOG_ENV] = self.log
        self.answerer.begin(self._connect, self.log)
        started: dict[int, Any] = super()._start_workers(worker_group)
        return started

    # -- one round: the workers of one rendezvous --------------------------------

    def _begin_round(self) -> None:
        group = self._worker_group
        if self.health is not None:
            self.health.stop_watching()
        self._leave_ring()
        self.replacements.stop()
        self.replacements = Replacements(self.replace_dead, self.timing)
        self.outcomes = {}
        self.job_workers = group.workers[0].world_size
        self.health = HealthRound(
            group.store,
            self.restarts_used,
            workers=self.job_workers,
            agents=cast(int, group.group_world_size),  # set by the rendezvous (torch types it None)
            min_healthy=self.min_healthy,
        )
        self.health.start_watching()
        if self.on_death is not None and self.health.agents > 1:
            self._join_ring(group)

    def _join_ring(self, group: Any) -> None:
        """Watch the next agent of the round (`AgentRing`): its death is its workers' (they die with it)."""
        health = cast(HealthRound, self.health)  # (set by the round's start)
        ring = AgentRing(
            group.store,
            health.prefix,
            self._index(),
            health.agents,
            [worker.global_rank for worker in group.workers],
            self._agent_lost,
            host=local_address(str(group.master_addr)),
            report=report,
            timing=self.timing,
        )
        try:
            ring.start()
        except Exception as error:  # the job runs on; the others' workers find this node's deaths their own way
            report(f"could not join the agents' ring ({described(error)})")
            ring.close()  # (its record of leaving: the agent watching this one finds no death)
            return
        self.ring = ring

    def _leave_ring(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    def _index(self) -> int:
        return int(cast(int, self._worker_group.group_rank))  # this agent's place, set by the rendezvous

    def _agent_lost(self, index: int, ranks: list[int], said: str) -> None:
        """The ring found agent ``index`` dead: its workers went with it; tell the survivors, and count them."""
        health = self.health
        report(f"worker ranks {format_ranks(ranks)} {said}")
        self._announce(members_of(ranks, self.replace_dead), said)  # (with any replacement it started)
        if health is None:
            return
        try:
            health.count_dead_agent(index, ranks, f"ring {self._index()}", self._read_accounted)
        except Exception as error:  # (the store's host was the dead agent: nothing left to count on)
            report(f"could not count ranks {format_ranks(ranks)} as failed ({described(error)})")

    def _handlers(self) -> dict[int, Any]:
        return cast(dict[int, Any], getattr(self._pcontext, "subprocess_handlers", None) or {})

    def _error_files(self) -> dict[int, str]:
        return cast(dict[int, str], getattr(self._pcontext, "error_files", None) or {})

    def _exits(self, stopped: bool = False) -> list[WorkerOutcome]:
        """The workers seen exited since the last call (all the rest, read after a stop, when ``stopped``)."""
        found = []
        for local_rank, handler in sorted(self._handlers().items()):
            worker = self._worker_group.workers[local_rank]
            if worker.global_rank in self.outcomes:
                continue
            exitcode = handler.proc.poll()
            if exitcode is None and not stopped:
                continue
            said = raised(self._error_files().get(local_rank, "")) if exitcode and exitcode > 0 else None
            outcome = WorkerOutcome(worker.global_rank, local_rank, handler.proc.pid, exitcode, stopped, said)
            self.outcomes[outcome.rank] = outcome
            found.append(outcome)
        return found

    def _check(self) -> str:
        """``"running"``, ``"done"`` (every local worker exited) or ``"below"`` (the job fell below the minimum)."""
        health = cast(HealthRound, self.health)  # (set by the round's start)
        if health.below_minimum():
            return "below"
        below = False
        for outcome in self._exits():  # count every failure seen, then decide
            if not health.claim(outcome.rank, f"agent {self._index()}") or not outcome.failed:
                continue  # (claimed already: the ring found this agent dead, and counted it)
            below = health.record_failure() or below
            healthy = f"{health.healthy()} of {health.workers} workers of the job healthy, minimum {self.min_healthy}"
            self._failed(outcome, below, healthy)
        for outcome in self.replacements.exits():  # (not counted against the minimum: the round's workers are)
            if outcome.failed:
                self._failed(outcome, below, "a replacement, not counted against --min-healthy")
        if below:
            return "below"
        if len(self.outcomes) == len(self._worker_group.workers) and self.replacements.running:  # (issue 54)
            self.replacements.end_unjoined(MemberLog(self._client(), self.log).entries(), report)
        done = len(self.outcomes) == len(self._worker_group.workers) and not self.replacements.running
        return "done" if done else "running"

    def _failed(self, outcome: WorkerOutcome, below: bool, health: str) -> None:
        """A worker failed: the survivors are told; with ``--replace-dead``, a worker starts in its place."""
        self._announce([outcome.member], outcome.describe())
        replaced = None if below else self.replacements.start(self._pcontext, outcome.local_rank, outcome.rank)
        after = "" if below else ": the others keep running"
        if replaced is not None:
            after += f"; a replacement started in its place (pid {replaced})"
        report(
            f"worker {outcome.name} (local rank {outcome.local_rank}, pid {outcome.pid}) {outcome.describe()}; "
            f"{health}{after}"
        )

    def _client(self) -> Any:
        """A connection to the workers' store (hosted by node 0's agent), opened once per round."""
        with self._client_lock:  # (the ring's thread may ask too)
            if self._store_client is None:
                self._store_client = self._connect()
            return self._store_client

    def _connect(self) -> Any:
        """A new connection to the workers' store (the rendezvous set its address)."""
        address, port = str(self._worker_group.master_addr), int(cast(int, self._worker_group.master_port))
        timeout = datetime.timedelta(seconds=self.timing.probe_s)  # (the round's log lives there)
        return TCPStore(address, port, is_master=False, timeout=timeout)

    def _read_accounted(self) -> str:
        """The members whose death a shrink accounted for, as the round's log says (`format_members`)."""
        return format_members(sorted(accounted(MemberLog(self._client(), self.log).entries())))

    def _announce(self, members: list[str], said: str) -> None:
        """Workers died: tell the survivors at once (their roll call), where an announcer is set."""
        if self.on_death is None:
            return
        try:
            self.on_death(self._client(), self.log, members, self.job_workers, said)
        except Exception as error:  # the survivors find it their own way: a failed operation, a probe
            report(f"could not tell the survivors of {', '.join(members)} ({described(error)})")

    def _judge(self, barrier: str) -> WorkerState:
        """Every worker of the job has exited: mark the deaths a shrink accounted for, and give the verdict."""
        health = cast(HealthRound, self.health)  # (set by the round's start)
        try:
            listed = health.shrunk() if barrier == "done" else self._read_accounted()
        except Exception as error:  # no store, no proof: every death counts as unaccounted
            report(f"could not read which deaths a shrink accounted for ({described(error)})")
            listed = ""
        health.leave(index=self._index())
        shrunk = parse_members(listed)
        self.outcomes = {rank: self._account(each, shrunk) for rank, each in self.outcomes.items()}
        replaced = [self._account(each, shrunk) for each in self.replacements.ended]
        self.replacements.ended = replaced
        succeeded, self.verdict = judge([*self.outcomes.values(), *replaced])
        return WorkerState.SUCCEEDED if succeeded else WorkerState.FAILED

    @staticmethod
    def _account(outcome: WorkerOutcome, shrunk: set[str]) -> WorkerOutcome:
        """The outcome, marked accounted for where it failed and the log's worlds left its member out as dead."""
        return dataclasses.replace(outcome, shrunk=outcome.failed and outcome.member in shrunk)

    def _count_job(self) -> None:
        """The job-wide failure count, as the store holds it (the last count seen, where the store is gone)."""
        local = sum(1 for outcome in self.outcomes.values() if outcome.failed)
        if self.health is None:
            self.job_failed = max(self.job_failed, local)
            return
        try:
            self.job_failed = int(self.health.store.add(self.health.prefix + "failed", 0))
        except Exception:  # the store may be gone with a failed job
            self.job_failed = self.health.failed
        self.job_failed = max(self.job_failed, local)

    def _result(self, state: WorkerState) -> RunResult:
        self._worker_group.state = state
        self._leave_ring()
        self.answerer.end()
        if self.health is not None:
            self.health.stop_watching()
        self._count_job()
        error_files = self._error_files()
        failures = {
            rank: ProcessFailure(o.local_rank, o.pid, o.exitcode or 1, error_files.get(o.local_rank, ""))
            for rank, o in self.outcomes.items()
            if o.failed
        }
        finished = {rank: None for rank, o in self.outcomes.items() if o.exitcode == 0 and not o.stopped}
        return RunResult(state=state, return_values=finished, failures=failures)

    # -- the policy --------------------------------------------------------------

    def _invoke_run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """Start the workers, then watch them under the minimum-healthy rule (replaces torchrun's loop)."""
        spec = self._worker_group.spec
        self._initialize_workers(self._worker_group)
        self._begin_round()
        while True:
            time.sleep(spec.monitor_interval)
            try:
                state = self._check()
            except DistNetworkError:  # the job's store is gone: its workers raise StoreLostError by themselves
                self._await_exits(self.timing.stop_s)
                raise
            if state == "running":
                continue
            health = self.health
            assert health is not None
            if state == "done":
                barrier = health.exit_barrier(self.exit_barrier_timeout_s, self._read_accounted, self._index())
                if barrier == "timeout":
                    report(f"the other agents' workers did not finish within {self.exit_barrier_timeout_s:g} s "
                           "(--exit-barrier-timeout) after this node's; exiting anyway")  # fmt: skip
                if barrier != "verdict":
                    return self._result(self._judge(barrier))
            below = f"the job fell below --min-healthy {self.min_healthy} ({health.verdict})"
            if self._remaining_restarts > 0:
                self._remaining_restarts -= 1
                self.restarts_used += 1
                report(f"{below}: restarting every worker ({self._remaining_restarts} restart(s) left after this)")
                self._leave_ring()  # (before the next rendezvous: the workers this ring watched are stopped)
                self.replacements.stop()
                self._restart_workers(self._worker_group)
                self._begin_round()
                continue
            report(f"{below} and no restart left (--max-restarts {spec.max_restarts}): stopping every worker")
            self._stop_workers(self._worker_group)
            self._exits(stopped=True)
            self.replacements.stop()
            self.verdict = f"failed: {below}"
            return self._result(WorkerState.FAILED)

    def _await_exits(self, timeout_s: float) -> None:
        """Wait, at most ``timeout_s``, until every worker of this node has exited by itself (their outcomes read)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._exits()
            if len(self.outcomes) == len(self._worker_group.workers):
                return
            time.sleep(self.timing.poll_s)

    def record_stop(self, verdict: str) -> None:
        """After ``run`` ended abnormally (the launcher signalled, the agent raised): note how and who was stopped."""
        self.verdict = verdict
        self._leave_ring()
        self.answerer.end()
        self.replacements.stop()
        if self._pcontext is not None and self._worker_group.workers and self._worker_group.store is not None:
            self._exits(stopped=True)
        self._count_job()  # the summary counts the failures it lists

    def summary(self) -> str:
        """What became of this node's workers, and the job-wide count, as the launcher prints it on exit
        (`hypergrid.launch.outcomes.summary`)."""
        job = (f"  job: {self.job_failed} of {self.job_workers} workers failed; --min-healthy {self.min_healthy}; "
               f"restarts used: {self.restarts_used}")  # fmt: skip
        job += f"; replacements started: {len(self.replacements.started)}" if self.replace_dead else ""
        return summary(self.verdict, [*self.outcomes.values(), *self.replacements.ended], job + self.answerer.said())
