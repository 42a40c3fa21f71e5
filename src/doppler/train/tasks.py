"""What a training run learns on: a :class:`Task` per (graph, cluster), scored by a :class:`CostOracle`.

A task holds the graph's features, the oracle that scores its assignments (the simulator in
Stage II, the engine in Stage III), the makespan lower bound its rewards are divided by, and the
best assignment found so far (the incumbent that the self-improvement term imitates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.policy.features import GraphFeatures, graph_features
from doppler.policy.decode import Rollout
from doppler.policy.rollout import rollout
from doppler.sim import SimContext
from doppler.methods import MethodError
from doppler.train.config import RULE_TEACHER, TrainConfig, TrainError

#: budget of an anneal or heft_lookahead teacher
TEACHER_BUDGET_S = 10.0
#: the most (episodes x ops) of one graph in one update: about 16 KB each were measured (3.98 GB for
#: --batch 128 on 2,000 ops), so this keeps an update near 8 GB
MAX_BATCH_OP_EPISODES = 2**19


class CostOracle(Protocol):
    """Where Stage II/III rewards come from: makespans (seconds) of a batch of assignments."""

    def evaluate(self, assignments: np.ndarray) -> np.ndarray: ...


class SimulatorOracle:
    """The WC simulator as a cost oracle (optionally with seeded noise, a fresh seed per call)."""

    def __init__(self, graph: DataflowGraph, cluster: Cluster, noise_sigma: float = 0.0, seed: int = 0) -> None:
        self.graph, self.cluster, self.noise_sigma = graph, cluster, noise_sigma
        self.ctx = SimContext(graph, cluster)  # built once, reused by every evaluation
        self.calls = seed

    def evaluate(self, assignments: np.ndarray) -> np.ndarray:
        self.calls += 1
        seed = self.calls if self.noise_sigma > 0 else 0
        return self.ctx.simulate_many(assignments, noise_sigma=self.noise_sigma, seed=seed)


@dataclass
class Task:
    """One training graph: its features, oracle, reward scale, baseline and best result."""

    graph: DataflowGraph
    cluster: Cluster
    features: GraphFeatures
    oracle: CostOracle
    lower_bound_s: float
    teacher_devices: np.ndarray | None  # per op, when PLC imitates a method other than the rule
    teacher_order: np.ndarray | None  # the b-level (critical_path) order its trajectory follows
    baseline: float | None = None  # running mean of normalised makespans
    best_makespan_s: float = math.inf
    best_order: np.ndarray | None = None
    best_step_device: np.ndarray | None = None
    best_assignment: np.ndarray | None = None
    greedy_ratio: float = math.nan  # the last Stage II greedy decode's makespan over the lower bound
    memory_budget_bytes: np.ndarray | None = None  # per device: episodes and incumbents keep within it
    _blevel_order: np.ndarray | None = field(default=None, repr=False)

    def blevel_order(self) -> np.ndarray:
        """The b-level (critical_path) op order along which assignments that are not the policy's own
        are replayed (teacher, warm start, local search); computed once."""
        if self._blevel_order is None:
            from doppler.methods.critical_path import critical_path_schedule

            self._blevel_order = critical_path_schedule(self.graph, self.cluster)["order"]
        return self._blevel_order

    def fits(self, devices: np.ndarray) -> bool:
        """Whether ``devices`` keeps every device within the task's memory budget (simulated; no budget: yes)."""
        if self.memory_budget_bytes is None:
            return True
        from doppler.sim import context

        return context(self.graph, self.cluster).fits_memory(devices, self.memory_budget_bytes)

    def record(self, ro: Rollout, makespans_s: np.ndarray) -> None:
        """The fastest episode of ``ro`` that fits the memory budget becomes the incumbent if it is faster."""
        b = int(np.argmin(makespans_s))
        if self.memory_budget_bytes is not None:
            fitting = [int(i) for i in np.argsort(makespans_s, kind="stable")
                       if makespans_s[i] < self.best_makespan_s and self.fits(ro.assignment[i])][:1]  # fmt: skip
            if not fitting:
                return
            b = fitting[0]
        if makespans_s[b] < self.best_makespan_s:
            self.best_makespan_s = float(makespans_s[b])
            self.best_order = ro.order[b].copy()
            self.best_step_device = ro.step_device[b].copy()
            self.best_assignment = ro.assignment[b].copy()

    def adopt_best(self, cands: np.ndarray, makespans_s: np.ndarray) -> None:
        """The fastest of assignments ``cands`` that fits the memory budget replaces the incumbent if it is
        faster (replayed along the b-level order)."""
        makespans_s = np.array([m if self.fits(c) else np.inf for c, m in zip(cands, makespans_s)])
        b = int(np.argmin(makespans_s))
        if makespans_s[b] < self.best_makespan_s:
            order = self.blevel_order()
            self.best_makespan_s, self.best_assignment = float(makespans_s[b]), cands[b].copy()
            self.best_order, self.best_step_device = order, cands[b][order]


def make_task(graph: DataflowGraph, cluster: Cluster, cfg: TrainConfig, oracle: CostOracle | None = None) -> Task:
    """A training graph. With a teacher other than the rule, that method's assignment (along the b-level
    order) is the Stage I target and the first best-so-far."""
    batch = max(cfg.batch, cfg.il_batch)
    if batch * graph.num_ops > MAX_BATCH_OP_EPISODES:
        raise TrainError(f"graph {graph.name!r}: --batch {batch} x {graph.num_ops:,} ops is more than the "
                         f"{MAX_BATCH_OP_EPISODES:,} op-episodes one update may hold (about 8 GB); give --batch "
                         f"{max(1, MAX_BATCH_OP_EPISODES // graph.num_ops)} or less")  # fmt: skip
    sim = SimulatorOracle(graph, cluster, cfg.noise_sigma, cfg.seed)
    lower_bound_s = sim.ctx.lower_bound()
    if not lower_bound_s > 0:  # rewards are makespans over this bound
        raise TrainError(f"graph {graph.name!r}: its makespan lower bound on {cluster.name!r} is 0 (no op has any work "
                         "and no data moves): nothing to learn")  # fmt: skip
    task = Task(graph=graph, cluster=cluster, features=graph_features(graph, cluster), oracle=oracle or sim,
                lower_bound_s=lower_bound_s, teacher_devices=None, teacher_order=None,
                memory_budget_bytes=_memory_budget(graph, cluster, cfg.memory_fraction))  # fmt: skip
    if cfg.teacher != RULE_TEACHER:
        from doppler.methods import assign

        memory = {"ignore_memory": True} if cfg.memory_fraction is None else {"memory_fraction": cfg.memory_fraction}
        try:
            task.teacher_devices = assign(graph, cluster, cfg.teacher, seed=cfg.seed, budget_s=TEACHER_BUDGET_S,
                                          **memory).devices  # fmt: skip
        except MethodError as e:
            raise TrainError(f"--teacher {cfg.teacher}: {e}") from None
        task.teacher_order = task.blevel_order()
        task.best_order = task.teacher_order
        task.best_step_device = task.teacher_devices[task.teacher_order]
        task.best_assignment = task.teacher_devices
        task.best_makespan_s = float(task.oracle.evaluate(task.teacher_devices[None, :])[0])
    return task


def _memory_budget(graph: DataflowGraph, cluster: Cluster, memory_fraction: float | None) -> np.ndarray | None:
    """The per-device budget a task's episodes keep to (None: ignored, unlimited, or everything fits at once);
    TrainError where no placement fits."""
    if memory_fraction is None:
        return None
    from doppler import memory

    budget = memory.budget_bytes(cluster, memory_fraction)
    if memory.always_fits(graph, budget):
        return None
    if memory.shortfall(graph, budget) is not None:
        raise TrainError(f"graph {graph.name!r} does not fit {cluster.name!r} within --memory-fraction "
                         f"{memory_fraction:g} (`doppler graph info -c` gives its weights against the budget)")  # fmt: skip
    return budget


def greedy_rollout(task: Task, enc, plc_ties_only: bool = False) -> tuple[Rollout, float]:
    """Decode greedily (no gradients), score it with the task's oracle, keep it if it is the best."""
    with torch.no_grad():
        ro = rollout(task.features, enc, batch=1, mode="greedy", plc_ties_only=plc_ties_only,
                     memory_budget_bytes=task.memory_budget_bytes)  # fmt: skip
    mk = np.asarray(task.oracle.evaluate(ro.assignment), dtype=np.float64)
    task.record(ro, mk)
    return ro, float(mk[0])
