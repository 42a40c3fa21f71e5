"""Build / validate / save / load times of random layered graphs of 1k, 10k and 100k ops.

    python benchmarks/graph_scale.py [--sizes 1000,10000,100000] [--repeats 3]

"build" is the random-DAG generator plus IR construction (CSR views, validation,
topological levels); "validate" rebuilds the IR from the same arrays (what a file
load pays after parsing); "b-level" is one longest-path pass with communication;
"save"/"load" are the native JSON format on disk. Each figure is the median of
``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _timing import median_call_s

from doppler import workloads
from doppler.ir.formats import load_graph, save_graph
from doppler.ir.graph import DataflowGraph
from doppler.ir.analysis import b_level, edge_comm_from_ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'ops':>8} {'edges':>8} {'depth':>6} {'build s':>9} {'validate s':>11} {'b-level s':>10} "
          f"{'save s':>8} {'load s':>8} {'file MB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            graph = workloads.build("random", num_ops=n, seed=0)
            build_s = median_call_s(lambda: workloads.build("random", num_ops=n, seed=0), args.repeats)
            validate_s = median_call_s(
                lambda: DataflowGraph.from_arrays(graph.flops, graph.output_bytes, graph.src, graph.dst,
                                                  kind=graph.kind),
                args.repeats,
            )
            comm = edge_comm_from_ops(graph, graph.output_bytes)
            blevel_s = median_call_s(lambda: b_level(graph, comm_s=comm), args.repeats)
            path = Path(tmp) / f"g{n}.json"
            save_s = median_call_s(lambda: save_graph(graph, path), args.repeats)
            load_s = median_call_s(lambda: load_graph(path), args.repeats)
            assert load_graph(path).equals(graph)
            size_mb = path.stat().st_size / 1e6
            print(f"{graph.num_ops:>8} {graph.num_edges:>8} {graph.depth:>6} {build_s:>9.3f} {validate_s:>11.3f} "
                  f"{blevel_s:>10.3f} {save_s:>8.3f} {load_s:>8.3f} {size_mb:>8.1f}")


if __name__ == "__main__":
    main()
