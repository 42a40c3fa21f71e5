"""``doppler train``: Stage I (imitation) and Stage II (simulator RL) of DOPPLER."""

import time
from pathlib import Path
from typing import Any, Optional

import typer

from doppler.cli._common import (JSON_OPT, MEMORY_FRACTION_OPT, UserError, app, as_user_error, console, emit_json,
                                 handle_errors, hold_outputs, live_progress)  # fmt: skip


def _parse_stages(stages: str) -> tuple[str, ...]:
    from doppler.train import STAGES

    out = tuple(s.strip() for s in stages.split(",") if s.strip())
    bad = [s for s in out if s not in STAGES]
    if bad or not out:
        raise UserError(f"unknown stage {bad[0] if bad else stages!r} in --stages (use a comma list of: {', '.join(STAGES)})")
    return out


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


def _typed_options(ctx: typer.Context) -> dict[str, Any]:
    """The command's parameters the user gave (on the command line or from the environment), by name."""
    return {p.name: p for p in ctx.command.params
            if getattr(ctx.get_parameter_source(p.name), "name", None) in ("COMMANDLINE", "ENVIRONMENT")}  # fmt: skip


def _check_resume_options(typed: dict[str, Any], trainer, cfg, run_dir: Path) -> None:
    """``--resume`` continues a run as it was configured: an option typed on the command line (``typed``) that
    differs from the run's own is refused (it would be ignored), and so is ``--episodes`` below the Stage II
    episodes the run has already done."""
    from doppler.train.config import RUN_OPTIONS

    for name, field in RUN_OPTIONS.items():
        if name == "episodes":  # (it may extend Stage II: below)
            continue
        mine, theirs = getattr(cfg, field), getattr(trainer.cfg, field)
        if isinstance(mine, (list, tuple)) and isinstance(theirs, (list, tuple)):
            mine, theirs = tuple(mine), tuple(theirs)
        if name in typed and mine != theirs:
            p = typed[name]
            given = (p.opts[0] if mine else p.secondary_opts[0]) if isinstance(mine, bool) else f"{p.opts[0]} {mine}"
            raise UserError(f"--resume continues {run_dir} as it was configured: {given} differs from the run's "
                            f"{theirs} (leave it out, or start a new run with another -o)")  # fmt: skip
    if "set_" in typed:
        raise UserError(f"--resume continues {run_dir} as it was configured: leave out --set")
    if "episodes" in typed and cfg.episodes < trainer.episode:
        raise UserError(f"--episodes {cfg.episodes}: the run in {run_dir} has already done {trainer.episode} Stage II "
                        "episodes (--resume can only extend it)")  # fmt: skip


def _trainer(graph_paths: list[Path], cluster_name: str, cfg, run_dir: Path, resume: bool, init: str | None = None,
             op_features: str | None = None, resume_episodes: int | None = None):  # fmt: skip
    from doppler.formats import load_graph
    from doppler.presets import cluster
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


@app.command("train")
def train_cmd(
    ctx: typer.Context,
    graph_paths: list[Path] = typer.Argument(..., metavar="G...", help="Training graph file(s) (.json or .txt)."),
    cluster_name: str = typer.Option(..., "--cluster", "-c", help="Cluster preset (e.g. p100x4, unit:8) or JSON file."),
    stages: Optional[str] = typer.Option(None, "--stages", help="Comma list of stages: il (imitation), sim (simulator RL), real (RL on measured runs) (default: il,sim; with --init: sim)."),
    episodes: int = typer.Option(4000, "--episodes", help="Stage II episodes (paper: 4000; 8000 for LLaMA graphs), all graphs together; rounded up to whole updates of --batch episodes per graph."),
    il_episodes: Optional[int] = typer.Option(None, "--il-episodes", help="Stage I episodes (default: 1024), rounded up to whole updates."),
    batch: Optional[int] = typer.Option(None, "--batch", help="Episodes per graph per update, sharing one encoder pass (default: 8)."),
    method: str = typer.Option("doppler", "--method", "-m", help="doppler (SEL and PLC learned); a single-head ablation: doppler_sel (PLC: earliest start), doppler_plc (SEL: largest b-level); or a learned baseline: single_policy (one softmax over op x device pairs), gdp (GraphSAGE + transformer, one shot), placeto (re-embeds at every step)."),
    teacher: str = typer.Option("critical_path", "--teacher", help="Stage I PLC teacher: critical_path (the list-schedule rule, on the states the policy visits), or a method whose assignment is cloned: heft, heft_lookahead (at most 10 s), enumerative, anneal (10 s)."),
    list_schedule: Optional[str] = typer.Option(None, "--list-schedule", help="List-schedule model of DOPPLER's PLC device features and Stage I rule: critical_path (ops append to a device; earliest start) or heft (ops fill idle gaps; earliest finish) (default: critical_path; with --init: the checkpoint's)."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="REINFORCE baseline: running, mean, loo (default: loo)."),
    self_improve: Optional[float] = typer.Option(None, "--self-improve", help="Weight of the best-so-far imitation term, 0: off (default: 1.0)."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    warm_start: Optional[str] = typer.Option(None, "--warm-start", help="Comma list of methods whose best assignment Stage II starts improving from, or 'none' (default: critical_path,heft,metis,enumerative,round_robin_block)."),
    search_every: Optional[int] = typer.Option(None, "--search-every", help="Stage II episodes between local searches (simulated annealing) from the best assignment so far, which the policy then imitates; 0: off (default: 500)."),
    distill_on_policy: Optional[float] = typer.Option(None, "--distill-on-policy", help="Weight of distillation's second term: the best assignment's device for each op, in the states the greedy decode itself visits (DAgger), so that one early mistake does not lead it off the best trajectory for good; 0: off (default: 1 with device identity, which doppler and doppler_plc learn by default; 0 with --no-device-identity or for other methods, where the device head cannot tell alike devices apart and the term fights the replay)."),
    search_evals: Optional[int] = typer.Option(None, "--search-evals", help="Simulator evaluations per local search (default: 20000; with --init: 100000)."),
    real_episodes: Optional[int] = typer.Option(None, "--real-episodes", help="Stage III episodes, each a measured run (default: 64), rounded up to whole updates of --batch per graph."),
    engine: str = typer.Option("local", "--engine", help="Stage III engine: local or dask (devices: the cluster's count)."),
    engine_device_type: str = typer.Option("cpu", "--device-type", help="Stage III devices of the local engine: cpu or cuda."),
    device: str = typer.Option("cpu", "--device", help="Where the networks run: cpu or cuda (rollouts and the simulator stay on the CPU)."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch intra-op threads (default: 2; give 1 when two trainings share a 2-core machine: with 2 each they oversubscribe it and run far slower)."),
    output: Path = typer.Option(..., "-o", "--output", help="Run directory (checkpoint, config, best assignment, TensorBoard)."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the output directory exactly, with its own options; --episodes may extend Stage II."),
    op_features: Optional[str] = typer.Option(None, "--op-features", help="Static op features: full (with block coordinates and op ids: one graph's positions; the policy then serves its own graphs only, on any cluster) or structural (position-free: serves any graph) (default: full; with --init, a structural checkpoint is widened to it, the new inputs starting at zero weight: distillation needs identical tiles told apart)."),
    init: Optional[str] = typer.Option(None, "--init", help="Fine-tune from 'pretrained' (the shipped policy) or a checkpoint file (skips Stage I unless --stages says otherwise)."),
    device_identity: Optional[bool] = typer.Option(None, "--device-identity/--no-device-identity", help="DOPPLER's device head learns a state for each device of this cluster (starting at zero), so that it can tell apart devices that differ only by their links (v100x8) and decode the best assignment it was taught; on any other cluster the policy decodes without them (default: on where the device head is learned: doppler, doppler_plc)."),
    memory_fraction: float = MEMORY_FRACTION_OPT,
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
        from doppler.train.config import INIT_SEARCH_EVALS, TrainConfig, TrainError, set_fields

        with as_user_error(TrainError, CheckpointError):
            given = {"op_features": op_features if init is None else None, "il_episodes": il_episodes, "batch": batch, "baseline": baseline, "self_improve_coef": self_improve,
                     "distill_on_policy": distill_on_policy,
                     "real_episodes": real_episodes, "search_every": search_every, "torch_threads": threads,
                     "search_evals": search_evals if search_evals is not None or init is None else INIT_SEARCH_EVALS,
                     "sim_seed_methods": None if warm_start is None else
                     tuple(m.strip() for m in warm_start.split(",") if m.strip() and m.strip() != "none")}  # fmt: skip
            if init is not None and resume:
                raise UserError("--init starts a new run from a policy; --resume continues a run: give one of them")
            if stages is not None and not stages.strip():
                raise UserError("--stages is empty (use a comma list of: il, sim, real)")
            stages = stages or ("sim" if init is not None else "il,sim")
            cfg = TrainConfig(stages=_parse_stages(stages), episodes=episodes, teacher=teacher, method=method, seed=seed, engine=engine,
                              list_schedule=list_schedule or "critical_path",
                              engine_device_type=engine_device_type, device=device, device_identity=device_identity,
                              memory_fraction=None if ignore_memory else memory_fraction,
                              **{k: v for k, v in given.items() if v is not None})  # fmt: skip
            cfg = set_fields(cfg, set_)
            cfg.validate()
            shaped = [item for item in set_ if item.partition("=")[0].strip() in ("hidden", "mp_steps", "mlp_hidden")]
            if init is not None and shaped:
                raise UserError(f"--set {shaped[0]}: the policy's sizes come from the --init checkpoint: leave it out")
            if init is not None and list_schedule is not None:
                raise UserError("--list-schedule comes from the --init checkpoint (its features were learned on that "
                                "model): leave it out")  # fmt: skip
            typed = _typed_options(ctx)
            trainer = _trainer(graph_paths, cluster_name, cfg, output, resume, init, op_features or cfg.op_features,
                               resume_episodes=episodes if "episodes" in typed else None)  # fmt: skip
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
