"""Numbers as the commands print them (times, bytes) and the methods' comparison table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from doppler.hardware.cluster import Cluster


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


def comparison_table(rows: list[Any], title: str, cluster: "Cluster | None" = None) -> "Any":
    """A rich table of :func:`doppler.methods.compare` rows (``CompareRow``): the best makespan among the
    placements that fit the memory budget in bold green; peak memory (largest over devices) and ``no`` in
    the ``fits`` column in red where some device is over its budget."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    table.add_column("method")
    for col in ("makespan", "/ lower bound", "/ critical_path", "fits", "peak memory", "assign time (s)"):
        table.add_column(col, justify="right")
    best = min((r.makespan_s for r in rows if r.feasible), default=None)
    for r in rows:
        peak = max(r.peak_memory_bytes)
        table.add_row(
            r.method,
            format_time(r.makespan_s, cluster),
            f"{r.ratio_to_lower_bound:.3f}" if r.ratio_to_lower_bound is not None else "-",
            f"{r.ratio_to_critical_path:.3f}" if r.ratio_to_critical_path is not None else "-",
            "yes" if r.feasible else Text("no", style="red"),
            format_bytes(peak) if r.feasible else Text(f"{format_bytes(peak)} (over)", style="red"),
            f"{r.assign_time_s:.3f}",
            style="bold green" if r.feasible and r.makespan_s == best else None,
        )
    return table
