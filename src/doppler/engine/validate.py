"""``doppler validate``: does the simulator rank and time assignments as the real engine does?

For one graph and a calibrated cluster, :func:`validation_assignments` makes N
diverse assignments over a wide makespan range (every baseline; partial
offloads between ``single`` and the balanced methods; then perturbations of
them: a share of ops moved to random devices), :func:`validate` simulates each (with link
contention: the engine's links carry one copy at a time) and executes each
``repeats`` times, every (assignment, repeat) pair in one shuffled order so that
drift of the machine hits all assignments alike, and compares medians.

Reported: Spearman rank correlation (does the simulator order assignments
correctly?), mean and max absolute % error, signed bias (positive: the
simulator overestimates), and the engine's own test-retest Spearman between
its first and second repeat, the ceiling any simulator can reach.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from doppler.engine import RunOptions
from doppler.engine.program import EngineError, build_program
from doppler.ir.graph import DataflowGraph
from doppler.util.progress import ProgressEvent, ProgressFn
from doppler.hardware.cluster import Cluster

__all__ = ["ValidationResult", "validate", "validation_assignments"]

#: the methods whose assignments seed the validation set (anneal gets a short budget)
BASE_METHODS = ("single", "round_robin", "round_robin_block", "random", "critical_path", "heft", "metis",
                "enumerative", "anneal")  # fmt: skip
ANNEAL_BUDGET_S = 3.0
#: shares of ops moved by the perturbations
PERTURB_SHARES = (0.05, 0.2, 0.5)
#: shares of ops moved off device 0 by the "partial" assignments that fill the makespan range
PARTIAL_SHARES = (0.1, 0.2, 0.3, 0.4, 0.6, 0.8)


@dataclass
class ValidationResult:
    """Agreement between simulated and measured makespans (see the module docstring)."""

    n: int
    spearman: float
    mean_abs_pct_error: float
    max_abs_pct_error: float
    bias_pct: float
    retest_spearman: float | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The figures (in field order), then ``info``, then every assignment's row."""
        figures = ("n", "spearman", "mean_abs_pct_error", "max_abs_pct_error", "bias_pct", "retest_spearman")
        return {**{name: getattr(self, name) for name in figures}, **self.info, "assignments": self.rows}


#: the most assignments one validation runs (``--n``; default 30), each executed ``repeats`` times
MAX_ASSIGNMENTS = 10_000


def _is_method(label: str) -> bool:
    """True for the assignment of a placement method (not a partial offload or a perturbation)."""
    return "~" not in label and not label.startswith("partial")


def validation_assignments(graph: DataflowGraph, cluster: Cluster, n: int, *, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """``n`` distinct (label, devices) pairs: the baselines, partial offloads of ``single``
    (10-80% of the ops in contiguous blocks moved to other devices), then perturbations."""
    from doppler.methods import assign, get_method

    if not 2 <= n <= MAX_ASSIGNMENTS:
        raise EngineError(f"validation needs from 2 to {MAX_ASSIGNMENTS:,} assignments, got n={n}")
    out: list[tuple[str, np.ndarray]] = []
    seen: dict[bytes, int] = {}

    def add(label: str, dev: np.ndarray) -> None:
        key = np.asarray(dev, np.int64).tobytes()
        if key in seen:  # two methods agree: one case, both names
            i = seen[key]
            if _is_method(label):
                out[i] = (f"{out[i][0]}={label}", out[i][1])
        elif len(out) < n:
            seen[key] = len(out)
            out.append((label, np.asarray(dev, np.int64)))

    for m in BASE_METHODS:
        spec = get_method(m)
        if cluster.num_devices < spec.min_devices:
            continue
        budget = ANNEAL_BUDGET_S if spec.uses_budget else None
        add(m, assign(graph, cluster, m, seed=seed, budget_s=budget, ignore_memory=True).devices)
    rng = np.random.default_rng(seed)
    for share in PARTIAL_SHARES:
        dev = np.zeros(graph.num_ops, np.int64)
        blocks = np.array_split(np.arange(graph.num_ops), 10)
        for i in rng.permutation(len(blocks))[: max(1, round(share * len(blocks)))]:
            dev[blocks[i]] = rng.integers(1, cluster.num_devices) if cluster.num_devices > 1 else 0
        add(f"partial{share:g}", dev)
    bases = list(out)
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        label, base = bases[tries % len(bases)]
        share = PERTURB_SHARES[(tries // len(bases)) % len(PERTURB_SHARES)]
        dev = base.copy()
        moved = rng.random(dev.shape[0]) < share
        dev[moved] = rng.integers(0, cluster.num_devices, int(moved.sum()))
        add(f"{label}~{share:g}", dev)
    return out


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def validate(
    graph: DataflowGraph,
    cluster: Cluster,
    *,
    options: RunOptions = RunOptions(repeats=3, warmup=1),
    n: int = 30,
    seed: int = 0,
    dispatch: str = "fifo",
    time_scale: float = 1.0,
    progress: ProgressFn | None = None,
) -> ValidationResult:
    """Simulate and execute ``n`` diverse assignments; compare (see the module docstring). ``options``: the
    engine's, with ``repeats`` runs of each assignment, after ``warmup`` runs of the first, not kept.

    Cost-only graphs run synthetic kernels of ``time_scale`` x the cluster's op times, and
    their simulated makespans are scaled alike."""
    from doppler.engine import run
    from doppler.sim import simulate

    options.check(cluster.num_devices, seed)
    engine, repeats, device_type = options.engine, options.repeats, options.device_type
    cases = validation_assignments(graph, cluster, n, seed=seed)
    sim_kw: dict[str, Any] = {"link_contention": True}
    if dispatch != "fifo":
        sim_kw["dispatch"] = dispatch
    simulated = np.array([simulate(graph, cluster, dev, **sim_kw).makespan_s for _, dev in cases])
    program = build_program(graph, cluster=cluster, seed=seed, time_scale=time_scale)
    if program.is_synthetic:
        simulated = simulated * time_scale
    order = [(i, r) for r in range(repeats) for i in range(len(cases))]
    np.random.default_rng(seed + 1).shuffle(order)
    measured = np.full((len(cases), repeats), np.nan)
    each = dataclasses.replace(options, repeats=1, warmup=0)
    run_on = partial(run, graph, options=each, num_devices=cluster.num_devices, program=program, keep_outputs=False)
    for _ in range(options.warmup):  # not kept
        run_on(cases[0][1])
    for k, (i, r) in enumerate(order):
        measured[i, r] = run_on(cases[i][1]).makespan_s
        if progress is not None:
            progress(ProgressEvent("validate", k + 1, len(order), "runs"))
    return agreement([label for label, _ in cases], simulated, measured,
                     info={"graph": graph.name, "cluster": cluster.name, "engine": engine, "device_type": device_type,
                           "repeats": repeats})  # fmt: skip


def agreement(labels: list[str], simulated_s: np.ndarray, measured_s: np.ndarray, info: dict[str, Any]) -> ValidationResult:
    """The statistics of a validation: ``simulated_s[n]`` against the medians of ``measured_s[n, repeats]``
    (rank correlation, absolute and signed % errors, and the engine's own repeat-to-repeat ranking)."""
    med = np.median(measured_s, axis=1)
    err = (simulated_s - med) / med
    rows = [
        {"label": label, "simulated_s": float(s), "measured_s": float(m), "measured_repeats_s": measured_s[i].tolist()}
        for i, (label, s, m) in enumerate(zip(labels, simulated_s, med))
    ]
    return ValidationResult(
        n=len(labels),
        spearman=_spearman(simulated_s, med),
        mean_abs_pct_error=float(np.mean(np.abs(err)) * 100),
        max_abs_pct_error=float(np.max(np.abs(err)) * 100),
        bias_pct=float(np.mean(err) * 100),
        retest_spearman=_spearman(measured_s[:, 0], measured_s[:, 1]) if measured_s.shape[1] >= 2 else None,
        rows=rows,
        info=info,
    )


def scatter_plot(result: ValidationResult, path: str | Path, *, title: str | None = None) -> None:
    """Simulated vs measured makespan per assignment, with the y = x line (PNG, written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from doppler.report import save_figure, time_unit

    sim = np.array([r["simulated_s"] for r in result.rows])
    meas = np.array([r["measured_s"] for r in result.rows])
    reps = np.array([r["measured_repeats_s"] for r in result.rows])
    hi = float(max(sim.max(), np.nanmax(reps)) * 1.08)
    scale, unit = time_unit(hi)
    fig, ax = plt.subplots(figsize=(5.2, 5))
    ax.plot([0, hi * scale], [0, hi * scale], color="0.6", lw=1, ls="--", label="y = x")
    lo_err = (meas - np.nanmin(reps, axis=1)) * scale
    hi_err = (np.nanmax(reps, axis=1) - meas) * scale
    base = np.array([_is_method(r["label"]) for r in result.rows])
    ax.errorbar(meas[~base] * scale, sim[~base] * scale, xerr=[lo_err[~base], hi_err[~base]], fmt="o", ms=4,
                alpha=0.6, lw=0.8, label="partial offloads and perturbations")  # fmt: skip
    ax.errorbar(meas[base] * scale, sim[base] * scale, xerr=[lo_err[base], hi_err[base]], fmt="s", ms=5, lw=0.8,
                label="baseline methods")  # fmt: skip
    for r, m, s in zip(result.rows, meas, sim):
        if _is_method(r["label"]):
            ax.annotate(r["label"], (m * scale, s * scale), fontsize=6, xytext=(3, -8), textcoords="offset points")
    ax.set_xlim(0, hi * scale)
    ax.set_ylim(0, hi * scale)
    ax.set_xlabel(f"measured makespan ({unit}, median; bars: min-max of repeats)")
    ax.set_ylabel(f"simulated makespan ({unit})")
    rt = "n/a" if result.retest_spearman is None or math.isnan(result.retest_spearman) else f"{result.retest_spearman:.3f}"
    ax.set_title(title or f"{result.info.get('graph', '')} on {result.info.get('cluster', '')}", fontsize=10)
    ax.text(0.03, 0.97, f"Spearman {result.spearman:.3f} (engine retest {rt})\nmean |error| "
            f"{result.mean_abs_pct_error:.1f}%, bias {result.bias_pct:+.1f}%, n={result.n}",
            transform=ax.transAxes, va="top", fontsize=8)  # fmt: skip
    ax.legend(frameon=False, loc="lower right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, 130)
