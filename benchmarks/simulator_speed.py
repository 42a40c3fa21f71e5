"""Simulator speed and exactness: SimPy reference vs ``doppler.sim``, in one run.

    python benchmarks/simulator_speed.py [--quick] [--no-large-simpy]

1. ``llama_layer`` (240 ops) on ``p100x4``: median time of one
   simulation in SimPy, of one ``simulate()`` call (validation included), of the
   ``SimContext.makespan`` fast path, and the throughput of ``simulate_many``
   (one core). Then 100 random assignments: SimPy and ours must give identical
   makespans in WC, WC + link contention, BSP, and WC with noise.
2. A 100k-op layered random graph on 64 devices: one ``simulate()`` call, cold
   (context build + kernel load) and warm, against one SimPy run.
(The WC vs BSP gap is in ``benchmarks/wc_vs_bsp.py``.)

Targets (2-core laptop-class machine): single call <= 50 us, batched >= 20,000
simulations/s, 100k ops on 64 devices <= 1 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.reference

from _timing import median_call_s  # noqa: E402
from tests.reference.simpy_reference import simulate_simpy  # noqa: E402

from doppler.hardware import cluster as hardware
from doppler import workloads  # noqa: E402
from doppler.hardware import presets
from doppler.methods import assign  # noqa: E402
from doppler.ir.graph import DataflowGraph  # noqa: E402
from doppler.sim import SimContext, context, simulate, simulate_many  # noqa: E402


# --------------------------------------------------------------------------- graphs
def round_robin_by_block(graph: DataflowGraph, num_devices: int) -> np.ndarray:
    """The ``round_robin_block`` baseline: tiles spread over devices by block index."""
    return assign(graph, presets.cluster(f"unit:{num_devices}"), "round_robin_block").devices


# --------------------------------------------------------------------------- timing
def fmt_t(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


# --------------------------------------------------------------------------- sections
def bench_small(quick: bool) -> list[list[str]]:
    g = workloads.build("llama_layer")
    c = presets.cluster("p100x4")
    D = c.num_devices
    rng = np.random.default_rng(0)
    print(f"\n## {g.name}: {g.num_ops} ops, {g.num_edges} edges on {c.name} ({D} devices)")
    ctx = context(g, c)
    rr = round_robin_by_block(g, D)
    simulate(g, c, rr)  # load / compile the loops
    simulate_many(g, c, rr[None, :])

    # exactness on 100 random assignments
    A = rng.integers(0, D, (100, g.num_ops))
    A[0] = rr
    checks = {
        "wc": dict(mode="wc"),
        "wc+contention": dict(mode="wc", link_contention=True),
        "bsp": dict(mode="bsp"),
        "bsp+contention": dict(mode="bsp", link_contention=True),
        "wc+noise(0.2)": dict(mode="wc", noise_sigma=0.2, seed=7),
    }
    print("\nexactness vs SimPy on 100 random assignments (makespans compared with ==):")
    for label, kw in checks.items():
        ours = simulate_many(g, c, A, **kw)
        ref = np.array([simulate_simpy(g, c, a, ctx=ctx, **kw).makespan_s for a in A])
        same = int(np.sum(ours == ref))
        print(f"  {label:16s} identical {same}/100   max |diff| = {np.max(np.abs(ours - ref)):.3g} s")
        assert same == 100, f"SimPy and doppler.sim disagree ({label})"

    reps_simpy = 10 if quick else 30
    reps = 500 if quick else 3000
    t_simpy = median_call_s(lambda: simulate_simpy(g, c, A[1], ctx=ctx), reps_simpy)
    j = iter(range(10**9))
    t_single = median_call_s(lambda: ctx.simulate(A[next(j) % 100]), reps)
    j = iter(range(10**9))
    t_public = median_call_s(lambda: simulate(g, c, A[next(j) % 100]), reps)
    dev64 = [np.ascontiguousarray(a, dtype=np.int64) for a in A]
    j = iter(range(10**9))
    t_fast = median_call_s(lambda: ctx.makespan(dev64[next(j) % 100]), reps)
    t_rr = median_call_s(lambda: ctx.simulate(rr), reps)
    B = 5000 if quick else 20000
    AB = rng.integers(0, D, (B, g.num_ops))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        simulate_many(g, c, AB)
        best = min(best, time.perf_counter() - t0)
    per_batched = best / B
    rows = [
        ["SimPy reference, one run (random assignment)", fmt_t(t_simpy), f"{1 / t_simpy:,.0f}", "1x"],
        ["SimContext.simulate(), one call (random assignment)", fmt_t(t_single), f"{1 / t_single:,.0f}", f"{t_simpy / t_single:,.0f}x"],
        ["SimContext.simulate(), one call (round-robin by block)", fmt_t(t_rr), f"{1 / t_rr:,.0f}", f"{t_simpy / t_rr:,.0f}x"],
        ["simulate(), one call (the pair's cached context)", fmt_t(t_public), f"{1 / t_public:,.0f}", f"{t_simpy / t_public:,.0f}x"],
        ["SimContext.makespan(), one call", fmt_t(t_fast), f"{1 / t_fast:,.0f}", f"{t_simpy / t_fast:,.0f}x"],
        [f"simulate_many(), batch of {B}, per row", fmt_t(per_batched), f"{1 / per_batched:,.0f}", f"{t_simpy / per_batched:,.0f}x"],
    ]
    print()
    print(table(rows, ["llama_layer on p100x4 (median)", "time", "sims/s", "vs SimPy"]))
    ok1 = t_single <= 50e-6
    ok2 = 1 / per_batched >= 20000
    print(f"\ntarget single call (held context) <= 50 µs: {'OK' if ok1 else 'MISSED'} ({fmt_t(t_single)});"
          f" batched >= 20,000/s: {'OK' if ok2 else 'MISSED'} ({1 / per_batched:,.0f}/s)")
    return rows


def bench_large(quick: bool, large_simpy: bool) -> None:
    n, D = 100_000, 64
    g = workloads.build("random", num_ops=n, width=256, seed=0)
    c = hardware.homogeneous("h100:64", D, flops_per_s=46.9e12, bandwidth_Bps=360e9, latency_s=5e-6)
    a = np.random.default_rng(1).integers(0, D, n)
    print(f"\n## {g.name}: {g.num_ops} ops, {g.num_edges} edges on {D} devices")
    t0 = time.perf_counter()
    r_cold = simulate(g, c, a)
    cold = time.perf_counter() - t0
    ctx = context(g, c)
    warm = min(median_call_s(lambda: ctx.simulate(a), 3 if quick else 5), cold)
    t0 = time.perf_counter()
    r_tr = ctx.simulate(a, trace=True, link_contention=True)
    cont = time.perf_counter() - t0
    rows = [
        ["simulate(), first call (context build + kernel load)", fmt_t(cold), ""],
        ["SimContext.simulate(), warm", fmt_t(warm), ""],
        ["SimContext.simulate(trace=True, link_contention=True), warm", fmt_t(cont), ""],
    ]
    if large_simpy:
        t0 = time.perf_counter()
        ref = simulate_simpy(g, c, a, ctx=SimContext(g, c))
        t_simpy = time.perf_counter() - t0
        same = ref.makespan_s == r_cold.makespan_s
        rows.insert(0, ["SimPy reference, one run", fmt_t(t_simpy), "identical" if same else "DIFFERENT"])
        rows[2][2] = f"{t_simpy / warm:,.0f}x faster"
        assert same, "SimPy and doppler.sim disagree on the 100k graph"
    print()
    print(table(rows, [f"{n // 1000}k ops, {D} devices", "time", "vs SimPy"]))
    print(f"\ntarget 100k ops on 64 devices <= 1 s: {'OK' if cold <= 1.0 else 'MISSED'} (cold {fmt_t(cold)}, warm {fmt_t(warm)});"
          f" makespan {r_cold.makespan_s:.4g} s, {r_tr.trace.num_transfers} transfers")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--no-large-simpy", action="store_true", help="skip the (slow) SimPy run on the 100k graph")
    args = ap.parse_args(argv)
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, {os.cpu_count()} CPUs; one core used")
    bench_small(args.quick)
    bench_large(args.quick, not args.no_large_simpy)


if __name__ == "__main__":
    main()
