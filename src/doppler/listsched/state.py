"""The list-schedule state shared by the CRITICAL PATH teacher and the learned policy (the rules that
act on it: :mod:`doppler.listsched.rules`).

A list scheduler places ops one at a time; after each placement it knows, per
op, the device it went to and its estimated start and finish, and per device the
time it becomes free. From that state, the **estimated earliest start** of an op
``v`` on device ``d`` is::

    EST(v, d) = max(free[d], max_{u in pred(v)} finish[u] + xfer(u, dev[u] -> d))

with ``xfer = latency + bytes / bandwidth`` (0 on the same device) and no
insertion into idle gaps. Placing ``v`` on ``d`` sets ``start[v] = EST(v, d)``,
``finish[v] = start[v] + compute(v, d)`` and ``free[d] = finish[v]``.

:class:`PlacementState` holds ``B`` such states of one graph (one per episode)
as ``[B, ...]`` arrays and steps them together; every step costs
O(in-degree x devices) per state, never O(ops). The same compiled functions are
called per state from the policy's compiled rollout (:mod:`doppler.policy.rollout`),
so the teacher and the policy's dynamic features can never disagree.

The policy can also see HEFT's model instead (``list_schedule="heft"``, :data:`LIST_SCHEDULES`):
each device keeps its busy intervals, and ``EST(v, d)`` is the start of the earliest idle gap
on ``d``, no earlier than ``v``'s data-ready time, that is long enough for ``v``
(:func:`insertion_starts_into`); the rule then takes the earliest *finish*. Only the policy's
rollout keeps this state; :class:`PlacementState` is CRITICAL PATH's.

Dynamic device features of the op ``v`` being placed (docs/design.md, The method), one row per
device ``d`` (:data:`DEVICE_FEATURES`), all in seconds before normalisation:

0. ``assigned_compute``: compute already placed on ``d``;
1. ``input_compute``: compute of ``v``'s inputs that sit on ``d``;
2. ``input_first_start``: earliest start of ``v``'s inputs on ``d`` (0 if none);
3. ``input_last_finish``: latest finish of ``v``'s inputs on ``d`` (0 if none);
4. ``est``: EST(v, d);
5. ``est_gap``: EST(v, d) - min over devices of EST(v, ·);
6. ``input_comm``: summed mean transfer time of ``v``'s inputs that sit on ``d``
   (what placing ``v`` on ``d`` saves in communication);
7. ``assigned_gap``: ``assigned_compute`` - its minimum over devices (load imbalance);
8. ``compute``: the compute time of ``v`` on ``d`` (devices of different speeds);
9. ``eft_gap``: EST(v, d) + compute(v, d) - min over devices of the same (the finish-time
   gap, which tells fast from slow devices where the EST alone does not);
10. ``has_input``: 1 if some input of ``v`` sits on ``d``, else 0 (always last: a flag, not a time).
"""

from __future__ import annotations

import bisect

import numpy as np

from doppler.util.jit import jit
from doppler.hardware.costs import CostModel

DEVICE_FEATURES = (
    "assigned_compute",
    "input_compute",
    "input_first_start",
    "input_last_finish",
    "est",
    "est_gap",
    "input_comm",
    "assigned_gap",
    "compute",
    "eft_gap",
    "has_input",
)
NUM_DEVICE_FEATURES = len(DEVICE_FEATURES)

#: the list-schedule model PLC's device features come from, and its rule (the Stage I teacher):
#: ``critical_path``: ops append to their device, earliest start (``EST``); ``heft``: ops go into
#: the earliest idle gap that fits them (HEFT's insertion), earliest finish. The WC engine fills
#: idle gaps, so the second models it better.
LIST_SCHEDULES = ("critical_path", "heft")


@jit(cache=True)
def est_into(v, pred_ptr, pred_idx, pred_bytes, lat, inv, dev, finish, free, out):  # pragma: no cover - compiled
    """EST(v, d) for every device d into ``out[D]`` (one state: 1-D ``dev``/``finish``/``free``)."""
    nd = free.shape[0]
    for d in range(nd):
        out[d] = free[d]
    for k in range(pred_ptr[v], pred_ptr[v + 1]):
        p = pred_idx[k]
        dp = dev[p]
        fp = finish[p]
        b = pred_bytes[k]
        for d in range(nd):
            t = fp + lat[dp, d] + b * inv[dp, d]
            if t > out[d]:
                out[d] = t


def _gaps(values: list, plus: list | None = None) -> list:
    """Each of ``values`` (plus ``plus``) less their minimum: :func:`gaps_into`'s expressions on Python floats."""
    if plus is not None:
        values = [a + b for a, b in zip(values, plus)]
    least = min(values)
    return [a - least for a in values]


def _write_columns(out, assigned, est, comp_v, input_compute, first_start, last_finish, input_comm, has_input):
    """Fill ``out[D, F]`` from per-device Python lists, with the gap columns :func:`gaps_into` computes
    (the same expressions, so the same floats)."""
    out[:] = list(zip(assigned, input_compute, first_start, last_finish, est, _gaps(est), input_comm, _gaps(assigned),
                      comp_v, _gaps(est, comp_v), has_input))  # fmt: skip


def _feature_lists(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free, assigned):
    """:func:`features_into`'s per-device values on Python floats, as :func:`_write_columns`' arguments
    (each time is the same expression as the loop's; sums run in the same order, input by input)."""
    nd = free.shape[0]
    k0, k1 = int(pred_ptr[v]), int(pred_ptr[v + 1])
    est = free.tolist()
    input_compute, first_start, last_finish = [0.0] * nd, [np.inf] * nd, [0.0] * nd
    input_comm, has_input = [0.0] * nd, [0.0] * nd
    if k1 > k0:
        preds = pred_idx[k0:k1]
        pred_dev = dev[preds]
        lat_rows, inv_rows = lat.tolist(), inv.tolist()
        for dp, fp, sp, cp, b, pc in zip(pred_dev.tolist(), finish[preds].tolist(), start[preds].tolist(),
                                         comp[preds, pred_dev].tolist(), pred_bytes[k0:k1].tolist(),
                                         pred_comm[k0:k1].tolist()):  # fmt: skip
            input_compute[dp] += cp
            if sp < first_start[dp]:
                first_start[dp] = sp
            if fp > last_finish[dp]:
                last_finish[dp] = fp
            input_comm[dp] += pc
            has_input[dp] = 1.0
            for d, (la, iv) in enumerate(zip(lat_rows[dp], inv_rows[dp])):
                t = fp + la + b * iv
                if t > est[d]:
                    est[d] = t
    first_start = [0.0 if s == np.inf else s for s in first_start]
    return assigned.tolist(), est, comp[v].tolist(), input_compute, first_start, last_finish, input_comm, has_input


def _features_into_lists(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free, assigned,
                         out):  # fmt: skip
    """:func:`features_into` on Python floats (``doppler.util.jit.as_python``): the same values, bit for bit."""
    _write_columns(out, *_feature_lists(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish,
                                        free, assigned))  # fmt: skip


@jit(cache=True, python=_features_into_lists)
def features_into(
    v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free, assigned, out
):  # pragma: no cover - compiled
    """The device features of op ``v`` (module docstring) into ``out[D, F]``, unnormalised."""
    nd = free.shape[0]
    for d in range(nd):
        out[d, 0] = assigned[d]
        out[d, 1] = 0.0
        out[d, 2] = np.inf
        out[d, 3] = 0.0
        out[d, 4] = free[d]
        out[d, 6] = 0.0
        out[d, 8] = comp[v, d]
        out[d, 10] = 0.0
    for k in range(pred_ptr[v], pred_ptr[v + 1]):
        p = pred_idx[k]
        dp = dev[p]
        fp = finish[p]
        out[dp, 1] += comp[p, dp]
        if start[p] < out[dp, 2]:
            out[dp, 2] = start[p]
        if fp > out[dp, 3]:
            out[dp, 3] = fp
        out[dp, 6] += pred_comm[k]
        out[dp, 10] = 1.0
        b = pred_bytes[k]
        for d in range(nd):
            t = fp + lat[dp, d] + b * inv[dp, d]
            if t > out[d, 4]:
                out[d, 4] = t
    for d in range(nd):
        if out[d, 2] == np.inf:
            out[d, 2] = 0.0
    gaps_into(out)


@jit(cache=True)
def gaps_into(out):  # pragma: no cover - compiled
    """The gap features of ``out[D, F]`` (``est_gap``, ``assigned_gap``, ``eft_gap``) from its other columns."""
    nd = out.shape[0]
    best = np.inf
    least = np.inf
    best_eft = np.inf
    for d in range(nd):
        best = min(best, out[d, 4])
        least = min(least, out[d, 0])
        best_eft = min(best_eft, out[d, 4] + out[d, 8])
    for d in range(nd):
        out[d, 5] = out[d, 4] - best
        out[d, 7] = out[d, 0] - least
        out[d, 9] = out[d, 4] + out[d, 8] - best_eft


def _earliest_gap_lists(ready_s, length_s, starts, ends, count):
    """:func:`earliest_gap` on Python floats (``doppler.util.jit.as_python``): the same search and
    comparisons, without numpy's cost per element (a device whose intervals all end by the ready
    time needs neither)."""
    t, length_s = float(ready_s), float(length_s)
    if count == 0 or ends[count - 1] <= t:
        return t, count
    j = bisect.bisect_right(ends, t, 0, count)
    for s, e in zip(starts[j:count].tolist(), ends[j:count].tolist()):
        if t + length_s <= s:
            return t, j
        t = e if e > t else t  # max(t, e)
        j += 1
    return t, count


@jit(cache=True, python=_earliest_gap_lists)
def earliest_gap(ready_s, length_s, starts, ends, count):  # pragma: no cover - compiled
    """HEFT's insertion on one device whose busy intervals are ``starts[:count]`` / ``ends[:count]``
    (sorted, disjoint): ``(start, slot)`` of the earliest idle gap from ``ready_s`` on that is
    ``length_s`` long, and the index its interval goes to, keeping the intervals sorted."""
    lo, hi = 0, count
    while lo < hi:  # the first interval that ends after the ready time (ends are sorted)
        mid = (lo + hi) // 2
        if ends[mid] <= ready_s:
            lo = mid + 1
        else:
            hi = mid
    t = ready_s
    j = lo
    while j < count:
        if t + length_s <= starts[j]:
            break
        t = max(t, ends[j])
        j += 1
    return t, j


@jit(cache=True)
def insert_interval(starts, ends, count, slot, start_s, finish_s):  # pragma: no cover - compiled
    """Put ``[start_s, finish_s)`` at index ``slot`` of one device's ``count`` busy intervals."""
    for j in range(count, slot, -1):
        starts[j] = starts[j - 1]
        ends[j] = ends[j - 1]
    starts[slot] = start_s
    ends[slot] = finish_s


def _insertion_starts(ready, comp_v, busy_start, busy_end, busy_count) -> list:
    """Per device, the start of the earliest idle gap from ``ready[d]`` on that fits ``comp_v[d]``
    (:func:`insertion_starts_into`'s search, on Python floats)."""
    return [_earliest_gap_lists(t, need, busy_start[d], busy_end[d], count)[0]
            for d, (t, need, count) in enumerate(zip(ready, comp_v, busy_count.tolist()))]  # fmt: skip


def _insertion_starts_into_lists(v, comp, busy_start, busy_end, busy_count, out):
    """:func:`insertion_starts_into` on Python floats (``doppler.util.jit.as_python``): the same search
    per device, and only the columns it changes written back (``est`` and the gaps)."""
    rows = out.tolist()
    est = _insertion_starts([row[4] for row in rows], comp[v].tolist(), busy_start, busy_end, busy_count)
    out[:, 4] = est
    out[:, 5] = _gaps(est)
    out[:, 7] = _gaps([row[0] for row in rows])
    out[:, 9] = _gaps(est, [row[8] for row in rows])


@jit(cache=True, python=_insertion_starts_into_lists)
def insertion_starts_into(v, comp, busy_start, busy_end, busy_count, out):  # pragma: no cover - compiled
    """HEFT's insertion model. ``out[d, 4]`` holds op ``v``'s data-ready time on ``d`` (its features
    computed with ``free`` all 0); replace it with the start of the earliest idle gap on ``d``, from
    then on, that is long enough for ``v`` (:func:`earliest_gap`), then recompute the gaps."""
    for d in range(out.shape[0]):
        out[d, 4] = earliest_gap(out[d, 4], comp[v, d], busy_start[d], busy_end[d], busy_count[d])[0]
    gaps_into(out)


def _heft_features_into_lists(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free,
                              assigned, busy_start, busy_end, busy_count, out):  # fmt: skip
    """:func:`heft_features_into` on Python floats (``doppler.util.jit.as_python``): the insertion search on the
    data-ready times as computed, and ``out`` written once (bit for bit the loop's values)."""
    assigned_s, ready, comp_v, *rest = _feature_lists(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev,
                                                      start, finish, free, assigned)  # fmt: skip
    _write_columns(out, assigned_s, _insertion_starts(ready, comp_v, busy_start, busy_end, busy_count), comp_v, *rest)


@jit(cache=True, python=_heft_features_into_lists)
def heft_features_into(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free, assigned,
                       busy_start, busy_end, busy_count, out):  # pragma: no cover - compiled  # fmt: skip
    """The device features of op ``v`` under HEFT's model: :func:`features_into` with ``free`` (all 0: ops
    do not append to their device), then :func:`insertion_starts_into`."""
    features_into(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free, assigned, out)
    insertion_starts_into(v, comp, busy_start, busy_end, busy_count, out)


@jit(cache=True)
def insert_busy(d, start_s, finish_s, busy_start, busy_end, busy_count):  # pragma: no cover - compiled
    """Occupy ``[start_s, finish_s)`` on device ``d``: a gap :func:`insertion_starts_into` found; it goes
    where HEFT's scan puts it, so the busy intervals stay sorted (zero-length ops included)."""
    slot = earliest_gap(start_s, finish_s - start_s, busy_start[d], busy_end[d], busy_count[d])[1]
    insert_interval(busy_start[d], busy_end[d], busy_count[d], slot, start_s, finish_s)
    busy_count[d] += 1


@jit(cache=True)
def place(v, d, est_d, comp, dev, start, finish, free, assigned):  # pragma: no cover - compiled
    """Put op ``v`` on device ``d`` starting at ``est_d`` (one state)."""
    c = comp[v, d]
    dev[v] = d
    start[v] = est_d
    finish[v] = est_d + c
    free[d] = est_d + c
    assigned[d] += c


@jit(cache=True)
def _push(v, cand, pos, k):  # pragma: no cover - compiled
    cand[k] = v
    pos[v] = k
    return k + 1


@jit(cache=True)
def init_candidates(indeg, cand, pos):  # pragma: no cover - compiled
    """Fill the candidate set (``cand[:k]``, ``pos[v]`` = index or -1) with the ops of in-degree 0; returns k."""
    k = 0
    pos[:] = -1
    for v in range(indeg.shape[0]):
        if indeg[v] == 0:
            k = _push(v, cand, pos, k)
    return k


@jit(cache=True)
def take_candidate(v, succ_ptr, succ_idx, indeg, cand, pos, ncand):  # pragma: no cover - compiled
    """Remove placed candidate ``v`` and append the successors it frees (at ``cand[old size - 1:]``);
    returns the new size."""
    ncand -= 1
    _push(cand[ncand], cand, pos, pos[v])
    pos[v] = -1
    for s in range(succ_ptr[v], succ_ptr[v + 1]):
        w = succ_idx[s]
        indeg[w] -= 1
        if indeg[w] == 0:
            ncand = _push(w, cand, pos, ncand)
    return ncand


@jit(cache=True)
def empty_state(indeg0, nd):  # pragma: no cover - compiled
    """A fresh list-schedule state of one episode: ``(dev, start, finish, free, assigned, indeg, cand, pos,
    ncand)`` with nothing placed and the roots as candidates."""
    n = indeg0.shape[0]
    indeg = indeg0.copy()
    cand = np.empty(n, np.int64)
    pos = np.empty(n, np.int64)
    ncand = init_candidates(indeg, cand, pos)
    return np.full(n, -1, np.int64), np.zeros(n), np.zeros(n), np.zeros(nd), np.zeros(nd), indeg, cand, pos, ncand


@jit(cache=True)
def _est_batch(ops, pred_ptr, pred_idx, pred_bytes, lat, inv, dev, finish, free, out):  # pragma: no cover
    for b in range(ops.shape[0]):
        est_into(ops[b], pred_ptr, pred_idx, pred_bytes, lat, inv, dev[b], finish[b], free[b], out[b])


@jit(cache=True)
def _features_batch(
    ops, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free, assigned, out
):  # pragma: no cover
    for b in range(ops.shape[0]):
        features_into(
            ops[b], pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv,
            dev[b], start[b], finish[b], free[b], assigned[b], out[b],
        )  # fmt: skip


@jit(cache=True)
def _place_batch(ops, devs, est, comp, dev, start, finish, free, assigned):  # pragma: no cover
    for b in range(ops.shape[0]):
        place(ops[b], devs[b], est[b], comp, dev[b], start[b], finish[b], free[b], assigned[b])


def pred_comm_s(graph, costs: CostModel) -> np.ndarray:
    """Mean transfer time of each edge, in predecessor-CSR slot order (feature ``input_comm``)."""
    return np.ascontiguousarray(costs.mean_edge_comm_s()[graph.pred_eid], dtype=np.float64)


class PlacementState:
    """``B`` list-schedule states of one graph on one cluster, stepped in lock-step.

    Arrays (``[B, ...]``, updated in place): ``dev`` (device per op, -1 before
    placement), ``start_s``/``finish_s`` (estimated, per op), ``free_s`` (per
    device), ``assigned_compute_s`` (per device). Build from a
    :class:`~doppler.hardware.costs.CostModel`.
    """

    def __init__(self, graph, costs: CostModel, batch: int = 1) -> None:
        self.num_ops = n = graph.num_ops
        self.num_devices = nd = costs.num_devices
        self.batch = batch
        self.pred_ptr = np.ascontiguousarray(graph.pred_ptr, dtype=np.int64)
        self.pred_idx = np.ascontiguousarray(graph.pred_idx, dtype=np.int64)
        self.pred_bytes = np.ascontiguousarray(costs.pred_bytes(graph), dtype=np.float64)
        self.pred_comm_s = pred_comm_s(graph, costs)
        self.compute_s = np.ascontiguousarray(costs.compute_s, dtype=np.float64)
        self.latency_s = np.ascontiguousarray(costs.latency_s, dtype=np.float64)
        self.inv_bw = np.ascontiguousarray(costs.inv_bw, dtype=np.float64)
        self.dev = np.full((batch, n), -1, dtype=np.int64)
        self.start_s = np.zeros((batch, n))
        self.finish_s = np.zeros((batch, n))
        self.free_s = np.zeros((batch, nd))
        self.assigned_compute_s = np.zeros((batch, nd))

    def est(self, ops: np.ndarray) -> np.ndarray:
        """EST of ``ops[b]`` on every device in state ``b``: ``float64[B, D]``."""
        out = np.empty((self.batch, self.num_devices))
        _est_batch(
            np.ascontiguousarray(ops, dtype=np.int64), self.pred_ptr, self.pred_idx, self.pred_bytes,
            self.latency_s, self.inv_bw, self.dev, self.finish_s, self.free_s, out,
        )  # fmt: skip
        return out

    def features(self, ops: np.ndarray) -> np.ndarray:
        """Unnormalised device features of ``ops[b]`` in state ``b``: ``float64[B, D, F]``."""
        out = np.empty((self.batch, self.num_devices, NUM_DEVICE_FEATURES))
        _features_batch(
            np.ascontiguousarray(ops, dtype=np.int64), self.pred_ptr, self.pred_idx, self.pred_bytes,
            self.pred_comm_s, self.compute_s, self.latency_s, self.inv_bw, self.dev, self.start_s, self.finish_s,
            self.free_s, self.assigned_compute_s, out,
        )  # fmt: skip
        return out

    def place(self, ops: np.ndarray, devs: np.ndarray, est_s: np.ndarray) -> None:
        """Put ``ops[b]`` on ``devs[b]`` at time ``est_s[b]`` in every state ``b``."""
        _place_batch(
            np.ascontiguousarray(ops, dtype=np.int64), np.ascontiguousarray(devs, dtype=np.int64),
            np.ascontiguousarray(est_s, dtype=np.float64), self.compute_s, self.dev, self.start_s,
            self.finish_s, self.free_s, self.assigned_compute_s,
        )  # fmt: skip
