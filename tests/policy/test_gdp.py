"""GDP: every op's device in one shot, from a GraphSAGE + transformer encoding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from doppler import workloads
from doppler.policy.decode import rule_order
from doppler.policy.features import graph_features
from doppler.policy.gdp import GdpPolicy, SageConv
from doppler.policy.rollout import evaluate_actions, rollout
from doppler.hardware.presets import cluster


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


@pytest.mark.parametrize("seed", [0, 1])
def test_the_graphsage_layer_is_pygs_sageconv(seed):
    """The same initial weights from the same seed, the same names (a checkpoint of either loads into the
    other), the same outputs and gradients (PyG: the dev extra)."""
    SAGEConv = pytest.importorskip("torch_geometric.nn").SAGEConv
    torch.manual_seed(seed)
    ref = SAGEConv(8, 8)
    torch.manual_seed(seed)
    ours = SageConv(8)
    theirs = ref.state_dict()
    assert list(ours.state_dict()) == list(theirs)
    for name, w in ours.state_dict().items():
        assert torch.equal(w, theirs[name]), name
    ours.load_state_dict(theirs)  # (strict: no name missing on either side)
    ref.load_state_dict(ours.state_dict())
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, 8, generator=g)
    edge_index = torch.cat([torch.randint(0, 10, (2, 30), generator=g), torch.tensor([[3, 3], [4, 4]])], 1)  # a repeated
    # edge; nodes 10 and 11 receive nothing
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    out_ours, out_ref = ours(xs[0], edge_index), ref(xs[1], edge_index)
    torch.testing.assert_close(out_ours, out_ref)
    (out_ours**2).sum().backward()
    (out_ref**2).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
