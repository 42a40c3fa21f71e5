"""An engine-backed cost oracle: Stage III (real-system RL) rewards are measured makespans."""

from __future__ import annotations

import numpy as np

from doppler.engine.program import EngineError, Program, build_program
from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster

__all__ = ["EngineOracle"]


class EngineOracle:
    """``evaluate(assignments[B, n]) -> makespans_s[B]``, each the median of ``repeats`` real runs.

    Satisfies :class:`doppler.train.CostOracle`. The program (kernels, input
    tensors) is built once; ``cluster`` sizes synthetic kernels of cost-only
    graphs and gives the device count.
    """

    def __init__(
        self,
        graph: DataflowGraph,
        cluster: Cluster,
        *,
        engine: str = "local",
        repeats: int = 1,
        timeout_s: float = 600.0,
        scheduler: str | None = None,
        seed: int = 0,
        program: Program | None = None,
        device_type: str = "cpu",
    ) -> None:
        from doppler.engine import check_options

        check_options(engine, cluster.num_devices, repeats, timeout_s, seed, device_type)
        self.graph, self.cluster, self.engine, self.device_type = graph, cluster, engine, device_type
        self.repeats, self.timeout_s, self.scheduler = repeats, timeout_s, scheduler
        self.program = program or build_program(graph, cluster=cluster, seed=seed)
        self.calls = 0
        self.runs = 0

    def evaluate(self, assignments: np.ndarray) -> np.ndarray:
        from doppler.engine import RunOptions, run

        devs = np.asarray(assignments, dtype=np.int64)
        if devs.ndim != 2 or devs.shape[1] != self.graph.num_ops:
            raise EngineError(f"assignments must have shape [batch, {self.graph.num_ops}], got {devs.shape}")
        self.calls += 1
        out = np.empty(devs.shape[0])
        for b, row in enumerate(devs):
            options = RunOptions(engine=self.engine, device_type=self.device_type, scheduler=self.scheduler,
                                 repeats=self.repeats, timeout_s=self.timeout_s)  # fmt: skip
            res = run(self.graph, row, options=options, num_devices=self.cluster.num_devices, program=self.program,
                      keep_outputs=False)  # fmt: skip
            out[b] = res.makespan_s
            self.runs += self.repeats
        return out
