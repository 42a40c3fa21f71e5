"""Fixtures of the registry and placement tests: a chain of three ops and two unit devices."""

from __future__ import annotations

import pytest

from doppler.ir.graph import from_edges
from doppler.hardware.cluster import homogeneous


@pytest.fixture
def g():
    return from_edges([1, 2, 3], [(0, 1), (1, 2)], output_bytes=[1, 1, 1])


@pytest.fixture
def c():
    return homogeneous("h", 2, flops_per_s=1.0, bandwidth_Bps=1.0)
