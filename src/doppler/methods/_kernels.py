"""numba kernels of the list-scheduling baselines (imported lazily: numba is slow to import)."""

from __future__ import annotations

import numpy as np

from doppler._jit import jit
from doppler.listsched import earliest_gap, est_into, insert_interval


@jit(cache=True)
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
            t, j = earliest_gap(ready[d], comp[v, d], starts[d], ends[d], cnt[d])
            f = t + comp[v, d]
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
        insert_interval(starts[d], ends[d], c, best_pos, best_s, best_f)
        cnt[d] = c + 1
        dev[v] = d
        start[v] = best_s
        finish[v] = best_f
    return dev, start, finish
