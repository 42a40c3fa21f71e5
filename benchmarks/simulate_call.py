"""The public ``doppler.simulate(g, c, a)`` in a loop against a held context, in one run.

    python benchmarks/simulate_call.py [--calls N] [--workload W] [--cluster C]

A user's own search loop calls ``doppler.simulate(g, c, a)`` with the same graph and cluster
every time; ``ctx = doppler.sim.context(g, c); ctx.simulate(a)`` is the held context that a
library loop uses. Both run the same assignments (random, seeded), interleaved in rounds so that
a busy machine slows both alike; the script prints the median time per call of each and their
ratio. Target: the public call within 1.5x of the held context.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import doppler  # noqa: E402
from doppler import workloads  # noqa: E402
from doppler.hardware.presets import cluster  # noqa: E402
from doppler.sim import context  # noqa: E402

ROUNDS = 10


def per_call_s(fn, assignments: np.ndarray) -> float:
    """Seconds per call of ``fn(a)`` over every row of ``assignments``."""
    t0 = time.perf_counter()
    for a in assignments:
        fn(a)
    return (time.perf_counter() - t0) / len(assignments)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000, help="calls of each, in all (default 5000)")
    ap.add_argument("--workload", default="llama_block")
    ap.add_argument("--cluster", default="p100x4")
    args = ap.parse_args()

    g, c = workloads.build(args.workload), cluster(args.cluster)
    rng = np.random.default_rng(0)
    per_round = max(1, args.calls // ROUNDS)
    A = rng.integers(0, c.num_devices, size=(per_round, g.num_ops), dtype=np.int64)
    ctx = context(g, c)
    public = lambda a: doppler.simulate(g, c, a)  # noqa: E731
    held = ctx.simulate
    for a in A[:50]:  # compile or load the kernel; check both give the same makespans
        assert public(a).makespan_s == held(a).makespan_s
    t_public, t_held = [], []
    for _ in range(ROUNDS):
        t_public.append(per_call_s(public, A))
        t_held.append(per_call_s(held, A))
    pub, hld = statistics.median(t_public), statistics.median(t_held)
    print(f"{args.workload} ({g.num_ops} ops) on {args.cluster}: {per_round * ROUNDS} calls of each, "
          f"median of {ROUNDS} rounds")  # fmt: skip
    print(f"  doppler.simulate(g, c, a)   {pub * 1e6:8.1f} µs/call")
    print(f"  ctx.simulate(a) (held)      {hld * 1e6:8.1f} µs/call")
    print(f"  ratio public / held         {pub / hld:8.2f}x  (target <= 1.5x)")


if __name__ == "__main__":
    main()
