"""Which op features transfer? Pretrain with each feature set, judge zero-shot on the held-out split.

    python benchmarks/experiments/feature_ablation.py [--train-s 300] [--seeds 1,2,3] [--sets structural,full] [--dir D]
    python benchmarks/experiments/feature_ablation.py --eval-only --dir D     # judge runs already in D/{set}-{seed}

``structural`` is the paper's five static features (compute, b-level, t-level, input and output
communication); ``full`` adds each tile's block coordinates and two op-id values, which identify
positions inside one graph. Each (set, seed) pretrains for ``--train-s`` seconds of updates on
the corpus (same seeds, same corpus stream per seed), then decodes greedily every held-out row.
Printed: per set, the geometric mean over rows of greedy / best cheap method and of greedy /
critical_path, as mean and spread (max - min) over seeds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from doppler.methods import assign
from doppler.workloads.corpus import held_out_split
from doppler.sim import simulate

CHEAP = ("critical_path", "heft", "enumerative", "round_robin_block", "metis")


def references(cases) -> list[tuple]:
    """(case, best cheap makespan, critical_path makespan) per case."""
    refs = []
    for case in cases:
        ms = {m: simulate(case.graph, case.cluster, assign(case.graph, case.cluster, m)).makespan_s for m in CHEAP}
        refs.append((case, min(ms.values()), ms["critical_path"]))
    return refs


def judge(ckpt: Path | None, refs: list[tuple], plc_ties_only: bool | None = None) -> tuple[float, float, int]:
    """Zero-shot greedy decodes of ``ckpt`` (None: the shipped policy) on ``refs``' cases: (geomean
    greedy / best cheap, geomean greedy / critical_path, cases not worse than critical_path).
    ``plc_ties_only``: the method's option (None: its zero-shot default)."""
    vs_cheap, vs_cp = [], []
    for case, best_cheap, cp in refs:
        a = assign(case.graph, case.cluster, "doppler", checkpoint=ckpt, plc_ties_only=plc_ties_only)
        ms = simulate(case.graph, case.cluster, a).makespan_s
        vs_cheap.append(ms / best_cheap)
        vs_cp.append(ms / cp)
    ratio_cp = np.asarray(vs_cp)
    return (float(np.exp(np.mean(np.log(vs_cheap)))), float(np.exp(np.mean(np.log(ratio_cp)))),
            int((ratio_cp <= 1.0 + 1e-9).sum()))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-s", type=float, default=300.0)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--sets", default="structural,full")
    ap.add_argument("--dir", default="out/feature_ablation")
    ap.add_argument("--eval-only", action="store_true")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    sets = args.sets.split(",")
    root = Path(args.dir)
    if not args.eval_only:
        from doppler.train.pretrain import Pretrainer, pretrain_config

        for seed in seeds:
            for fs in sets:
                pt = Pretrainer.create(pretrain_config(seed=seed, op_features=fs, torch_threads=1), args.train_s)
                pt.run(root / f"{fs}-{seed}")
    refs = references(held_out_split())
    print("| op features | greedy / best cheap (geomean over rows) | greedy / critical_path | seeds |")
    print("|---|---|---|---|")
    for fs in sets:
        got = [judge(root / f"{fs}-{seed}" / "checkpoint.pt", refs) for seed in seeds]
        a, b = np.array([g[0] for g in got]), np.array([g[1] for g in got])
        print(f"| {fs} | {a.mean():.3f} (spread {a.max() - a.min():.3f}) | {b.mean():.3f} (spread {b.max() - b.min():.3f}) "
              f"| {len(seeds)} |", flush=True)


if __name__ == "__main__":
    main()
