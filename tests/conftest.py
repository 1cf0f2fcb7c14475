"""Shared test set-up: hypothesis profiles, the one-rank world fixtures and the `--folder-times` report."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch.distributed as dist
from hypothesis import HealthCheck, settings

# CI runs every property with at least 200 examples; locally the same by default,
# HYPOTHESIS_PROFILE=quick for a faster loop while editing.
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@contextmanager
def _one_rank_gloo() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def one_rank_world() -> Iterator[None]:
    """A one-rank gloo world in this process, for one test."""
    with _one_rank_gloo():
        yield


@pytest.fixture(scope="module")
def one_rank_world_module() -> Iterator[None]:
    """A one-rank gloo world shared by a module's tests (hypothesis tests cannot use per-test fixtures)."""
    with _one_rank_gloo():
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``stress`` run only when ``-m`` names them (``pytest -m stress``), whatever else ``-m`` says."""
    if "stress" in (config.getoption("markexpr") or ""):
        return
    stress = [item for item in items if item.get_closest_marker("stress") is not None]
    if stress:
        config.hook.pytest_deselected(items=stress)
        items[:] = [item for item in items if item.get_closest_marker("stress") is None]


class _FolderTimes:
    """``--folder-times``: the total duration (set-up, call, teardown) of each test folder, printed at the end."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        folder = report.nodeid.split("::")[0].rpartition("/")[0] or "."
        self.totals[folder] = self.totals.get(folder, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.section("duration per folder")
        for folder, seconds in sorted(self.totals.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:9.1f} s  {folder}")
        terminalreporter.write_line(f"{sum(self.totals.values()):9.1f} s  in all")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--folder-times", action="store_true", help="print the total duration of each test folder")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--folder-times"):
        config.pluginmanager.register(_FolderTimes(), "folder-times")
