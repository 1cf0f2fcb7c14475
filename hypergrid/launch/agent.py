"""``MinHealthyAgent``: torchelastic's local agent with a monitoring policy that keeps the survivors running.

torchrun's ``LocalElasticAgent`` treats its workers as one group: when one
exits non-zero, its process context stops all the others (SIGTERM, then
SIGKILL) and the agent restarts the whole group or fails. An elastic grid
needs the opposite: the survivors shrink past the dead and carry on.

This agent is the same agent (rendezvous, worker environment, the store
hosted by the agents, logs, restarts), with three methods replaced:

- monitoring reads each worker's exit on its own; a failed worker is recorded
  and reported, the others are left running;
- the run loop applies the minimum-healthy rule, job-wide
  (``hypergrid.launch.health``): while at least ``min_healthy`` workers of the
  job have not failed, nothing is stopped; below it, every agent falls back
  to torchrun's behaviour (restart every worker while ``max_restarts`` allows,
  else stop them and fail);
- the exit barrier waits for every agent whose workers still run (or for a
  verdict), so the agent hosting the store outlives every worker.

A node that joins later (``--nnodes MIN:MAX``) waits for the next restart: a
healthy job is never restarted to grow (torchrun restarts it).
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, cast

from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import LogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from hypergrid.errors import InvalidArgumentError
from hypergrid.launch.health import HealthRound
from hypergrid.values import format_ranks

__all__ = ["MinHealthyAgent", "WorkerOutcome", "report"]

PREFIX = "hypergrid.run: "


def report(message: str) -> None:
    """One line of the launcher's own, on stderr (the workers' output keeps stdout)."""
    print(PREFIX + message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class WorkerOutcome:
    """How one worker ended.

    Attributes:
        rank: its global rank.
        local_rank: its rank on this node.
        pid: its process id.
        exitcode: its exit code (negative: the signal that ended it); None if it
            could not be read (still running when the launcher gave up on it).
        stopped: the launcher stopped it (the job fell below the minimum, or the
            launcher itself was signalled).

    Examples:
        >>> WorkerOutcome(3, 3, 4242, -9).describe()
        'died by signal SIGKILL'
        >>> WorkerOutcome(1, 1, 4240, -15, stopped=True).describe()
        'stopped by the launcher (signal SIGTERM)'
    """

    rank: int
    local_rank: int
    pid: int
    exitcode: int | None
    stopped: bool = False

    @property
    def failed(self) -> bool:
        """It ended by itself, not with exit code 0."""
        return not self.stopped and self.exitcode != 0

    def _how(self) -> str:
        if self.exitcode is None:
            return "exit code unknown"
        if self.exitcode < 0:
            try:
                return f"signal {signal.Signals(-self.exitcode).name}"
            except ValueError:
                return f"signal {-self.exitcode}"
        return f"exit code {self.exitcode}"

    def describe(self) -> str:
        """``exited 0``, ``died by signal SIGKILL``, ``died with exit code 3`` or ``stopped by the launcher (...)``."""
        if self.stopped:
            return f"stopped by the launcher ({self._how()})"
        if self.exitcode == 0:
            return "exited 0"
        how = self._how()
        return f"died by {how}" if how.startswith("signal") else f"died with {how}"


class MinHealthyAgent(LocalElasticAgent):
    """torchelastic's ``LocalElasticAgent`` whose monitoring keeps the surviving workers running.

    Args:
        spec: the worker spec (a command: ``entrypoint`` is a program, as under torchrun).
        logs_specs: where the workers' output goes (torchrun's ``--log-dir``, ``--tee``, ...).
        min_healthy: the job-wide minimum of workers that have not failed; below
            it the agent restarts every worker (``spec.max_restarts`` allowing) or
            stops them and fails.
        exit_barrier_timeout_s: how long an agent whose workers have all exited
            waits for the other agents' workers before it exits anyway.
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
    ) -> None:
        if not isinstance(spec.entrypoint, str):
            raise InvalidArgumentError(
                f"MinHealthyAgent: entrypoint={spec.entrypoint!r}; expected a command (str), as torchrun runs"
            )
        if not isinstance(min_healthy, int) or isinstance(min_healthy, bool) or min_healthy < 1:
            raise InvalidArgumentError(f"MinHealthyAgent: min_healthy={min_healthy!r}; expected an int >= 1")
        super().__init__(
            spec,
            logs_specs,
            start_method,
            exit_barrier_timeout=exit_barrier_timeout_s,
            log_line_prefix_template=log_line_prefix_template,
            shutdown_timeout=shutdown_timeout,
        )
        self.min_healthy = min_healthy
        self.exit_barrier_timeout_s = exit_barrier_timeout_s
        self.outcomes: dict[int, WorkerOutcome] = {}  # global rank -> how it ended (this round)
        self.restarts_used = 0
        self.job_failed = 0  # job-wide failed workers of the last round, as last read
        self.job_workers = 0  # the job's number of workers (the last rendezvous)
        self.verdict = ""  # why the run ended as it did, for the summary
        self.health: HealthRound | None = None

    # -- one round: the workers of one rendezvous --------------------------------

    def _begin_round(self) -> None:
        group = self._worker_group
        if self.health is not None:
            self.health.stop_watching()
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

    def _handlers(self) -> dict[int, Any]:
        pcontext: Any = self._pcontext
        handlers: dict[int, Any] = pcontext.subprocess_handlers if pcontext is not None else {}
        return handlers

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
            outcome = WorkerOutcome(worker.global_rank, local_rank, handler.proc.pid, exitcode, stopped)
            self.outcomes[outcome.rank] = outcome
            found.append(outcome)
        return found

    def _check(self) -> str:
        """``"running"``, ``"done"`` (every local worker exited) or ``"below"`` (the job fell below the minimum)."""
        health = self.health
        assert health is not None
        if health.below_minimum():
            return "below"
        below = False
        for outcome in self._exits():  # count every failure seen, then decide
            if not outcome.failed:
                continue
            below = health.record_failure() or below
            report(
                f"worker rank {outcome.rank} (local rank {outcome.local_rank}, pid {outcome.pid}) "
                f"{outcome.describe()}; {health.healthy()} of {health.workers} workers of the job healthy, "
                f"minimum {self.min_healthy}" + ("" if below else ": the others keep running")
            )
        if below:
            return "below"
        return "done" if len(self.outcomes) == len(self._worker_group.workers) else "running"

    def _result(self, state: WorkerState) -> RunResult:
        self._worker_group.state = state
        if self.health is not None:
            self.health.stop_watching()
            try:
                self.job_failed = int(self.health.store.add(self.health.prefix + "failed", 0))
            except Exception:  # the store may be gone with a failed job; the last count stands
                self.job_failed = self.health.failed
        error_files = getattr(self._pcontext, "error_files", {})
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
            state = self._check()
            if state == "running":
                continue
            health = self.health
            assert health is not None
            if state == "done":
                barrier = health.exit_barrier(self.exit_barrier_timeout_s)
                if barrier == "timeout":
                    report(
                        f"the other agents' workers did not finish within {self.exit_barrier_timeout_s:g} s "
                        "(--exit-barrier-timeout) after this node's; exiting anyway"
                    )
                if barrier != "verdict":
                    self.verdict = "succeeded"
                    return self._result(WorkerState.SUCCEEDED)
            below = f"the job fell below --min-healthy {self.min_healthy} ({health.verdict})"
            if self._remaining_restarts > 0:
                self._remaining_restarts -= 1
                self.restarts_used += 1
                report(f"{below}: restarting every worker ({self._remaining_restarts} restart(s) left after this)")
                self._restart_workers(self._worker_group)
                self._begin_round()
                continue
            report(f"{below} and no restart left (--max-restarts {spec.max_restarts}): stopping every worker")
            self._stop_workers(self._worker_group)
            self._exits(stopped=True)
            self.verdict = f"failed: {below}"
            return self._result(WorkerState.FAILED)

    def record_stop(self, verdict: str) -> None:
        """After ``run`` ended abnormally (the launcher signalled, the agent raised): note how and who was stopped."""
        self.verdict = verdict
        if self._pcontext is not None and self._worker_group.workers and self._worker_group.store is not None:
            self._exits(stopped=True)

    def summary(self) -> str:
        """What became of this node's workers, and the job-wide count, as the launcher prints it on exit.

        Examples:
            >>> agent = object.__new__(MinHealthyAgent)  # a finished agent, without starting one
            >>> agent.outcomes = {0: WorkerOutcome(0, 0, 10, 0), 1: WorkerOutcome(1, 1, 11, -9)}
            >>> agent.verdict, agent.job_failed, agent.job_workers = "succeeded", 1, 2
            >>> agent.min_healthy, agent.restarts_used = 1, 0
            >>> print(agent.summary())
            summary: succeeded; this node's workers (ranks 0-1):
              rank 0: exited 0 (pid 10)
              rank 1: died by signal SIGKILL (pid 11)
              job: 1 of 2 workers failed; --min-healthy 1; restarts used: 0
        """
        ranks = format_ranks(list(self.outcomes))
        lines = [f"summary: {self.verdict or 'ended'}; this node's workers (ranks {ranks}):"]
        for rank, outcome in sorted(self.outcomes.items()):
            lines.append(f"  rank {rank}: {outcome.describe()} (pid {outcome.pid})")
        lines.append(
            f"  job: {self.job_failed} of {self.job_workers} workers failed; --min-healthy {self.min_healthy}; "
            f"restarts used: {self.restarts_used}"
        )
        return "\n".join(lines)
