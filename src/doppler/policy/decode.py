"""Decoding ASSIGN(SEL, PLC) episodes of one graph: the compiled rollout loop, without torch.

A rollout has |V| sequential steps, but the policy's encoder and every op-dependent head input
are computed once per batch. What is left per step (a masked softmax over the candidates, the
device features from the shared list-schedule state, a ``[D, F] x [F, M]`` product, the state
update) is a few hundred flops, so the whole |V|-step loop for all B episodes runs as one
compiled call (:func:`_rollout_loop`) on plain arrays (the heads, :func:`run_heads`), recording
the actions, the device features each PLC decision saw, and when each op became a candidate.

The loops can also run as Python, with numpy twins of their hot loops, which is faster than
starting numba for one greedy decode (:mod:`doppler.util.jit`; ``doppler assign --method doppler``).

This module imports no torch: the heads may come from the torch policy
(:func:`doppler.policy.rollout.rollout`) or from its numpy twin (:mod:`doppler.policy.infer`),
which places a graph with the shipped policy without paying torch's import.

Decode modes: ``sample`` (softmax, with epsilon-greedy exploration: with
probability ``eps`` a uniform choice), ``greedy`` (arg-max; ties: lowest op id /
device id) and ``teacher`` (replay given op orders and devices, to score them).
All randomness comes from one numpy ``Generator`` (uniforms drawn up front), so
a rollout is reproducible from the generator's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler.util.jit import jit
from doppler.listsched import (
    LIST_SCHEDULES, NUM_DEVICE_FEATURES, empty_state, features_into, heft_features_into, insert_busy,
    largest_key_candidate, place, take_candidate, tied,
)  # fmt: skip
from doppler.listsched.ledger import hold, room_into
from doppler.ir.slices import input_slices
from doppler.policy import LEAK
from doppler.policy.features import GraphFeatures, normalise_device_features

MODES = ("sample", "greedy", "teacher")
#: greedy decoding treats scores within this distance of the best (relative to it, or absolute below 1)
#: as tied and takes the lowest id, as the rules do. Float32 rounding differs between CPUs, between
#: BLAS kernels for different rows of one matrix, and between torch and numpy (about 1e-7 of the
#: value): identical ops score exactly alike on one machine and one ulp apart on another, and
#: without a tolerance the decode then takes them in another order, which can move a greedy
#: makespan far.
GREEDY_TIE_RTOL = 1e-6
_MODE_CODE = {"sample": 0, "greedy": 1, "teacher": 2}


def _pick_numpy(weights_or_scores, idx, count, mode, u_coin, u_draw, eps):
    """:func:`pick` with a numpy greedy arg-max (``doppler.util.jit.as_python``); sampling runs :func:`pick` itself."""
    if mode == 0:
        return pick.py_func(weights_or_scores, idx, count, mode, u_coin, u_draw, eps)
    ids = idx[:count]
    w = weights_or_scores[ids]
    top = w.max()
    ties = ids[w >= top - GREEDY_TIE_RTOL * max(abs(top), 1.0)]
    return int(ties.min()) if ties.size else int(ids[0])  # NaN scores compare false: take the first candidate


@jit(cache=True, python=_pick_numpy)
def pick(weights_or_scores, idx, count, mode, u_coin, u_draw, eps):  # pragma: no cover - compiled
    """Choose one of ``idx[:count]`` by ``scores``: softmax sample / eps-uniform / greedy arg-max
    (scores within :data:`GREEDY_TIE_RTOL` of the best tie; the lowest id wins)."""
    if mode == 0 and u_coin < eps:
        return idx[min(int(u_draw * count), count - 1)]
    top = weights_or_scores[idx[0]]
    for k in range(1, count):
        top = max(top, weights_or_scores[idx[k]])
    if mode != 0:
        floor = top - GREEDY_TIE_RTOL * max(abs(top), 1.0)
        best = -1
        for k in range(count):
            i = idx[k]
            if weights_or_scores[i] >= floor and (best < 0 or i < best):
                best = i
        return best if best >= 0 else idx[0]  # NaN scores compare false: never an index outside the candidates
    total = 0.0
    for k in range(count):
        total += np.exp(weights_or_scores[idx[k]] - top)
    target = u_draw * total
    acc = 0.0
    for k in range(count):
        acc += np.exp(weights_or_scores[idx[k]] - top)
        if acc >= target:
            return idx[k]
    return idx[count - 1]


@jit(cache=True, inline="always")
def plc_logit(v, x_d, placed_d, plc_op, plc_query, plc_dev, w_out, b_out, leak):  # pragma: no cover - compiled
    """The PLC head's logit of device d for op ``v``: its device features ``x_d[F]`` and the summed
    contributions ``placed_d[M + A]`` of the ops already on it (see :class:`~doppler.policy.networks.PlcHead`)."""
    m_hidden = plc_op.shape[1]
    z = b_out
    for j in range(m_hidden):
        a = plc_op[v, j] + placed_d[j]
        for f in range(x_d.shape[0]):
            a += x_d[f] * plc_dev[f, j]
        if a < 0.0:
            a *= leak
        z += w_out[j] * a
    for j in range(plc_query.shape[1]):
        z += plc_query[v, j] * placed_d[m_hidden + j]
    return z


def _plc_logits_into_numpy(v, x, placed, plc_op, plc_query, plc_dev, w_out, b_out, leak, logits):
    """:func:`plc_logits_into` in numpy (``doppler.util.jit.as_python``): the same logits up to rounding
    (its sums run in numpy's order), which greedy decoding's tie tolerance absorbs."""
    m_hidden = plc_op.shape[1]
    a = plc_op[v] + placed[:, :m_hidden] + x @ plc_dev
    a = np.where(a < 0.0, a * leak, a)
    logits[:] = b_out + a @ w_out + placed[:, m_hidden:] @ plc_query[v]


@jit(cache=True, inline="always", python=_plc_logits_into_numpy)
def plc_logits_into(v, x, placed, plc_op, plc_query, plc_dev, w_out, b_out, leak, logits):  # pragma: no cover - compiled
    """The PLC head's logit of every device for op ``v`` into ``logits[D]`` (:func:`plc_logit`)."""
    for d in range(x.shape[0]):
        logits[d] = plc_logit(v, x[d], placed[d], plc_op, plc_query, plc_dev, w_out, b_out, leak)


@jit(cache=True, inline="always")
def begin_episode(b, indeg0, nd, placed_init, dev, enter_step, limited, held, used, unheld,
                  slice_bytes):  # pragma: no cover - compiled  # fmt: skip
    """A fresh episode ``b``: nothing placed (``dev`` all -1), the roots as candidates (entered at step 0),
    the per-device sums at ``placed_init[D, M + A]`` (zero, or the devices' learned identity), and where
    ``limited`` an empty memory ledger. Returns ``(start, finish, free, assigned, indeg, cand, pos, ncand, placed)``."""
    if limited:
        held[:] = False
        used[:] = 0.0
        unheld[0] = slice_bytes.sum()
    dev[:] = -1
    _, start, finish, free, assigned, indeg, cand, pos, ncand = empty_state(indeg0, nd)
    for k in range(ncand):
        enter_step[b, cand[k]] = 0
    return start, finish, free, assigned, indeg, cand, pos, ncand, placed_init.copy()


def _record_view_numpy(b, h, raw, x, feats, est_tied, by_finish):
    """:func:`record_view` in numpy (``doppler.util.jit.as_python``)."""
    gap = 9 if by_finish else 5
    best = raw[0, 4] + (raw[0, 8] if by_finish else 0.0) - raw[0, gap]
    feats[b, h] = x
    est_tied[b, h] = tied.py_func(raw[:, gap], best)


def _add_row_numpy(dst, i, src, j):
    dst[i] += src[j]


@jit(cache=True, inline="always", python=_add_row_numpy)
def add_row(dst, i, src, j):  # pragma: no cover - compiled
    """``dst[i] += src[j]``, element by element."""
    for k in range(dst.shape[1]):
        dst[i, k] += src[j, k]


@jit(cache=True, inline="always", python=_record_view_numpy)
def record_view(b, h, raw, x, feats, est_tied, by_finish):  # pragma: no cover - compiled
    """Record what step ``h`` of episode ``b`` saw: the normalised device features ``x`` and which
    devices tie for the earliest start (from the raw features ``raw``; CRITICAL PATH's PLC choices,
    :func:`~doppler.listsched.tied`), or with ``by_finish`` for the earliest finish (HEFT's)."""
    gap = 9 if by_finish else 5
    best = raw[0, 4] + (raw[0, 8] if by_finish else 0.0) - raw[0, gap]
    for d in range(x.shape[0]):
        for f in range(x.shape[1]):
            feats[b, h, d, f] = x[d, f]
        est_tied[b, h, d] = tied(raw[d, gap], best)


@jit(cache=True, inline="always")
def commit_step(v, d, b, h, est_d, comp, dev, start, finish, free, assigned, placed, plc_placed,
                succ_ptr, succ_idx, indeg, cand, pos, ncand, order, step_dev, enter_step):  # pragma: no cover - compiled  # fmt: skip
    """Put op ``v`` on device ``d`` at step ``h`` of episode ``b``: the list-schedule state, the per-device
    sums of placed-op contributions, the recorded actions and the new candidates; returns their count."""
    place(v, d, est_d, comp, dev, start, finish, free, assigned)
    add_row(placed, d, plc_placed, v)
    order[b, h] = v
    step_dev[b, h] = d
    freed = ncand - 1
    ncand = take_candidate(v, succ_ptr, succ_idx, indeg, cand, pos, ncand)
    for k in range(freed, ncand):
        enter_step[b, cand[k]] = h + 1
    return ncand


@jit(cache=True, inline="always")
def choose_device(v, ties, x, placed, plc_op, plc_query, plc_dev, w_out, b_out, leak, logits, room_devs, nroom,
                  tied_devs, rule, ties_only, mode, u_coin, u_draw, eps):  # pragma: no cover - compiled  # fmt: skip
    """PLC's device for op ``v`` outside teacher mode: with ``rule``, the lowest device its list schedule's
    rule ties for first (``ties[D]``); else the learned head's pick (:func:`plc_logits_into`, :func:`pick`)
    among those tied devices (``ties_only``) or among the ``nroom`` devices ``room_devs`` (every device,
    or those with memory for the op)."""
    if rule:
        d = 0
        while not ties[d]:
            d += 1
        return d
    if ties_only:
        count = 0
        for dd in range(ties.shape[0]):
            if ties[dd]:
                tied_devs[count] = dd
                count += 1
        if count == 1:  # nothing to choose: any pick of one device returns it
            return tied_devs[0]
        plc_logits_into(v, x, placed, plc_op, plc_query, plc_dev, w_out, b_out, leak, logits)
        return pick(logits, tied_devs, count, mode, u_coin, u_draw, eps)
    plc_logits_into(v, x, placed, plc_op, plc_query, plc_dev, w_out, b_out, leak, logits)
    return pick(logits, room_devs, nroom, mode, u_coin, u_draw, eps)


@jit(cache=True, inline="always")
def restrict_to_room(raw, room, by_finish, ties):  # pragma: no cover - compiled
    """``ties[D]``: the devices with ``room`` tied for the earliest start (with ``by_finish``, finish) among
    the devices with room: the list schedule's rule within the memory budget."""
    best = np.inf
    for d in range(room.shape[0]):
        if room[d]:
            best = min(best, raw[d, 4] + (raw[d, 8] if by_finish else 0.0))
    for d in range(room.shape[0]):
        ties[d] = room[d] and tied(raw[d, 4] + (raw[d, 8] if by_finish else 0.0) - best, best)


@jit(cache=True)
def _rollout_loop(
    pred_ptr, pred_idx, pred_bytes, pred_comm, succ_ptr, succ_idx, indeg0, comp, lat, inv, inv_time_scale,
    sel_score, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, plc_init, leak,
    mode, eps, uniforms, forced_order, forced_dev, sel_key, sel_heuristic, plc_heuristic, heft_model,
    plc_ties_only, order, step_dev, assignment, enter_step, feats, est_tied,
    slice_ptr, slice_idx, slice_bytes, out_bytes, cap, room_rec,
):  # pragma: no cover - compiled  # fmt: skip
    """Run B episodes; returns -1 on success, else the step at which a forced op was not a candidate (or,
    with a memory budget, ``-2 - h``: no device had room for step ``h``'s op).

    ``slice_ptr`` ... ``cap``: the memory ledger's arrays (:mod:`doppler.listsched.ledger`; ``cap`` empty:
    no budget). With a budget, PLC chooses only among the devices with room for the op (recorded in
    ``room_rec[B, n, D]``), and the rule's ties (``est_tied``) are those among them.

    ``sel_heuristic``: SEL takes the candidate with the largest ``sel_key`` (ties: lowest op id);
    ``plc_heuristic``: PLC takes the lowest device tied for the smallest EST (CRITICAL PATH's rules).
    ``heft_model``: the list schedule inserts ops into idle gaps and the rule (and ``est_tied``) is
    the earliest finish (HEFT's model, :data:`~doppler.listsched.LIST_SCHEDULES`).
    ``plc_ties_only``: the learned PLC head chooses only among the devices that rule ties for first."""
    B, n = order.shape
    nd = comp.shape[1]
    nf = feats.shape[3]
    tied_devs = np.empty(nd, np.int64)
    busy_start = np.empty((nd, n if heft_model else 0))
    busy_end = np.empty_like(busy_start)
    busy_count = np.zeros(nd, np.int64)
    never_free = np.zeros(nd)
    limited = cap.shape[0] > 0 and mode != 2
    held = np.zeros((slice_bytes.shape[0] if limited else 0, nd), np.bool_)
    used = np.zeros(nd)
    unheld = np.zeros(1)
    room = np.ones(nd, np.bool_)
    room_devs = np.arange(nd)
    for b in range(B):
        dev = assignment[b]
        start, finish, free, assigned, indeg, cand, pos, ncand, placed = begin_episode(
            b, indeg0, nd, plc_init, dev, enter_step, limited, held, used, unheld, slice_bytes)  # fmt: skip
        busy_count[:] = 0
        raw = np.empty((nd, nf))
        x = np.empty((nd, nf))
        logits = np.empty(nd)
        for h in range(n):
            u = uniforms[b, h]
            # ---- SEL
            if mode == 2:
                v = forced_order[b, h]
                if v < 0 or v >= n or pos[v] < 0:
                    return h
            elif sel_heuristic:
                v = largest_key_candidate(sel_key, cand, ncand)
            else:
                v = pick(sel_score, cand, ncand, mode, u[0], u[1], eps)
            # ---- PLC
            if heft_model:
                heft_features_into(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish,
                                   never_free, assigned, busy_start, busy_end, busy_count, raw)  # fmt: skip
            else:
                features_into(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free,
                              assigned, raw)  # fmt: skip
            normalise_device_features(raw, inv_time_scale, x)
            record_view(b, h, raw, x, feats, est_tied, heft_model)
            nroom = nd
            if limited:
                room_into(v, slice_ptr, slice_idx, slice_bytes, out_bytes, held, used, cap, unheld, room)
                nroom = 0
                for dd in range(nd):
                    if room[dd]:
                        room_devs[nroom] = dd
                        nroom += 1
                if nroom == 0:
                    return -2 - h
                restrict_to_room(raw, room, heft_model, est_tied[b, h])
                room_rec[b, h] = room
            if mode == 2:
                d = forced_dev[b, h]
                if d < 0 or d >= nd:
                    return h
            else:
                d = choose_device(v, est_tied[b, h], x, placed, plc_op, plc_query, plc_dev, w_out, b_out, leak, logits,
                                  room_devs, nroom, tied_devs, plc_heuristic, plc_ties_only, mode, u[2], u[3],
                                  eps)  # fmt: skip
            if limited:
                hold(v, d, slice_ptr, slice_idx, slice_bytes, held, used, unheld)
            if heft_model:
                insert_busy(d, raw[d, 4], raw[d, 4] + comp[v, d], busy_start, busy_end, busy_count)
            ncand = commit_step(v, d, b, h, raw[d, 4], comp, dev, start, finish, free, assigned, placed, plc_placed,
                                succ_ptr, succ_idx, indeg, cand, pos, ncand, order, step_dev, enter_step)  # fmt: skip
    return -1


@dataclass
class Rollout:
    """B finished episodes of one graph. Step ``h`` of episode ``b`` put op
    ``order[b, h]`` on device ``step_device[b, h]``."""

    order: np.ndarray  # int64[B, n]
    step_device: np.ndarray  # int64[B, n]
    assignment: np.ndarray  # int64[B, n]: device per op
    enter_step: np.ndarray  # int64[B, n]: step at which each op became a candidate
    device_features: np.ndarray  # float32[B, n, D, F]: what PLC saw at each step
    est_tied: np.ndarray  # bool[B, n, D]: the devices the list schedule's rule ties for first (smallest EST;
    # with the ``heft`` list schedule, earliest finish): the PLC teacher's choices
    plc_ties_only: bool = False  # PLC chose only among ``est_tied`` (DecodePlan.plc_ties_only)
    room: np.ndarray | None = None  # bool[B, n, D]: the devices with memory for the op (a decode with a budget)
    memory_budget_bytes: np.ndarray | None = None  # the budget the episodes were decoded within (None: none)

    @property
    def batch(self) -> int:
        return int(self.order.shape[0])


class RolloutError(ValueError):
    """Replayed actions that are not a valid ASSIGN trajectory of the graph."""


@dataclass
class DecodePlan:
    """What a batch of episodes is asked to do, prepared once for every policy's decoder: the
    mode codes, the exploration rate, the uniforms all randomness comes from (``[B, n, 4]``: SEL
    coin and draw, PLC coin and draw) and, in teacher mode, the trajectories to replay."""

    batch: int
    mode: int  # _MODE_CODE
    eps: float
    uniforms: np.ndarray  # float64[B, n, 4]
    forced_order: np.ndarray  # int64[B, n] (teacher mode), else [1, 1]
    forced_dev: np.ndarray  # int64[B, n] (teacher mode), else [1, 1]
    #: the learned PLC head only breaks the ties of its list schedule's rule (zero-shot decoding,
    #: :data:`doppler.policy.method.ZERO_SHOT_PLC_TIES_ONLY`); teacher mode replays any device
    plc_ties_only: bool = False
    #: per-device memory caps (bytes): PLC places each op only where it has room (None: no budget)
    memory_budget_bytes: np.ndarray | None = None

    @classmethod
    def replaying(cls, order: np.ndarray, step_device: np.ndarray) -> "DecodePlan":
        """Teacher mode: replay ``order[B, n]`` with ``step_device[B, n]``."""
        B, n = np.atleast_2d(order).shape
        return make_plan(n, batch=B, mode="teacher", order=order, devices_by_step=step_device)

    @property
    def teacher(self) -> bool:
        return self.mode == _MODE_CODE["teacher"]

    def choose_devices(self, weights: np.ndarray, step: int | slice = slice(None),
                       allowed: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        """PLC's choice at ``step`` (default: every step) of every episode from device logits
        ``weights[B, (steps,) D]`` (only among ``allowed``), drawing on PLC's uniforms (``choose``)."""
        u = self.uniforms[:, step]
        return choose(weights, self.mode == _MODE_CODE["sample"], u[..., 2], u[..., 3], self.eps, allowed)


def empty_rollout(batch: int, n: int, nd: int) -> Rollout:
    return Rollout(
        order=np.empty((batch, n), np.int64),
        step_device=np.empty((batch, n), np.int64),
        assignment=np.empty((batch, n), np.int64),
        enter_step=np.empty((batch, n), np.int64),
        device_features=np.empty((batch, n, nd, NUM_DEVICE_FEATURES), np.float32),
        est_tied=np.empty((batch, n, nd), np.bool_),
    )


def _run_loop(gf: GraphFeatures, heads: tuple, plan: DecodePlan, sel_rule: bool, plc_rule: bool,
                list_schedule: str = "critical_path") -> Rollout:  # fmt: skip
    """DOPPLER's compiled rollout on ``heads`` (see :func:`numpy_heads`); ``sel_rule``/``plc_rule``: that
    head follows CRITICAL PATH's rule instead (PLC: ``list_schedule``'s rule)."""
    if list_schedule not in LIST_SCHEDULES:
        raise ValueError(f"list_schedule must be one of {', '.join(LIST_SCHEDULES)}, got {list_schedule!r}")
    cm = gf.costs
    ro = empty_rollout(plan.batch, gf.num_ops, gf.num_devices)
    sel, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, plc_init = heads
    if plc_init.shape != (gf.num_devices, plc_placed.shape[1]):
        from doppler.policy.checkpoint import device_identity_mismatch  # (a guard: numba does not check bounds)

        raise ValueError(device_identity_mismatch(plc_init.shape[0], gf.num_devices))
    inv_scale = 1.0 / gf.time_scale_s if gf.time_scale_s > 0 else 0.0
    ledger = ledger_arrays(gf, plan.memory_budget_bytes)
    limited = plan.memory_budget_bytes is not None and not plan.teacher
    room = np.ones((plan.batch, gf.num_ops, gf.num_devices) if limited else (0, 0, 0), np.bool_)
    bad = _rollout_loop(
        *gf.loop_arrays, cm.compute_s, cm.latency_s, cm.inv_bw, inv_scale,
        sel, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, plc_init, LEAK,
        plan.mode, plan.eps, plan.uniforms, plan.forced_order, plan.forced_dev,
        gf.b_level_key, sel_rule, plc_rule, list_schedule == "heft", plan.plc_ties_only and not plan.teacher,
        ro.order, ro.step_device, ro.assignment, ro.enter_step, ro.device_features, ro.est_tied, *ledger, room,
    )  # fmt: skip
    if bad >= 0:
        raise RolloutError(f"replayed step {bad}: op or device is not a valid choice at that step")
    if bad <= -2:
        raise RolloutError(f"step {-2 - bad}: no device has room for the op within the memory budget")
    ro.plc_ties_only = plan.plc_ties_only and not plan.teacher and not plc_rule
    ro.room = room if limited else None
    return ro


def ledger_arrays(gf: GraphFeatures, budget: np.ndarray | None) -> tuple:
    """The rollout loop's memory arguments: the graph's input slices per op, their bytes, the ops' output
    bytes and the caps (:mod:`doppler.listsched.ledger`); without a budget, empty ones."""
    if budget is None:
        empty_i, empty_f = np.zeros(1, np.int64), np.empty(0)
        return empty_i, np.empty(0, np.int64), empty_f, empty_f, empty_f
    s = input_slices(gf.graph)
    return (s.op_ptr, s.slice_idx, s.nbytes, np.ascontiguousarray(gf.graph.output_bytes, dtype=np.float64),
            np.ascontiguousarray(budget, dtype=np.float64))  # fmt: skip


def _no_heads(n: int, nd: int) -> tuple:
    """Heads of width 0 for ``n`` ops on ``nd`` devices: the loop then only list-schedules (teacher
    mode, or both rules)."""
    z = np.zeros((n, 0))
    return np.zeros(n), z, z, z, np.zeros((NUM_DEVICE_FEATURES, 0)), np.zeros(0), 0.0, np.zeros((nd, 0))


def replay(gf: GraphFeatures, order: np.ndarray, step_device: np.ndarray) -> Rollout:
    """The list schedule of given trajectories (``order[B, n]``, ``step_device[B, n]``) with what each
    step saw (device features, EST ties, when each op became a candidate): the :class:`Rollout` of any
    policy that made those choices. Raises :class:`RolloutError` if they are not valid ASSIGN steps."""
    return _run_loop(gf, _no_heads(gf.num_ops, gf.num_devices), DecodePlan.replaying(order, step_device), False, False)


def rule_decode(gf: GraphFeatures, list_schedule: str = "critical_path") -> Rollout:
    """One episode with both heads on their rules: SEL takes the ready op of largest b-level (ties:
    lowest id), PLC the device ``list_schedule`` ranks first. With ``critical_path`` this is CRITICAL
    PATH; with ``heft`` it is HEFT wherever b-levels do not tie (HEFT breaks ties by level first)."""
    plan = make_plan(gf.num_ops, batch=1, mode="greedy")
    return _run_loop(gf, _no_heads(gf.num_ops, gf.num_devices), plan, True, True, list_schedule)


def rule_order(gf: GraphFeatures) -> np.ndarray:
    """``int64[n]``: SEL's rule applied at every step (the ready op of largest b-level; ties: lowest id).
    It depends on no placement, so it is the fixed topological order of the one-placement policies
    (PLACETO, GDP) and of ``doppler_plc``; it is CRITICAL PATH's order."""
    return rule_decode(gf).order[0]


def choose(weights: np.ndarray, sample: bool, u_coin: np.ndarray, u_draw: np.ndarray, eps: float,
           allowed: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Vectorised :func:`pick` over the last axis: ``weights[..., D]`` (logits) -> ``int64[...]``.
    Greedy: arg-max (ties within :data:`GREEDY_TIE_RTOL`: lowest index); sample: with probability ``eps``
    uniform, else softmax. ``allowed[..., D]``: only among those devices (each row allows one at least)."""
    if allowed is not None:
        weights = np.where(allowed, weights, -np.inf)
    if not sample:
        top = weights.max(axis=-1, keepdims=True)
        return np.argmax(weights >= top - GREEDY_TIE_RTOL * np.maximum(np.abs(top), 1.0), axis=-1)
    nd = weights.shape[-1]
    p = np.exp(weights - weights.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p, axis=-1)
    soft = np.minimum((cdf < (u_draw * cdf[..., -1])[..., None]).sum(-1), nd - 1)
    if allowed is None:
        uniform = np.minimum((u_draw * nd).astype(np.int64), nd - 1)
    else:  # the k-th allowed device, k uniform
        count = allowed.sum(-1)
        k = np.minimum((u_draw * count).astype(np.int64), count - 1)
        uniform = np.argmax(np.cumsum(allowed, axis=-1) > k[..., None], axis=-1)
    return np.where(u_coin < eps, uniform, soft)


def choose_in_order(gf: GraphFeatures, plan: DecodePlan, order: np.ndarray, weights_at) -> Rollout:
    """The :func:`replay` of a decoder that places the ops of ``order[B, n]`` one step at a time (PLACETO, and
    GDP under a budget): ``weights_at(h, devices)`` gives step ``h``'s device logits ``[B, D]`` (``devices``:
    the choices so far). With ``plan.memory_budget_bytes``, each choice is only among the devices with room
    in the episode's memory ledger, and those rooms are the rollout's ``room`` ``[B, n, D]`` (else None)."""
    from doppler.listsched.ledger import MemoryLedger

    B, n = order.shape
    devices = np.empty((B, n), dtype=np.int64)
    budget = plan.memory_budget_bytes
    ledgers = [MemoryLedger.build(gf.graph, gf.num_devices, budget) for _ in range(B)] if budget is not None else []
    room = np.ones((B, n, gf.num_devices), np.bool_) if ledgers else None
    for h in range(n):
        allowed = None
        if ledgers:
            allowed = room[:, h]
            for b, led in enumerate(ledgers):
                allowed[b] = led.room(int(order[b, h]))
            if not allowed.any(-1).all():
                raise RolloutError(f"step {h}: no device has room for the op within the memory budget")
        devices[:, h] = plan.choose_devices(weights_at(h, devices), h, allowed)
        for b, led in enumerate(ledgers):
            led.hold(int(order[b, h]), int(devices[b, h]))
    ro = replay(gf, order, devices)
    ro.room = room
    return ro


def make_plan(
    n: int,
    *,
    batch: int,
    mode: str = "sample",
    eps: float = 0.0,
    rng: np.random.Generator | None = None,
    order: np.ndarray | None = None,
    devices_by_step: np.ndarray | None = None,
    plc_ties_only: bool = False,
    memory_budget_bytes: np.ndarray | None = None,
) -> DecodePlan:
    """The :class:`DecodePlan` of ``batch`` episodes of an ``n``-op graph: ``mode`` sample, greedy or
    teacher (replay ``order[B, n]`` with ``devices_by_step[B, n]``); ``eps``: epsilon-greedy exploration
    in sample mode, whose uniforms come from ``rng``; ``plc_ties_only``: the learned PLC head chooses only
    among the devices its list schedule's rule ties for first; ``memory_budget_bytes[D]``: PLC places each
    op only where it has room (:mod:`doppler.listsched.ledger`)."""
    if mode not in MODES:
        raise ValueError(f"unknown decode mode {mode!r} (use one of: {', '.join(MODES)})")
    if mode == "teacher":
        if order is None or devices_by_step is None:
            raise ValueError("teacher mode needs order and devices_by_step")
        forced_order = np.ascontiguousarray(np.broadcast_to(order, (batch, n)), dtype=np.int64)
        forced_dev = np.ascontiguousarray(np.broadcast_to(devices_by_step, (batch, n)), dtype=np.int64)
    else:
        forced_order = forced_dev = np.zeros((1, 1), dtype=np.int64)
    if mode == "sample" and rng is None:
        raise ValueError("sample mode needs a random generator: pass rng=np.random.default_rng(seed)")
    uniforms = rng.random((batch, n, 4)) if mode == "sample" else np.zeros((batch, n, 4))
    return DecodePlan(batch, _MODE_CODE[mode], float(eps), uniforms, forced_order, forced_dev, bool(plc_ties_only),
                      memory_budget_bytes)  # fmt: skip


def run_heads(gf: GraphFeatures, heads: tuple, plan: DecodePlan, learned: str = "both",
              list_schedule: str = "critical_path") -> Rollout:  # fmt: skip
    """Decode ``plan`` with DOPPLER's heads (``(sel_score, plc_op, plc_placed, plc_query, plc_dev, w_out,
    b_out)`` as float64 arrays and a float); ``learned`` says which heads decide (the other follows its rule)."""
    return _run_loop(gf, heads, plan, learned == "plc", learned == "sel", list_schedule)
