"""Dispatch overhead of the local engine: graphs of no-op kernels, in one run.

    python benchmarks/engine_overhead.py [--ops 2000] [--repeats 5] [--device-type cpu|cuda]

Each op is a synthetic kernel of zero seconds writing 8 bytes, so a run's
makespan is almost all engine overhead. Reported, per graph, the median over
repeats of:

* ``(makespan - critical path) / ops`` on ONE device, where every op runs
  back to back: the cost of one dispatch (dequeue, operand gathering, the
  completion's bookkeeping, waking the next op); the critical path is the
  longest path of the measured kernel times;
* the same on a dependency chain alternating between TWO devices, where every
  op waits for a transfer: the cost of one dependent hand-off across devices
  (on CPU devices the consumer's worker wakes up, copies and runs the op; on CUDA
  devices the link worker wakes up and copies, then the consumer's worker wakes up);
* a layered random DAG on 2 devices, round-robin: (makespan - critical path) /
  (ops / 2), the overhead per op when both devices work.

Target (issue 9): <= 50 us per op on this 2-core CPU. With ``--device-type cuda``
the no-op kernels are GPU launches (a fill of 8 bytes) timed by CUDA events, and
a dispatch includes the launch and the wait for the kernel's end event.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from doppler import workloads
from doppler.engine import RunOptions, build_program, run
from doppler.ir.graph import DataflowGraph
from doppler.hardware.presets import cluster
from doppler.ir.analysis import critical_path_length


def noop_graph(src: np.ndarray, dst: np.ndarray, n: int, name: str) -> DataflowGraph:
    return DataflowGraph.from_arrays(np.zeros(n), np.full(n, 8.0), src, dst, name=name)


def critical_path_s(graph: DataflowGraph, trace) -> float:
    return float(critical_path_length(graph, compute_s=trace.op_end - trace.op_start))


def measure(graph: DataflowGraph, devices: np.ndarray, num_devices: int, repeats: int, per: float,
            device_type: str = "cpu") -> float:  # fmt: skip
    prog = build_program(graph, cluster=cluster(f"unit:{num_devices}"))
    out = []
    kw = {"num_devices": num_devices, "program": prog, "keep_outputs": False}
    res = run(graph, devices, options=RunOptions(device_type=device_type, repeats=repeats, warmup=1), **kw)
    for _ in range(repeats):
        res = run(graph, devices, options=RunOptions(device_type=device_type), **kw)
        out.append((res.makespan_s - critical_path_s(graph, res.trace)) / per)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device-type", default="cpu", help="cpu or cuda (2 devices: one GPU split in two)")
    args = ap.parse_args()
    n = args.ops
    chain_src, chain_dst = np.arange(n - 1), np.arange(1, n)
    rnd = workloads.build("random", num_ops=n, width=16, seed=0)
    rows = [
        ("chain, 1 device (one dispatch)", noop_graph(chain_src, chain_dst, n, "chain"), np.zeros(n, np.int64), 1, n),
        ("chain alternating over 2 devices (dispatch + hand-off)", noop_graph(chain_src, chain_dst, n, "chain"),
         np.arange(n) % 2, 2, n),
        ("layered random DAG, 2 devices round-robin (per op per device)", noop_graph(rnd.src, rnd.dst, n, "random"),
         np.arange(n) % 2, 2, n / 2),
    ]  # fmt: skip
    print(f"local engine ({args.device_type} devices), {n} no-op ops, median of {args.repeats} runs")
    for label, g, dev, d, per in rows:
        us = measure(g, dev, d, args.repeats, per, args.device_type) * 1e6
        verdict = "meets" if us <= 50 else "misses"
        print(f"  {label:<62} {us:7.1f} us per op  ({verdict} the 50 us target)")


if __name__ == "__main__":
    main()
