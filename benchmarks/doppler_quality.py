"""How good is the learned policy? DOPPLER vs critical_path, enumerative and anneal.

    python benchmarks/doppler_quality.py [--workloads chainmm,ffnn,llama_block,llama_layer]
        [--clusters p100x4,links10] [--anneal-s 60] [--episodes-scale 1.0] [--seed 0] [--out F.json]

For each paper workload (paper size) on ``p100x4`` and on ``p100x4`` with every
link 10x slower, it trains DOPPLER (Stage I imitation of critical_path, then Stage
II in the simulator with the paper's budgets: 4000 episodes for chainmm/ffnn, 8000
for the LLaMA graphs, times ``--episodes-scale``) and reports the simulated
makespan of the greedy decode and of the best of 64 samples (``doppler assign
--samples 64``), next to critical_path, enumerative (the paper's EnumOpt) and
anneal with ``--anneal-s`` seconds, plus both DOPPLER assignment times.

Bars (issue): greedy strictly better than critical_path everywhere; at least as
good as enumerative in >= 6 of 8 settings; within 10% of anneal (3% with 64 samples).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from doppler import workloads
from doppler.methods import assign
from doppler.hardware.presets import cluster
from doppler.util.io import write_json
from doppler.sim import lower_bound, simulate
from doppler.methods.anneal import WARM_START_METHODS
from doppler.train import Trainer, TrainConfig

WORKLOADS = ("chainmm", "ffnn", "llama_block", "llama_layer")
EPISODES = {"chainmm": 4000, "ffnn": 4000, "llama_block": 8000, "llama_layer": 8000}


def clusters(names: list[str]):
    base = cluster("p100x4")
    table = {"p100x4": base, "links10": base.scaled_links(10)}
    return [(n, table[n]) for n in names]


def run_setting(wname: str, cname: str, cl, args) -> dict:
    g = workloads.build(wname)
    seeds = tuple(m for m in args.warm_start.split(",") if m and m != "none")
    cfg = TrainConfig(episodes=int(EPISODES[wname] * args.episodes_scale), seed=args.seed, torch_threads=args.threads,
                      sim_seed_methods=seeds, search_every=args.search_every, search_evals=args.search_evals)  # fmt: skip
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        tr = Trainer.create([g], cl, cfg)
        tr.run(run_dir)
        train_s = time.perf_counter() - t0
        if args.curves:
            from doppler.report import training_curve

            training_curve(tr.history, f"{args.curves}/{wname}_{cname}.png", title=f"DOPPLER on {wname}, {cname}")
        ckpt = f"{run_dir}/checkpoint.pt"
        greedy = assign(g, cl, "doppler", checkpoint=ckpt)
        sampled = assign(g, cl, "doppler", checkpoint=ckpt, samples=64, seed=args.seed)
    row = {
        "workload": wname,
        "cluster": cname,
        "lower_bound_s": lower_bound(g, cl),
        "episodes": tr.episode,
        "train_s": train_s,
        "doppler_greedy_s": simulate(g, cl, greedy).makespan_s,
        "doppler_greedy_assign_s": greedy.assign_time_s,
        "doppler_64_s": simulate(g, cl, sampled).makespan_s,
        "doppler_64_assign_s": sampled.assign_time_s,
    }
    for m in ("critical_path", "enumerative"):
        row[f"{m}_s"] = simulate(g, cl, assign(g, cl, m)).makespan_s
    row["anneal_s"] = simulate(g, cl, assign(g, cl, "anneal", budget_s=args.anneal_s, seed=args.seed)).makespan_s
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--clusters", default="p100x4,links10")
    p.add_argument("--anneal-s", type=float, default=60.0)
    p.add_argument("--episodes-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch threads (1 when running two of these side by side)")
    p.add_argument("--out", default=None, help="also write the rows as JSON")
    p.add_argument("--warm-start", default=",".join(WARM_START_METHODS),
                   help="methods whose best assignment Stage II starts from (doppler train --warm-start); none: off")
    p.add_argument("--search-every", type=int, default=TrainConfig.search_every,
                   help="Stage II episodes between local searches from the incumbent (doppler train --search-every)")
    p.add_argument("--search-evals", type=int, default=TrainConfig.search_evals,
                   help="simulator evaluations per local search (doppler train --search-evals)")
    p.add_argument("--curves", default=None, help="also write a training-curve PNG per setting into this folder")
    args = p.parse_args()
    rows = []
    hdr = (f"{'cluster':8s} {'workload':12s} {'LB':>7s} {'crit.path':>9s} {'enum':>7s} {'anneal':>7s} "
           f"{'DOP.greedy':>10s} {'DOP.64':>7s} {'greedy/anneal':>13s} {'64/anneal':>9s} {'train s':>7s} "
           f"{'assign s (greedy / 64)':>22s}")  # fmt: skip
    print("simulated makespans in ms", flush=True)
    print(hdr, flush=True)
    for cname, cl in clusters(args.clusters.split(",")):
        for w in args.workloads.split(","):
            r = run_setting(w, cname, cl, args)
            rows.append(r)
            ms = {k: v * 1e3 for k, v in r.items() if k.endswith("_s") and "assign" not in k and k != "train_s"}
            print(f"{cname:8s} {w:12s} {ms['lower_bound_s']:7.2f} {ms['critical_path_s']:9.2f} {ms['enumerative_s']:7.2f} "
                  f"{ms['anneal_s']:7.2f} {ms['doppler_greedy_s']:10.2f} {ms['doppler_64_s']:7.2f} "
                  f"{r['doppler_greedy_s'] / r['anneal_s']:13.3f} {r['doppler_64_s'] / r['anneal_s']:9.3f} "
                  f"{r['train_s']:7.0f} {r['doppler_greedy_assign_s']:10.2f} / {r['doppler_64_assign_s']:.2f}",
                  flush=True)  # fmt: skip
    beats_cp = sum(r["doppler_greedy_s"] < r["critical_path_s"] for r in rows)
    ties_enum = sum(r["doppler_greedy_s"] <= r["enumerative_s"] * (1 + 1e-9) for r in rows)
    within10 = sum(r["doppler_greedy_s"] <= 1.10 * r["anneal_s"] for r in rows)
    within3 = sum(r["doppler_64_s"] <= 1.03 * r["anneal_s"] for r in rows)
    n = len(rows)
    print(f"\ngreedy < critical_path: {beats_cp}/{n}; greedy <= enumerative: {ties_enum}/{n}; "
          f"greedy within 10% of anneal: {within10}/{n}; 64 samples within 3% of anneal: {within3}/{n}")  # fmt: skip
    if args.out:
        write_json(args.out, rows, indent=1)


if __name__ == "__main__":
    main()
