"""numba kernels of ANNEAL: its moves and its loop (imported lazily: numba is slow to import).

One compiled call runs many batches (propose, simulate, accept). With the loop in Python around
:func:`doppler.simulate.simulate_many`, half the time or more went to the loop itself; compiled,
the annealer scores 1.7-2.4x more assignments per second (``benchmarks/anneal_speed.py``).

numba's cache of this module is keyed on this file alone, and the loop compiles the simulator's
kernel into itself: after editing ``doppler/simulate.py``, clear the caches (``make clean``
removes them) or the annealer keeps the old simulator."""

from __future__ import annotations

import importlib
import math

import numba
import numpy as np

_simulate = importlib.import_module("doppler.simulate")  # the module (the package exports a function of that name)

_simulate._jit()  # the loop calls the simulator's kernel: compile (or load) it first

# walk counters (int64[5]) and values (float64[2]): the annealer's state between calls
EVALS, CYCLE_EVALS, ACCEPTED, IMPROVED, RESTARTS = range(5)
CUR_MS, BEST_MS = range(2)


@numba.njit(cache=True, inline="always")
def _other_device(rng, nd, d):  # pragma: no cover - compiled
    x = rng.integers(0, nd - 1)
    return x + (x >= d)


@numba.njit(cache=True)
def apply_move(a, rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, pref_cdf,
               guided_share):  # pragma: no cover - compiled  # fmt: skip
    """Mutate ``a`` in place with one random move (see :mod:`doppler.methods.anneal`); always changes
    something when there are two devices or more. ``pref_cdf[n, D]`` (cumulative rows; 0 rows: none)
    draws a ``guided_share`` of the moves from a learned device preference."""
    n = a.shape[0]
    if guided_share > 0.0 and rng.random() < guided_share:
        v = rng.integers(0, n)
        d = min(np.searchsorted(pref_cdf[v], rng.random() * pref_cdf[v, nd - 1], side="right"), nd - 1)
        a[v] = d if d != a[v] else _other_device(rng, nd, a[v])
        return
    r = rng.random()
    if r < 0.35:  # single op: to a random other device, or to a neighbour's
        v = rng.integers(0, n)
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
        a[v] = d
    elif r < 0.55:  # swap two ops' devices
        v = rng.integers(0, n)
        w = rng.integers(0, n)
        if a[v] == a[w]:
            a[v] = _other_device(rng, nd, a[v])
        else:
            a[v], a[w] = a[w], a[v]
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
        d = rng.integers(0, nd)
        same = True
        for i in range(m):
            same = same and a[seg[i]] == d
        if same:
            d = _other_device(rng, nd, d)
        for i in range(m):
            a[seg[i]] = d
    else:  # a logical op's tiles (or an op and its neighbours) to one device, or rotated
        ngroups = grp_ptr.shape[0] - 1
        if ngroups > 0:
            g = rng.integers(0, ngroups)
            lo, hi = grp_ptr[g], grp_ptr[g + 1]
            if rng.random() < 0.5:
                d = rng.integers(0, nd)
                same = True
                for i in range(lo, hi):
                    same = same and a[grp_ops[i]] == d
                if same:
                    d = _other_device(rng, nd, d)
                for i in range(lo, hi):
                    a[grp_ops[i]] = d
            else:
                shift = rng.integers(1, nd)
                for i in range(lo, hi):
                    a[grp_ops[i]] = (a[grp_ops[i]] + shift) % nd
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
            a[v] = d
            for i in range(pred_ptr[v], pred_ptr[v + 1]):
                a[pred_idx[i]] = d
            for i in range(succ_ptr[v], succ_ptr[v + 1]):
                a[succ_idx[i]] = d


@numba.njit(cache=True)
def anneal_batches(
    sim, cur, best, counts, values, max_batches, batch_size, max_evals, cycle_evals, t_start, log_ratio, optimal_ms,
    rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, pref_cdf, guided_share, threads,
):  # pragma: no cover - compiled
    """Up to ``max_batches`` iterations of the annealer on its state (``cur``, ``best``, ``counts``,
    ``values``, updated in place): propose ``batch_size`` neighbours of ``cur``, simulate them (on
    ``threads`` cores when more than one: the same numbers), offer the best to the Metropolis rule;
    restart from ``best`` after each cooling cycle. Stops early at ``max_evals`` (-1: none) or once
    ``best`` reaches ``optimal_ms``."""
    (s_succ_ptr, s_succ_idx, indeg, level, lvl_ptr, lvl_ops, comp, out_bytes, lat, bw, streams, op_f, edge_f,
     copies_in) = sim  # fmt: skip
    n = cur.shape[0]
    batch = np.empty((batch_size, n), np.int64)
    for _ in range(max_batches):
        if values[BEST_MS] <= optimal_ms:
            return
        b = batch_size
        if max_evals >= 0:
            b = min(b, max_evals - counts[EVALS])
            if b <= 0:
                return
        for i in range(b):
            batch[i] = cur
            apply_move(batch[i], rng, nd, succ_ptr, succ_idx, pred_ptr, pred_idx, grp_ptr, grp_ops, pref_cdf,
                       guided_share)  # fmt: skip
        devs = batch if b == batch_size else batch[:b].copy()
        if threads > 1:
            vals = _simulate._sim_many_par_kernel(s_succ_ptr, s_succ_idx, indeg, level, lvl_ptr, lvl_ops, comp,
                                                  out_bytes, lat, bw, streams, devs, op_f, edge_f, False, False,
                                                  copies_in, None, threads)  # fmt: skip
        else:
            vals = _simulate._sim_many_kernel(s_succ_ptr, s_succ_idx, indeg, level, lvl_ptr, lvl_ops, comp,
                                              out_bytes, lat, bw, streams, devs, op_f, edge_f, False, False,
                                              copies_in, None)  # fmt: skip
        counts[EVALS] += b
        counts[CYCLE_EVALS] += b
        j = np.argmin(vals)
        cand_ms = vals[j]
        temp = t_start * math.exp(log_ratio * min(1.0, counts[CYCLE_EVALS] / cycle_evals))
        u = rng.random()  # always drawn: one stream for every branch
        delta = (cand_ms - values[CUR_MS]) / max(values[CUR_MS], 1e-300)
        if delta <= 0 or u < math.exp(-delta / temp):
            cur[:] = batch[j]
            values[CUR_MS] = cand_ms
            counts[ACCEPTED] += 1
            if cand_ms < values[BEST_MS]:
                best[:] = batch[j]
                values[BEST_MS] = cand_ms
                counts[IMPROVED] += 1
        if counts[CYCLE_EVALS] >= cycle_evals:  # end of a cooling cycle: reheat from the best
            counts[CYCLE_EVALS] = 0
            counts[RESTARTS] += 1
            cur[:] = best
            values[CUR_MS] = values[BEST_MS]
