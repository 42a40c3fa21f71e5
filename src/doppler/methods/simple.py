"""Trivial reference assignments: everything on one device, round robin, uniform random."""

from __future__ import annotations

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.methods.registry import PythonRun, register
from doppler.ir.graph import DataflowGraph


@register("single", description="every op on device 0", python=PythonRun())
def single(graph: DataflowGraph, cluster) -> Assignment:
    """Every op on device 0 (no transfers, no parallelism)."""
    return Assignment(devices=np.zeros(graph.num_ops, dtype=np.int64))


@register("round_robin", description="op id modulo the number of devices", python=PythonRun())
def round_robin(graph: DataflowGraph, cluster) -> Assignment:
    """Op ``i`` on device ``i mod D``."""
    return Assignment(devices=np.arange(graph.num_ops, dtype=np.int64) % cluster.num_devices)


@register("random", description="uniformly random device per op (seeded)", deterministic=False,
          python=PythonRun())
def random_assignment(graph: DataflowGraph, cluster, *, seed: int = 0) -> Assignment:
    """Each op on a uniformly random device, from ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return Assignment(devices=rng.integers(0, cluster.num_devices, size=graph.num_ops, dtype=np.int64))


@register("round_robin_block", description="tiles of each logical op spread over devices by block index",
          python=PythonRun())
def round_robin_block(graph: DataflowGraph, cluster) -> Assignment:
    """Tile ops on device ``flattened block index mod D`` inside their logical op (the
    placement a sharded-tensor engine uses by default); ops without tile structure
    fall back to ``op id mod D``."""
    return Assignment(devices=flat_block_index(graph) % cluster.num_devices)


def flat_block_index(graph: DataflowGraph) -> np.ndarray:
    """Each op's block index inside its logical op, flattened row-major over the group's grid (int64[n]); an op
    without tile structure gets its op id."""
    flat = np.arange(graph.num_ops, dtype=np.int64)
    tiled = np.flatnonzero(graph.group >= 0)
    for gid in np.unique(graph.group[tiled]):
        ops = tiled[graph.group[tiled] == gid]
        grid = graph.groups[int(gid)].grid
        idx = graph.block[ops, : len(grid)]
        inside = np.all((idx >= 0) & (idx < np.asarray(grid)), axis=1)
        if len(grid) and inside.any():
            flat[ops[inside]] = np.ravel_multi_index(tuple(idx[inside].T), grid)
    return flat
