"""Trivial reference assignments: everything on one device, round robin, uniform random."""

from __future__ import annotations

import numpy as np

from doppler.assignment import Assignment
from doppler.baselines import register
from doppler.graph import DataflowGraph


@register("single", description="every op on device 0")
def single(graph: DataflowGraph, cluster, *, seed: int = 0, budget_s: float | None = None) -> Assignment:
    """Every op on device 0 (no transfers, no parallelism)."""
    return Assignment(devices=np.zeros(graph.num_ops, dtype=np.int64))


@register("round_robin", description="op id modulo the number of devices")
def round_robin(graph: DataflowGraph, cluster, *, seed: int = 0, budget_s: float | None = None) -> Assignment:
    """Op ``i`` on device ``i mod D``."""
    return Assignment(devices=np.arange(graph.num_ops, dtype=np.int64) % cluster.num_devices)


@register("random", description="uniformly random device per op (seeded)", deterministic=False)
def random_assignment(graph: DataflowGraph, cluster, *, seed: int = 0, budget_s: float | None = None) -> Assignment:
    """Each op on a uniformly random device, from ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return Assignment(devices=rng.integers(0, cluster.num_devices, size=graph.num_ops, dtype=np.int64))
