"""How good is direct search in the simulator? ANNEAL vs the list schedulers.

    python benchmarks/anneal_quality.py [--quick] [--short-s 60] [--long-s 600] [--seed 0]
        [--workloads chainmm,ffnn,llama_block,llama_layer] [--clusters p100x4,links10] [--out F.json]

For each paper workload (chainmm, ffnn, llama_block, llama_layer at the
``paper`` size) on ``p100x4`` and on ``p100x4`` with every link 10x slower
(``Cluster.scaled_links(10)``), it reports the simulated makespan of
critical_path, heft, enumerative and anneal with a short and a long budget
(same seed: the long run continues the short run's trajectory), then

* ``gain``: improvement of the short anneal over best(critical_path, heft),
  ``1 - anneal / best`` (anneal starts from that best, so it is >= 0);
* ``long gain``: the same for the long anneal;
* ``60 vs 600``: how much further the long run got, ``1 - long / short``.

``--quick`` uses 5 s / 20 s budgets for a smoke run (about 3.5 minutes).
"""

from __future__ import annotations

import argparse
import time

from doppler import workloads
from doppler.methods import assign
from doppler.hardware.presets import cluster
from doppler.util.io import write_json
from doppler.sim import lower_bound, simulate

WORKLOADS = ("chainmm", "ffnn", "llama_block", "llama_layer")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 s / 20 s budgets")
    p.add_argument("--short-s", type=float, default=60.0)
    p.add_argument("--long-s", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", default="paper")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--clusters", default="p100x4,links10",
                   help="comma-separated: p100x4 and/or links10 (p100x4 with every link 10x slower)")
    p.add_argument("--out", default=None, help="also write the rows as JSON")
    args = p.parse_args()
    short_s, long_s = (5.0, 20.0) if args.quick else (args.short_s, args.long_s)

    base = cluster("p100x4")
    known = {"p100x4": ("p100x4", base), "links10": ("p100x4 links/10", base.scaled_links(10))}
    picked = args.clusters.split(",")
    unknown = [k for k in picked if k not in known]
    if unknown:
        p.error(f"unknown cluster {unknown[0]!r}; choose from {', '.join(known)}")
    clusters = dict(known[k] for k in picked)
    rows = []
    hdr = (
        f"{'cluster':<16} {'workload':<12} {'LB ms':>8} {'crit ms':>8} {'heft ms':>8} {'enum ms':>8} "
        f"{f'ann{short_s:g}s':>9} {f'ann{long_s:g}s':>9} {'gain':>7} {'long gain':>9} {f'{short_s:g} vs {long_s:g}':>10}"
    )
    print(hdr)
    print("-" * len(hdr))
    t_all = time.perf_counter()
    for cname, c in clusters.items():
        for w in args.workloads.split(","):
            g = workloads.build(w, size=args.size)
            lb = lower_bound(g, c)
            ms = {m: simulate(g, c, assign(g, c, m)).makespan_s for m in ("critical_path", "heft", "enumerative")}
            a_short = assign(g, c, "anneal", seed=args.seed, budget_s=short_s)
            a_long = assign(g, c, "anneal", seed=args.seed, budget_s=long_s)
            s_ms = simulate(g, c, a_short).makespan_s
            l_ms = simulate(g, c, a_long).makespan_s
            best_list = min(ms["critical_path"], ms["heft"])
            row = {
                "cluster": cname,
                "workload": w,
                "num_ops": g.num_ops,
                "lower_bound_s": lb,
                "critical_path_s": ms["critical_path"],
                "heft_s": ms["heft"],
                "enumerative_s": ms["enumerative"],
                "anneal_short_s": s_ms,
                "anneal_long_s": l_ms,
                "short_budget_s": short_s,
                "long_budget_s": long_s,
                "anneal_short_evals": a_short.info["evals"],
                "anneal_long_evals": a_long.info["evals"],
                "gain_short": 1 - s_ms / best_list,
                "gain_long": 1 - l_ms / best_list,
                "short_vs_long": 1 - l_ms / s_ms,
            }
            rows.append(row)
            print(
                f"{cname:<16} {w:<12} {lb * 1e3:8.2f} {ms['critical_path'] * 1e3:8.2f} {ms['heft'] * 1e3:8.2f} "
                f"{ms['enumerative'] * 1e3:8.2f} {s_ms * 1e3:9.2f} {l_ms * 1e3:9.2f} {row['gain_short']:7.1%} "
                f"{row['gain_long']:9.1%} {row['short_vs_long']:10.1%}",
                flush=True,
            )
    print(f"\ntotal {time.perf_counter() - t_all:.0f} s; anneal evaluations short/long per row: "
          + ", ".join(f"{r['anneal_short_evals']}/{r['anneal_long_evals']}" for r in rows))  # fmt: skip
    if args.out:
        write_json(args.out, rows, indent=1)


if __name__ == "__main__":
    main()
