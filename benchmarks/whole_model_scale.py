"""Whole-command wall time of every cheap method, DOPPLER's zero-shot decode and the timed searches on the
built-in whole model (``llama_model``, LLaMA-2-7B prefill, float16) at about 8,000, 20,000 and 50,000 ops.

    python benchmarks/whole_model_scale.py [--sizes 8k,20k,50k] [--cluster v100x8] [--budget-s 10]
                                           [--methods round_robin,...] [--train-episodes 0]

Each row is one fresh ``doppler`` process, as a user runs it (the graph file loaded, the method run within
the default memory fraction, the placement simulated and written): "wall s" is the whole command, "method s"
the method's own time (``assign_time_s``), "cpu s" the command's CPU time (all its threads: on a loaded
machine it tells what the command costs where the wall time does not). The bars (issue #53): ``graph info``, ``simulate``, each cheap
method and the zero-shot decode under 10 s at 50,000 ops; a search given ``--budget-s S`` at most 1.1 S of
method time. The first run after an install also loads or compiles numba's kernels: run twice for warm
numbers. ``--train-episodes N`` adds a short ``doppler train`` (N Stage II episodes, N / 2 imitation, no
distillation) and prints its episodes per second, set-up included. The machine's load average is printed with
each row: other work on the machine slows every row.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doppler import workloads
from doppler.ir.formats import save_graph

#: the llama_model parameters of each size (LLaMA-2-7B's shapes, finer tiles; 50k also two sequence blocks
#: and 35 layers, for 50,057 ops)
SIZES = {
    "8k": {"hidden_blocks": 8},
    "20k": {"head_blocks": 8, "hidden_blocks": 8, "dim_blocks": 8},
    "50k": {"head_blocks": 8, "hidden_blocks": 8, "dim_blocks": 8, "seq_blocks": 2, "layers": 35},
}
CHEAP_METHODS = "round_robin,random,round_robin_block,critical_path,heft,metis,enumerative,doppler"
BAR_S = 10.0
BUDGET_SLACK = 1.1
_CPU_S = [0.0]  # CPU seconds of the last command (_run)


def _run(args: list[str], timeout_s: float) -> tuple[float, dict | None, str]:
    """(wall seconds, the command's JSON output or None, the last line of its error output); the command's CPU
    seconds (user and system, all its threads) are left in ``_CPU_S[0]``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "doppler", *args], capture_output=True, text=True, timeout=timeout_s)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    _CPU_S[0] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    try:
        doc = json.loads(out.stdout) if out.returncode == 0 else None
    except json.JSONDecodeError:
        doc = None
    return wall_s, doc, (out.stderr.strip().splitlines() or [""])[-1]


def _row(label: str, size: str, n: int, wall_s: float, method_s: float | None, bar_s: float, note: str) -> bool:
    ok = wall_s <= bar_s if method_s is None or bar_s == BAR_S else method_s <= bar_s
    load = os.getloadavg()[0]
    shown = "" if method_s is None else f"{method_s:9.2f}"
    print(f"{label:<26} {size:>4} {n:>7,} {wall_s:8.2f} {_CPU_S[0]:7.2f} {shown:>9} {bar_s:6.1f} {load:5.1f}  "
          f"{'ok' if ok else 'MISS'} {note}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="8k,20k,50k", help=f"comma list of {', '.join(SIZES)}")
    p.add_argument("--cluster", default="v100x8")
    p.add_argument("--budget-s", type=float, default=10.0, help="budget of anneal and doppler --budget-s (0: skip)")
    p.add_argument("--methods", default=CHEAP_METHODS)
    p.add_argument("--train-episodes", type=int, default=0)
    args = p.parse_args()
    timeout_s = 10 * max(BAR_S, args.budget_s) + 120
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        print(f"cluster {args.cluster}; bar {BAR_S:g} s per command, searches {BUDGET_SLACK:g} x --budget-s of method time")
        print(f"{'command':<26} {'size':>4} {'ops':>7} {'wall s':>8} {'cpu s':>7} {'method s':>9} {'bar s':>6} {'load':>5}")
        for size in args.sizes.split(","):
            g = workloads.build("llama_model", **SIZES[size])
            path = Path(tmp) / f"{size}.json"
            save_graph(g, path)
            n = g.num_ops
            wall_s, _, err = _run(["graph", "info", str(path), "--devices", "8", "--json"], timeout_s)
            ok &= _row("graph info", size, n, wall_s, None, BAR_S, err if _ is None else "")
            for m in args.methods.split(","):
                out = Path(tmp) / f"{size}_{m}.json"
                wall_s, doc, err = _run(["assign", str(path), "-c", args.cluster, "-m", m, "-o", str(out), "--json"],
                                        timeout_s)  # fmt: skip
                note = err if doc is None else f"makespan/LB {doc['makespan_s'] / doc['lower_bound_s']:.3f}"
                ok &= _row(f"assign {m}", size, n, wall_s, None if doc is None else doc["assign_time_s"], BAR_S, note)
            first = args.methods.split(",")[0]
            wall_s, doc, err = _run(["simulate", str(path), "-c", args.cluster, "-a", str(Path(tmp) / f"{size}_{first}.json"),
                                     "--json"], timeout_s)  # fmt: skip
            ok &= _row(f"simulate ({first}'s)", size, n, wall_s, None, BAR_S, err if doc is None else "")
            for m in ("anneal", "doppler") if args.budget_s > 0 else ():
                out = Path(tmp) / f"{size}_{m}_budget.json"
                wall_s, doc, err = _run(["assign", str(path), "-c", args.cluster, "-m", m, "--budget-s",
                                         f"{args.budget_s:g}", "-o", str(out), "--json"], timeout_s)  # fmt: skip
                note = err if doc is None else f"makespan/LB {doc['makespan_s'] / doc['lower_bound_s']:.3f}"
                ok &= _row(f"{m} --budget-s {args.budget_s:g}", size, n, wall_s,
                           None if doc is None else doc["assign_time_s"], BUDGET_SLACK * args.budget_s, note)  # fmt: skip
            if args.train_episodes:
                run = Path(tmp) / f"run_{size}"
                wall_s, doc, err = _run(["train", str(path), "-c", args.cluster, "--episodes", str(args.train_episodes),
                                         "--il-episodes", str(max(args.train_episodes // 2, 1)), "--set",
                                         "distill_updates=0", "-o", str(run), "--json"], 100 * timeout_s)  # fmt: skip
                rate = _episode_rate(doc)
                print(f"{'train':<26} {size:>4} {n:>7,} {wall_s:8.2f}   {rate} episodes/s {err if doc is None else ''}")
    raise SystemExit(0 if ok else 1)


def _episode_rate(doc: dict | None) -> str:
    """Imitation and Stage II episodes per second of a ``doppler train --json`` run, its set-up (warm starts)
    included (``?`` where it failed)."""
    if not doc or not doc.get("elapsed_s"):
        return "?"
    return f"{(doc['il_episodes'] + doc['episodes']) / doc['elapsed_s']:.3f}"


if __name__ == "__main__":
    main()
