"""ASSIGN(SEL, PLC) for a batch of episodes of one graph, and the batched re-scoring
of recorded actions.

Why two passes. The encoder and every op-dependent head input are computed once per batch
(:meth:`~doppler.policy.networks.DopplerPolicy.encode`); the |V|-step loop of all B episodes then runs
as one compiled call on detached copies of those arrays (:mod:`doppler.policy.decode`, which needs no
torch, and whose docstring gives the decode modes). :func:`evaluate_actions` then recomputes the
log-likelihood and entropy of every recorded decision in one batched, differentiable torch pass
(``benchmarks/train_speed.py`` measures this against keeping an autograd graph through a per-step
torch loop).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from doppler.policy import LEAK
from doppler.policy.decode import DecodePlan, Rollout, make_plan, run_heads
from doppler.policy.features import GraphFeatures
from doppler.policy.networks import Encoded


class Decoder(Protocol):
    """A policy's per-graph state that is not DOPPLER's :class:`Encoded` (the learned baselines):
    it decodes a :class:`DecodePlan` into a :class:`Rollout` and re-scores a rollout's actions."""

    def head_weights(self) -> tuple[float, float]: ...

    def decode(self, gf: GraphFeatures, plan: DecodePlan) -> Rollout: ...

    def score(self, ro: Rollout) -> ActionScores: ...


def numpy_heads(enc: Encoded) -> tuple[np.ndarray, ...]:
    def arr(t: torch.Tensor) -> np.ndarray:
        return np.ascontiguousarray(t.detach().to("cpu", torch.float64).numpy())

    return (arr(enc.sel_score), arr(enc.plc_op), arr(enc.plc_placed), arr(enc.plc_query), arr(enc.plc_dev),
            arr(enc.plc_w_out), float(enc.plc_b_out.detach()), arr(enc.plc_init))  # fmt: skip


def rollout(gf: GraphFeatures, enc: Encoded | Decoder, **plan: Any) -> Rollout:
    """Run episodes of ASSIGN(SEL, PLC) on one graph with DOPPLER's :class:`Encoded` or a learned
    baseline's :class:`Decoder`: ``plan`` holds :func:`~doppler.policy.decode.make_plan`'s keywords
    (``batch``, ``mode``, ``eps``, ``rng``, ``order``, ``devices_by_step``, ...)."""
    return run_plan(gf, enc, make_plan(gf.num_ops, **plan))


def run_plan(gf: GraphFeatures, enc: Encoded | Decoder, plan: DecodePlan) -> Rollout:
    """Decode a :class:`DecodePlan` (:func:`~doppler.policy.decode.make_plan`) with any learned policy's encoding."""
    if not isinstance(enc, Encoded):
        if plan.plc_ties_only:
            raise ValueError("plc_ties_only is a decode of DOPPLER's dual policy, not of a learned baseline")
        return enc.decode(gf, plan)
    return run_heads(gf, numpy_heads(enc), plan, enc.learned, enc.list_schedule)


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
    device features each step saw: the batched twin of the scoring inside :func:`~doppler.policy.decode._rollout_loop`.

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
    carry = enc.plc_init.to(enc.plc_placed.dtype).expand(B, 1, D, width)
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
    if ro.plc_ties_only:  # the decode chose among the rule's tied devices: the distribution it drew from
        tied = torch.from_numpy(ro.est_tied).to(device)
        logits = logits.masked_fill(~tied, -torch.inf)
    elif ro.room is not None:  # ... or among the devices with memory for the op
        logits = logits.masked_fill(~torch.from_numpy(ro.room).to(device), -torch.inf)
    plc_logp = torch.log_softmax(logits, dim=-1)
    logp_plc = plc_logp.gather(2, dev.unsqueeze(-1)).squeeze(-1)
    finite_logp = plc_logp.masked_fill(~torch.isfinite(plc_logp), 0.0)  # 0 * log 0 is 0, with finite gradients
    entropy_plc = -(torch.exp(plc_logp) * finite_logp).sum(-1)
    return ActionScores(logp_sel, logp_plc, entropy_sel, entropy_plc, cand_logp, plc_logp, cs)


def fixed_order_scores(ro: Rollout, logits: torch.Tensor) -> ActionScores:
    """The scores of a policy whose SEL follows a fixed rule (PLACETO, GDP): ``logits[B, n, D]`` are PLC's
    device logits at every step (masked to the devices with room, where ``ro.room``); SEL's terms are
    constants (each candidate equally likely, so that imitation's SEL agreement stays finite; its weight is 0)."""
    if ro.room is not None:  # the devices each choice was made among
        logits = logits.masked_fill(~torch.from_numpy(ro.room).to(logits.device), -torch.inf)
    plc_logp = torch.log_softmax(logits, dim=-1)
    B, n = ro.order.shape
    cs = candidate_steps(ro)
    count = np.bincount(cs.seg, minlength=cs.num_segments).astype(np.float32)
    cand_logp = torch.from_numpy(-np.log(count[cs.seg])).to(plc_logp.device)
    zeros = plc_logp.new_zeros((B, n))
    dev = torch.from_numpy(ro.step_device).to(plc_logp.device)
    logp_plc = plc_logp.gather(2, dev.unsqueeze(-1)).squeeze(-1)
    finite_logp = plc_logp.masked_fill(~torch.isfinite(plc_logp), 0.0)  # (masked devices: 0 * log 0 is 0)
    entropy_plc = -(torch.exp(plc_logp) * finite_logp).sum(-1)
    return ActionScores(zeros, logp_plc, zeros, entropy_plc, cand_logp, plc_logp, cs)
