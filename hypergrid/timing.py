"""Every bound of the failure machinery, derived from three settings: one `Timing` per lifetime that needs one.

The settings are the roll call's liveness bound (``HYPERGRID_LIVENESS_S``, 0.5 s: how long a live process may go
without running), the probe (``HYPERGRID_PROBE_S``, 30 s: how long a grid wait lasts before it asks who is dead)
and the group timeout (a grid's ``guard_timeout_s``, 300 s). A heartbeat, a poll or a grace scales with the
liveness bound; a wait on a peer that may merely be slow scales with the probe or the group timeout; what does not
scale (a store's cost per participant, torch's own habits, an unbounded wait's slices) is a constant of this
module. Nothing here is read at import and nothing is cached: a `hypergrid.agreement.world.World`, a launcher's
agent or a ``spawn`` call builds its `Timing` (`Timing.from_env`) and hands it to what it holds. The table of
every value and why: docs/timing.md.

Examples:
    >>> timing = Timing()
    >>> timing.pulse_s, timing.report_grace_s, timing.shrink_timeout_s
    (0.1, 2.0, 30.0)
    >>> Timing(liveness_s=2.0).pulse_s
    0.4
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from hypergrid.errors import InvalidArgumentError
from hypergrid.values import MAX_TIMEOUT_S, as_number, shown

__all__ = [
    "CONNECT_TRIES",
    "FOREVER_S",
    "GLOO_WAITS",
    "KEEPALIVE_PROBES",
    "PER_PARTICIPANT_S",
    "QUIET_READS",
    "Timing",
]

#: An unbounded wait is done in slices of this long (a day): torch's store waits need a timeout, and log each one
#: that ends.
FOREVER_S = 86400.0
#: What the store costs per participant of a round or a roll call (it serves about 50 µs per answer): a bound over
#: N participants is at least N times this, so a large job that is merely busy is not taken for a stuck one.
PER_PARTICIPANT_S = 1e-4
#: gloo (torch 2.13) waits 5 x its timeout for a member that published its address and died before connecting.
GLOO_WAITS = 5
#: A roll call's closer reads the answer count this many times per quiet span (docs/design/rollcall.md).
QUIET_READS = 10
#: Unanswered TCP keepalive probes after which the kernel ends an agents' ring connection (a vanished node).
KEEPALIVE_PROBES = 5
#: How many times an agent tries the next agent's port before it counts a refusal as a death.
CONNECT_TRIES = 3


def _seconds(value: object, name: str) -> float:
    number = as_number(value)
    if number is None or not 0 < number <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(f"Timing: {name}={shown(value)}: expected a positive number of seconds")
    return number


@dataclass(frozen=True)
class Timing:
    """The three settings and every bound derived from them (the defaults: today's values).

    Args:
        liveness_s: how long a roll call waits for a live rank's answer (``HYPERGRID_LIVENESS_S``).
        probe_s: how long a grid wait lasts before it asks for a roll call, then twice as long, and so on
            (``HYPERGRID_PROBE_S``).
        group_timeout_s: how long a collective step waits for its other participants (a grid's
            ``guard_timeout_s``).

    Raises:
        InvalidArgumentError: a setting that is not a positive number of seconds.

    Examples:
        >>> Timing()
        Timing(liveness_s=0.5, probe_s=30.0, group_timeout_s=300.0)
        >>> Timing(liveness_s=0)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: Timing: liveness_s=0: expected a positive number of seconds
    """

    liveness_s: float = 0.5
    probe_s: float = 30.0
    group_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            object.__setattr__(self, field.name, _seconds(getattr(self, field.name), field.name))

    @classmethod
    def from_env(cls, group_timeout_s: float | None = None, environ: Mapping[str, str] | None = None) -> Timing:
        """The settings of this process's environment (``environ``: default ``os.environ``), read now.

        Args:
            group_timeout_s: the group timeout of whoever asks (a grid's ``guard_timeout_s``); default 300 s.
            environ: where to read ``HYPERGRID_LIVENESS_S`` and ``HYPERGRID_PROBE_S``.

        Raises:
            InvalidArgumentError: a variable that is not a positive number of seconds (its name, its value and
                what was expected), or a bad ``group_timeout_s``.

        Examples:
            >>> Timing.from_env(environ={"HYPERGRID_LIVENESS_S": "2"}).liveness_s
            2.0
            >>> Timing.from_env(60.0, environ={}).group_timeout_s
            60.0
            >>> Timing.from_env(environ={"HYPERGRID_PROBE_S": "soon"})  # doctest: +ELLIPSIS
            Traceback (most recent call last):
              ...
            hypergrid.errors.InvalidArgumentError: HYPERGRID_PROBE_S='soon': expected a positive number of seconds ...
        """
        environ = os.environ if environ is None else environ
        defaults = cls()
        liveness = _setting(environ, "HYPERGRID_LIVENESS_S", defaults.liveness_s)
        probe = _setting(environ, "HYPERGRID_PROBE_S", defaults.probe_s)
        group = defaults.group_timeout_s if group_timeout_s is None else group_timeout_s
        return cls(liveness, probe, group)

    def with_group_timeout(self, timeout_s: float) -> Timing:
        """These settings with the group timeout ``timeout_s`` (a grid's or a round's own).

        Examples:
            >>> Timing().with_group_timeout(8.0).guard_probe_s(4)
            1.0
        """
        return dataclasses.replace(self, group_timeout_s=timeout_s)

    # -- scaled by the liveness bound: heartbeats, polls, graces ------------------------------------

    @property
    def pulse_s(self) -> float:
        """A heartbeat's period, liveness / 5 (a worker's pulse to its agent, an arrival's beat): several beats per
        liveness bound, so one late beat is no death."""
        return self.liveness_s / 5

    @property
    def poll_s(self) -> float:
        """How often a wait that cannot block polls, liveness / 10 (the store's host waiting for the others' leave,
        an agent waiting for its workers' exits, the point-to-point sentry's floor)."""
        return self.liveness_s / 10

    @property
    def closing_poll_s(self) -> float:
        """How often a rank that joins a world's watch looks whether the members' list is being closed,
        liveness / 100: a closing lasts a few store operations."""
        return self.liveness_s / 100

    @property
    def agent_check_s(self) -> float:
        """How often a worker waiting on its node's agent looks whether the agent still runs, liveness / 2: a worker
        whose agent stopped answers for itself within the bound."""
        return self.liveness_s / 2

    @property
    def send_s(self) -> float:
        """How long a message to a slow reader's pipe waits for room, 2 x liveness (the reader runs by then)."""
        return 2 * self.liveness_s

    @property
    def arrival_window_s(self) -> float:
        """2 x liveness: how long an arrival's heartbeat may stand still before a survivor counts it gone, and how
        long an arrival waits for its draft between two looks at the running job."""
        return 2 * self.liveness_s

    @property
    def report_grace_s(self) -> float:
        """How long past a roll call's bound a rank waits for its verdict before it gives up, 4 x liveness."""
        return 4 * self.liveness_s

    @property
    def pulse_window_s(self) -> float:
        """How old a worker's pulse may be for its agent to answer a roll call for it, 4 x liveness (20 pulses)."""
        return 4 * self.liveness_s

    @property
    def backup_s(self) -> float:
        """How much longer than the roll call's two closers the others wait before they close it, 10 x liveness
        (only if both closers died)."""
        return 10 * self.liveness_s

    @property
    def stop_s(self) -> float:
        """How long a thread or a process asked to end gets before it is given up on (or killed), 10 x liveness:
        a watcher's join, a replacement's SIGTERM, an agent's workers after the store is lost, a stop flag's look;
        and how much longer ``spawn``'s workers wait than its limit, so that the launcher's report ends a hang."""
        return 10 * self.liveness_s

    @property
    def connect_s(self) -> float:
        """How long a process waits to reach a live peer process, 20 x liveness: an agent's port (once per try), a
        worker's join acknowledged by its agent."""
        return 20 * self.liveness_s

    @property
    def keepalive_idle_s(self) -> int:
        """Seconds of silence before the kernel probes an agents' ring connection, 10 x liveness (whole seconds,
        at least 1: the kernel's unit)."""
        return max(1, round(10 * self.liveness_s))

    @property
    def keepalive_interval_s(self) -> int:
        """Seconds between two keepalive probes, 4 x liveness (whole seconds, at least 1)."""
        return max(1, round(4 * self.liveness_s))

    def roll_bound_s(self, ranks: int) -> float:
        """How long a roll call of ``ranks`` waits for answers: max(liveness, 0.1 ms per rank); also how often a
        barrier's or a vigil's members ask who is dead.

        Examples:
            >>> Timing().roll_bound_s(8), Timing().roll_bound_s(131072)
            (0.5, 13.1072)
        """
        return max(self.liveness_s, ranks * PER_PARTICIPANT_S)

    def round_probe_s(self, participants: int) -> float:
        """How often a round's waiting participants ask who is dead: max(2 x liveness, 0.1 ms per participant).

        Examples:
            >>> Timing().round_probe_s(8), Timing().round_probe_s(131072)
            (1.0, 13.1072)
        """
        return max(2 * self.liveness_s, participants * PER_PARTICIPANT_S)

    # -- scaled by the probe and the group timeout: waits on peers that may be slow -------------------

    @property
    def address_s(self) -> float:
        """How long an agent waits for the next agent to join the ring before it watches the one after, 2 x probe."""
        return 2 * self.probe_s

    def guard_probe_s(self, participants: int) -> float:
        """When the first to arrive first probes an open guard round: `round_probe_s`, at most the group timeout / 4.

        Examples:
            >>> Timing().guard_probe_s(8), Timing().guard_probe_s(131072), Timing(group_timeout_s=2.0).guard_probe_s(8)
            (1.0, 13.1072, 0.5)
        """
        return min(self.round_probe_s(participants), self.group_timeout_s / 4)

    @property
    def guard_grace_s(self) -> float:
        """How long past its timeout a guard participant waits for another's verdict: max(4 x liveness, group timeout
        / 4), at most 2 x probe.

        Examples:
            >>> [Timing(group_timeout_s=t).guard_grace_s for t in (1.0, 60.0, 3600.0)]
            [2.0, 15.0, 60.0]
        """
        return min(max(4 * self.liveness_s, self.group_timeout_s / 4), 2 * self.probe_s)

    @property
    def shrink_timeout_s(self) -> float:
        """``shrink``'s default ``timeout_s``: min(group timeout, probe), how long a survivor that is alive but
        absent is waited for."""
        return min(self.group_timeout_s, self.probe_s)

    @property
    def publish_timeout_s(self) -> float:
        """How long a node's agent waits for its workers to say where their roll calls live, 2 x group timeout:
        a worker that starts later than that times its peers' first guard round out anyway."""
        return 2 * self.group_timeout_s


def _setting(environ: Mapping[str, str], name: str, default: float) -> float:
    """The setting ``name`` of ``environ`` in seconds (``default`` where unset)."""
    text = environ.get(name)
    if text is None:
        return default
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and 0 < number <= MAX_TIMEOUT_S):
        raise InvalidArgumentError(f"{name}={shown(text)}: expected a positive number of seconds (default {default:g})")
    return number
