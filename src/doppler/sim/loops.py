"""The simulator's event loop, compiled with numba (``@jit(cache=True)``; numba starts on first use:
:mod:`doppler.util.jit`). The rules it implements are :mod:`doppler.sim`'s.

Every loop takes the static arrays of one (graph, cluster) as one tuple, ``arrays``
(:attr:`doppler.sim.SimContext.arrays`), in this order (see :data:`ARRAYS`):

* ``succ_ptr``, ``succ_idx`` (int64): the graph's successors, CSR;
* ``indeg``, ``level`` (int64[n]): in-degree and topological level of each op;
* ``lvl_ptr``, ``lvl_ops`` (int64): the ops by level, then op id (CSR over levels);
* ``comp`` (float64[n, D]): seconds of each op on each device;
* ``out_bytes`` (float64[n]): each op's output;
* ``lat``, ``bw`` (float64[D, D]): link latency (s) and bandwidth (B/s);
* ``streams`` (int64[D]), ``copies_in`` (bool[D]): the devices' streams, and whether each makes its
  inbound copies itself.

The rest of a call is per run: the assignment (``dev``, or ``devs`` rows), the noise factors
(``op_f`` per op, ``edge_f`` per successor slot), the mode (``bsp``, ``contention``) and the
dispatch key (None: FIFO). Methods that search (:mod:`doppler.methods`) compile these into
their own loops: :func:`sim_loop` for one traced run, :func:`sim_rows` for a batch's rows with
pruning.
"""

from __future__ import annotations

import numpy as np

from doppler.util.jit import jit

#: the order of the ``arrays`` tuple every loop takes first
ARRAYS = ("succ_ptr", "succ_idx", "indeg", "level", "lvl_ptr", "lvl_ops", "comp", "out_bytes", "lat", "bw", "streams",
          "copies_in")  # fmt: skip

#: relative margin of the annealer's pruning (sim_rows): far above float rounding, far below any real difference
PRUNE_SLACK = 1e-9


@jit(cache=True, inline="always")
def _precedes(t1, i1, t2, i2):  # pragma: no cover - compiled
    """Whether heap key (t1, i1) comes before (t2, i2): the earlier time, then the lower index."""
    return t1 < t2 or (t1 == t2 and i1 < i2)


@jit(cache=True, inline="always")
def _put(ht, hi, at, t, i):  # pragma: no cover - compiled
    """Store key (t, i) at slot ``at`` of the heap's arrays."""
    ht[at] = t
    hi[at] = i


@jit(cache=True, inline="always")
def _mark(dirty, dirty_list, count, d):  # pragma: no cover - compiled
    """Add ``d`` to the ``count`` entries of ``dirty_list`` unless ``dirty[d]`` says it is there; the new count."""
    if dirty[d]:
        return count
    dirty[d] = True
    dirty_list[count] = d
    return count + 1


@jit(cache=True)
def heap_push(ht, hi, base, size, t, i):  # pragma: no cover - compiled
    """Push key (t, i) into the binary min-heap stored in ht/hi[base : base + size]."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        if not _precedes(t, i, ht[base + parent], hi[base + parent]):
            break
        _put(ht, hi, base + pos, ht[base + parent], hi[base + parent])
        pos = parent
    _put(ht, hi, base + pos, t, i)
    return size + 1


@jit(cache=True)
def heap_pop(ht, hi, base, size):  # pragma: no cover - compiled
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
            if _precedes(rt, ri, ct, ci):
                c += 1
                ct = rt
                ci = ri
        if not _precedes(ct, ci, t, i):
            break
        _put(ht, hi, base + pos, ct, ci)
        pos = c
    _put(ht, hi, base + pos, t, i)
    return size


@jit(cache=True)
def sim_loop(
    arrays, dev, op_f, edge_f, bsp, contention, key, op_ready, op_start, op_end, tr_src, tr_dst, tr_start, tr_end,
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
    succ_ptr, succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, copies_in = arrays
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

    # ---- initial ready ops (time 0): level 0, the sources, in op id order (WC and BSP)
    for q in range(lvl_ptr[0], lvl_ptr[1]):
        v = lvl_ops[q]
        op_ready[v] = 0.0
        d = dev[v]
        rsize[d] = heap_push(rt, ri, rbase[d], rsize[d], 0.0 if key is None else key[v], v)
        nddirty = _mark(ddirty, ddirty_list, nddirty, d)

    makespan = 0.0
    t = 0.0
    while True:
        # ---------------- dispatch at time t: idle devices, then free links
        for q in range(nddirty):
            d = ddirty_list[q]
            ddirty[d] = False
            while running[d] < streams[d] and rsize[d] > 0:
                v = ri[rbase[d]]
                rsize[d] = heap_pop(rt, ri, rbase[d], rsize[d])
                running[d] += 1
                if v >= n:  # a copy into d, made by d
                    k = v - n
                    u = tr_src[k]
                    tr_start[k] = t
                    e = t + (lat[dev[u], d] + out_bytes[u] / bw[dev[u], d]) * edge_f[tr_slot[k]]
                    tr_end[k] = e
                    esize = heap_push(et, ei, 0, esize, e, ev_tr + k)
                    continue
                op_start[v] = t
                dur = comp[v, d] * op_f[v]
                e = t + dur
                op_end[v] = e
                esize = heap_push(et, ei, 0, esize, e, v)
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
                lsize[l] = heap_pop(lqt, lqi, lbase[l], lsize[l])
                lbusy[l] = True
                u = tr_src[k]
                a = dev[u]
                b = tr_dst[k]
                tr_start[k] = t
                e = t + (lat[a, b] + out_bytes[u] / bw[a, b]) * edge_f[tr_slot[k]]
                tr_end[k] = e
                esize = heap_push(et, ei, 0, esize, e, ev_tr + k)
        nldirty = 0

        if esize == 0:
            break
        # ---------------- process every event at the next timestamp
        t = et[0]
        while esize > 0 and et[0] == t:
            x = ei[0]
            esize = heap_pop(et, ei, 0, esize)
            u = -1  # producer whose op or transfer just finished (BSP accounting)
            if x < n:  # ---- op completion
                u = x
                d = dev[u]
                running[d] -= 1
                nddirty = _mark(ddirty, ddirty_list, nddirty, d)
                if t > makespan:
                    makespan = t
                # start transfers (contention: queue them on their link)
                for k in range(tr_ptr[u], tr_ptr[u + 1]):
                    b = tr_dst[k]
                    if copies_in[b]:  # key (request time, n + k): after ops ready at the same time
                        rsize[b] = heap_push(rt, ri, rbase[b], rsize[b], t, n + k)
                        nddirty = _mark(ddirty, ddirty_list, nddirty, b)
                    elif contention:
                        l = d * D + b
                        # key (request time, k): transfer ids grow with the producer id and a
                        # link carries at most one transfer per producer, so ties go by producer
                        lsize[l] = heap_push(lqt, lqi, lbase[l], lsize[l], t, k)
                        nldirty = _mark(ldirty, ldirty_list, nldirty, l)
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
                                rsize[dw] = heap_push(rt, ri, rbase[dw], rsize[dw], t if key is None else key[w], w)
                                nddirty = _mark(ddirty, ddirty_list, nddirty, dw)
                            else:
                                esize = heap_push(et, ei, 0, esize, rdy[w], n + w)
            elif x < ev_tr:  # ---- op becomes ready (its last input arrived)
                w = x - n
                op_ready[w] = t
                dw = dev[w]
                rsize[dw] = heap_push(rt, ri, rbase[dw], rsize[dw], t if key is None else key[w], w)
                nddirty = _mark(ddirty, ddirty_list, nddirty, dw)
            elif x < ev_rel:  # ---- transfer ends (contention mode, or a copy made by its destination)
                k = x - ev_tr
                u = tr_src[k]
                b = tr_dst[k]
                if copies_in[b]:
                    running[b] -= 1
                    nddirty = _mark(ddirty, ddirty_list, nddirty, b)
                else:
                    l = dev[u] * D + b
                    lbusy[l] = False
                    nldirty = _mark(ldirty, ldirty_list, nldirty, l)
                if not bsp:
                    for sl in range(succ_ptr[u], succ_ptr[u + 1]):
                        w = succ_idx[sl]
                        if dev[w] == b:
                            pending[w] -= 1
                            if pending[w] == 0:
                                op_ready[w] = t
                                rsize[b] = heap_push(rt, ri, rbase[b], rsize[b], t if key is None else key[w], w)
                                nddirty = _mark(ddirty, ddirty_list, nddirty, b)
            else:  # ---- BSP level released
                lv = x - ev_rel
                for q in range(lvl_ptr[lv], lvl_ptr[lv + 1]):
                    v = lvl_ops[q]
                    op_ready[v] = t
                    d2 = dev[v]
                    rsize[d2] = heap_push(rt, ri, rbase[d2], rsize[d2], t if key is None else key[v], v)
                    nddirty = _mark(ddirty, ddirty_list, nddirty, d2)
            if bsp and u >= 0:
                lv = level[u]
                outstanding[lv] -= 1
                if t > lvl_end[lv]:
                    lvl_end[lv] = t
                if outstanding[cur_level] == 0 and cur_level + 1 < nlev:
                    # every op and transfer of the level is done or has a known end time
                    cur_level += 1
                    esize = heap_push(et, ei, 0, esize, lvl_end[cur_level - 1], ev_rel + cur_level)
    return makespan, ntr


@jit(cache=True)
def sim_rows(
    arrays, devs, op_f, edge_f, bsp, contention, key, first, step, out, prune, cap, skip=None
):  # pragma: no cover - compiled
    """Makespans of rows ``first, first + step, ...`` of ``devs`` into ``out``, with one set of scratch arrays.

    With ``prune``, a row is abandoned as ``inf`` once it is sure to end later than ``cap`` or than
    the best of the rows before it here. So if the least makespan of these rows is at most ``cap``,
    it and the first row that reaches it are exact; if not, every row is ``inf`` or within float
    rounding of ``cap`` or above it. Only that is kept (the annealer's use: only its batch's best row
    matters, and only if its rule may accept it). A row ``skip`` (bool[B]) marks is not simulated:
    ``inf``."""
    B, n = devs.shape
    E = arrays[1].shape[0]  # succ_idx: one slot per edge
    op_ready = np.empty(n, np.float64)
    op_start = np.empty(n, np.float64)
    op_end = np.empty(n, np.float64)
    tr_src = np.empty(E, np.int64)
    tr_dst = np.empty(E, np.int64)
    tr_start = np.empty(E, np.float64)
    tr_end = np.empty(E, np.float64)
    best = np.inf
    for b in range(first, B, step):
        if skip is not None and skip[b]:
            out[b] = np.inf
            continue
        # PRUNE_SLACK: a bound within float rounding of the best must not cut a row that ties it
        prune_at = min(best, cap) * (1.0 + PRUNE_SLACK) if prune else np.inf
        mk, _ = sim_loop(arrays, devs[b], op_f, edge_f, bsp, contention, key, op_ready, op_start, op_end, tr_src,
                           tr_dst, tr_start, tr_end, prune_at)  # fmt: skip
        out[b] = mk
        if mk < best:
            best = mk


@jit(cache=True)
def sim_many(arrays, devs, op_f, edge_f, bsp, contention, key):  # pragma: no cover - compiled
    """Makespans of every row of ``devs``: ``float64[B]`` (:func:`sim_rows`, without pruning)."""
    out = np.empty(devs.shape[0], np.float64)
    sim_rows(arrays, devs, op_f, edge_f, bsp, contention, key, 0, 1, out, False, np.inf)
    return out
