"""Policy search against blind search at equal time: ``doppler --budget-s S`` and ``anneal --budget-s S``.

    python benchmarks/experiments/budget_search.py [--budget-s 5] [--seeds 3] [--rows NAME,...] [--baselines out/baselines.json]
                                       [--long-s 60] [--threads N]

On the held-out rows of :func:`doppler.workloads.corpus.held_out_split`, both searches run one after the
other for each seed (interleaved, so a noisy machine slows both alike), with the shipped pretrained
policy. Makespans are simulated and divided by the row's best cheap method (critical_path, heft,
enumerative, round_robin_block, metis). Also printed: how many policy samples the search drew (it
stops sampling once the policy has used a tenth of the budget), and, given the policy-free cache of
``benchmarks/generalization.py --baselines``, its long anneal column (60 s by default). With
``--long-s L`` the long anneal runs here instead, for every seed, right after the two short
searches: the column to use when the annealer itself changed since the cache was filled (for
example its cores: ``--threads``, default every core, is passed to all three searches). The last
line is the geometric means: doppler / anneal at S, and doppler / the long anneal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from doppler.workloads.corpus import held_out_split
from doppler.methods import assign
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: generalization.py
from generalization import CHEAP, geomean, makespan  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=5.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", default=None, help="comma list of held-out row names (default: all)")
    ap.add_argument("--baselines", default=None, help="the policy-free cache of benchmarks/generalization.py")
    ap.add_argument("--long-s", type=float, default=None, help="run the long anneal here for this long (per seed)")
    ap.add_argument("--threads", type=int, default=None, help="cores of every search (default: all)")
    args = ap.parse_args()
    cached = json.loads(Path(args.baselines).read_text()) if args.baselines else {"rows": {}, "settings": {}}
    cache, long_s = cached["rows"], args.long_s or cached["settings"].get("anneal_long_s", 60.0)
    where = "measured" if args.long_s else "cached"
    wanted = set(args.rows.split(",")) if args.rows else None
    S = args.budget_s
    print(f"| graph / cluster | ops | samples drawn | doppler {S:g}s | anneal {S:g}s | anneal {long_s:g}s ({where}) |")
    print("|---|---|---|---|---|---|")
    ratios_short, ratios_long = [], []
    for case in held_out_split():
        if wanted is not None and case.name not in wanted:
            continue
        g, cl = case.graph, case.cluster
        if case.name in cache:
            ref = cache[case.name]["best_cheap_s"]
        else:
            ref = min(makespan(g, cl, assign(g, cl, m)) for m in CHEAP)
        ours, blind, drawn, longs = [], [], [], []
        for seed in range(args.seeds):
            a = assign(g, cl, "anneal", seed=seed, budget_s=S, threads=args.threads)
            blind.append(makespan(g, cl, a) / ref)
            d = assign(g, cl, "doppler", seed=seed, budget_s=S, threads=args.threads)
            ours.append(makespan(g, cl, d) / ref)
            drawn.append(d.info["samples"])
            if args.long_s:
                longs.append(makespan(g, cl, assign(g, cl, "anneal", seed=seed, budget_s=args.long_s,
                                                    threads=args.threads)) / ref)  # fmt: skip
        long = float(np.mean(longs)) if longs else cache.get(case.name, {}).get("anneal_long")
        ratios_short.append(np.mean(ours) / np.mean(blind))
        if long:
            ratios_long.append(np.mean(ours) / long)
        print(f"| {case.name} | {g.num_ops} | {drawn} | {np.mean(ours):.3f} ±{np.ptp(ours):.3f} | "
              f"{np.mean(blind):.3f} ±{np.ptp(blind):.3f} | {long if long is None else f'{long:.3f}'} |", flush=True)
    print(f"\ngeomean doppler {S:g}s / anneal {S:g}s: {geomean(ratios_short):.4f}"
          + (f"; doppler {S:g}s / anneal {long_s:g}s ({where}): {geomean(ratios_long):.4f}" if ratios_long else ""))


if __name__ == "__main__":
    main()
