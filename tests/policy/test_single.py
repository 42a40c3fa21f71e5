"""The single policy: one softmax over exactly the (candidate op, device) pairs of each step."""

from __future__ import annotations

import numpy as np
import torch

from doppler import workloads
from doppler.policy.features import graph_features
from doppler.policy.rollout import rollout
from doppler.policy.single import SinglePolicy
from doppler.hardware.presets import cluster


def _ready_ops(g, order: np.ndarray, h: int) -> set[int]:
    """The ops whose inputs are all placed before step h and that are not placed yet (from scratch)."""
    placed = set(order[:h].tolist())
    preds = {v: set(g.pred_idx[g.pred_ptr[v] : g.pred_ptr[v + 1]].tolist()) for v in range(g.num_ops)}
    return {v for v in range(g.num_ops) if v not in placed and preds[v] <= placed}


def test_the_action_space_is_exactly_the_candidate_device_pairs():
    g, c = workloads.build("random", num_ops=20, seed=2), cluster("p100x4")
    gf = graph_features(g, c)
    torch.manual_seed(0)
    dec = SinglePolicy(16, 2, 16).encode(gf)
    with torch.no_grad():
        ro = rollout(gf, dec, batch=2, mode="sample", rng=np.random.default_rng(1))
        pair, cs = dec.pair_logits(ro)
        sc = dec.score(ro)
    n = g.num_ops
    assert pair.shape[1] == c.num_devices
    for b in range(2):
        for h in range(n):
            rows = cs.seg == b * n + h
            assert set(cs.op[rows].tolist()) == _ready_ops(g, ro.order[b], h)  # the candidates, each once
            assert rows.sum() == len(_ready_ops(g, ro.order[b], h))
            joint = torch.log_softmax(pair[torch.from_numpy(rows)].flatten(), 0)  # one softmax over all pairs
            assert abs(float(torch.logsumexp(joint, 0))) < 1e-5
            k = int(np.flatnonzero(cs.op[rows] == ro.order[b, h])[0])
            taken = joint[k * c.num_devices + ro.step_device[b, h]]
            # the loop's two factors are exactly the pair's probability
            assert abs(float(sc.logp_sel[b, h] + sc.logp_plc[b, h] - taken)) < 1e-4


def test_the_greedy_decode_takes_the_best_pair():
    g, c = workloads.build("random", num_ops=20, seed=2), cluster("p100x4")
    gf = graph_features(g, c)
    torch.manual_seed(3)
    dec = SinglePolicy(16, 2, 16).encode(gf)
    with torch.no_grad():
        ro = rollout(gf, dec, batch=1, mode="greedy")
        pair, cs = dec.pair_logits(ro)
    for h in range(g.num_ops):
        rows = np.flatnonzero(cs.seg == h)
        best = int(torch.argmax(pair[torch.from_numpy(rows)].flatten()))
        assert (cs.op[rows[best // c.num_devices]], best % c.num_devices) == (ro.order[0, h], ro.step_device[0, h])
