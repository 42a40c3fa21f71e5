"""Measured against simulated on 2 calibrated CPU workers: three cost models fitted on one calibration.

    python benchmarks/experiments/cpu_roofline.py --model llama_58m=DIR [--model qwen2_58m=DIR2] [--rounds 3]
        [--repeats 5] [--n 8]

Each ``DIR`` holds the graph (``*.json`` other than ``a.json``), ``a.json`` and ``ckpt/`` as docs/run_weights.md's
walk-through makes them. Each round calibrates 2 CPU workers (``doppler calibrate --devices 2 --memory-bytes 200e6``
in this process, keeping its measured runs), fits three clusters on the same runs:

* ``plain``: the calibration graph's fits alone, no bandwidth (plain devices);
* ``floor``: the same with the measured STREAM bandwidth (no op reads its weights faster than it);
* ``weights``: the same with the memory graph's weight-read rates too (what ``doppler calibrate`` writes);

then runs ``doppler execute DIR/graph -a a.json -c CAL --weights ckpt/ --input-ids 32 --repeats R --json`` for each
model, and validates ``ffnn`` and ``chainmm`` (size small): ``--n`` assignments made as ``doppler validate`` makes them,
each run ``R`` times in one shuffled order, median kept. Prints one JSON line per round: measured over simulated
per model and cluster, Spearman, mean absolute error and bias per workload and cluster, the load averages before
and after, and how long the calibration took.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from doppler import workloads
from doppler.engine import run
from doppler.engine.calibrate import WEIGHT_ARRAYS, DEFAULT_STREAM_BYTES, calibrate, calibration_graph, fit_cluster, memory_graph
from doppler.engine.program import build_program
from doppler.engine.validate import agreement, validation_assignments
from doppler.hardware.cluster import Cluster
from doppler.hardware.files import save_cluster
from doppler.ir.assignment import load_assignment
from doppler.ir.formats import load_graph
from doppler.sim import simulate


def variants(res) -> dict[str, Cluster]:
    """The three clusters of one calibration (module docstring)."""
    g = calibration_graph()
    bw = [d.memory_bandwidth_Bps for d in res.cluster.devices]
    kw = {"copies_inbound": True, "memory_bytes": 200e6}
    floor = fit_cluster(g, res.traces, 2, memory_bandwidth_Bps=bw, **kw).cluster
    plain = replace(floor, devices=[replace(d, memory_bandwidth_Bps=None) for d in floor.devices])
    mg = memory_graph(WEIGHT_ARRAYS * DEFAULT_STREAM_BYTES * 2)
    weights = fit_cluster(g, res.traces, 2, memory_bandwidth_Bps=bw, memory=(mg, res.memory_traces), **kw).cluster
    return {"plain": plain, "floor": floor, "weights": weights}


def validate_all(name: str, clusters: dict[str, Cluster], n: int, repeats: int, seed: int = 0) -> dict:
    """``doppler validate``'s protocol on workload ``name``, the measured medians against every cluster."""
    g = workloads.build(name, size="small")
    cases = validation_assignments(g, clusters["plain"], n, seed=seed)
    program = build_program(g, seed=seed)
    order = [(i, r) for r in range(repeats) for i in range(len(cases))]
    np.random.default_rng(seed + 1).shuffle(order)
    measured = np.full((len(cases), repeats), np.nan)
    run(g, cases[0][1], num_devices=2, program=program, keep_outputs=False)  # warm-up
    for i, r in order:
        measured[i, r] = run(g, cases[i][1], num_devices=2, program=program, keep_outputs=False).makespan_s
    out = {}
    for label, c in clusters.items():
        sim = np.array([simulate(g, c, a, link_contention=True).makespan_s for _, a in cases])
        res = agreement([lab for lab, _ in cases], sim, measured, info={})
        out[label] = {"spearman": round(res.spearman, 3), "mean_abs_pct_error": round(res.mean_abs_pct_error, 1),
                      "bias_pct": round(res.bias_pct, 1)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, help="NAME=DIR (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n", type=int, default=8)
    args = ap.parse_args()
    models = [(m.split("=", 1)[0], Path(m.split("=", 1)[1])) for m in args.model]
    for rnd in range(args.rounds):
        row: dict = {"round": rnd, "load_before": [round(x, 1) for x in os.getloadavg()]}
        t0 = time.perf_counter()
        res = calibrate(2, memory_bytes=200e6)
        row["calibrate_s"] = round(time.perf_counter() - t0, 1)
        clusters = variants(res)
        row["bandwidth_GBps"] = [round(d.memory_bandwidth_Bps / 1e9, 2) for d in res.cluster.devices]
        row["weight_read_GBps"] = [{k: round(v / 1e9, 2) for k, v in d.weight_read_Bps_by_kind.items()}
                                   for d in res.cluster.devices]  # fmt: skip
        for name, d in models:
            gpath = next(p for p in sorted(d.glob("*.json")) if p.name != "a.json")
            with tempfile.TemporaryDirectory() as tmp:
                cal = Path(tmp) / "cal.json"
                save_cluster(res.cluster, cal)
                cmd = [sys.executable, "-m", "doppler", "execute", str(gpath), "-a", str(d / "a.json"), "-c", str(cal),
                       "--weights", str(d / "ckpt"), "--input-ids", "32", "--repeats", str(args.repeats), "--json"]
                ex = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            g = load_graph(gpath)
            a = load_assignment(d / "a.json", g)
            sims = {k: simulate(g, c, a, link_contention=True).makespan_s for k, c in clusters.items()}
            row[name] = {"measured_ms": round(ex["makespan_s"] * 1e3, 1),
                         "simulated_ms": {k: round(v * 1e3, 1) for k, v in sims.items()},
                         "measured_over_simulated": {k: round(ex["makespan_s"] / v, 2) for k, v in sims.items()}}  # fmt: skip
        for name in ("ffnn", "chainmm"):
            row[name] = validate_all(name, clusters, args.n, args.repeats)
        row["load_after"] = [round(x, 1) for x in os.getloadavg()]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
