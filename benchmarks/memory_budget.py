"""What keeping to a memory budget costs each memory-aware method, on the held-out rows.

    python benchmarks/memory_budget.py [--shares 0.95,0.85] [--methods heft,critical_path,doppler,anneal]
                                       [--anneal-evals 3000] [--out F.json]

For each held-out (graph, cluster) of :func:`doppler.workloads.corpus.held_out_split` and each method: its placement
without a budget (``--ignore-memory``), the largest peak memory it holds on a device, and then its placement
with every device's memory set so that the budget (``memory_bytes x 0.9``) is ``share`` of that peak. Prints
the makespan with the budget over the makespan without it (lower is better; ``-`` where the method said the
graph does not fit), and writes the rows as JSON. ``doppler`` is the shipped policy's greedy decode (zero-shot),
masked by the memory ledger; ``anneal`` runs ``--anneal-evals`` evaluations. About a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from doppler.workloads.corpus import held_out_split
from doppler.util.io import write_json
from doppler.memory import DEFAULT_MEMORY_FRACTION
from doppler.methods import MethodError, assign
from doppler.sim import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shares", default="0.95,0.85")
    ap.add_argument("--methods", default="heft,critical_path,enumerative,doppler,anneal")
    ap.add_argument("--anneal-evals", type=int, default=3000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shares = [float(x) for x in args.shares.split(",")]
    methods = [m.strip() for m in args.methods.split(",")]
    kw = {"anneal": {"max_evals": args.anneal_evals}}
    rows = []
    print("| row | method | free peak (MB) | " + " | ".join(f"{s:g} of it: makespan ratio" for s in shares) + " |")
    print("|---|---|---|" + "---|" * len(shares))
    for case in held_out_split():
        g, c = case.graph, case.cluster
        for m in methods:
            free = assign(g, c, m, ignore_memory=True, **kw.get(m, {}))
            r = simulate(g, c, free, trace=True)
            row = {"row": case.name, "method": m, "free_makespan_s": r.makespan_s,
                   "free_peak_bytes": float(r.peak_memory_bytes.max()), "ratios": {}}  # fmt: skip
            for share in shares:
                cap = row["free_peak_bytes"] * share / DEFAULT_MEMORY_FRACTION
                tight = dataclasses.replace(c, devices=[dataclasses.replace(d, memory_bytes=cap) for d in c.devices])
                try:
                    a = assign(g, tight, m, **kw.get(m, {}))
                    row["ratios"][str(share)] = simulate(g, tight, a).makespan_s / r.makespan_s
                except MethodError:
                    row["ratios"][str(share)] = None
            rows.append(row)
            cells = ["-" if row["ratios"][str(s)] is None else f"{row['ratios'][str(s)]:.3f}" for s in shares]
            print(f"| {case.name} | {m} | {row['free_peak_bytes'] / 1e6:.0f} | " + " | ".join(cells) + " |", flush=True)
    for m in methods:
        for s in shares:
            vals = [r["ratios"][str(s)] for r in rows if r["method"] == m]
            fit = [v for v in vals if v is not None]
            geo = float(np.exp(np.mean(np.log(fit)))) if fit else float("nan")
            print(f"{m} at {s:g}: fits {len(fit)} of {len(vals)} rows, makespan ratio geomean {geo:.3f}")
    if args.out:
        write_json(args.out, {"shares": shares, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
