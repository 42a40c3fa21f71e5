"""Gantt charts of simulated (or executed) traces.

Plotting only: every number shown comes from a :class:`~doppler.sim.trace.Trace` (the critical path
from :meth:`Trace.critical_path`). matplotlib is imported inside :func:`gantt`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from doppler.ir.graph import DataflowGraph, OpKind
from doppler.report.figures import kind_colour, pyplot, save_figure
from doppler.report.text import format_bytes, format_time, time_unit

if TYPE_CHECKING:  # pragma: no cover
    from doppler.hardware.cluster import Cluster
    from doppler.sim import SimResult
    from doppler.sim.trace import Trace


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
    memory_budget_bytes: np.ndarray | None = None,
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

    With ``memory_budget_bytes`` (per device; inf: unlimited), a second panel shows the bytes each device
    holds over time (its resident weights plus its live activations, :func:`memory_curves`) against its
    budget.
    """
    plt = pyplot()
    trace = getattr(result, "trace", result)
    if trace is None:
        raise ValueError("gantt() needs a result simulated with trace=True")
    path = Path(path)
    lay = _GanttLayout.of(graph, cluster, trace)
    height = max(2.8, 0.55 * lay.num_devices + 1.9)
    if memory_budget_bytes is None:
        fig, ax = plt.subplots(figsize=(11.0, height), constrained_layout=True)
    else:
        fig, (ax, mem_ax) = plt.subplots(2, 1, figsize=(11.0, height + 2.6), sharex=True, constrained_layout=True,
                                         gridspec_kw={"height_ratios": [height, 2.6]})  # fmt: skip
        _draw_memory(mem_ax, graph, cluster, trace, lay, np.asarray(memory_budget_bytes, dtype=np.float64))
        ax.tick_params(labelbottom=True)
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


def memory_curves(graph: DataflowGraph, trace: "Trace", num_devices: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per device, ``(times_s, bytes)``: the bytes it holds from each time on (a step function), its resident
    weights included (:meth:`Trace.activation_timeline`, :meth:`Trace.resident_bytes`): its highest point is
    the device's peak memory."""
    device, t, live = trace.activation_timeline(graph, num_devices)
    resident = trace.resident_bytes(graph, num_devices)
    return [(np.concatenate([[0.0], t[device == d]]), resident[d] + np.concatenate([[0.0], live[device == d]]))
            for d in range(num_devices)]  # fmt: skip


def _draw_memory(ax: Any, graph: DataflowGraph, cluster: "Cluster", trace: "Trace", lay: _GanttLayout,
                 budget: np.ndarray) -> None:  # fmt: skip
    """Each device's held bytes over time (GB), its budget as a dashed line of the same colour."""
    import matplotlib.pyplot as plt

    colours = plt.get_cmap("tab10")
    curves = memory_curves(graph, trace, lay.num_devices)
    top = 1.15 * max((float(held.max()) for _, held in curves), default=0.0) or 1.0
    shown = np.isfinite(budget) & (budget <= 2.0 * top)  # a budget far above every curve would flatten them
    for d, (t, held) in enumerate(curves):
        c = colours(d % 10)
        ax.step(np.append(t, trace.makespan_s) * lay.scale, np.append(held, held[-1]) / 1e9, where="post", lw=1.0,
                color=c, label=cluster.devices[d].name)  # fmt: skip
        if shown[d]:
            ax.axhline(budget[d] / 1e9, color=c, lw=0.8, ls="--")
    far = budget[np.isfinite(budget) & ~shown]
    note = "dashed: budget" if not far.size else f"budget {format_bytes(float(far.min()))}+ (above)"
    ax.set_ylabel("held (GB)")
    ax.set_xlabel(f"time ({lay.unit})")
    ax.grid(color="#dddddd", lw=0.6)
    ax.set_ylim(0, max(top, float(budget[shown].max()) * 1.05 if shown.any() else 0.0) / 1e9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, title=note,
              title_fontsize=8)  # fmt: skip
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


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
