"""Does one pretrained policy place graphs and clusters it has never seen? The held-out table.

    python benchmarks/generalization.py [--checkpoint CKPT] [--quick] [--seeds 3] [--budget-s 5]
        [--anneal-long-s 60] [--finetune-rows 1] [--finetune-episodes 500] [--no-device-identity]
        [--distill-on-policy W] [--out F.json] [--chart F.png]
    python benchmarks/generalization.py --chart F.png --chart-from F.json   # redraw a saved run's chart

One row per held-out (graph, cluster) of :func:`doppler.workloads.corpus.held_out_split`. Makespans are
simulated and divided by the row's best cheap method (the best of critical_path, heft,
enumerative, round_robin_block and metis): lower is better, below 1 beats every cheap method.

Columns: the five cheap methods; anneal at ``--budget-s`` and at ``--anneal-long-s`` seconds;
DOPPLER zero-shot greedy, best of 64 samples, and ``--budget-s`` of search from the policy's best
decode; fine-tuned for
``--finetune-episodes`` from the pretrained policy on the first ``--finetune-rows`` rows, with its
``structural`` op features / widened to ``full`` ones (``--op-features full``), each with a
learned state per device as ``doppler train`` has by default (``--no-device-identity``: without);
and the zero-shot greedy assignment time (warm: the policy loaded and compiled once per process).
Search columns give the mean over ``--seeds`` seeds and the spread (max - min).

Then the hardware transfer (the paper's Section 5): the pretrained policy fine-tuned on
llama_layer / p100x4, applied to v100x8 zero-shot and after ``--transfer-episodes`` episodes
there (the p100x4 stage's state per device is left out on v100x8, and a new one starts at zero), with the
share of transferred bytes that stay on NVLink-connected GPU pairs; and the fine-tuning
histories of llama_layer / p100x4 from the pretrained policy and from scratch (``curves`` in
``--out``). ``--chart PNG`` draws the table's main columns as bars per row.

Bars (issue): zero-shot greedy never worse than critical_path; geomean vs best cheap <= 0.95
and strictly better on >= 80% of rows; geomean vs anneal 60 s <= 1.10; --budget-s 5 geomean vs
anneal 60 s <= 1.00 and better than anneal 5 s; fine-tuning within 2% of anneal 60 s.
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from doppler.methods import assign
from doppler.workloads.corpus import held_out_split
from doppler.hardware.presets import DGX1_V100_NVLINKS, cluster
from doppler.util.io import write_json
from doppler.sim import simulate

CHEAP = ("critical_path", "heft", "enumerative", "round_robin_block", "metis")


def makespan(graph, cl, a) -> float:
    return float(simulate(graph, cl, a).makespan_s)


def geomean(xs) -> float:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.exp(np.mean(np.log(xs)))) if xs else float("nan")


def seeded(fn, seeds: int) -> tuple[float, float]:
    vals = [fn(s) for s in range(seeds)]
    return float(np.mean(vals)), float(np.max(vals) - np.min(vals))


def finetune(graph, cl, episodes: int, init: str | None, run_dir: Path, seed: int = 0, op_features: str | None = None,
             device_identity: bool | None = None, distill_on_policy: float | None = None):  # fmt: skip
    """Train ``episodes`` Stage II episodes on one graph, from ``init`` (a checkpoint) or from scratch;
    ``op_features`` None keeps the checkpoint's (``doppler train --init`` widens to ``full`` unless told
    ``--op-features structural``); ``"full"`` widens a ``structural`` checkpoint,
    ``device_identity``: a learned state per device (None: as ``doppler train``, on), ``distill_on_policy``
    weighs distillation's labels in the greedy decode's own states (``--distill-on-policy``)."""
    import torch

    from doppler.cli.train_cmd import trainer_from_init
    from doppler.train import INIT_SEARCH_EVALS, Trainer, TrainConfig

    cfg = TrainConfig(stages=("sim",) if init else ("il", "sim"), episodes=episodes, seed=seed, checkpoint_every=10**9,
                      search_evals=INIT_SEARCH_EVALS if init else TrainConfig.search_evals,
                      device_identity=device_identity, distill_on_policy=distill_on_policy)  # as `doppler train --init`
    tr = trainer_from_init([graph], cl, cfg, init, op_features) if init else Trainer.create([graph], cl, cfg)
    t0 = time.perf_counter()
    tr.run(run_dir)
    with torch.no_grad():
        devices, _ = tr.greedy(tr.tasks[0])
    return tr, devices, time.perf_counter() - t0


def nvlink_byte_share(graph, devices: np.ndarray) -> float:
    """Share of transferred bytes (once per producer and receiving device) between NVLink-connected GPUs."""
    nv = np.zeros((8, 8), dtype=bool)
    for i, j in DGX1_V100_NVLINKS:
        nv[i, j] = nv[j, i] = True
    ds, dd = devices[graph.src], devices[graph.dst]
    cross = ds != dd
    pairs = {(int(u), int(d)) for u, d in zip(graph.src[cross], dd[cross])}
    total = sum(float(graph.output_bytes[u]) for u, _ in pairs)
    on_nv = sum(float(graph.output_bytes[u]) for u, d in pairs if nv[devices[u], d])
    return on_nv / total if total else float("nan")


#: the table's columns in the ``--chart`` bars (row key -> legend label)
CHART_COLUMNS = {"heft": "heft", "greedy": "DOPPLER zero-shot greedy", "anneal_short": "anneal {b:g} s",
                 "search": "DOPPLER --budget-s {b:g}", "anneal_long": "anneal {l:g} s"}  # fmt: skip


def chart(rows: list[dict], path: str, budget_s: float, anneal_long_s: float) -> None:
    from doppler.report import held_out_chart

    labels = {k: v.format(b=budget_s, l=anneal_long_s) for k, v in CHART_COLUMNS.items()}
    held_out_chart(rows, labels, path, title="held-out pairs: makespan over the best cheap method")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default=None, help="policy to test (default: the shipped pretrained one)")
    ap.add_argument("--quick", action="store_true", help="four rows, short budgets")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=5.0)
    ap.add_argument("--anneal-long-s", type=float, default=60.0)
    ap.add_argument("--finetune-rows", type=int, default=1)
    ap.add_argument("--finetune-episodes", type=int, default=500)
    ap.add_argument("--transfer-episodes", type=int, default=2000)
    ap.add_argument("--device-identity", action=argparse.BooleanOptionalAction, default=None,
                    help="fine-tune with a learned state per device (doppler train's default: on), or "
                    "without: the fine-tuned column and the transfer")
    ap.add_argument("--distill-on-policy", type=float, default=None,
                    help="weight of distillation's labels in the greedy decode's own states, in every fine-tuning "
                    "run (doppler train --distill-on-policy; default: 1 with device identity, else 0)")
    ap.add_argument("--out", default=None, help="write every number as JSON")
    ap.add_argument("--chart", default=None, help="PNG of the table's main columns, bars per row")
    ap.add_argument("--chart-from", default=None, help="draw --chart from this --out JSON of an earlier run and stop")
    ap.add_argument("--baselines-only", action="store_true", help="fill the --baselines cache and stop")
    ap.add_argument("--baselines", default=None, help="JSON cache of the policy-free columns (cheap methods, "
                    "anneal): read if it exists and matches the settings, else computed and written")
    args = ap.parse_args()
    if args.chart_from:
        if not args.chart:
            ap.error("--chart-from needs --chart PNG")
        try:
            saved = json.loads(Path(args.chart_from).read_text())
            rows, budget_s, long_s = saved["rows"], saved["args"]["budget_s"], saved["args"]["anneal_long_s"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--chart-from {args.chart_from}: not a JSON file of --out ({type(e).__name__}: {e})")
        chart(rows, args.chart, budget_s, long_s)
        return
    if args.quick:
        args.seeds, args.budget_s, args.anneal_long_s, args.finetune_episodes = 1, 1.0, 3.0, 32
        args.transfer_episodes = 32

    from doppler.policy.checkpoint import resolve_checkpoint

    ckpt, _ = resolve_checkpoint(args.checkpoint)
    kw = {"checkpoint": ckpt}
    cases = held_out_split(quick=args.quick)
    work = Path(tempfile.mkdtemp(prefix="doppler-generalization-"))  # fine-tuning runs, reused across sections
    atexit.register(shutil.rmtree, work, True)
    tuned: dict[tuple, tuple] = {}

    def tune(g, cl, episodes: int, init: str | None, op_features: str | None = None,
             device_identity: bool | None = None):  # fmt: skip
        """``finetune`` once per setting (the first row and the transfer section share llama_layer / p100x4):
        (trainer, devices, seconds, run directory)."""
        key = (g.fingerprint(), json.dumps(cl.to_json(), sort_keys=True), episodes, init, op_features, device_identity,
               args.distill_on_policy)
        if key not in tuned:
            run_dir = work / f"run{len(tuned)}"
            tuned[key] = (*finetune(g, cl, episodes, init, run_dir, op_features=op_features,
                                    device_identity=device_identity, distill_on_policy=args.distill_on_policy),
                           run_dir)  # fmt: skip
        return tuned[key]

    if not args.baselines_only:
        assign(cases[0].graph, cases[0].cluster, "doppler", **kw)  # load and compile once (warm timings)
    rows = []
    ident = ", no device identity" if args.device_identity is False else ""
    header = (f"| graph / cluster | ops | dev | {' | '.join(CHEAP)} | best cheap (ms) | anneal {args.budget_s:g}s | "
              f"anneal {args.anneal_long_s:g}s | zero-shot greedy | best of 64 | "
              f"doppler {args.budget_s:g}s | fine-tuned (structural / full{ident}) | greedy time (s) |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1), flush=True)
    settings = {"seeds": args.seeds, "budget_s": args.budget_s, "anneal_long_s": args.anneal_long_s}
    cache = {}
    if args.baselines and Path(args.baselines).is_file():
        cache = json.loads(Path(args.baselines).read_text())
        if cache.get("settings") != settings:
            cache = {}
    cache.setdefault("settings", settings)
    cache.setdefault("rows", {})
    for i, case in enumerate(cases):
        g, cl = case.graph, case.cluster
        if case.name not in cache["rows"]:
            cheap = {m: makespan(g, cl, assign(g, cl, m)) for m in CHEAP}
            ref = min(cheap.values())
            cache["rows"][case.name] = {
                "best_cheap_s": ref, **{m: v / ref for m, v in cheap.items()},
                "anneal_short": seeded(lambda s: makespan(g, cl, assign(g, cl, "anneal", seed=s, budget_s=args.budget_s))
                                       / ref, args.seeds),
                "anneal_long": makespan(g, cl, assign(g, cl, "anneal", budget_s=args.anneal_long_s)) / ref,
            }  # fmt: skip
            if args.baselines:
                write_json(args.baselines, cache, indent=1)
        r = {"name": case.name, "why": case.why, "num_ops": g.num_ops, "num_devices": cl.num_devices,
             **cache["rows"][case.name]}  # fmt: skip
        ref = r["best_cheap_s"]
        if args.baselines_only:
            print(f"| {case.name} | baselines cached |", flush=True)
            continue
        a = assign(g, cl, "doppler", **kw)
        r["greedy"], r["greedy_time_s"] = makespan(g, cl, a) / ref, a.assign_time_s
        r["best64"] = makespan(g, cl, assign(g, cl, "doppler", samples=64, **kw)) / ref
        r["search"] = seeded(lambda s: makespan(g, cl, assign(g, cl, "doppler", seed=s, budget_s=args.budget_s,
                                                                **kw)) / ref, args.seeds)  # fmt: skip
        r["finetuned"] = r["finetuned_full"] = None
        if i < args.finetune_rows:
            _, dev, r["finetune_s"], _ = tune(g, cl, args.finetune_episodes, str(ckpt), None, args.device_identity)
            _, dev_full, r["finetune_full_s"], _ = tune(g, cl, args.finetune_episodes, str(ckpt), "full",
                                                        args.device_identity)
            r["finetuned"] = makespan(g, cl, dev) / ref
            r["finetuned_full"] = makespan(g, cl, dev_full) / ref
        rows.append(r)
        ft = "-" if r["finetuned"] is None else f"{r['finetuned']:.3f} / {r['finetuned_full']:.3f}"
        print(f"| {case.name} | {g.num_ops} | {cl.num_devices} | " + " | ".join(f"{r[m]:.3f}" for m in CHEAP)
              + f" | {ref * 1e3:.3g} | {r['anneal_short'][0]:.3f} ±{r['anneal_short'][1]:.3f} | {r['anneal_long']:.3f} | "
              f"{r['greedy']:.3f} | {r['best64']:.3f} | "
              f"{r['search'][0]:.3f} ±{r['search'][1]:.3f} | {ft} | {r['greedy_time_s']:.2f} |", flush=True)

    if args.baselines_only:
        return
    small = [r for r in rows if r["num_ops"] <= 1000]
    summary = {
        "greedy_vs_best_cheap_geomean": geomean(r["greedy"] for r in rows),
        "greedy_beats_best_cheap_share": float(np.mean([r["greedy"] < 1.0 for r in rows])),
        "greedy_not_worse_than_critical_path_rows": int(sum(r["greedy"] <= r["critical_path"] for r in rows)),
        "greedy_vs_critical_path_geomean": geomean(r["greedy"] / r["critical_path"] for r in rows),
        "greedy_vs_anneal_long_geomean": geomean(r["greedy"] / r["anneal_long"] for r in rows),
        "best64_vs_best_cheap_geomean": geomean(r["best64"] for r in rows),
        "search_vs_anneal_long_geomean": geomean(r["search"][0] / r["anneal_long"] for r in rows),
        "search_vs_anneal_short_geomean": geomean(r["search"][0] / r["anneal_short"][0] for r in rows),
        "anneal_short_vs_best_cheap_geomean": geomean(r["anneal_short"][0] for r in rows),
        "anneal_long_vs_best_cheap_geomean": geomean(r["anneal_long"] for r in rows),
        "max_greedy_time_s_up_to_1000_ops": max((r["greedy_time_s"] for r in small), default=float("nan")),
        "rows": len(rows),
    }
    if args.chart:
        chart(rows, args.chart, args.budget_s, args.anneal_long_s)
    print()
    for k, v in summary.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")

    # ---- hardware transfer and the fine-tuning histories: llama_layer, p100x4 -> v100x8
    from doppler import workloads

    g = workloads.build("llama_layer")
    p100, v100 = cluster("p100x4"), cluster("v100x8")
    tr_ft, dev_ft, ft_s, ft_dir = tune(g, p100, args.finetune_episodes, str(ckpt), None, args.device_identity)
    tr_wide, dev_wide, wide_s, wide_dir = tune(g, p100, args.finetune_episodes, str(ckpt), "full", args.device_identity)
    tr_sc, dev_sc, sc_s, _ = tune(g, p100, args.finetune_episodes, None, None, args.device_identity)
    anneal_p100 = makespan(g, p100, assign(g, p100, "anneal", budget_s=args.anneal_long_s))
    transfer = {
        "finetuned_p100_vs_anneal_long": makespan(g, p100, dev_ft) / anneal_p100,
        "finetuned_full_p100_vs_anneal_long": makespan(g, p100, dev_wide) / anneal_p100,
        "scratch_p100_vs_anneal_long": makespan(g, p100, dev_sc) / anneal_p100,
        "finetune_s": ft_s, "finetune_full_s": wide_s, "scratch_s": sc_s,
    }  # fmt: skip
    zs = assign(g, v100, "doppler", checkpoint=ft_dir / "checkpoint.pt")
    _, dev_v, _, _ = tune(g, v100, args.transfer_episodes, str(ft_dir / "checkpoint.pt"), None, args.device_identity)
    # the full-feature policy serves its own graph on another cluster too (positions are of the graph)
    zs_wide = assign(g, v100, "doppler", checkpoint=wide_dir / "checkpoint.pt")
    _, dev_vw, _, _ = tune(g, v100, args.transfer_episodes, str(wide_dir / "checkpoint.pt"), None,
                           args.device_identity)
    annealed_v100 = assign(g, v100, "anneal", budget_s=args.anneal_long_s)
    anneal_v100 = makespan(g, v100, annealed_v100)
    transfer.update(
        v100_zero_shot_vs_anneal_long=makespan(g, v100, zs) / anneal_v100,
        v100_zero_shot_full_vs_anneal_long=makespan(g, v100, zs_wide) / anneal_v100,
        v100_finetuned_vs_anneal_long=makespan(g, v100, dev_v) / anneal_v100,
        v100_finetuned_full_vs_anneal_long=makespan(g, v100, dev_vw) / anneal_v100,
        nvlink_share_zero_shot=nvlink_byte_share(g, zs.devices),
        nvlink_share_zero_shot_full=nvlink_byte_share(g, zs_wide.devices),
        nvlink_share_finetuned=nvlink_byte_share(g, dev_v),
        nvlink_share_finetuned_full=nvlink_byte_share(g, dev_vw),
        nvlink_share_anneal=nvlink_byte_share(g, annealed_v100.devices),
    )
    print()
    for k, v in transfer.items():
        print(f"{k}: {v:.4g}")
    if args.out:
        curves = {name: [{k: h[k] for k in ("episode", "greedy_ratio", "stage_il", "stage_distill") if k in h}
                         for h in tr.history] for name, tr in (("pretrained", tr_ft), ("widened", tr_wide),
                                                               ("scratch", tr_sc))}  # fmt: skip
        write_json(args.out, {"rows": rows, "summary": summary, "transfer": transfer, "checkpoint": str(ckpt),
                              "curves": curves, "args": vars(args)}, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
