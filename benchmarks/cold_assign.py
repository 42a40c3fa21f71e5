"""A new user's first call: ``doppler assign G -c C --method doppler`` in a fresh process.

    python benchmarks/cold_assign.py [--repeats 5] [--cases llama_layer,ffnn,llama_block,llama_layer-973/h100x8]
                                     [--method heft]

Three ways of running the same command, each in fresh processes, interleaved (a noisy machine slows
all three alike):

* ``python``: the command as a user runs it. With the shipped policy and no ``--checkpoint``, the
  encoder runs in numpy (:mod:`doppler.policy.infer`, no torch) and, for one greedy decode of up to
  ``PYTHON_ASSIGN_MAX_OPS`` ops, the kernels run as Python with their numpy twins (no numba:
  :mod:`doppler.util.jit`); so do the cheap methods (``--method heft`` etc.);
* ``numba``: the same command after ``doppler.util.jit.start()``, i.e. compiled loops loaded from
  numba's on-disk cache (what the command did before the kernels could run as Python);
* ``torch``: the same shipped checkpoint given as ``--checkpoint``, loaded with torch (``doppler`` only).

It prints, per case, the median wall time of the whole process and the ``assign`` time the command
reports (which leaves out Python's start and the imports), and whether all three wrote the same
assignment. A case is a workload name (on ``--cluster``) or a held-out case name
(``doppler.workloads.corpus.held_out_split``), e.g. ``llama_layer-973/h100x8``.
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
from doppler.workloads.corpus import held_out_split
from doppler.ir.formats import save_graph
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT

#: the command after numba has started: what ``doppler assign`` did before its loops could run as Python
NUMBA_FIRST = "import sys; from doppler.util.jit import start; start(); from doppler.cli import main; sys.argv[0] = 'doppler'; main()"
WAYS = ("python", "numba", "torch")


def run_once(way: str, graph: Path, cluster: str, out: Path, method: str) -> tuple[float, float, list[int]]:
    args = ["assign", str(graph), "-c", cluster, "--method", method, "-o", str(out)]
    if way == "torch":
        args += ["--checkpoint", str(PRETRAINED_CHECKPOINT)]
    head = [sys.executable, "-c", NUMBA_FIRST] if way == "numba" else [sys.executable, "-m", "doppler"]
    t0 = time.perf_counter()
    done = subprocess.run(head + args, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(head + args)} failed: {done.stderr.strip()[-300:]}")
    reported = float(re.search(r" in ([0-9.]+) s", done.stdout + done.stderr).group(1))
    return wall, reported, json.loads(out.read_text())["assignment"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cases", default="llama_layer,ffnn,llama_block,llama_layer-973/h100x8")
    ap.add_argument("--cluster", default="v100x8", help="the cluster of the workload cases")
    ap.add_argument("--method", default="doppler", help="a method that runs as Python (doppler, heft, critical_path, ...)")
    args = ap.parse_args()
    ways = WAYS if args.method == "doppler" else WAYS[:2]
    tmp = Path(tempfile.mkdtemp())
    held_out = {c.name: c for c in held_out_split()}
    print(f"`doppler assign --method {args.method}`\n")
    print("| case | ops | " + " | ".join(f"{w}: wall / assign (s)" for w in ways) + " | numba / python (wall) | same assignment |")
    print("|---|---|" + "---|" * len(ways) + "---|---|")
    for name in args.cases.split(","):
        if name in held_out:
            g, cluster = held_out[name].graph, held_out[name].cluster.name
        else:
            g, cluster = workloads.build(name), args.cluster
        path = tmp / f"{name.replace('/', '_')}.json"
        save_graph(g, path)
        run_once("numba", path, cluster, tmp / "warm.json", args.method)  # numba's on-disk caches, for every way
        times: dict[str, list[tuple[float, float]]] = {w: [] for w in ways}
        devices = {}
        for _ in range(args.repeats):
            for way in ways:
                wall, reported, devs = run_once(way, path, cluster, tmp / f"{way}.json", args.method)
                times[way].append((wall, reported))
                devices[way] = devs
        med = {w: (statistics.median(t for t, _ in v), statistics.median(r for _, r in v)) for w, v in times.items()}
        cells = " | ".join(f"{med[w][0]:.2f} / {med[w][1]:.2f}" for w in ways)
        same = all(devices[w] == devices["python"] for w in ways)
        print(f"| {name} | {g.num_ops} | {cells} | {med['numba'][0] / med['python'][0]:.2f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
