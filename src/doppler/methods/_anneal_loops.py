"""numba loops of ANNEAL: its moves and its walk (imported lazily: numba is slow to import).

One compiled call runs many batches (propose, simulate, accept), so the annealer's own loop
(moves, acceptance) costs little beside the simulations (``benchmarks/anneal_speed.py`` prints the
share; docs/research/anneal.md, "Speed").

numba's cache of this module is keyed on this file alone, and the loop compiles the simulator's
loop into itself: after editing ``doppler/sim/loops.py``, clear the caches (``make clean``
removes them) or the annealer keeps the old simulator."""

from __future__ import annotations

import math

import numba
import numpy as np

from doppler.util.jit import start
from doppler.sim.loops import sim_loop, sim_rows

start()  # the loop calls the simulator's loops: numba must have started (doppler.util.jit) before it compiles

# numba parallelises the loop over a batch's rows (``prange``) and nothing else. The prange is in this
# function itself: a cached function that calls a cached parallel one crashed when loaded from numba's
# cache in another process than the one that compiled it (numba 0.68, seen twice here).
PRANGE_ONLY = {"prange": True, "comprehension": False, "numpy": False, "reduction": False, "setitem": False,
               "stencil": False, "fusion": False, "inplace_binop": False}  # fmt: skip

# walk counters (int64[8]) and values (float64[2]): the annealer's state between calls (with the
# critical chain of the current assignment: its length, batches since it was found, whether it is stale)
EVALS, CYCLE_EVALS, ACCEPTED, IMPROVED, RESTARTS, NCRIT, SINCE, STALE = range(8)
NUM_COUNTS = 8
CUR_MS, BEST_MS = range(2)


@numba.njit(cache=True, inline="always")
def _other_device(rng, nd, d):  # pragma: no cover - compiled
    x = rng.integers(0, nd - 1)
    return x + (x >= d)


@numba.njit(cache=True, inline="always")
def _put(a, v, d, log):  # pragma: no cover - compiled
    """``a[v] = d``, and unless ``log`` is empty, (v, its old device) appended to it (``log[0]``: the count).
    Unchecked: the caller sizes ``log`` for the largest move (:func:`anneal_batches`)."""
    if log.shape[0] > 0:
        k = log[0]
        log[1 + 2 * k] = v
        log[2 + 2 * k] = a[v]
        log[0] = k + 1
    a[v] = d


@numba.njit(cache=True)
def move_op(a, v, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, log):  # pragma: no cover - compiled
    """Op ``v`` to the device of one of its neighbours (half the time, when that is another device) or
    to a random other device."""
    p0, p1, s0, s1 = pred_ptr[v], pred_ptr[v + 1], succ_ptr[v], succ_ptr[v + 1]
    nnb = (p1 - p0) + (s1 - s0)
    if nnb > 0 and rng.random() < 0.5:
        k = rng.integers(0, nnb)
        w = pred_idx[p0 + k] if k < p1 - p0 else succ_idx[s0 + k - (p1 - p0)]
        d = a[w]
        if d == a[v]:
            d = _other_device(rng, nd, a[v])
    else:
        d = _other_device(rng, nd, a[v])
    _put(a, v, d, log)


@numba.njit(cache=True)
def _to_one_device(a, ops, lo, hi, rng, nd, log):  # pragma: no cover - compiled
    """Ops ``ops[lo:hi]`` to one random device (another one where they all are on it already)."""
    d = rng.integers(0, nd)
    same = True
    for i in range(lo, hi):
        same = same and a[ops[i]] == d
    if same:
        d = _other_device(rng, nd, d)
    for i in range(lo, hi):
        _put(a, ops[i], d, log)


@numba.njit(cache=True)
def apply_move(a, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, log):  # pragma: no cover - compiled
    """Mutate ``a`` in place with one random move (see :mod:`doppler.methods.anneal`); always changes
    something when there are two devices or more. Every write is logged in ``log`` (see :func:`_put`;
    empty: none)."""
    n = a.shape[0]
    r = rng.random()
    if r < 0.35:  # single op: to a random other device, or to a neighbour's
        move_op(a, rng.integers(0, n), rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, log)
    elif r < 0.55:  # swap two ops' devices
        v = rng.integers(0, n)
        w = rng.integers(0, n)
        if a[v] == a[w]:
            _put(a, v, _other_device(rng, nd, a[v]), log)
        else:
            dv = a[v]
            _put(a, v, a[w], log)
            _put(a, w, dv, log)
    elif r < 0.8:  # chain: a random walk along successors moves to one device
        v = rng.integers(0, n)
        length = rng.integers(2, 17)
        seg = np.empty(length, np.int64)
        seg[0] = v
        m = 1
        for _ in range(length - 1):
            lo, hi = succ_ptr[v], succ_ptr[v + 1]
            if hi == lo:
                break
            v = succ_idx[lo + rng.integers(0, hi - lo)]
            seg[m] = v
            m += 1
        _to_one_device(a, seg, 0, m, rng, nd, log)
    else:  # a logical op's tiles (or an op and its neighbours) to one device, or rotated
        ngroups = grp_ptr.shape[0] - 1
        if ngroups > 0:
            g = rng.integers(0, ngroups)
            lo, hi = grp_ptr[g], grp_ptr[g + 1]
            if rng.random() < 0.5:
                _to_one_device(a, grp_ops, lo, hi, rng, nd, log)
            else:
                shift = rng.integers(1, nd)
                for i in range(lo, hi):
                    _put(a, grp_ops[i], (a[grp_ops[i]] + shift) % nd, log)
        else:
            v = rng.integers(0, n)
            d = rng.integers(0, nd)
            same = a[v] == d
            for i in range(pred_ptr[v], pred_ptr[v + 1]):
                same = same and a[pred_idx[i]] == d
            for i in range(succ_ptr[v], succ_ptr[v + 1]):
                same = same and a[succ_idx[i]] == d
            if same:
                d = _other_device(rng, nd, d)
            _put(a, v, d, log)
            for i in range(pred_ptr[v], pred_ptr[v + 1]):
                _put(a, pred_idx[i], d, log)
            for i in range(succ_ptr[v], succ_ptr[v + 1]):
                _put(a, succ_idx[i], d, log)


@numba.njit(cache=True)
def tie_move(a, log, tie_of, tie_ptr, tie_ops):  # pragma: no cover - compiled
    """Extend the move just applied to ``a`` (its writes in ``log``, see :func:`_put`) to the ops tied to
    the ones it wrote: every op of a written op's tie class (``tie_of[v]``, -1: none; class ``c``'s ops
    ``tie_ops[tie_ptr[c]:tie_ptr[c + 1]]``) joins that op's device, logged. Where the move wrote two ops of
    one class, the class takes the device of the first written. A tied ``a`` stays tied."""
    m = log[0]
    for k in range(m):
        v = log[1 + 2 * k]
        c = tie_of[v]
        if c < 0:
            continue
        d = a[v]
        for i in range(tie_ptr[c], tie_ptr[c + 1]):
            w = tie_ops[i]
            if a[w] != d:
                _put(a, w, d, log)


@numba.njit(cache=True)
def critical_chain(dev, op_ready, op_start, op_end, pred_ptr, pred_idx, tr_src, tr_dst, tr_end, ntr, nd,
                   out):  # pragma: no cover - compiled  # fmt: skip
    """The ops of one critical chain of a simulated schedule, last op first, into ``out``; returns
    their count. From the op that ends last, step to what held it back: the op before it on its
    device when it waited for the device, else the input that arrived last (the producer, whether its
    data came by a transfer or on the device).

    The same walk as :meth:`doppler.sim.trace.Trace.critical_path` (reports, Gantt outlines), compiled so
    that the annealer's loop can call it; that one stays the reference. Only tie-breaking differs
    (here: the last op to end starts the walk, the first of equal inputs in predecessor order wins;
    WC only, no inbound copies): on 120 random cases of four graphs and three clusters the two
    chains were equal in 105."""
    n = dev.shape[0]
    by_end = np.argsort(op_end, kind="mergesort")
    cnt = np.zeros(nd + 1, np.int64)
    for v in range(n):
        cnt[dev[v] + 1] += 1
    ptr = np.cumsum(cnt)
    fill = ptr[:-1].copy()
    dev_ops = np.empty(n, np.int64)  # each device's ops, in order of end time
    dev_end = np.empty(n, np.float64)
    for i in range(n):
        v = by_end[i]
        dev_ops[fill[dev[v]]] = v
        dev_end[fill[dev[v]]] = op_end[v]
        fill[dev[v]] += 1
    srcs = tr_src[:ntr]
    v = by_end[n - 1]
    m = 0
    while m < n:
        out[m] = v
        m += 1
        d = dev[v]
        if op_start[v] > op_ready[v]:  # it waited for its device: the op that freed it
            j = np.searchsorted(dev_end[ptr[d]:ptr[d + 1]], op_start[v], side="right") - 1
            while j >= 0 and dev_ops[ptr[d] + j] == v:
                j -= 1
            if j < 0:
                break
            v = dev_ops[ptr[d] + j]
            continue
        best_u, best_t = -1, -1.0
        for p in range(pred_ptr[v], pred_ptr[v + 1]):
            u = pred_idx[p]
            t = op_end[u]
            if dev[u] != d:
                k = np.searchsorted(srcs, u)
                while k < ntr and srcs[k] == u:
                    if tr_dst[k] == d:
                        t = tr_end[k]
                        break
                    k += 1
            if t > best_t:
                best_u, best_t = u, t
        if best_u < 0:
            break
        v = best_u
    return m


@numba.njit(cache=True)
def critical_move(a, crit, ncrit, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx,
                  log):  # pragma: no cover - compiled  # fmt: skip
    """A move on the critical chain ``crit[:ncrit]`` (see :func:`critical_chain`): one of its steps
    ``w -> v`` at random. Across two devices (a transfer on the chain), one of the two joins the
    other's device; on one device (``v`` waited for ``w`` or for the device), one of the two leaves
    for a random other device. A chain of one op: that op moves (:func:`move_op`)."""
    if ncrit < 2:
        move_op(a, crit[0], rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, log)
        return
    i = rng.integers(0, ncrit - 1)
    v, w = crit[i], crit[i + 1]
    if a[v] != a[w]:
        if rng.random() < 0.5:
            _put(a, v, a[w], log)
        else:
            _put(a, w, a[v], log)
    else:
        x = v if rng.random() < 0.5 else w
        _put(a, x, _other_device(rng, nd, a[x]), log)


@numba.njit(cache=True)
def draw_move(a, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, crit, ncrit, critical_share,
              log):  # pragma: no cover - compiled  # fmt: skip
    """One of the annealer's moves on ``a``, in place: a :func:`critical_move` with probability
    ``critical_share``, else an :func:`apply_move`; returns whether it was a critical one."""
    is_crit = critical_share > 0.0 and rng.random() < critical_share
    if is_crit:
        critical_move(a, crit, ncrit, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, log)
    else:
        apply_move(a, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, log)
    return is_crit


@numba.njit(cache=True)
def time_added(a, log, stamp, tag, old_dev, comp, out_bytes, lat, bw, pred_ptr, pred_idx, succ_ptr, succ_idx,
               cur_ms):  # pragma: no cover - compiled  # fmt: skip
    """The score of the move just applied to ``a`` (its writes in ``log``, see :func:`_put`): the compute
    time it adds plus the transfer time it adds on the edges of the moved ops (latency + bytes / bandwidth
    per edge that crosses devices: an output sent to several consumers on one device counts once per
    consumer, where the simulator may send it once), each over ``cur_ms``, the makespan before the move;
    less is better. ``stamp``/``old_dev``: scratch of length n, every ``stamp`` below ``tag`` on entry
    (this call marks ``tag`` and ``tag + 1``)."""
    for k in range(log[0]):  # the first write of an op holds its device before the move
        v = log[1 + 2 * k]
        if stamp[v] != tag:
            stamp[v] = tag
            old_dev[v] = log[2 + 2 * k]
    dcomp = dcomm = 0.0
    for k in range(log[0]):
        v = log[1 + 2 * k]
        if stamp[v] != tag:  # counted already (an op written twice)
            continue
        stamp[v] = tag + 1  # counted: its old device stays in old_dev
        d0, d1 = old_dev[v], a[v]
        if d0 == d1:
            continue
        dcomp += comp[v, d1] - comp[v, d0]
        for p in range(pred_ptr[v], pred_ptr[v + 1]):  # edges into v: both ends' devices before and after
            u = pred_idx[p]
            u0 = old_dev[u] if stamp[u] >= tag else a[u]
            dcomm += _edge_s(a[u], d1, u, out_bytes, lat, bw) - _edge_s(u0, d0, u, out_bytes, lat, bw)
        for p in range(succ_ptr[v], succ_ptr[v + 1]):  # edges out of v to ops that did not move (the rest: above)
            w = succ_idx[p]
            if stamp[w] >= tag and old_dev[w] != a[w]:
                continue
            dcomm += _edge_s(d1, a[w], v, out_bytes, lat, bw) - _edge_s(d0, a[w], v, out_bytes, lat, bw)
    return dcomp / cur_ms + dcomm / cur_ms


@numba.njit(cache=True, inline="always")
def _edge_s(d0, d1, u, out_bytes, lat, bw):  # pragma: no cover - compiled
    """Time of ``u``'s output from device ``d0`` to ``d1`` (0 on one device)."""
    if d0 == d1:
        return 0.0
    return lat[d0, d1] + out_bytes[u] / bw[d0, d1]


@numba.njit(cache=True)
def scored_proposal(cur, row, pool, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, crit, ncrit,
                    critical_share, log, best_log, stamp, tag, old_dev, comp, out_bytes, lat, bw,
                    cur_ms, ties):  # pragma: no cover - compiled  # fmt: skip
    """Into ``row``: of ``pool`` moves of ``cur``, each drawn as the annealer draws one (a critical-chain
    move with probability ``critical_share``), the one that adds the least time (:func:`time_added`).
    The moves are applied to ``cur`` and undone (``cur`` is unchanged after); the first is kept unless a
    later one adds less (so a score of NaN still gives a move). Returns the next free ``tag`` (every
    ``stamp`` below it; see :func:`time_added`). ``ties``: (``tie_of``, ``tie_ptr``, ``tie_ops``) of
    :func:`tie_move`, each move extended to the ops tied to those it moves (an empty ``tie_of``: no ties)."""
    tie_of, tie_ptr, tie_ops = ties
    best_s = -np.inf
    best_log[0] = 0
    for k in range(pool):
        log[0] = 0
        draw_move(cur, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, crit, ncrit, critical_share,
                  log)  # fmt: skip
        if tie_of.shape[0] > 0:
            tie_move(cur, log, tie_of, tie_ptr, tie_ops)
        s = -time_added(cur, log, stamp, tag, old_dev, comp, out_bytes, lat, bw, pred_ptr, pred_idx, succ_ptr,
                        succ_idx, cur_ms)  # fmt: skip
        tag += 2
        if k == 0 or s > best_s:  # keep the move as (op, new device) pairs
            best_s = s
            best_log[0] = log[0]
            for j in range(log[0]):
                best_log[1 + 2 * j] = log[1 + 2 * j]
                best_log[2 + 2 * j] = cur[log[1 + 2 * j]]
        for j in range(log[0] - 1, -1, -1):  # undo, last write first
            cur[log[1 + 2 * j]] = log[2 + 2 * j]
    row[:] = cur
    for j in range(best_log[0]):
        row[best_log[1 + 2 * j]] = best_log[2 + 2 * j]
    return tag


@numba.njit(cache=True)
def over_caps(a, mem, mark, gen, used):  # pragma: no cover - compiled
    """Whether assignment ``a`` holds more weight bytes on some device than its cap. ``mem``: the weight
    slices each op reads (CSR ``slice_ptr``, ``slice_idx``), their bytes and the caps per device;
    ``mark`` (int64[S * D]) and ``used`` (float64[D]): scratch, ``mark`` below ``gen`` on entry."""
    slice_ptr, slice_idx, slice_bytes, caps = mem
    nd = caps.shape[0]
    used[:] = 0.0
    for v in range(a.shape[0]):
        d = a[v]
        for k in range(slice_ptr[v], slice_ptr[v + 1]):
            i = slice_idx[k] * nd + d
            if mark[i] != gen:
                mark[i] = gen
                used[d] += slice_bytes[slice_idx[k]]
    for d in range(nd):
        if used[d] > caps[d]:
            return True
    return False


@numba.njit(cache=True, parallel=PRANGE_ONLY)
def anneal_batches(
    sim, cur, best, crit, counts, values, max_batches, batch_size, max_evals, cycle_evals, t_start, log_ratio,
    optimal_ms, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, threads, critical_share,
    critical_refresh, prune, pool, mem, ties,
):  # pragma: no cover - compiled
    """Up to ``max_batches`` batches of the annealer (:mod:`doppler.methods.anneal`) on its state (``cur``,
    ``best``, ``crit``: the critical chain of ``cur``, ``counts``, ``values``; updated in place), simulated
    on ``threads`` cores (the same numbers). Stops early at ``max_evals`` (-1: none) or once ``best`` reaches
    ``optimal_ms``. ``critical_share``, ``critical_refresh``, ``prune`` (:func:`~doppler.sim.loops.sim_rows`)
    and ``pool`` (:func:`scored_proposal`): as there. ``mem``: a proposal that holds more weight bytes on a
    device than its cap (:func:`over_caps`; no caps: an empty ``caps`` array) is not simulated and never
    accepted. ``ties`` (:func:`scored_proposal`): every move extended to the ops tied to those it moves (a
    tied search: ``cur`` must be tied on entry; an empty ``tie_of``: none). ``sim``: the simulator's arrays
    (:attr:`~doppler.sim.SimContext.arrays`) and noise factors."""
    arrays, op_f, edge_f = sim
    (s_succ_ptr, s_succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, copies_in) = arrays
    n = cur.shape[0]
    batch = np.empty((batch_size, n), np.int64)
    E = max(s_succ_idx.shape[0], 1)
    ready, start, end = np.empty(n), np.empty(n), np.empty(n)
    tsrc, tdst, tstart, tend = np.empty(E, np.int64), np.empty(E, np.int64), np.empty(E), np.empty(E)
    no_log = np.empty(0, np.int64)
    nlog = 2 * (2 * n + E) + 1  # room for 2n + E writes: a move writes distinct ops (at most n), its ties n more
    log, best_log = np.empty(nlog, np.int64), np.empty(nlog, np.int64)
    stamp, old_dev = np.zeros(n, np.int64), np.empty(n, np.int64)
    tag = 1
    limited = mem[3].shape[0] > 0
    mark = np.zeros(mem[2].shape[0] * nd if limited else 0, np.int64)
    used = np.zeros(nd)
    gen = 0
    skip = np.zeros(batch_size, np.bool_)
    for _ in range(max_batches):
        if values[BEST_MS] <= optimal_ms:
            return
        b = batch_size
        if max_evals >= 0:
            b = min(b, max_evals - counts[EVALS])
            if b <= 0:
                return
        counts[SINCE] += 1
        if critical_share > 0.0 and counts[STALE] and (counts[SINCE] >= critical_refresh or counts[NCRIT] == 0):
            _, ntr = sim_loop(arrays, cur, op_f, edge_f, False, False, None, ready, start, end, tsrc, tdst, tstart,
                                tend, np.inf)  # fmt: skip
            counts[NCRIT] = critical_chain(cur, ready, start, end, pred_ptr, pred_idx, tsrc, tdst, tend, ntr, nd, crit)
            counts[SINCE] = 0
            counts[STALE] = 0
        for i in range(b):
            if pool > 1 or ties[0].shape[0] > 0:
                tag = scored_proposal(cur, batch[i], pool, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr,
                                      grp_ops, crit, counts[NCRIT], critical_share, log, best_log, stamp, tag, old_dev,
                                      comp, out_bytes, lat, bw, max(values[CUR_MS], 1e-300), ties)  # fmt: skip
                continue
            batch[i] = cur
            draw_move(batch[i], rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, crit, counts[NCRIT],
                      critical_share, no_log)  # fmt: skip
        devs = batch if b == batch_size else batch[:b].copy()
        for i in range(b):
            gen += 1
            skip[i] = limited and over_caps(devs[i], mem, mark, gen, used)
        counts[EVALS] += b
        counts[CYCLE_EVALS] += b
        temp = t_start * math.exp(log_ratio * min(1.0, counts[CYCLE_EVALS] / cycle_evals))
        u = rng.random()  # always drawn, and before the simulations use no randomness: one stream for every branch
        cur_ms = max(values[CUR_MS], 1e-300)
        # the Metropolis rule below accepts the batch's best only at or under this makespan, so a proposal
        # sure to end above it may stop early (with ``prune``), like one sure to lose to an earlier row
        accept_below = cur_ms * (1.0 - temp * math.log(u)) if u > 0.0 else np.inf
        vals = np.empty(b, np.float64)
        chunks = min(threads, b)
        for t in numba.prange(chunks):  # thread t simulates rows t, t + chunks, ...: the serial numbers
            sim_rows(arrays, devs, op_f, edge_f, False, False, None, t, chunks, vals, prune, accept_below, skip)
        j = np.argmin(vals)
        cand_ms = vals[j]
        delta = (cand_ms - values[CUR_MS]) / cur_ms
        if delta <= 0 or u < math.exp(-delta / temp):
            cur[:] = batch[j]
            values[CUR_MS] = cand_ms
            counts[ACCEPTED] += 1
            counts[STALE] = 1
            if cand_ms < values[BEST_MS]:
                best[:] = batch[j]
                values[BEST_MS] = cand_ms
                counts[IMPROVED] += 1
        if counts[CYCLE_EVALS] >= cycle_evals:  # end of a cooling cycle: reheat from the best
            counts[CYCLE_EVALS] = 0
            counts[RESTARTS] += 1
            cur[:] = best
            values[CUR_MS] = values[BEST_MS]
            counts[STALE] = 1
