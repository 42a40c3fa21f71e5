"""Shared test settings.

Hypothesis: no per-example deadline anywhere (the first simulation in a process
compiles or loads numba kernels, which can take seconds on a cold machine), and
under CI (``CI=true``) a derandomised, fixed set of examples so a landing never
depends on a random draw; locally, examples stay random to keep finding bugs.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev")
