"""The trainer: DOPPLER's Stage I (imitation of a teacher), Stage II (REINFORCE in the simulator), a
last distillation of the best assignment found into the greedy decode, and Stage III (the Stage II
loop on measured makespans).

Read top to bottom, CleanRL-style: set-up (seeding, tasks, policy and optimiser), Stage I, Stage II
with its incumbents (warm starts, local search), distillation, the run loop, logging, checkpoints.
Every hyper-parameter lives in :class:`~doppler.train.config.TrainConfig`; the losses are in
:mod:`doppler.train.losses`.

One update processes, for every training graph, ``batch`` episodes that share one encoder pass: a
compiled rollout records the actions (:func:`~doppler.policy.rollout.rollout`), the oracle scores
the B assignments in one call, and :func:`~doppler.policy.rollout.evaluate_actions` re-scores all
decisions in one differentiable pass. Rewards are ``-(makespan / lower bound)`` so several graphs
(and clusters of other sizes) can share one policy.

Pretraining (:mod:`doppler.train.pretrain`) drives the same trainer through its public methods:
:meth:`Trainer.use_pairs`, :meth:`Trainer.imitation_update`, :meth:`Trainer.seed_incumbent`,
:meth:`Trainer.search_incumbent`, :meth:`Trainer.sim_update` and :meth:`Trainer.load_weights`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import random
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.util.io import make_run_dir, refuse_links
from doppler.util.malloc_tuning import tune_malloc
from doppler.policy.architectures import build_policy
from doppler.policy.base import BasePolicy
from doppler.policy.checkpoint import CHECKPOINT_FORMAT, RUN_DIR_MEMBERS, weight_fault, write_checkpoint
from doppler.policy.rollout import rollout
from doppler.hardware.presets import cluster as resolve_cluster
from doppler.util.progress import ProgressEvent, ProgressFn
from doppler.train.config import (RULE_TEACHER, TrainConfig, TrainError, TrainingDiverged, check_config_file,
                                  config_to_json, saved_config)  # fmt: skip
from doppler.train.losses import advantages, best_nll, imitation_loss, on_policy_nll, policy_gradient_loss
from doppler.train.state import (check_counters, check_numpy_rng, check_torch_rng, check_weights, count, finite,
                                 history_from_json, load_optimizer_state, loading_state, replayable_best)  # fmt: skip
from doppler.train.tasks import CostOracle, Task, greedy_rollout, make_task


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


# ============================================================================ the trainer


@dataclass
class Trainer:
    """A training run: tasks, policy, optimiser, RNGs and counters (everything a checkpoint holds)."""

    cfg: TrainConfig
    tasks: list[Task]
    policy: BasePolicy  # doppler.policy.architectures.build_policy(cfg.method, ...)
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator
    il_episode: int = 0
    episode: int = 0
    real_episode: int = 0  # Stage III episodes done
    distill_step: int = 0  # distillation updates done (set to distill_updates once greedy matches the best)
    distill_best: tuple[float, dict] | None = None  # during distillation: the best greedy score and its weights
    history: list[dict[str, float]] = field(default_factory=list)
    writer: Any = None  # TensorBoard's SummaryWriter, made at the first number logged (open_writer)
    tensorboard_dir: Path | None = None  # where it logs (open_writer)
    phase_s: dict[str, float] = field(default_factory=dict)  # wall time per phase of Stage II updates
    real_oracles: dict[int, CostOracle] = field(default_factory=dict)  # Stage III oracles per task (engine-backed)
    identity_left_out: int | None = None  # `--init`: the device count of the checkpoint's learned device identity,
    # left out because it was learned on another cluster (not saved: it describes how this run started)
    grad_sync: Callable[[list[torch.nn.Parameter]], None] | None = None  # pretraining workers: averages the
    # gradients across processes before each step (doppler.train.pretrain_parallel.GradSync.average)

    @contextlib.contextmanager
    def _phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        self.phase_s[name] = self.phase_s.get(name, 0.0) + time.perf_counter() - t0

    @classmethod
    def create(
        cls, graphs: list[DataflowGraph], cluster: Cluster | str | Path, cfg: TrainConfig, oracles=None, real_oracles=None
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
        cluster = resolve_cluster(cluster)  # a Cluster, or a preset name or a cluster file as assign and simulate take
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

    def use_pairs(self, pairs: list[tuple[DataflowGraph, Cluster]]) -> None:
        """Make ``pairs`` the run's tasks (pretraining draws fresh ones every update)."""
        self.tasks = [make_task(g, c, self.cfg) for g, c in pairs]

    # ------------------------------------------------------------------ stage I
    @_reproducible
    def imitation_update(self) -> dict[str, float]:
        """Stage I: one step of imitating the teacher on every task: the rule's labels on the states the
        policy visits (DAgger), or another method's one trajectory (behaviour cloning)."""
        cfg = self.cfg
        self._set_lr(cfg.il_lr)
        self.optimizer.zero_grad()
        stats = {"loss_il": 0.0, "agree_sel": 0.0, "agree_plc": 0.0}
        for task in self.tasks:
            enc = self.policy.encode(task.features)
            if task.teacher_devices is None:  # DAgger: the rule labels the states the policy visits
                ro = rollout(task.features, enc, batch=cfg.il_batch, mode="sample", eps=0.0, rng=self.rng,
                             memory_budget_bytes=task.memory_budget_bytes)  # fmt: skip
            else:  # behaviour cloning of the teacher's one trajectory (its labels depend on no state)
                ro = rollout(task.features, enc, batch=1, mode="teacher", order=task.teacher_order,
                             devices_by_step=task.teacher_devices[task.teacher_order])  # fmt: skip
            loss, a_sel, a_plc = imitation_loss(task, ro, enc)
            (loss / len(self.tasks)).backward()
            for key, value in zip(stats, (float(loss.detach()), a_sel, a_plc)):
                stats[key] += value / len(self.tasks)
        self._step()
        self.il_episode += (cfg.il_batch if cfg.teacher == RULE_TEACHER else 1) * len(self.tasks)
        return stats

    # ------------------------------------------------------------------ stage II
    def rl_update(self) -> dict[str, float]:
        """Stage II: one REINFORCE update on simulated makespans (lr and epsilon decay linearly), and every
        ``search_every`` episodes a local search from each incumbent."""
        cfg = self.cfg
        frac = min(self.episode / cfg.episodes, 1.0)
        before = self.episode
        stats = self.sim_update(cfg.lr + (cfg.lr_final - cfg.lr) * frac, cfg.eps_start + (cfg.eps_end - cfg.eps_start) * frac)
        if cfg.search_every > 0 and cfg.search_evals > 0 and self.episode // cfg.search_every > before // cfg.search_every:
            with self._phase("search"):
                for i, task in enumerate(self.tasks):
                    self.search_incumbent(task, seed=cfg.seed + 1000 * self.episode + i)
        return stats

    def sim_update(self, lr: float, eps: float) -> dict[str, float]:
        """One REINFORCE update of ``batch`` episodes per task at learning rate ``lr`` and exploration ``eps``,
        counted as Stage II episodes."""
        stats = self._reinforce(lr, eps)
        self.episode += self.cfg.batch * len(self.tasks)
        return stats

    def search_incumbent(self, task: Task, seed: int) -> None:
        """Expert iteration: simulated annealing for ``search_evals`` evaluations from the incumbent
        (deterministic for a seed); a better result becomes the incumbent the policy imitates."""
        from doppler.methods.anneal import AnnealOptions, anneal_search

        if task.best_assignment is None:
            return
        # (one core: torch's threads hold the rest)
        options = AnnealOptions(max_evals=self.cfg.search_evals, start=task.best_assignment, threads=1)
        found = anneal_search(task.graph, task.cluster, options, seed=seed,
                              memory_budget_bytes=task.memory_budget_bytes).devices  # fmt: skip
        task.adopt_best(found[None, :], np.asarray(task.oracle.evaluate(found[None, :]), dtype=np.float64))

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
                self.real_oracles[i] = EngineOracle(task.graph, task.cluster, engine=self.cfg.engine, repeats=1,
                                                    seed=self.cfg.seed, device_type=self.cfg.engine_device_type)  # fmt: skip
            if task.oracle is self.real_oracles[i]:
                continue
            task.oracle = self.real_oracles[i]
            task.baseline = None
            if task.best_assignment is not None:
                task.best_makespan_s = float(task.oracle.evaluate(task.best_assignment[None, :])[0])
            self.seed_incumbent(task, self.cfg.real_seed_methods)

    def seed_incumbent(self, task: Task, methods: tuple[str, ...]) -> None:
        """Evaluate ``methods``' assignments with the task's oracle; a faster one replaces the incumbent
        (replayed along the b-level order, as a teacher other than the rule is)."""
        from doppler.methods import assign, get_method

        methods = [m for m in methods if task.cluster.num_devices >= get_method(m).min_devices]
        if not methods:
            return
        cands = np.stack([assign(task.graph, task.cluster, m, seed=self.cfg.seed, ignore_memory=True).devices
                          for m in methods])  # fmt: skip
        task.adopt_best(cands, np.asarray(task.oracle.evaluate(cands), dtype=np.float64))

    @_reproducible
    def _reinforce(self, lr: float, eps: float) -> dict[str, float]:
        """Sample ``batch`` episodes per graph, score them, then one gradient step on
        :func:`~doppler.train.losses.policy_gradient_loss`."""
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
                             plc_ties_only=cfg.plc_ties_only, memory_budget_bytes=task.memory_budget_bytes)  # fmt: skip
            with self._phase("oracle"):
                mk = np.asarray(task.oracle.evaluate(ro.assignment), dtype=np.float64)
            cost = mk / task.lower_bound_s
            adv = torch.from_numpy(advantages(cost, task, cfg)).float().to(self.policy.device)
            task.record(ro, mk)
            with self._phase("greedy"):  # the same encoder pass: one cheap greedy decode
                task.greedy_ratio = greedy_rollout(task, enc, cfg.plc_ties_only)[1] / task.lower_bound_s
                stats["greedy_ratio"] += task.greedy_ratio / k
            stats["mean_ratio"] += float(cost.mean()) / k
            stats["best_ratio"] += task.best_makespan_s / task.lower_bound_s / k
            batches.append((enc, ro, adv))
        self.optimizer.zero_grad()
        for task, (enc, ro, adv) in zip(self.tasks, batches):
            with self._phase("loss"):
                parts = policy_gradient_loss(task, enc, ro, adv, cfg)
            with self._phase("backward"):
                (parts["loss"] / k).backward()
            for key in ("loss_pg", "entropy_sel", "entropy_plc", "loss_self"):
                stats[key] += float(parts[key]) / k
        with self._phase("optimizer"):
            stats["skipped_steps"] = float(not self._step())
        stats["eps"] = eps
        stats["lr"] = self.optimizer.param_groups[0]["lr"]
        return stats

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
            ro, mk_greedy = greedy_rollout(task, enc)
            matched &= mk_greedy <= task.best_makespan_s * (1 + 1e-9)
            loss = best_nll(task, enc)
            if self.cfg.on_policy_weight > 0:
                loss = loss + self.cfg.on_policy_weight * on_policy_nll(task, enc, ro)
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
        fault = weight_fault(self.policy.state_dict())
        if fault is not None:
            raise TrainingDiverged(f"training diverged in the update after {self.il_episode} Stage I and {self.episode} "
                                   f"Stage II episodes: {fault}")  # fmt: skip
        return True

    def _set_lr(self, lr: float) -> None:
        """Set the learning rate (times the architecture's ``lr_scale``: GDP's transformer needs a lower one)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * self.policy.lr_scale

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
        ro = rollout(task.features, enc, batch=1, mode="greedy", memory_budget_bytes=task.memory_budget_bytes)
        return ro.assignment[0], float(task.oracle.evaluate(ro.assignment)[0])

    # ------------------------------------------------------------------ the run
    def run(self, run_dir: str | Path | None = None, on_progress: ProgressFn | None = None) -> None:
        """Run the configured stages from where the counters stand (a resumed run continues)."""
        cfg = self.cfg
        cfg.check_lengths()
        run_dir = Path(run_dir) if run_dir is not None else None
        if run_dir is not None:
            self.open_writer(run_dir)
        if "il" in cfg.stages:
            self._loop("il", cfg.il_episodes, lambda: self.il_episode, self.imitation_update, run_dir, on_progress)
        if "sim" in cfg.stages:
            if self.episode == 0 and cfg.sim_seed_methods:  # once, before the first update (resume-exact)
                for task in self.tasks:
                    self.seed_incumbent(task, cfg.sim_seed_methods)
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

    def open_writer(self, run_dir: Path) -> None:
        """Log to TensorBoard in ``run_dir/tensorboard``. First (once) the run directory is made, and refused (exit 2)
        if it or a name the run writes in it (:data:`RUN_DIR_MEMBERS`) is a symbolic link, or a file is in the way;
        the event file is made at the first number logged (:meth:`add_scalars`), so that a run that stops in its
        first update (it diverged: a damaged state) leaves the run directory as it was. The event file's name ends
        in a random part: no link can be planted at it beforehand."""
        if self.tensorboard_dir is None:
            refuse_links(make_run_dir(run_dir), RUN_DIR_MEMBERS)
            self.tensorboard_dir = make_run_dir(run_dir / "tensorboard")

    def _log(self, stage: str, stats: dict[str, Any]) -> None:
        row = {"stage_il": float(stage == "il"), "stage_distill": float(stage == "distill"),
               "stage_real": float(stage == "real"),
               **{k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}}  # fmt: skip
        self.history.append(row)
        self.add_scalars(stage, stats, int(stats["episode"]), ("episode", "total"))

    def add_scalars(self, prefix: str, stats: dict[str, Any], step: int, skip: tuple[str, ...]) -> None:
        """The numbers of ``stats`` but ``skip`` to TensorBoard (if open), as ``losses/{prefix}_{name}`` (losses,
        entropies) and ``charts/{prefix}_{name}``."""
        if self.writer is None and self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.tensorboard_dir), filename_suffix=f".{secrets.token_hex(8)}")
        for k, v in stats.items():
            if self.writer is not None and isinstance(v, (int, float)) and k not in skip:
                group = "losses" if k.startswith(("loss", "entropy")) else "charts"
                self.writer.add_scalar(f"{group}/{prefix}_{k}", float(v), step)

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
            from doppler.ir.assignment import Assignment, save_assignment

            a = Assignment(devices=task.best_assignment, method=self.cfg.method, graph_fingerprint=task.graph.fingerprint())
            save_assignment(a, run_dir / "best_assignment.json")

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
        try:
            saved.check_lengths()
        except TrainError as e:
            raise TrainError(f"{ckpt}: a damaged checkpoint: its configuration does not hold ({e})") from None
        check_config_file(run_dir, saved)
        trained_on = json.loads(ck["cluster"])
        if trained_on != cluster.to_json():
            raise TrainError(f"{ckpt}: trained on cluster {trained_on.get('name')!r}, not {cluster.name!r}")
        with loading_state(ckpt):
            check_counters(ck, saved, len(ck["graphs"]))
        if episodes is not None and episodes < ck["episode"]:
            raise TrainError(f"--episodes {episodes}: the run in {run_dir} has already done {ck['episode']} Stage II "
                             "episodes (--resume can only extend it)")  # fmt: skip
        run_cfg = saved if episodes is None else dataclasses.replace(saved, episodes=episodes)
        run_cfg.check_lengths()
        trainer = cls.create(graphs, cluster, run_cfg)
        with loading_state(ckpt):
            trainer.load_state(ck)
        if trainer.episode < run_cfg.episodes:  # Stage II is extended: distil its new best again afterwards
            trainer.distill_step, trainer.distill_best = 0, None
        return trainer

    def load_weights(self, ck: dict[str, Any]) -> None:
        """A checkpoint's policy weights, optimizer state and Stage I/II episode counters, each checked
        (:func:`~doppler.train.state.check_weights`, :func:`~doppler.train.state.load_optimizer_state`)."""
        self.policy.load_state_dict(check_weights(ck["state_dict"], self.policy, "state_dict"))
        load_optimizer_state(self.optimizer, ck["optimizer"])
        self.il_episode, self.episode = count(ck["il_episode"], "il_episode"), count(ck["episode"], "episode")

    def load_state(self, ck: dict[str, Any]) -> None:
        """Continue from a checkpoint of the same graphs (see :meth:`state`)."""
        if len(ck["graphs"]) != len(self.tasks) or not all(
            t.graph.matches_fingerprint(g["fingerprint"]) for g, t in zip(ck["graphs"], self.tasks)
        ):
            raise TrainError("the checkpoint was trained on other graphs (fingerprints differ)")
        self.load_weights(ck)
        torch.set_rng_state(check_torch_rng(ck["torch_rng"]))
        self.rng.bit_generator.state = check_numpy_rng(json.loads(ck["numpy_rng"]), "numpy_rng")
        self.distill_step = count(ck["distill_step"], "distill_step")
        best = ck.get("distill_best")  # saved during distillation
        self.distill_best = None if best is None else (
            finite(best["score"], "distill_best score", positive=True),
            check_weights(best["state_dict"], self.policy, "distill_best"))  # fmt: skip
        self.real_episode = count(ck.get("real_episode", 0), "real_episode")
        self.history = history_from_json(ck["history"], stages=True)
        for i, (t, g) in enumerate(zip(self.tasks, ck["graphs"])):
            t.baseline = None if g["baseline"] is None else finite(g["baseline"], f"graphs[{i}] baseline", positive=True)
            if hasattr(t.oracle, "calls"):
                t.oracle.calls = count(g["oracle_calls"], f"graphs[{i}] oracle_calls")
            if g["best"] is not None:
                t.best_makespan_s = finite(g["best_makespan_s"], f"graphs[{i}] best_makespan_s", positive=True)
                t.best_order, t.best_step_device, t.best_assignment = replayable_best(g["best"], t)


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
    a = assign(graph, cl, cfg.method, checkpoint=run_dir / "checkpoint.pt", ignore_memory=True)
    curve = run_dir / "training_curve.png"
    training_curve(trainer.history, curve, title=f"DOPPLER on {graph.name} ({graph.num_ops} ops), {cl.name}")
    return {"assignment": a, "train_s": train_s, "assign_time_s": a.assign_time_s, "training_curve": curve}
