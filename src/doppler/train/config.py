"""Every hyper-parameter of a training run: :class:`TrainConfig`, its checks, and its JSON form.

Each field is set by an option of ``doppler train`` of its own, or by ``--set FIELD=VALUE`` (the
hyper-parameters a run rarely changes); docs/doppler.md, "Training configuration", lists them all.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from doppler.io_util import check_seed, read_json
from doppler.listsched import LIST_SCHEDULES
from doppler.methods.anneal import WARM_START_METHODS
from doppler.policy import BASELINE_METHODS, LEARNED_METHODS
from doppler.policy.architectures import MAX_MP_STEPS, MAX_WIDTH

STAGES = ("il", "sim", "real")
#: Stage I teachers of PLC: the list-schedule rule labels the states the policy visits (DAgger); any
#: other method's assignment is cloned along the b-level order
RULE_TEACHER = "critical_path"
TEACHERS = (RULE_TEACHER, "heft", "heft_lookahead", "enumerative", "anneal")
BASELINES = ("running", "mean", "loo")
IDENTITY_METHODS = ("doppler", "doppler_plc")  # whose device head is learned: device identity on by default
#: evaluations of each local search when fine-tuning a pretrained policy (``doppler train --init``), where
#: the fine-tuned decode is what these searches find, so they are longer than the default 20,000
INIT_SEARCH_EVALS = 100_000
#: the most episodes per graph in one update (``--batch``; Stage I's ``il_batch`` too): a batch's
#: tensors grow with it (``--batch 100000`` on 84 ops took 19.8 GB before its first update)
MAX_BATCH = 1024
#: the most fresh (graph, cluster) pairs in one pretraining update (each up to 1,000 ops, held at once)
MAX_PAIRS_PER_UPDATE = 64
#: the most torch threads (``--threads``): far more than any machine's cores (100,000 crashed torch)
MAX_TORCH_THREADS = 256
#: the most episodes of Stage I or of Stage II of a ``doppler train`` run (``--il-episodes``, ``--episodes``; a
#: resumed run's own): the paper trains 4,000 to 8,000. 10**6 takes hours on a graph of 8 ops (18 episodes/s
#: with the defaults) and days on real ones, so a mistyped count is refused instead of running for weeks
MAX_EPISODES = 1_000_000
#: the most Stage III episodes (``--real-episodes``; default 64), each a measured run on the engine
MAX_REAL_EPISODES = 100_000
#: the most distillation updates (``--set distill_updates``; default 1,000)
MAX_DISTILL_UPDATES = 100_000
#: the most simulator evaluations of one local search (``--search-evals``; default 20,000, 100,000 with ``--init``)
MAX_SEARCH_EVALS = 10_000_000
#: the largest count a run's configuration or training state may hold: the interval fields (``checkpoint_every``,
#: ``search_every``), the episode and update counters of a checkpoint, the optimizer's step counts. Pretraining,
#: which runs until its time budget ends, sets its episode counts to this: they stand for "the whole budget"
#: (:data:`MAX_EPISODES` bounds only ``doppler train``, whose stages those counts end)
MAX_RUN_COUNT = 10**9
#: the fields ``doppler train`` sets with options of their own (option name -> field); ``--set`` sets the rest
RUN_OPTIONS = {"stages": "stages", "episodes": "episodes", "il_episodes": "il_episodes", "batch": "batch",
               "method": "method", "teacher": "teacher", "list_schedule": "list_schedule", "baseline": "baseline",
               "self_improve": "self_improve_coef", "seed": "seed", "warm_start": "sim_seed_methods",
               "search_every": "search_every", "distill_on_policy": "distill_on_policy", "search_evals": "search_evals",
               "real_episodes": "real_episodes", "engine": "engine", "engine_device_type": "engine_device_type",
               "device": "device", "threads": "torch_threads", "op_features": "op_features",
               "device_identity": "device_identity", "memory_fraction": "memory_fraction"}  # fmt: skip


class TrainError(ValueError):
    """Bad training request or checkpoint (reported with exit code 2 by the CLI)."""


class TrainingDiverged(RuntimeError):
    """An update made a weight that is not a finite number (NaN or inf): the run stops there, and its run
    directory keeps the last checkpoint it wrote (every checkpoint holds finite weights only)."""


#: fields that ``doppler pretrain`` sets with options of their own
PRETRAIN_OPTIONS = ("pairs_per_update", "il_lr")


def flag(field_name: str) -> str:
    """The command-line option that sets a :class:`TrainConfig` field, for messages."""
    option = next((o for o, f in RUN_OPTIONS.items() if f == field_name), None)
    if option is None and field_name not in PRETRAIN_OPTIONS:
        return f"--set {field_name}"
    option = option or field_name
    return "--" + {"engine_device_type": "device-type"}.get(option, option).replace("_", "-")


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
    self_improve_coef: float = 1.0  # weight of the log-likelihood of the best assignment so far (0: off)
    plc_ties_only: bool = False  # Stage II's episodes and greedy decodes: the device head only breaks the ties
    # of the list-schedule rule (the action space of zero-shot decoding; `doppler pretrain --init`)
    search_every: int = 500  # Stage II episodes between local searches from the incumbent (expert iteration; 0: off)
    search_evals: int = 20_000  # simulator evaluations of each such search (simulated annealing, deterministic)
    distill_updates: int = 1000  # after Stage II, at most this many updates that teach the policy to decode
    # the best assignment found greedily (self-imitation until greedy matches it; 0: off)
    # distillation also imitates the best device in the greedy decode's own states (DAgger), with this
    # weight; None: 1 with device_identity, else 0 (see on_policy_weight)
    distill_on_policy: float | None = None
    max_grad_norm: float = 5.0  # gradient clipping
    teacher: str = RULE_TEACHER  # Stage I teacher of PLC (SEL always imitates b-level order)
    method: str = "doppler"  # doppler (both heads learned), doppler_sel or doppler_plc (one head; the other
    # follows CRITICAL PATH's rule: the paper's single-head ablations), or a learned baseline: single_policy,
    # gdp, placeto (doppler.policy.architectures)
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
    engine_device_type: str = "cpu"  # Stage III devices of the local engine: cpu | cuda
    seed: int = 0
    checkpoint_every: int = 1000  # episodes between checkpoints (and at the end of each stage)
    torch_threads: int = 2  # intra-op threads (benchmarks/train_speed.py compares 1 and 2; two processes
    # with 2 each on 2 cores oversubscribe them and run far slower than one: use 1 there)
    device: str = "cpu"  # where the networks run (cpu, cuda); rollouts and the simulator stay on the CPU
    memory_fraction: float | None = 0.9  # episodes place each op only where the device's memory_bytes x this
    # has room for it, and incumbents fit it (doppler.memory); None: memory ignored (--ignore-memory)

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
            value, default = getattr(self, f.name), _default(f)
            if value is None and (default is None or f.name == "memory_fraction"):
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
                raise TrainError(f"{flag(f.name)} must be {what}, got {value!r}")

    def _require(self, names: tuple[str, ...], ok: Callable[[Any], bool], what: str) -> None:
        """TrainError naming the first of ``names`` whose value is not ``ok``: it "must be ``what``"."""
        for name in names:
            if not ok(getattr(self, name)):
                raise TrainError(f"{flag(name)} must be {what}, got {getattr(self, name)}")

    def validate(self) -> None:
        """Raise :class:`TrainError` naming the first field (by its option) that does not hold."""
        self._check_types()
        for name, lo, hi in (("hidden", 1, MAX_WIDTH), ("mlp_hidden", 1, MAX_WIDTH), ("mp_steps", 0, MAX_MP_STEPS),
                             ("distill_updates", 0, MAX_DISTILL_UPDATES)):  # fmt: skip
            self._require((name,), lambda v: not int(v) < lo, f">= {lo}")
            self._require((name,), lambda v: not int(v) > hi, f"at most {hi:,}")
        self._require(("eps_start", "eps_end", "real_eps"), lambda v: 0 <= float(v) <= 1, "in [0, 1]")
        self._require(("entropy_coef", "noise_sigma"), lambda v: not float(v) < 0, ">= 0")
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown or not self.stages:
            raise TrainError(f"unknown stage {unknown[0] if unknown else ''!r} (use: {', '.join(STAGES)})")
        from doppler.policy.features import OP_FEATURE_SETS

        for what, value, allowed in (("teacher", self.teacher, TEACHERS), ("method", self.method, LEARNED_METHODS),
                                     ("op feature set", self.op_features, OP_FEATURE_SETS),
                                     ("list schedule", self.list_schedule, LIST_SCHEDULES),
                                     ("baseline", self.baseline, BASELINES)):  # fmt: skip
            if value not in allowed:
                label = "trainable" if what == "method" else "use one of"
                raise TrainError(f"unknown {what} {value!r} ({label}: {', '.join(allowed)})")
        if self.list_schedule != "critical_path" and self.method in BASELINE_METHODS:
            raise TrainError(f"--list-schedule {self.list_schedule} is for DOPPLER's policies, not {self.method}")
        if self.device_identity and self.method in BASELINE_METHODS:
            raise TrainError(f"--device-identity is for DOPPLER's policies, not {self.method}")
        self._require(("episodes", "il_episodes", "batch", "il_batch", "checkpoint_every", "real_episodes",
                       "torch_threads", "pairs_per_update"), lambda v: not int(v) < 1, ">= 1")  # fmt: skip
        for name, cap in (("batch", MAX_BATCH), ("il_batch", MAX_BATCH), ("pairs_per_update", MAX_PAIRS_PER_UPDATE)):
            self._require((name,), lambda v: not int(v) > cap, f"at most {cap} (all of them are held in memory at "
                          "once)")  # fmt: skip
        self._require(("torch_threads",), lambda v: not int(v) > MAX_TORCH_THREADS, f"at most {MAX_TORCH_THREADS}")
        if not self.max_grad_norm > 0:
            raise TrainError(f"{flag('max_grad_norm')} must be a finite number > 0, got {self.max_grad_norm!r}")
        self._require(("lr", "il_lr", "real_lr"), lambda v: 0 < float(v) <= 1, "a learning rate in (0, 1]")
        self._require(("lr_final",), lambda v: 0 <= float(v) <= 1, "a learning rate in (0, 1]")  # (or 0)
        self._require(("memory_fraction",), lambda v: v is None or 0 < float(v) <= 1, "a number in (0, 1]")
        self._require(("self_improve_coef", "distill_on_policy"), lambda v: v is None or 0 <= float(v) <= 100,
                      "a weight in [0, 100]")  # fmt: skip
        self._require(("search_every", "search_evals"), lambda v: not int(v) < 0, ">= 0")
        for name, cap in (("episodes", MAX_RUN_COUNT), ("il_episodes", MAX_RUN_COUNT), ("real_episodes", MAX_REAL_EPISODES),
                          ("search_evals", MAX_SEARCH_EVALS),
                          ("search_every", MAX_RUN_COUNT), ("checkpoint_every", MAX_RUN_COUNT)):  # fmt: skip
            self._require((name,), lambda v: not int(v) > cap, f"at most {cap:,}")
        from doppler.methods import MethodError, get_method

        for m in (*self.sim_seed_methods, *self.real_seed_methods):
            try:
                get_method(m)
            except MethodError as e:
                raise TrainError(f"warm start: {e}") from None
        check_seed(self.seed, TrainError, "--seed")
        self._check_engine()
        if self.baseline != "running" and self.batch < 2:
            raise TrainError(f"baseline {self.baseline!r} needs --batch >= 2")

    def check_lengths(self) -> None:
        """TrainError unless a ``doppler train`` run of this configuration ends in a bounded time: its Stage I and
        Stage II episodes at most :data:`MAX_EPISODES` (:meth:`validate` bounds the other counts). Pretraining,
        which stops when its time budget ends, does not check this: its counts stand for the whole budget."""
        self._require(("il_episodes", "episodes"), lambda v: not int(v) > MAX_EPISODES,
                      f"at most {MAX_EPISODES:,} (a doppler train run; the paper trains 4,000 to 8,000)")  # fmt: skip

    def _check_engine(self) -> None:
        from doppler.engine import DEVICE_TYPES, ENGINES

        if self.engine not in ENGINES:
            raise TrainError(f"unknown engine {self.engine!r} for Stage III (use local or dask)")
        if self.engine_device_type not in DEVICE_TYPES or (self.engine == "dask" and self.engine_device_type != "cpu"):
            raise TrainError(f"device type {self.engine_device_type!r} is not available on the {self.engine} engine "
                             "(local: cpu or cuda; dask: cpu)")  # fmt: skip
        if "real" in self.stages and self.engine_device_type == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise TrainError("Stage III on CUDA devices: no CUDA device is visible here")  # before any training


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def set_fields(cfg: TrainConfig, items: Sequence[str]) -> TrainConfig:
    """``cfg`` with ``--set FIELD=VALUE`` items applied, each VALUE read by the type of the field's default
    (true/false; a whole number; a number; a comma list of names; ``none`` where the default is None);
    a field with an option of its own is set by that option. TrainError naming the item otherwise."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    own = set(RUN_OPTIONS.values())
    changes: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name:
            raise TrainError(f"--set {item!r}: expected FIELD=VALUE")
        if name not in fields:
            raise TrainError(f"--set {item!r}: no field {name!r} (fields: {', '.join(sorted(set(fields) - own))})")
        if name in own:
            raise TrainError(f"--set {item!r}: {name} has an option of its own: {flag(name)}")
        if name in changes:
            raise TrainError(f"--set {item!r}: {name} is set twice")
        changes[name] = _parse_value(item, text, _default(fields[name]))
    return dataclasses.replace(cfg, **changes)


def _parse_value(item: str, text: str, default: Any) -> Any:
    if default is None and text.lower() == "none":
        return None
    try:
        if isinstance(default, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError
            return text.lower() == "true"
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float) or default is None:
            return float(text)
        if isinstance(default, tuple):
            return tuple(s.strip() for s in text.split(",") if s.strip())
    except ValueError:
        kind = {bool: "true or false", int: "a whole number"}.get(type(default), "a number")
        raise TrainError(f"--set {item!r}: {text!r} is not {kind}") from None
    return text


def config_to_json(cfg: TrainConfig) -> dict[str, Any]:
    d = asdict(cfg)
    for key in ("stages", "real_seed_methods", "sim_seed_methods"):
        d[key] = list(getattr(cfg, key))
    return d


def config_from_json(obj: dict[str, Any]) -> TrainConfig:
    """The configuration :func:`config_to_json` wrote (a checkpoint's ``config``); keys of fields a run no
    longer has are dropped, and values of the wrong type are kept as they are, for
    :meth:`TrainConfig.validate` to name."""
    if not isinstance(obj, dict):
        raise TrainError(f"a training configuration must be a JSON object, got {type(obj).__name__}")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    kw = {k: v for k, v in obj.items() if k in names}
    for key in ("stages", "real_seed_methods", "sim_seed_methods"):
        value = kw.get(key, getattr(TrainConfig, key))
        kw[key] = tuple(value) if isinstance(value, list) else value
    kw.setdefault("device_identity", False)  # a run saved before the option existed had none
    return TrainConfig(**kw)


def check_config_file(run_dir: str | Path, cfg: TrainConfig) -> None:
    """TrainError unless the run directory's ``config.json``, where there is one, holds ``cfg``, the configuration
    of its checkpoint: a run continues as its checkpoint says, so a config.json that says otherwise (edited or
    damaged) is refused naming it and the first field that differs, not overwritten with the checkpoint's. A
    missing one is written again by the next checkpoint."""
    path = Path(run_dir) / "config.json"
    if not path.exists() and not path.is_symlink():
        return
    doc = read_json(path, "run configuration", TrainError)
    try:
        own = config_from_json(doc)
        own.validate()
    except TrainError as e:
        raise TrainError(f"{path}: the run's configuration does not hold ({e})") from None
    differs = next((f.name for f in dataclasses.fields(TrainConfig) if getattr(own, f.name) != getattr(cfg, f.name)), None)
    if differs is not None:
        raise TrainError(f"{path}: {differs} is {getattr(own, differs)!r}, but the run's checkpoint says "
                         f"{getattr(cfg, differs)!r} (a run continues as its checkpoint says: restore config.json, or "
                         "start a new run with another -o)")  # fmt: skip


def saved_config(ck: dict[str, Any], path: str | Path) -> TrainConfig:
    """The training configuration a checkpoint holds, validated: it was valid when saved, so a refusal means a
    damaged file, and says so naming it (not as the command-line option it would be)."""
    cfg = config_from_json(json.loads(ck["config"]))
    try:
        cfg.validate()
    except TrainError as e:
        raise TrainError(f"{path}: a damaged checkpoint: its configuration does not hold ({e})") from None
    return cfg
