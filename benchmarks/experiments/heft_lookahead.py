"""HEFT_LOOKAHEAD (one-step rollout over HEFT) against the cheap methods and against annealing
given the same wall-clock time.

    python benchmarks/experiments/heft_lookahead.py [--max-ops 1000] [--validation 40] [--seeds 3] [--out F.json]
    python benchmarks/experiments/heft_lookahead.py --speed [--max-ops 1000] [--validation 12] [--reps 3]

Pairs: the held-out rows of :func:`doppler.workloads.corpus.held_out_split` and the first ``--validation``
pairs of :func:`doppler.workloads.corpus.validation_split`, each of at most ``--max-ops`` ops (the rollout
costs ``O(|V|^2 D^2)``). Per pair: the simulated makespans of the five cheap methods, of
``heft_lookahead`` (run to the end on every core, its time T), and of ``anneal --budget-s T``
(every core, the mean over ``--seeds`` seeds; from the cheap methods only: the benchmark leaves
the rollout out of anneal's start set), each divided by the best cheap method; lower is
better. The rollout is timed after one warm-up call, so T leaves out numba's start. It prints one
row per pair and the geometric means per split.

``--speed``: the rollout on one core against every core, side by side on the same pairs (``--reps``
alternating runs each; the median time), with a check that both give the same assignment.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from doppler.workloads.corpus import held_out_split, validation_split
from doppler.util.io import write_json
from doppler.methods import assign
from doppler.sim import simulate

CHEAP = ("critical_path", "heft", "enumerative", "round_robin_block", "metis")


def geomean(xs: list[float]) -> float:
    return float(np.exp(np.mean(np.log(xs)))) if xs else math.nan


def row(case, seeds: int) -> dict:
    g, cl = case.graph, case.cluster

    def ms(a) -> float:
        return float(simulate(g, cl, a).makespan_s)

    cheap = {m: ms(assign(g, cl, m)) for m in CHEAP}
    best = min(cheap.values())
    t0 = time.perf_counter()
    rollout_s = ms(assign(g, cl, "heft_lookahead"))
    took_s = time.perf_counter() - t0
    anneal_s = [ms(assign(g, cl, "anneal", seed=s, budget_s=max(took_s, 0.05))) for s in range(seeds)]
    return {"pair": case.name, "ops": g.num_ops, "devices": cl.num_devices, "best_cheap_s": best,
            "heft": cheap["heft"] / best, "heft_lookahead": rollout_s / best, "time_s": took_s,
            "anneal_same_time": float(np.mean(anneal_s)) / best}  # fmt: skip


def speed(cases, reps: int) -> None:
    """One core against every core: the median of ``reps`` alternating runs per pair, and their ratio."""
    from doppler.methods.threads import search_threads
    from doppler.methods.lookahead import heft_lookahead_schedule

    cores = search_threads(None, 64)
    print(f"{'pair':45s} {'ops':>5s} {'dev':>3s} {'1 core s':>9s} {f'{cores} cores s':>10s} {'speed-up':>8s}")
    ratios = []
    for c in cases:
        times: dict[int, list[float]] = {1: [], cores: []}
        results = {}
        for _ in range(reps):
            for threads in times:
                t0 = time.perf_counter()
                results[threads] = heft_lookahead_schedule(c.graph, c.cluster, threads=threads)
                times[threads].append(time.perf_counter() - t0)
        if not np.array_equal(results[1][0], results[cores][0]):
            raise SystemExit(f"{c.name}: {cores} cores gave another assignment than one core")
        one, many = (float(np.median(times[t])) for t in times)
        ratios.append(one / many)
        print(f"{c.name[:45]:45s} {c.graph.num_ops:5d} {c.cluster.num_devices:3d} {one:9.3f} {many:10.3f} "
              f"{one / many:8.2f}", flush=True)  # fmt: skip
    print(f"speed-up of {cores} cores over one, geomean over {len(ratios)} pairs: {geomean(ratios):.2f}x "
          f"(same assignments)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-ops", type=int, default=1000)
    ap.add_argument("--validation", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--speed", action="store_true", help="time one core against every core instead")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    warm = held_out_split(quick=True)[0]
    assign(warm.graph, warm.cluster, "heft_lookahead", budget_s=0.5)  # numba's start, outside every timing
    splits = {"held_out": held_out_split(), "validation": validation_split(args.validation)}
    if args.speed:
        speed([c for cases in splits.values() for c in cases if c.graph.num_ops <= args.max_ops], args.reps)
        return
    from doppler.methods import anneal

    anneal.ROLLOUT_START_MAX_WORK = 0  # the anneal column anneals from the cheap methods only, not from the rollout
    out = {}
    print(f"{'pair':45s} {'ops':>5s} {'dev':>3s} {'heft':>6s} {'heft_lookahead':>14s} {'time_s':>7s} {'anneal same time':>16s}")
    for split, cases in splits.items():
        rows = [row(c, args.seeds) for c in cases if c.graph.num_ops <= args.max_ops]
        for r in rows:
            print(f"{r['pair'][:45]:45s} {r['ops']:5d} {r['devices']:3d} {r['heft']:6.3f} {r['heft_lookahead']:14.3f} "
                  f"{r['time_s']:7.2f} {r['anneal_same_time']:16.3f}", flush=True)  # fmt: skip
        summary = {k: geomean([r[k] for r in rows]) for k in ("heft", "heft_lookahead", "anneal_same_time")}
        summary["better_than_best_cheap"] = sum(r["heft_lookahead"] < 1 - 1e-9 for r in rows)
        summary["better_than_anneal_same_time"] = sum(r["heft_lookahead"] < r["anneal_same_time"] for r in rows)
        summary["rows"] = len(rows)
        print(f"{split}: geomean over {len(rows)} pairs / best cheap: heft {summary['heft']:.3f}, heft_lookahead "
              f"{summary['heft_lookahead']:.3f} (better than best cheap on {summary['better_than_best_cheap']}), "
              f"anneal with the same time {summary['anneal_same_time']:.3f} (heft_lookahead better on "
              f"{summary['better_than_anneal_same_time']})\n", flush=True)  # fmt: skip
        out[split] = {"rows": rows, "summary": summary}
    if args.out:
        write_json(args.out, out)


if __name__ == "__main__":
    main()
