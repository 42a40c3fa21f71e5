"""Assignment time of the list-scheduling baselines on a large graph (target: <= 2 s each).

    python benchmarks/baselines_scale.py [--ops 10000] [--devices 64] [--repeats 3] [--methods critical_path,heft]

The graph is the layered ``random`` workload (``--width`` ops per layer on
average, fan-in up to 3); the cluster is ``h100x8:N`` (homogeneous, N devices).
"first" is the first call in this process (it includes loading numba's compiled
cache, or compiling on a fresh checkout); "median" is the median of
``--repeats`` further calls. The simulated makespan over the lower bound is
printed as a sanity check.
"""

from __future__ import annotations

import argparse
import time

from _timing import median_call_s

from doppler import workloads
from doppler.methods import assign
from doppler.hardware.presets import cluster
from doppler.sim import lower_bound, simulate

TARGET_S = 2.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", type=int, default=10000)
    p.add_argument("--devices", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--methods", default="critical_path,heft")
    args = p.parse_args()

    g = workloads.build("random", num_ops=args.ops, width=args.width, seed=0)
    c = cluster(f"h100x8:{args.devices}")
    lb = lower_bound(g, c)
    print(f"graph: {g.num_ops} ops, {g.num_edges} edges, depth {g.depth}; cluster {c.name} ({c.num_devices} devices)")
    print(f"{'method':<15} {'first s':>9} {'median s':>9} {'makespan/LB':>12}  target <= {TARGET_S:g} s")
    ok = True
    for m in args.methods.split(","):
        t0 = time.perf_counter()
        a = assign(g, c, m)
        first = time.perf_counter() - t0
        med = median_call_s(lambda: assign(g, c, m), args.repeats) if args.repeats else first
        ratio = simulate(g, c, a).makespan_s / lb
        passed = max(first, med) <= TARGET_S
        ok &= passed
        print(f"{m:<15} {first:9.3f} {med:9.3f} {ratio:12.3f}  {'ok' if passed else 'SLOW'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
