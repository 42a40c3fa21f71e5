"""The single-policy ablation (the reviewers' question): one network scores every (candidate op,
device) pair, with **one softmax over all pairs**, instead of SEL picking the op and PLC its device.

To compare architectures and nothing else, it has DOPPLER's encoder and the same two scoring
functions: a pair's score is ``s(v) + g(v, d)``, where ``s`` is the SEL head's op score and ``g``
the PLC head's device logit, computed from the device features of ``v`` on ``d`` in the current
state. What changes is the decision: the op is no longer chosen by ``s`` alone, but jointly, so a
step needs the device features of every candidate on every device (``candidates x D`` features,
where DOPPLER needs ``D``). Its marginal over ops and its conditional over devices are exactly the
two factors the training loop scores (``logp_sel + logp_plc`` = the pair's log-probability), so
Stage I, Stage II and distillation are DOPPLER's, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from doppler.util.jit import jit
from doppler.listsched import features_into
from doppler.listsched.ledger import hold, room_into
from doppler.policy.decode import (
    DecodePlan, Rollout, RolloutError, begin_episode, commit_step, empty_rollout, ledger_arrays, pick, plc_logit,
    record_view,
)  # fmt: skip
from doppler.policy.features import GraphFeatures, normalise_device_features
from doppler.policy.networks import LEAK, DopplerPolicy, Encoded
from doppler.policy.rollout import ActionScores, candidate_steps, numpy_heads, placed_sums, segment_logsumexp


@jit(cache=True)
def _pair_loop(
    pred_ptr, pred_idx, pred_bytes, pred_comm, succ_ptr, succ_idx, indeg0, comp, lat, inv, inv_time_scale,
    op_score, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, plc_init, leak,
    mode, eps, uniforms, forced_order, forced_dev, pair_first, pair_feats,
    order, step_dev, assignment, enter_step, feats, est_tied,
    slice_ptr, slice_idx, slice_bytes, out_bytes, cap, pair_room,
):  # pragma: no cover - compiled  # fmt: skip
    """Run B episodes of the single policy; returns -1 on success, else the step at which a forced
    (op, device) was not a valid choice (or ``-2 - h``: with a memory budget, no pair had room at step
    ``h``). With a non-empty ``pair_feats[T, D, F]`` (teacher mode), the normalised device features of
    every candidate at every step go to row ``pair_first[b, c] + h - enter_step[b, c]`` (the order of
    :func:`candidate_steps`), and with a budget whether each device had room for it to ``pair_room[T, D]``.
    ``slice_ptr`` ... ``cap``: the memory ledger's arrays (``cap`` empty: no budget); a pair whose device has
    no room for the op is never chosen."""
    B, n = order.shape
    nd = comp.shape[1]
    nf = feats.shape[3]
    record = pair_feats.shape[0] > 0
    limited = cap.shape[0] > 0 and (mode != 2 or record)
    held = np.zeros((slice_bytes.shape[0] if limited else 0, nd), np.bool_)
    used = np.zeros(nd)
    unheld = np.zeros(1)
    room = np.ones(nd, np.bool_)
    pairs = np.arange(n * nd)
    for b in range(B):
        dev = assignment[b]
        start, finish, free, assigned, indeg, cand, pos, ncand, placed = begin_episode(
            b, indeg0, nd, plc_init, dev, enter_step, limited, held, used, unheld, slice_bytes)  # fmt: skip
        raw = np.empty((nd, nf))
        x = np.empty((nd, nf))
        logits = np.empty(n * nd)
        for h in range(n):
            u = uniforms[b, h]
            if mode == 2 and not record:
                v = forced_order[b, h]
                d = forced_dev[b, h]
            else:
                npairs = 0
                for k in range(ncand):
                    c = cand[k]
                    features_into(c, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish,
                                  free, assigned, raw)  # fmt: skip
                    normalise_device_features(raw, inv_time_scale, x)
                    if limited:
                        room_into(c, slice_ptr, slice_idx, slice_bytes, out_bytes, held, used, cap, unheld, room)
                    if record:
                        i = pair_first[b, c] + h - enter_step[b, c]
                        for dd in range(nd):
                            for f in range(nf):
                                pair_feats[i, dd, f] = x[dd, f]
                            if limited:
                                pair_room[i, dd] = room[dd]
                    else:
                        for dd in range(nd):
                            logits[k * nd + dd] = op_score[c] + plc_logit(c, x[dd], placed[dd], plc_op, plc_query,
                                                                          plc_dev, w_out, b_out, leak)  # fmt: skip
                            if not limited or room[dd]:
                                pairs[npairs] = k * nd + dd
                                npairs += 1
                if mode == 2:
                    v = forced_order[b, h]
                    d = forced_dev[b, h]
                else:
                    if npairs == 0:
                        return -2 - h
                    i = pick(logits, pairs, npairs, mode, u[0], u[1], eps)
                    v = cand[i // nd]
                    d = i % nd
            if v < 0 or v >= n or pos[v] < 0 or d < 0 or d >= nd:
                return h
            features_into(v, pred_ptr, pred_idx, pred_bytes, pred_comm, comp, lat, inv, dev, start, finish, free,
                          assigned, raw)  # fmt: skip
            normalise_device_features(raw, inv_time_scale, x)
            record_view(b, h, raw, x, feats, est_tied, False)
            if limited:
                hold(v, d, slice_ptr, slice_idx, slice_bytes, held, used, unheld)
            ncand = commit_step(v, d, b, h, raw[d, 4], comp, dev, start, finish, free, assigned, placed, plc_placed,
                                succ_ptr, succ_idx, indeg, cand, pos, ncand, order, step_dev, enter_step)  # fmt: skip
    return -1


class SinglePolicy(DopplerPolicy):
    """DOPPLER's encoder and scoring functions, one softmax over every (candidate, device) pair."""

    architecture = method = "single_policy"
    methods = ("single_policy",)
    takes_device_identity = False

    def __init__(self, hidden: int = 128, steps: int = 6, mlp_hidden: int = 128, basis: int = 4,
                 op_features: str = "full") -> None:  # fmt: skip
        super().__init__(hidden, steps, mlp_hidden, basis, op_features)
        self.config = {"architecture": "single_policy", **{k: v for k, v in self.config.items() if k not in ("learned", "list_schedule")}}

    @classmethod
    def build(cls, method: str, *, num_devices: int, hidden: int, steps: int, mlp_hidden: int, op_features: str,
              list_schedule: str = "critical_path", device_identity: bool = False) -> SinglePolicy:  # fmt: skip
        """DOPPLER's sizes; its decisions follow no list-schedule rule, so ``list_schedule`` plays no part."""
        return cls(hidden, steps, mlp_hidden, op_features=op_features)

    def encode(self, gf: GraphFeatures) -> "PairDecoder":
        return PairDecoder(super().encode(gf), gf)


@dataclass
class PairDecoder:
    """One graph's encoding, decoded one (op, device) pair at a time."""

    enc: Encoded
    gf: GraphFeatures

    def head_weights(self) -> tuple[float, float]:
        return 1.0, 1.0

    def _run(self, plan: DecodePlan, pair_first: np.ndarray, pair_feats: np.ndarray,
             budget: np.ndarray | None = None, pair_room: np.ndarray | None = None) -> Rollout:  # fmt: skip
        gf, cm = self.gf, self.gf.costs
        ro = empty_rollout(plan.batch, gf.num_ops, gf.num_devices)
        sel, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, plc_init = numpy_heads(self.enc)
        inv_scale = 1.0 / gf.time_scale_s if gf.time_scale_s > 0 else 0.0
        bad = _pair_loop(
            *gf.loop_arrays, cm.compute_s, cm.latency_s, cm.inv_bw, inv_scale,
            sel, plc_op, plc_placed, plc_query, plc_dev, w_out, b_out, plc_init, LEAK,
            plan.mode, plan.eps, plan.uniforms, plan.forced_order, plan.forced_dev, pair_first, pair_feats,
            ro.order, ro.step_device, ro.assignment, ro.enter_step, ro.device_features, ro.est_tied,
            *ledger_arrays(gf, budget), np.zeros((0, gf.num_devices), np.bool_) if pair_room is None else pair_room,
        )  # fmt: skip
        if bad >= 0:
            raise RolloutError(f"replayed step {bad}: op or device is not a valid choice at that step")
        if bad <= -2:
            raise RolloutError(f"step {-2 - bad}: no device has room for any candidate within the memory budget")
        ro.memory_budget_bytes = budget
        return ro

    def decode(self, gf: GraphFeatures, plan: DecodePlan) -> Rollout:
        return self._run(plan, np.zeros((1, 1), np.int64), np.zeros((0, gf.num_devices, self.enc.plc_dev.shape[0]), np.float32),
                         None if plan.teacher else plan.memory_budget_bytes)  # fmt: skip

    def pair_logits(self, ro: Rollout) -> tuple[torch.Tensor, object]:
        """``[T, D]``: the score of every (candidate, device) pair of every step of ``ro``, and the
        candidate steps (:func:`candidate_steps`) that index its rows."""
        enc = self.enc
        B, n = ro.order.shape
        cs = candidate_steps(ro)
        nd, nf = self.gf.num_devices, enc.plc_dev.shape[0]
        feats = np.zeros((cs.seg.shape[0], nd, nf), np.float32)
        room = None if ro.memory_budget_bytes is None else np.ones((cs.seg.shape[0], nd), np.bool_)
        self._run(DecodePlan.replaying(ro.order, ro.step_device), np.ascontiguousarray(cs.first), feats,
                  ro.memory_budget_bytes, room)  # replay, recording every pair's features (and room)  # fmt: skip
        device = enc.sel_score.device
        seg = torch.from_numpy(cs.seg).to(device)
        op = torch.from_numpy(cs.op).to(device)
        order = torch.from_numpy(ro.order).to(device)
        placed, _ = placed_sums(enc.plc_placed[order], torch.from_numpy(ro.step_device).to(device), nd)
        before = placed.reshape(B * n, nd, -1).index_select(0, seg) + enc.plc_init  # [T, D, M + A]: what each device held
        m = enc.plc_op.shape[1]
        pre = torch.from_numpy(feats).to(device) @ enc.plc_dev + enc.plc_op.index_select(0, op).unsqueeze(1) + before[..., :m]
        affinity = (before[..., m:] * enc.plc_query.index_select(0, op).unsqueeze(1)).sum(-1)
        g = torch.nn.functional.leaky_relu(pre, LEAK) @ enc.plc_w_out + enc.plc_b_out + affinity
        g = g + enc.sel_score.index_select(0, op).unsqueeze(1)
        if room is not None:  # a pair whose device had no room was never a choice
            g = g.masked_fill(~torch.from_numpy(room).to(device), -torch.inf)
        return g, cs

    def score(self, ro: Rollout) -> ActionScores:
        B, n = ro.order.shape
        pair, cs = self.pair_logits(ro)
        device = pair.device
        seg = torch.from_numpy(cs.seg).to(device)
        marginal = torch.logsumexp(pair, dim=1)  # [T]: log of the op's summed pair weights
        log_z = segment_logsumexp(marginal, seg, cs.num_segments)
        cand_logp = marginal - log_z[seg]
        step = np.arange(n)
        chosen = cs.first[np.arange(B)[:, None], ro.order] + step - np.take_along_axis(ro.enter_step, ro.order, 1)
        chosen = torch.from_numpy(chosen.reshape(-1)).to(device)  # the row of the op taken at each step
        logp_sel = cand_logp.index_select(0, chosen).view(B, n)
        plc_logp = (pair.index_select(0, chosen) - marginal.index_select(0, chosen).unsqueeze(-1)).view(B, n, -1)
        dev = torch.from_numpy(ro.step_device).to(device)
        logp_plc = plc_logp.gather(2, dev.unsqueeze(-1)).squeeze(-1)
        ent = torch.exp(cand_logp) * cand_logp.masked_fill(~torch.isfinite(cand_logp), 0.0)  # (0 * log 0 is 0)
        entropy_sel = -torch.zeros_like(log_z).index_add_(0, seg, ent).view(B, n)
        entropy_plc = -(torch.exp(plc_logp) * plc_logp.masked_fill(~torch.isfinite(plc_logp), 0.0)).sum(-1)
        return ActionScores(logp_sel, logp_plc, entropy_sel, entropy_plc, cand_logp, plc_logp, cs)
