"""Compile the numba loops once, split over the cores, before pytest-xdist's workers run a test.

A loop compiles the first time a process calls it with new argument types, and numba caches it on
disk (``cache=True``, in ``__pycache__`` beside its source). With two workers on a fresh clone, both
would compile the same loops (the annealer's alone takes half a minute of a core) while each waits
for its own. ``tests/conftest.py`` starts one process per group of :data:`GROUPS` as the whole suite
starts, in parallel with the workers' start and collection, and each worker waits for them before
its first test; every loop is then loaded from the cache. The groups call the methods as the tests
do (the same argument types, so the same compiled signatures), on graphs where each loop runs.
A group that fails only costs the warm-up: the tests compile whatever is missing, as without it.

    python -m tests.numba_warmup GROUP DONE_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path

#: group -> (workload, methods with their options); each group runs in its own process
GROUPS: dict[str, tuple[str, list[tuple[str, dict]]]] = {
    # the annealer's batches, its moves and the simulator they inline (a start that is not optimal); then a
    # tiny training of the pairwise policy
    "anneal": ("chainmm", [("anneal", {"max_evals": 300})]),
    # the list schedulers (heft also within memory), the rollouts, the policy's compiled decode (numba started by
    # heft first), the simulator's entry points; then a tiny training of DOPPLER
    "rest": ("chainmm", [("heft", {}), ("critical_path", {}), ("lookahead", {}),
                         ("heft_lookahead", {"threads": 1}), ("heft_lookahead", {}), ("doppler", {}),
                         ("doppler", {"samples": 4})]),
}


def warm(group: str) -> None:
    """Run ``group``'s methods once (numba compiles, or loads from its cache, every loop they call)."""
    import numpy as np

    from doppler import cluster, workloads
    from doppler.methods import assign
    from doppler.sim import simulate, simulate_many, traced

    workload, methods = GROUPS[group]
    graph, devices = workloads.build(workload), cluster("p100x4")
    for method, options in methods:
        assign(graph, devices, method, seed=0, options=options or None)
    if group == "rest":
        placed = assign(graph, devices, "critical_path")
        simulate(graph, devices, placed)
        traced(graph, devices, placed)
        simulate_many(graph, devices, np.zeros((3, graph.num_ops), dtype=np.int64))
        # heft within each device's memory budget: 60% of what the graph holds on one device
        peak_bytes = max(traced(graph, devices, assign(graph, devices, "single")).peak_memory_bytes)
        assign(graph, devices, "heft", memory_fraction=0.6 * peak_bytes / devices.devices[0].memory_bytes)
        _train_tiny(graph, "doppler")
    else:
        _train_tiny(graph, "single_policy")


def _train_tiny(graph, method: str) -> None:
    """A tiny training of ``method`` through the CLI, as the tests run it (the policy's compiled rollouts)."""
    import tempfile

    from typer.testing import CliRunner

    from doppler.cli import app
    from doppler.ir.formats import save_graph

    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/g.json"
        save_graph(graph, path)
        CliRunner().invoke(app, ["train", path, "-c", "unit:2", "--method", method, "--episodes", "4", "--batch", "4",
                                 "--search-evals", "0", "--warm-start", "none", "--threads", "1", "-o", f"{tmp}/run"])  # fmt: skip


def main() -> None:
    group, done = sys.argv[1], Path(sys.argv[2])
    try:
        warm(group)
    finally:
        done.write_text(group)


if __name__ == "__main__":
    main()
