"""The learned placers on the same footing: DOPPLER, its single-head ablations, the single policy,
GDP and PLACETO, each trained by the same loop (``doppler.train``) on the same graphs and clusters.

    python benchmarks/learned_baselines.py [--scale 1.0] [--seeds 3] [--jobs N] [--anneal-s 60]
        [--workloads chainmm,ffnn,llama_block,llama_layer] [--clusters p100x4,links10]
        [--methods ...] [--regimes alone,full] [--shard I/K] [--out runs.jsonl]
    python benchmarks/learned_baselines.py --report runs.jsonl [more.jsonl ...] [--markdown table.md]
    python benchmarks/learned_baselines.py --zero-shot [--scale 0.1] [--seeds 3] [--out zs.jsonl]
    python benchmarks/learned_baselines.py --speed 4 [--workloads llama_layer] [--clusters p100x4]

Clusters: ``p100x4``, and ``links10`` (p100x4 with every link 10x slower). Budgets: the paper's episode counts times ``--scale`` (Stage II: 4,000 episodes for chainmm and
ffnn, 8,000 for the LLaMA graphs; Stage I: 1,024), the same for every method.

Two regimes, reported separately:

* ``alone`` (learning alone): ``--warm-start none --search-every 0`` and no distillation: Stage I
  imitation of CRITICAL PATH, then REINFORCE with the self-improvement term on the policy's own
  samples. This is what each architecture learns by itself.
* ``full`` (the full recipe): the defaults: warm start from the cheap methods, expert iteration
  (annealing from the incumbent every 500 episodes) and the final distillation into the greedy decode.

Per cell: the greedy decode's simulated makespan (mean and spread over ``--seeds`` seeds; spread =
max - min), Stage II episodes/s, and the greedy inference time (encoder + decode, after training).
Next to them: ``critical_path``, ``enumerative`` and ``anneal`` for ``--anneal-s`` seconds.
Every run is one process with one torch thread, ``--jobs`` at a time (``--cuda-methods``: those
methods' networks run on the GPU, which changes their speed, not what they learn) (runs can be split with
``--shard`` across machines and merged with ``--report``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

WORKLOADS = ("chainmm", "ffnn", "llama_block", "llama_layer")
CLUSTERS = ("p100x4", "links10")
METHODS = ("doppler", "doppler_sel", "doppler_plc", "single_policy", "gdp", "placeto")
REGIMES = ("alone", "full")
PAPER_EPISODES = {"chainmm": 4000, "ffnn": 4000, "llama_block": 8000, "llama_layer": 8000}
PAPER_IL_EPISODES = 1024
BASELINES = ("critical_path", "enumerative", "anneal")


@dataclass(frozen=True)
class Job:
    workload: str
    cluster: str
    method: str  # a learned method, or a baseline of BASELINES
    regime: str = ""  # alone | full (learned methods)
    seed: int = 0
    episodes: int = 0
    il_episodes: int = 0
    anneal_s: float = 0.0
    device: str = "cpu"  # where the networks run (rollouts and the simulator stay on the CPU)


def make_cluster(name: str):
    """A preset, or ``links10``: p100x4 with every link 10x slower (as benchmarks/doppler_quality.py)."""
    from doppler.hardware.presets import cluster

    return cluster("p100x4").scaled_links(10) if name == "links10" else cluster(name)


def run_job(job: Job) -> dict:
    """Train (or run) one cell in this process; returns the job and what it measured."""
    import torch

    torch.set_num_threads(1)
    from doppler import workloads
    from doppler.sim import simulate

    g, cl = workloads.build(job.workload), make_cluster(job.cluster)
    t0 = time.perf_counter()
    if job.method in BASELINES:
        from doppler.methods import assign

        a = assign(g, cl, job.method, seed=job.seed, budget_s=job.anneal_s if job.method == "anneal" else None)
        return {**asdict(job), "makespan_s": float(simulate(g, cl, a.devices).makespan_s),
                "wall_s": time.perf_counter() - t0}  # fmt: skip
    from doppler.policy.rollout import rollout
    from doppler.train import TrainConfig, Trainer

    cfg = TrainConfig(method=job.method, episodes=job.episodes, il_episodes=job.il_episodes, seed=job.seed,
                      torch_threads=1, checkpoint_every=10**9, device=job.device,
                      device_identity=False)  # as measured (docs/research/learned_baselines.md): before identity was the default
    if job.regime == "alone":
        cfg.sim_seed_methods, cfg.search_every, cfg.distill_updates = (), 0, 0
    tr = Trainer.create([g], cl, cfg)
    tr.run(None)
    train_s = time.perf_counter() - t0
    task = tr.tasks[0]
    sim_rows = [h for h in tr.history if not (h["stage_il"] or h["stage_distill"] or h["stage_real"])]
    il_rows = [h for h in tr.history if h["stage_il"]]
    tr.policy.eval()
    infer = []
    for _ in range(3):
        t1 = time.perf_counter()
        with torch.no_grad():
            ro = rollout(task.features, tr.policy.encode(task.features), batch=1, mode="greedy")
        infer.append(time.perf_counter() - t1)
    return {
        **asdict(job),
        "makespan_s": float(simulate(g, cl, ro.assignment[0]).makespan_s),
        "best_seen_s": task.best_makespan_s,
        "train_s": train_s,
        "episodes_per_s": sim_rows[-1]["episodes_per_s"] if sim_rows else float("nan"),
        "il_episodes_per_s": il_rows[-1]["episodes_per_s"] if il_rows else float("nan"),
        "inference_s": min(infer),
    }


def speed(workload: str, cluster_name: str, methods: list[str], updates: int) -> None:
    """Stage II episodes/s of every method, side by side in this process (one torch thread, no warm
    start, search or distillation): the cost comparison, free of the load of parallel runs."""
    import torch

    from doppler import workloads
    from doppler.train import TrainConfig, Trainer

    torch.set_num_threads(1)
    g, cl = workloads.build(workload), make_cluster(cluster_name)
    rates = {}
    for m in methods:
        cfg = TrainConfig(method=m, stages=("sim",), episodes=8 * (updates + 1), seed=0, torch_threads=1,
                          sim_seed_methods=(), search_every=0, distill_updates=0, checkpoint_every=10**9)  # fmt: skip
        tr = Trainer.create([g], cl, cfg)
        tr.rl_update()  # the first update compiles and allocates: not timed
        t0 = time.perf_counter()
        for _ in range(updates):
            tr.rl_update()
        rates[m] = 8 * updates / (time.perf_counter() - t0)
    print(f"Stage II episodes/s on {workload} ({g.num_ops} ops), {cluster_name}, one process, one torch thread:")
    for m, r in rates.items():
        ratio = f"  (per-episode time {rates['doppler'] / r:.1f}x doppler's)" if "doppler" in rates else ""
        print(f"  {m:14s} {r:8.2f}{ratio}")


ZERO_SHOT_TRAIN = ("chainmm", "ffnn", "llama_block")
ZERO_SHOT_MAX_OPS = 1000


def zero_shot_job(method: str, seed: int, episodes: int, il_episodes: int) -> dict:
    """Train ``method`` on the three training workloads together on p100x4 (position-free op features,
    learning alone), then decode greedily every held-out row (up to 1,000 ops) it can serve."""
    import torch

    torch.set_num_threads(1)
    from doppler import workloads
    from doppler.workloads.corpus import held_out_split
    from doppler.methods import assign
    from doppler.policy.features import graph_features
    from doppler.policy.rollout import rollout
    from doppler.sim import simulate
    from doppler.train import TrainConfig, Trainer

    cfg = TrainConfig(method=method, episodes=episodes, il_episodes=il_episodes, seed=seed, op_features="structural",
                      sim_seed_methods=(), search_every=0, distill_updates=0, torch_threads=1, checkpoint_every=10**9,
                      device_identity=False)  # the policy is applied to other clusters: no per-device states  # fmt: skip
    t0 = time.perf_counter()
    tr = Trainer.create([workloads.build(w) for w in ZERO_SHOT_TRAIN], make_cluster("p100x4"), cfg)
    tr.run(None)
    out = {"method": method, "seed": seed, "episodes": episodes, "il_episodes": il_episodes,
           "train_s": time.perf_counter() - t0, "rows": {}}  # fmt: skip
    tr.policy.eval()
    for case in held_out_split():
        if case.graph.num_ops > ZERO_SHOT_MAX_OPS:
            continue
        cp = simulate(case.graph, case.cluster, assign(case.graph, case.cluster, "critical_path").devices).makespan_s
        row = {"critical_path_s": cp}
        try:
            gf = graph_features(case.graph, case.cluster)
            t1 = time.perf_counter()
            with torch.no_grad():
                ro = rollout(gf, tr.policy.encode(gf), batch=1, mode="greedy")
            row.update(makespan_s=float(simulate(case.graph, case.cluster, ro.assignment[0]).makespan_s),
                       assign_s=time.perf_counter() - t1)  # fmt: skip
        except ValueError as e:  # GDP and PLACETO: one output unit per device
            row["error"] = str(e)
        out["rows"][case.name] = row
    return out


def zero_shot(args) -> None:
    jobs = [(m, s) for m in args.methods for s in range(args.seeds)]
    episodes = max(1, round(sum(PAPER_EPISODES[w] for w in ZERO_SHOT_TRAIN) * args.scale))
    il = max(1, round(PAPER_IL_EPISODES * len(ZERO_SHOT_TRAIN) * args.scale))
    print(f"zero-shot: {len(jobs)} runs ({episodes} + {il} imitation episodes on {', '.join(ZERO_SHOT_TRAIN)}) "
          f"-> {args.out}", flush=True)  # fmt: skip
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool, Path(args.out).open("a") as f:
        futures = [pool.submit(zero_shot_job, m, s, episodes, il) for m, s in jobs]
        for fut in as_completed(futures):
            row = fut.result()
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{row['method']} seed {row['seed']}: trained in {row['train_s']:.0f} s", flush=True)
    zero_shot_report([args.out], args.markdown)


def zero_shot_report(files: list[str], markdown: str | None) -> None:
    runs = [json.loads(line) for f in files for line in Path(f).read_text().splitlines() if line.strip()]
    methods = [m for m in METHODS if any(r["method"] == m for r in runs)]
    names = list(dict.fromkeys(n for r in runs for n in r["rows"]))
    lines = ["### Zero-shot on the held-out rows: greedy makespan / critical_path (mean ± half-spread over seeds)", "",
             "| held-out row | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]  # fmt: skip
    per_method: dict[str, list[float]] = {m: [] for m in methods}
    for name in names:
        cells = []
        for m in methods:
            vals = [r["rows"][name]["makespan_s"] / r["rows"][name]["critical_path_s"]
                    for r in runs if r["method"] == m and "makespan_s" in r["rows"].get(name, {})]  # fmt: skip
            if not vals:
                cells.append("cannot serve")
                continue
            v = np.array(vals)
            per_method[m].append(float(v.mean()))
            cells.append(f"{v.mean():.3f} ± {(v.max() - v.min()) / 2:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("| geomean over the rows it serves | " + " | ".join(
        f"{float(np.exp(np.mean(np.log(per_method[m])))):.3f} ({len(per_method[m])} rows)" if per_method[m] else "-"
        for m in methods) + " |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if markdown:
        from doppler.util.io import atomic_write_bytes

        atomic_write_bytes(Path(markdown), (text + "\n").encode())


def make_jobs(args) -> list[Job]:
    jobs = []
    for w in args.workloads:
        for c in args.clusters:
            if not args.no_baselines:
                jobs += [Job(w, c, "critical_path"), Job(w, c, "enumerative"), Job(w, c, "anneal", anneal_s=args.anneal_s)]
            for m in args.methods:
                for r in args.regimes:
                    for s in range(args.seeds):
                        jobs.append(Job(w, c, m, r, s, max(1, round(PAPER_EPISODES[w] * args.scale)),
                                        max(1, round(PAPER_IL_EPISODES * args.scale)), 0.0,
                                        "cuda" if m in args.cuda_methods else "cpu"))  # fmt: skip
    # the slowest first (PLACETO, then the larger graphs), so the pool's tail is short
    return sorted(jobs, key=lambda j: (j.method != "placeto", j.method != "anneal", -PAPER_EPISODES[j.workload]))


def run(args) -> None:
    jobs = make_jobs(args)
    if args.shard:
        i, k = (int(x) for x in args.shard.split("/"))
        jobs = jobs[i::k]
    print(f"{len(jobs)} runs on {args.jobs} processes -> {args.out}", flush=True)
    # warm the numba cache once, so the workers load compiled loops instead of compiling together
    run_job(Job("chainmm", "p100x4", "single_policy", "alone", 0, 8, 8))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    spawn = multiprocessing.get_context("spawn")  # the warm-up ran autograd here: forked workers cannot
    with ProcessPoolExecutor(args.jobs, mp_context=spawn) as pool, out.open("a") as f:
        futures = {pool.submit(run_job, j): j for j in jobs}
        for k, fut in enumerate(as_completed(futures), 1):
            try:
                row = fut.result()
            except Exception as e:  # noqa: BLE001 - one failed run is reported, the rest go on
                row = {**asdict(futures[fut]), "error": f"{type(e).__name__}: {e}"}
            f.write(json.dumps(row) + "\n")
            f.flush()
            j = futures[fut]
            print(f"[{k}/{len(jobs)} {time.perf_counter() - t0:.0f}s] {j.workload} {j.cluster} {j.method} {j.regime} "
                  f"seed {j.seed}: {row.get('makespan_s', row.get('error'))}", flush=True)  # fmt: skip


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def report(files: list[str], markdown: str | None) -> None:
    rows = [json.loads(line) for f in files for line in Path(f).read_text().splitlines() if line.strip()]
    errors = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    cells = sorted({(r["workload"], r["cluster"]) for r in rows}, key=lambda c: (WORKLOADS.index(c[0]), c[1]))
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    regimes = [g for g in REGIMES if any(r.get("regime") == g for r in rows)]

    def pick(w, c, m, g=""):
        return [r for r in rows if (r["workload"], r["cluster"], r["method"], r.get("regime", "")) == (w, c, m, g)]

    lines = []
    for g in regimes:
        label = {"alone": "learning alone (no warm start, no search, no distillation)",
                 "full": "full recipe (warm start, expert iteration, distillation)"}[g]  # fmt: skip
        lines += [f"### Greedy makespan, ms: {label}", "",
                  "| graph | cluster | critical_path | enumerative | anneal | " + " | ".join(methods) + " |",
                  "|---|---|---|---|---|" + "---|" * len(methods)]  # fmt: skip
        for w, c in cells:
            base = [pick(w, c, b) for b in BASELINES]
            out = [f"{_ms(b[0]['makespan_s'])}" if b else "-" for b in base]
            best_mean = min((np.mean([r["makespan_s"] for r in pick(w, c, m, g)]) for m in methods if pick(w, c, m, g)),
                            default=None)  # fmt: skip
            for m in methods:
                rs = pick(w, c, m, g)
                if not rs:
                    out.append("-")
                    continue
                v = np.array([r["makespan_s"] for r in rs])
                cell = f"{_ms(v.mean())} ± {_ms((v.max() - v.min()) / 2)}" + (f" (n={v.size})" if v.size != 3 else "")
                out.append(f"**{cell}**" if best_mean is not None and v.mean() <= best_mean else cell)
            lines.append(f"| {w} | {c} | " + " | ".join(out) + " |")
        lines.append("")
    lines += ["### Cost: Stage II episodes/s and greedy inference time (mean over seeds and regimes)", "",
              "| graph | cluster | " + " | ".join(f"{m} ep/s" for m in methods) + " | "
              + " | ".join(f"{m} infer ms" for m in methods) + " |", "|---|---|" + "---|" * (2 * len(methods))]  # fmt: skip
    for w, c in cells:
        eps = [np.mean([r["episodes_per_s"] for g in regimes for r in pick(w, c, m, g)] or [np.nan]) for m in methods]
        inf = [np.mean([r["inference_s"] for g in regimes for r in pick(w, c, m, g)] or [np.nan]) for m in methods]
        lines.append(f"| {w} | {c} | " + " | ".join(f"{x:.1f}" for x in eps) + " | "
                     + " | ".join(f"{x * 1e3:.1f}" for x in inf) + " |")  # fmt: skip
    lines.append("")
    if "placeto" in methods and "doppler" in methods:
        for w, c in cells:
            p = [r["episodes_per_s"] for g in regimes for r in pick(w, c, "placeto", g)]
            d = [r["episodes_per_s"] for g in regimes for r in pick(w, c, "doppler", g)]
            if p and d:
                lines.append(f"- per-episode time, placeto / doppler, {w} on {c}: {np.mean(d) / np.mean(p):.1f}x")
        lines.append("")
    lines += _wins(rows, cells, methods, regimes, pick)
    if errors:
        lines += ["", f"{len(errors)} runs failed:"] + [f"- {e['workload']} {e['cluster']} {e['method']} {e.get('regime')} "
                                                         f"seed {e.get('seed')}: {e['error']}" for e in errors]  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if markdown:
        from doppler.util.io import atomic_write_bytes

        atomic_write_bytes(Path(markdown), (text + "\n").encode())


def _wins(rows, cells, methods, regimes, pick) -> list[str]:
    """Where DOPPLER's mean beats each other method's, per regime (the issue's expectation)."""
    out = []
    for g in regimes:
        for m in methods:
            if m == "doppler":
                continue
            pairs = [(np.mean([r["makespan_s"] for r in pick(w, c, "doppler", g)]),
                      np.mean([r["makespan_s"] for r in pick(w, c, m, g)]))
                     for w, c in cells if pick(w, c, "doppler", g) and pick(w, c, m, g)]  # fmt: skip
            if pairs:
                wins = sum(d < o for d, o in pairs)
                ratio = float(np.exp(np.mean([np.log(o / d) for d, o in pairs])))
                out.append(f"- {g}: doppler beats {m} on {wins}/{len(pairs)} cells; geomean {m} / doppler = {ratio:.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="episode budgets as a share of the paper's")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 1))
    ap.add_argument("--anneal-s", type=float, default=60.0)
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=list(WORKLOADS))
    ap.add_argument("--clusters", type=lambda s: s.split(","), default=list(CLUSTERS))
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    ap.add_argument("--regimes", type=lambda s: s.split(","), default=list(REGIMES))
    ap.add_argument("--cuda-methods", type=lambda s: s.split(","), default=[],
                    help="methods whose networks run on the GPU (their episodes/s are then not CPU figures)")
    ap.add_argument("--no-baselines", action="store_true", help="only the learned methods (e.g. to add runs to a report)")
    ap.add_argument("--shard", default=None, help="I/K: run every K-th job starting at I")
    ap.add_argument("--out", default="runs/learned_baselines.jsonl")
    ap.add_argument("--report", nargs="+", default=None, help="print the table of these result files")
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--zero-shot", action="store_true",
                    help="train each method on chainmm, ffnn and llama_block together, then place the held-out rows")
    ap.add_argument("--speed", type=int, default=0, metavar="UPDATES",
                    help="only time UPDATES Stage II updates of each method, side by side, on the last --workloads")
    args = ap.parse_args()
    if args.report:
        (zero_shot_report if args.zero_shot else report)(args.report, args.markdown)
        return
    if args.speed:
        speed(args.workloads[-1], args.clusters[0], args.methods, args.speed)
        return
    for name, allowed in (("workloads", WORKLOADS), ("methods", METHODS), ("regimes", REGIMES)):
        bad = [x for x in getattr(args, name) if x not in allowed]
        if bad:
            ap.error(f"unknown --{name} {bad[0]!r} (use: {', '.join(allowed)})")
    if args.seeds < 1 or args.scale <= 0 or args.jobs < 1:
        ap.error("--seeds and --jobs must be >= 1 and --scale > 0")
    if args.zero_shot:
        zero_shot(args)
        return
    run(args)
    report([args.out], args.markdown)


if __name__ == "__main__":
    main()
