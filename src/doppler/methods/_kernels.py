"""numba kernels of the list-scheduling baselines (imported lazily: numba is slow to import)."""

from __future__ import annotations

import numpy as np

from doppler._jit import jit
from doppler.listsched import earliest_gap, est_into, insert_interval


@jit(cache=True)
def heft_place(v, only, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt, ready,
               no_wait):  # pragma: no cover - compiled  # fmt: skip
    """Put op ``v`` where HEFT would: the device with the earliest finish in its earliest idle gap that
    fits (insertion), ties to the lowest id; ``only >= 0`` restricts the choice to that device.
    Returns the busy-interval arrays ``(starts, ends)``, grown when a device's row is full."""
    nd = comp.shape[1]
    est_into(v, pred_ptr, pred_idx, pb, lat, inv, dev, finish, no_wait, ready)  # data-ready time per device
    best_f = np.inf
    best_s = 0.0
    best_d = 0
    best_pos = 0
    for d in range(nd):
        if only >= 0 and d != only:
            continue
        t, j = earliest_gap(ready[d], comp[v, d], starts[d], ends[d], cnt[d])
        f = t + comp[v, d]
        if f < best_f:
            best_f = f
            best_s = t
            best_d = d
            best_pos = j
    d = best_d
    c = cnt[d]
    if c == starts.shape[1]:
        ns = np.empty((nd, 2 * c))
        ne = np.empty((nd, 2 * c))
        ns[:, :c] = starts[:, :c]
        ne[:, :c] = ends[:, :c]
        starts = ns
        ends = ne
    insert_interval(starts[d], ends[d], c, best_pos, best_s, best_f)
    cnt[d] = c + 1
    dev[v] = d
    start[v] = best_s
    finish[v] = best_f
    return starts, ends


@jit(cache=True)
def empty_schedule(n, nd):  # pragma: no cover - compiled
    """HEFT's state before any op is placed, in :func:`heft_place`'s order: device/start/finish per op,
    busy intervals per device (room for 16 each, grown as needed) and their counts, two scratch rows."""
    return (np.zeros(n, np.int64), np.zeros(n), np.zeros(n), np.empty((nd, 16)), np.empty((nd, 16)),
            np.zeros(nd, np.int64), np.zeros(nd), np.zeros(nd))  # fmt: skip


@jit(cache=True)
def heft_core(order, pred_ptr, pred_idx, pb, comp, lat, inv):  # pragma: no cover - compiled
    """HEFT's schedule of the ops in ``order``: ``(device, start, finish)`` per op."""
    n, nd = comp.shape
    dev, start, finish, starts, ends, cnt, ready, no_wait = empty_schedule(n, nd)
    for h in range(n):
        starts, ends = heft_place(order[h], -1, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish,
                                  starts, ends, cnt, ready, no_wait)  # fmt: skip
    return dev, start, finish


@jit(cache=True)
def heft_branch(order, h, d, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt,
                out):  # pragma: no cover - compiled  # fmt: skip
    """HEFT's completion of a partial schedule: from the state of ``order[:h]`` placed (``dev`` ...
    ``cnt``, as :func:`heft_place` leaves it; not changed here), op ``order[h]`` on device ``d``, every
    later op by HEFT's rule; the device per op into ``out``. Its own scratch rows, so completions can
    run side by side (``doppler.methods._rollout_kernels``)."""
    n, nd = comp.shape
    b_starts = starts.copy()
    b_ends = ends.copy()
    b_cnt = cnt.copy()
    b_dev = dev.copy()
    b_start = start.copy()
    b_finish = finish.copy()
    ready = np.empty(nd)
    no_wait = np.zeros(nd)
    for k in range(h, n):
        b_starts, b_ends = heft_place(order[k], d if k == h else -1, pred_ptr, pred_idx, pb, comp, lat, inv,
                                      b_dev, b_start, b_finish, b_starts, b_ends, b_cnt, ready, no_wait)  # fmt: skip
    out[:] = b_dev
