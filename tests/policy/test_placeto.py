"""PLACETO: a fixed op order, and an embedding that is re-run after every placement."""

from __future__ import annotations

import networkx as nx
import numpy as np
import torch

from doppler import workloads
from doppler.policy.decode import rule_order
from doppler.policy.features import graph_features
from doppler.policy.placeto import PlacetoPolicy, reachability
from doppler.policy.rollout import rollout
from doppler.hardware.presets import cluster


def _setup():
    g, c = workloads.build("random", num_ops=24, seed=6), cluster("p100x4")
    torch.manual_seed(0)
    return g, graph_features(g, c), PlacetoPolicy(4, hidden=16, steps=2, mlp_hidden=16)


def test_the_logits_of_a_later_step_change_when_an_earlier_placement_changes():
    g, gf, policy = _setup()
    dec = policy.encode(gf)
    order = rule_order(gf)
    h = g.num_ops - 1
    last = torch.tensor([order[h]])
    placed = torch.full((1, g.num_ops), -1, dtype=torch.int64)
    placed[0, torch.from_numpy(order[:h])] = 0
    with torch.no_grad():
        before = policy.state_logits(dec, placed, last)
        for first in order[:3]:  # move one early op, far from the last one or not
            moved = placed.clone()
            moved[0, first] = 2
            after = policy.state_logits(dec, moved, last)
            assert not torch.allclose(before, after)  # the whole graph was embedded again


def test_the_order_is_fixed_and_only_devices_are_sampled():
    g, gf, policy = _setup()
    dec = policy.encode(gf)
    with torch.no_grad():
        ro = rollout(gf, dec, batch=4, mode="sample", rng=np.random.default_rng(0))
    assert (ro.order == rule_order(gf)[None, :]).all()
    assert len({tuple(a) for a in ro.assignment}) > 1
    assert dec.head_weights() == (0.0, 1.0)


def test_reachability_matches_networkx():
    g, gf, _ = _setup()
    anc = reachability(g, rule_order(gf))
    dg = nx.DiGraph(list(zip(g.src.tolist(), g.dst.tolist())))
    dg.add_nodes_from(range(g.num_ops))
    for v in range(g.num_ops):
        assert set(np.flatnonzero(anc[v]).tolist()) == nx.ancestors(dg, v)
