"""Fixtures of the fuzzing suite: the directory every example's sandbox lives in, and two real run
directories (a tiny ``doppler train`` run and a tiny ``doppler pretrain`` run) whose checkpoints the
checkpoint and ``--resume`` fuzzers mutate. Each is made once per test process, in a few seconds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

#: the training graph of :func:`train_run` (``random``, tiny, 8 ops)
TRAIN_GRAPH = {"size": "tiny", "num_ops": 8}
#: small networks: a checkpoint of about 80 kB that loads in milliseconds
TINY_POLICY = dict(hidden=8, mlp_hidden=8, mp_steps=1, torch_threads=1)


@dataclass(frozen=True)
class Run:
    """A finished run: its directory, the graph it trained on (a train run), the seconds it took (pretrain)."""

    dir: Path
    graph: Path | None = None
    elapsed_s: float = 0.0


@pytest.fixture(scope="session")
def fuzz_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="session")
def train_run(tmp_path_factory) -> Run:
    """A ``doppler train`` run directory (Stage I and II, a few episodes) as the command writes it."""
    from doppler import workloads
    from doppler.ir.formats import save_graph
    from doppler.hardware.presets import cluster
    from doppler.train import TrainConfig, Trainer

    d = tmp_path_factory.mktemp("train_run")
    graph = workloads.build("random", **TRAIN_GRAPH)
    save_graph(graph, d / "g.json")
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=8, il_batch=4, episodes=8, batch=4, search_every=0,
                      sim_seed_methods=(), distill_updates=0, **TINY_POLICY)  # fmt: skip
    Trainer.create([graph], cluster("unit:2"), cfg).run(d / "RUN")
    return Run(d / "RUN", graph=d / "g.json")


@pytest.fixture(scope="session")
def pretrain_run(tmp_path_factory) -> Run:
    """A ``doppler pretrain`` run directory (one update)."""
    from doppler.train.pretrain import Pretrainer, pretrain_config

    d = tmp_path_factory.mktemp("pretrain_run")
    pt = Pretrainer.create(pretrain_config(il_episodes=4, batch=4, search_evals=10, **TINY_POLICY), budget_s=1e-3)
    pt.run(d / "PRE")
    return Run(d / "PRE", elapsed_s=pt.elapsed_s)
