"""Distillation with and without ``--distill-on-policy``, from the same Stage II run, side by side.

    python benchmarks/experiments/distill_on_policy.py [--graphs chainmm,ffnn,llama_block,llama_layer] [--seeds 3]
                                           [--cluster p100x4] [--episodes 1000] [--weights 0,1] [--no-device-identity]
                                           [--out DIR]

For each graph and seed, Stage II runs once (the demo's settings: 512 imitation episodes, then
``--episodes`` simulator episodes, no distillation; a learned state per device, as ``doppler train``
has by default, so the device head can tell alike devices apart; ``--no-device-identity``: without) and is saved. Distillation then starts from
that same saved state once per weight W of the on-policy term (``TrainConfig.distill_on_policy``;
0 is plain replay of the best trajectory), for up to ``--distill-updates`` updates. The stage
stops as soon as the greedy decode is as good as the best assignment Stage II found ("matched").

Printed per (graph, seed, W): the distillation updates and seconds it took, whether it matched,
and the greedy decode over the best assignment (1.000 when matched). The last lines give, per W,
how many runs matched and the total updates and seconds, so the cost of the term on these graphs
reads side by side with plain replay. Torch threads: ``TrainConfig``'s default (2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path

from doppler import cluster, workloads
from doppler.train import TrainConfig, Trainer


def stage_two(graph, cl, seed: int, episodes: int, il_episodes: int, device_identity: bool | None,
              run_dir: Path) -> float:  # fmt: skip
    """Imitation and Stage II with the demo's settings, saved in ``run_dir``; returns its seconds."""
    tr = Trainer.create([graph], cl, TrainConfig(episodes=episodes, il_episodes=il_episodes, seed=seed,
                                                 distill_updates=0, device_identity=device_identity))  # fmt: skip
    t0 = time.perf_counter()
    tr.run(run_dir)
    return time.perf_counter() - t0


def distill(graph, cl, saved: Path, weight: float, updates: int, work: Path) -> dict:
    """Distillation alone, from the state saved by :func:`stage_two`, with on-policy weight ``weight``."""
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(saved / "checkpoint.pt", work / "checkpoint.pt")
    tr = Trainer.resume(work, [graph], cl)
    tr.distill_step = 0
    tr.cfg = dataclasses.replace(tr.cfg, distill_updates=updates, distill_on_policy=weight)
    t0 = time.perf_counter()
    tr.run(None)
    seconds = time.perf_counter() - t0
    task = tr.tasks[0]
    _, greedy_s = tr.greedy(task)
    done = sum(1 for h in tr.history if h.get("stage_distill"))
    return {"updates": done, "seconds": seconds, "greedy_over_best": greedy_s / task.best_makespan_s,
            "matched": greedy_s <= task.best_makespan_s * (1 + 1e-9)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", default="chainmm,ffnn,llama_block,llama_layer")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cluster", default="p100x4")
    ap.add_argument("--episodes", type=int, default=1000, help="Stage II episodes (the demo's 1000)")
    ap.add_argument("--il-episodes", type=int, default=512, help="Stage I episodes (the demo's 512)")
    ap.add_argument("--distill-updates", type=int, default=1000)
    ap.add_argument("--weights", default="0,1", help="comma list of on-policy weights W to compare")
    ap.add_argument("--device-identity", action=argparse.BooleanOptionalAction, default=None,
                    help="train with a learned state per device (doppler train's default: on), or without")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory)")
    args = ap.parse_args()
    cl = cluster(args.cluster)
    weights = [float(w) for w in args.weights.split(",")]
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="distill_on_policy_"))
    print("| graph | seed | W | distillation updates | seconds | matched | greedy / best |")
    print("|---|---|---|---|---|---|---|")
    totals = {w: [0, 0, 0.0] for w in weights}  # matched runs, updates, seconds
    for seed in range(args.seeds):
        for name in args.graphs.split(","):
            g = workloads.build(name)
            saved = root / f"{name}_{seed}{'' if args.device_identity is False else '_identity'}" / "stage2"
            if not (saved / "checkpoint.pt").is_file():
                stage_two(g, cl, seed, args.episodes, args.il_episodes, args.device_identity, saved)
            for w in weights:
                r = distill(g, cl, saved, w, args.distill_updates, saved.parent / f"w{w:g}")
                totals[w][0] += r["matched"]
                totals[w][1] += r["updates"]
                totals[w][2] += r["seconds"]
                print(f"| {name} | {seed} | {w:g} | {r['updates']} | {r['seconds']:.0f} | {'yes' if r['matched'] else 'no'} | "
                      f"{r['greedy_over_best']:.3f} |", flush=True)  # fmt: skip
    runs = args.seeds * len(args.graphs.split(","))
    for w, (matched, updates, seconds) in totals.items():
        print(f"W={w:g}: matched {matched} of {runs} runs, {updates} distillation updates, {seconds:.0f} s in all")
    print(json.dumps({"root": str(root), "totals": {str(w): t for w, t in totals.items()}}))


if __name__ == "__main__":
    main()
