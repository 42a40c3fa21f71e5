"""The Dask engine's trace, re-based to the moment the run's gates opened (see ``dask_engine``).

Op times are the ``"compute"`` intervals of Dask's task stream (the scheduler's
``TaskStreamPlugin``, through ``distributed.get_task_stream``). Transfers come
from each worker's incoming-transfer log (``Worker.transfer_incoming_log``,
which names the keys each fetch moved, unlike the task stream's ``"transfer"``
entries, which are attached to one consumer only). Time zero is the earliest
gate ``"compute"`` stop, on the scheduler's clock, as every task-stream time.
Dask reports worker times on the scheduler's clock by adding an estimated offset
that jitters by milliseconds; the workers of our LocalCluster share the
scheduler's host and clock, so they report their raw clock (offset 0) and their
times are exact. For an external scheduler the times are Dask's estimates.

The trace: ``op_start``/``op_end`` from ``"compute"``; ``op_ready`` = the
latest arrival of an input on the op's device (the producer's end on the
same device, else the end of the fetch that brought it there; a fetch
missing from the log counts as the producer's end); a source op is ready
when its device's gate finished (~0). One transfer per (producer op,
destination device) that Dask actually moved (the first fetch if it moved
one twice), sorted by (producer, destination); ``tr_src_device`` is the
worker it came from, ``tr_bytes`` the graph's ``output_bytes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from doppler.engine.program import EngineError, PlacedProgram
from doppler.sim.trace import Trace

__all__ = ["build_trace"]

#: tolerance when matching a re-fetched input to the op that used it (seconds)
_EPS = 1e-6


def build_trace(
    placed: PlacedProgram,
    workers: list[str],
    records: list[dict[str, Any]],
    fetches: dict[str, list[tuple[float, float, str, list[str]]]],
    prefix: str,
    gate_prefix: str,
) -> Trace:
    """The trace of one run from Dask's task stream (``records``: op and gate compute times) and the
    workers' transfer logs (``fetches``), in seconds from the moment the gates opened."""
    g, dev = placed.program.graph, placed.devices
    start, end, gate_end = _compute_times(placed, records, prefix, gate_prefix)
    t0 = float(np.nanmin(gate_end)) if np.isfinite(gate_end).any() else float(start.min())
    gate_end = np.where(np.isfinite(gate_end), gate_end, t0) - t0
    start, end = start - t0, end - t0
    arrivals = _arrivals(fetches, {workers[d]: d for d in range(placed.num_devices)}, dev, prefix, t0)
    moved = sorted(arrivals)
    T = len(moved)
    src = np.array([u for u, _ in moved], dtype=np.int64)
    first = [arrivals[key][0] for key in moved]
    return Trace(
        op_device=dev.copy(),
        op_ready=_ready_times(g, dev, start, end, gate_end, arrivals),
        op_start=start,
        op_end=end,
        tr_src_op=src,
        tr_src_device=np.array([f[2] for f in first], dtype=np.int64),
        tr_dst_device=np.array([b for _, b in moved], dtype=np.int64),
        tr_bytes=g.output_bytes[src].astype(np.float64) if T else np.empty(0),
        tr_start=np.array([f[1] for f in first], dtype=np.float64),
        tr_end=np.array([f[0] for f in first], dtype=np.float64),
        mode="engine:dask",
    )


def _compute_times(placed: PlacedProgram, records: list[dict[str, Any]], prefix: str,
                   gate_prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Each op's (start, end) and each device's last gate end, on Dask's clock, from the task stream."""
    prog = placed.program
    n, D = prog.graph.num_ops, placed.num_devices
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    gate_end = np.full(D, np.nan)
    for rec in records:
        key = str(rec.get("key", ""))
        comp = [s for s in rec.get("startstops", ()) if s.get("action") == "compute"]
        if not comp:
            continue
        s0, s1 = float(comp[0]["start"]), float(comp[-1]["stop"])
        if key.startswith(prefix) and key[len(prefix) :].isdigit():
            v = int(key[len(prefix) :])
            start[v], end[v] = s0, s1
        elif key.startswith(gate_prefix):
            d = int(key[len(gate_prefix) :].split("-")[0])
            gate_end[d] = s1 if np.isnan(gate_end[d]) else max(gate_end[d], s1)
    missing = np.flatnonzero(np.isnan(start))
    if missing.size:
        raise EngineError(
            f"Dask's task stream lost the times of {missing.size} of {n} ops (e.g. op {prog.label(int(missing[0]))}); "
            "raise distributed.scheduler.dashboard.tasks.task-stream-length"
        )
    return start, end, gate_end


def _arrivals(fetches: dict[str, list[tuple[float, float, str, list[str]]]], device_of: dict[str, int],
              dev: np.ndarray, prefix: str, t0: float) -> dict[tuple[int, int], list[tuple[float, float, int]]]:  # fmt: skip
    """Every fetch of an op's output onto a device, (producer, device) -> sorted [(end, start, source)]."""
    arrivals: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    for addr, recs in fetches.items():
        b = device_of.get(addr)
        if b is None:
            continue
        for s0, s1, who, keys in recs:
            a = device_of.get(who, -1)
            for k in keys:
                tail = k[len(prefix) :] if k.startswith(prefix) else ""
                if tail.isdigit():
                    u = int(tail)
                    arrivals.setdefault((u, b), []).append((s1 - t0, s0 - t0, a if a >= 0 else int(dev[u])))
    for lst in arrivals.values():
        lst.sort()
    return arrivals


def _ready_times(g: Any, dev: np.ndarray, start: np.ndarray, end: np.ndarray, gate_end: np.ndarray,
                 arrivals: dict[tuple[int, int], list[tuple[float, float, int]]]) -> np.ndarray:  # fmt: skip
    """When each op's last input was on its device: a producer's end on the same device, else the
    fetch that brought it (the last one before the op started); a source op, its device's gate end."""

    def arrival(u: int, v: int, d: int) -> float:
        lst = arrivals.get((u, d)) if int(dev[u]) != d else None
        if not lst:  # on the same device, or a fetch missing from the log: the producer's end
            return float(end[u])
        before = [a for a in lst if a[0] <= start[v] + _EPS]
        return float((before[-1] if before else lst[0])[0])

    ready = np.zeros(g.num_ops)
    for v in range(g.num_ops):
        d = int(dev[v])
        preds = g.predecessors(v).tolist()
        ready[v] = max([0.0] + [arrival(u, v, d) for u in preds]) if preds else gate_end[d]
    return ready
