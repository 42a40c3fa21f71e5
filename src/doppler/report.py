"""Figures: Gantt charts of simulated (or executed) traces.

Plotting only: every number shown comes from a :class:`~doppler.trace.Trace`
(the critical path from :meth:`Trace.critical_path`). matplotlib runs on the
Agg backend and files are written atomically (rendered to memory, then
``io_util.atomic_write_bytes``), so an interrupted run never leaves half a PNG.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from doppler.graph import DataflowGraph, OpKind
from doppler.io_util import atomic_write_bytes

if TYPE_CHECKING:  # pragma: no cover
    from doppler.hardware import Cluster
    from doppler.sim import SimResult
    from doppler.trace import Trace

class FigureFormatError(ValueError):
    """A figure path whose extension matplotlib cannot write; the message names the path and the formats."""


def figure_format(path: str | Path) -> str:
    """The image format of ``path`` from its extension (none: png); FigureFormatError if unsupported."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backend_bases import FigureCanvasBase

    fmt = Path(path).suffix.lstrip(".").lower() or "png"
    supported = FigureCanvasBase.get_supported_filetypes()
    if fmt not in supported:
        raise FigureFormatError(f"{path}: cannot draw a .{fmt} image (use one of: {', '.join(sorted(supported))})")
    return fmt


def save_figure(fig: Any, path: str | Path, dpi: int | None = None) -> None:
    """Render ``fig`` in the format of ``path``'s extension, write it atomically, close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format=figure_format(path), dpi=dpi)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


# one stable colour per op kind (colour-blind-friendly Okabe-Ito first, then tab20)
_KIND_COLOURS: dict[int, str] = {
    OpKind.MATMUL: "#0072B2",
    OpKind.ADD: "#E69F00",
    OpKind.ELEMENTWISE: "#009E73",
    OpKind.SOFTMAX: "#CC79A7",
    OpKind.NORM: "#56B4E9",
    OpKind.ROTARY: "#D55E00",
    OpKind.MASK_FILL: "#F0E442",
    OpKind.SELECT: "#8c564b",
    OpKind.REDUCE: "#7f7f7f",
    OpKind.INPUT: "#c7c7c7",
    OpKind.FORMATION: "#9edae5",
    OpKind.COMPLEXER: "#c5b0d5",
    OpKind.SQUEEZER: "#dbdb8d",
    OpKind.FILL: "#ffbb78",
    OpKind.EINSUMMABLE: "#1f77b4",
    OpKind.UNKNOWN: "#aec7e8",
}


def kind_colour(kind: int) -> str:
    return _KIND_COLOURS.get(int(kind), "#999999")


def time_unit(span_s: float, cluster: "Cluster | None" = None) -> tuple[float, str]:
    """(scale, label) so that span_s * scale is a readable number; ``(1, "units")`` on a unit-cost cluster."""
    if cluster is not None and cluster.unit_cost:
        return 1.0, "units"
    if span_s <= 0:
        return 1.0, "s"
    for scale, label in ((1.0, "s"), (1e3, "ms"), (1e6, "µs"), (1e9, "ns")):
        if span_s * scale >= 1.0:
            return scale, label
    return 1e9, "ns"


def format_time(x: float, cluster: "Cluster | None" = None) -> str:
    """``0.0123`` -> ``"12.3 ms"``; on a unit-cost cluster (times are cost units) ``"12.3 units"``."""
    scale, unit = time_unit(abs(x), cluster)
    return f"{x * scale:.{6 if unit == 'units' else 4}g} {unit}"


def format_bytes(x: float) -> str:
    """``1.6e10`` -> ``"16 GB"`` (decimal units); ``inf`` -> ``"unlimited"``."""
    if not np.isfinite(x):
        return "unlimited"
    for scale, label in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {label}"
    return f"{x:.0f} B"


def memory_overruns(peak_bytes: np.ndarray, cluster: "Cluster") -> list[str]:
    """One phrase per device whose peak live bytes exceed its ``memory_bytes`` (empty when all fit)."""
    cap = cluster.memory_bytes
    return [f"{cluster.devices[d].name} holds {format_bytes(float(peak_bytes[d]))} at peak, more than its "
            f"{format_bytes(float(cap[d]))}" for d in np.flatnonzero(peak_bytes > cap)]  # fmt: skip


def _lanes(dev: np.ndarray, start: np.ndarray, end: np.ndarray, num_devices: int) -> tuple[np.ndarray, np.ndarray]:
    """Lane of every op inside its device row (ops that overlap in time go to different lanes)."""
    lane = np.zeros(dev.shape[0], dtype=np.int64)
    nlanes = np.ones(num_devices, dtype=np.int64)
    order = np.lexsort((np.arange(dev.shape[0]), start))
    free_at: list[list[float]] = [[] for _ in range(num_devices)]
    for v in order:
        d = int(dev[v])
        lanes = free_at[d]
        for i, t in enumerate(lanes):
            if t <= start[v]:
                lane[v] = i
                lanes[i] = end[v]
                break
        else:
            lane[v] = len(lanes)
            lanes.append(float(end[v]))
        nlanes[d] = max(nlanes[d], len(lanes))
    return lane, nlanes


def gantt(
    graph: DataflowGraph,
    cluster: "Cluster",
    result: "SimResult | Trace",
    path: str | Path,
    title: str | None = None,
    lower_bound_s: float | None = None,
    *,
    detail_ops: int = 2000,
    max_transfer_lines: int = 1500,
    dpi: int = 200,
) -> Path:
    """Draw a Gantt chart of ``result`` (a SimResult with a trace, or a Trace) to ``path``.

    One row per device (sub-lanes when a device runs several ops at once), ops
    coloured by kind, transfers as thin lines from the sender's row at their
    start to the receiver's row at their end, the critical path outlined in
    black (its transfers drawn as dark arrows), makespan and lower bound in
    the title and as vertical lines. The format follows the extension
    (``.png``, ``.pdf``, ``.svg``).

    Graphs of more than ``detail_ops`` ops (a 20k-op graph would be a black
    mass) are drawn for the big picture instead: bars without outlines, the
    critical path as one black thread through its ops, and at most
    ``max_transfer_lines`` transfers (a random sample, said in the legend).
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    trace = getattr(result, "trace", result)
    if trace is None:
        raise ValueError("gantt() needs a result simulated with trace=True")
    path = Path(path)
    lay = _GanttLayout.of(graph, cluster, trace)
    fig, ax = plt.subplots(figsize=(11.0, max(2.8, 0.55 * lay.num_devices + 1.9)), constrained_layout=True)
    detailed = trace.num_ops <= detail_ops
    kinds_present = _draw_ops(ax, graph, trace, lay, detailed)
    shown = _draw_transfers(ax, trace, lay, detailed, max_transfer_lines)
    _draw_frame(ax, graph, cluster, trace, lay, title, lower_bound_s)
    _legend(ax, kinds_present, len(shown), trace.num_transfers, len(lay.crit), detailed, lower_bound_s, lay.num_devices)
    save_figure(fig, path, dpi)
    return path


@dataclass
class _GanttLayout:
    """Where a Gantt chart puts things: the time scale, one band per device (split into lanes where
    a device runs several ops at once), each op's bar, and the critical path."""

    num_devices: int
    scale: float  # seconds -> display unit
    unit: str
    row_y: np.ndarray  # centre of device d's band (device 0 on top)
    op_y0: np.ndarray  # bottom of each op's bar
    lane_h: np.ndarray  # height of each op's lane
    crit: list[int]
    on_crit: np.ndarray

    @classmethod
    def of(cls, graph: DataflowGraph, cluster: "Cluster", trace: "Trace") -> "_GanttLayout":
        D, dev = cluster.num_devices, trace.op_device
        scale, unit = time_unit(trace.makespan_s, cluster)
        lane, nlanes = _lanes(dev, trace.op_start, trace.op_end, D)
        row_y = np.arange(D)[::-1].astype(float)
        band = 0.8
        lane_h = band / nlanes[dev]
        crit = trace.critical_path(graph)
        on_crit = np.zeros(trace.num_ops, dtype=bool)
        on_crit[crit] = True
        return cls(D, scale, unit, row_y, row_y[dev] - band / 2 + lane * lane_h, lane_h, crit, on_crit)

    def bars(self, trace: "Trace", mask: np.ndarray) -> list[np.ndarray]:
        """The rectangles of the ops in ``mask``."""
        idx = np.flatnonzero(mask)
        x0, x1 = trace.op_start[idx] * self.scale, trace.op_end[idx] * self.scale
        y0, y1 = self.op_y0[idx], self.op_y0[idx] + self.lane_h[idx] * 0.92
        return [np.array([[a, c], [b, c], [b, d_], [a, d_]]) for a, b, c, d_ in zip(x0, x1, y0, y1)]


def _draw_ops(ax: Any, graph: DataflowGraph, trace: "Trace", lay: _GanttLayout, detailed: bool) -> list[int]:
    """Op bars coloured by kind, the critical path outlined (or, on big graphs, one red thread through
    it); returns the op kinds drawn."""
    from matplotlib.collections import PolyCollection

    kinds_present = [int(k) for k in np.unique(graph.kind)]
    for k in kinds_present:
        m = graph.kind == k
        if not detailed:  # no outlines: at this density they would hide the bars
            ax.add_collection(PolyCollection(lay.bars(trace, m), facecolors=kind_colour(k), edgecolors="none", zorder=2))
            continue
        polys = lay.bars(trace, m & ~lay.on_crit)
        if polys:
            ax.add_collection(PolyCollection(polys, facecolors=kind_colour(k), edgecolors="white", linewidths=0.3, zorder=2))
        polys = lay.bars(trace, m & lay.on_crit)
        if polys:
            ax.add_collection(PolyCollection(polys, facecolors=kind_colour(k), edgecolors="black", linewidths=1.4, zorder=4))
    crit = lay.crit
    if not detailed and crit:
        # the critical path as one thread: along each op's bar, then to the next op's start
        cy = lay.op_y0[crit] + lay.lane_h[crit] * 0.46
        x0, x1 = trace.op_start[crit] * lay.scale, trace.op_end[crit] * lay.scale
        pts = np.stack([np.stack([x0, cy], 1), np.stack([x1, cy], 1)], 1).reshape(-1, 2)
        ax.plot(pts[:, 0], pts[:, 1], color="#C00000", lw=0.7, alpha=0.9, zorder=5, solid_capstyle="butt")
    return kinds_present


def _draw_transfers(ax: Any, trace: "Trace", lay: _GanttLayout, detailed: bool, max_lines: int) -> np.ndarray:
    """Transfers as lines from the sender's row at their start to the receiver's row at their end (a
    seeded sample of ``max_lines`` on big runs); the critical path's as arrows. Returns those drawn."""
    from matplotlib.collections import LineCollection

    ntr, dev, scale, row_y = trace.num_transfers, trace.op_device, lay.scale, lay.row_y
    crit = lay.crit
    crit_pairs = {(u, int(dev[v])) for u, v in zip(crit[:-1], crit[1:]) if dev[u] != dev[v]}
    shown = np.arange(ntr)
    if ntr > max_lines:
        shown = np.sort(np.random.default_rng(0).choice(ntr, max_lines, replace=False))
    if ntr:
        segs = np.stack(
            [
                np.stack([trace.tr_start[shown] * scale, row_y[trace.tr_src_device[shown]]], axis=1),
                np.stack([trace.tr_end[shown] * scale, row_y[trace.tr_dst_device[shown]]], axis=1),
            ],
            axis=1,
        )
        alpha = float(np.clip(30.0 / np.sqrt(max(len(shown), 1)), 0.12, 0.6))
        ax.add_collection(LineCollection(segs, colors="#555555", linewidths=0.6 if detailed else 0.3, alpha=alpha,
                                         zorder=3))  # fmt: skip
    if ntr and detailed:
        for k in range(ntr):
            if (int(trace.tr_src_op[k]), int(trace.tr_dst_device[k])) in crit_pairs:
                ax.annotate(
                    "",
                    xy=(trace.tr_end[k] * scale, row_y[trace.tr_dst_device[k]]),
                    xytext=(trace.tr_start[k] * scale, row_y[trace.tr_src_device[k]]),
                    arrowprops=dict(arrowstyle="-|>", color="black", lw=1.3, shrinkA=0, shrinkB=0, mutation_scale=9),
                    zorder=5,
                )
    return shown


def _draw_frame(ax: Any, graph: DataflowGraph, cluster: "Cluster", trace: "Trace", lay: _GanttLayout,
                title: str | None, lower_bound_s: float | None) -> None:  # fmt: skip
    """Makespan and lower-bound lines, each device's busy share, the axes and the two-line title."""
    makespan, scale, D = trace.makespan_s, lay.scale, lay.num_devices
    ax.axvline(makespan * scale, color="black", lw=1.0, ls="-", zorder=1)
    if lower_bound_s is not None and lower_bound_s > 0:
        ax.axvline(lower_bound_s * scale, color="#D55E00", lw=1.0, ls="--", zorder=1)
    util = trace.utilisation(cluster)
    x_max = makespan * scale * 1.001 if makespan > 0 else 1.0
    ax.text(1.005, 1.0, "busy", transform=ax.transAxes, va="bottom", ha="left", fontsize=8, color="#333333")
    for d in range(D):
        ax.text(1.005, (lay.row_y[d] + 0.5) / D, f"{100 * util[d]:.0f}%", transform=ax.transAxes, va="center", ha="left", fontsize=8, color="#333333")
    ax.set_xlim(0, x_max)
    ax.set_ylim(-0.6, D - 0.4)
    ax.set_yticks(lay.row_y)
    ax.set_yticklabels([f"{dv.name}" + (f" ×{dv.streams}" if dv.streams > 1 else "") for dv in cluster.devices], fontsize=9)
    ax.set_xlabel(f"time ({lay.unit})")
    ax.grid(axis="x", color="#dddddd", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    mode = getattr(trace, "mode", "wc").upper()
    head = title or f"{graph.name} on {cluster.name}"
    sub = f"{mode} · {trace.num_ops} ops · {trace.num_transfers} transfers · makespan {format_time(makespan, cluster)}"
    if lower_bound_s is not None and lower_bound_s > 0:
        sub += f" · lower bound {format_time(lower_bound_s, cluster)} ({makespan / lower_bound_s:.2f}×)"
    ax.set_title(f"{head}\n{sub}", fontsize=10, loc="left")


def _legend(ax: Any, kinds_present: list[int], shown: int, ntr: int, crit_ops: int, detailed: bool,
            lower_bound_s: float | None, num_devices: int) -> None:  # fmt: skip
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = [Patch(facecolor=kind_colour(k), edgecolor="none", label=OpKind(k).label) for k in kinds_present]
    sampled = f" ({shown} of {ntr} shown)" if shown < ntr else ""
    handles.append(Line2D([], [], color="#555555", lw=0.8, label="transfer" + sampled))
    if detailed:
        handles.append(Patch(facecolor="white", edgecolor="black", lw=1.4, label="critical path"))
    else:
        handles.append(Line2D([], [], color="#C00000", lw=0.9, label=f"critical path ({crit_ops} ops)"))
    handles.append(Line2D([], [], color="black", lw=1.0, label="makespan"))
    if lower_bound_s is not None and lower_bound_s > 0:
        handles.append(Line2D([], [], color="#D55E00", lw=1.0, ls="--", label="lower bound"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.16 if num_devices > 2 else -0.3),
              ncol=min(len(handles), 9), fontsize=8, frameon=False)  # fmt: skip


# ------------------------------------------------------------------ graph pictures
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

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


# ------------------------------------------------------------------ tables
def comparison_table(rows: list[Any], title: str, cluster: "Cluster | None" = None) -> "Any":
    """A rich table of :func:`doppler.methods.compare` rows (``CompareRow``); the best makespan in
    bold green, peak memory (largest over devices) in red where some device's peak exceeds its memory."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    table.add_column("method")
    for col in ("makespan", "/ lower bound", "/ critical_path", "peak memory", "assign time (s)"):
        table.add_column(col, justify="right")
    best = min(r.makespan_s for r in rows)
    for r in rows:
        peak = max(r.peak_memory_bytes)
        table.add_row(
            r.method,
            format_time(r.makespan_s, cluster),
            f"{r.ratio_to_lower_bound:.3f}" if r.ratio_to_lower_bound is not None else "-",
            f"{r.ratio_to_critical_path:.3f}" if r.ratio_to_critical_path is not None else "-",
            Text(f"{format_bytes(peak)} (over)", style="red") if r.memory_overruns else format_bytes(peak),
            f"{r.assign_time_s:.3f}",
            style="bold green" if r.makespan_s == best else None,
        )
    return table



# ------------------------------------------------------------------ training curves
def training_curve(
    history: list[dict[str, float]],
    path: str | Path,
    *,
    title: str = "DOPPLER training",
    references: dict[str, float] | None = None,
) -> None:
    """Plot a training run's history (``Trainer.history``): Stage I agreement with the
    teacher and Stage II mean / best makespan over the lower bound, with optional
    horizontal reference lines (e.g. ``{"critical_path": 1.39}`` as ratios)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    il = [h for h in history if h.get("stage_il")]
    rl = [h for h in history if not h.get("stage_il") and not h.get("stage_distill") and not h.get("stage_real")]
    distill = [h for h in history if h.get("stage_distill")]
    real = [h for h in history if h.get("stage_real")]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ax = axes[0]
    if il:
        x = [h["episode"] for h in il]
        ax.plot(x, [h["agree_sel"] for h in il], label="SEL agrees with teacher")
        ax.plot(x, [h["agree_plc"] for h in il], label="PLC agrees with teacher")
        ax.set_ylim(0, 1.02)
        ax.legend(frameon=False, loc="lower right")
    ax.set_title("Stage I: imitation")
    ax.set_xlabel("episodes")
    ax = axes[1]
    if rl:
        x = [h["episode"] for h in rl]
        ax.plot(x, [h["mean_ratio"] for h in rl], label="batch mean (sampled)", alpha=0.8)
        ax.plot(x, [h["best_ratio"] for h in rl], label="best so far")
        if "greedy_ratio" in rl[-1]:
            ax.plot(x, [h["greedy_ratio"] for h in rl], label="greedy decode", alpha=0.8)
        if distill:
            end = x[-1]
            ax.plot([end + i + 1 for i in range(len(distill))], [h["greedy_ratio"] for h in distill],
                    label=f"greedy during distillation ({len(distill)} updates)")  # fmt: skip
    if real:
        start = (rl[-1]["episode"] if rl else 0) + len(distill)
        ax.plot([start + h["episode"] for h in real], [h["mean_ratio"] for h in real], "o-", ms=3,
                label="Stage III: measured on the engine (batch mean)")  # fmt: skip
    for i, (name, value) in enumerate((references or {}).items()):
        ax.axhline(value, ls="--", lw=1, color=f"C{i + 3}", label=name)
    ax.set_title("Stage II: simulator RL" + (" / Stage III: real system" if real else ""))
    ax.set_xlabel("episodes")
    ax.set_ylabel("makespan / lower bound")
    ax.legend(frameon=False, fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, 110)


def fine_tuning_curve(
    histories: dict[str, list[dict[str, float]]], path: str | Path, *, reference: float | None = None,
    title: str = "fine-tuning",
) -> None:  # fmt: skip
    """Greedy makespan over the lower bound against Stage II episodes, one line per run (e.g. from the
    pretrained policy and from scratch), with an optional reference line (anneal's ratio). Where the
    run distilled, a dot at the end marks the greedy decode it kept: the best one distillation passed
    through, or the one before it (:meth:`doppler.train.Trainer.run`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, (name, history) in enumerate(histories.items()):
        rl = [h for h in history if not h.get("stage_il") and not h.get("stage_distill") and "greedy_ratio" in h]
        (line,) = ax.plot([h["episode"] for h in rl], [h["greedy_ratio"] for h in rl], label=name)
        distilled = [h for h in history if h.get("stage_distill") and "greedy_ratio" in h]
        if rl and distilled:
            kept = min(h["greedy_ratio"] for h in distilled)  # the first is the decode before distillation
            ax.plot([rl[-1]["episode"]], [kept], "os^D"[i % 4], color=line.get_color(), mfc="none", ms=8, mew=1.5)
    if reference is not None:
        ax.axhline(reference, ls="--", lw=1, color="gray", label="anneal 60 s")
    ax.set_xlabel("Stage II episodes")
    ax.set_ylabel("greedy makespan / lower bound")
    ax.set_title(title)
    ax.legend(frameon=False)
    fig.tight_layout()
    save_figure(fig, path, 110)


def held_out_chart(
    rows: list[dict[str, Any]], columns: dict[str, str], path: str | Path, *, title: str = "held-out pairs",
) -> None:  # fmt: skip
    """One group of horizontal bars per row (a (graph, cluster) pair), one bar per column: each value is
    a makespan over the row's best cheap method, so the line at 1 is that method and shorter is better.
    ``columns`` maps a row's key to its legend label; a value may be a number or ``[mean, spread]``
    (drawn with the spread as an error bar); a missing value leaves its bar out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(columns)
    height = 0.8 / max(len(keys), 1)
    fig, ax = plt.subplots(figsize=(7.5, 0.14 * len(keys) * len(rows) + 1.6))
    lo = np.inf  # the shortest bar: the x axis starts just below it
    for j, key in enumerate(keys):
        ys, xs, errs = [], [], []
        for i, row in enumerate(rows):
            v = row.get(key)
            if v is None:
                continue
            mean, spread = (float(v[0]), float(v[1])) if isinstance(v, (list, tuple)) else (float(v), 0.0)
            ys.append(i + (j - (len(keys) - 1) / 2) * height)
            xs.append(mean)
            errs.append(spread / 2)
            lo = min(lo, mean)
        ax.barh(ys, xs, height=height, xerr=errs if any(errs) else None, label=columns[key],
                color=f"C{j}", error_kw={"lw": 0.8})  # fmt: skip
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([str(r["name"]) for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(max(0.0, (lo if np.isfinite(lo) else 1.0) - 0.05), None)
    ax.set_xlabel("makespan / best cheap method (lower is better)")
    ax.set_title(title, pad=15 * (1 + (len(keys) - 1) // 3) + 10)
    ax.legend(frameon=False, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(keys), 3))
    fig.tight_layout()
    save_figure(fig, path, 110)
