"""Gantt charts: files are written (atomically) for WC, BSP and multi-stream traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import doppler.report.gantt_chart as gantt_chart
from doppler.ir.graph import OpKind, from_edges
from doppler.hardware.presets import cluster
from doppler.report import gantt
from doppler.sim import lower_bound, simulate


def _graph():
    rng = np.random.default_rng(0)
    n = 40
    edges = [(int(u), v) for v in range(3, n) for u in set(rng.integers(max(0, v - 8), v, 2).tolist())]
    kinds = rng.choice([OpKind.MATMUL, OpKind.ADD, OpKind.SOFTMAX], n)
    return from_edges(rng.uniform(1e9, 1e10, n), edges, rng.uniform(1e6, 5e7, n), kind=kinds, name="g40")


@pytest.mark.parametrize("mode,streams,suffix", [("wc", 1, ".png"), ("bsp", 2, ".png"), ("wc", 1, ".svg")])
def test_gantt_writes_a_file(tmp_path: Path, mode: str, streams: int, suffix: str) -> None:
    g = _graph()
    c = cluster("p100x4")
    if streams > 1:
        c = c.with_streams(streams)
    a = np.arange(g.num_ops) % 4
    r = simulate(g, c, a, trace=True, mode=mode)
    out = gantt(g, c, r, tmp_path / f"chart{suffix}", title="test chart", lower_bound_s=lower_bound(g, c))
    data = out.read_bytes()
    assert len(data) > 5000
    if suffix == ".png":
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert b"<svg" in data[:2000]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"chart{suffix}"]  # no temp files left


def test_gantt_accepts_a_trace_and_needs_one(tmp_path: Path) -> None:
    g = from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1])
    c = cluster("unit:2")
    r = simulate(g, c, [0, 1, 0], trace=True)
    gantt(g, c, r.trace, tmp_path / "t.png")
    with pytest.raises(ValueError, match="trace=True"):
        gantt(g, c, simulate(g, c, [0, 1, 0]), tmp_path / "u.png")


def test_large_gantt_drops_outlines_samples_transfers_and_threads_the_critical_path(tmp_path: Path, monkeypatch) -> None:
    figs = []
    monkeypatch.setattr(gantt_chart, "save_figure", lambda fig, path, dpi=None: figs.append(fig))
    g = _graph()
    c = cluster("p100x4")
    tr = simulate(g, c, np.arange(g.num_ops) % 4, trace=True).trace
    assert tr.num_transfers > 10
    gantt(g, c, tr, tmp_path / "big.png", detail_ops=5, max_transfer_lines=10)
    ax = figs[-1].axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"transfer (10 of {tr.num_transfers} shown)" in labels
    assert f"critical path ({len(tr.critical_path(g))} ops)" in labels
    assert not ax.texts or all("%" in t.get_text() or t.get_text() == "busy" for t in ax.texts)
    bars = [col for col in ax.collections if type(col).__name__ == "PolyCollection"]
    assert bars and all(col.get_edgecolor().size == 0 for col in bars)  # no outlines
    gantt(g, c, tr, tmp_path / "small.png")  # the detailed chart: outlined critical ops, every transfer
    labels = [t.get_text() for t in figs[-1].axes[0].get_legend().get_texts()]
    assert "transfer" in labels and "critical path" in labels


def test_a_unit_cost_cluster_charts_in_units(tmp_path: Path, monkeypatch) -> None:
    g = from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1])
    c = cluster("unit:2")
    figs = []
    monkeypatch.setattr(gantt_chart, "save_figure", lambda fig, path, dpi=None: figs.append(fig))
    gantt(g, c, simulate(g, c, [0, 1, 0], trace=True), tmp_path / "u.png")
    assert figs[0].axes[0].get_xlabel() == "time (units)"


@pytest.mark.parametrize("name", ["ffnn", "llama_block"])
def test_the_memory_panels_curves_peak_where_the_trace_says(tmp_path: Path, name: str) -> None:
    """Each device's curve starts at its resident weights, its highest point is its peak memory, and after
    the makespan it holds its weights alone."""
    from doppler import workloads

    g = workloads.build(name, size="tiny")
    c = cluster("p100x4")
    r = simulate(g, c, np.random.default_rng(1).integers(0, 4, g.num_ops), trace=True)
    curves = gantt_chart.memory_curves(g, r.trace, 4)
    for d, (t, held) in enumerate(curves):
        assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
        assert held[0] >= r.resident_bytes[d]
        np.testing.assert_allclose(held.max(), r.peak_memory_bytes[d], rtol=1e-12)
        np.testing.assert_allclose(held[-1], r.resident_bytes[d], atol=1e-6)  # after the makespan: the weights
    out = gantt(g, c, r, tmp_path / "m.png", memory_budget_bytes=np.full(4, r.peak_memory_bytes.max()))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
