"""``doppler demo``: every method on the four paper workloads, the pretrained and a trained
DOPPLER policy, pictures of the best schedules, and the real engine on a small graph."""

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from doppler.cli._common import (JSON_OPT, UserError, app, console, emit_json, err_console, handle_errors, hold_outputs,
                                 live_progress)  # fmt: skip

if TYPE_CHECKING:
    from rich.table import Table

DEMO_METHODS = ("round_robin_block", "critical_path", "heft", "metis", "enumerative", "anneal")
ZERO_SHOT = "doppler zero-shot"


WORKLOADS = ("chainmm", "ffnn", "llama_block", "llama_layer")


@app.command("demo")
def demo_cmd(
    ctx: typer.Context,
    budget_s: float = typer.Option(5.0, "--budget-s", help="Search budget of anneal per workload (s)."),
    out_dir: Path = typer.Option(Path("out/demo"), "--out", "-o", help="Where to write graph pictures and Gantt charts."),
    cluster_name: str = typer.Option("p100x4", "--cluster", "-c", help="Cluster preset or JSON file."),
    train_episodes: int = typer.Option(1000, "--train-episodes", help="DOPPLER Stage II episodes per workload (0: skip DOPPLER)."),
    il_episodes: int = typer.Option(512, "--il-episodes", help="DOPPLER Stage I (imitation) episodes per workload."),
    engine: bool = typer.Option(True, "--engine/--no-engine", help="Also calibrate the local engine and execute a small graph for real."),
    json_out: bool = JSON_OPT,
) -> None:
    """End to end: train DOPPLER and run every baseline on the four paper workloads, simulate, draw the best schedules."""
    with handle_errors():
        from doppler.hardware.presets import cluster
        from doppler.util.progress import ProgressEvent

        from doppler.methods import MethodError, check_budget
        from doppler.train.config import MAX_EPISODES

        try:
            check_budget(budget_s)
        except MethodError as e:
            raise UserError(f"--budget-s: {e}") from None
        if not (0 <= train_episodes <= MAX_EPISODES and 1 <= il_episodes <= MAX_EPISODES):
            raise UserError(f"--train-episodes must be from 0 and --il-episodes from 1 to {MAX_EPISODES:,}, got "
                            f"{train_episodes}, {il_episodes}")  # fmt: skip
        methods = DEMO_METHODS + (ZERO_SHOT,) + (("doppler",) if train_episodes else ())
        cl = cluster(cluster_name)
        # made, locked and checked for links before minutes of work, not at the first picture
        hold_outputs(ctx, dirs={"": out_dir}, members=_demo_members(methods, train_episodes > 0, engine))
        with live_progress(lambda ev: ev.stats["step"]) as on_progress:
            steps = [0]

            def say(text: str, advance: int = 0) -> None:
                steps[0] += advance
                on_progress(ProgressEvent("demo", steps[0], len(WORKLOADS) * len(methods), "steps", {"step": text}))

            results = [_demo_workload(name, cl, budget_s, train_episodes, il_episodes, out_dir, say) for name in WORKLOADS]
        real = _engine_demo(out_dir, progress_console=err_console) if engine else None
        if json_out:
            emit_json({"cluster": cl.name, "anneal_budget_s": budget_s, "workloads": results, "engine": real})
            return
        console.print(_demo_table(results, methods, cl, train_episodes > 0))
        console.print(f"anneal: {budget_s:g} s of simulated annealing per workload. "
                      f"Graph pictures and Gantt charts of the best schedules are in {out_dir}/.", highlight=False)
        console.print(f"{ZERO_SHOT}: the pretrained policy shipped with doppler, greedy decode, never trained on "
                      "these graphs or this cluster.", highlight=False)
        if train_episodes:
            console.print(f"doppler: imitation + {train_episodes} simulator-RL episodes per workload, greedy decode; "
                          f"checkpoints and training curves in {out_dir}/doppler_*/.", highlight=False)
        if real is not None:
            _print_engine_demo(real)
        console.print("next: doppler graph build llama_layer -o g.json && "
                      "doppler compare g.json --cluster p100x4 --methods critical_path,heft,anneal", highlight=False)


def _demo_members(methods: tuple[str, ...], trained: bool, engine: bool) -> list[str]:
    """Every name the demo may write in its output directory (the Gantt chart: of the best method, any)."""
    from doppler.policy.checkpoint import RUN_DIR_MEMBERS

    out = []
    for name in WORKLOADS:
        out += [f"{name}_graph.png", *(f"{name}_gantt_{m}.png" for m in methods)]
        if trained:
            out += [f"doppler_{name}", *(f"doppler_{name}/{m}" for m in RUN_DIR_MEMBERS)]
    if engine:
        out += ["engine_cluster.json", *(f"ffnn_small_engine_gantt_{m}.png" for m in ENGINE_DEMO_METHODS)]
    return out


def _demo_workload(name: str, cl, budget_s: float, train_episodes: int, il_episodes: int, out_dir: Path, say) -> dict:
    """One workload of the demo: every method, the zero-shot and (optionally) a trained policy,
    the graph's picture and the best schedule's Gantt chart."""
    from doppler import workloads
    from doppler.methods import assign, compare, score
    from doppler.report import draw_graph, gantt
    from doppler.sim import simulate
    from doppler.train import TrainConfig, train_and_assign

    say(f"{name}: building the tile graph")
    graph = workloads.build(name)
    rows = compare(graph, cl, list(DEMO_METHODS), budget_s=budget_s,
                   on_progress=lambda ev: say(f"{name}: [bold]{ev.stats['method']}[/]", 0 if ev.done == 0 else 1))  # fmt: skip
    say(f"{name}: [bold]doppler[/], the shipped pretrained policy (zero-shot)")
    rows.append(score(graph, cl, assign(graph, cl, "doppler"), rows[0].lower_bound_s, ZERO_SHOT))
    say(f"{name}: [bold]doppler[/], the shipped pretrained policy (zero-shot)", 1)
    train = None
    if train_episodes:
        def on_train(ev) -> None:
            say(f"{name}: [bold]doppler[/] training, {ev.task} episode {ev.done:g}/{ev.total:g}")

        # (with device identity, the default: it lets distillation make the greedy decode reproduce the run's best)
        config = TrainConfig(episodes=train_episodes, il_episodes=il_episodes)
        train = train_and_assign(graph, cl, out_dir / f"doppler_{name}", config, on_train)
        rows.append(score(graph, cl, train["assignment"], rows[0].lower_bound_s))
        say(f"{name}: [bold]doppler[/] trained", 1)
    best = min(rows, key=lambda r: r.makespan_s)
    picture = out_dir / f"{name}_graph.png"
    chart = out_dir / f"{name}_gantt_{best.method}.png"
    draw_graph(graph, picture)
    trace = simulate(graph, cl, best.assignment, trace=True)
    gantt(graph, cl, trace, chart, title=f"{name} on {cl.name}, {best.method} assignment", lower_bound_s=best.lower_bound_s)
    return {"name": name, "num_ops": graph.num_ops, "num_edges": graph.num_edges,
            "total_flops": float(graph.flops.sum()), "lower_bound_s": best.lower_bound_s,
            "makespan_s": {r.method: r.makespan_s for r in rows},
            "best_method": best.method, "graph_png": str(picture), "gantt_png": str(chart),
            "doppler_train_s": train["train_s"] if train else None,
            "doppler_training_curve_png": str(train["training_curve"]) if train else None}  # fmt: skip


def _demo_table(results: list[dict], methods: tuple[str, ...], cl, trained: bool) -> "Table":
    """Makespan per method (rows) and workload (columns), the best per workload in green."""
    from rich.table import Table
    from rich.text import Text

    from doppler.report import time_unit

    scale, unit = time_unit(min(r["lower_bound_s"] for r in results), cl)
    table = Table(title=f"Simulated makespan ({unit}) on {cl.name}, work-conserving engine", caption="best per workload in green")
    table.add_column("method")
    for r in results:
        table.add_column(f"{r['name']}\n{r['num_ops']} ops", justify="right")
    table.add_row("lower bound", *(f"{r['lower_bound_s'] * scale:.2f}" for r in results), style="dim", end_section=True)
    for m in methods:
        cells = []
        for r in results:
            v, best = r["makespan_s"][m], min(r["makespan_s"].values())
            cells.append(Text(f"{v * scale:.2f}", style="bold green" if v == best else ""))
        table.add_row(m, *cells)
    table.add_row("best / critical_path",
                  *(f"{min(r['makespan_s'].values()) / r['makespan_s']['critical_path']:.3f}" for r in results),
                  style="bold", end_section=True)  # fmt: skip
    if trained:
        table.add_row("doppler training (s)", *(f"{r['doppler_train_s']:.0f}" for r in results), style="dim")
    return table


ENGINE_DEMO_METHODS = ("single", "round_robin", "critical_path", "metis")


def _engine_demo(out_dir: Path, progress_console) -> dict:
    """Calibrate the local engine (2 CPU devices), then execute ``ffnn`` (size small) under a few
    assignments for real, next to the simulator's prediction on the calibrated cluster."""
    from rich.status import Status

    from doppler import workloads
    from doppler.hardware.files import save_cluster
    from doppler.methods import assign
    from doppler.engine import RunOptions, build_program, run
    from doppler.engine.calibrate import calibrate
    from doppler.report import gantt
    from doppler.sim import simulate

    with Status("real engine: calibrating 2 CPU devices", console=progress_console):
        cal = calibrate(2, runs=2)
    cal_path = out_dir / "engine_cluster.json"
    save_cluster(cal.cluster, cal_path)
    graph = workloads.build("ffnn", size="small")
    program = build_program(graph)
    rows = []
    for m in ENGINE_DEMO_METHODS:
        with Status(f"real engine: executing ffnn (small) under {m}", console=progress_console):
            a = assign(graph, cal.cluster, m)
            res = run(graph, a, num_devices=2, program=program, options=RunOptions(repeats=3, warmup=1))
        sim = simulate(graph, cal.cluster, a, link_contention=True).makespan_s
        rows.append({"method": m, "measured_s": res.makespan_s, "simulated_s": sim, "trace": res.trace})
    best = min(rows, key=lambda r: r["measured_s"])
    chart = out_dir / f"ffnn_small_engine_gantt_{best['method']}.png"
    gantt(graph, cal.cluster, best["trace"], chart, title=f"ffnn (small) measured on the local engine, {best['method']}")
    return {"cluster": str(cal_path), "graph": f"ffnn (size=small, {graph.num_ops} ops)", "gantt_png": str(chart),
            "rows": [{k: v for k, v in r.items() if k != "trace"} for r in rows]}


def _print_engine_demo(real: dict) -> None:
    from rich.table import Table

    from doppler.report import format_time

    table = Table(title=f"Real engine: {real['graph']} on 2 local CPU devices (median of 3 runs)")
    for col in ("method", "measured", "simulated (calibrated)", "error"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for r in real["rows"]:
        err = (r["simulated_s"] - r["measured_s"]) / r["measured_s"] * 100
        table.add_row(r["method"], format_time(r["measured_s"]), format_time(r["simulated_s"]), f"{err:+.0f}%")
    console.print(table)
    console.print(f"calibrated cluster: {real['cluster']}; Gantt chart of the fastest measured run: {real['gantt_png']}",
                  highlight=False)
