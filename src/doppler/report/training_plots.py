"""Figures of a policy's training: its history (Stage I agreement, Stage II and III makespans) and
its results on held-out (graph, cluster) pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from doppler.report.figures import pyplot, save_figure


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
    plt = pyplot()
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


def held_out_chart(
    rows: list[dict[str, Any]], columns: dict[str, str], path: str | Path, *, title: str = "held-out pairs",
) -> None:  # fmt: skip
    """One group of horizontal bars per row (a (graph, cluster) pair), one bar per column: each value is
    a makespan over the row's best cheap method, so the line at 1 is that method and shorter is better.
    ``columns`` maps a row's key to its legend label; a value may be a number or ``[mean, spread]``
    (drawn with the spread as an error bar); a missing value leaves its bar out."""
    plt = pyplot()
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
