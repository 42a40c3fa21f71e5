"""The losses of training, each a function of a task, an encoder pass and a rollout.

* :func:`imitation_loss`: Stage I, the teacher's tied-best choices;
* :func:`policy_gradient_loss`: Stage II/III, REINFORCE with an entropy bonus and the
  self-improvement term (:func:`best_nll`);
* :func:`best_nll` and :func:`on_policy_nll`: distillation of the best assignment into the greedy decode;
* :func:`advantages`: the baselines of REINFORCE.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from doppler.policy.decode import Rollout
from doppler.policy.rollout import evaluate_actions, rollout, segment_logsumexp
from doppler.train.config import TrainConfig
from doppler.train.tasks import Task

#: decay of the running-mean baseline (``baseline="running"``)
RUNNING_DECAY = 0.95


def imitation_loss(task: Task, ro: Rollout, enc) -> tuple[torch.Tensor, float, float]:
    """-log P(teacher's tied-best choices), per step; returns (loss, SEL agreement, PLC agreement).

    SEL's teacher picks the candidate with the largest b-level; PLC's the device the list-schedule
    rule ties at best (``ro.est_tied``), or with another teacher that method's device for the op."""
    sc = evaluate_actions(enc, ro)
    cs = sc.cands
    key = task.features.b_level_key[cs.op]
    seg_best = np.full(cs.num_segments, np.iinfo(np.int64).min)
    np.maximum.at(seg_best, cs.seg, key)
    tied = key == seg_best[cs.seg]
    device = sc.cand_logp.device
    seg = torch.from_numpy(cs.seg).to(device)
    masked = sc.cand_logp.masked_fill(~torch.from_numpy(tied).to(device), -torch.inf)
    sel_ll = segment_logsumexp(masked, seg, cs.num_segments)
    if task.teacher_devices is None:
        plc_mask = torch.from_numpy(ro.est_tied).to(device)
    else:
        want = task.teacher_devices[ro.order]  # [B, n]
        plc_mask = torch.from_numpy(np.arange(ro.est_tied.shape[2]) == want[..., None]).to(device)
    labelled = plc_mask.any(-1)
    plc_ll = torch.logsumexp(sc.plc_logp.masked_fill(~plc_mask, -torch.inf), dim=-1)[labelled]
    w_sel, w_plc = enc.head_weights()
    loss = -(w_sel * sel_ll.mean() if w_sel else 0.0) - w_plc * plc_ll.mean()
    with torch.no_grad():
        seg_max = torch.full((cs.num_segments,), -torch.inf, device=device).scatter_reduce(0, seg, sc.cand_logp, "amax")
        sel_agree = float((sel_ll >= seg_max - 1e-6).float().mean())
        plc_best = sc.plc_logp.argmax(-1, keepdim=True)
        plc_agree = float(plc_mask.gather(-1, plc_best)[labelled].float().mean())
    return loss, sel_agree, plc_agree


def best_nll(task: Task, enc) -> torch.Tensor:
    """Per-step negative log-likelihood of the best trajectory so far (the self-improvement term)."""
    best = rollout(task.features, enc, batch=1, mode="teacher", order=task.best_order,
                   devices_by_step=task.best_step_device)  # fmt: skip
    sb = evaluate_actions(enc, best)
    w_sel, w_plc = enc.head_weights()
    return -(w_sel * sb.logp_sel + w_plc * sb.logp_plc).mean()


def on_policy_nll(task: Task, enc, ro: Rollout) -> torch.Tensor:
    """Per-step negative log-likelihood of the best assignment's device for each op, in the states the
    greedy decode ``ro`` visited (DAgger for distillation): where the decode has left the best
    trajectory, the teacher-forced replay no longer shows the device head the states it meets. A
    makespan depends only on the assignment, so the best device of the op at hand is the label in
    any state."""
    sb = evaluate_actions(enc, ro)
    label = torch.from_numpy(task.best_assignment[ro.order[0]]).to(sb.plc_logp.device)
    return -sb.plc_logp[0].gather(1, label.unsqueeze(1)).mean()


def advantages(cost: np.ndarray, task: Task, cfg: TrainConfig) -> np.ndarray:
    """Advantage (higher is better) of each episode's normalised makespan ``cost``, divided by the batch's
    standard deviation."""
    if cfg.baseline == "running":
        if task.baseline is None:
            task.baseline = float(cost.mean())
        adv = task.baseline - cost
        task.baseline = RUNNING_DECAY * task.baseline + (1 - RUNNING_DECAY) * float(cost.mean())
    elif cfg.baseline == "mean":
        adv = cost.mean() - cost
    else:  # leave-one-out mean of the other B - 1 episodes
        adv = (cost.sum() - cost) / (cost.size - 1) - cost
    if adv.size > 1:
        adv = adv / (adv.std() + 1e-8)
    return adv


def policy_gradient_loss(task: Task, enc, ro: Rollout, adv: torch.Tensor, cfg: TrainConfig) -> dict[str, Any]:
    """Policy-gradient loss of a scored batch: per-step log-likelihoods weighted by the episode's
    advantage, minus the entropy bonus, plus the self-improvement term. Returns ``loss`` and its
    detached parts (``loss_pg``, ``entropy_sel``, ``entropy_plc``, ``loss_self``)."""
    sc = evaluate_actions(enc, ro)
    w_sel, w_plc = enc.head_weights()  # a head that follows a fixed rule is not trained
    logp = w_sel * sc.logp_sel + w_plc * sc.logp_plc  # [B, n]
    loss_pg = -(adv.unsqueeze(1) * logp).mean()
    ent_sel, ent_plc = sc.entropy_sel.mean(), sc.entropy_plc.mean()
    loss = loss_pg - cfg.entropy_coef * (w_sel * ent_sel + w_plc * ent_plc)
    loss_self = torch.zeros(())
    if cfg.self_improve_coef > 0:
        loss_self = best_nll(task, enc)
        loss = loss + cfg.self_improve_coef * loss_self
    return {"loss": loss, "loss_pg": loss_pg.detach(), "entropy_sel": ent_sel.detach(),
            "entropy_plc": ent_plc.detach(), "loss_self": loss_self.detach()}  # fmt: skip
