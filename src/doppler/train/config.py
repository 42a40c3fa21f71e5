"""Every hyper-parameter of a training run: :class:`TrainConfig`, its checks, and its JSON form.

Each field is set by an option of ``doppler train`` of its own, or by ``--set FIELD=VALUE`` (the
hyper-parameters a run rarely changes); docs/doppler.md, "Training configuration", lists them all. A field
with an option of its own declares it (:func:`option`: its names and help), and the commands' options are
made from these declarations (:func:`command_options`), so each default and each help text is written once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from doppler.util.io import check_seed, read_json
from doppler.listsched import LIST_SCHEDULES
from doppler.memory import DEFAULT_MEMORY_FRACTION, MEMORY_FRACTION_HELP
from doppler.methods.anneal import WARM_START_METHODS
from doppler.policy import BASELINE_METHODS, LEARNED_METHODS

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
class TrainError(ValueError):
    """Bad training request or checkpoint (reported with exit code 2 by the CLI)."""


class TrainingDiverged(RuntimeError):
    """An update made a weight that is not a finite number (NaN or inf): the run stops there, and its run
    directory keeps the last checkpoint it wrote (every checkpoint holds finite weights only)."""


@dataclass(frozen=True)
class Option:
    """The command-line option of its own that sets a :class:`TrainConfig` field (the field's metadata): its
    names (``decls``, as typer takes them), its help text, in which ``{default}`` stands for the command's
    default, and the commands that have it; a field without one is set by ``--set FIELD=VALUE``."""

    decls: tuple[str, ...]
    help: str
    commands: tuple[str, ...] = ("train",)

    @property
    def flag(self) -> str:
        """The option's long name (``--device-identity`` of ``--device-identity/--no-device-identity``)."""
        return next(d for d in self.decls if d.startswith("--")).split("/")[0]


def option(default: Any, *decls: str, help: str, commands: tuple[str, ...] = ("train",)) -> Any:
    """A :class:`TrainConfig` field of ``default`` set by the option ``decls`` of ``commands``."""
    return dataclasses.field(default=default, metadata={"option": Option(decls, help, commands)})


@dataclass
class TrainConfig:
    """Every hyper-parameter of a training run (one field each, with what it sets)."""

    stages: tuple[str, ...] = option(("il", "sim"), "--stages", help="Comma list of stages: il (imitation), sim (simulator RL), real (RL on measured runs) (default: {default}; with --init: sim).")
    episodes: int = option(4000, "--episodes", help="Stage II episodes (paper: 4000; 8000 for LLaMA graphs), all graphs together; rounded up to whole updates of --batch episodes per graph (default: {default}).")
    il_episodes: int = option(1024, "--il-episodes", help="Stage I episodes (default: {default}), all graphs together; rounded up to whole updates.")
    batch: int = option(8, "--batch", help="Stage II episodes per graph per update, sharing one encoder pass (default: {default}).")
    pairs_per_update: int = option(1, "--pairs-per-update", commands=("pretrain",), help="Fresh (graph, cluster) pairs per update, their gradients averaged (default: {default}; with --init, the checkpoint's).")
    il_batch: int = 8  # Stage I episodes per graph per update
    lr: float = 3e-3  # Adam learning rate at the start of Stage II
    lr_final: float = 1e-6  # ... decayed linearly to this at the end
    il_lr: float = option(5e-3, "--il-lr", commands=("pretrain",), help="Adam learning rate of Stage I (default: {default}; a smaller one, such as 5e-4, makes snapshots differ less).")
    eps_start: float = 0.02  # epsilon-greedy exploration in Stage II (paper: 0.2), decayed linearly ...
    eps_end: float = 0.0  # ... to this
    entropy_coef: float = 1e-3  # weight of the (per-step mean) entropy bonus (paper: 1e-2)
    baseline: str = option("loo", "--baseline", help="REINFORCE baseline: running, mean, loo (leave-one-out batch mean) (default: {default}).")
    self_improve_coef: float = option(1.0, "--self-improve", help="Weight of the log-likelihood of the best assignment so far, 0: off (default: {default}).")
    plc_ties_only: bool = False  # Stage II's episodes and greedy decodes: the device head only breaks the ties
    # of the list-schedule rule (the action space of zero-shot decoding; `doppler pretrain --init`)
    search_every: int = option(500, "--search-every", help="Stage II episodes between local searches (simulated annealing) from the best assignment so far, which the policy then imitates (expert iteration); 0: off (default: {default}).")
    search_evals: int = option(20_000, "--search-evals", help=f"Simulator evaluations of each such search (deterministic) (default: {{default}}; with --init: {INIT_SEARCH_EVALS}).")
    distill_updates: int = 1000  # after Stage II, at most this many updates that teach the policy to decode
    # the best assignment found greedily (self-imitation until greedy matches it; 0: off)
    distill_on_policy: float | None = option(None, "--distill-on-policy", help="Weight of distillation's second term: the best assignment's device for each op, in the states the greedy decode itself visits (DAgger), so that one early mistake does not lead it off the best trajectory for good; 0: off (default: 1 with device identity, which doppler and doppler_plc learn by default; 0 with --no-device-identity or for other methods, where the device head cannot tell alike devices apart and the term fights the replay).")
    max_grad_norm: float = 5.0  # gradient clipping
    teacher: str = option(RULE_TEACHER, "--teacher", help="Stage I PLC teacher: critical_path (the list-schedule rule, on the states the policy visits), or a method whose assignment is cloned: heft, heft_lookahead (at most 10 s), enumerative, anneal (10 s) (default: {default}; SEL always imitates b-level order).")
    method: str = option("doppler", "--method", "-m", help="doppler (SEL and PLC learned); a single-head ablation: doppler_sel (PLC: earliest start), doppler_plc (SEL: largest b-level); or a learned baseline: single_policy (one softmax over op x device pairs), gdp (GraphSAGE + transformer, one shot), placeto (re-embeds at every step) (default: {default}).")
    hidden: int = 128  # embedding width H
    mp_steps: int = 6  # message-passing steps K
    mlp_hidden: int = 128  # width of the heads' hidden layer
    op_features: str = option("full", "--op-features", help="Static op features: full (with block coordinates and op ids: one graph's positions; the policy then serves its own graphs only, on any cluster) or structural (position-free: serves any graph) (default: {default}; with --init, a structural checkpoint is widened to it, the new inputs starting at zero weight: distillation needs identical tiles told apart).")
    device_identity: bool | None = option(None, "--device-identity/--no-device-identity", help="DOPPLER's device head learns a state for each device of this cluster (starting at zero), so that it can tell apart devices that differ only by their links (v100x8) and decode the best assignment it was taught; on any other cluster the policy decodes without them (default: on where the device head is learned: doppler, doppler_plc; see learns_device_identity).")
    list_schedule: str = option("critical_path", "--list-schedule", commands=("train", "pretrain"), help="List-schedule model of DOPPLER's PLC device features and Stage I rule: critical_path (ops append to a device; earliest start) or heft (ops fill idle gaps; earliest finish) (default: {default}; with --init: the checkpoint's).")
    noise_sigma: float = 0.0  # lognormal noise of the simulator oracle
    real_episodes: int = option(64, "--real-episodes", help="Stage III episodes, each a measured run on the engine (default: {default}), rounded up to whole updates of --batch per graph.")
    real_lr: float = 3e-4  # Adam learning rate of Stage III (constant)
    real_eps: float = 0.0  # epsilon-greedy exploration of Stage III (constant)
    real_seed_methods: tuple[str, ...] = ("single", "metis", "critical_path")  # measured at the start of
    # Stage III next to the best simulated assignment; the fastest measured one becomes the incumbent that
    # the self-improvement term imitates (empty: only the simulator's best)
    sim_seed_methods: tuple[str, ...] = option(WARM_START_METHODS, "--warm-start", help="Comma list of methods simulated at the start of Stage II, whose best assignment becomes the first one the self-improvement term imitates, or 'none': start from the policy's own samples (default: {default}).")
    engine: str = option("local", "--engine", help="Stage III engine: local or dask (devices: the cluster's count) (default: {default}).")
    engine_device_type: str = option("cpu", "--device-type", help="Stage III devices of the local engine: cpu or cuda (default: {default}).")
    seed: int = option(0, "--seed", commands=("train", "pretrain"), help="Random seed of torch, numpy and every search of the run (pretrain: and of the corpus stream) (default: {default}).")
    checkpoint_every: int = 1000  # episodes between checkpoints (and at the end of each stage)
    torch_threads: int = option(2, "--threads", commands=("train", "pretrain"), help="torch intra-op threads (default: {default}; two trainings that share a 2-core machine want 1 each: with 2 each they oversubscribe it and run far slower; benchmarks/train_speed.py compares 1 and 2).")
    device: str = option("cpu", "--device", commands=("train", "pretrain"), help="Where the networks run: cpu or cuda (rollouts and the simulator stay on the CPU) (default: {default}).")
    memory_fraction: float | None = option(DEFAULT_MEMORY_FRACTION, "--memory-fraction", help=MEMORY_FRACTION_HELP)

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
        from doppler.policy.architectures import MAX_MP_STEPS, MAX_WIDTH  # (torch: not when the CLI starts)

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


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_HINTS = typing.get_type_hints(TrainConfig)


def flag(field_name: str) -> str:
    """The command-line option that sets a :class:`TrainConfig` field, for messages (``--set FIELD`` if none)."""
    own = _FIELDS[field_name].metadata.get("option")
    return own.flag if own is not None else f"--set {field_name}"


def pretrain_config(**overrides: Any) -> TrainConfig:
    """The training hyper-parameters of pretraining (``doppler pretrain``; overrides by name), whose values are
    also the defaults of its options. Stage I runs for the whole budget; Stage II on the corpus runs only when
    ``il_episodes`` is set below the budget's."""
    base = dict(
        stages=("il", "sim"), il_episodes=MAX_RUN_COUNT, list_schedule="heft", episodes=MAX_RUN_COUNT, batch=16, il_batch=8,
        lr=2e-4, lr_final=2e-5, il_lr=2e-3, eps_start=0.0, eps_end=0.0, entropy_coef=1e-3, self_improve_coef=0.5,
        search_every=0, search_evals=1000, distill_updates=0, op_features="structural", checkpoint_every=MAX_RUN_COUNT,
        device_identity=False,  # a pair per update, each with its own cluster: no devices to learn a state for
        torch_threads=1,
    )  # fmt: skip
    base.update(overrides)
    return TrainConfig(**base)


@dataclass(frozen=True)
class CommandOption:
    """One option of a command that sets the :class:`TrainConfig` field ``name``: its names, its help with the
    command's default, and the type the command line reads (a tuple field reads a comma list of names)."""

    name: str
    decls: tuple[str, ...]
    help: str
    value_type: type

    def read(self, value: Any) -> Any:
        """The field's value of the option's command-line ``value`` (a comma list: a tuple, ``none`` left out)."""
        if _is_names(_HINTS[self.name]):
            return tuple(s.strip() for s in value.split(",") if s.strip() and s.strip() != "none")
        return value


def command_options(command: str, defaults: TrainConfig) -> list[CommandOption]:
    """The options of ``command`` (``train`` or ``pretrain``) that set fields of its configuration, in field
    order, each with its help text showing the command's default (``defaults``'s value)."""
    out = []
    for f in dataclasses.fields(TrainConfig):
        own = f.metadata.get("option")
        if own is None or command not in own.commands:
            continue
        hint = _HINTS[f.name]
        value_type = str if _is_names(hint) else next(t for t in typing.get_args(hint) or (hint,) if t is not type(None))
        out.append(CommandOption(f.name, own.decls, own.help.format(default=_shown(getattr(defaults, f.name))),
                                 value_type))  # fmt: skip
    return out


def _is_names(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple


def _shown(value: Any) -> str:
    """A default as a help text shows it."""
    if isinstance(value, tuple):
        return ",".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def set_fields(cfg: TrainConfig, items: Sequence[str]) -> TrainConfig:
    """``cfg`` with ``--set FIELD=VALUE`` items applied, each VALUE read by the type of the field's default
    (true/false; a whole number; a number; a comma list of names; ``none`` where the default is None);
    a field with an option of its own is set by that option. TrainError naming the item otherwise."""
    fields = _FIELDS
    own = {o.name for o in command_options("train", cfg)}
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
