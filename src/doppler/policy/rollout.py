"""ASSIGN(SEL, PLC) for a batch of episodes of one graph, and the batched re-scoring
of recorded actions.

Why two passes. A rollout has |V| sequential steps, but the policy's encoder and
every op-dependent head input are computed once per batch
(:meth:`~doppler.policy.networks.DopplerPolicy.encode`). What is left per step
(a masked softmax over the candidates, the device features from the shared
list-schedule state, a ``[D, F] x [F, M]`` product, the state update) is a few
hundred flops, so the whole |V|-step loop for all B episodes runs as one compiled
call (:func:`_rollout_kernel`) on detached copies of those arrays, recording the
actions, the device features each PLC decision saw, and when each op became a
candidate. :func:`evaluate_actions` then recomputes the log-likelihood and
entropy of every recorded decision in one batched, differentiable torch pass
(``benchmarks/train_speed.py`` measures this against keeping an autograd graph
through a per-step torch loop).

Decode modes: ``sample`` (softmax, with epsilon-greedy exploration: with
probability ``eps`` a uniform choice), ``greedy`` (arg-max; ties: lowest op id /
device id) and ``teacher`` (replay given op orders and devices, to score them).
All randomness comes from one numpy ``Generator`` (uniforms drawn up front), so
a rollout is reproducible from the generator's state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numba
import numpy as np
import torch

from doppler.methods.critical_path import TIE_RTOL
from doppler.listsched import (
    LIST_SCHEDULES, NUM_DEVICE_FEATURES, empty_state, features_into, insert_busy, insertion_starts_into, place, take_candidate,
)  # fmt: skip
from doppler.policy.features import GraphFeatures, normalise_device_features
from doppler.policy.networks import LEAK, Encoded

MODES = ("sample", "greedy", "teacher")
_MODE_CODE = {"sample": 0, "greedy": 1, "teacher": 2}


@numba.njit(cache=True)
def pick(weights_or_scores, idx, count, mode, u_coin, u_draw, eps):  # pragma: no cover - compiled
    """Choose one of ``idx[:count]`` by ``scores``: softmax sample / eps-uniform / greedy arg-max."""
    if mode == 0 and u_coin < eps:
        return idx[min(int(u_draw * count), count - 1)]
    best = idx[0]
    for k in range(1, count):
        i = idx[k]
        s = weights_or_scores[i]
        if s > weights_or_scores[best] or (s == weights_or_scores[best] and i < best):
            best = i
    if mode != 0:
        return best
    top = weights_or_scores[best]
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


@numba.njit(cache=True, inline="always")
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


@numba.njit(cache=True, inline="always")
def begin_episode(b, indeg0, nd, m_placed, dev, enter_step):  # pragma: no cover - compiled
    """A fresh episode ``b``: nothing placed (``dev`` all -1), the roots as candidates (entered at step 0),
    no placed-op contributions. Returns ``(start, finish, free, assigned, indeg, cand, pos, ncand, placed)``."""
    dev[:] = -1
    _, start, finish, free, assigned, indeg, cand, pos, ncand = empty_state(indeg0, nd)
    for k in range(ncand):
        enter_step[b, cand[k]] = 0
    return start, finish, free, assigned, indeg, cand, pos, ncand, np.zeros((nd, m_placed))


@numba.njit(cache=True, inline="always")
def record_view(b, h, raw, x, feats, est_tied, by_finish):  # pragma: no cover - compiled
    """Record what step ``h`` of episode ``b`` saw: the normalised device features ``x`` and which
    devices tie for the earliest start (from the raw features ``raw``; CRITICAL PATH's PLC choices),
    or with ``by_finish`` for the earliest finish (HEFT's)."""
    gap = 9 if by_finish else 5
    best = raw[0, 4] + (raw[0, 8] if by_finish else 0.0) - raw[0, gap]
    for d in range(x.shape[0]):
        for f in range(x.shape[1]):
            feats[b, h, d, f] = x[d, f]
        est_tied[b, h, d] = raw[d, gap] <= TIE_RTOL * abs(best)


@numba.njit(cache=True, inline="always")
def commit_step(v, d, b, h, est_d, comp, dev, start, finish, free, assigned, placed, plc_placed,
                succ_ptr, succ_idx, indeg, cand, pos, ncand, order, step_dev, enter_step):  # pragma: no cover - compiled  # fmt: skip
    """Put op ``v`` on device ``d`` at step ``h`` of episode ``b``: the list-schedule state, the per-device
    sums of placed-op contributions, the recorded actions and the new candidates; returns their count."""
    place(v, d, est_d, comp, dev, start, finish, free, assigned)
    for j in range(plc_placed.shape[1]):
        placed[d, j] += plc_placed[v, j]
    order[b, h] = v
    step_dev[b, h] = d
    freed = ncand - 1
    ncand = take_candidate(v, succ_ptr, succ_idx, indeg, cand, pos, ncand)
    for k in range(freed, ncand):
        enter_step[b, cand[k]] = h + 1
    return ncand


@numba.njit(cache=True)
def _rollout_kernel(
    pred_ptr, pred_idx, pred_bytes, pred_comm, succ_ptr, succ_idx, indeg0, comp, lat, inv, inv_time_scale,
    sel_score, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, leak,
    mode, sel_mode, eps, uniforms, forced_order, forced_dev, sel_key, sel_heuristic, plc_heuristic, heft_model,
    order, step_dev, assignment, enter_step, feats, est_tied,
):  # pragma: no cover - compiled  # fmt: skip
    """Run B episodes; returns -1 on success, else the step at which a forced op was not a candidate.

    ``sel_heuristic``: SEL takes the candidate with the largest ``sel_key`` (ties: lowest op id);
    ``plc_heuristic``: PLC takes the lowest device tied for the smallest EST (CRITICAL PATH's rules).
    ``heft_model``: the list schedule inserts ops into idle gaps and the rule (and ``est_tied``) is
    the earliest finish (HEFT's model, :data:`~doppler.listsched.LIST_SCHEDULES`)."""
    B, n = order.shape
    nd = comp.shape[1]
    m_placed = plc_placed.shape[1]
    nf = feats.shape[3]
    all_devs = np.arange(nd)
    busy_start = np.empty((nd, n if heft_model else 0))
    busy_end = np.empty_like(busy_start)
    busy_count = np.zeros(nd, np.int64)
    never_free = np.zeros(nd)
    for b in range(B):
        dev = assignment[b]
        start, finish, free, assigned, indeg, cand, pos, ncand, placed = begin_episode(b, indeg0, nd, m_placed, dev,
                                                                                       enter_step)  # fmt: skip
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
                v = cand[0]
                for j in range(1, ncand):
                    c = cand[j]
                    if sel_key[c] > sel_key[v] or (sel_key[c] == sel_key[v] and c < v):
                        v = c
            else:
                v = pick(sel_score, cand, ncand, sel_mode, u[0], u[1], eps)
            # ---- PLC
            features_into(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish,
                          never_free if heft_model else free, assigned, raw)  # fmt: skip
            if heft_model:
                insertion_starts_into(v, comp, busy_start, busy_end, busy_count, raw)
            normalise_device_features(raw, inv_time_scale, x)
            record_view(b, h, raw, x, feats, est_tied, heft_model)
            for d in range(nd):
                logits[d] = plc_logit(v, x[d], placed[d], plc_op, plc_query, plc_dev, w_out, b_out, leak)
            if mode == 2:
                d = forced_dev[b, h]
                if d < 0 or d >= nd:
                    return h
            elif plc_heuristic:
                d = 0
                while not est_tied[b, h, d]:
                    d += 1
            else:
                d = pick(logits, all_devs, nd, mode, u[2], u[3], eps)
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

    @property
    def batch(self) -> int:
        return int(self.order.shape[0])


class RolloutError(ValueError):
    """Replayed actions that are not a valid ASSIGN trajectory of the graph."""


def numpy_heads(enc: Encoded) -> tuple[np.ndarray, ...]:
    def arr(t: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(t.detach().to("cpu", torch.float64).numpy())

    return (arr(enc.sel_score), arr(enc.plc_op), arr(enc.plc_placed), arr(enc.plc_query), arr(enc.plc_dev),
            arr(enc.plc_w_out), float(enc.plc_b_out.detach()))  # fmt: skip


@dataclass
class DecodePlan:
    """What a batch of episodes is asked to do, prepared once for every policy's decoder: the
    mode codes, the exploration rate, the uniforms all randomness comes from (``[B, n, 4]``: SEL
    coin and draw, PLC coin and draw) and, in teacher mode, the trajectories to replay."""

    batch: int
    mode: int  # _MODE_CODE
    sel_mode: int  # the SEL decode (greedy where ``greedy_sel``)
    eps: float
    uniforms: np.ndarray  # float64[B, n, 4]
    forced_order: np.ndarray  # int64[B, n] (teacher mode), else [1, 1]
    forced_dev: np.ndarray  # int64[B, n] (teacher mode), else [1, 1]

    @classmethod
    def replaying(cls, order: np.ndarray, step_device: np.ndarray) -> "DecodePlan":
        """Teacher mode: replay ``order[B, n]`` with ``step_device[B, n]``."""
        order = np.ascontiguousarray(np.atleast_2d(order), dtype=np.int64)
        B, n = order.shape
        return cls(B, _MODE_CODE["teacher"], _MODE_CODE["teacher"], 0.0, np.zeros((B, n, 4)), order,
                   np.ascontiguousarray(np.broadcast_to(step_device, (B, n)), dtype=np.int64))  # fmt: skip

    @property
    def teacher(self) -> bool:
        return self.mode == _MODE_CODE["teacher"]

    def choose_devices(self, weights: np.ndarray, step: int | slice = slice(None)) -> np.ndarray:
        """PLC's choice at ``step`` (default: every step) of every episode from device logits
        ``weights[B, (steps,) D]``, drawing on PLC's uniforms (``choose``)."""
        u = self.uniforms[:, step]
        return choose(weights, self.mode == _MODE_CODE["sample"], u[..., 2], u[..., 3], self.eps)


class Decoder(Protocol):
    """A policy's per-graph state that is not DOPPLER's :class:`Encoded` (the learned baselines):
    it decodes a :class:`DecodePlan` into a :class:`Rollout` and re-scores a rollout's actions."""

    def head_weights(self) -> tuple[float, float]: ...

    def decode(self, gf: GraphFeatures, plan: DecodePlan) -> "Rollout": ...

    def score(self, ro: "Rollout") -> "ActionScores": ...


def empty_rollout(batch: int, n: int, nd: int) -> Rollout:
    return Rollout(
        order=np.empty((batch, n), np.int64),
        step_device=np.empty((batch, n), np.int64),
        assignment=np.empty((batch, n), np.int64),
        enter_step=np.empty((batch, n), np.int64),
        device_features=np.empty((batch, n, nd, NUM_DEVICE_FEATURES), np.float32),
        est_tied=np.empty((batch, n, nd), np.bool_),
    )


def _run_kernel(gf: GraphFeatures, heads: tuple, plan: DecodePlan, sel_rule: bool, plc_rule: bool,
                list_schedule: str = "critical_path") -> Rollout:  # fmt: skip
    """DOPPLER's compiled rollout on ``heads`` (see :func:`numpy_heads`); ``sel_rule``/``plc_rule``: that
    head follows CRITICAL PATH's rule instead (PLC: ``list_schedule``'s rule)."""
    if list_schedule not in LIST_SCHEDULES:
        raise ValueError(f"list_schedule must be one of {', '.join(LIST_SCHEDULES)}, got {list_schedule!r}")
    cm = gf.costs
    ro = empty_rollout(plan.batch, gf.num_ops, gf.num_devices)
    sel, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out = heads
    inv_scale = 1.0 / gf.time_scale_s if gf.time_scale_s > 0 else 0.0
    bad = _rollout_kernel(
        *gf.kernel_arrays, cm.compute_s, cm.latency_s, cm.inv_bw, inv_scale,
        sel, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, LEAK,
        plan.mode, plan.sel_mode, plan.eps, plan.uniforms, plan.forced_order, plan.forced_dev,
        gf.b_level_key, sel_rule, plc_rule, list_schedule == "heft",
        ro.order, ro.step_device, ro.assignment, ro.enter_step, ro.device_features, ro.est_tied,
    )  # fmt: skip
    if bad >= 0:
        raise RolloutError(f"replayed step {bad}: op or device is not a valid choice at that step")
    return ro


def _no_heads(n: int) -> tuple:
    """Heads of width 0: the kernel then only list-schedules (teacher mode, or both rules)."""
    z = np.zeros((n, 0))
    return np.zeros(n), z, z, z, np.zeros((NUM_DEVICE_FEATURES, 0)), np.zeros(0), 0.0


def replay(gf: GraphFeatures, order: np.ndarray, step_device: np.ndarray) -> Rollout:
    """The list schedule of given trajectories (``order[B, n]``, ``step_device[B, n]``) with what each
    step saw (device features, EST ties, when each op became a candidate): the :class:`Rollout` of any
    policy that made those choices. Raises :class:`RolloutError` if they are not valid ASSIGN steps."""
    return _run_kernel(gf, _no_heads(gf.num_ops), DecodePlan.replaying(order, step_device), False, False)


def rule_decode(gf: GraphFeatures, list_schedule: str = "critical_path") -> Rollout:
    """One episode with both heads on their rules: SEL takes the ready op of largest b-level (ties:
    lowest id), PLC the device ``list_schedule`` ranks first. With ``critical_path`` this is CRITICAL
    PATH; with ``heft`` it is HEFT wherever b-levels do not tie (HEFT breaks ties by level first)."""
    n = gf.num_ops
    plan = DecodePlan(1, _MODE_CODE["greedy"], _MODE_CODE["greedy"], 0.0, np.zeros((1, n, 4)),
                      np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64))  # fmt: skip
    return _run_kernel(gf, _no_heads(n), plan, True, True, list_schedule)


def rule_order(gf: GraphFeatures) -> np.ndarray:
    """``int64[n]``: SEL's rule applied at every step (the ready op of largest b-level; ties: lowest id).
    It depends on no placement, so it is the fixed topological order of the one-placement policies
    (PLACETO, GDP) and of ``doppler_plc``; it is CRITICAL PATH's order."""
    return rule_decode(gf).order[0]


def choose(weights: np.ndarray, sample: bool, u_coin: np.ndarray, u_draw: np.ndarray, eps: float) -> np.ndarray:
    """Vectorised :func:`pick` over the last axis: ``weights[..., D]`` (logits) -> ``int64[...]``.
    Greedy: arg-max (ties: lowest index); sample: with probability ``eps`` uniform, else softmax."""
    if not sample:
        return np.argmax(weights, axis=-1)
    nd = weights.shape[-1]
    p = np.exp(weights - weights.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p, axis=-1)
    soft = np.minimum((cdf < (u_draw * cdf[..., -1])[..., None]).sum(-1), nd - 1)
    uniform = np.minimum((u_draw * nd).astype(np.int64), nd - 1)
    return np.where(u_coin < eps, uniform, soft)


def rollout(
    gf: GraphFeatures,
    enc: Encoded | Decoder,
    *,
    batch: int,
    mode: str = "sample",
    eps: float = 0.0,
    rng: np.random.Generator | None = None,
    order: np.ndarray | None = None,
    devices_by_step: np.ndarray | None = None,
    greedy_sel: bool = False,
) -> Rollout:
    """Run ``batch`` episodes of ASSIGN(SEL, PLC) on one graph (see the module docstring).

    ``mode="teacher"`` replays ``order[B, n]`` and ``devices_by_step[B, n]``.
    ``greedy_sel``: in ``sample`` mode, SEL still decodes greedily (only PLC samples).
    ``enc``: DOPPLER's :class:`Encoded`, or a learned baseline's :class:`Decoder`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown decode mode {mode!r} (use one of: {', '.join(MODES)})")
    n = gf.num_ops
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
    plan = DecodePlan(batch, _MODE_CODE[mode], _MODE_CODE["greedy" if greedy_sel and mode == "sample" else mode],
                      float(eps), uniforms, forced_order, forced_dev)  # fmt: skip
    if not isinstance(enc, Encoded):
        return enc.decode(gf, plan)
    return _run_kernel(gf, numpy_heads(enc), plan, enc.learned == "plc", enc.learned == "sel", enc.list_schedule)


# ============================================================================ re-scoring
def segment_logsumexp(values: torch.Tensor, seg: torch.Tensor, num_segments: int) -> torch.Tensor:
    """``log(sum(exp(values[seg == s])))`` for every segment ``s`` (-inf for empty ones)."""
    top = torch.full((num_segments,), -torch.inf, dtype=values.dtype, device=values.device)
    top = top.scatter_reduce(0, seg, values.detach(), reduce="amax", include_self=True)
    safe_top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    total = torch.zeros_like(top).index_add_(0, seg, torch.exp(values - safe_top[seg]))
    return torch.log(total) + safe_top


@dataclass
class CandidateSteps:
    """Every (step, candidate) pair of a rollout, flattened: candidate ``op[i]`` was in the
    candidate set of step ``seg[i] % n`` of episode ``seg[i] // n``."""

    seg: np.ndarray  # int64[T]
    op: np.ndarray  # int64[T]
    num_segments: int
    first: np.ndarray  # int64[B, n]: where op v's pairs of episode b begin (they follow in step order)


def candidate_steps(ro: Rollout) -> CandidateSteps:
    """Op v is a candidate from the step it became ready until the step that selected it."""
    B, n = ro.order.shape
    sel_step = np.empty_like(ro.order)
    np.put_along_axis(sel_step, ro.order, np.broadcast_to(np.arange(n), (B, n)), axis=1)
    lengths = (sel_step - ro.enter_step + 1).reshape(-1)
    total = int(lengths.sum())
    first = np.repeat(np.cumsum(lengths) - lengths, lengths)
    ep_op = np.repeat(np.arange(B * n), lengths)
    step = np.repeat(ro.enter_step.reshape(-1), lengths) + (np.arange(total) - first)
    return CandidateSteps(seg=(ep_op // n) * n + step, op=ep_op % n, num_segments=B * n,
                          first=(np.cumsum(lengths) - lengths).reshape(B, n))


@dataclass
class ActionScores:
    """Differentiable log-likelihoods and entropies of a rollout's recorded actions."""

    logp_sel: torch.Tensor  # [B, n]: log SEL(op taken at step h)
    logp_plc: torch.Tensor  # [B, n]: log PLC(device taken at step h)
    entropy_sel: torch.Tensor  # [B, n]
    entropy_plc: torch.Tensor  # [B, n]
    cand_logp: torch.Tensor  # [T]: log SEL(candidate) for every pair in ``cands``
    plc_logp: torch.Tensor  # [B, n, D]: log PLC(d) at every step
    cands: CandidateSteps


#: bytes of one [B, steps, D, M + A] float32 block of the PLC re-scoring (see plc_logits)
PLC_CHUNK_BYTES = 8 << 20


def plc_logits(enc: Encoded, order: torch.Tensor, dev: torch.Tensor, device_features: torch.Tensor) -> torch.Tensor:
    """PLC logits ``[B, n, D]`` of every step, given the ops taken (``order``), their devices and the
    device features each step saw: the batched twin of the scoring inside :func:`_rollout_kernel`.

    The sums over ops already on each device are ``[B, n, D, M + A]`` tensors, 200 MB at 10k ops.
    Steps go in chunks of about :data:`PLC_CHUNK_BYTES`, carrying the per-device sums from chunk to
    chunk: blocks that size come back from the allocator's free lists, where whole-graph blocks were
    fresh memory every update (millions of page faults at 10k ops; ``benchmarks/doppler_scale.py``).
    """
    B, n = order.shape
    D = device_features.shape[2]
    m, width = enc.plc_op.shape[1], enc.plc_placed.shape[1]
    chunk = max(1, PLC_CHUNK_BYTES // max(1, B * D * width * enc.plc_placed.element_size()))
    # split (not sliced per chunk): the backward of a split is one concatenation, where every
    # slice of a tensor would allocate and fill a full-size zero gradient
    per_step = [t.split(chunk, dim=1) for t in (enc.plc_placed[order], enc.plc_op[order], enc.plc_query[order],
                                                 device_features, dev)]  # fmt: skip
    carry = enc.plc_placed.new_zeros((B, 1, D, width))
    out = []
    for contrib, op_part, query, feats, devs in zip(*per_step):
        before, total = placed_sums(contrib, devs, D)
        placed_before = carry + before
        pre = feats @ enc.plc_dev + op_part.unsqueeze(2) + placed_before[..., :m]
        affinity = (placed_before[..., m:] * query.unsqueeze(2)).sum(-1)
        out.append(torch.nn.functional.leaky_relu(pre, LEAK) @ enc.plc_w_out + enc.plc_b_out + affinity)
        carry = carry + total
    return torch.cat(out, dim=1)


def placed_sums(contrib: torch.Tensor, devs: torch.Tensor, num_devices: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What the devices hold before each step of a run of steps: ``contrib[B, c, W]`` (the placed-op
    contribution of the op taken at each step) put on ``devs[B, c]``. Returns the sums before each step
    ``[B, c, D, W]`` and the sums after the last ``[B, 1, D, W]``."""
    onehot = torch.nn.functional.one_hot(devs, num_devices).to(contrib.dtype)  # [B, c, D]
    added = onehot.unsqueeze(-1) * contrib.unsqueeze(2)  # [B, c, D, W]
    running = torch.cumsum(added, dim=1)
    return running - added, running[:, -1:]


def evaluate_actions(enc: Encoded | Decoder, ro: Rollout) -> ActionScores:
    """Re-score every decision of ``ro`` under the current weights in one batched pass."""
    if not isinstance(enc, Encoded):
        return enc.score(ro)
    B, n = ro.order.shape
    device = enc.sel_score.device
    cs = candidate_steps(ro)
    seg = torch.from_numpy(cs.seg).to(device)
    s = enc.sel_score[torch.from_numpy(cs.op).to(device)]
    log_z = segment_logsumexp(s, seg, cs.num_segments)
    cand_logp = s - log_z[seg]
    order = torch.from_numpy(ro.order).to(device)
    logp_sel = enc.sel_score[order] - log_z.view(B, n)
    ent_terms = torch.exp(cand_logp) * cand_logp
    entropy_sel = -torch.zeros_like(log_z).index_add_(0, seg, ent_terms).view(B, n)

    dev = torch.from_numpy(ro.step_device).to(device)
    logits = plc_logits(enc, order, dev, torch.from_numpy(ro.device_features).to(device))
    plc_logp = torch.log_softmax(logits, dim=-1)
    logp_plc = plc_logp.gather(2, dev.unsqueeze(-1)).squeeze(-1)
    entropy_plc = -(torch.exp(plc_logp) * plc_logp).sum(-1)
    return ActionScores(logp_sel, logp_plc, entropy_sel, entropy_plc, cand_logp, plc_logp, cs)


def fixed_order_scores(ro: Rollout, plc_logp: torch.Tensor) -> ActionScores:
    """The scores of a policy whose SEL follows a fixed rule (PLACETO, GDP): ``plc_logp[B, n, D]`` holds
    log PLC(d) at every step; SEL's terms are constants (each candidate equally likely, so that
    imitation's SEL agreement stays finite; its weight is 0)."""
    B, n = ro.order.shape
    cs = candidate_steps(ro)
    count = np.bincount(cs.seg, minlength=cs.num_segments).astype(np.float32)
    cand_logp = torch.from_numpy(-np.log(count[cs.seg])).to(plc_logp.device)
    zeros = plc_logp.new_zeros((B, n))
    dev = torch.from_numpy(ro.step_device).to(plc_logp.device)
    logp_plc = plc_logp.gather(2, dev.unsqueeze(-1)).squeeze(-1)
    entropy_plc = -(torch.exp(plc_logp) * plc_logp).sum(-1)
    return ActionScores(zeros, logp_plc, zeros, entropy_plc, cand_logp, plc_logp, cs)
