"""Times as text: readable units, and cost units on a unit-cost cluster."""

from __future__ import annotations

from doppler.hardware.presets import cluster
from doppler.report import format_time, time_unit


def test_format_time() -> None:
    assert format_time(0.0123) == "12.3 ms"
    assert format_time(2.5) == "2.5 s"
    assert format_time(3e-6) == "3 µs"


def test_unit_cost_clusters_print_units() -> None:
    c = cluster("unit:2")
    assert format_time(12.5, c) == "12.5 units" and format_time(12.5) == "12.5 s"
    assert time_unit(1e-3, c) == (1.0, "units")
