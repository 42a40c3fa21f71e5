"""Pretraining one transferable policy on the corpus (:mod:`doppler.workloads.corpus`).

Pretraining is the Stage I / Stage II loop of :mod:`doppler.train` with one change: every
update draws a **fresh (graph, cluster) pair** (or ``pairs_per_update`` of them, their gradients
averaged) and makes it the trainer's only task, so the policy never sees one instance twice. Per
update:

1. Stage I (the first ``il_episodes``; by default the whole budget): imitate the list-schedule
   rule on the states the policy visits (DAgger), which gives the floor "as good as its
   teacher". The default list schedule is HEFT's (``list_schedule="heft"``: ops fill idle gaps,
   earliest finish, as the work-conserving engine does), not CRITICAL PATH's (append, earliest
   start).
2. Stage II (after, only if ``il_episodes`` is set below the budget): the incumbent of the pair is the best of the cheap methods
   (``critical_path``, ``heft``, ``metis``, ``enumerative``, ``round_robin_block``),
   improved by ``search_evals`` evaluations of simulated annealing (expert iteration); then
   one REINFORCE update on ``batch`` sampled episodes (leave-one-out baseline) plus the
   log-likelihood of the incumbent (or of a better sample). The policy learns to decode, in one
   greedy pass, what search finds on pairs it has never seen.

3. From a pretrained policy (``doppler pretrain --init``, :meth:`Pretrainer.from_init`): Stage II
   only, in the action space of zero-shot decoding (:data:`FROM_INIT`: the device head breaks only
   the ties of HEFT's rule), with neither search nor self-imitation. The shipped policy is such a
   run's final checkpoint (its model card says which and why).

The policy reads only position-free op features (``op_features="structural"``), so that nothing
it learns names a position inside one graph. Stage II's learning rate decays linearly over the
wall-clock budget; Stage I's is constant. Checkpoints (every ``checkpoint_every_s`` seconds and at
the end) hold the corpus generator's state, so ``--resume`` continues the same stream of pairs.

What each of these choices measured is in docs/research/generalization_log.md.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from doppler.workloads.corpus import TRAIN_DEVICES, TRAIN_FAMILIES, TRAIN_OPS, sample_pair
from doppler.util.io import file_sha256
from doppler.policy.architectures import read_checkpoint
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, PRETRAINED_DIR, require_training_state, write_checkpoint
from doppler.util.progress import ProgressEvent, ProgressFn
from doppler.train.config import (TrainConfig, TrainError, check_config_file, config_to_json, pretrain_config,
                                  saved_config)  # fmt: skip
from doppler.train.state import (check_numpy_rng, check_torch_rng, count, finite, history_from_json,
                                 loading_state)  # fmt: skip
from doppler.train.trainer import Trainer

__all__ = ["MAX_BUDGET_H", "PRETRAINED_CHECKPOINT", "PRETRAINED_DIR", "Pretrainer", "pretrain_config"]

#: the longest training time of a pretraining run (``--budget-h``, and a resumed run's own budget), in hours: the
#: shipped policy trained for half an hour
MAX_BUDGET_H = 1000.0


#: Stage II from a pretrained policy (``doppler pretrain --init``): REINFORCE on fresh pairs where the
#: device head only breaks the ties of the list schedule's rule, as zero-shot decoding does; no search
#: and no self-imitation (their incumbents are other devices than the rule's); the greedy decode's
#: progress is reported against HEFT's makespan
FROM_INIT: dict[str, Any] = dict(il_episodes=1, search_evals=0, self_improve_coef=0.0, sim_seed_methods=("heft",),
                                 plc_ties_only=True)  # fmt: skip


@dataclass
class Pretrainer:
    """A pretraining run: a :class:`Trainer` whose tasks are redrawn every update."""

    trainer: Trainer
    budget_s: float
    corpus_rng: np.random.Generator
    elapsed_s: float = 0.0  # training time so far (summed over resumed sessions)
    updates: int = 0
    checkpoint_every_s: float = 180.0
    history: list[dict[str, float]] = field(default_factory=list)
    init: dict[str, Any] | None = None  # the checkpoint a ``--init`` run started from
    rank: int = 0  # with ``--workers N``: this process's place among them (0 checkpoints and reports)
    sync: Any = None  # with ``--workers N``: their :class:`doppler.train.pretrain_parallel.GradSync`
    saved_workers: int = 1  # resumed: the worker count the checkpoint was written with

    @classmethod
    def create(cls, cfg: TrainConfig, budget_s: float, checkpoint_every_s: float = 180.0,
               rank: int = 0) -> "Pretrainer":  # fmt: skip
        """A new run. Worker ``rank`` > 0 of ``--workers`` draws its own streams of pairs and of rollouts
        (rank 0's are those of a run without workers)."""
        if not 0 < budget_s <= MAX_BUDGET_H * 3600:
            raise TrainError(f"--budget-h must be in (0, {MAX_BUDGET_H:g}] hours, got {budget_s / 3600:g}")
        cfg.validate()  # before the corpus stream is seeded from it
        corpus_rng, rollout_rng = _streams(cfg.seed, rank)
        g, c = sample_pair(corpus_rng)
        tr = Trainer.create([g], c, cfg)
        if rollout_rng is not None:
            tr.rng = rollout_rng
        return cls(tr, budget_s, corpus_rng, checkpoint_every_s=checkpoint_every_s, rank=rank)

    @classmethod
    def from_init(cls, init: str | Path, budget_s: float, seed: int = 0, checkpoint_every_s: float = 180.0,
                  rank: int = 0, **overrides: Any) -> "Pretrainer":
        """Stage II on a new stream of corpus pairs (``seed``) from the pretraining checkpoint ``init``: its
        configuration with :data:`FROM_INIT` and ``overrides``, its weights and optimizer state."""
        ck = read_checkpoint(init)
        init = Path(init) / "checkpoint.pt" if Path(init).is_dir() else Path(init)
        require_training_state(ck, init)
        if "pretrain" not in ck:
            raise TrainError(f"{init}: --init needs a pretraining checkpoint (of `doppler pretrain`), this one is "
                             "of `doppler train`")  # fmt: skip
        cfg = dataclasses.replace(saved_config(ck, init), seed=seed, **{**FROM_INIT, **overrides})
        pt = cls.create(cfg, budget_s, checkpoint_every_s, rank=rank)
        tr = pt.trainer
        with loading_state(init):
            tr.load_weights(ck)
            meta = json.loads(ck["pretrain"])
            pt.init = {"checkpoint": str(init), "sha256": file_sha256(init), "updates": count(meta["updates"], "updates"),
                       "elapsed_s": _elapsed(meta)}  # fmt: skip
        tr.il_episode = max(tr.il_episode, cfg.il_episodes)  # Stage I is done
        return pt

    @property
    def cfg(self) -> TrainConfig:
        return self.trainer.cfg

    def update(self) -> dict[str, Any]:
        """One update on ``pairs_per_update`` fresh pairs, their gradients averaged (Stage I until
        ``il_episodes``, then Stage II with search)."""
        tr, cfg = self.trainer, self.cfg
        pairs = [sample_pair(self.corpus_rng) for _ in range(cfg.pairs_per_update)]
        tr.use_pairs(pairs)
        if tr.il_episode < cfg.il_episodes:
            stats = tr.imitation_update()
            stage = "il"
        else:
            best_cheap_s, search_s = [], []
            for i, task in enumerate(tr.tasks):
                tr.seed_incumbent(task, cfg.sim_seed_methods)
                best_cheap_s.append(task.best_makespan_s)
                if cfg.search_evals > 0:
                    tr.search_incumbent(task, seed=cfg.seed + self.updates * cfg.pairs_per_update + i)
                search_s.append(task.best_makespan_s)
            frac = min(self.elapsed_s / self.budget_s, 1.0)
            stats = tr.sim_update(cfg.lr + (cfg.lr_final - cfg.lr) * frac, cfg.eps_start)
            stats["greedy_vs_cheap"] = float(np.mean([t.greedy_ratio * t.lower_bound_s / b
                                                      for t, b in zip(tr.tasks, best_cheap_s)]))
            stats["search_vs_cheap"] = float(np.mean(np.divide(search_s, best_cheap_s)))
            stage = "sim"
        self.updates += 1
        stats.update(stage=stage, update=self.updates, num_ops=sum(g.num_ops for g, _ in pairs),
                     num_devices=max(c.num_devices for _, c in pairs), elapsed_s=self.elapsed_s)  # fmt: skip
        return stats

    def run(self, run_dir: str | Path | None = None, on_progress: ProgressFn | None = None) -> None:
        """Update until the budget is spent, checkpointing every ``checkpoint_every_s`` seconds and at the end
        (a resumed run with no budget left makes no update and leaves its checkpoint as it is)."""
        run_dir = Path(run_dir) if run_dir is not None else None
        start = self.updates
        if run_dir is not None:
            self.trainer.open_writer(run_dir)
        last_save = time.perf_counter()
        while self.elapsed_s < self.budget_s:
            t0 = time.perf_counter()
            stats = self.update()
            self.elapsed_s += time.perf_counter() - t0
            save_now = run_dir is not None and time.perf_counter() - last_save >= self.checkpoint_every_s
            if self.sync is not None:  # every worker takes rank 0's clock and save decision: same lr, same stop
                self.elapsed_s, save_now = self.sync.agree(self.elapsed_s, save_now)
            row = {k: float(v) for k, v in stats.items() if isinstance(v, (int, float))}
            self.history.append(row)
            self.history = thin_history(self.history)
            self.trainer.add_scalars("pretrain", row, self.updates, ("update",))
            if on_progress is not None:
                on_progress(ProgressEvent("pretrain", min(self.elapsed_s, self.budget_s), self.budget_s, "s", stats))
            if save_now:
                self.save(run_dir)
                last_save = time.perf_counter()
        if (run_dir is not None or self.sync is not None) and self.updates > start:  # (workers agree: same clock)
            self.save(run_dir)
            if self.trainer.writer is not None:
                self.trainer.writer.flush()

    # ------------------------------------------------------------------ checkpoints
    def _streams(self) -> dict[str, Any]:
        """This process's corpus and rollout generators (what a worker needs to resume its own streams)."""
        return {"corpus_rng": self.corpus_rng.bit_generator.state, "numpy_rng": self.trainer.rng.bit_generator.state}

    def state(self, worker_streams: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        st = self.trainer.state()
        st["graphs"] = []  # not trained on any one graph: serves every graph zero-shot
        st["history"] = json.dumps(self.history)
        st["pretrain"] = json.dumps({
            "corpus_rng": self.corpus_rng.bit_generator.state, "elapsed_s": self.elapsed_s, "updates": self.updates,
            "budget_s": self.budget_s, "families": list(TRAIN_FAMILIES), "ops": list(TRAIN_OPS),
            "devices": list(TRAIN_DEVICES), "init": self.init,
            "workers": 1 + len(worker_streams or []), "worker_streams": worker_streams or [],
        })  # fmt: skip
        return st

    def save(self, run_dir: str | Path | None) -> None:
        """``checkpoint.pt`` and ``config.json`` in ``run_dir``, atomically. With workers every one of them
        calls it (their streams are gathered into the checkpoint), and rank 0 writes."""
        streams = self.sync.gather(self._streams())[1:] if self.sync is not None else None
        if self.rank == 0 and run_dir is not None:
            write_checkpoint(Path(run_dir), self.state(streams), config_to_json(self.cfg))

    @classmethod
    def resume(cls, run_dir: str | Path, budget_s: float | None = None, rank: int = 0) -> "Pretrainer":
        """Continue a pretraining run from ``run_dir/checkpoint.pt`` (optionally with a new total budget); worker
        ``rank`` > 0 continues its own streams, saved in the checkpoint (a rank the run did not have begins
        its own, as :meth:`create` would)."""
        import torch

        ck = read_checkpoint(run_dir)
        ckpt = Path(run_dir) / "checkpoint.pt" if Path(run_dir).is_dir() else Path(run_dir)
        require_training_state(ck, ckpt)
        if "pretrain" not in ck:
            raise TrainError(f"{run_dir}: not a pretraining checkpoint (made by `doppler train`, not `doppler pretrain`)")
        meta = json.loads(ck["pretrain"])
        cfg = saved_config(ck, ckpt)
        check_config_file(ckpt.parent, cfg)
        with loading_state(ckpt):
            own_budget_s = finite(meta["budget_s"], "budget_s", positive=True)
            if own_budget_s > MAX_BUDGET_H * 3600:
                raise ValueError(f"budget_s is {own_budget_s:g}, more than {MAX_BUDGET_H:g} hours")
            budget_s = float(budget_s or own_budget_s)
            streams = meta.get("worker_streams", [])
            if not isinstance(streams, list) or not all(isinstance(w, dict) for w in streams):
                raise ValueError("worker_streams is not a list of each worker's generator states")
            workers = count(meta.get("workers", 1), "workers")
            if workers != 1 + len(streams):
                raise ValueError(f"workers is {workers}, but the checkpoint holds the streams of {1 + len(streams)}")
            init = meta.get("init")
            if init is not None and not isinstance(init, dict):
                raise ValueError(f"init is {type(init).__name__}, not an object or null")
        pt = cls.create(cfg, budget_s)
        tr = pt.trainer
        with loading_state(ckpt):
            tr.load_weights(ck)
            torch.set_rng_state(check_torch_rng(ck["torch_rng"]))
            tr.rng.bit_generator.state = check_numpy_rng(json.loads(ck["numpy_rng"]), "numpy_rng")
            pt.corpus_rng.bit_generator.state = check_numpy_rng(meta["corpus_rng"], "corpus_rng")
            for i, w in enumerate(streams, start=1):
                for key in ("corpus_rng", "numpy_rng"):
                    check_numpy_rng(w.get(key), f"worker {i}'s {key}")
            if rank:  # a worker continues its own streams; one the run did not have starts its streams afresh
                pt.rank = rank
                if rank <= len(streams):
                    pt.corpus_rng.bit_generator.state = streams[rank - 1]["corpus_rng"]
                    tr.rng.bit_generator.state = streams[rank - 1]["numpy_rng"]
                else:
                    pt.corpus_rng, tr.rng = _streams(cfg.seed, rank)
            pt.elapsed_s, pt.updates = _elapsed(meta), count(meta["updates"], "updates")
            pt.history = history_from_json(ck["history"])
            pt.init = init
            pt.saved_workers = workers
        return pt


#: rows of per-update statistics a pretraining checkpoint carries (TensorBoard keeps every update): past twice
#: this many, every other row is dropped. Without it a run's checkpoint grows with the run (1.5 h on 2
#: workers: 19,070 rows, 8.3 MB of a 12.5 MB checkpoint)
HISTORY_ROWS = 4096


def thin_history(history: list[dict[str, float]], rows: int | None = None) -> list[dict[str, float]]:
    """``history`` as is, or, past ``2 * rows`` rows (default :data:`HISTORY_ROWS`), every other row ending
    with the latest: a record spread over the whole run at an interval that doubles each time (each row
    names its ``update``)."""
    if len(history) <= 2 * (HISTORY_ROWS if rows is None else rows):
        return history
    return history[(len(history) - 1) % 2 :: 2]


def _elapsed(meta: dict[str, Any]) -> float:
    """A pretraining checkpoint's training time so far: a finite number of seconds >= 0."""
    elapsed_s = finite(meta["elapsed_s"], "elapsed_s")
    if elapsed_s < 0:
        raise ValueError(f"elapsed_s is {elapsed_s:g}, not a training time >= 0")
    return elapsed_s


def _streams(seed: int, rank: int) -> tuple[np.random.Generator, np.random.Generator | None]:
    """Worker ``rank``'s corpus stream (separate from its rollouts') and rollout stream; worker 0 has those of
    a run without workers, its rollout stream being the trainer's own (None)."""
    if rank == 0:
        return np.random.default_rng(seed + 1), None
    return np.random.default_rng([seed + 1, rank]), np.random.default_rng([seed, rank])
