"""The policy's networks: the factorised edge-conditioned convolution against PyG's
NNConv with mapped weights, and the shapes / determinism of DopplerPolicy.encode."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from doppler import cluster, workloads
from doppler.listsched import NUM_DEVICE_FEATURES
from doppler.policy.features import graph_features
from doppler.policy import networks
from doppler.policy.networks import LEAK, DopplerPolicy, EdgeConditionedConv


def _mapped_pair(channels: int, edge_dim: int, basis: int, edge_hidden: int, aggr: str, seed: int):
    """Our conv with random weights, and an NNConv carrying the same function (PyG: the dev extra)."""
    NNConv = pytest.importorskip("torch_geometric.nn").NNConv
    torch.manual_seed(seed)
    ours = EdgeConditionedConv(channels, edge_dim, basis=basis, edge_hidden=edge_hidden, aggr=aggr).double()
    edge_mlp = copy.deepcopy(ours.edge_mlp)
    last = nn.Linear(basis, channels * channels).double()
    ref = NNConv(channels, channels, nn=nn.Sequential(*edge_mlp, last), aggr=aggr).double()
    # NNConv's reset_parameters re-initialises its nn: copy our edge MLP back, then draw A and c
    for k, layer in enumerate(ours.edge_mlp):
        ref.nn[k].load_state_dict(layer.state_dict())
    C = channels
    with torch.no_grad():
        A = torch.randn(C * C, basis, dtype=torch.float64) * 0.3
        c = torch.randn(C * C, dtype=torch.float64) * 0.3
        ref.nn[-1].weight.copy_(A)
        ref.nn[-1].bias.copy_(c)
        # W(e)[i, o] = sum_k A[i*C + o, k] a_k(e) + c[i*C + o]; ours: basis.weight[k*C + o, i]
        w = torch.empty((basis + 1) * C, C, dtype=torch.float64)
        for k in range(basis + 1):
            for o in range(C):
                for i in range(C):
                    w[k * C + o, i] = A[i * C + o, k] if k < basis else c[i * C + o]
        ours.basis.weight.copy_(w)
        ref.lin.weight.copy_(ours.root.weight)
        ref.bias.copy_(ours.root.bias)
    return ours, ref


def _random_graph(num_nodes: int, num_edges: int, edge_dim: int, channels: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    dst = torch.randint(1, num_nodes, (num_edges,), generator=g)  # node 0 receives nothing
    x = torch.randn(num_nodes, channels, generator=g, dtype=torch.float64)
    e = torch.rand(num_edges, edge_dim, generator=g, dtype=torch.float64)
    return x, torch.stack([src, dst]), e


@pytest.mark.parametrize("per_basis", [False, True])
@pytest.mark.parametrize("aggr", ["mean", "add"])
@pytest.mark.parametrize("channels,basis", [(6, 3), (5, 1)])
def test_edge_conditioned_conv_equals_nnconv(aggr, channels, basis, per_basis, monkeypatch):
    if per_basis:  # the large-graph path: one basis matrix at a time
        monkeypatch.setattr(networks, "GATHER_ALL_MAX_BYTES", 0)
    ours, ref = _mapped_pair(channels, edge_dim=2, basis=basis, edge_hidden=7, aggr=aggr, seed=channels + basis)
    x, ei, ea = _random_graph(num_nodes=9, num_edges=23, edge_dim=2, channels=channels, seed=3)
    got = ours(x, ei, ea)
    want = ref(x, ei, ea)
    assert got.shape == (9, channels)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # node 0 has no incoming edges: only the root term
    torch.testing.assert_close(got[0], ours.root(x[0]))
    # the messages matter: dropping an edge changes the result of its target
    got2 = ours(x, ei[:, 1:], ea[1:])
    assert not torch.allclose(got2[ei[1, 0]], got[ei[1, 0]])


@pytest.mark.parametrize("per_basis", [False, True])
def test_edge_conditioned_conv_gradients_match_nnconv(per_basis, monkeypatch):
    if per_basis:
        monkeypatch.setattr(networks, "GATHER_ALL_MAX_BYTES", 0)
    ours, ref = _mapped_pair(4, edge_dim=2, basis=2, edge_hidden=5, aggr="mean", seed=0)
    x, ei, ea = _random_graph(num_nodes=6, num_edges=12, edge_dim=2, channels=4, seed=1)
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    (ours(xa, ei, ea) ** 2).sum().backward()
    (ref(xb, ei, ea) ** 2).sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-10)
    # and the shared edge-MLP parameters get the same gradient
    torch.testing.assert_close(ours.edge_mlp[0].weight.grad, ref.nn[0].weight.grad, rtol=1e-9, atol=1e-10)


def test_leak_is_a_small_positive_slope():
    assert 0 < LEAK < 1


CFG = {"hidden": 16, "steps": 3, "mlp_hidden": 24, "basis": 3}


@pytest.mark.parametrize("graph", [("random", {"num_ops": 40, "seed": 1}), ("ffnn", {})], ids=["random40", "ffnn"])
def test_encode_shapes_finite_and_deterministic(graph):
    name, params = graph
    g = workloads.build(name, **params)
    gf = graph_features(g, cluster("p100x4"))
    torch.manual_seed(0)
    policy = DopplerPolicy(**CFG)
    assert policy.config == {**CFG, "op_features": "full", "learned": "both", "list_schedule": "critical_path"}
    n, m_hidden = g.num_ops, CFG["mlp_hidden"]
    with torch.no_grad():
        enc = policy.encode(gf)
        enc2 = policy.encode(gf)
    shapes = {
        "sel_score": (n,),
        "plc_op": (n, m_hidden),
        "plc_placed": (n, m_hidden + policy.plc.affinity),
        "plc_query": (n, policy.plc.affinity),
        "plc_dev": (NUM_DEVICE_FEATURES, m_hidden),
        "plc_w_out": (m_hidden,),
        "plc_b_out": (),
    }
    for field, shape in shapes.items():
        a, b = getattr(enc, field), getattr(enc2, field)
        assert tuple(a.shape) == shape, field
        assert torch.isfinite(a).all(), field
        assert torch.equal(a, b), f"{field} differs between two identical encodes"
    # op-dependent parts really depend on the op
    assert enc.sel_score.std() > 0 and enc.plc_op.std(dim=0).max() > 0
    # the folded device matrix and the placed part are what the docstring says
    torch.testing.assert_close(enc.plc_dev, (policy.plc.w_dev.weight @ policy.plc.dev_lin.weight).T)


def test_encode_two_graph_sizes_one_policy():
    torch.manual_seed(1)
    policy = DopplerPolicy(**CFG)
    small = graph_features(workloads.build("random", num_ops=20, seed=2), cluster("unit:3"))
    big = graph_features(workloads.build("random", num_ops=60, seed=2), cluster("unit:3"))
    with torch.no_grad():
        e_small, e_big = policy.encode(small), policy.encode(big)
    assert e_small.sel_score.shape == (20,) and e_big.sel_score.shape == (60,)
    width = CFG["mlp_hidden"] + policy.plc.affinity
    assert e_small.plc_placed.shape == (20, width) and e_big.plc_placed.shape == (60, width)
    # graph-independent parts are shared
    assert torch.equal(e_small.plc_dev, e_big.plc_dev)
    assert torch.equal(e_small.plc_w_out, e_big.plc_w_out) and torch.equal(e_small.plc_b_out, e_big.plc_b_out)
    # the placed part is [w_placed(H), aff_k(H)] / n, so it scales with the graph size
    h_small = policy.encoder(
        torch.from_numpy(small.op_x), torch.from_numpy(small.edge_index), torch.from_numpy(small.edge_attr)
    )
    want = torch.cat([policy.plc.w_placed(h_small), policy.plc.aff_k(h_small)], dim=1).detach() / 20
    torch.testing.assert_close(e_small.plc_placed, want)
    torch.testing.assert_close(e_small.plc_query, policy.plc.aff_q(h_small).detach())


def test_encode_is_differentiable():
    torch.manual_seed(2)
    policy = DopplerPolicy(**CFG)
    gf = graph_features(workloads.build("random", num_ops=20, seed=4), cluster("p100x4"))
    enc = policy.encode(gf)
    (enc.sel_score.sum() + enc.plc_op.sum() + enc.plc_placed.sum()).backward()
    grads = {name: p.grad for name, p in policy.named_parameters()}
    for name in ("encoder.embed.weight", "encoder.conv.basis.weight", "encoder.conv.edge_mlp.0.weight",
                 "encoder.gru.weight_ih", "sel.mlp.0.weight", "plc.w_emb.weight", "plc.w_placed.weight"):  # fmt: skip
        assert grads[name] is not None and grads[name].abs().sum() > 0, name
    assert np.isfinite(sum(float(g.abs().sum()) for g in grads.values() if g is not None))


def test_a_large_graphs_encoder_recomputes_its_rounds_with_the_same_outputs_and_gradients(monkeypatch):
    """Above CHECKPOINT_MIN_OPS ops the encoder holds only each round's input for the backward pass; its
    outputs and every parameter's gradient are those of the plain pass."""
    gf = graph_features(workloads.build("random", num_ops=60, seed=5), cluster("p100x4"))
    runs = []
    for min_ops in (10**9, 0):  # plain, then recomputed
        monkeypatch.setattr(networks, "CHECKPOINT_MIN_OPS", min_ops)
        torch.manual_seed(3)
        policy = DopplerPolicy(**CFG)
        enc = policy.encode(gf)
        (enc.sel_score.square().sum() + enc.plc_op.sum()).backward()
        runs.append((enc.sel_score.detach(), {k: p.grad.clone() for k, p in policy.named_parameters()
                                              if p.grad is not None}))  # fmt: skip
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    assert runs[0][1].keys() == runs[1][1].keys()
    for name, grad in runs[0][1].items():
        torch.testing.assert_close(grad, runs[1][1][name], rtol=1e-6, atol=1e-7, msg=name)
