"""HEFT: Heterogeneous Earliest Finish Time (Topcuoglu, Hariri and Wu, IEEE TPDS 2002).

1. Upward rank ``rank_u(v) = mean_compute(v) + max_{w in succ(v)} (mean_comm(v, w) + rank_u(w))``
   with the mean compute time of ``v`` over devices and the mean transfer time of
   the edge over ordered pairs of distinct devices (the same costs as the
   CRITICAL PATH teacher's b-level).
2. Visit ops by decreasing ``rank_u`` (ties: lower topological level, then lower
   op id; this is always a topological order).
3. Put each op on the device that gives it the **earliest finish time**, where
   the start on device ``d`` is the earliest idle gap on ``d`` that begins no
   earlier than the op's data-ready time on ``d`` and is long enough for the op
   (insertion-based policy); ties: lowest device id.

:func:`heft_schedule` accepts explicit ``compute_s[n, D]`` and ``comm_s[E]`` so the
paper's example (10 tasks, 3 processors, schedule length 80) can be reproduced
exactly. The inner loop is compiled with numba (O(E * D) plus the gap scans).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler.assignment import Assignment
from doppler.baselines import register
from doppler.baselines._costs import CostModel
from doppler.graph import DataflowGraph

_core = None


def _get_core():
    global _core
    if _core is not None:
        return _core
    import numba

    @numba.njit(cache=True)
    def heft_core(order, pred_ptr, pred_idx, pb, comp, lat, inv):  # pragma: no cover - compiled
        n, nd = comp.shape
        cap = 16
        starts = np.empty((nd, cap))
        ends = np.empty((nd, cap))
        cnt = np.zeros(nd, np.int64)
        dev = np.zeros(n, np.int64)
        start = np.zeros(n)
        finish = np.zeros(n)
        ready = np.zeros(nd)
        best_pos = 0
        for h in range(n):
            v = order[h]
            for d in range(nd):
                ready[d] = 0.0
            for k in range(pred_ptr[v], pred_ptr[v + 1]):
                p = pred_idx[k]
                dp = dev[p]
                fp = finish[p]
                b = pb[k]
                for d in range(nd):
                    t = fp
                    if d != dp:
                        t = fp + lat[dp, d] + b * inv[dp, d]
                    if t > ready[d]:
                        ready[d] = t
            best_f = np.inf
            best_s = 0.0
            best_d = 0
            for d in range(nd):
                w = comp[v, d]
                c = cnt[d]
                # first interval whose end is after the ready time (ends are sorted)
                lo, hi = 0, c
                while lo < hi:
                    mid = (lo + hi) // 2
                    if ends[d, mid] <= ready[d]:
                        lo = mid + 1
                    else:
                        hi = mid
                t = ready[d]
                j = lo
                while j < c:
                    if t + w <= starts[d, j]:
                        break
                    if ends[d, j] > t:
                        t = ends[d, j]
                    j += 1
                f = t + w
                if f < best_f:
                    best_f = f
                    best_s = t
                    best_d = d
                    best_pos = j
            d = best_d
            c = cnt[d]
            if c == cap:
                cap *= 2
                ns = np.empty((nd, cap))
                ne = np.empty((nd, cap))
                ns[:, :c] = starts[:, :c]
                ne[:, :c] = ends[:, :c]
                starts = ns
                ends = ne
            for j in range(c, best_pos, -1):
                starts[d, j] = starts[d, j - 1]
                ends[d, j] = ends[d, j - 1]
            starts[d, best_pos] = best_s
            ends[d, best_pos] = best_f
            cnt[d] = c + 1
            dev[v] = d
            start[v] = best_s
            finish[v] = best_f
        return dev, start, finish

    _core = heft_core
    return _core


@dataclass
class HeftSchedule:
    assignment: np.ndarray  # int64[n] device per op
    order: np.ndarray  # int64[n] ops in scheduling order
    rank_u: np.ndarray  # float64[n]
    start_s: np.ndarray  # float64[n]
    finish_s: np.ndarray  # float64[n]
    makespan_s: float


def heft_schedule(
    graph: DataflowGraph,
    cluster=None,
    *,
    compute_s: np.ndarray | None = None,
    comm_s: np.ndarray | None = None,
) -> HeftSchedule:
    """HEFT's schedule. Costs come from ``cluster`` unless ``compute_s[n, D]``
    (per op and device) and/or ``comm_s[E]`` (per edge, between distinct devices)
    are given."""
    cm = CostModel.build(graph, cluster, compute_s=compute_s, comm_s=comm_s)
    rank = cm.b_level(graph)
    order = np.lexsort((np.arange(graph.num_ops), graph.level, -rank)).astype(np.int64)
    core = _get_core()
    dev, start, finish = core(
        order,
        graph.pred_ptr.astype(np.int64),
        graph.pred_idx.astype(np.int64),
        np.ascontiguousarray(cm.pred_bytes(graph)),
        np.ascontiguousarray(cm.compute_s),
        np.ascontiguousarray(cm.latency_s),
        np.ascontiguousarray(cm.inv_bw),
    )
    return HeftSchedule(dev, order, rank, start, finish, float(finish.max()))


@register("heft", description="HEFT: upward rank order, earliest finish time with insertion")
def heft(graph: DataflowGraph, cluster, *, seed: int = 0, budget_s: float | None = None) -> Assignment:
    """HEFT (deterministic; ``seed``/``budget_s`` unused)."""
    s = heft_schedule(graph, cluster)
    return Assignment(devices=s.assignment, estimated_makespan_s=s.makespan_s)
