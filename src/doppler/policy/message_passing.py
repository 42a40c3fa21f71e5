"""Message passing over a graph's edges, as PyG's ``MessagePassing.propagate`` does it: every edge
``j -> i`` carries a message made from ``x_j``, and node ``i`` receives the sum (or the mean) of its
incoming messages. DOPPLER's edge-conditioned conv, GDP's GraphSAGE layers and PLACETO's parent and
child aggregation all run on :func:`propagate`, with torch's ``index_select`` and ``index_add``
(summed in edge order: one graph gives the same numbers every run)."""

from __future__ import annotations

from collections.abc import Callable

import torch

AGGREGATIONS = ("add", "mean")


def propagate(x: torch.Tensor, edge_index: torch.Tensor | tuple[torch.Tensor, torch.Tensor], *,
              message: Callable[[torch.Tensor], torch.Tensor] | None = None, aggr: str = "add", dim: int = 0,
              into: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """For every node ``i`` (an index of ``x`` along ``dim``) the ``aggr`` of ``message(x_j)`` over the
    edges ``j -> i`` of ``edge_index`` (sources first, then destinations: ``[2, E]`` or a pair).

    ``message`` maps the gathered ``x_j`` (``x`` with ``E`` rows along ``dim``) to the messages (same
    length along ``dim``; default: ``x_j`` itself). ``aggr``: ``"add"`` or ``"mean"`` (a node without
    incoming edges gets zero). ``into``: with ``"add"``, the sums are added to this tensor (not changed
    in place), one edge at a time, so that several message kinds accumulate as one sum would."""
    if aggr not in AGGREGATIONS:
        raise ValueError(f"aggr must be one of {', '.join(AGGREGATIONS)}, got {aggr!r}")
    if into is not None and aggr != "add":
        raise ValueError(f"into= accumulates sums: aggr must be add, got {aggr!r}")
    src, dst = edge_index[0], edge_index[1]
    msg = x.index_select(dim, src)
    if message is not None:
        msg = message(msg)
    if into is not None:
        return into.index_add(dim, dst, msg)
    shape = list(msg.shape)
    shape[dim] = x.shape[dim]
    out = msg.new_zeros(shape).index_add_(dim, dst, msg)
    if aggr == "mean":
        per_node = [1] * out.ndim
        per_node[dim] = -1
        out = out / degree(dst, x.shape[dim], out).view(per_node)
    return out


def degree(index: torch.Tensor, num_nodes: int, like: torch.Tensor) -> torch.Tensor:
    """``[num_nodes]``: how often each node occurs in ``index``, at least 1 (so that a mean divides by
    it), in ``like``'s dtype and device."""
    count = torch.zeros(num_nodes, dtype=like.dtype, device=like.device)
    return count.index_add_(0, index, like.new_ones(index.shape[0])).clamp(min=1.0)

