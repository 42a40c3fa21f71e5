"""propagate: each node receives the sum or the mean of its incoming edges' messages, as a dense
adjacency product computes them."""

from __future__ import annotations

import pytest
import torch

from doppler.policy.message_passing import degree, propagate


def _graph(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n, e = 7, 15
    edge_index = torch.randint(0, n - 1, (2, e), generator=g)  # node n - 1 receives nothing
    x = torch.randn(n, 3, dtype=torch.float64, generator=g)
    adj = torch.zeros(n, n, dtype=torch.float64)
    adj.index_put_((edge_index[1], edge_index[0]), torch.ones(e, dtype=torch.float64), accumulate=True)
    return x, edge_index, adj  # adj[i, j]: how many edges j -> i


def test_sums_and_means_are_the_adjacency_products():
    x, edge_index, adj = _graph()
    torch.testing.assert_close(propagate(x, edge_index), adj @ x)
    mean = propagate(x, edge_index, aggr="mean")
    torch.testing.assert_close(mean, adj @ x / adj.sum(1, keepdim=True).clamp(min=1))
    assert (mean[-1] == 0).all()  # no incoming edge: zero
    torch.testing.assert_close(degree(edge_index[1], 7, x), adj.sum(1).clamp(min=1))


def test_messages_a_batch_dimension_and_accumulation():
    x, edge_index, adj = _graph(1)
    scale = torch.arange(edge_index.shape[1], dtype=x.dtype).unsqueeze(1)
    weighted = torch.zeros_like(adj).index_put_((edge_index[1], edge_index[0]), scale.squeeze(1), accumulate=True)
    torch.testing.assert_close(propagate(x, edge_index, message=lambda x_j: x_j * scale), weighted @ x)
    batch = torch.stack([x, 2 * x])  # [S, n, F]: nodes along dim 1
    torch.testing.assert_close(propagate(batch, (edge_index[0], edge_index[1]), dim=1), torch.stack([adj @ x, 2 * adj @ x]))
    start = torch.ones_like(x)
    summed = propagate(x, edge_index, into=propagate(x, edge_index, into=start))
    torch.testing.assert_close(summed, 1 + 2 * adj @ x)
    assert (start == 1).all()  # into= is not changed in place


def test_gradients_flow_to_the_sources():
    x, edge_index, adj = _graph(2)
    x.requires_grad_(True)
    propagate(x, edge_index, aggr="mean").sum().backward()
    torch.testing.assert_close(x.grad, (adj / adj.sum(1, keepdim=True).clamp(min=1)).sum(0).unsqueeze(1).expand(-1, 3))


def test_an_unknown_aggregation_is_refused():
    x, edge_index, _ = _graph()
    with pytest.raises(ValueError, match="aggr must be one of add, mean, got 'max'"):
        propagate(x, edge_index, aggr="max")
    with pytest.raises(ValueError, match="into= accumulates sums"):
        propagate(x, edge_index, aggr="mean", into=torch.zeros_like(x))
