"""A new user's first call: ``doppler assign G -c C --method doppler`` in a fresh process.

    python benchmarks/cold_assign.py [--repeats 5] [--graphs llama_layer,ffnn] [--cluster v100x8]

With the shipped policy and no ``--checkpoint``, ``assign`` decodes with the policy's numpy twin
(:mod:`doppler.policy.infer`) and never imports torch. Passing the same shipped checkpoint as
``--checkpoint`` takes the torch path. Both are run in turn, in fresh processes, on the same
graphs; the script prints the median wall time of the whole command and the ``assign`` time it
reports (which leaves out the CLI's own imports), and the ratio torch / numpy. Both paths give the
same assignment (checked here too).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doppler import workloads
from doppler.formats import save_graph
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT


def run_once(graph: Path, cluster: str, out: Path, checkpoint: Path | None) -> tuple[float, float, list[int]]:
    cmd = [sys.executable, "-m", "doppler", "assign", str(graph), "-c", cluster, "--method", "doppler", "-o", str(out)]
    if checkpoint is not None:
        cmd += ["--checkpoint", str(checkpoint)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-300:]}")
    reported = float(re.search(r" in ([0-9.]+) s", done.stdout + done.stderr).group(1))
    return wall, reported, json.loads(out.read_text())["assignment"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--graphs", default="llama_layer,ffnn,llama_block")
    ap.add_argument("--cluster", default="v100x8")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    print("| graph | ops | torch path: wall / assign (s) | numpy path: wall / assign (s) | wall x | assign x | same assignment |")
    print("|---|---|---|---|---|---|---|")
    for name in args.graphs.split(","):
        g = workloads.build(name)
        path = tmp / f"{name}.json"
        save_graph(g, path)
        run_once(path, args.cluster, tmp / "warm.json", None)  # numba's on-disk caches, for both paths
        times = {"torch": [], "numpy": []}
        devices = {}
        for _ in range(args.repeats):  # interleaved: a noisy machine slows both alike
            for label, ck in (("torch", PRETRAINED_CHECKPOINT), ("numpy", None)):
                wall, reported, devs = run_once(path, args.cluster, tmp / f"{label}.json", ck)
                times[label].append((wall, reported))
                devices[label] = devs
        med = {k: (statistics.median(w for w, _ in v), statistics.median(r for _, r in v)) for k, v in times.items()}
        t, n = med["torch"], med["numpy"]
        print(f"| {name} | {g.num_ops} | {t[0]:.2f} / {t[1]:.2f} | {n[0]:.2f} / {n[1]:.2f} | {t[0] / n[0]:.2f} | "
              f"{t[1] / n[1]:.2f} | {devices['torch'] == devices['numpy']} |", flush=True)


if __name__ == "__main__":
    main()
