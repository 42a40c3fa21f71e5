"""numba kernels of the list-scheduling baselines (imported lazily: numba is slow to import)."""

from __future__ import annotations

import numba
import numpy as np

from doppler.listsched import est_into


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
    no_wait = np.zeros(nd)
    best_pos = 0
    for h in range(n):
        v = order[h]
        est_into(v, pred_ptr, pred_idx, pb, lat, inv, dev, finish, no_wait, ready)  # data-ready time per device
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
