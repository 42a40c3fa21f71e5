"""Dask's cost per dependent op, next to the local engine's, on the same chains.

    python benchmarks/dask_overhead.py [--ops 200] [--repeats 3]

A chain of ``--ops`` synthetic ops (writing 8 bytes each) runs on ONE device,
so every op waits for its predecessor; reported, per engine, the median over
``--repeats`` runs of ``(makespan - summed kernel time) / ops``: the engine's
overhead per dependent op. Chains:

* no-op kernels (zero seconds): pure dispatch, the makespan is all overhead
  (the number :func:`doppler.engine.dask_engine.measure_overhead` returns and
  ``run(..., engine="dask").info["overhead_per_op_s"]`` carries);
* 10 ms kernels: Dask batches its messages (a worker hears from the scheduler
  at most every 5 ms, the scheduler from a worker every 2 ms), which throttles
  back-to-back short ops; ops longer than that pay only the round trip;
* no-op kernels alternating over 2 devices: each op also waits for a fetch.

Dask: a LocalCluster of single-threaded worker processes (the producer's
completion travels worker -> scheduler, the consumer's dispatch scheduler ->
worker). Local: ``doppler.engine.run(..., engine="local")``, a thread
hand-off inside one process.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from doppler.engine import RunOptions, build_program, run
from doppler.engine import dask_cluster, dask_engine
from doppler.ir.graph import DataflowGraph
from doppler.hardware.presets import cluster


def chain(n: int) -> DataflowGraph:
    return DataflowGraph.from_arrays(np.ones(n), np.full(n, 8.0), np.arange(n - 1), np.arange(1, n), name="chain")


def overhead(engine: str, n: int, num_devices: int, op_seconds: float, repeats: int) -> float:
    g = chain(n)
    devices = np.arange(n) % num_devices
    prog = build_program(g, cluster=cluster(f"unit:{num_devices}"), time_scale=op_seconds)
    options = RunOptions(engine=engine)
    run(g, devices, num_devices=num_devices, options=options, program=prog, keep_outputs=False)  # warm-up
    out = []
    for _ in range(repeats):
        tr = run(g, devices, num_devices=num_devices, options=options, program=prog, keep_outputs=False).trace
        out.append((tr.makespan_s - float((tr.op_end - tr.op_start).sum())) / n)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n, r = args.ops, args.repeats
    rows = [("no-op chain, 1 device", 1, 0.0), ("10 ms ops, chain, 1 device", 1, 0.01),
            ("no-op chain alternating over 2 devices", 2, 0.0)]  # fmt: skip
    results = []
    try:
        for label, d, sec in rows:
            results.append((label, overhead("dask", n, d, sec, r), overhead("local", n, d, sec, r)))
        measured = dask_engine.measure_overhead(1, num_ops=n)
    finally:
        dask_cluster.close_clusters()
    print(f"overhead per dependent op = (makespan - kernel time) / ops, {n} ops, median of {r} runs")
    print(f"  {'':<42} {'dask':>10} {'local':>10} {'ratio':>7}")
    for label, dk, lc in results:
        print(f"  {label:<42} {dk * 1e6:8.1f}us {lc * 1e6:8.1f}us {dk / lc:6.0f}x")
    print(f"  dask_engine.measure_overhead(1, num_ops={n}): {measured * 1e6:.1f} us")


if __name__ == "__main__":
    main()
