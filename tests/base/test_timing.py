"""`hypergrid.timing.Timing`: at the default settings every derived bound is the value it replaced; the settings come
from the environment, and a bad one is refused with its name, its value and what was expected."""

from __future__ import annotations

import dataclasses
import math

import pytest

from hypergrid.errors import InvalidArgumentError
from hypergrid.timing import FOREVER_S, GLOO_WAITS, PER_PARTICIPANT_S, Timing

DEFAULT = Timing()

# Every value the package used before the table, and where it lived (0.4.x), against its derivation now.
BEFORE = [
    ("relay.PULSE_S, arrivals.BEAT_S", DEFAULT.pulse_s, 0.1),
    ("world.HOST_POLL_S, the agent's exit poll, the sentry's floor", DEFAULT.poll_s, 0.05),
    ("liveness.CLOSING_POLL_S", DEFAULT.closing_poll_s, 0.005),
    ("relay.AGENT_CHECK_S", DEFAULT.agent_check_s, 0.25),
    ("relay.SEND_S", DEFAULT.send_s, 1.0),
    ("intake.ARRIVAL_WINDOW_S, arrival.LOOK_S", DEFAULT.arrival_window_s, 1.0),
    ("watcher._GRACE_S", DEFAULT.report_grace_s, 2.0),
    ("nodewatch.PULSE_WINDOW_S", DEFAULT.pulse_window_s, 2.0),
    ("liveness.BACKUP_S", DEFAULT.backup_s, 5.0),
    ("world.JOIN_S, replacements.STOP_S, agent.STORE_LOST_GRACE_S, spawned.OUTLAST_S, ring._ADDRESS_SLICE_S",
     DEFAULT.stop_s, 5.0),
    ("relay.JOIN_TIMEOUT_S, ring.CONNECT_S", DEFAULT.connect_s, 10.0),
    ("ring.KEEPALIVE_S", DEFAULT.keepalive_idle_s, 5),
    ("ring.KEEPALIVE_INTERVAL_S", DEFAULT.keepalive_interval_s, 2),
    ("ring.ADDRESS_S", DEFAULT.address_s, 60.0),
    ("world.HOST_EXIT_S, agent._STORE_TIMEOUT, waiting.probe_after_s()", DEFAULT.probe_s, 30.0),
    ("processes._SETTLE_SECONDS", DEFAULT.liveness_s, 0.5),
    ("elastic.SHRINK_TIMEOUT_S (with guard_timeout_s 300)", DEFAULT.shrink_timeout_s, 30.0),
    ("nodewatch.PREFIX_TIMEOUT_S", DEFAULT.publish_timeout_s, 600.0),
    ("health._WATCH_SLICE_S, nodewatch.SLICE_S, launcher.DEFAULT_EXIT_BARRIER_TIMEOUT_S", FOREVER_S, 86400.0),
    ("recovery.GLOO_WAITS", GLOO_WAITS, 5),
    ("liveness.PER_RANK_S, protocol.PROBE_PER_PARTICIPANT_S", PER_PARTICIPANT_S, 1e-4),
]  # fmt: skip


@pytest.mark.parametrize(("where", "derived", "before"), BEFORE, ids=[row[0] for row in BEFORE])
def test_the_defaults_give_the_values_they_replaced(where: str, derived: float, before: float) -> None:
    assert derived == before and type(derived) is type(before), where


@pytest.mark.parametrize("ranks", [1, 2, 8, 4096, 5000, 131072, 10**6])
def test_the_size_dependent_bounds_are_the_old_formulas(ranks: int) -> None:
    assert DEFAULT.roll_bound_s(ranks) == max(0.5, ranks * 1e-4)  # liveness.bound_s, barrier.probe_every_s
    assert DEFAULT.round_probe_s(ranks) == max(1.0, ranks * 1e-4)  # membership.probe_period_s
    for timeout in (1.0, 2.0, 60.0, 300.0, 3600.0):
        timing = DEFAULT.with_group_timeout(timeout)
        assert timing.guard_probe_s(ranks) == min(max(1.0, ranks * 1e-4), timeout / 4)  # protocol.probe_s
        assert timing.guard_grace_s == min(max(2.0, timeout / 4), 60.0)  # protocol.grace_s
        assert timing.shrink_timeout_s == min(timeout, 30.0)  # shrink's default timeout_s


def test_derived_values_scale_with_their_setting() -> None:
    slow = Timing(liveness_s=2.0, probe_s=60.0, group_timeout_s=100.0)
    assert (slow.pulse_s, slow.report_grace_s, slow.backup_s, slow.connect_s) == (0.4, 8.0, 20.0, 40.0)
    assert (slow.keepalive_idle_s, slow.keepalive_interval_s) == (20, 8)
    assert (slow.address_s, slow.shrink_timeout_s, slow.publish_timeout_s) == (120.0, 60.0, 200.0)
    fast = Timing(liveness_s=0.01)
    assert (fast.keepalive_idle_s, fast.keepalive_interval_s) == (1, 1)  # the kernel counts whole seconds


def test_from_env_reads_the_settings_and_takes_the_group_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HYPERGRID_LIVENESS_S", raising=False)
    monkeypatch.delenv("HYPERGRID_PROBE_S", raising=False)
    assert Timing.from_env() == DEFAULT
    monkeypatch.setenv("HYPERGRID_LIVENESS_S", "1.5")
    monkeypatch.setenv("HYPERGRID_PROBE_S", " 2 ")
    assert Timing.from_env(45.0) == Timing(1.5, 2.0, 45.0)
    assert Timing.from_env(environ={"HYPERGRID_PROBE_S": "7e1"}) == Timing(probe_s=70.0)
    assert dataclasses.replace(DEFAULT, liveness_s=1.0).liveness_s == 1.0  # frozen, but replaceable


@pytest.mark.parametrize("value", ["", "abc", "0", "-1", "nan", "inf", "-inf", "1e300", "0.5s", "1,5"])
@pytest.mark.parametrize("name", ["HYPERGRID_LIVENESS_S", "HYPERGRID_PROBE_S"])
def test_a_bad_setting_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        Timing.from_env(environ={name: value})
    assert str(raised.value).startswith(f"{name}={value!r}: expected a positive number of seconds (default ")
    assert isinstance(raised.value, ValueError)


@pytest.mark.parametrize("value", [0, -0.5, math.nan, math.inf, "1", True, None, 10**400])
@pytest.mark.parametrize("field", ["liveness_s", "probe_s", "group_timeout_s"])
def test_a_bad_value_is_refused_by_the_constructor(field: str, value: object) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"^Timing: {field}=.*: expected a positive number of seconds$"):
        Timing(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=rf"^Timing: {field}="):
        dataclasses.replace(DEFAULT, **{field: value})


def test_a_bad_group_timeout_is_refused_by_from_env() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^Timing: group_timeout_s=-3: "):
        Timing.from_env(-3, environ={})
    with pytest.raises(InvalidArgumentError, match=r"^Timing: group_timeout_s=0: "):
        DEFAULT.with_group_timeout(0)
