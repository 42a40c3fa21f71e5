"""ANNEAL with pools of moves against one move per proposal, at the same wall-clock budget.

    python benchmarks/experiments/anneal_pool.py [--split validation|held_out] [--budget-s 2] [--seeds 2]
                                     [--pools 1,4] [--out F.json]

Per pair (the 40 validation pairs of :func:`doppler.workloads.corpus.validation_split`, or the 10 held-out
rows): ``anneal`` with each ``--pools`` size for ``--budget-s`` seconds on every core, seeds
0..``--seeds``-1 one after the other, the mean simulated makespan over the pair's best cheap method
(lower is better). With ``pool=P`` each proposal is the best of P drawn moves by the compute and
transfer time it adds (``_anneal_loops.time_added``), and only that one is simulated. The last lines:
the geometric mean per pool size, and per size against the first, the pairs better and worse, also
for the pairs of 300 ops or more. Run it on a quiet machine: the budget is wall clock.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: generalization.py
from generalization import CHEAP, geomean  # noqa: E402

from doppler.workloads.corpus import held_out_split, validation_split
from doppler.util.io import write_json
from doppler.methods import assign
from doppler.methods.anneal import AnnealOptions, anneal_search
from doppler.sim import SimContext


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--split", choices=("validation", "held_out"), default="validation")
    ap.add_argument("--budget-s", type=float, default=2.0)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--pools", default="1,4", help="comma-separated pool sizes; the first is the reference")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    pools = [int(p) for p in args.pools.split(",")]
    cases = validation_split(40) if args.split == "validation" else held_out_split()
    anneal_search(cases[0].graph, cases[0].cluster, AnnealOptions(max_evals=100, pool=max(pools)))  # numba's start, not timed
    print(f"| pair | ops | {' | '.join(f'pool {p}' for p in pools)} |")
    print(f"|---|---|{'---|' * len(pools)}")
    rows = []
    for case in cases:
        g, cl = case.graph, case.cluster
        ctx = SimContext(g, cl)
        best_cheap = float(ctx.simulate_many(np.stack([assign(g, cl, m).devices for m in CHEAP])).min())
        ratios = {}
        for p in pools:
            runs = [anneal_search(g, cl, AnnealOptions(pool=p), seed=s, budget_s=args.budget_s).estimated_makespan_s
                    for s in range(args.seeds)]  # fmt: skip
            ratios[p] = float(np.mean(runs)) / best_cheap
        rows.append({"name": case.name, "ops": g.num_ops, "ratios": ratios})
        print(f"| {case.name} | {g.num_ops} | {' | '.join(f'{ratios[p]:.4f}' for p in pools)} |", flush=True)
    ref = pools[0]
    for p in pools:
        line = f"pool {p}: geomean {geomean([r['ratios'][p] for r in rows]):.4f} x best cheap"
        if p != ref:
            for label, sel in (("all", rows), (">= 300 ops", [r for r in rows if r["ops"] >= 300])):
                rel = np.array([r["ratios"][p] / r["ratios"][ref] for r in sel])
                line += (f"; {label}: {geomean(rel):.4f}x pool {ref}, better on {int((rel < 1 - 1e-9).sum())}, "
                         f"worse on {int((rel > 1 + 1e-9).sum())} of {len(rel)}")  # fmt: skip
        print(line)
    if args.out:
        write_json(args.out, {"args": vars(args), "rows": [{**r, "ratios": {str(k): v for k, v in r["ratios"].items()}}
                                                          for r in rows]})  # fmt: skip


if __name__ == "__main__":
    main()
