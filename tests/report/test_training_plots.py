"""The held-out results chart: one bar per present value, each row's bars together."""

from __future__ import annotations

from pathlib import Path


def test_held_out_chart_draws_one_bar_per_present_value(tmp_path: Path, monkeypatch) -> None:
    import matplotlib.axes

    from doppler.report import held_out_chart

    calls = []
    real = matplotlib.axes.Axes.barh
    monkeypatch.setattr(matplotlib.axes.Axes, "barh", lambda self, y, w, **k: calls.append((list(y), list(w), k))
                        or real(self, y, w, **k))  # fmt: skip
    rows = [{"name": "a/x", "heft": 1.1, "anneal": [0.9, 0.02]}, {"name": "b/y", "heft": 1.0, "anneal": None}]
    out = tmp_path / "chart.png"
    held_out_chart(rows, {"heft": "HEFT", "anneal": "anneal 5 s"}, out)
    assert out.stat().st_size > 0
    (y0, w0, _), (y1, w1, k1) = calls
    assert w0 == [1.1, 1.0] and w1 == [0.9]  # b/y has no anneal value: no bar
    assert y0[0] < y1[0] < y0[1]  # each row's bars sit together, in column order
    assert k1["xerr"] == [0.01] and k1["label"] == "anneal 5 s"
