"""Whole models at real size: every method against the placements people make by hand.

    python benchmarks/whole_model.py [--cases llama2_7b_tp@h100x8,llama2_7b_tp@a100x8,llama2_7b_decode@h100x8,...]
                                     [--budget-s 60] [--out whole_model.json] [--charts docs/]

Each case is a built-in ``llama_model`` (float16, the default ``--memory-fraction``) on a cluster preset
(roofline rates per dtype, :mod:`doppler.hardware.presets`) or ``mixed8``:

* ``llama2_7b``: LLaMA-2-7B prefill at its defaults (32 layers, dim 4096, 32 heads, seq_len 2048, 4 blocks per
  large dimension: 6,629 ops); ``llama2_7b_tp`` splits its heads, hidden dimension and vocabulary in 8 blocks
  (12,153 ops), so that ``tensor_parallel`` splits it over 8 devices; ``llama2_7b_decode`` is one decode step of
  the latter at context 2048 (its KV cache held where it is read);
* ``gqa_8b``: Llama-3-8B's shape (8 key/value heads for 32 query heads, hidden 14336, vocab 128256), in 8 blocks;
* ``llama_13b``: LLaMA-2-13B's shape (40 layers, dim 5120, 40 heads, hidden 13824), in 8 blocks;
* ``mixed8``: 4 V100-rate and 4 P100-rate 16 GB GPUs, every pair over PCIe (12 GB/s, 10 us).

For every method (``--methods``): the simulated makespan, its ratio to ``sequential_fill``'s, to
``tensor_parallel``'s (the expert's: Megatron-LM's split) and to the lower bound, whether it fits every device's
budget, the largest peak over budget (per device: peak / budget), and the time to place. A method that refuses
(``tensor_parallel`` where the blocks do not divide over the devices) is left out of the case; one that does not
place by memory and overfills a device is placed again with ``--ignore-memory`` and shown as not fitting.
``anneal``, ``heft_lookahead`` and ``doppler+search`` get ``--budget-s``; ``doppler`` is the shipped policy's
greedy decode (zero-shot). With ``--charts DIR`` the best placement that fits of each case is drawn as a Gantt
chart with the memory panel. About 4-5 minutes per case with the default 60 s budgets (three searches), on 2
cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from doppler import cluster as resolve_cluster
from doppler import memory, workloads
from doppler.workloads.corpus import gpu_rates
from doppler.hardware.cluster import Cluster, Device
from doppler.util.io import write_json
from doppler.methods import MethodError, assign, score
from doppler.sim import lower_bound, traced

EIGHT = {"head_blocks": 8, "hidden_blocks": 8, "vocab_blocks": 8}
MODELS: dict[str, dict[str, Any]] = {
    "llama2_7b": {},
    "llama2_7b_tp": EIGHT,
    "llama2_7b_decode": {**EIGHT, "phase": "decode", "context": 2048},
    "gqa_8b": {**EIGHT, "n_kv_heads": 8, "hidden": 14336, "vocab": 128256, "rope_theta": 500000.0},
    "llama_13b": {**EIGHT, "layers": 40, "dim": 5120, "n_heads": 40, "n_kv_heads": 40, "hidden": 13824},
}
#: (label, method, options)
METHODS: list[tuple[str, str, dict[str, Any]]] = [
    ("sequential_fill", "sequential_fill", {}),
    ("pipeline", "pipeline", {}),
    ("tensor_parallel", "tensor_parallel", {}),
    ("tp_pipeline", "tp_pipeline", {}),
    ("round_robin_block", "round_robin_block", {}),
    ("metis", "metis", {}),
    ("critical_path", "critical_path", {}),
    ("heft", "heft", {}),
    ("enumerative", "enumerative", {}),
    ("heft_lookahead", "heft_lookahead", {"budget": True}),
    ("doppler", "doppler", {}),
    ("anneal", "anneal", {"budget": True}),
    ("doppler+search", "doppler", {"budget": True}),
]


def mixed8() -> Cluster:
    """4 V100-rate and 4 P100-rate GPUs of 16 GB, every pair over PCIe 3.0 (12 GB/s, 10 us)."""
    devices = []
    for i, (peak, hbm) in enumerate([(15.7e12, 900e9)] * 4 + [(9.3e12, 732e9)] * 4):
        rate, by_kind = gpu_rates(peak, hbm)
        devices.append(Device(f"gpu{i}", kind="gpu", flops_per_s=rate, flops_per_s_by_kind=by_kind, memory_bytes=16e9))
    return Cluster(name="mixed8", devices=devices, bandwidth_Bps=np.full((8, 8), 12e9), latency_s=np.full((8, 8), 10e-6),
                   meta={"source": "benchmarks/whole_model.py"})  # fmt: skip


def _cluster(name: str) -> Cluster:
    return mixed8() if name == "mixed8" else resolve_cluster(name)


def run_case(model: str, cluster_name: str, methods: list[tuple[str, str, dict[str, Any]]], budget_s: float,
             chart_dir: Path | None) -> list[dict[str, Any]]:  # fmt: skip
    g = workloads.build("llama_model", **MODELS[model])
    c = _cluster(cluster_name)
    lb = float(lower_bound(g, c))
    budget = memory.budget_bytes(c)
    rows: list[dict[str, Any]] = []
    best: tuple[float, Any, str] | None = None
    print(f"\n{model} on {c.name}: {g.num_ops:,} ops, {memory.weight_bytes(g) / 1e9:.1f} GB of weights, "
          f"lower bound {lb * 1e3:.3f} ms", flush=True)  # fmt: skip
    for label, method, opts in methods:
        t0 = time.perf_counter()
        note = ""
        try:
            a = assign(g, c, method, budget_s=budget_s if opts.get("budget") else None)
        except MethodError as e:
            note = str(e)
            try:
                a = assign(g, c, method, budget_s=budget_s if opts.get("budget") else None, ignore_memory=True)
            except MethodError as again:  # it refuses the graph itself (tensor_parallel: blocks, structure)
                print(f"{label}: {again}", flush=True)
                continue
        place_s = time.perf_counter() - t0
        r = score(g, c, a, lb)
        over = float(np.max(np.asarray(r.peak_memory_bytes) / budget))
        rows.append({"case": f"{model}@{cluster_name}", "method": label, "makespan_s": r.makespan_s,
                     "ratio_to_lower_bound": r.makespan_s / lb, "fits": r.feasible, "peak_over_budget": over,
                     "place_s": place_s, "devices_used": int(np.unique(a.devices).size), "note": note})  # fmt: skip
        if r.feasible and (best is None or r.makespan_s < best[0]):
            best = (r.makespan_s, a, label)
    fill = next((x["makespan_s"] for x in rows if x["method"] == "sequential_fill"), None)
    tp = next((x["makespan_s"] for x in rows if x["method"] == "tensor_parallel"), None)
    print("| method | makespan (ms) | / sequential_fill | / tensor_parallel | / lower bound | fits | peak / budget "
          "| place (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        x["ratio_to_sequential_fill"] = x["makespan_s"] / fill if fill else None
        x["ratio_to_tensor_parallel"] = x["makespan_s"] / tp if tp else None
        ratios = " | ".join("-" if r is None else f"{r:.3f}"
                            for r in (x["ratio_to_sequential_fill"], x["ratio_to_tensor_parallel"]))  # fmt: skip
        print(f"| {x['method']} | {x['makespan_s'] * 1e3:.3f} | {ratios} | {x['ratio_to_lower_bound']:.3f} | "
              f"{'yes' if x['fits'] else 'no'} | {x['peak_over_budget']:.2f} | {x['place_s']:.1f} |", flush=True)  # fmt: skip
    if chart_dir is not None and best is not None:
        from doppler.report import gantt

        path = chart_dir / f"whole_model_{model}_{cluster_name}.png"
        gantt(g, c, traced(g, c, best[1]), path, title=f"{model} on {c.name}: {best[2]}", lower_bound_s=lb,
              memory_budget_bytes=budget)  # fmt: skip
        print(f"chart: {path}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default="llama2_7b_tp@h100x8,llama2_7b_tp@a100x8,llama2_7b_decode@h100x8,"
                    "gqa_8b@h200x8,llama_13b@l40sx8,llama2_7b@v100x8")
    ap.add_argument("--methods", default=",".join(label for label, _, _ in METHODS))
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--charts", default=None, help="a folder for each case's Gantt chart")
    args = ap.parse_args()
    wanted = [m.strip() for m in args.methods.split(",")]
    methods = [m for m in METHODS if m[0] in wanted]
    rows: list[dict[str, Any]] = []
    for case in args.cases.split(","):
        model, _, cluster_name = case.partition("@")
        rows += run_case(model, cluster_name, methods, args.budget_s, Path(args.charts) if args.charts else None)
        if args.out:
            write_json(args.out, {"budget_s": args.budget_s, "rows": rows})


if __name__ == "__main__":
    main()
