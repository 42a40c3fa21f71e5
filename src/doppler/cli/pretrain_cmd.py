"""``doppler pretrain``: train one transferable policy on the corpus of (graph, cluster) pairs."""

import time
from pathlib import Path
from typing import Any, Optional

import typer

from doppler.cli._common import (JSON_OPT, UserError, app, as_user_error, console, emit_json, handle_errors,
                                 config_options, hold_outputs, live_progress)  # fmt: skip
from doppler.train.config import command_options, pretrain_config


#: the options of ``doppler pretrain`` that set fields of its configuration, with pretraining's defaults
PRETRAIN_OPTIONS = command_options("pretrain", pretrain_config())


@app.command("pretrain")
@config_options(PRETRAIN_OPTIONS)
def pretrain_cmd(
    ctx: typer.Context,
    output: Path = typer.Option(..., "-o", "--output", help="Run directory (checkpoint, config, TensorBoard)."),
    budget_h: Optional[float] = typer.Option(None, "--budget-h", help="Training time in hours (Stage I for all of it by default; a Stage II learning rate decays over it) (default: 1; with --resume, the run's own)."),
    options: dict[str, Any] = {},  # noqa: B006  (the TrainConfig fields' options, @config_options)
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes that train side by side, each on its own fresh pairs, their gradients averaged every update (data-parallel; default: 1; with --resume, the run's own count, and another count keeps the streams of the workers in both). Each holds a core: at most the cores doppler may use. A worker that has not joined within 180 s, or a gradient exchange that waits over 600 s, ends the run."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in the output directory (same corpus stream)."),
    init: Optional[str] = typer.Option(None, "--init", help="Start from 'pretrained' (the shipped policy) or a pretraining checkpoint: Stage II on new pairs, the device head breaking only HEFT's ties, as zero-shot decoding does (no Stage I, no search)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Pretrain a DOPPLER policy on random graphs and clusters, for zero-shot use on new ones."""
    with handle_errors():
        from doppler.policy.checkpoint import RUN_DIR_MEMBERS

        # one writer (worker 0, this process), no member a link: before torch is imported
        hold_outputs(ctx, dirs={"": output}, members=RUN_DIR_MEMBERS)
        from doppler.methods.threads import usable_cores
        from doppler.train.pretrain import MAX_BUDGET_H
        from doppler.train.pretrain_parallel import Recipe, run_workers
        from doppler.policy.checkpoint import CheckpointError
        from doppler.cli.train_cmd import diverged_run
        from doppler.train import TrainError

        if budget_h is not None and (not budget_h > 0 or budget_h > MAX_BUDGET_H):
            raise UserError(f"--budget-h must be in (0, {MAX_BUDGET_H:g}] hours, got {budget_h:g}")
        budget_s = None if budget_h is None else budget_h * 3600  # None: a resumed run's own, else 1 h
        cores = usable_cores()

        def check_workers(n: int, why: str = "") -> None:
            if not 1 <= n <= cores:
                raise UserError(f"--workers must be between 1 and the {cores} cores doppler may use here, got {n}"
                                f"{why} (each worker holds a core; more run slower, not faster)")  # fmt: skip

        if workers is not None:
            check_workers(workers)
        ckpt = output / "checkpoint.pt"
        with as_user_error(TrainError, CheckpointError):
            run = {k: options.get(k, getattr(pretrain_config(), k)) for k in ("device", "seed", "torch_threads")}
            overrides = {k: v for k, v in options.items() if k in ("list_schedule", "il_lr")}
            flag = "--" + next(iter(overrides)).replace("_", "-") if overrides else None
            if init is not None and (resume or flag):
                raise UserError(f"--init with {'--resume' if resume else flag}: an --init run takes its configuration "
                                "from the checkpoint (--resume continues a run in -o)")  # fmt: skip
            per_update = {k: v for k, v in options.items() if k == "pairs_per_update"}
            if resume:
                if flag or per_update:
                    raise UserError(f"{flag or '--pairs-per-update'} with --resume: a resumed run keeps its own "
                                    "configuration")  # fmt: skip
                if not ckpt.is_file():
                    raise UserError(f"{ckpt}: no checkpoint to resume from")
                recipe = Recipe("resume", budget_s, path=str(output))
            elif ckpt.exists():
                raise UserError(f"{output} already holds a run (use --resume to continue it, or another -o)")
            if init is not None:
                from doppler.policy.checkpoint import resolve_checkpoint

                path, _ = resolve_checkpoint(None if init == "pretrained" else init)
                recipe = Recipe("init", budget_s or 3600.0, path=str(path), seed=run["seed"],
                                overrides=dict(device=run["device"], torch_threads=run["torch_threads"], **per_update))  # fmt: skip
            elif not resume:
                recipe = Recipe("create", budget_s or 3600.0, cfg=pretrain_config(**run, **overrides, **per_update))
            pt = recipe.build(0)
            if resume and workers is None:  # the run's own count; another one keeps the streams of the workers in both
                workers = pt.saved_workers
                check_workers(workers, " (the run's own count; give --workers to resume it with fewer)")
        t0 = time.perf_counter()
        ref = "HEFT" if pt.cfg.sim_seed_methods == ("heft",) else "best cheap"

        def describe(ev) -> str:
            st = ev.stats
            quality = (f"greedy {st['greedy_vs_cheap']:.3f}x {ref}" if "greedy_vs_cheap" in st
                       else f"imitation: PLC agreement {st.get('agree_plc', 0):.0%}")  # fmt: skip
            k = pt.cfg.pairs_per_update
            pairs = f"{st['num_ops']} ops x {st['num_devices']} devices" if k == 1 else \
                f"{k} pairs: {st['num_ops']} ops, up to {st['num_devices']} devices"
            on = f"worker 0 of {workers}: " if workers > 1 else ""
            return f"update {st['update']}  {on}{pairs}  {quality}"

        workers = workers or 1
        in_sync = True
        episodes_before = pt.trainer.episode if pt.init is not None and not resume else 0  # --init: the policy's own
        with live_progress(describe, labels={"pretrain": "pretraining"}, quiet=json_out, keep=True) as on_progress:
            if workers > 1:
                with as_user_error(TrainError):
                    in_sync = run_workers(pt, recipe, workers, output, on_progress)
            else:
                with diverged_run(output, output if resume else init):
                    pt.run(output, on_progress)
        summary = {"run_dir": str(output), "checkpoint": str(ckpt), "updates": pt.updates,
                   "il_episodes": pt.trainer.il_episode, "episodes": pt.trainer.episode,
                   "train_s": pt.elapsed_s, "elapsed_s": time.perf_counter() - t0, "workers": workers,
                   "pairs_per_update": pt.cfg.pairs_per_update * workers, "workers_in_sync": in_sync,
                   "episodes_this_run": pt.trainer.episode - episodes_before}  # fmt: skip
        if json_out:
            emit_json(summary)
        else:
            counts = (f"{summary['episodes_this_run']} RL episodes; with the --init policy's, {summary['il_episodes']} "
                      f"imitation + {summary['episodes']} RL episodes in all" if episodes_before else
                      f"{summary['il_episodes']} imitation + {summary['episodes']} RL episodes")  # fmt: skip
            console.print(f"pretrained {summary['updates']} updates ({counts}, {summary['train_s'] / 3600:.2f} h) -> {ckpt}",
                          highlight=False)  # fmt: skip
            if workers > 1:  # the episode counts above are worker 0's
                console.print(f"{workers} workers, {summary['pairs_per_update']} pairs per update; "
                              + ("every worker ended with the same weights" if in_sync else
                                 "[red]the workers' weights differ[/red]"), highlight=False)  # fmt: skip
