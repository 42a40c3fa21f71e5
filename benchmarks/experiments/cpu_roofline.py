"""Measured against simulated on 2 calibrated CPU workers, with and without the measured memory bandwidth.

    python benchmarks/experiments/cpu_roofline.py --llama DIR [--rounds 3] [--repeats 5] [--n 10]

``DIR`` holds ``llama58m.json``, ``a.json`` and ``ckpt/`` as docs/run_weights.md's walk-through makes them.
Each round calibrates 2 CPU workers (``doppler calibrate --devices 2 --memory-bytes 200e6``), then

* runs ``doppler execute llama58m.json -a a.json -c CAL --weights ckpt/ --input-ids 32 --repeats R --json``;
* validates ``ffnn`` and ``chainmm`` (size small): ``--n`` assignments made as ``doppler validate`` makes them,
  each run ``R`` times in one shuffled order, median kept.

Every measured makespan is set beside two simulations of the same calibration: the cluster as
calibrated (measured devices: weights read at the measured bandwidth at most) and the same cluster
without ``memory_bandwidth_Bps`` (plain devices). Prints one JSON line per round, with the load averages
before and after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from doppler import workloads
from doppler.ir.assignment import load_assignment
from doppler.engine import run
from doppler.engine.calibrate import calibrate
from doppler.engine.program import build_program
from doppler.engine.validate import agreement, validation_assignments
from doppler.ir.formats import load_graph
from doppler.hardware.files import save_cluster
from doppler.hardware.cluster import Cluster
from doppler.sim import simulate


def plain(cl: Cluster) -> Cluster:
    """The same cluster with plain devices: no bytes term."""
    return replace(cl, name=f"{cl.name}-plain", devices=[replace(d, memory_bandwidth_Bps=None) for d in cl.devices])


def validate_both(name: str, cl: Cluster, n: int, repeats: int, seed: int = 0) -> dict:
    """``doppler validate``'s protocol on workload ``name``, the measured medians against both simulations."""
    g = workloads.build(name, size="small")
    cases = validation_assignments(g, plain(cl), n, seed=seed)
    program = build_program(g, seed=seed)
    order = [(i, r) for r in range(repeats) for i in range(len(cases))]
    np.random.default_rng(seed + 1).shuffle(order)
    measured = np.full((len(cases), repeats), np.nan)
    run(g, cases[0][1], num_devices=2, program=program, keep_outputs=False)  # warm-up
    for i, r in order:
        measured[i, r] = run(g, cases[i][1], num_devices=2, program=program, keep_outputs=False).makespan_s
    out = {}
    for label, c in (("measured_devices", cl), ("plain_devices", plain(cl))):
        sim = np.array([simulate(g, c, a, link_contention=True).makespan_s for _, a in cases])
        res = agreement([lab for lab, _ in cases], sim, measured, info={})
        out[label] = {"spearman": round(res.spearman, 3), "mean_abs_pct_error": round(res.mean_abs_pct_error, 1),
                      "bias_pct": round(res.bias_pct, 1)}  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--n", type=int, default=10)
    args = ap.parse_args()
    d = args.llama
    g = load_graph(d / "llama58m.json")
    a = load_assignment(d / "a.json", g)
    for rnd in range(args.rounds):
        load_before = os.getloadavg()
        cl = calibrate(2, memory_bytes=200e6).cluster
        with tempfile.TemporaryDirectory() as tmp:
            cal = Path(tmp) / "cal.json"
            save_cluster(cl, cal)
            cmd = [sys.executable, "-m", "doppler", "execute", str(d / "llama58m.json"), "-a", str(d / "a.json"), "-c",
                   str(cal), "--weights", str(d / "ckpt"), "--input-ids", "32", "--repeats", str(args.repeats), "--json"]
            ex = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        row = {"round": rnd, "load_before": [round(x, 1) for x in load_before],
               "bandwidth_GBps": [round(dev.memory_bandwidth_Bps / 1e9, 2) for dev in cl.devices],
               "llama_58m": {"measured_ms": round(ex["makespan_s"] * 1e3, 1),
                             "repeats_ms": [round(x * 1e3, 1) for x in ex["makespans_s"]],
                             "simulated_ms": round(ex["simulated_makespan_s"] * 1e3, 1),
                             "simulated_plain_ms": round(simulate(g, plain(cl), a, link_contention=True).makespan_s * 1e3, 1)}}  # fmt: skip
        for name in ("ffnn", "chainmm"):
            row[name] = validate_both(name, cl, args.n, args.repeats)
        row["load_after"] = [round(x, 1) for x in os.getloadavg()]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
