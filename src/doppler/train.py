"""Training DOPPLER: Stage I (imitation of a teacher), Stage II (REINFORCE in the
simulator) and a last distillation of the best assignment found into the greedy
decode; Stage III is the Stage II loop with another :class:`CostOracle`.

Read top to bottom, CleanRL-style: config -> oracles -> tasks (graph, cluster,
features, oracle) -> losses -> the trainer (seeding, policy and optimiser, Stage I,
Stage II, distillation, the run loop, logging, checkpoints). Every hyper-parameter
lives in :class:`TrainConfig`.

One update processes, for every training graph, ``batch`` episodes that share one
encoder pass: a compiled rollout records the actions
(:func:`~doppler.policy.rollout.rollout`), the oracle scores the B assignments in
one call, and :func:`~doppler.policy.rollout.evaluate_actions` re-scores all
decisions in one differentiable pass. Rewards are ``-(makespan / lower bound)``
so several graphs (and clusters of other sizes) can share one policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import torch

from doppler.methods.anneal import WARM_START_METHODS
from doppler.graph import DataflowGraph
from doppler.hardware import Cluster
from doppler.io_util import check_seed, make_run_dir
from doppler.listsched import LIST_SCHEDULES
from doppler.malloc import tune_malloc
from doppler.policy.architectures import MAX_MP_STEPS, MAX_WIDTH, build_policy
from doppler.policy.features import GraphFeatures, graph_features
from doppler.progress import ProgressEvent, ProgressFn
from doppler.policy.checkpoint import CHECKPOINT_FORMAT, write_checkpoint
from doppler.policy import BASELINE_METHODS, LEARNED_METHODS
from doppler.policy.decode import Rollout
from doppler.policy.rollout import evaluate_actions, rollout, segment_logsumexp
from doppler.sim import SimContext

STAGES = ("il", "sim", "real")
TEACHERS = ("critical_path", "lookahead", "heft", "heft_lookahead", "enumerative", "anneal")
STATE_TEACHERS = ("critical_path", "lookahead")  # label the states the policy visits (DAgger)
BASELINES = ("running", "mean", "loo")
IDENTITY_METHODS = ("doppler", "doppler_plc")  # whose device head is learned: device identity on by default
TEACHER_BUDGET_S = 10.0  # budget of an anneal or heft_lookahead teacher
#: evaluations of each local search when fine-tuning a pretrained policy (``doppler train --init``), where
#: the fine-tuned decode is what these searches find, so they are longer than the default 20,000
INIT_SEARCH_EVALS = 100_000


class TrainError(ValueError):
    """Bad training request or checkpoint (reported with exit code 2 by the CLI)."""


#: the most episodes per graph in one update (``--batch``; Stage I's ``il_batch`` too): a batch's
#: tensors grow with it (``--batch 100000`` on 84 ops took 19.8 GB before its first update)
MAX_BATCH = 1024
#: the most fresh (graph, cluster) pairs in one pretraining update (each up to 1,000 ops, held at once)
MAX_PAIRS_PER_UPDATE = 64
#: the most (episodes x ops) of one graph in one update: about 16 KB each were measured (3.98 GB for
#: --batch 128 on 2,000 ops), so this keeps an update near 8 GB
MAX_BATCH_OP_EPISODES = 2**19
#: the most torch threads (``--threads``): far more than any machine's cores (100,000 crashed torch)
MAX_TORCH_THREADS = 256




def _flag(field_name: str) -> str:
    """The command-line option that sets a :class:`TrainConfig` field, for messages."""
    return "--" + {"torch_threads": "threads", "self_improve_coef": "self-improve"}.get(field_name, field_name).replace("_", "-")


@dataclass
class TrainConfig:
    """Every hyper-parameter of a training run (one field each, with what it sets)."""

    stages: tuple[str, ...] = ("il", "sim")  # which stages to run, in order
    episodes: int = 4000  # Stage II episodes (all graphs together)
    il_episodes: int = 1024  # Stage I episodes (all graphs together)
    batch: int = 8  # Stage II episodes per graph per update (they share one encoder pass)
    pairs_per_update: int = 1  # pretraining: fresh (graph, cluster) pairs per update, their gradients averaged
    il_batch: int = 8  # Stage I episodes per graph per update
    lr: float = 3e-3  # Adam learning rate at the start of Stage II
    lr_final: float = 1e-6  # ... decayed linearly to this at the end
    il_lr: float = 5e-3  # Adam learning rate of Stage I
    eps_start: float = 0.02  # epsilon-greedy exploration in Stage II (paper: 0.2), decayed linearly ...
    eps_end: float = 0.0  # ... to this
    entropy_coef: float = 1e-3  # weight of the (per-step mean) entropy bonus (paper: 1e-2)
    baseline: str = "loo"  # REINFORCE baseline: running | mean | loo (leave-one-out batch mean)
    running_decay: float = 0.95  # decay of the running-mean baseline
    normalize_advantage: bool = True  # divide advantages by the batch's standard deviation
    self_improve_coef: float = 1.0  # weight of the log-likelihood of the best assignment so far (0: off)
    sample_sel: bool = True  # Stage II samples SEL too (False: SEL decodes greedily, only PLC explores)
    plc_ties_only: bool = False  # Stage II's episodes and greedy decodes: the device head only breaks the ties
    # of the list-schedule rule (the action space of zero-shot decoding; `doppler pretrain --init`)
    update_epochs: int = 1  # gradient steps per batch of episodes (> 1: PPO-style clipped reuse)
    clip_ratio: float = 0.2  # PPO's clip range for update_epochs > 1
    search_every: int = 500  # Stage II episodes between local searches from the incumbent (expert iteration; 0: off)
    search_evals: int = 20_000  # simulator evaluations of each such search (simulated annealing, deterministic)
    distill_updates: int = 1000  # after Stage II, at most this many updates that teach the policy to decode
    # the best assignment found greedily (self-imitation until greedy matches it; 0: off)
    # distillation also imitates the best device in the greedy decode's own states (DAgger), with this
    # weight; None: 1 with device_identity, else 0 (see on_policy_weight)
    distill_on_policy: float | None = None
    max_grad_norm: float = 5.0  # gradient clipping
    teacher: str = "critical_path"  # Stage I teacher of PLC (SEL always imitates b-level order)
    method: str = "doppler"  # doppler (both heads learned), doppler_sel or doppler_plc (one head; the other
    # follows CRITICAL PATH's rule: the paper's single-head ablations), or a learned baseline: single_policy,
    # gdp, placeto (doppler.policy.architectures)
    lookahead_steps: int = 16  # with teacher="lookahead": labelled steps per Stage I episode
    hidden: int = 128  # embedding width H
    mp_steps: int = 6  # message-passing steps K
    mlp_hidden: int = 128  # width of the heads' hidden layer
    op_features: str = "full"  # static op features: full | structural (position-free, for transfer)
    device_identity: bool | None = None  # DOPPLER's device head learns a state per device of the training cluster,
    # so that it tells apart devices that differ only by their links (v100x8) and decodes the best assignment it
    # was taught; on any other cluster the policy decodes without them. None: on where the device head is
    # learned (doppler, doppler_plc), else off (see learns_device_identity)
    list_schedule: str = "critical_path"  # DOPPLER's PLC: the list-schedule model of its device features and
    # its Stage I rule: critical_path (append, earliest start) | heft (insert into idle gaps, earliest finish)
    noise_sigma: float = 0.0  # lognormal noise of the simulator oracle
    real_episodes: int = 64  # Stage III episodes (each one a measured run on the engine)
    real_lr: float = 3e-4  # Adam learning rate of Stage III (constant)
    real_eps: float = 0.0  # epsilon-greedy exploration of Stage III (constant)
    real_seed_methods: tuple[str, ...] = ("single", "metis", "critical_path")  # measured at the start of
    # Stage III next to the best simulated assignment; the fastest measured one becomes the incumbent that
    # the self-improvement term imitates (empty: only the simulator's best)
    sim_seed_methods: tuple[str, ...] = WARM_START_METHODS  # simulated at the start of Stage II; the fastest
    # becomes the first incumbent of the self-improvement term (empty: start from the policy's own samples)
    engine: str = "local"  # Stage III engine: local | dask
    engine_repeats: int = 1  # runs per Stage III episode (the reward is their median)
    engine_device_type: str = "cpu"  # Stage III devices of the local engine: cpu | cuda
    seed: int = 0
    checkpoint_every: int = 1000  # episodes between checkpoints (and at the end of each stage)
    torch_threads: int = 2  # intra-op threads (benchmarks/train_speed.py compares 1 and 2; two processes
    # with 2 each on 2 cores oversubscribe them and run far slower than one: use 1 there)
    device: str = "cpu"  # where the networks run (cpu, cuda); rollouts and the simulator stay on the CPU

    @property
    def on_policy_weight(self) -> float:
        """Weight of distillation's on-policy term. By default it is on only where the device head can
        tell devices apart (``device_identity``): the term names the best assignment's devices, and
        without identity the head cannot keep them apart from their renamed copies, so the labels fight
        the replay. ``distill_on_policy`` overrides the default."""
        if self.distill_on_policy is not None:
            return float(self.distill_on_policy)
        return 1.0 if self.learns_device_identity else 0.0

    @property
    def learns_device_identity(self) -> bool:
        """Whether the policy learns a state per device (``device_identity``; by default wherever DOPPLER's
        device head is learned), so that distillation can make the greedy decode reproduce the best
        assignment on clusters of alike devices. ``device_identity`` overrides the default."""
        if self.device_identity is not None:
            return bool(self.device_identity)
        return self.method in IDENTITY_METHODS

    def _check_types(self) -> None:
        """Every field holds a value of its default's type (an int field a whole number, a float field a finite
        number, a tuple field a sequence of names), so that a wrong type is one line, not torch's error."""
        for f in dataclasses.fields(self):
            value, default = getattr(self, f.name), f.default if f.default is not dataclasses.MISSING else f.default_factory()
            if value is None and default is None:
                continue
            if isinstance(default, bool) or (default is None and f.name == "device_identity"):
                ok, what = isinstance(value, bool), "true or false"
            elif isinstance(default, int):
                ok, what = isinstance(value, (int, np.integer)) and not isinstance(value, bool), "a whole number"
            elif isinstance(default, float) or default is None:
                ok = (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                      and math.isfinite(float(value)))  # fmt: skip
                what = "a finite number"
            elif isinstance(default, tuple):
                ok = isinstance(value, (tuple, list)) and all(isinstance(s, str) for s in value)
                what = "a list of names"
            else:
                ok, what = isinstance(value, type(default)), f"a {type(default).__name__}"
            if not ok:
                raise TrainError(f"{_flag(f.name)} must be {what}, got {value!r}")

    def validate(self) -> None:
        self._check_types()
        for name, lo, hi in (("hidden", 1, MAX_WIDTH), ("mlp_hidden", 1, MAX_WIDTH), ("mp_steps", 0, MAX_MP_STEPS),
                             ("update_epochs", 1, None), ("distill_updates", 0, None)):  # fmt: skip
            if int(getattr(self, name)) < lo:
                raise TrainError(f"{name} must be >= {lo}, got {getattr(self, name)}")
            if hi is not None and int(getattr(self, name)) > hi:
                raise TrainError(f"{name} must be at most {hi}, got {getattr(self, name)}")
        for name in ("eps_start", "eps_end", "real_eps", "running_decay"):
            if not 0 <= float(getattr(self, name)) <= 1:
                raise TrainError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("entropy_coef", "noise_sigma", "clip_ratio"):
            if float(getattr(self, name)) < 0:
                raise TrainError(f"{name} must be >= 0, got {getattr(self, name)}")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise TrainError(f"unknown stage {unknown[0] if unknown else ''!r} (use: {', '.join(STAGES)})")
        if self.teacher not in TEACHERS:
            raise TrainError(f"unknown teacher {self.teacher!r} (use one of: {', '.join(TEACHERS)})")
        if self.method not in LEARNED_METHODS:
            raise TrainError(f"unknown method {self.method!r} (trainable: {', '.join(LEARNED_METHODS)})")
        from doppler.policy.features import OP_FEATURE_SETS

        if self.op_features not in OP_FEATURE_SETS:
            raise TrainError(f"unknown op feature set {self.op_features!r} (use one of: {', '.join(OP_FEATURE_SETS)})")
        if self.list_schedule not in LIST_SCHEDULES:
            raise TrainError(f"unknown list schedule {self.list_schedule!r} (use one of: {', '.join(LIST_SCHEDULES)})")
        if self.list_schedule != "critical_path" and self.teacher == "lookahead":
            raise TrainError("--teacher lookahead rolls out CRITICAL PATH's list schedule: use it with --list-schedule "
                             "critical_path")  # fmt: skip
        if self.list_schedule != "critical_path" and self.method in BASELINE_METHODS:
            raise TrainError(f"--list-schedule {self.list_schedule} is for DOPPLER's policies, not {self.method}")
        if self.device_identity and self.method in BASELINE_METHODS:
            raise TrainError(f"--device-identity is for DOPPLER's policies, not {self.method}")
        if self.baseline not in BASELINES:
            raise TrainError(f"unknown baseline {self.baseline!r} (use one of: {', '.join(BASELINES)})")
        for name in ("episodes", "il_episodes", "batch", "il_batch", "checkpoint_every", "real_episodes", "engine_repeats",
                     "lookahead_steps", "torch_threads", "pairs_per_update"):
            if int(getattr(self, name)) < 1:
                raise TrainError(f"{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name, cap in (("batch", MAX_BATCH), ("il_batch", MAX_BATCH), ("pairs_per_update", MAX_PAIRS_PER_UPDATE)):
            if int(getattr(self, name)) > cap:
                raise TrainError(f"{_flag(name)} must be at most {cap} (all of them are held in memory "
                                 f"at once), got {getattr(self, name)}")  # fmt: skip
        if int(self.torch_threads) > MAX_TORCH_THREADS:
            raise TrainError(f"--threads must be at most {MAX_TORCH_THREADS}, got {self.torch_threads}")
        if not (math.isfinite(float(self.max_grad_norm)) and self.max_grad_norm > 0):
            raise TrainError(f"max_grad_norm must be a finite number > 0, got {self.max_grad_norm!r}")
        for name in ("lr", "il_lr", "real_lr", "lr_final"):
            value = float(getattr(self, name))
            if not (math.isfinite(value) and 0 < value <= 1) and not (name == "lr_final" and value == 0):
                raise TrainError(f"{_flag(name)} must be a learning rate in (0, 1], got {getattr(self, name)}")
        for name, flag in (("self_improve_coef", "self-improve"), ("distill_on_policy", "distill-on-policy")):
            if getattr(self, name) is None:
                continue
            value = float(getattr(self, name))
            if not (math.isfinite(value) and 0 <= value <= 100):
                raise TrainError(f"--{flag} must be a weight in [0, 100], got {getattr(self, name)}")
        for name in ("search_every", "search_evals"):
            if int(getattr(self, name)) < 0:
                raise TrainError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")
        from doppler.methods import MethodError, get_method

        for m in (*self.sim_seed_methods, *self.real_seed_methods):
            try:
                get_method(m)
            except MethodError as e:
                raise TrainError(f"warm start: {e}") from None
        check_seed(self.seed, TrainError, "--seed")
        from doppler.engine import DEVICE_TYPES, ENGINES

        if self.engine not in ENGINES:
            raise TrainError(f"unknown engine {self.engine!r} for Stage III (use local or dask)")
        if self.engine_device_type not in DEVICE_TYPES or (self.engine == "dask" and self.engine_device_type != "cpu"):
            raise TrainError(f"device type {self.engine_device_type!r} is not available on the {self.engine} engine "
                             "(local: cpu or cuda; dask: cpu)")  # fmt: skip
        if "real" in self.stages and self.engine_device_type == "cuda" and not torch.cuda.is_available():
            raise TrainError("Stage III on CUDA devices: no CUDA device is visible here")  # before any training
        if self.baseline != "running" and self.batch < 2:
            raise TrainError(f"baseline {self.baseline!r} needs --batch >= 2")


# ============================================================================ oracles
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


# ============================================================================ tasks
@dataclass
class Task:
    """One training graph: its features, oracle, reward scale, baseline and best result."""

    graph: DataflowGraph
    cluster: Cluster
    features: GraphFeatures
    oracle: CostOracle
    lower_bound_s: float
    teacher_devices: np.ndarray | None  # per op, when PLC imitates a method other than critical_path
    teacher_order: np.ndarray | None  # the b-level (critical_path) order its trajectory follows
    baseline: float | None = None  # running mean of normalised makespans
    best_makespan_s: float = math.inf
    best_order: np.ndarray | None = None
    best_step_device: np.ndarray | None = None
    best_assignment: np.ndarray | None = None
    greedy_ratio: float = math.nan  # the last Stage II greedy decode's makespan over the lower bound
    _blevel_order: np.ndarray | None = field(default=None, repr=False)

    def blevel_order(self) -> np.ndarray:
        """The b-level (critical_path) op order along which assignments that are not the policy's own
        are replayed (teacher, warm start, local search); computed once."""
        if self._blevel_order is None:
            from doppler.methods.critical_path import critical_path_schedule

            self._blevel_order = critical_path_schedule(self.graph, self.cluster)["order"]
        return self._blevel_order

    def record(self, ro: Rollout, makespans_s: np.ndarray) -> None:
        b = int(np.argmin(makespans_s))
        if makespans_s[b] < self.best_makespan_s:
            self.best_makespan_s = float(makespans_s[b])
            self.best_order = ro.order[b].copy()
            self.best_step_device = ro.step_device[b].copy()
            self.best_assignment = ro.assignment[b].copy()


def _reproducible(update):
    """Run a training update with torch's deterministic CPU kernels, then restore the flag. With two
    or more threads a parallel reduction in a CPU kernel otherwise adds in another order from run to
    run: same-seed runs differed in the seventh digit of their first losses, then took different
    trajectories. The flag is process-wide (and on CUDA it makes cuBLAS raise), so it is held only
    for the update, and only where both the policy and Stage III's engine devices are CPUs (the
    engine runs its kernels in this process, inside the update)."""

    @functools.wraps(update)
    def run(self, *args, **kwargs):
        if torch.device(self.cfg.device).type != "cpu" or self.cfg.engine_device_type != "cpu":
            return update(self, *args, **kwargs)
        before = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            return update(self, *args, **kwargs)
        finally:
            torch.use_deterministic_algorithms(before, warn_only=warn_only)

    return run


def make_task(graph: DataflowGraph, cluster: Cluster, cfg: TrainConfig, oracle: CostOracle | None = None) -> Task:
    """A training graph. With a teacher other than critical_path, that method's assignment
    (along the b-level order) is the Stage I target and the first best-so-far."""
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
    task = Task(
        graph=graph,
        cluster=cluster,
        features=graph_features(graph, cluster),
        oracle=oracle or sim,
        lower_bound_s=lower_bound_s,
        teacher_devices=None,
        teacher_order=None,
    )
    if cfg.teacher not in STATE_TEACHERS:
        from doppler.methods import assign

        task.teacher_devices = assign(graph, cluster, cfg.teacher, seed=cfg.seed, budget_s=TEACHER_BUDGET_S).devices
        task.teacher_order = task.blevel_order()
        task.best_order = task.teacher_order
        task.best_step_device = task.teacher_devices[task.teacher_order]
        task.best_assignment = task.teacher_devices
        task.best_makespan_s = float(task.oracle.evaluate(task.teacher_devices[None, :])[0])
    return task


# ============================================================================ losses
def lookahead_mask(task: Task, ro: Rollout, steps_per_episode: int, rng: np.random.Generator) -> np.ndarray:
    """PLC labels of the LOOKAHEAD teacher at ``steps_per_episode`` random steps of each episode:
    ``bool[B, n, D]``, the devices whose one-step rollout simulates fastest (all False elsewhere)."""
    from doppler.methods.lookahead import lookahead_labels

    B, n = ro.order.shape
    steps = np.sort([rng.choice(n, size=min(steps_per_episode, n), replace=False) for _ in range(B)], axis=1)
    _, tied = lookahead_labels(task.graph, task.cluster, ro.order, ro.step_device, steps)  # one batch, one context
    mask = np.zeros(ro.est_tied.shape, dtype=bool)
    mask[np.arange(B)[:, None], steps] = tied
    return mask


def imitation_loss(task: Task, ro: Rollout, enc, plc_mask: np.ndarray | None = None) -> tuple[torch.Tensor, float, float]:
    """-log P(teacher's tied-best choices), per step; returns (loss, SEL agreement, PLC agreement).

    SEL's teacher picks the candidate with the largest b-level; PLC's the device with
    the smallest EST, or with another teacher that method's device for the op. A given
    ``plc_mask[B, n, D]`` replaces PLC's labels; steps where it marks no device are not scored."""
    sc = evaluate_actions(enc, ro)
    cs = sc.cands
    key = task.features.b_level_key[cs.op]
    seg_best = np.full(cs.num_segments, np.iinfo(np.int64).min)
    np.maximum.at(seg_best, cs.seg, key)
    tied = key == seg_best[cs.seg]
    device = sc.cand_logp.device
    seg = torch.from_numpy(cs.seg).to(device)
    masked = sc.cand_logp.masked_fill(~torch.from_numpy(tied).to(device), -torch.inf)
    sel_ll = segment_logsumexp(masked, seg, cs.num_segments)
    if plc_mask is not None:
        plc_mask = torch.from_numpy(plc_mask).to(device)
    elif task.teacher_devices is None:
        plc_mask = torch.from_numpy(ro.est_tied).to(device)
    else:
        want = task.teacher_devices[ro.order]  # [B, n]
        plc_mask = torch.from_numpy(np.arange(ro.est_tied.shape[2]) == want[..., None]).to(device)
    labelled = plc_mask.any(-1)
    plc_ll = torch.logsumexp(sc.plc_logp.masked_fill(~plc_mask, -torch.inf), dim=-1)[labelled]
    w_sel, w_plc = enc.head_weights()
    loss = -(w_sel * sel_ll.mean() if w_sel else 0.0) - w_plc * plc_ll.mean()
    with torch.no_grad():
        seg_max = torch.full((cs.num_segments,), -torch.inf, device=device).scatter_reduce(0, seg, sc.cand_logp, "amax")
        sel_agree = float((sel_ll >= seg_max - 1e-6).float().mean())
        plc_best = sc.plc_logp.argmax(-1, keepdim=True)
        plc_agree = float(plc_mask.gather(-1, plc_best)[labelled].float().mean())
    return loss, sel_agree, plc_agree


def _greedy_rollout(task: Task, enc, plc_ties_only: bool = False) -> tuple[Rollout, float]:
    """Decode greedily (no gradients), score it with the task's oracle, keep it if it is the best."""
    with torch.no_grad():
        ro = rollout(task.features, enc, batch=1, mode="greedy", plc_ties_only=plc_ties_only)
    mk = np.asarray(task.oracle.evaluate(ro.assignment), dtype=np.float64)
    task.record(ro, mk)
    return ro, float(mk[0])


def _best_nll(task: Task, enc) -> torch.Tensor:
    """Per-step negative log-likelihood of the best trajectory so far (the self-improvement term)."""
    best = rollout(task.features, enc, batch=1, mode="teacher", order=task.best_order,
                   devices_by_step=task.best_step_device)  # fmt: skip
    sb = evaluate_actions(enc, best)
    w_sel, w_plc = enc.head_weights()
    return -(w_sel * sb.logp_sel + w_plc * sb.logp_plc).mean()


def _on_policy_nll(task: Task, enc, ro: Rollout) -> torch.Tensor:
    """Per-step negative log-likelihood of the best assignment's device for each op, in the states the
    greedy decode ``ro`` visited (DAgger for distillation): where the decode has left the best
    trajectory, the teacher-forced replay no longer shows the device head the states it meets. A
    makespan depends only on the assignment, so the best device of the op at hand is the label in
    any state."""
    sb = evaluate_actions(enc, ro)
    label = torch.from_numpy(task.best_assignment[ro.order[0]]).to(sb.plc_logp.device)
    return -sb.plc_logp[0].gather(1, label.unsqueeze(1)).mean()


def advantages(cost: np.ndarray, task: Task, cfg: TrainConfig) -> np.ndarray:
    """Advantage (higher is better) of each episode's normalised makespan ``cost``."""
    if cfg.baseline == "running":
        if task.baseline is None:
            task.baseline = float(cost.mean())
        adv = task.baseline - cost
        task.baseline = cfg.running_decay * task.baseline + (1 - cfg.running_decay) * float(cost.mean())
    elif cfg.baseline == "mean":
        adv = cost.mean() - cost
    else:  # leave-one-out mean of the other B - 1 episodes
        adv = (cost.sum() - cost) / (cost.size - 1) - cost
    if cfg.normalize_advantage and adv.size > 1:
        adv = adv / (adv.std() + 1e-8)
    return adv


# ============================================================================ the trainer


@dataclass
class Trainer:
    """A training run: tasks, policy, optimiser, RNGs and counters (everything a checkpoint holds)."""

    cfg: TrainConfig
    tasks: list[Task]
    policy: torch.nn.Module  # doppler.policy.architectures.build_policy(cfg.method, ...)
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator
    il_episode: int = 0
    episode: int = 0
    real_episode: int = 0  # Stage III episodes done
    distill_step: int = 0  # distillation updates done (set to distill_updates once greedy matches the best)
    distill_best: tuple[float, dict] | None = None  # during distillation: the best greedy score and its weights
    history: list[dict[str, float]] = field(default_factory=list)
    writer: Any = None
    phase_s: dict[str, float] = field(default_factory=dict)  # wall time per phase of Stage II updates
    real_oracles: dict[int, CostOracle] = field(default_factory=dict)  # Stage III oracles per task (engine-backed)
    identity_left_out: int | None = None  # `--init`: the device count of the checkpoint's learned device identity,
    # left out because it was learned on another cluster (not saved: it describes how this run started)
    grad_sync: Callable[[list[torch.nn.Parameter]], None] | None = None  # pretraining workers: averages the
    # gradients across processes before each step (doppler.pretrain_parallel.GradSync.average)

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.phase_s[name] = self.phase_s.get(name, 0.0) + time.perf_counter() - t0

    @classmethod
    def create(
        cls, graphs: list[DataflowGraph], cluster: Cluster, cfg: TrainConfig, oracles=None, real_oracles=None
    ) -> "Trainer":
        """Set up a run; ``oracles``/``real_oracles`` map task index -> Stage II / Stage III oracle
        (defaults: the simulator, and an :class:`~doppler.engine.oracle.EngineOracle` on ``cfg.engine``)."""
        if not isinstance(cfg, TrainConfig):
            raise TrainError(f"expected a TrainConfig, got {type(cfg).__name__}")
        cfg.validate()
        if not isinstance(graphs, (list, tuple)) or not all(isinstance(g, DataflowGraph) for g in graphs):
            raise TrainError(f"graphs must be a list of DataflowGraph, got {type(graphs).__name__}"
                             + (f" holding a {type(next(g for g in graphs if not isinstance(g, DataflowGraph))).__name__}"
                                if isinstance(graphs, (list, tuple)) else ""))  # fmt: skip
        if not graphs:
            raise TrainError("give at least one graph")
        prints = [g.fingerprint() for g in graphs]
        twice = next((i for i, fp in enumerate(prints) if fp in prints[:i]), None)
        if twice is not None:
            raise TrainError(f"graphs {prints.index(prints[twice])} and {twice} are the same graph ({graphs[twice].name!r}): "
                             "give each training graph once")  # fmt: skip
        if isinstance(cluster, (str, Path)):  # a preset name or a cluster file, as assign and simulate take
            from doppler.presets import cluster as resolve_cluster

            cluster = resolve_cluster(str(cluster))
        if not isinstance(cluster, Cluster):
            raise TrainError(f"expected a Cluster or a preset name, got {type(cluster).__name__}")
        cfg = dataclasses.replace(cfg, device_identity=cfg.learns_device_identity)  # the checkpoint says which
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(max(1, cfg.torch_threads))
        tune_malloc()  # every update frees and re-allocates the same large tensors: reuse, do not fault them in
        tasks = [make_task(g, cluster, cfg, (oracles or {}).get(i)) for i, g in enumerate(graphs)]
        try:
            policy = build_policy(cfg.method, num_devices=cluster.num_devices, hidden=cfg.hidden, steps=cfg.mp_steps,
                                  mlp_hidden=cfg.mlp_hidden, op_features=cfg.op_features,
                                  list_schedule=cfg.list_schedule,
                                  device_identity=cfg.learns_device_identity).to(cfg.device)  # fmt: skip
        except (RuntimeError, AssertionError) as e:
            raise TrainError(f"device {cfg.device!r} is not usable here ({str(e).splitlines()[0]})") from None
        opt = torch.optim.Adam(policy.parameters(), lr=cfg.il_lr)
        trainer = cls(cfg, tasks, policy, opt, np.random.default_rng(cfg.seed))
        trainer.real_oracles = dict(real_oracles or {})
        return trainer

    # ------------------------------------------------------------------ stage I
    @_reproducible
    def imitation_update(self) -> dict[str, float]:
        cfg = self.cfg
        self._set_lr(cfg.il_lr)
        self.optimizer.zero_grad()
        stats = {"loss_il": 0.0, "agree_sel": 0.0, "agree_plc": 0.0}
        for task in self.tasks:
            enc = self.policy.encode(task.features)
            plc_mask = None
            if task.teacher_devices is None:  # DAgger: the teacher labels the states the policy visits
                ro = rollout(task.features, enc, batch=cfg.il_batch, mode="sample", eps=0.0, rng=self.rng)
                if cfg.teacher == "lookahead":
                    plc_mask = lookahead_mask(task, ro, cfg.lookahead_steps, self.rng)
            else:  # behaviour cloning of the teacher's one trajectory (its labels depend on no state)
                ro = rollout(task.features, enc, batch=1, mode="teacher", order=task.teacher_order,
                             devices_by_step=task.teacher_devices[task.teacher_order])  # fmt: skip
            loss, a_sel, a_plc = imitation_loss(task, ro, enc, plc_mask)
            (loss / len(self.tasks)).backward()
            stats["loss_il"] += float(loss.detach()) / len(self.tasks)
            stats["agree_sel"] += a_sel / len(self.tasks)
            stats["agree_plc"] += a_plc / len(self.tasks)
        self._step()
        self.il_episode += (cfg.il_batch if cfg.teacher in STATE_TEACHERS else 1) * len(self.tasks)
        return stats

    # ------------------------------------------------------------------ stage II
    def rl_update(self) -> dict[str, float]:
        """Stage II: one REINFORCE update on simulated makespans (lr and epsilon decay linearly)."""
        cfg = self.cfg
        frac = min(self.episode / cfg.episodes, 1.0)
        stats = self._reinforce(cfg.lr + (cfg.lr_final - cfg.lr) * frac, cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac)
        before = self.episode
        self.episode += cfg.batch * len(self.tasks)
        if cfg.search_every > 0 and cfg.search_evals > 0 and self.episode // cfg.search_every > before // cfg.search_every:
            with self._phase("search"):
                for i, task in enumerate(self.tasks):
                    self._search_incumbent(task, seed=cfg.seed + 1000 * self.episode + i)
        return stats

    def _search_incumbent(self, task: Task, seed: int) -> None:
        """Expert iteration: simulated annealing for ``search_evals`` evaluations from the incumbent
        (deterministic for a seed); a better result becomes the incumbent the policy imitates."""
        from doppler.methods.anneal import anneal_search

        if task.best_assignment is None:
            return
        found = anneal_search(task.graph, task.cluster, seed=seed, max_evals=self.cfg.search_evals,
                              start=task.best_assignment, threads=1).devices  # one core: torch's threads hold the rest
        self._adopt_best(task, found[None, :], np.asarray(task.oracle.evaluate(found[None, :]), dtype=np.float64))

    def real_update(self) -> dict[str, float]:
        """Stage III: the same update on makespans measured by the engine (constant lr and epsilon)."""
        stats = self._reinforce(self.cfg.real_lr, self.cfg.real_eps)
        self.real_episode += self.cfg.batch * len(self.tasks)
        return stats

    def enter_real_stage(self) -> None:
        """Swap every task's oracle for its engine oracle and re-measure the best assignment so far
        (simulated and measured makespans are not comparable)."""
        from doppler.engine.oracle import EngineOracle

        for i, task in enumerate(self.tasks):
            if i not in self.real_oracles:
                self.real_oracles[i] = EngineOracle(task.graph, task.cluster, engine=self.cfg.engine,
                                                    repeats=self.cfg.engine_repeats, seed=self.cfg.seed,
                                                    device_type=self.cfg.engine_device_type)  # fmt: skip
            if task.oracle is self.real_oracles[i]:
                continue
            task.oracle = self.real_oracles[i]
            task.baseline = None
            if task.best_assignment is not None:
                task.best_makespan_s = float(task.oracle.evaluate(task.best_assignment[None, :])[0])
            self._seed_incumbent(task, self.cfg.real_seed_methods)

    def _seed_incumbent(self, task: Task, methods: tuple[str, ...]) -> None:
        """Evaluate ``methods``' assignments with the task's oracle; a faster one replaces the incumbent
        (replayed along the b-level order, as a non-critical_path teacher is)."""
        from doppler.methods import assign, get_method

        methods = [m for m in methods if task.cluster.num_devices >= get_method(m).min_devices]
        if not methods:
            return
        cands = np.stack([assign(task.graph, task.cluster, m, seed=self.cfg.seed).devices for m in methods])
        self._adopt_best(task, cands, np.asarray(task.oracle.evaluate(cands), dtype=np.float64))

    @staticmethod
    def _adopt_best(task: Task, cands: np.ndarray, makespans_s: np.ndarray) -> None:
        """The fastest candidate replaces the incumbent if it is faster (replayed along the b-level order)."""
        b = int(np.argmin(makespans_s))
        if makespans_s[b] < task.best_makespan_s:
            order = task.blevel_order()
            task.best_makespan_s, task.best_assignment = float(makespans_s[b]), cands[b].copy()
            task.best_order, task.best_step_device = order, cands[b][order]

    @_reproducible
    def _reinforce(self, lr: float, eps: float) -> dict[str, float]:
        """Sample ``batch`` episodes per graph, score them, then ``update_epochs`` gradient steps
        on them (the first is plain REINFORCE; later ones use PPO's clipped per-step ratio)."""
        cfg = self.cfg
        self._set_lr(lr)
        stats = {"loss_pg": 0.0, "entropy_sel": 0.0, "entropy_plc": 0.0, "loss_self": 0.0, "mean_ratio": 0.0,
                 "greedy_ratio": 0.0, "best_ratio": 0.0}  # fmt: skip
        k = len(self.tasks)
        batches = []
        for task in self.tasks:
            with self._phase("encoder"):
                enc = self.policy.encode(task.features)
            with self._phase("rollout"):
                ro = rollout(task.features, enc, batch=cfg.batch, mode="sample", eps=eps, rng=self.rng,
                             greedy_sel=not cfg.sample_sel, plc_ties_only=cfg.plc_ties_only)  # fmt: skip
            with self._phase("oracle"):
                mk = np.asarray(task.oracle.evaluate(ro.assignment), dtype=np.float64)
            cost = mk / task.lower_bound_s
            adv = torch.from_numpy(advantages(cost, task, cfg)).float().to(self.policy.device)
            task.record(ro, mk)
            with self._phase("greedy"):  # the same encoder pass: one cheap greedy decode
                task.greedy_ratio = _greedy_rollout(task, enc, cfg.plc_ties_only)[1] / task.lower_bound_s
                stats["greedy_ratio"] += task.greedy_ratio / k
            stats["mean_ratio"] += float(cost.mean()) / k
            stats["best_ratio"] += task.best_makespan_s / task.lower_bound_s / k
            batches.append([enc, ro, adv, None])
        for epoch in range(cfg.update_epochs):
            self.optimizer.zero_grad()
            for task, item in zip(self.tasks, batches):
                if epoch > 0:
                    with self._phase("encoder"):
                        item[0] = self.policy.encode(task.features)
                parts = self._policy_loss(task, *item)
                item[3] = parts["old_logp"]
                with self._phase("backward"):
                    (parts["loss"] / k).backward()
                if epoch == 0:
                    for key in ("loss_pg", "entropy_sel", "entropy_plc", "loss_self"):
                        stats[key] += float(parts[key]) / k
            with self._phase("optimizer"):
                stats["skipped_steps"] = stats.get("skipped_steps", 0.0) + float(not self._step())
        stats["eps"] = eps
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        return stats

    def _policy_loss(self, task: Task, enc, ro: Rollout, adv: torch.Tensor, old_logp) -> dict[str, Any]:
        """Policy-gradient loss of a scored batch: per-step log-likelihoods weighted by the episode's
        advantage (clipped ratios against ``old_logp`` after the first epoch), minus the entropy
        bonus, plus the self-improvement term."""
        cfg = self.cfg
        with self._phase("rescore"):
            sc = evaluate_actions(enc, ro)
        w_sel, w_plc = enc.head_weights()  # a head that follows a fixed rule is not trained
        sel_on = w_sel if cfg.sample_sel else 0.0  # a greedy SEL is not credited by the policy gradient
        logp = sel_on * sc.logp_sel + w_plc * sc.logp_plc  # [B, n]
        a = adv.unsqueeze(1)
        if old_logp is None:
            loss_pg = -(a * logp).mean()
        else:
            ratio = torch.exp((logp - old_logp).clamp(max=20.0))
            loss_pg = -torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio) * a).mean()
        ent_sel, ent_plc = sc.entropy_sel.mean(), sc.entropy_plc.mean()
        loss = loss_pg - cfg.entropy_coef * (sel_on * ent_sel + w_plc * ent_plc)
        loss_self = torch.zeros(())
        if cfg.self_improve_coef > 0:
            loss_self = _best_nll(task, enc)
            loss = loss + cfg.self_improve_coef * loss_self
        return {"loss": loss, "loss_pg": loss_pg.detach(), "entropy_sel": ent_sel.detach(),
                "entropy_plc": ent_plc.detach(), "loss_self": loss_self.detach(),
                "old_logp": logp.detach() if old_logp is None else old_logp}  # fmt: skip

    # ------------------------------------------------------------------ distillation
    @_reproducible
    def distill_update(self) -> dict[str, float]:
        """One step of imitating each graph's best assignment so far (replayed in teacher mode);
        stops the stage once the greedy decode is as good as that assignment on every graph."""
        self._set_lr(self.cfg.il_lr)
        self.optimizer.zero_grad()
        stats = {"loss_distill": 0.0, "greedy_ratio": 0.0, "best_ratio": 0.0}
        matched = True
        k = len(self.tasks)
        for task in self.tasks:
            enc = self.policy.encode(task.features)
            ro, mk_greedy = _greedy_rollout(task, enc)
            matched &= mk_greedy <= task.best_makespan_s * (1 + 1e-9)
            loss = _best_nll(task, enc)
            if self.cfg.on_policy_weight > 0:
                loss = loss + self.cfg.on_policy_weight * _on_policy_nll(task, enc, ro)
            (loss / k).backward()
            stats["loss_distill"] += float(loss.detach()) / k
            stats["greedy_ratio"] += mk_greedy / task.lower_bound_s / k
            stats["best_ratio"] += task.best_makespan_s / task.lower_bound_s / k
        if self.distill_best is not None and stats["greedy_ratio"] < self.distill_best[0] * (1 - 1e-9):
            self.distill_best = (stats["greedy_ratio"], self._weights())  # the weights that decoded it
        if matched:
            self.distill_step = self.cfg.distill_updates
            return stats
        self._step()
        self.distill_step += 1
        return stats

    def _step(self) -> bool:
        """Clip the gradients and take an optimiser step, unless they are not finite (then the
        step is skipped, so one bad batch cannot turn every weight into NaN). True if taken."""
        if self.grad_sync is not None:
            self.grad_sync(list(self.policy.parameters()))
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad()
            return False
        self.optimizer.step()
        return True

    def _set_lr(self, lr: float) -> None:
        """Set the learning rate (times the architecture's ``lr_scale``, where it has one: GDP's transformer)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * getattr(self.policy, "lr_scale", 1.0)

    def _greedy_score(self) -> float:
        """Mean over tasks of the greedy decode's makespan over the lower bound."""
        return float(np.mean([self.greedy(t)[1] / t.lower_bound_s for t in self.tasks]))

    def _weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def _keep_better(self, kept: tuple[float, dict[str, torch.Tensor]], run_dir: Path | None) -> None:
        """Distillation must not leave the greedy decode worse than the best it reached (a policy that
        cannot tell identical tiles apart may fail to match, and keep imitating until it breaks; one
        that can may pass the incumbent's decode and drift off it): restore those weights if it did.
        Then save: the last checkpoint of distillation holds ``kept``, this one the weights it ends with."""
        score, weights = kept
        if self._greedy_score() > score * (1 + 1e-9):
            self.policy.load_state_dict(weights)
        if run_dir is not None:
            self.save(run_dir)

    # ------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def greedy(self, task: Task) -> tuple[np.ndarray, float]:
        enc = self.policy.encode(task.features)
        ro = rollout(task.features, enc, batch=1, mode="greedy")
        return ro.assignment[0], float(task.oracle.evaluate(ro.assignment)[0])

    # ------------------------------------------------------------------ the run
    def run(self, run_dir: str | Path | None = None, on_progress: ProgressFn | None = None) -> None:
        """Run the configured stages from where the counters stand (a resumed run continues)."""
        cfg = self.cfg
        run_dir = Path(run_dir) if run_dir is not None else None
        if run_dir is not None and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(make_run_dir(run_dir / "tensorboard")))  # (a file in its place: exit 2)
        if "il" in cfg.stages:
            self._loop("il", cfg.il_episodes, lambda: self.il_episode, self.imitation_update, run_dir, on_progress)
        if "sim" in cfg.stages:
            if self.episode == 0 and cfg.sim_seed_methods:  # once, before the first update (resume-exact)
                for task in self.tasks:
                    self._seed_incumbent(task, cfg.sim_seed_methods)
            self._loop("sim", cfg.episodes, lambda: self.episode, self.rl_update, run_dir, on_progress)
            # distillation is done once its best weights are kept (a run resumed after that changes nothing)
            done = self.distill_step >= cfg.distill_updates and self.distill_best is None
            if cfg.distill_updates > 0 and not done and any(t.best_order is not None for t in self.tasks):
                if self.distill_best is None:  # before distillation (a run resumed during it has its own)
                    self.distill_best = (self._greedy_score(), self._weights())
                self._loop("distill", cfg.distill_updates, lambda: self.distill_step, self.distill_update, run_dir,
                           on_progress)  # fmt: skip
                kept, self.distill_best = self.distill_best, None
                self._keep_better(kept, run_dir)
        if "real" in cfg.stages:
            self.enter_real_stage()
            self._loop("real", cfg.real_episodes, lambda: self.real_episode, self.real_update, run_dir, on_progress)
        if self.writer is not None:
            self.writer.flush()

    def _loop(self, stage, total, counter, update, run_dir, on_progress) -> None:
        next_ckpt = (counter() // self.cfg.checkpoint_every + 1) * self.cfg.checkpoint_every
        t0, start = time.perf_counter(), counter()
        while counter() < total:
            stats = update()
            ep = counter()
            stats.update(stage=stage, episode=ep, total=total,
                         episodes_per_s=(ep - start) / max(time.perf_counter() - t0, 1e-9))  # fmt: skip
            if stage != "il":
                stats["best_makespan_s"] = min(t.best_makespan_s for t in self.tasks)
            self._log(stage, stats)
            if on_progress is not None:
                on_progress(ProgressEvent(stage, ep, total, "episodes", stats))
            if run_dir is not None and (ep >= next_ckpt or ep >= total):
                self.save(run_dir)
                next_ckpt = (ep // self.cfg.checkpoint_every + 1) * self.cfg.checkpoint_every

    def _log(self, stage: str, stats: dict[str, Any]) -> None:
        row = {"stage_il": float(stage == "il"), "stage_distill": float(stage == "distill"),
               "stage_real": float(stage == "real"),
               **{k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}}  # fmt: skip
        self.history.append(row)
        if self.writer is None:
            return
        step = int(stats["episode"])
        for k, v in stats.items():
            if isinstance(v, (int, float)) and k not in ("episode", "total"):
                group = "losses" if k.startswith(("loss", "entropy")) else "charts"
                self.writer.add_scalar(f"{group}/{stage}_{k}", float(v), step)

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly (loadable with ``weights_only=True``)."""
        st = {
            "format": CHECKPOINT_FORMAT,
            "policy_config": dict(self.policy.config),
            "state_dict": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": json.dumps(self.rng.bit_generator.state),
            "config": json.dumps(config_to_json(self.cfg)),
            "il_episode": self.il_episode,
            "episode": self.episode,
            "real_episode": self.real_episode,
            "distill_step": self.distill_step,
            "history": json.dumps(self.history),
            "cluster": json.dumps(self.tasks[0].cluster.to_json()),
            "graphs": [
                {
                    "name": t.graph.name,
                    "fingerprint": t.graph.fingerprint(),
                    "num_ops": t.graph.num_ops,
                    "baseline": t.baseline,
                    "oracle_calls": getattr(t.oracle, "calls", 0),
                    "best_makespan_s": t.best_makespan_s if math.isfinite(t.best_makespan_s) else None,
                    "best": None if t.best_order is None else
                    [t.best_order.tolist(), t.best_step_device.tolist(), t.best_assignment.tolist()],
                }
                for t in self.tasks
            ],
        }  # fmt: skip
        if self.distill_best is not None:  # during distillation: the best greedy decode so far and its weights
            st["distill_best"] = {"score": self.distill_best[0], "state_dict": self.distill_best[1]}
        return st

    def save(self, run_dir: str | Path) -> None:
        """Write ``checkpoint.pt``, ``config.json`` and ``best_assignment.json`` atomically."""
        run_dir = Path(run_dir)
        write_checkpoint(run_dir, self.state(), config_to_json(self.cfg))
        task = self.tasks[0]
        if task.best_assignment is not None:
            from doppler.assignment import Assignment

            a = Assignment(devices=task.best_assignment, method=self.cfg.method, graph_fingerprint=task.graph.fingerprint())
            a.save(run_dir / "best_assignment.json")

    @classmethod
    def resume(cls, run_dir: str | Path, graphs: list[DataflowGraph], cluster: Cluster,
               episodes: int | None = None) -> "Trainer":  # fmt: skip
        """Continue the run saved in ``run_dir`` exactly, on the same graphs and cluster; ``episodes``
        may extend Stage II (everything else is the run's own configuration)."""
        from doppler.policy.architectures import read_checkpoint
        from doppler.policy.checkpoint import require_training_state

        ckpt = Path(run_dir) / "checkpoint.pt"
        if not ckpt.is_file():
            raise TrainError(f"{ckpt}: no checkpoint to resume from")
        ck = read_checkpoint(ckpt)
        require_training_state(ck, ckpt)
        if "pretrain" in ck:
            raise TrainError(f"{run_dir}: a pretraining run (made by `doppler pretrain`, not `doppler train`): continue "
                             "it with `doppler pretrain -o DIR --resume`, or fine-tune it with `train --init DIR`")  # fmt: skip
        saved = saved_config(ck, ckpt)
        if episodes is not None:
            saved.episodes = episodes
        trained_on = json.loads(ck["cluster"])
        if trained_on != cluster.to_json():
            raise TrainError(f"{ckpt}: trained on cluster {trained_on.get('name')!r}, not {cluster.name!r}")
        trainer = cls.create(graphs, cluster, saved)
        with loading_state(ckpt):
            trainer.load_state(ck)
        if trainer.episode < saved.episodes:  # Stage II is extended: distil its new best again afterwards
            trainer.distill_step, trainer.distill_best = 0, None
        return trainer

    def load_state(self, ck: dict[str, Any]) -> None:
        """Continue from a checkpoint of the same graphs (see :meth:`state`)."""
        if len(ck["graphs"]) != len(self.tasks) or not all(
            t.graph.matches_fingerprint(g["fingerprint"]) for g, t in zip(ck["graphs"], self.tasks)
        ):
            raise TrainError("the checkpoint was trained on other graphs (fingerprints differ)")
        self.policy.load_state_dict(ck["state_dict"])
        load_optimizer_state(self.optimizer, ck["optimizer"])
        torch.set_rng_state(ck["torch_rng"])
        self.rng.bit_generator.state = json.loads(ck["numpy_rng"])
        self.il_episode, self.episode = int(ck["il_episode"]), int(ck["episode"])
        self.distill_step = int(ck["distill_step"])
        best = ck.get("distill_best")  # saved during distillation
        self.distill_best = None if best is None else (float(best["score"]), best["state_dict"])
        self.real_episode = int(ck.get("real_episode", 0))
        self.history = history_from_json(ck["history"], stages=True)
        for t, g in zip(self.tasks, ck["graphs"]):
            t.baseline = None if g["baseline"] is None else _finite(g["baseline"], "baseline")
            if hasattr(t.oracle, "calls"):
                t.oracle.calls = int(g["oracle_calls"])
            if g["best"] is not None:
                t.best_makespan_s = _finite(g["best_makespan_s"], "best_makespan_s")
                t.best_order, t.best_step_device, t.best_assignment = _replayable_best(g["best"], t)


def config_to_json(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["stages"] = list(cfg.stages)
    d["real_seed_methods"] = list(cfg.real_seed_methods)
    d["sim_seed_methods"] = list(cfg.sim_seed_methods)
    return d


def config_from_json(obj: dict[str, Any]) -> TrainConfig:
    """The configuration :func:`config_to_json` wrote (a checkpoint's ``config``); values of the wrong type are
    kept as they are, for :meth:`TrainConfig.validate` to name."""
    if not isinstance(obj, dict):
        raise TrainError(f"a training configuration must be a JSON object, got {type(obj).__name__}")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    kw = {k: v for k, v in obj.items() if k in names}
    for key in ("stages", "real_seed_methods", "sim_seed_methods"):
        value = kw.get(key, getattr(TrainConfig, key))
        kw[key] = tuple(value) if isinstance(value, list) else value
    kw.setdefault("device_identity", False)  # a run saved before the option existed had none
    return TrainConfig(**kw)


def saved_config(ck: dict[str, Any], path: str | Path) -> TrainConfig:
    """The training configuration a checkpoint holds, validated: it was valid when saved, so a refusal means a
    damaged file, and says so naming it (not as the command-line option it would be)."""
    cfg = config_from_json(json.loads(ck["config"]))
    try:
        cfg.validate()
    except TrainError as e:
        raise TrainError(f"{path}: a damaged checkpoint: its configuration does not hold ({e})") from None
    return cfg


def _finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} is {value!r}, not a finite number")
    return float(value)


#: what a row of :attr:`Trainer.history` holds besides its stage flags, by stage (the training curve draws them)
HISTORY_ROW_KEYS = {"il": ("episode", "agree_sel", "agree_plc"), "sim": ("episode", "mean_ratio", "best_ratio"),
                    "distill": ("greedy_ratio",), "real": ("episode", "mean_ratio")}  # fmt: skip


def history_from_json(text: str, *, stages: bool = False) -> list[dict[str, float]]:
    """A checkpoint's ``history``: rows of named numbers; with ``stages`` (a training run's, which the training
    curve draws), each holding the numbers of its stage (:data:`HISTORY_ROW_KEYS`). ValueError if not."""
    rows = json.loads(text)
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in r.values())
        for r in rows
    ):
        raise ValueError("history is not a list of rows of numbers")
    for i, row in enumerate(rows if stages else ()):
        stage = next((s for s in ("il", "distill", "real") if row.get(f"stage_{s}")), "sim")
        missing = [k for k in HISTORY_ROW_KEYS[stage] if k not in row]
        if missing:
            raise ValueError(f"history row {i} (stage {stage}) has no {', '.join(missing)}")
    return rows


def _replayable_best(best: Any, task: Task) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A checkpoint's best ``[op order, device per step, device per op]`` of ``task``, checked as the rollout
    replays it (each op once, after the ops it reads; devices of the cluster; the two device lists agreeing):
    ValueError naming what is wrong."""
    order, step_device, assignment = (np.asarray(x, dtype=np.int64) for x in best)
    n = task.graph.num_ops
    if any(a.shape != (n,) for a in (order, step_device, assignment)):
        raise ValueError(f"best holds lists of {[a.shape for a in (order, step_device, assignment)]} entries, not {n}")
    if not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError("the best op order does not hold each op once")
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    if np.any(position[task.graph.src] >= position[task.graph.dst]):
        raise ValueError("the best op order puts an op before an op it reads")
    if assignment.min() < 0 or assignment.max() >= task.cluster.num_devices:
        raise ValueError(f"the best assignment names a device outside 0..{task.cluster.num_devices - 1}")
    if not np.array_equal(step_device, assignment[order]):
        raise ValueError("the best devices per step are not the best assignment's")
    return order, step_device, assignment


def _like(value: Any, own: Any) -> bool:
    """Whether a loaded optimizer setting is of the kind of the optimizer's own (a finite number, a flag, ...)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    if number(own):
        return number(value) and math.isfinite(value)
    if isinstance(own, (tuple, list)):
        return isinstance(value, (tuple, list)) and len(value) == len(own) and all(map(_like, value, own))
    return type(value) is type(own)


def load_optimizer_state(optimizer: torch.optim.Adam, state: dict[str, Any]) -> None:
    """A checkpoint's Adam state into ``optimizer``, checked as its next step will use it: each group's settings
    of the kind of the optimizer's own, each parameter's state the step count and the moments of its shape.
    torch checks only that the groups hold as many parameters, so any of those was an error in the next step."""
    own = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, settings in zip(optimizer.param_groups, own):
        bad = next((k for k, v in settings.items() if not _like(group.get(k), v)), None)
        if bad is not None:
            raise ValueError(f"the optimizer's {bad} is {group.get(bad)!r}, not like {settings[bad]!r}")
        moments = {"exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if group["amsgrad"] else set())
        for param in group["params"]:
            st = optimizer.state.get(param)
            if not st:  # (a parameter that has not stepped yet)
                continue
            if set(st) != moments | {"step"}:
                raise ValueError(f"the optimizer's state of a parameter holds {sorted(st)}, not "
                                 f"{sorted(moments | {'step'})}")  # fmt: skip
            for name, value in st.items():
                shape = torch.Size([]) if name == "step" else param.shape
                if not (torch.is_tensor(value) and value.is_floating_point() and value.shape == shape):
                    raise ValueError(f"the optimizer's {name} is {_tensor_kind(value)} for a parameter of shape "
                                     f"{list(param.shape)}")  # fmt: skip


def _tensor_kind(value: Any) -> str:
    return f"a {value.dtype} tensor of shape {list(value.shape)}" if torch.is_tensor(value) else repr(value)[:40]


@contextlib.contextmanager
def loading_state(path: str | Path) -> Iterator[None]:
    """A checkpoint's training state (optimizer, generators, counters, per-graph records) going into a trainer:
    what does not fit, being damaged, is a TrainError naming the file, not torch's or numpy's own error."""
    try:
        yield
    except (AttributeError, IndexError, KeyError, OverflowError, RuntimeError, TypeError, ValueError) as e:
        text = str(e).splitlines()[0][:120] if str(e) else "no message"
        raise TrainError(f"{path}: a damaged checkpoint: its training state does not load ({type(e).__name__}: "
                         f"{text})") from None  # fmt: skip


def train_and_assign(graph: DataflowGraph, cl: Cluster, run_dir: Path, cfg: TrainConfig,
                     on_progress: ProgressFn | None = None) -> dict[str, Any]:
    """Train DOPPLER on one graph into ``run_dir``, decode greedily, draw the training curve.

    Returns ``assignment``, ``train_s``, ``assign_time_s`` and ``training_curve`` (the demo's DOPPLER row)."""
    from doppler.methods import assign
    from doppler.report import training_curve

    t0 = time.perf_counter()
    trainer = Trainer.create([graph], cl, cfg)
    trainer.run(run_dir, on_progress)
    train_s = time.perf_counter() - t0
    a = assign(graph, cl, cfg.method, checkpoint=run_dir / "checkpoint.pt")
    curve = run_dir / "training_curve.png"
    training_curve(trainer.history, curve, title=f"DOPPLER on {graph.name} ({graph.num_ops} ops), {cl.name}")
    return {"assignment": a, "train_s": train_s, "assign_time_s": a.assign_time_s, "training_curve": curve}
