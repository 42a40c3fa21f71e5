"""Outputs a refactoring must not change: run before and after, then compare the two files.

    python benchmarks/invariants.py -o before.json [--quick] [--demo]
    python benchmarks/invariants.py --compare before.json after.json

Recorded, each as the assignment itself and its simulated makespan:
- every deterministic method (critical_path, heft, metis, enumerative, round_robin_block) and the
  shipped policy's zero-shot greedy decode on the four paper workloads, on p100x4 and v100x8;
- anneal with a fixed seed and a fixed number of evaluations (``max_evals``: no time budget, so
  the walk does not depend on the machine's speed) on the same rows;
- the zero-shot greedy decode on every held-out row of :func:`doppler.workloads.corpus.held_out_split`;
- with ``--demo``, ``doppler demo --json --no-engine`` (its anneal has a time budget: its row is
  recorded but not compared).
``--compare`` prints every difference and exits 1 if there is one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from doppler import workloads
from doppler.workloads.corpus import held_out_split
from doppler.util.io import write_json
from doppler.methods import assign
from doppler.hardware.presets import cluster
from doppler.sim import simulate

DETERMINISTIC = ("round_robin_block", "critical_path", "heft", "metis", "enumerative", "doppler")
WORKLOADS = ("chainmm", "ffnn", "llama_block", "llama_layer")
CLUSTERS = ("p100x4", "v100x8")
ANNEAL_EVALS = 20_000


def _row(graph, cl, devices) -> dict:
    devices = np.asarray(getattr(devices, "devices", devices), dtype=np.int64)
    return {"makespan_s": float(simulate(graph, cl, devices).makespan_s),
            "sha256": hashlib.sha256(devices.tobytes()).hexdigest()[:16], "assignment": devices.tolist()}  # fmt: skip


def record(quick: bool, demo: bool) -> dict:
    out: dict = {"methods": {}, "anneal": {}, "zero_shot_held_out": {}}
    for cname in CLUSTERS[:1] if quick else CLUSTERS:
        cl = cluster(cname)
        for w in WORKLOADS[:2] if quick else WORKLOADS:
            g = workloads.build(w)
            for m in DETERMINISTIC:
                out["methods"][f"{w}/{cname}/{m}"] = _row(g, cl, assign(g, cl, m))
                print(f"{w}/{cname}/{m}: {out['methods'][f'{w}/{cname}/{m}']['makespan_s']:.6g}", flush=True)
            a = assign(g, cl, "anneal", seed=0, max_evals=ANNEAL_EVALS)
            out["anneal"][f"{w}/{cname}"] = _row(g, cl, a)
            print(f"{w}/{cname}/anneal: {out['anneal'][f'{w}/{cname}']['makespan_s']:.6g}", flush=True)
    for i, case in enumerate(held_out_split(quick=quick)):
        key = f"{i}:{case.graph.name}/{case.cluster.name}"
        out["zero_shot_held_out"][key] = _row(case.graph, case.cluster, assign(case.graph, case.cluster, "doppler"))
        print(f"held-out {key}: {out['zero_shot_held_out'][key]['makespan_s']:.6g}", flush=True)
    if demo:
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "doppler", "demo", "--json", "--no-engine", "-o", d],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            out["demo"] = json.loads(res.stdout)
            out["demo_s"] = time.perf_counter() - t0
    return out


def _demo_cells(doc: dict) -> dict[str, float]:
    """The demo table's makespans by ``workload/method``, without anneal's (a time budget: not reproducible)."""
    return {f"{w['name']}/{m}": v for w in doc.get("workloads", []) for m, v in w["makespan_s"].items() if m != "anneal"}


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    diffs = []
    for section in ("methods", "anneal", "zero_shot_held_out"):
        for key in sorted(set(a[section]) | set(b[section])):
            ra, rb = a[section].get(key), b[section].get(key)
            if ra is None or rb is None:
                diffs.append(f"{section} {key}: only in {'after' if ra is None else 'before'}")
            elif ra["assignment"] != rb["assignment"] or ra["makespan_s"] != rb["makespan_s"]:
                diffs.append(f"{section} {key}: {ra['makespan_s']:.6g} ({ra['sha256']}) -> {rb['makespan_s']:.6g} ({rb['sha256']})")
    if "demo" in a and "demo" in b:
        ca, cb = _demo_cells(a["demo"]), _demo_cells(b["demo"])
        diffs += [f"demo {k}: {ca.get(k)} -> {cb.get(k)}" for k in sorted(set(ca) | set(cb)) if ca.get(k) != cb.get(k)]
    counts = {s: len(a[s]) for s in ("methods", "anneal", "zero_shot_held_out")}
    print("\n".join(diffs) if diffs else f"identical: {counts}" + (", demo table" if "demo" in a and "demo" in b else ""))
    return 1 if diffs else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path)
    ap.add_argument("--quick", action="store_true", help="two workloads on p100x4, the quick held-out split")
    ap.add_argument("--demo", action="store_true", help="also run doppler demo (minutes)")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if args.out is None:
        ap.error("-o is required unless --compare")
    write_json(args.out, record(args.quick, args.demo))


if __name__ == "__main__":
    main()
