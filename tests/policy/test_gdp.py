"""GDP: every op's device in one shot, from a GraphSAGE + transformer encoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from doppler import workloads
from doppler.policy.decode import rule_order
from doppler.policy.features import graph_features
from doppler.policy.gdp import GdpPolicy
from doppler.policy.rollout import evaluate_actions, rollout
from doppler.presets import cluster


def test_every_op_gets_its_device_in_one_shot():
    g, c = workloads.build("random", num_ops=24, seed=6), cluster("p100x4")
    gf = graph_features(g, c)
    torch.manual_seed(0)
    dec = GdpPolicy(4, hidden=16, steps=2, mlp_hidden=16, heads=2).encode(gf)
    with torch.no_grad():
        greedy = rollout(gf, dec, batch=1, mode="greedy")
        sampled = rollout(gf, dec, batch=3, mode="sample", rng=np.random.default_rng(0))
        sc = evaluate_actions(dec, sampled)
    # the greedy device of each op is its own arg-max: no decision depends on another one's outcome
    np.testing.assert_array_equal(greedy.assignment[0], dec.logits.argmax(1).numpy())
    assert (sampled.order == rule_order(gf)[None, :]).all()
    # a sampled episode's log-likelihood is the sum of independent per-op terms
    per_op = torch.log_softmax(dec.logits, 1)
    for b in range(3):
        want = per_op[torch.arange(g.num_ops), torch.from_numpy(sampled.assignment[b])].sum()
        assert abs(float(sc.logp_plc[b].sum() - want)) < 1e-4


def test_a_cluster_of_another_device_count_is_refused():
    g = workloads.build("random", num_ops=10, seed=6)
    with pytest.raises(ValueError, match="4 device outputs; the cluster has 2"):
        GdpPolicy(4, hidden=16, steps=1, mlp_hidden=16, heads=2).encode(graph_features(g, cluster("p100x4:2")))
