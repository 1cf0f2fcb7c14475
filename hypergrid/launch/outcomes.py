"""How each worker of ``hypergrid.run`` ended, and the run's verdict from them.

A worker *finished* when it exited 0 (a rank that ``shrink`` retired exits 0
too). One that did not finish, by a signal, a non-zero exit or an exception,
was *accounted for* when a world formed without it, as dead (``hypergrid.launch.memberlog``):
the job went on without it, as designed. The run succeeded only when every
worker that did not finish was accounted for; any other ending fails it,
named rank by rank.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass

from hypergrid.launch.memberlog import member_name
from hypergrid.values import format_ranks

__all__ = ["WorkerOutcome", "judge", "summary"]

#: The most characters of a worker's exception quoted in the verdict.
_QUOTED = 200


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
        raised: the first line of the exception it raised (``Type: message``), when it said.
        shrunk: a shrink of the survivors excluded it (read once every worker has exited).
        replacement: 0 for a worker the round started; ``k`` for the ``k``-th the agent started in its place
            (``--replace-dead``: `hypergrid.launch.replacements`).

    Examples:
        >>> WorkerOutcome(3, 3, 4242, -9).describe()
        'died by signal SIGKILL'
        >>> WorkerOutcome(1, 1, 4240, -15, stopped=True).describe()
        'stopped by the launcher (signal SIGTERM)'
        >>> WorkerOutcome(4, 4, 4243, 1, raised="RankError: rank 4 is not in the grid").describe()
        'raised RankError: rank 4 is not in the grid; exit code 1'
    """

    rank: int
    local_rank: int
    pid: int
    exitcode: int | None
    stopped: bool = False
    raised: str | None = None
    shrunk: bool = False
    replacement: int = 0

    @property
    def failed(self) -> bool:
        """It ended by itself, not with exit code 0."""
        return not self.stopped and self.exitcode != 0

    @property
    def member(self) -> str:
        """The process as the round's log names it (`hypergrid.launch.memberlog`): ``"3"``, ``"3.1"``.

        Examples:
            >>> WorkerOutcome(3, 3, 4242, 0).member, WorkerOutcome(3, 3, 4243, 0, replacement=1).member
            ('3', '3.1')
        """
        return member_name(self.rank, self.replacement)

    @property
    def name(self) -> str:
        """``rank 3``, or ``rank 3 (replacement 1)`` for the first worker started in its place.

        Examples:
            >>> WorkerOutcome(3, 3, 4242, 0, replacement=1).name
            'rank 3 (replacement 1)'
        """
        return f"rank {self.rank}" + (f" (replacement {self.replacement})" if self.replacement else "")

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
        """``exited 0``, ``died by signal SIGKILL``, ``raised E: ... (exit code 1)``, ``stopped by the launcher (...)``

        Examples:
            >>> WorkerOutcome(0, 0, 10, 0).describe()
            'exited 0'
        """
        if self.stopped:
            return f"stopped by the launcher ({self._how()})"
        if self.exitcode == 0:
            return "exited 0"
        how = self._how()
        if self.raised:
            quoted = self.raised if len(self.raised) <= _QUOTED else self.raised[: _QUOTED - 3] + "..."
            return f"raised {quoted}; {how}"
        return f"died by {how}" if how.startswith("signal") else f"died with {how}"

    def brief(self) -> str:
        """``describe``, with only the type of the exception it raised (for the verdict's line).

        Examples:
            >>> WorkerOutcome(4, 4, 4243, 1, raised="RankError: rank 4 is not in the grid").brief()
            'raised RankError'
        """
        if self.raised and self.failed:
            return f"raised {self.raised.partition(':')[0]}"
        return self.describe()


def judge(outcomes: Iterable[WorkerOutcome]) -> tuple[bool, str]:
    """Whether a run whose workers all ended so succeeded, and the verdict's text.

    Examples:
        >>> judge([WorkerOutcome(0, 0, 10, 0), WorkerOutcome(1, 1, 11, -9, shrunk=True)])
        (True, 'succeeded: 1 of 2 workers finished; rank 1 died by signal SIGKILL and was shrunk away')
        >>> judge([WorkerOutcome(0, 0, 10, 0), WorkerOutcome(1, 1, 11, -9)])
        (False, 'failed: rank 1 died by signal SIGKILL and no shrink excluded it')
        >>> print(judge([WorkerOutcome(4, 4, 14, 1, raised="RankError: no"), WorkerOutcome(5, 5, 15, 1)])[1])
        failed: rank 4 raised RankError, rank 5 died with exit code 1; no shrink excluded them
    """
    ordered = sorted(outcomes, key=lambda outcome: (outcome.rank, outcome.replacement))
    unaccounted = [outcome for outcome in ordered if outcome.failed and not outcome.shrunk]
    if unaccounted:
        named = ", ".join(f"{outcome.name} {outcome.brief()}" for outcome in unaccounted)
        why = "; no shrink excluded them" if len(unaccounted) > 1 else " and no shrink excluded it"
        return False, f"failed: {named}{why}"
    finished = sum(1 for outcome in ordered if outcome.exitcode == 0 and not outcome.stopped)
    text = f"succeeded: {finished} of {len(ordered)} workers finished"
    for outcome in ordered:
        if outcome.failed:
            text += f"; {outcome.name} {outcome.brief()} and was shrunk away"
    return True, text


def summary(verdict: str, outcomes: Iterable[WorkerOutcome], job: str) -> str:
    """The launcher's closing lines for one node: the verdict, each worker (the round's and their replacements, by
    rank), then ``job`` (the job-wide counts).

    Examples:
        >>> ended = [WorkerOutcome(0, 0, 10, 0), WorkerOutcome(1, 1, 11, -9, shrunk=True)]
        >>> print(summary(judge(ended)[1], ended, "  job: 1 of 2 workers failed"))
        summary: succeeded: 1 of 2 workers finished; rank 1 died by signal SIGKILL and was shrunk away
          this node's workers (ranks 0-1):
          rank 0: exited 0 (pid 10)
          rank 1: died by signal SIGKILL; shrunk away (pid 11)
          job: 1 of 2 workers failed
    """
    ordered = sorted(outcomes, key=lambda outcome: (outcome.rank, outcome.replacement))
    ranks = format_ranks(sorted({outcome.rank for outcome in ordered}))
    lines = [f"summary: {verdict or 'ended'}", f"  this node's workers (ranks {ranks}):"]
    for outcome in ordered:
        shrunk = "; shrunk away" if outcome.shrunk else ""
        lines.append(f"  {outcome.name}: {outcome.describe()}{shrunk} (pid {outcome.pid})")
    return "\n".join([*lines, job])
