"""``doppler train``: Stage I (imitation) and Stage II (simulator RL) of DOPPLER."""

import contextlib
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import typer

from doppler.cli._common import (CLUSTER_OPT,
    JSON_OPT, UserError, app, as_user_error, config_options, console, emit_json,
                                 handle_errors, hold_outputs, live_progress)  # fmt: skip
from doppler.train.config import TrainConfig, command_options


def _init_config(cfg, init: str, op_features: str | None = None, cluster=None):
    """``cfg`` with the shape of the policy in ``init`` (``pretrained`` or a checkpoint path), its weights,
    its path, and the device count of a device identity it left out (else None). ``op_features``: read
    these op features instead of the checkpoint's (a superset: the new inputs' weights start at zero,
    :func:`~doppler.policy.checkpoint.widen_op_features`). ``cluster``: the training cluster; a
    checkpoint's learned per-device states carry over only on the cluster they were learned on (and
    not with ``device_identity=False``): elsewhere they start again at zero."""
    import dataclasses

    from doppler.policy.architectures import config_sizes, read_checkpoint
    from doppler.policy.checkpoint import (
        CheckpointError, checkpoint_method, identity_left_out, resolve_checkpoint, strip_device_identity,
    )  # fmt: skip

    path, _ = resolve_checkpoint(None if init == "pretrained" else init)  # CheckpointError: exit 2
    ck = read_checkpoint(path)
    pc, weights = ck["policy_config"], ck["state_dict"]
    if checkpoint_method(pc) != cfg.method:
        raise CheckpointError(f"{path}: --init needs a {cfg.method} checkpoint, this one is {checkpoint_method(pc)} "
                              f"(give --method {checkpoint_method(pc)}, or another checkpoint)")  # fmt: skip
    if cluster is not None and pc.get("num_devices") not in (None, cluster.num_devices):
        raise CheckpointError(f"{path}: a {cfg.method} policy has one output unit per device: its {pc['num_devices']} "
                              f"cannot serve cluster {cluster.name!r} ({cluster.num_devices} devices)")  # fmt: skip
    left_out = None
    if pc.get("device_identity") and (cfg.device_identity is False or (cluster and identity_left_out(ck, cluster))):
        left_out = int(pc["device_identity"])
        pc, weights = strip_device_identity(pc, weights)
    identity = cfg.device_identity if cfg.device_identity is not None else (True if pc.get("device_identity") else None)
    shaped = dataclasses.replace(cfg, **config_sizes(pc), op_features=op_features or pc.get("op_features", "full"),
                                 list_schedule=pc.get("list_schedule", "critical_path"),
                                 device_identity=identity)  # fmt: skip
    shaped.validate()
    if shaped.op_features != pc.get("op_features", "full"):
        from doppler.policy.architectures import build_policy
        from doppler.policy.checkpoint import widen_op_features

        target = build_policy(shaped.method, num_devices=1, hidden=shaped.hidden, steps=shaped.mp_steps,
                              mlp_hidden=shaped.mlp_hidden, op_features=shaped.op_features,
                              list_schedule=shaped.list_schedule)  # fmt: skip
        try:
            weights = widen_op_features(weights, target, pc.get("op_features", "full"))
        except KeyError as e:
            raise CheckpointError(f"{path}: --op-features {shaped.op_features}: the checkpoint has no weights {e}") from None
        except CheckpointError as e:
            raise CheckpointError(f"{path}: --op-features {shaped.op_features}: {e}") from None
    return shaped, weights, path, left_out


def trainer_from_init(graphs: list, cl, cfg, init: str, op_features: str | None = None):
    """A :class:`~doppler.train.Trainer` whose policy starts from ``init`` (``pretrained`` or a checkpoint),
    as ``doppler train --init``: shaped by :func:`_init_config`, a device identity added at zero.
    ``op_features`` None keeps the checkpoint's (the command passes its default, ``full``).
    ``trainer.identity_left_out``: the device count of a learned identity the checkpoint had for another cluster."""
    from doppler.policy.checkpoint import add_device_identity
    from doppler.train import Trainer, TrainError

    cfg, weights, path, left_out = _init_config(cfg, init, op_features, cl)
    trainer = Trainer.create(graphs, cl, cfg)
    trainer.identity_left_out = left_out
    try:
        trainer.policy.load_state_dict(add_device_identity(weights, trainer.policy))
    except RuntimeError as e:
        raise TrainError(f"{path}: --init weights do not match the policy ({str(e).splitlines()[0][:120]})") from None
    return trainer


@contextlib.contextmanager
def diverged_run(output: Path, started_from: Any = None) -> Iterator[None]:
    """A training run inside that diverges (:class:`~doppler.train.TrainingDiverged`) ends in one line saying that
    ``output`` keeps its last checkpoint: exit 2 if it ``started_from`` a saved state (``--resume``, ``--init``),
    whose damage is the likelier cause; else exit 1 (``internal error``)."""
    from doppler.train import TrainingDiverged

    try:
        yield
    except TrainingDiverged as e:
        if started_from is not None:
            raise UserError(f"{e}; {output} keeps its last checkpoint (the run started from {started_from}, whose "
                            "state may be damaged)") from None  # fmt: skip
        raise TrainingDiverged(f"{e}; {output} keeps its last checkpoint") from None


def _typed_options(ctx: typer.Context) -> dict[str, Any]:
    """The command's parameters the user gave (on the command line or from the environment), by name."""
    return {p.name: p for p in ctx.command.params
            if getattr(ctx.get_parameter_source(p.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")}  # fmt: skip


def _check_resume_options(typed: dict[str, Any], trainer, cfg, run_dir: Path) -> None:
    """``--resume`` continues a run as it was configured: an option typed on the command line (``typed``) that
    differs from the run's own is refused (it would be ignored). (``--episodes`` below the Stage II episodes the
    run has already done is refused by :meth:`~doppler.train.Trainer.resume`.)"""
    for name in (o.name for o in TRAIN_OPTIONS):
        if name == "episodes":  # (it may extend Stage II: below)
            continue
        mine, theirs = getattr(cfg, name), getattr(trainer.cfg, name)
        if isinstance(mine, (list, tuple)) and isinstance(theirs, (list, tuple)):
            mine, theirs = tuple(mine), tuple(theirs)
        if name in typed and mine != theirs:
            p = typed[name]
            given = (p.opts[0] if mine else p.secondary_opts[0]) if isinstance(mine, bool) else f"{p.opts[0]} {mine}"
            raise UserError(f"--resume continues {run_dir} as it was configured: {given} differs from the run's "
                            f"{theirs} (leave it out, or start a new run with another -o)")  # fmt: skip
    if "set_" in typed:
        raise UserError(f"--resume continues {run_dir} as it was configured: leave out --set")


def _trainer(graph_paths: list[Path], cluster_name: str, cfg, run_dir: Path, resume: bool, init: str | None = None,
             op_features: str | None = None, resume_episodes: int | None = None):  # fmt: skip
    from doppler.ir.formats import load_graph
    from doppler.hardware.presets import cluster
    from doppler.train import Trainer

    graphs = [load_graph(p) for p in graph_paths]
    seen: dict[str, Path] = {}
    for path, g in zip(graph_paths, graphs):  # (a copy or a link is the same graph)
        first = seen.setdefault(g.fingerprint(), path)
        if first is not path:
            raise UserError(f"{path}: the same graph as {first} (give each training graph once)")
    cl = cluster(cluster_name)
    if resume:  # --episodes typed: extend Stage II to it; else the run's own length
        return Trainer.resume(run_dir, graphs, cl, episodes=resume_episodes)
    if (run_dir / "checkpoint.pt").exists():
        raise UserError(f"{run_dir} already holds a training run (use --resume to continue it, or another -o)")
    if init is None:
        return Trainer.create(graphs, cl, cfg)
    return trainer_from_init(graphs, cl, cfg, init, op_features)


def _real_oracle_with_weights(trainer, graph_paths: list[Path], weights_path: Path) -> None:
    """``--weights``: Stage III measures the one graph's runs on the checkpoint's weights (bound now, so that a
    bad checkpoint stops the command before any training)."""
    from doppler.engine.oracle import EngineOracle
    from doppler.engine.weights import WeightsError, bound_program

    if len(graph_paths) != 1:
        raise UserError("--weights: give one graph (the checkpoint holds one model's weights)")
    if "real" not in trainer.cfg.stages:
        raise UserError("--weights is what Stage III runs: give --stages with real")
    if trainer.cfg.engine != "local":
        raise UserError("--weights: the dask engine does not read checkpoints; use --engine local")
    task, cfg = trainer.tasks[0], trainer.cfg
    with as_user_error(WeightsError):
        bound = bound_program(task.graph, str(graph_paths[0]), weights_path, seed=cfg.seed)
    trainer.real_oracles[0] = EngineOracle(task.graph, task.cluster, engine=cfg.engine, repeats=1, seed=cfg.seed,
                                           program=bound.program, device_type=cfg.engine_device_type)  # fmt: skip


#: the options of ``doppler train`` that set fields of its configuration (from the fields' own metadata)
TRAIN_OPTIONS = command_options("train", TrainConfig())


@app.command("train")
@config_options(TRAIN_OPTIONS)
def train_cmd(
    ctx: typer.Context,
    graph_paths: list[Path] = typer.Argument(..., metavar="G...", help="Training graph file(s) (.json or .txt)."),
    cluster_name: str = CLUSTER_OPT,
    options: dict[str, Any] = {},  # noqa: B006  (the TrainConfig fields' options, @config_options)
    output: Path = typer.Option(..., "-o", "--output", help="Run directory (checkpoint, config, best assignment, TensorBoard)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the output directory exactly, with its own options; --episodes may extend Stage II."),
    init: Optional[str] = typer.Option(None, "--init", help="Fine-tune from 'pretrained' (the shipped policy) or a checkpoint file (skips Stage I unless --stages says otherwise)."),
    ignore_memory: bool = typer.Option(False, "--ignore-memory", help="Train without the memory budget: episodes may place ops where they do not fit."),
    weights_path: Optional[Path] = typer.Option(None, "--weights", help="Stage III runs the model with its own weights (a graph from `graph import`, also on the meta device; one graph): a .safetensors file or a save_pretrained directory, as `execute --weights` reads it."),
    set_: list[str] = typer.Option([], "--set", metavar="FIELD=VALUE", help="Any other hyper-parameter of the run (repeatable), e.g. lr=1e-3, hidden=64, distill_updates=0 (docs/doppler.md, Training configuration, lists them)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Train a DOPPLER policy (imitation, then REINFORCE in the simulator) on one or more graphs."""
    with handle_errors():
        from doppler.policy.checkpoint import RUN_DIR_MEMBERS, CheckpointError

        # one writer, no member a link: before torch's import and before the run is read or checked
        hold_outputs(ctx, dirs={"": output}, members=RUN_DIR_MEMBERS)
        from doppler.train.config import INIT_SEARCH_EVALS, TrainError, set_fields

        with as_user_error(TrainError, CheckpointError):
            if init is not None and resume:
                raise UserError("--init starts a new run from a policy; --resume continues a run: give one of them")
            if options.get("stages") == ():
                raise UserError("--stages is empty (use a comma list of: il, sim, real)")
            given = dict(options)
            op_features = given.pop("op_features", None) if init is not None else given.get("op_features")
            if init is not None:
                given.setdefault("stages", ("sim",))
                given.setdefault("search_evals", INIT_SEARCH_EVALS)
            if ignore_memory:
                given["memory_fraction"] = None
            cfg = set_fields(TrainConfig(**given), set_)
            cfg.check_lengths()  # (first: validate's own bound of these counts is pretraining's, far above)
            cfg.validate()
            shaped = [item for item in set_ if item.partition("=")[0].strip() in ("hidden", "mp_steps", "mlp_hidden")]
            if init is not None and shaped:
                raise UserError(f"--set {shaped[0]}: the policy's sizes come from the --init checkpoint: leave it out")
            if init is not None and "list_schedule" in options:
                raise UserError("--list-schedule comes from the --init checkpoint (its features were learned on that "
                                "model): leave it out")  # fmt: skip
            typed = _typed_options(ctx)
            trainer = _trainer(graph_paths, cluster_name, cfg, output, resume, init, op_features or cfg.op_features,
                               resume_episodes=options.get("episodes"))  # fmt: skip
            if resume:
                _check_resume_options(typed, trainer, cfg, output)
        if weights_path is not None:
            _real_oracle_with_weights(trainer, graph_paths, weights_path)
        if trainer.identity_left_out and not json_out:
            console.print(f"--init: the checkpoint's device identity ({trainer.identity_left_out} devices) was learned on "
                          "another cluster; it starts again at zero" if trainer.cfg.learns_device_identity else
                          f"--init: the checkpoint's device identity ({trainer.identity_left_out} devices) is left out",
                          highlight=False)  # fmt: skip
        t0 = time.perf_counter()
        with diverged_run(output, output if resume else init):
            _run_with_progress(trainer, output, quiet=json_out)
        elapsed = time.perf_counter() - t0
        summary = _summary(trainer, output, elapsed)
        if json_out:
            emit_json(summary)
        else:
            _print_summary(summary, trainer.tasks[0].cluster)


STAGE_LABELS = {"il": "Stage I  imitation", "sim": "Stage II simulator RL", "distill": "distil the best",
                "real": "Stage III real system"}  # fmt: skip


def _run_with_progress(trainer, run_dir: Path, quiet: bool) -> None:
    from doppler.report import format_time

    cl = trainer.tasks[0].cluster

    def describe(ev: Any) -> str:
        st = ev.stats
        if ev.task == "il":
            return f"{st['episodes_per_s']:.0f} ep/s  agreement SEL {st['agree_sel']:.0%} PLC {st['agree_plc']:.0%}"
        if ev.task in ("sim", "real"):
            return f"{st['episodes_per_s']:.0f} ep/s  mean {st['mean_ratio']:.3f}x LB  best {format_time(st['best_makespan_s'], cl)}"
        status = f"greedy {st['greedy_ratio']:.3f}x LB, best {st['best_ratio']:.3f}x LB"
        if ev.done >= ev.total and st["greedy_ratio"] <= st["best_ratio"] * (1 + 1e-9):
            status += " (matched)"
        return status

    with live_progress(describe, labels=STAGE_LABELS, counts=True, quiet=quiet, keep=True) as on_progress:
        trainer.run(run_dir, on_progress)


def _summary(trainer, run_dir: Path, elapsed_s: float) -> dict[str, Any]:
    from doppler.methods import assign
    from doppler.report import training_curve
    from doppler.sim import simulate

    graphs = []
    refs: dict[str, float] = {}
    real = trainer.real_episode > 0
    for task in trainer.tasks:
        devices, oracle_s = trainer.greedy(task)
        greedy_s = simulate(task.graph, task.cluster, devices).makespan_s
        cp_devices = assign(task.graph, task.cluster, "critical_path", ignore_memory=True)
        cp = simulate(task.graph, task.cluster, cp_devices).makespan_s
        graphs.append({
            "graph": task.graph.name,
            "num_ops": task.graph.num_ops,
            "greedy_makespan_s": greedy_s,
            "greedy_measured_makespan_s": oracle_s if real else None,
            "best_makespan_s": task.best_makespan_s if task.best_assignment is not None else None,
            "critical_path_makespan_s": cp,
            "lower_bound_s": task.lower_bound_s,
        })  # fmt: skip
        if len(trainer.tasks) == 1:
            refs = {"critical_path": cp / task.lower_bound_s, f"{trainer.cfg.method} greedy (end)": greedy_s / task.lower_bound_s}
    curve = run_dir / "training_curve.png"
    training_curve(trainer.history, curve, title=f"{trainer.cfg.method} on {', '.join(g['graph'] for g in graphs)}", references=refs)
    return {
        "run_dir": str(run_dir),
        "checkpoint": str(run_dir / "checkpoint.pt"),
        "training_curve": str(curve),
        "il_episodes": trainer.il_episode,
        "episodes": trainer.episode,
        "real_episodes": trainer.real_episode,
        "elapsed_s": elapsed_s,
        "device_identity": bool(trainer.cfg.device_identity),
        "device_identity_left_out": trainer.identity_left_out,  # --init: the checkpoint's, learned on another cluster
        "graphs": graphs,
    }


def _print_summary(s: dict[str, Any], cl) -> None:
    from doppler.report import format_time

    real = f" + {s['real_episodes']} real-system" if s["real_episodes"] else ""
    console.print(f"trained {s['il_episodes']} imitation + {s['episodes']} RL{real} episodes in {s['elapsed_s']:.1f} s "
                  f"-> {s['checkpoint']}", highlight=False)  # fmt: skip
    for g in s["graphs"]:
        best = f", best sampled {format_time(g['best_makespan_s'], cl)}" if g["best_makespan_s"] is not None else ""
        if s["real_episodes"] > 0:
            best = (f" (measured {format_time(g['greedy_measured_makespan_s'], cl)})"
                    + best.replace("best sampled", "best measured"))  # fmt: skip
        console.print(
            f"  {g['graph']} ({g['num_ops']} ops): greedy {format_time(g['greedy_makespan_s'], cl)}{best}; "
            f"critical_path {format_time(g['critical_path_makespan_s'], cl)}; "
            f"lower bound {format_time(g['lower_bound_s'], cl)}",
            highlight=False,
        )
    console.print(f"training curve: {s['training_curve']}", highlight=False)
