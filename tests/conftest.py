"""Shared test set-up: hypothesis profiles and the grid strategies."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# CI runs every property with at least 200 examples; locally the same by default,
# HYPOTHESIS_PROFILE=quick for a faster loop while editing.
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", max_examples=25, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
