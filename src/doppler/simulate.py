"""The work-conserving (WC) simulator, its bulk-synchronous (BSP) variant, lower bounds and traces.

Semantics (docs/design.md, Execution semantics), exactly:

* Device ``d`` runs up to ``streams[d]`` ops at once (1 by default), each at
  full speed: op ``v`` takes ``flops[v] / rate(kind[v], d)`` seconds.
* An op is *ready* on its device once every input has *arrived* there. Among
  its ready ops an idle device (a free stream) takes the one that became ready
  first (FIFO), ties broken by the lower op id.
* ``dispatch="priority"`` (WC only) replaces that FIFO rule: among its ready
  ops an idle device takes the one with the smallest static ``priority[v]``
  (one number per op, lower runs first; the op id by default), ties broken by
  the lower op id. When an op became ready no longer matters (the trace still
  records it in ``op_ready``); everything else below is unchanged.
* When ``u`` finishes on device ``a``, its output is sent once to every other
  device ``b`` that holds a consumer of ``u`` (one transfer per (op, device),
  however many consumers sit there). The transfer starts at ``u``'s finish and
  takes ``latency[a, b] + output_bytes[u] / bandwidth[a, b]``; consumers on
  ``a`` itself get it at ``u``'s finish.
* Links are contention-free by default. With ``link_contention=True`` every
  ordered link ``a -> b`` carries one transfer at a time (latency included),
  in FIFO order of request (= producer finish) time, ties by (producer op id,
  destination device).
* A destination device ``b`` with ``copies_inbound`` (a CPU worker: no copy
  engine) makes every transfer into it itself: the transfer joins ``b``'s
  ready queue at its request time, FIFO with ``b``'s ops (on equal times ops
  go first, then transfers by producer op id), and occupies one of ``b``'s
  streams for its duration, whatever ``link_contention`` says. FIFO dispatch
  only.
* Time advances from event to event. At each timestamp the simulator first
  processes *every* completion and arrival at that time (and any zero-length
  transfer they trigger), and only then lets idle devices (and free links)
  pick their next op (transfer). If zero-duration ops finish "at the same
  time", that repeats in further rounds at the same timestamp. The result
  never depends on the order in which simultaneous events are processed.
* ``noise_sigma > 0`` multiplies every op duration and every transfer
  duration by an independent lognormal factor ``exp(sigma * z - sigma**2 / 2)``
  (mean 1), ``z ~ N(0, 1)`` drawn from ``numpy.random.default_rng(seed)``: one
  draw per op, and one per successor slot (CSR order) for transfers (a
  transfer ``(u, b)`` uses the draw of the first successor of ``u`` on ``b``).
  So the same seed gives the same durations whatever the assignment
  (common random numbers: ``simulate_many`` uses the same draws for every row).
* ``mode="bsp"``: ops are grouped by topological level (``graph.level``).
  Level ``k + 1`` is released (all its ops become ready at once) when every op
  of level ``k`` and every transfer sent by an op of level ``k`` has finished;
  inside a level, devices run their ops FIFO (= op id order, since they are
  all ready at the release time).
* Makespan = finish time of the last op. (Trailing transfers are never
  needed: a transfer only exists when some op consumes it.)

Implementation: a heap-based event loop compiled with numba (``@njit(cache=True)``).
The per-(graph, cluster) arrays (compute time per op and device, CSR arrays,
level order) live in a :class:`SimContext`. The functions :func:`simulate`,
:func:`simulate_many` and :func:`lower_bound` build one per call; code that
simulates many assignments of one graph holds its own (``ctx = context(g, c)``), so
each further call only pays for the event loop. The tests cross-check it against two independent implementations of the
same semantics, a pure-Python one and a SimPy one (``tests/reference/``), which
give bit-identical results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from doppler.assignment import Assignment, AssignmentError, as_devices, check_assignment
from doppler.costs import CostModel
from doppler.graph import DataflowGraph
from doppler.hardware import Cluster
from doppler.io_util import check_seed
from doppler._jit import jit
from doppler.trace import Trace  # re-exported (see __all__): `from doppler.simulate import Trace` still works

MODES = ("wc", "bsp")
DISPATCHES = ("fifo", "priority")

__all__ = [
    "SimContext",
    "SimResult",
    "SimulationError",
    "Trace",
    "lower_bound",
    "simulate",
    "simulate_many",
    "traced",
]


#: relative margin of the annealer's pruning (_sim_rows): far above float rounding, far below any real difference
PRUNE_SLACK = 1e-9

#: largest accepted lognormal noise sigma (see check_options)
MAX_NOISE_SIGMA = 3.0


class SimulationError(ValueError):
    """Bad simulator options (mode, noise, seed, ...); the message says which."""


# =========================================================================== results
@dataclass
class SimResult:
    """``makespan_s`` (seconds) and, with ``trace=True``, the :class:`Trace` and the peak live
    bytes per device (:meth:`Trace.peak_memory_bytes`; the model is in docs/cli.md)."""

    makespan_s: float
    trace: Trace | None = None
    mode: str = "wc"
    peak_memory_bytes: np.ndarray | None = None  # float64[D], with trace=True


# =========================================================================== numba kernel
# (numba is imported, and the kernels compiled or loaded from its cache, on first use: doppler._jit)
@jit(cache=True)
def _hpush(ht, hi, base, size, t, i):  # pragma: no cover - compiled
    """Push key (t, i) into the binary min-heap stored in ht/hi[base : base + size]."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        pt = ht[base + parent]
        pi = hi[base + parent]
        if t < pt or (t == pt and i < pi):
            ht[base + pos] = pt
            hi[base + pos] = pi
            pos = parent
        else:
            break
    ht[base + pos] = t
    hi[base + pos] = i
    return size + 1


@jit(cache=True)
def _hpop(ht, hi, base, size):  # pragma: no cover - compiled
    """Remove the minimum of the heap in ht/hi[base : base + size]; returns the new size."""
    size -= 1
    t = ht[base + size]
    i = hi[base + size]
    pos = 0
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        ct = ht[base + c]
        ci = hi[base + c]
        if c + 1 < size:
            rt = ht[base + c + 1]
            ri = hi[base + c + 1]
            if rt < ct or (rt == ct and ri < ci):
                c += 1
                ct = rt
                ci = ri
        if ct < t or (ct == t and ci < i):
            ht[base + pos] = ct
            hi[base + pos] = ci
            pos = c
        else:
            break
    ht[base + pos] = t
    hi[base + pos] = i
    return size


@jit(cache=True)
def _sim_kernel(
    succ_ptr,
    succ_idx,
    indeg,
    level,
    lvl_ptr,
    lvl_ops,
    comp,
    out_bytes,
    lat,
    bw,
    streams,
    dev,
    op_f,
    edge_f,
    bsp,
    contention,
    copies_in,
    key,
    op_ready,
    op_start,
    op_end,
    tr_src,
    tr_dst,
    tr_start,
    tr_end,
    prune_at,
):  # pragma: no cover - compiled
    """One simulation; fills the trace arrays and returns (makespan, number of transfers).

    ``prune_at < inf`` (the annealer's batches): stop as soon as a lower bound on the makespan
    exceeds ``prune_at`` and return ``(inf, 0)``; the trace arrays are then partial. The bounds:
    before the loop, this assignment's critical path (durations and transfer times, no waiting) and
    each device's work over its streams; at each op's dispatch at time ``t``, the op's end plus
    ``tail[v]``, the longest such path after it, and ``t`` plus the work its device has left over
    its streams. Waiting for a device or a link only adds to these. ``prune_at = inf`` never
    stops early and costs nothing.

    Events (heap keyed by (time, id)): ``id < n`` op ``id`` completes;
    ``n <= id < 2n`` op ``id - n`` becomes ready (its last input arrives);
    ``2n <= id < 2n + T`` transfer ``id - 2n`` ends (link-contention mode, or a
    transfer into a ``copies_in`` device); ``id >= 2n + T`` BSP level
    ``id - 2n - T`` is released. Without contention a transfer's end is known
    when its producer finishes, so instead of one event per transfer there is
    at most one "ready" event per op (and one release event per BSP level),
    which is what makes this loop fast. The per-device ready heaps are keyed
    (ready time, op id), or (``key[v]``, op id) in priority dispatch; a transfer
    ``k`` into a ``copies_in`` device waits in that device's heap as item
    ``n + k`` keyed by its request time (priority dispatch refuses such
    clusters before calling here). FIFO passes ``key=None``: numba compiles a
    separate specialization for it and prunes the ``key is None`` tests, so the
    FIFO loop carries no trace of priority dispatch.
    """
    n = dev.shape[0]
    D = streams.shape[0]
    E = succ_idx.shape[0]
    pruning = prune_at < np.inf

    cnt = np.zeros(D, np.int64)
    work_left = np.zeros(D, np.float64)  # pruning: the durations of the ops not yet started, per device
    for v in range(n):
        dv = dev[v]
        if dv < 0 or dv >= D:
            return -1.0, -1
        cnt[dv] += 1
        if pruning:
            work_left[dv] += comp[v, dv] * op_f[v]
    if pruning:
        for d in range(D):
            if work_left[d] / streams[d] > prune_at:
                return np.inf, 0

    # ---- transfers: one per (producer, destination device), in producer order
    tr_ptr = np.empty(n + 1, np.int64)
    tr_slot = np.empty(E, np.int64)
    slot_tr = np.empty(E, np.int64)  # successor slot -> transfer carrying it (-1: same device)
    mark = np.full(D, -1, np.int64)
    mark_k = np.empty(D, np.int64)
    ntr = 0
    for u in range(n):
        tr_ptr[u] = ntr
        du = dev[u]
        for sl in range(succ_ptr[u], succ_ptr[u + 1]):
            dv = dev[succ_idx[sl]]
            if dv == du:
                slot_tr[sl] = -1
            elif mark[dv] != u:
                mark[dv] = u
                mark_k[dv] = ntr
                slot_tr[sl] = ntr
                tr_src[ntr] = u
                tr_dst[ntr] = dv
                tr_slot[ntr] = sl
                ntr += 1
            else:
                slot_tr[sl] = mark_k[dv]
    tr_ptr[n] = ntr

    # ---- pruning: tail[v], the longest path of durations and transfer times after v (levels backwards)
    tail = np.empty(n if pruning else 0, np.float64)
    if pruning:
        for q in range(lvl_ops.shape[0] - 1, -1, -1):
            v = lvl_ops[q]
            dv = dev[v]
            x = 0.0
            for sl in range(succ_ptr[v], succ_ptr[v + 1]):
                w = succ_idx[sl]
                dw = dev[w]
                y = comp[w, dw] * op_f[w] + tail[w]
                k = slot_tr[sl]
                if k >= 0:
                    y += (lat[dv, dw] + out_bytes[v] / bw[dv, dw]) * edge_f[tr_slot[k]]
                if y > x:
                    x = y
            tail[v] = x
            if indeg[v] == 0 and comp[v, dv] * op_f[v] + x > prune_at:
                return np.inf, 0

    # ---- ready heaps: one segment of rt/ri per device (ops, and copies made by the device)
    for k in range(ntr):
        if copies_in[tr_dst[k]]:
            cnt[tr_dst[k]] += 1
    rbase = np.empty(D, np.int64)
    s = 0
    for d in range(D):
        rbase[d] = s
        s += cnt[d]
    rsize = np.zeros(D, np.int64)
    rt = np.empty(s, np.float64)
    ri = np.empty(s, np.int64)

    # ---- link queues (contention mode)
    L = D * D if contention else 1
    lbase = np.zeros(L, np.int64)
    lsize = np.zeros(L, np.int64)
    lbusy = np.zeros(L, np.bool_)
    ldirty = np.zeros(L, np.bool_)
    ldirty_list = np.empty(L, np.int64)
    nldirty = 0
    qcap = ntr if contention else 1
    lqt = np.empty(qcap, np.float64)
    lqi = np.empty(qcap, np.int64)
    if contention:
        lcnt = np.zeros(L, np.int64)
        for k in range(ntr):
            if not copies_in[tr_dst[k]]:  # a copy made by its destination never waits on a link
                lcnt[dev[tr_src[k]] * D + tr_dst[k]] += 1
        s = 0
        for l in range(L):
            lbase[l] = s
            s += lcnt[l]

    # ---- BSP: ops + transfers still to finish per level, latest end per level
    nlev = lvl_ptr.shape[0] - 1
    outstanding = np.zeros(nlev if bsp else 1, np.int64)
    lvl_end = np.zeros(nlev if bsp else 1, np.float64)
    cur_level = 0
    if bsp:
        for v in range(n):
            outstanding[level[v]] += 1
        for k in range(ntr):
            outstanding[level[tr_src[k]]] += 1

    pending = indeg.copy()
    rdy = np.zeros(n, np.float64)  # latest input arrival seen so far (WC)
    running = np.zeros(D, np.int64)
    ddirty = np.zeros(D, np.bool_)
    ddirty_list = np.empty(D, np.int64)
    nddirty = 0

    ecap = 2 * n + ntr + 1
    et = np.empty(ecap, np.float64)
    ei = np.empty(ecap, np.int64)
    esize = 0
    ev_tr = 2 * n
    ev_rel = 2 * n + ntr

    # ---- initial ready ops (time 0): sources (WC) or level 0 (BSP)
    if bsp:
        for q in range(lvl_ptr[0], lvl_ptr[1]):
            v = lvl_ops[q]
            op_ready[v] = 0.0
            d = dev[v]
            rsize[d] = _hpush(rt, ri, rbase[d], rsize[d], 0.0 if key is None else key[v], v)
            if not ddirty[d]:
                ddirty[d] = True
                ddirty_list[nddirty] = d
                nddirty += 1
    else:
        for v in range(n):
            if indeg[v] == 0:
                op_ready[v] = 0.0
                d = dev[v]
                rsize[d] = _hpush(rt, ri, rbase[d], rsize[d], 0.0 if key is None else key[v], v)
                if not ddirty[d]:
                    ddirty[d] = True
                    ddirty_list[nddirty] = d
                    nddirty += 1

    makespan = 0.0
    t = 0.0
    while True:
        # ---------------- dispatch at time t: idle devices, then free links
        for q in range(nddirty):
            d = ddirty_list[q]
            ddirty[d] = False
            while running[d] < streams[d] and rsize[d] > 0:
                v = ri[rbase[d]]
                rsize[d] = _hpop(rt, ri, rbase[d], rsize[d])
                running[d] += 1
                if v >= n:  # a copy into d, made by d
                    k = v - n
                    u = tr_src[k]
                    tr_start[k] = t
                    e = t + (lat[dev[u], d] + out_bytes[u] / bw[dev[u], d]) * edge_f[tr_slot[k]]
                    tr_end[k] = e
                    esize = _hpush(et, ei, 0, esize, e, ev_tr + k)
                    continue
                op_start[v] = t
                dur = comp[v, d] * op_f[v]
                e = t + dur
                op_end[v] = e
                esize = _hpush(et, ei, 0, esize, e, v)
                if pruning:
                    work_left[d] -= dur
                    if e + tail[v] > prune_at or t + (dur + work_left[d]) / streams[d] > prune_at:
                        return np.inf, 0
        nddirty = 0
        for q in range(nldirty):
            l = ldirty_list[q]
            ldirty[l] = False
            if not lbusy[l] and lsize[l] > 0:
                k = lqi[lbase[l]]
                lsize[l] = _hpop(lqt, lqi, lbase[l], lsize[l])
                lbusy[l] = True
                u = tr_src[k]
                a = dev[u]
                b = tr_dst[k]
                tr_start[k] = t
                e = t + (lat[a, b] + out_bytes[u] / bw[a, b]) * edge_f[tr_slot[k]]
                tr_end[k] = e
                esize = _hpush(et, ei, 0, esize, e, ev_tr + k)
        nldirty = 0

        if esize == 0:
            break
        # ---------------- process every event at the next timestamp
        t = et[0]
        while esize > 0 and et[0] == t:
            x = ei[0]
            esize = _hpop(et, ei, 0, esize)
            u = -1  # producer whose op or transfer just finished (BSP accounting)
            if x < n:  # ---- op completion
                u = x
                d = dev[u]
                running[d] -= 1
                if not ddirty[d]:
                    ddirty[d] = True
                    ddirty_list[nddirty] = d
                    nddirty += 1
                if t > makespan:
                    makespan = t
                # start transfers (contention: queue them on their link)
                for k in range(tr_ptr[u], tr_ptr[u + 1]):
                    b = tr_dst[k]
                    if copies_in[b]:  # key (request time, n + k): after ops ready at the same time
                        rsize[b] = _hpush(rt, ri, rbase[b], rsize[b], t, n + k)
                        if not ddirty[b]:
                            ddirty[b] = True
                            ddirty_list[nddirty] = b
                            nddirty += 1
                    elif contention:
                        l = d * D + b
                        # key (request time, k): transfer ids grow with the producer id and a
                        # link carries at most one transfer per producer, so ties go by producer
                        lsize[l] = _hpush(lqt, lqi, lbase[l], lsize[l], t, k)
                        if not ldirty[l]:
                            ldirty[l] = True
                            ldirty_list[nldirty] = l
                            nldirty += 1
                    else:
                        tr_start[k] = t
                        e = t + (lat[d, b] + out_bytes[u] / bw[d, b]) * edge_f[tr_slot[k]]
                        tr_end[k] = e
                        if bsp:
                            lv = level[u]
                            outstanding[lv] -= 1
                            if e > lvl_end[lv]:
                                lvl_end[lv] = e
                if not bsp:
                    # deliver to consumers: same device now, others at their transfer's end
                    for sl in range(succ_ptr[u], succ_ptr[u + 1]):
                        k = slot_tr[sl]
                        w = succ_idx[sl]
                        if k >= 0 and (contention or copies_in[dev[w]]):
                            continue  # delivered when the transfer event fires
                        arr = t if k < 0 else tr_end[k]
                        if arr > rdy[w]:
                            rdy[w] = arr
                        pending[w] -= 1
                        if pending[w] == 0:
                            if rdy[w] == t:
                                op_ready[w] = t
                                dw = dev[w]
                                rsize[dw] = _hpush(rt, ri, rbase[dw], rsize[dw], t if key is None else key[w], w)
                                if not ddirty[dw]:
                                    ddirty[dw] = True
                                    ddirty_list[nddirty] = dw
                                    nddirty += 1
                            else:
                                esize = _hpush(et, ei, 0, esize, rdy[w], n + w)
            elif x < ev_tr:  # ---- op becomes ready (its last input arrived)
                w = x - n
                op_ready[w] = t
                dw = dev[w]
                rsize[dw] = _hpush(rt, ri, rbase[dw], rsize[dw], t if key is None else key[w], w)
                if not ddirty[dw]:
                    ddirty[dw] = True
                    ddirty_list[nddirty] = dw
                    nddirty += 1
            elif x < ev_rel:  # ---- transfer ends (contention mode, or a copy made by its destination)
                k = x - ev_tr
                u = tr_src[k]
                b = tr_dst[k]
                if copies_in[b]:
                    running[b] -= 1
                    if not ddirty[b]:
                        ddirty[b] = True
                        ddirty_list[nddirty] = b
                        nddirty += 1
                else:
                    l = dev[u] * D + b
                    lbusy[l] = False
                    if not ldirty[l]:
                        ldirty[l] = True
                        ldirty_list[nldirty] = l
                        nldirty += 1
                if not bsp:
                    for sl in range(succ_ptr[u], succ_ptr[u + 1]):
                        w = succ_idx[sl]
                        if dev[w] == b:
                            pending[w] -= 1
                            if pending[w] == 0:
                                op_ready[w] = t
                                rsize[b] = _hpush(rt, ri, rbase[b], rsize[b], t if key is None else key[w], w)
                                if not ddirty[b]:
                                    ddirty[b] = True
                                    ddirty_list[nddirty] = b
                                    nddirty += 1
            else:  # ---- BSP level released
                lv = x - ev_rel
                for q in range(lvl_ptr[lv], lvl_ptr[lv + 1]):
                    v = lvl_ops[q]
                    op_ready[v] = t
                    d2 = dev[v]
                    rsize[d2] = _hpush(rt, ri, rbase[d2], rsize[d2], t if key is None else key[v], v)
                    if not ddirty[d2]:
                        ddirty[d2] = True
                        ddirty_list[nddirty] = d2
                        nddirty += 1
            if bsp and u >= 0:
                lv = level[u]
                outstanding[lv] -= 1
                if t > lvl_end[lv]:
                    lvl_end[lv] = t
                if outstanding[cur_level] == 0 and cur_level + 1 < nlev:
                    # every op and transfer of the level is done or has a known end time
                    cur_level += 1
                    esize = _hpush(et, ei, 0, esize, lvl_end[cur_level - 1], ev_rel + cur_level)
    return makespan, ntr


@jit(cache=True)
def _sim_rows(
    succ_ptr, succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, devs, op_f, edge_f, bsp,
    contention, copies_in, key, first, step, out, prune, cap,
):  # pragma: no cover - compiled
    """Makespans of rows ``first, first + step, ...`` of ``devs`` into ``out``, with one set of scratch arrays.

    With ``prune``, a row is abandoned as ``inf`` once it is sure to end later than ``cap`` or than
    the best of the rows before it here. So if the least makespan of these rows is at most ``cap``,
    it and the first row that reaches it are exact; if not, every row is ``inf`` or within float
    rounding of ``cap`` or above it. Only that is kept (the annealer's use: only its batch's best row
    matters, and only if its rule may accept it)."""
    B, n = devs.shape
    E = succ_idx.shape[0]
    op_ready = np.empty(n, np.float64)
    op_start = np.empty(n, np.float64)
    op_end = np.empty(n, np.float64)
    tr_src = np.empty(E, np.int64)
    tr_dst = np.empty(E, np.int64)
    tr_start = np.empty(E, np.float64)
    tr_end = np.empty(E, np.float64)
    best = np.inf
    for b in range(first, B, step):
        # PRUNE_SLACK: a bound within float rounding of the best must not cut a row that ties it
        prune_at = min(best, cap) * (1.0 + PRUNE_SLACK) if prune else np.inf
        mk, _ = _sim_kernel(
            succ_ptr, succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, devs[b],
            op_f, edge_f, bsp, contention, copies_in, key, op_ready, op_start, op_end, tr_src, tr_dst, tr_start, tr_end,
            prune_at,
        )  # fmt: skip
        out[b] = mk
        if mk < best:
            best = mk


@jit(cache=True)
def _sim_many_kernel(
    succ_ptr, succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, devs, op_f, edge_f, bsp,
    contention, copies_in, key,
):  # pragma: no cover - compiled
    out = np.empty(devs.shape[0], np.float64)
    _sim_rows(succ_ptr, succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, devs, op_f,
              edge_f, bsp, contention, copies_in, key, 0, 1, out, False, np.inf)  # fmt: skip
    return out


# =========================================================================== context
class SimContext:
    """Static per-(graph, cluster) arrays, built once; reuse it for many assignments.

    ``simulate``/``simulate_many``/``lower_bound`` build one per call; hold one in
    loops: ``ctx = SimContext(g, c); ctx.makespan(devices)``.
    """

    def __init__(self, graph: DataflowGraph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        self.num_ops = n = graph.num_ops
        self.num_devices = cluster.num_devices
        self.num_edges = graph.num_edges
        self.succ_ptr = np.ascontiguousarray(graph.succ_ptr, dtype=np.int64)
        self.succ_idx = np.ascontiguousarray(graph.succ_idx, dtype=np.int64)
        self.indeg = np.ascontiguousarray(np.diff(graph.pred_ptr), dtype=np.int64)
        self.level = np.ascontiguousarray(graph.level, dtype=np.int64)
        self.lvl_ops = np.lexsort((np.arange(n), self.level)).astype(np.int64)
        self.lvl_ptr = np.zeros(int(self.level.max()) + 2, dtype=np.int64)
        np.cumsum(np.bincount(self.level), out=self.lvl_ptr[1:])
        self.comp = np.ascontiguousarray(CostModel.build(graph, cluster).compute_s, dtype=np.float64)
        cluster.check_times(graph, self.comp)
        self.out_bytes = np.ascontiguousarray(graph.output_bytes, dtype=np.float64)
        self.lat = np.ascontiguousarray(cluster.latency_s, dtype=np.float64)
        self.bw = np.ascontiguousarray(cluster.bandwidth_Bps, dtype=np.float64)
        self.streams = np.ascontiguousarray(cluster.streams, dtype=np.int64)
        self.copies_in = np.ascontiguousarray(cluster.copies_inbound, dtype=np.bool_)
        self._ones_n = np.ones(n)
        self._ones_e = np.ones(max(self.num_edges, 1))
        self._noise_cache: tuple[float, int, np.ndarray, np.ndarray] | None = None
        self._fingerprints: set[str] = set()  # assignment fingerprints found to be this graph's
        self._lower_bound: float | None = None

    # ------------------------------------------------------------------ options
    def noise(self, sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Multiplicative duration factors (per op, per successor slot)."""
        if sigma == 0.0:
            return self._ones_n, self._ones_e
        c = self._noise_cache
        if c is not None and c[0] == sigma and c[1] == seed:
            return c[2], c[3]
        rng = np.random.default_rng(seed)
        z = rng.standard_normal(self.num_ops + self.num_edges)
        f = np.exp(sigma * z - 0.5 * sigma * sigma)
        op_f = np.ascontiguousarray(f[: self.num_ops])
        edge_f = np.ascontiguousarray(f[self.num_ops :]) if self.num_edges else self._ones_e
        self._noise_cache = (sigma, seed, op_f, edge_f)
        return op_f, edge_f

    # ------------------------------------------------------------------ running
    def _scratch(self) -> tuple[np.ndarray, ...]:
        """Output arrays reused by untraced runs (calls hold the GIL, so one set per context is safe)."""
        sc = self.__dict__.get("_scratch_arrays")
        if sc is None:
            n, E = self.num_ops, max(self.num_edges, 1)
            sc = (np.empty(n), np.empty(n), np.empty(n), np.empty(E, np.int64), np.empty(E, np.int64), np.empty(E), np.empty(E))
            self.__dict__["_scratch_arrays"] = sc
        return sc

    def _devices(self, assignment: Any) -> np.ndarray:
        """The device array; int64 contiguous arrays of the right length pass through unchecked
        (the kernel range-checks them), anything else goes through check_assignment."""
        if isinstance(assignment, Assignment) and assignment.graph_fingerprint:
            self._check_fingerprint(assignment.graph_fingerprint)
        arr = assignment.devices if isinstance(assignment, Assignment) else assignment
        if (
            type(arr) is np.ndarray
            and arr.dtype == np.int64
            and arr.ndim == 1
            and arr.shape[0] == self.num_ops
            and arr.flags.c_contiguous
        ):
            return arr
        dev = check_assignment(self.graph, as_devices(assignment), self.num_devices)
        return np.ascontiguousarray(dev, dtype=np.int64)

    def _check_fingerprint(self, fp: str) -> None:
        """An :class:`Assignment` made for another graph (its fingerprint says so) is refused, as the CLI
        refuses such a file; the graph's fingerprints are hashed once per context."""
        if fp in self._fingerprints:
            return
        if not self.graph.matches_fingerprint(fp):
            raise AssignmentError(f"the assignment was made for another graph than {self.graph.name!r} (its "
                                  "graph_fingerprint differs); pass its .devices to simulate it anyway")  # fmt: skip
        self._fingerprints.add(fp)

    def _dispatch_key(self, dispatch: str, priority: Any, mode: str) -> np.ndarray | None:
        """The per-op priority key (float64) for ``dispatch="priority"``, None for FIFO."""
        if not check_dispatch(dispatch, mode, priority is not None):
            return None
        if self.copies_in.any():
            names = ", ".join(d.name for d in self.cluster.devices if d.copies_inbound)
            raise SimulationError(
                f"priority dispatch does not model devices that make their own inbound copies "
                f"(copies_inbound: {names}); use FIFO dispatch with cluster {self.cluster.name!r}"
            )
        if priority is None:
            k = self.__dict__.get("_id_key")
            if k is None:
                k = self.__dict__["_id_key"] = np.arange(self.num_ops, dtype=np.float64)
            return k
        return _check_priority(priority, self.num_ops)

    def _run(
        self,
        dev: np.ndarray,
        mode: str,
        trace: bool,
        sigma: float,
        seed: int,
        contention: bool,
        key: np.ndarray | None = None,
    ) -> SimResult:
        op_f, edge_f = self.noise(sigma, seed)
        if trace:
            n, E = self.num_ops, max(self.num_edges, 1)
            ready, start, end = np.empty(n), np.empty(n), np.empty(n)
            tsrc, tdst = np.empty(E, np.int64), np.empty(E, np.int64)
            tstart, tend = np.empty(E), np.empty(E)
        else:
            ready, start, end, tsrc, tdst, tstart, tend = self._scratch()
        mk, ntr = _sim_kernel(
            self.succ_ptr, self.succ_idx, self.indeg, self.level, self.lvl_ptr, self.lvl_ops, self.comp,
            self.out_bytes, self.lat, self.bw, self.streams, dev, op_f, edge_f, mode == "bsp", contention,
            self.copies_in, key, ready, start, end, tsrc, tdst, tstart, tend, np.inf,
        )  # fmt: skip
        if ntr < 0:  # a device index out of range: let check_assignment word the error
            check_assignment(self.graph, dev, self.num_devices)
            raise AssignmentError("the assignment has a device index out of range")  # pragma: no cover
        if not trace:
            return SimResult(float(mk), None, mode)
        return self.result(dev, mode, float(mk), ready, start, end, tsrc[:ntr], tdst[:ntr], tstart[:ntr], tend[:ntr])

    def result(self, dev: np.ndarray, mode: str, makespan_s: float, op_ready: np.ndarray, op_start: np.ndarray,
               op_end: np.ndarray, tr_src_op: np.ndarray, tr_dst_device: np.ndarray, tr_start: np.ndarray,
               tr_end: np.ndarray) -> SimResult:  # fmt: skip
        """A traced :class:`SimResult` from per-op and per-transfer arrays (also used by the reference
        simulators of the tests, so that every implementation builds its trace the same way)."""
        tsrc = np.array(tr_src_op, dtype=np.int64)
        tr = Trace(
            op_device=dev.copy(),
            op_ready=op_ready,
            op_start=op_start,
            op_end=op_end,
            tr_src_op=tsrc,
            tr_src_device=dev[tsrc],
            tr_dst_device=np.array(tr_dst_device, dtype=np.int64),
            tr_bytes=self.out_bytes[tsrc],
            tr_start=np.array(tr_start, dtype=np.float64),
            tr_end=np.array(tr_end, dtype=np.float64),
            mode=mode,
        )
        return SimResult(makespan_s, tr, mode, tr.peak_memory_bytes(self.graph, self.num_devices))

    def simulate(
        self,
        assignment: "Assignment | Sequence[int] | np.ndarray",
        *,
        mode: str = "wc",
        trace: bool = False,
        noise_sigma: float = 0.0,
        seed: int = 0,
        link_contention: bool = False,
        dispatch: str = "fifo",
        priority: "np.ndarray | Sequence[float] | None" = None,
    ) -> SimResult:
        """Simulate ``assignment`` (device index per op).

        ``mode``: ``"wc"`` (work-conserving, the default) or ``"bsp"`` (a barrier per
        topological level). ``trace=True`` records per-op and per-transfer times.
        ``noise_sigma``/``seed``: seeded lognormal noise on every duration.
        ``link_contention``: one transfer at a time per ordered link.
        ``dispatch``: ``"fifo"`` (ready ops run in order of readiness, the default)
        or ``"priority"`` (WC only: ready ops run by ``priority``, one number per op,
        lower first, ties by op id; the op id when ``priority`` is None).
        Raises :class:`~doppler.assignment.AssignmentError` for a wrong-length or
        out-of-range assignment and :class:`SimulationError` for bad options.
        """
        if mode != "wc" or noise_sigma != 0.0 or seed != 0:
            mode, noise_sigma, seed = check_options(mode, noise_sigma, seed)
        key = None if dispatch == "fifo" and priority is None else self._dispatch_key(dispatch, priority, mode)
        return self._run(self._devices(assignment), mode, bool(trace), noise_sigma, seed, bool(link_contention), key)

    def makespan(self, devices: "np.ndarray | Assignment | Sequence[int]") -> float:
        """Fast path for hot loops: WC, no noise, no trace (same result as ``simulate(...).makespan_s``)."""
        return self._run(self._devices(devices), "wc", False, 0.0, 0, False).makespan_s

    def simulate_many(
        self,
        assignments: np.ndarray | Sequence[Sequence[int]],
        *,
        mode: str = "wc",
        noise_sigma: float = 0.0,
        seed: int = 0,
        link_contention: bool = False,
        dispatch: str = "fifo",
        priority: "np.ndarray | Sequence[float] | None" = None,
    ) -> np.ndarray:
        """Makespans of a batch ``assignments[B, num_ops]``: ``float64[B]``.

        Row ``b`` equals ``simulate(assignments[b], same options).makespan_s`` (with noise, every
        row uses the same ``seed``: common random numbers; with ``dispatch="priority"``, every row
        uses the same ``priority``)."""
        mode, sigma, seed = check_options(mode, noise_sigma, seed)
        key = self._dispatch_key(dispatch, priority, mode)
        devs = _check_batch(self.graph, assignments, self.num_devices)
        if devs.shape[0] == 0:
            return np.empty(0)
        op_f, edge_f = self.noise(sigma, seed)
        return _sim_many_kernel(*self.static_arrays(), devs, op_f, edge_f, mode == "bsp", bool(link_contention),
                                self.copies_in, key)  # fmt: skip

    def static_arrays(self) -> tuple[np.ndarray, ...]:
        """The batch kernel's leading arguments, in its order: the graph's and the cluster's arrays
        (the assignments, noise factors and options follow them)."""
        return (self.succ_ptr, self.succ_idx, self.indeg, self.level, self.lvl_ptr, self.lvl_ops, self.comp,
                self.out_bytes, self.lat, self.bw, self.streams)  # fmt: skip

    # ------------------------------------------------------------------ bounds
    def lower_bound(self) -> float:
        """See :func:`lower_bound`."""
        if self._lower_bound is None:
            tmin = self.comp.min(axis=1)
            cp = float(self.graph.critical_path_length(compute_s=tmin))
            self._lower_bound = max(cp, work_bound(self.graph, self.cluster))
        return self._lower_bound


def context(graph: DataflowGraph, cluster: "Cluster | str") -> SimContext:
    """A new :class:`SimContext` of (graph, cluster): hold it to simulate many assignments of one graph.
    ``cluster`` may also be a preset name (``"p100x4"``, ``"unit:8"``) or a cluster JSON path, as on
    the CLI."""
    if not isinstance(cluster, Cluster):
        from doppler.presets import cluster as resolve_cluster

        cluster = resolve_cluster(cluster)
    if not isinstance(graph, DataflowGraph):
        raise SimulationError(f"expected a DataflowGraph, got {type(graph).__name__}")
    return SimContext(graph, cluster)


def check_options(mode: str, noise_sigma: float, seed: int) -> tuple[str, float, int]:
    if mode not in MODES:
        raise SimulationError(f"unknown simulation mode {mode!r} (use one of: {', '.join(MODES)})")
    try:
        sigma = float(noise_sigma)
    except (TypeError, ValueError):
        raise SimulationError(f"noise_sigma must be a number >= 0, got {noise_sigma!r}") from None
    if not math.isfinite(sigma) or sigma < 0:
        raise SimulationError(f"noise_sigma must be a finite number >= 0, got {noise_sigma!r}")
    if sigma > MAX_NOISE_SIGMA:
        raise SimulationError(
            f"noise_sigma must be <= {MAX_NOISE_SIGMA:g}, got {noise_sigma!r}: at sigma {MAX_NOISE_SIGMA:g} the durations "
            f"at +2 and -2 standard deviations already differ {math.exp(4 * MAX_NOISE_SIGMA):.0f}x, and larger values overflow"
        )
    check_seed(seed, SimulationError)
    return mode, sigma, int(seed)


def check_dispatch(dispatch: str, mode: str, has_priority: bool = False) -> bool:
    """Validate ``dispatch`` (and that it fits ``mode`` and a given ``priority``); True for priority dispatch."""
    if dispatch not in DISPATCHES:
        raise SimulationError(f"unknown dispatch {dispatch!r} (use one of: {', '.join(DISPATCHES)})")
    if dispatch == "fifo":
        if has_priority:
            raise SimulationError('priority is only used with dispatch="priority" (got dispatch="fifo")')
        return False
    if mode != "wc":
        raise SimulationError(f'dispatch="priority" needs mode="wc" (got mode={mode!r})')
    return True


def _check_priority(priority: Any, num_ops: int) -> np.ndarray:
    """``priority`` as a contiguous float64 array, one number (not NaN) per op."""
    try:
        arr = np.asarray(priority)
    except (TypeError, ValueError):
        raise SimulationError("priority must be a 1-D sequence of numbers, one per op") from None
    if arr.dtype.kind not in "iuf":
        raise SimulationError(f"priority must hold numbers (one per op), got values of type {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != num_ops:
        raise SimulationError(f"priority must have one number per op ({num_ops}), got shape {arr.shape}")
    key = np.array(arr, dtype=np.float64, order="C")  # a private, writable copy: one kernel specialization
    bad = np.flatnonzero(np.isnan(key))
    if bad.size:
        raise SimulationError(f"priority of op {int(bad[0])} is NaN ({bad.size} NaN values in all)")
    return key


def _check_batch(graph: DataflowGraph, assignments: Any, num_devices: int) -> np.ndarray:
    arr = np.asarray(assignments)
    if arr.ndim != 2:
        raise AssignmentError(f"assignments must be a 2-D array [batch, num_ops], got shape {arr.shape}")
    if arr.shape[1] != graph.num_ops:
        raise AssignmentError(
            f"each assignment has {arr.shape[1]} entries but graph {graph.name!r} has {graph.num_ops} ops"
        )
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            b, i = (int(x) for x in np.argwhere(bad)[0])
            raise AssignmentError(f"assignment {b}: op {graph.op_label(i)} has a non-integer device {float(arr[b, i]):g}")
    elif arr.dtype.kind not in "iu" and arr.size:
        raise AssignmentError(f"assignments must hold device indices, got values of type {arr.dtype}")
    devs = np.ascontiguousarray(arr, dtype=np.int64)
    bad = (devs < 0) | (devs >= num_devices)
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise AssignmentError(
            f"assignment {b}: op {graph.op_label(i)} is assigned to device {int(devs[b, i])}, "
            f"but the cluster has devices 0..{num_devices - 1}"
        )
    return devs


# =========================================================================== public API
def simulate(graph: DataflowGraph, cluster: Cluster, assignment: "Assignment | Sequence[int] | np.ndarray",
             **options: Any) -> SimResult:  # fmt: skip
    """Simulate ``graph`` on ``cluster`` under ``assignment`` (device index per op):
    :meth:`SimContext.simulate`, with its options, on a context built for this call."""
    return context(graph, cluster).simulate(assignment, **options)


def traced(graph: DataflowGraph, cluster: Cluster, assignment: Assignment) -> SimResult:
    """The traced WC run of a method's ``assignment``: the method's own (:attr:`Assignment.simulation`)
    where it made one of these devices on this very graph and cluster, else a new one."""
    if assignment.simulation is not None:
        g, c, result = assignment.simulation
        if g is graph and c is cluster and np.array_equal(result.trace.op_device, assignment.devices):
            return result
    return simulate(graph, cluster, assignment, trace=True)


def simulate_many(graph: DataflowGraph, cluster: Cluster, assignments: np.ndarray | Sequence[Sequence[int]],
                  **options: Any) -> np.ndarray:  # fmt: skip
    """Makespans of a batch ``assignments[B, num_ops]``: :meth:`SimContext.simulate_many`, with its
    options, on a context built for this call."""
    return context(graph, cluster).simulate_many(assignments, **options)


def _dual_lp_beta(W: np.ndarray, c: np.ndarray) -> np.ndarray | None:
    """The dual LP's beta of :func:`work_bound` (scipy HiGHS), or None if the solver fails."""
    K, D = c.shape
    try:
        from scipy.optimize import linprog

        # variables: alpha[K] (free), beta[D] >= 0; maximise W.alpha
        # s.t. alpha_k - c[k, d] beta_d <= 0, sum beta = 1
        A = np.zeros((K * D, K + D))
        for k in range(K):
            A[k * D : (k + 1) * D, k] = 1.0
            A[k * D : (k + 1) * D, K:] = -np.diag(c[k])
        res = linprog(
            np.concatenate([-W, np.zeros(D)]),
            A_ub=A,
            b_ub=np.zeros(K * D),
            A_eq=np.concatenate([np.zeros(K), np.ones(D)])[None, :],
            b_eq=[1.0],
            bounds=[(None, None)] * K + [(0, None)] * D,
            method="highs",
        )
    except Exception:  # noqa: BLE001 - the proportional beta still gives a valid bound
        return None
    return np.asarray(res.x[K:]) if res.status == 0 else None


def work_bound(graph: DataflowGraph, cluster: Cluster) -> float:
    """Total-work lower bound on the makespan, valid with per-kind device rates.

    With ``W_k`` the FLOPs of kind ``k`` and ``c[k, d] = 1 / (rate[k, d] *
    streams[d])`` the seconds device ``d`` needs per FLOP of kind ``k`` (per
    unit of makespan), any schedule gives a feasible point of the LP
    ``min T  s.t.  sum_d y[k, d] = W_k,  sum_k c[k, d] y[k, d] <= T``. Its dual
    says that for every probability vector ``beta`` over devices,
    ``sum_k W_k * min_d beta_d c[k, d]`` is a lower bound. We take ``beta``
    from solving the dual LP (scipy HiGHS) and evaluate that closed form, so
    the bound is valid whatever the solver tolerance. When every device has
    one rate for all kinds present this is exactly ``total FLOPs / sum_d
    (rate_d * streams_d)``. (Naively dividing each op's FLOPs by the sum of
    the devices' rates *for its kind* is **not** a bound: two devices each
    fast at a different kind beat it.)
    """
    kinds = graph.kind.astype(np.int64)
    W = np.bincount(kinds, weights=graph.flops, minlength=len(cluster.throughput_matrix()))
    present = np.flatnonzero(W > 0)
    if present.size == 0:
        return 0.0
    W = W[present]
    cap = cluster.throughput_matrix()[present] * cluster.streams[None, :].astype(np.float64)  # [K, D]
    if np.all(cap == cap[0:1]):
        return float(W.sum() / cap[0].sum())
    c = 1.0 / cap
    betas = [cap.sum(axis=0) / cap.sum()]
    # Devices that differ by one speed factor for every kind (cap[k, d] = r_k * s_d, rank one): the
    # column-sum beta (proportional to s_d) is already the LP's optimum; skip the solver and scipy's import.
    if not np.allclose(cap[:, :1] * cap[:1, :], cap[:1, :1] * cap, rtol=1e-9, atol=0.0):
        beta = _dual_lp_beta(W, c)
        if beta is not None:
            betas.append(beta)
    best = 0.0
    for beta in betas:
        beta = np.clip(beta, 0.0, None)
        if beta.sum() <= 0:
            continue
        beta = beta / beta.sum()
        best = max(best, float((W * (beta[None, :] * c).min(axis=1)).sum()))
    return best


def lower_bound(graph: DataflowGraph, cluster: Cluster) -> float:
    """Seconds no assignment can beat (noise-free): the max of

    * the compute-only critical path, each op timed on its fastest device, and
    * the total-work bound :func:`work_bound` (total compute / total device
      speed, streams counted, done correctly for per-kind rates).

    Valid for WC and BSP, with or without link contention.
    """
    return context(graph, cluster).lower_bound()
