"""Pictures of a graph: ops laid out by topological level, coloured by kind, sized by FLOPs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from doppler.ir.graph import DataflowGraph, OpKind
from doppler.report.figures import kind_colour, pyplot, save_figure


def layered_positions(graph: DataflowGraph, sweeps: int = 4) -> np.ndarray:
    """(x, y) per op: x = topological level, y = rank inside the level after barycentre sweeps."""
    n = graph.num_ops
    level = graph.level.copy()
    # sources (inputs, weights-only ops) sit just before their first consumer
    first_use = np.full(n, graph.depth, dtype=np.int64)
    np.minimum.at(first_use, graph.src, level[graph.dst])
    sources = (graph.in_degree() == 0) & (graph.out_degree() > 0)
    level[sources] = first_use[sources] - 1
    depth = int(level.max()) + 1
    x = level.astype(np.float64)
    y = np.zeros(n)
    for d in range(depth):
        ops = np.flatnonzero(level == d)
        y[ops] = np.arange(ops.size)
    width = np.bincount(level)
    for sweep in range(sweeps):
        forward = sweep % 2 == 0
        ends, others = (graph.dst, graph.src) if forward else (graph.src, graph.dst)
        sums = np.bincount(ends, weights=y[others], minlength=n)
        counts = np.bincount(ends, minlength=n)
        bary = np.where(counts > 0, sums / np.maximum(counts, 1), y)
        levels = range(1, depth) if forward else range(depth - 2, -1, -1)
        for d in levels:
            ops = np.flatnonzero(level == d)
            y[ops[np.argsort(bary[ops], kind="stable")]] = np.arange(ops.size)
    # centre each level vertically
    y = y - (width[level] - 1) / 2.0
    return np.stack([x, y], axis=1)


def draw_graph(graph: DataflowGraph, path: str | Path, title: str | None = None) -> None:
    """Write a PNG of ``graph`` (atomically)."""
    from matplotlib.collections import LineCollection

    plt = pyplot()
    pos = layered_positions(graph)
    max_width = int(np.bincount(pos[:, 0].astype(np.int64)).max())
    fig_w = min(40.0, max(8.0, 0.35 * graph.depth + 3))
    fig_h = min(40.0, max(5.0, 0.12 * max_width + 2.5))
    fig, ax = plt.subplots(figsize=(fig_w, fig_h), dpi=120)
    segments = np.stack([pos[graph.src], pos[graph.dst]], axis=1)
    ax.add_collection(LineCollection(segments, colors="#555555", linewidths=0.4, alpha=0.35, zorder=1))
    flops = graph.flops
    positive = flops[flops > 0]
    scale = np.log1p(flops / positive.mean()) if positive.size else np.zeros_like(flops)
    sizes = 12 + 80 * scale / max(scale.max(), 1e-12)
    present = sorted({int(k) for k in graph.kind})
    for code in present:
        mask = graph.kind == code
        kind = OpKind(code)
        ax.scatter(pos[mask, 0], pos[mask, 1], s=sizes[mask], c=kind_colour(code), label=f"{kind.label} ({mask.sum()})",
                   edgecolors="black", linewidths=0.3, zorder=2)
    ax.set_xlabel("topological level")
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"{graph.name}: {graph.num_ops} ops, {graph.num_edges} edges, depth {graph.depth} "
                 f"(marker area ~ log FLOPs)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, title="op kind")
    ax.autoscale_view()
    fig.tight_layout()
    save_figure(fig, path)
