"""The two list-scheduling rules, CRITICAL PATH's and HEFT's, and their completions of a partial schedule.

CRITICAL PATH (the imitation teacher, :mod:`doppler.methods.critical_path`): **SEL** takes the
candidate with the largest b-level (its :func:`~doppler.hardware.costs.priority_key`; ties: lowest op id,
:func:`largest_key_candidate`); **PLC** puts it on the device with the smallest estimated earliest
start (:func:`~doppler.listsched.state.est_into`; ties: lowest device id, where devices within a
relative :data:`TIE_RTOL` of the smallest count as tied, :func:`earliest_start_device`).

HEFT (:mod:`doppler.methods.heft`): ops in a given order (decreasing upward rank), each on the
device where it finishes first, starting in the earliest idle gap, no earlier than its data-ready
time, that is long enough for it (insertion, :func:`~doppler.listsched.state.earliest_gap`; ties:
lowest device id) (:func:`heft_place`).

A completion (:func:`critical_path_completion`, :func:`heft_completion`) puts one op on a given
device in a copy of a partial schedule and places every later op by the rule: the one-step
rollouts of :mod:`doppler.methods.lookahead` score these. The policy's rule decode
(:func:`doppler.policy.decode.rule_decode`) applies the same rules through :func:`tied` and
:func:`largest_key_candidate`.
"""

from __future__ import annotations

import numpy as np

from doppler.util.jit import jit
from doppler.listsched.state import earliest_gap, est_into, insert_interval, place, take_candidate
from doppler.listsched.ledger import hold, room_into

#: estimated starts (CRITICAL PATH) or finishes (HEFT's model in the policy) within this distance of the
#: best, relative to it, count as tied, so that rounding noise never decides a device
TIE_RTOL = 1e-9


@jit(cache=True, inline="always")
def tied(gap, best):  # pragma: no cover - compiled
    """Whether a time ``gap`` above the best time ``best`` ties with it (within :data:`TIE_RTOL`)."""
    return gap <= TIE_RTOL * abs(best)


@jit(cache=True)
def earliest_start_device(est, ties):  # pragma: no cover - compiled
    """CRITICAL PATH's PLC from ``est[D]``: marks in ``ties[D]`` the devices tied for the smallest and
    returns the lowest of them (0 if none: NaN times)."""
    best = est.min()
    first = -1
    for d in range(est.shape[0]):
        ties[d] = tied(abs(est[d] - best), best)
        if ties[d] and first < 0:
            first = d
    return max(first, 0)


@jit(cache=True)
def largest_key_candidate(key, cand, ncand):  # pragma: no cover - compiled
    """CRITICAL PATH's SEL: the candidate of ``cand[:ncand]`` with the largest ``key`` (ties: lowest op id)."""
    v = cand[0]
    for j in range(1, ncand):
        c = cand[j]
        if key[c] > key[v] or (key[c] == key[v] and c < v):
            v = c
    return v


@jit(cache=True)
def critical_path_completion(v, d, key, pred_ptr, pred_idx, pred_bytes, succ_ptr, succ_idx, comp, lat, inv, dev, start,
                             finish, free, assigned, indeg, cand, pos, ncand, out):  # pragma: no cover  # fmt: skip
    """From a copy of a CRITICAL PATH state (:func:`~doppler.listsched.state.empty_state`'s arrays): put
    candidate ``v`` on ``d``, place every later op by CRITICAL PATH's rule; the device per op into ``out``."""
    dev, start, finish, free = dev.copy(), start.copy(), finish.copy(), free.copy()
    assigned, indeg, cand, pos = assigned.copy(), indeg.copy(), cand.copy(), pos.copy()
    est = np.empty(free.shape[0])
    ties = np.empty(free.shape[0], np.bool_)
    est_into(v, pred_ptr, pred_idx, pred_bytes, lat, inv, dev, finish, free, est)
    place(v, d, est[d], comp, dev, start, finish, free, assigned)
    ncand = take_candidate(v, succ_ptr, succ_idx, indeg, cand, pos, ncand)
    while ncand > 0:
        w = largest_key_candidate(key, cand, ncand)
        est_into(w, pred_ptr, pred_idx, pred_bytes, lat, inv, dev, finish, free, est)
        e = earliest_start_device(est, ties)
        place(w, e, est[e], comp, dev, start, finish, free, assigned)
        ncand = take_candidate(w, succ_ptr, succ_idx, indeg, cand, pos, ncand)
    out[:] = dev


@jit(cache=True)
def heft_place(v, only, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt, ready,
               no_wait, room=None):  # pragma: no cover - compiled  # fmt: skip
    """Put op ``v`` where HEFT would: the device with the earliest finish in its earliest idle gap that
    fits (insertion), ties to the lowest id; ``only >= 0`` restricts the choice to that device, ``room``
    (bool[D]) to the devices it marks. Returns the busy-interval arrays ``(starts, ends)``, grown when a
    device's row is full."""
    nd = comp.shape[1]
    est_into(v, pred_ptr, pred_idx, pb, lat, inv, dev, finish, no_wait, ready)  # data-ready time per device
    best_f = np.inf
    best_s = 0.0
    best_d = 0
    best_pos = 0
    for d in range(nd):
        if (only >= 0 and d != only) or (room is not None and not room[d]):
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
def heft_list_schedule(order, pred_ptr, pred_idx, pb, comp, lat, inv):  # pragma: no cover - compiled
    """HEFT's schedule of the ops in ``order``: ``(device, start, finish)`` per op."""
    n, nd = comp.shape
    dev, start, finish, starts, ends, cnt, ready, no_wait = empty_schedule(n, nd)
    for h in range(n):
        starts, ends = heft_place(order[h], -1, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish,
                                  starts, ends, cnt, ready, no_wait)  # fmt: skip
    return dev, start, finish


@jit(cache=True)
def heft_list_schedule_within(order, pred_ptr, pred_idx, pb, comp, lat, inv, slice_ptr, slice_idx, slice_bytes,
                              out_bytes, held, used, cap, unheld):  # pragma: no cover - compiled  # fmt: skip
    """:func:`heft_list_schedule` where each op goes only to a device with room for it in the memory ledger
    (:mod:`doppler.listsched.ledger`, its arrays). Returns ``(device, start, finish, h)``: ``h`` the step
    whose op had room nowhere (the schedule stops there), else -1."""
    n, nd = comp.shape
    dev, start, finish, starts, ends, cnt, ready, no_wait = empty_schedule(n, nd)
    room = np.empty(nd, np.bool_)
    for h in range(n):
        v = order[h]
        room_into(v, slice_ptr, slice_idx, slice_bytes, out_bytes, held, used, cap, unheld, room)
        if not room.any():
            return dev, start, finish, h
        starts, ends = heft_place(v, -1, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends,
                                  cnt, ready, no_wait, room)  # fmt: skip
        hold(v, dev[v], slice_ptr, slice_idx, slice_bytes, held, used, unheld)
    return dev, start, finish, -1


@jit(cache=True)
def heft_completion(order, h, d, pred_ptr, pred_idx, pb, comp, lat, inv, dev, start, finish, starts, ends, cnt,
                    out):  # pragma: no cover - compiled  # fmt: skip
    """HEFT's completion of a partial schedule: from the state of ``order[:h]`` placed (``dev`` ...
    ``cnt``, as :func:`heft_place` leaves it; not changed here), op ``order[h]`` on device ``d``, every
    later op by HEFT's rule; the device per op into ``out``. Its own scratch rows, so completions can
    run side by side (``doppler.methods._rollout_loops``)."""
    n, nd = comp.shape
    b_starts, b_ends, b_cnt = starts.copy(), ends.copy(), cnt.copy()
    b_dev, b_start, b_finish = dev.copy(), start.copy(), finish.copy()
    ready = np.empty(nd)
    no_wait = np.zeros(nd)
    for k in range(h, n):
        b_starts, b_ends = heft_place(order[k], d if k == h else -1, pred_ptr, pred_idx, pb, comp, lat, inv,
                                      b_dev, b_start, b_finish, b_starts, b_ends, b_cnt, ready, no_wait)  # fmt: skip
    out[:] = b_dev
