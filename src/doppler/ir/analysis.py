"""Longest-path analyses of a :class:`~doppler.ir.graph.DataflowGraph`, as passes beside it (torch.fx style):
b-level (an op's longest path to an exit, its own compute included), t-level (its earliest start with unlimited
devices), one critical path and its length. ``compute_s`` is a time per op (default: ``flops``), ``comm_s`` a
time per edge (default: 0). Each pass is O(V + E): vectorised per topological level, or, on a deep graph
(:attr:`DataflowGraph.deep`), one compiled loop over the ops; both give the same sums."""

from __future__ import annotations

import numpy as np

from typing import Any

from doppler.ir.graph import DataflowGraph, GraphError, OpKind, expand_ranges
from doppler.util.jit import jit


@jit(cache=True)
def _b_level_loop(order, succ_ptr, succ_idx, succ_eid, comp, edge_cost):  # pragma: no cover - compiled
    """:func:`b_level` as one pass over the ops in reverse topological order (same sums)."""
    b = comp.copy()
    for q in range(order.shape[0] - 1, -1, -1):
        v = order[q]
        best = 0.0
        for s in range(succ_ptr[v], succ_ptr[v + 1]):
            x = edge_cost[succ_eid[s]] + b[succ_idx[s]]
            if x > best:
                best = x
        b[v] = comp[v] + best
    return b


@jit(cache=True)
def _t_level_loop(order, pred_ptr, pred_idx, pred_eid, comp, edge_cost):  # pragma: no cover - compiled
    """:func:`t_level` as one pass over the ops in topological order (same sums)."""
    t = np.zeros(order.shape[0])
    for v in order:
        best = 0.0
        for s in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[s]
            x = t[u] + comp[u] + edge_cost[pred_eid[s]]
            if x > best:
                best = x
        t[v] = best
    return t


@jit(cache=True)
def _walk_critical_path(start, succ_ptr, succ_idx, succ_eid, edge_cost, blevel):  # pragma: no cover - compiled
    """The critical path from ``start``: at each op the successor of the largest edge cost plus b-level
    (ties: the lowest op id), as :func:`critical_path` walks it."""
    path = [start]
    v = start
    while succ_ptr[v + 1] > succ_ptr[v]:
        best = -np.inf
        nxt = -1
        for s in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[s]
            x = edge_cost[succ_eid[s]] + blevel[w]
            if x > best or (x == best and w < nxt):
                best = x
                nxt = w
        v = nxt
        path.append(v)
    return np.array(path, np.int64)


def _segment_max(vals: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of ``lengths`` consecutive entries of ``vals``: which rows are non-empty, and the max of
    each of those, at least 0 (work proportional to the rows, not to the graph)."""
    has = lengths > 0
    starts = (np.cumsum(lengths) - lengths)[has]
    return has, np.maximum(np.maximum.reduceat(vals, starts), 0.0)


def _edge_cost(graph: DataflowGraph, comm_s: np.ndarray | None) -> np.ndarray:
    if comm_s is None:
        return np.zeros(graph.num_edges)
    comm = np.asarray(comm_s, dtype=np.float64)
    if comm.shape == (graph.num_edges,):
        return comm
    raise GraphError(f"comm_s must have one entry per edge ({graph.num_edges}), got shape {comm.shape}")

def edge_comm_from_ops(graph: DataflowGraph, transfer_s: np.ndarray) -> np.ndarray:
    """Per-edge communication cost when each op's output costs ``transfer_s[op]`` to move."""
    return np.asarray(transfer_s, dtype=np.float64)[graph.src]

def _check_compute(graph: DataflowGraph, compute_s: np.ndarray | None) -> np.ndarray:
    comp = graph.flops if compute_s is None else np.asarray(compute_s, dtype=np.float64)
    if comp.shape != (graph.num_ops,):
        raise GraphError(f"compute_s must have one entry per op ({graph.num_ops}), got shape {comp.shape}")
    return comp

def _level_edge_groups(graph: DataflowGraph, by: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each level: (ops at that level, CSR slots of their out-(or in-)edges)."""
    cached = graph.__dict__.get(f"_lvl_groups_{by}")
    if cached is not None:
        return cached
    ptr = graph.succ_ptr if by == "succ" else graph.pred_ptr
    bounds = np.searchsorted(graph.level[graph.topo_order], np.arange(graph.depth + 1))
    groups = []
    for d in range(graph.depth):
        ops = graph.topo_order[bounds[d] : bounds[d + 1]]
        groups.append((ops, expand_ranges(ptr, ops)))
    graph.__dict__[f"_lvl_groups_{by}"] = groups
    return groups

def b_level(graph: DataflowGraph, compute_s: np.ndarray | None = None, comm_s: np.ndarray | None = None) -> np.ndarray:
    """Longest path from each op to an exit, counting the op's own compute.

    ``compute_s``: per-op time (defaults to ``flops``); ``comm_s``: per-edge
    transfer time (defaults to 0, i.e. compute-only). O(V+E), vectorised per level.
    """
    comp = _check_compute(graph, compute_s)
    edge_cost = _edge_cost(graph, comm_s)
    if graph.deep:
        return _b_level_loop(graph.topo_order, graph.succ_ptr, graph.succ_idx, graph.succ_eid, comp, edge_cost)
    blevel = comp.copy()
    degree = np.diff(graph.succ_ptr)
    for ops, slots in reversed(_level_edge_groups(graph, "succ")):
        if slots.size:
            vals = edge_cost[graph.succ_eid[slots]] + blevel[graph.succ_idx[slots]]
            has, best = _segment_max(vals, degree[ops])
            blevel[ops[has]] = comp[ops[has]] + best
    return blevel

def t_level(graph: DataflowGraph, compute_s: np.ndarray | None = None, comm_s: np.ndarray | None = None) -> np.ndarray:
    """Longest path from an entry to each op, *excluding* the op's own compute
    (its earliest possible start time with unlimited devices)."""
    comp = _check_compute(graph, compute_s)
    edge_cost = _edge_cost(graph, comm_s)
    if graph.deep:
        return _t_level_loop(graph.topo_order, graph.pred_ptr, graph.pred_idx, graph.pred_eid, comp, edge_cost)
    tlevel = np.zeros(graph.num_ops)
    degree = np.diff(graph.pred_ptr)
    for ops, slots in _level_edge_groups(graph, "pred"):
        if slots.size:
            preds = graph.pred_idx[slots]
            vals = tlevel[preds] + comp[preds] + edge_cost[graph.pred_eid[slots]]
            has, best = _segment_max(vals, degree[ops])
            tlevel[ops[has]] = best
    return tlevel

def critical_path(graph: DataflowGraph, compute_s: np.ndarray | None = None, comm_s: np.ndarray | None = None) -> list[int]:
    """Op ids on one longest entry-to-exit path (ties: lowest op id)."""
    comp = _check_compute(graph, compute_s)
    edge_cost = _edge_cost(graph, comm_s)
    blevel = b_level(graph, comp, comm_s)
    entries = np.flatnonzero(graph.in_degree() == 0)
    v = int(entries[np.argmax(blevel[entries])])
    if graph.deep:
        return _walk_critical_path(v, graph.succ_ptr, graph.succ_idx, graph.succ_eid, edge_cost, blevel).tolist()
    path = [v]
    while graph.succ_ptr[v + 1] > graph.succ_ptr[v]:
        lo, hi = graph.succ_ptr[v], graph.succ_ptr[v + 1]
        succ = graph.succ_idx[lo:hi]
        vals = edge_cost[graph.succ_eid[lo:hi]] + blevel[succ]
        best = vals.max()
        v = int(succ[vals == best].min())
        path.append(v)
    return path

def critical_path_length(graph: DataflowGraph, compute_s: np.ndarray | None = None, comm_s: np.ndarray | None = None) -> float:
    """The length of a longest entry-to-exit path: the largest :func:`b_level`."""
    return float(b_level(graph, compute_s, comm_s).max())


def summary(graph: DataflowGraph) -> dict[str, Any]:
    """Size and work statistics (no hardware involved)."""
    kinds, counts = np.unique(graph.kind, return_counts=True)
    return {
        "name": graph.name,
        "num_ops": graph.num_ops,
        "num_edges": graph.num_edges,
        "depth": graph.depth,
        "total_flops": float(graph.flops.sum()),
        "critical_path_flops": critical_path_length(graph),
        "total_output_bytes": float(graph.output_bytes.sum()),
        "ops_by_kind": {OpKind(int(k)).label: int(c) for k, c in zip(kinds, counts)},
        "fingerprint": graph.fingerprint(),
    }
