"""How much of ANNEAL's time is simulation: its evaluations per second beside the simulator's alone.

    python benchmarks/anneal_speed.py [--seconds S]

For each graph, in one process and one after the other: the rate of ``anneal`` for S seconds, and
the rate of ``SimContext.simulate_many`` alone on what the annealer scores: batches of 8
neighbours (one op moved) of the assignment it found. The ratio is the share of the annealer's
time spent simulating; the rest is its own loop (moves, acceptance). With the loop in Python it
was 0.29-0.52 (072e1ea); compiled, 0.74-0.98: 1.7-2.4x the evaluations per second. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from doppler import workloads
from doppler.methods import assign
from doppler.presets import cluster
from doppler.simulate import SimContext

CASES = (("llama_layer", "v100x8"), ("llama_block", "p100x4"), ("ffnn", "h100x8"), ("chainmm", "p100x4"))


def sim_rate(ctx: SimContext, around: np.ndarray, nd: int, seconds: float) -> float:
    """Evaluations per second of the simulator alone, batches of 8 neighbours of ``around``."""
    rng = np.random.default_rng(0)
    batches = np.repeat(around[None, None, :], 64 * 8, axis=0).reshape(64, 8, -1)
    ops = rng.integers(0, ctx.num_ops, (64, 8))
    for b in range(64):
        batches[b, np.arange(8), ops[b]] = (batches[b, np.arange(8), ops[b]] + rng.integers(1, nd, 8)) % nd
    ctx.simulate_many(batches[0])
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        ctx.simulate_many(batches[k % 64])
        k += 1
    return 8 * k / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    print("| graph / cluster | ops | simulator alone (evals/s) | anneal (evals/s) | anneal / simulator |")
    print("|---|---|---|---|---|")
    for name, preset in CASES:
        g, c = workloads.build(name), cluster(preset)
        assign(g, c, "anneal", max_evals=100)  # compile outside the timing
        t0 = time.perf_counter()
        a = assign(g, c, "anneal", budget_s=args.seconds, seed=0)
        rate = a.info["evals"] / (time.perf_counter() - t0)
        sim = sim_rate(SimContext(g, c), a.devices, c.num_devices, args.seconds)
        print(f"| {name} / {preset} | {g.num_ops} | {sim:,.0f} | {rate:,.0f} | {rate / sim:.2f} |", flush=True)


if __name__ == "__main__":
    main()
