"""METIS: a balanced k-way min-cut partition of the graph (pymetis), one part per device.

Vertex weight = the op's mean compute time over devices, edge weight = the
edge's mean transfer time (the producer's output bytes over a link), both
integerised to ``1..WEIGHT_SCALE`` (METIS wants positive integers; the ``+1``
keeps zero-cost ops and edges from being free to move). Target part weights
follow the devices' relative speed (their mean FLOP/s) on heterogeneous
clusters. The partition balances total work and minimises the total
communication cut, but it ignores time: it knows nothing about dependencies or
when an op can run, which is exactly what makes it a useful contrast.

Edge cases: one device -> everything on device 0; ops are connected by no edge
at all -> a greedy balanced split by weight (largest first onto the least
loaded device) since there is nothing to cut.

With a memory budget (``memory_budget_bytes``, given by :func:`~doppler.methods.assign`), an op's
vertex weight is its share of the total compute plus its share of the total weight bytes (each
weight slice's bytes split among the ops that read it), so that the parts balance both. (pymetis
2025 misreads METIS's multi-constraint weights: both constraints came out unbalanced.) Balancing is
not a cap: :func:`~doppler.methods.assign` checks the placement against the budget.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from typing import Iterator

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.methods.registry import PythonRun, register
from doppler.hardware.costs import CostModel
from doppler.ir.graph import DataflowGraph
from doppler.ir.slices import input_slices

WEIGHT_SCALE = 1000


def _integerise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    top = float(x.max()) if x.size else 0.0
    if top <= 0 or not np.isfinite(top):
        return np.ones(x.shape, dtype=np.int64)
    return 1 + np.rint(x / top * (WEIGHT_SCALE - 1)).astype(np.int64)


def _greedy_balance(weights: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """Largest weight first onto the device that would finish it earliest (LPT)."""
    load = np.zeros(speed.shape[0])
    out = np.zeros(weights.shape[0], dtype=np.int64)
    for v in np.lexsort((np.arange(weights.shape[0]), -weights)):
        d = int(np.argmin(load + weights[v] / speed))
        out[v] = d
        load[d] += weights[v] / speed[d]
    return out


def metis_partition(graph: DataflowGraph, cluster, *, seed: int = 0,
                    memory_budget_bytes: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Device per op from a balanced k-way partition (see the module docstring)."""
    d = int(cluster.num_devices)
    n = graph.num_ops
    if d == 1:
        return np.zeros(n, dtype=np.int64)
    cm = CostModel.build(graph, cluster)
    vw = _integerise(cm.mean_compute_s())
    speed = 1.0 / np.maximum(cm.compute_s.mean(axis=0), 1e-300) if cm.compute_s.any() else np.ones(d)
    speed = speed / speed.sum()
    if graph.num_edges == 0:
        return _greedy_balance(vw.astype(np.float64), speed)
    ew = _integerise(cm.mean_edge_comm_s())
    # undirected adjacency, both directions, with edge weights
    us = np.concatenate([graph.src, graph.dst])
    vs = np.concatenate([graph.dst, graph.src])
    ws = np.concatenate([ew, ew])
    order = np.lexsort((vs, us))
    us, vs, ws = us[order], vs[order], ws[order]
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(us, minlength=n), out=xadj[1:])
    import pymetis

    tpwgts = None if np.allclose(speed, speed[0]) else [float(s) for s in speed * (1 - 1e-9)]
    if memory_budget_bytes is not None:  # each op weighs its share of the compute plus its share of the weights
        mem = _weight_share(graph)
        if mem.sum() > 0:
            comp = cm.mean_compute_s()
            vw = _integerise(comp / max(comp.sum(), 1e-300) + mem / mem.sum())
    with warnings.catch_warnings(), _c_stdout_silenced():
        warnings.simplefilter("ignore", DeprecationWarning)
        res = pymetis.part_graph(
            d,
            xadj=xadj.tolist(),
            adjncy=vs.tolist(),
            vweights=vw.tolist(),
            eweights=ws.tolist(),
            tpwgts=tpwgts,
            options=pymetis.Options(seed=int(seed) & 0x7FFFFFFF),
        )
    parts = np.asarray(res[1], dtype=np.int64)
    if parts.shape != (n,) or parts.min() < 0 or parts.max() >= d:  # pragma: no cover - defensive
        return _greedy_balance(vw.astype(np.float64), speed)
    return parts


def _weight_share(graph: DataflowGraph) -> np.ndarray:
    """Per op: the bytes of the weight slices it reads, each slice's bytes split among its readers."""
    s = input_slices(graph)
    ops, sl = s.op_slices()
    readers = np.bincount(sl, minlength=s.num_slices)
    w = s.weight[sl]
    return np.bincount(ops[w], weights=s.nbytes[sl[w]] / readers[sl[w]], minlength=graph.num_ops)


@contextlib.contextmanager
def _c_stdout_silenced() -> Iterator[None]:
    """METIS prints notes such as "You are trying to partition a graph into too many parts!" from C
    straight to file descriptor 1, which would corrupt ``--json`` output: send it to /dev/null."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@register("metis", description="balanced k-way min-cut partition (pymetis); ignores time", deterministic=False,
          python=PythonRun(), memory_aware=True)
def metis(graph: DataflowGraph, cluster, *, seed: int = 0, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """Balanced min-cut partition, one part per device (``seed`` seeds METIS)."""
    return Assignment(devices=metis_partition(graph, cluster, seed=seed, memory_budget_bytes=memory_budget_bytes))
