"""DOPPLER at scale: greedy assignment of a 10k-op graph on 64 devices, and how the
per-episode training time grows with the graph.

    python benchmarks/doppler_scale.py [--sizes 1000,2000,5000,10000]

1. ``random`` graph with 10,000 ops on ``unit:64``: time of ``doppler assign
   --method doppler`` (checkpoint load, features, encoder, compiled greedy decode;
   the policy is untrained, which does not change the work). Target <= 5 s.
2. Stage II per-episode time (rollout + simulator + re-scoring + backward, batch 4;
   without the periodic local searches, whose cost is their evaluation count times one simulation)
   on ``random`` graphs of the given sizes on ``unit:8``, and its ratio to the
   smallest size next to the ratio of op counts (linear growth: equal ratios).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from doppler import cluster, workloads
from doppler.methods import assign
from doppler.train import Trainer, TrainConfig


def greedy_10k(num_ops: int, devices: int) -> None:
    g = workloads.build("random", num_ops=num_ops, width=64, seed=0)
    cl = cluster(f"unit:{devices}")
    with tempfile.TemporaryDirectory() as d:
        # a policy trained (briefly) on two small graphs may be applied zero-shot to any graph
        small = [workloads.build("random", num_ops=20, seed=s) for s in (1, 2)]
        Trainer.create(small, cl, TrainConfig(stages=("il",), il_episodes=2, il_batch=1)).run(d)
        assign(g, cl, "doppler", checkpoint=f"{d}/checkpoint.pt")  # warm: compiled loops loaded
        t0 = time.perf_counter()
        a = assign(g, cl, "doppler", checkpoint=f"{d}/checkpoint.pt")
        elapsed = time.perf_counter() - t0
    print(f"greedy DOPPLER assignment, {num_ops} ops on {devices} devices: {elapsed:.2f} s "
          f"(assign_time_s {a.assign_time_s:.2f}); target <= 5 s: {'met' if elapsed <= 5 else 'MISSED'}")  # fmt: skip


def episode_time(num_ops: int, batch: int = 4, updates: int = 3) -> float:
    g = workloads.build("random", num_ops=num_ops, width=32, seed=0)
    tr = Trainer.create([g], cluster("unit:8"), TrainConfig(stages=("sim",), batch=batch, episodes=10**9, search_every=0))
    tr.rl_update()  # warm-up
    t0 = time.perf_counter()
    for _ in range(updates):
        tr.rl_update()
    return (time.perf_counter() - t0) / (updates * batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,5000,10000")
    ap.add_argument("--ops", type=int, default=10_000)
    ap.add_argument("--devices", type=int, default=64)
    args = ap.parse_args()
    greedy_10k(args.ops, args.devices)
    sizes = [int(s) for s in args.sizes.split(",")]
    times = [episode_time(n) for n in sizes]
    print("\nStage II time per episode on unit:8 (batch 4):")
    print(f"{'ops':>7s} {'s/episode':>10s} {'time ratio':>11s} {'ops ratio':>10s}")
    for n, t in zip(sizes, times):
        print(f"{n:7d} {t:10.3f} {t / times[0]:11.2f} {n / sizes[0]:10.2f}")


if __name__ == "__main__":
    main()
