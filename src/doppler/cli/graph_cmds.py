"""``doppler graph build|info|convert|draw`` and ``doppler demo``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from doppler.cli._common import UserError, app, console, emit_json, err_console, graph_app, handle_errors
from doppler.formats import load_graph, save_graph

JSON_OPT = typer.Option(False, "--json", help="Print exactly one JSON object on stdout.")


def _cluster_for(name: str, devices: int | None):
    """A cluster preset or file; with ``devices``, a homogeneous preset of that size."""
    from doppler.hardware import cluster

    if devices is not None:
        if devices < 1:
            raise UserError(f"--devices must be >= 1, got {devices}")
        if ":" in name or name.endswith(".json"):
            raise UserError("--devices cannot be combined with a cluster file or a 'name:N' cluster")
        return cluster(f"{name}:{devices}")
    return cluster(name)


@graph_app.command("build")
def build_cmd(
    workload: str = typer.Argument(..., help="chainmm | ffnn | llama_block | llama_layer | random"),
    output: Path = typer.Option(..., "-o", "--output", help="Graph file to write (.json or .txt)."),
    set_: list[str] = typer.Option([], "--set", help="Workload parameter key=value (repeatable), e.g. size=tiny."),
    devices: Optional[int] = typer.Option(None, "--devices", help="Intended device count, recorded in the graph."),
    json_out: bool = JSON_OPT,
) -> None:
    """Build a tile-decomposed workload graph and write it to a file."""
    with handle_errors():
        from doppler import workloads

        params = workloads.parse_set(set_, workload)
        t0 = time.perf_counter()
        graph = workloads.build(workload, **params)
        if devices is not None:
            if devices < 1:
                raise UserError(f"--devices must be >= 1, got {devices}")
            graph.meta["devices"] = devices
        save_graph(graph, output)
        elapsed = time.perf_counter() - t0
        stats = graph.summary()
        if json_out:
            emit_json({**stats, "path": str(output), "elapsed_s": elapsed})
        else:
            console.print(
                f"built [bold]{workload}[/]: {stats['num_ops']} ops, {stats['num_edges']} edges, "
                f"depth {stats['depth']}, {stats['total_flops']:.3g} FLOPs -> {output} ({elapsed:.2f} s)"
            )


@graph_app.command("import")
def import_cmd(
    source: str = typer.Argument(..., help="A factory 'package.module:function' or 'file.py:function' returning "
                                            "(module, example_inputs), or a torch.export program (.pt2)."),
    output: Path = typer.Option(..., "-o", "--output", help="Graph file to write (.json)."),
    input_shape: list[str] = typer.Option([], "--input-shape", help="NAME=DIMS, e.g. x=2x64x256: redraw a forward "
                                           "input at this shape (repeatable)."),
    dtype: str = typer.Option("float32", "--dtype", help="Element type the graph's bytes are counted in."),
    blocks: list[str] = typer.Option([], "--blocks", help="SIZE=K: split every axis of this size into K blocks, "
                                      "e.g. 4096=4 (repeatable)."),
    devices: Optional[int] = typer.Option(None, "--devices", help="Intended device count, recorded in the graph; "
                                          "without --blocks it also picks a tiling (weight dimensions split N ways)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Import a PyTorch model (torch.export) as a tile-level dataflow graph."""
    with handle_errors():
        from doppler.torch_import import GraphImportError, import_model, parse_blocks, parse_input_shapes

        if dtype not in ("float16", "bfloat16", "float32", "float64"):
            raise UserError(f"--dtype must be float16, bfloat16, float32 or float64, got {dtype!r}")
        if devices is not None and not 1 <= devices <= 4096:
            raise UserError(f"--devices must be in 1..4096, got {devices}")
        t0 = time.perf_counter()
        try:
            graph = import_model(source, input_shapes=parse_input_shapes(input_shape), blocks=parse_blocks(blocks),
                                 dtype=dtype, devices=devices)  # fmt: skip
        except GraphImportError as e:
            raise UserError(str(e)) from None
        save_graph(graph, output)
        elapsed = time.perf_counter() - t0
        stats = graph.summary()
        if json_out:
            emit_json({**stats, "path": str(output), "elapsed_s": elapsed, "blocks": graph.meta["params"]["blocks"]})
        else:
            tiling = ", ".join(f"{k}={v}" for k, v in graph.meta["params"]["blocks"].items()) or "untiled"
            console.print(f"imported [bold]{source}[/]: {stats['num_ops']} ops, {stats['num_edges']} edges, "
                          f"{stats['total_flops']:.3g} FLOPs ({tiling}) -> {output} ({elapsed:.2f} s)", highlight=False)


@graph_app.command("params")
def params_cmd(
    workload: Optional[str] = typer.Argument(None, help="A workload name; all workloads if omitted."),
    json_out: bool = JSON_OPT,
) -> None:
    """List the --set keys a workload accepts, with their value at each size."""
    with handle_errors():
        from doppler import workloads

        names = [workload] if workload else workloads.list_workloads()
        infos = [workloads.describe(n) for n in names]
        if json_out:
            emit_json(infos if workload is None else infos[0])
            return
        for info in infos:
            table = Table(title=f"{info['name']}: {info['description']}", title_justify="left")
            table.add_column("--set key")
            for size in ("paper", "small", "tiny"):
                table.add_column(f"size={size}" + (" (default)" if size == "paper" else ""), justify="right")
            for key, default in info["defaults"].items():
                table.add_row(key, str(default), *(str(info["presets"][s].get(key, default)) for s in ("small", "tiny")))
            console.print(table)


@graph_app.command("info")
def info_cmd(
    graph_path: Path = typer.Argument(..., metavar="G", help="Graph file (.json or .txt)."),
    devices: Optional[int] = typer.Option(None, "--devices", help="Device count for the lower bound."),
    cluster_name: str = typer.Option("unit", "--cluster", help="Cluster preset or JSON file for the lower bound."),
    json_out: bool = JSON_OPT,
) -> None:
    """Size, depth, total work, critical path and makespan lower bound of a graph."""
    with handle_errors():
        from doppler.simulate import lower_bound

        graph = load_graph(graph_path)
        if devices is None and ":" not in cluster_name and not cluster_name.endswith(".json"):
            devices = graph.meta.get("devices")
        cl = _cluster_for(cluster_name, devices)
        stats = graph.summary()
        stats["critical_path_ops"] = len(graph.critical_path())
        stats["cluster"] = cl.name
        stats["num_devices"] = cl.num_devices
        stats["lower_bound_s"] = lower_bound(graph, cl)
        if json_out:
            emit_json(stats)
            return
        console.print(str(graph_path), highlight=False, soft_wrap=True)  # not a table title: it would wrap
        table = Table(show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
        for key in ("name", "num_ops", "num_edges", "depth", "critical_path_ops"):
            table.add_row(key, str(stats[key]))
        table.add_row("total_flops", f"{stats['total_flops']:.4g}")
        table.add_row("critical_path_flops", f"{stats['critical_path_flops']:.4g}")
        table.add_row("total_output_bytes", f"{stats['total_output_bytes']:.4g}")
        table.add_row("ops_by_kind", ", ".join(f"{k} {v}" for k, v in stats["ops_by_kind"].items()))
        from doppler.report import format_time

        table.add_row(f"lower_bound ({cl.name})", format_time(stats["lower_bound_s"], cl))
        table.add_row("fingerprint", stats["fingerprint"])
        console.print(table)


@graph_app.command("convert")
def convert_cmd(
    input_path: Path = typer.Argument(..., metavar="IN", help="Graph file to read (.json or .txt)."),
    output_path: Path = typer.Argument(..., metavar="OUT", help="Graph file to write (.json or .txt)."),
    round_costs: bool = typer.Option(False, "--round", help="Round costs to integers (the text format needs integers)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Convert between the native JSON and the DOPPLER text format (by extension)."""
    with handle_errors():
        graph = load_graph(input_path)
        save_graph(graph, output_path, round_costs=round_costs)
        if json_out:
            emit_json({"input": str(input_path), "output": str(output_path), "num_ops": graph.num_ops,
                       "num_edges": graph.num_edges, "fingerprint": graph.fingerprint()})
        else:
            console.print(f"{input_path} -> {output_path} ({graph.num_ops} ops, {graph.num_edges} edges)")


@graph_app.command("draw")
def draw_cmd(
    graph_path: Path = typer.Argument(..., metavar="G", help="Graph file (.json or .txt)."),
    output: Path = typer.Option(..., "-o", "--output", help="Image to write (.png, .svg, .pdf, .jpg, ...: by extension)."),
    max_ops: int = typer.Option(5000, "--max-ops", help="Refuse to draw larger graphs."),
) -> None:
    """Draw a graph as a layered picture, ops coloured by kind."""
    with handle_errors():
        from doppler.report import draw_graph, figure_format

        figure_format(output)  # an unsupported extension fails before any work
        graph = load_graph(graph_path)
        if graph.num_ops > max_ops:
            raise UserError(f"{graph_path}: {graph.num_ops} ops is too many to draw legibly (limit --max-ops {max_ops})")
        draw_graph(graph, output)
        err_console.print(f"wrote {output}")


DEMO_METHODS = ("round_robin_block", "critical_path", "heft", "metis", "enumerative", "anneal")
ZERO_SHOT = "doppler zero-shot"


@app.command("demo")
def demo_cmd(
    budget_s: float = typer.Option(5.0, "--budget-s", help="Search budget of anneal per workload (s)."),
    out_dir: Path = typer.Option(Path("out/demo"), "--out", help="Where to write graph pictures and Gantt charts."),
    cluster_name: str = typer.Option("p100x4", "--cluster", help="Cluster preset or JSON file."),
    train_episodes: int = typer.Option(1000, "--train-episodes", help="DOPPLER Stage II episodes per workload (0: skip DOPPLER)."),
    il_episodes: int = typer.Option(512, "--il-episodes", help="DOPPLER Stage I (imitation) episodes per workload."),
    engine: bool = typer.Option(True, "--engine/--no-engine", help="Also calibrate the local engine and execute a small graph for real."),
    json_out: bool = JSON_OPT,
) -> None:
    """End to end: train DOPPLER and run every baseline on the four paper workloads, simulate, draw the best schedules."""
    with handle_errors():
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        from doppler import workloads
        from doppler.baselines import compare
        from doppler.hardware import cluster
        from doppler.report import draw_graph, gantt, time_unit
        from doppler.simulate import simulate

        if not budget_s > 0:
            raise UserError(f"--budget-s must be > 0, got {budget_s}")
        if train_episodes < 0 or il_episodes < 1:
            raise UserError(f"--train-episodes must be >= 0 and --il-episodes >= 1, got {train_episodes}, {il_episodes}")
        from doppler.cli.train_cmd import train_and_assign
        from doppler.simulate import lower_bound
        from doppler.train import TrainConfig

        from doppler.baselines import assign

        methods = DEMO_METHODS + (ZERO_SHOT,) + (("doppler",) if train_episodes else ())
        cl = cluster(cluster_name)
        names = ("chainmm", "ffnn", "llama_block", "llama_layer")
        results = []
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True, disable=not err_console.is_terminal) as progress:
            task = progress.add_task("demo", total=len(names) * len(methods))
            for name in names:
                progress.update(task, description=f"{name}: building the tile graph")
                graph = workloads.build(name)

                def on_method(m: str, name: str = name) -> None:
                    progress.update(task, description=f"{name}: [bold]{m}[/]")
                    progress.advance(task, 0 if m == DEMO_METHODS[0] else 1)

                rows = compare(graph, cl, list(DEMO_METHODS), budget_s=budget_s, on_method=on_method)
                progress.update(task, description=f"{name}: [bold]doppler[/], the shipped pretrained policy (zero-shot)")
                zero_shot = assign(graph, cl, "doppler")
                rows.append({"method": ZERO_SHOT, "assignment": zero_shot,
                             "makespan_s": float(simulate(graph, cl, zero_shot).makespan_s),
                             "lower_bound_s": float(lower_bound(graph, cl))})  # fmt: skip
                progress.advance(task)
                train = None
                if train_episodes:
                    def on_train(st: dict, name: str = name) -> None:
                        progress.update(task, description=f"{name}: [bold]doppler[/] training, {st['stage']} "
                                        f"episode {st['episode']}/{st['total']}")  # fmt: skip

                    train = train_and_assign(graph, cl, out_dir / f"doppler_{name}",
                                             TrainConfig(episodes=train_episodes, il_episodes=il_episodes), on_train)  # fmt: skip
                    rows.append({"method": "doppler", "assignment": train["assignment"],
                                 "makespan_s": float(simulate(graph, cl, train["assignment"]).makespan_s),
                                 "lower_bound_s": float(lower_bound(graph, cl))})  # fmt: skip
                    progress.advance(task)
                best = min(rows, key=lambda r: r["makespan_s"])
                picture = out_dir / f"{name}_graph.png"
                chart = out_dir / f"{name}_gantt_{best['method']}.png"
                draw_graph(graph, picture)
                trace = simulate(graph, cl, best["assignment"], trace=True)
                gantt(graph, cl, trace, chart, title=f"{name} on {cl.name}, {best['method']} assignment",
                      lower_bound_s=best["lower_bound_s"])
                results.append({"name": name, "num_ops": graph.num_ops, "num_edges": graph.num_edges,
                                "total_flops": float(graph.flops.sum()), "lower_bound_s": best["lower_bound_s"],
                                "makespan_s": {r["method"]: r["makespan_s"] for r in rows},
                                "best_method": best["method"], "graph_png": str(picture), "gantt_png": str(chart),
                                "doppler_train_s": train["train_s"] if train else None,
                                "doppler_training_curve_png": str(train["training_curve"]) if train else None})
        real = _engine_demo(out_dir, progress_console=err_console) if engine else None
        if json_out:
            emit_json({"cluster": cl.name, "anneal_budget_s": budget_s, "workloads": results, "engine": real})
            return
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
                cells.append(f"[bold green]{v * scale:.2f}[/]" if v == best else f"{v * scale:.2f}")
            table.add_row(m, *cells)
        table.add_row("best / critical_path",
                      *(f"{min(r['makespan_s'].values()) / r['makespan_s']['critical_path']:.3f}" for r in results),
                      style="bold", end_section=True)
        if train_episodes:
            table.add_row("doppler training (s)", *(f"{r['doppler_train_s']:.0f}" for r in results), style="dim")
        console.print(table)
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


ENGINE_DEMO_METHODS = ("single", "round_robin", "critical_path", "metis")


def _engine_demo(out_dir: Path, progress_console) -> dict:
    """Calibrate the local engine (2 CPU devices), then execute ``ffnn`` (size small) under a few
    assignments for real, next to the simulator's prediction on the calibrated cluster."""
    from rich.status import Status

    from doppler import workloads
    from doppler.baselines import assign
    from doppler.engine import build_program, run
    from doppler.engine.calibrate import calibrate
    from doppler.report import gantt
    from doppler.simulate import simulate

    with Status("real engine: calibrating 2 CPU devices", console=progress_console):
        cal = calibrate(2, runs=2)
    cal_path = out_dir / "engine_cluster.json"
    cal.cluster.save(cal_path)
    graph = workloads.build("ffnn", size="small")
    program = build_program(graph)
    rows = []
    for m in ENGINE_DEMO_METHODS:
        with Status(f"real engine: executing ffnn (small) under {m}", console=progress_console):
            a = assign(graph, cal.cluster, m)
            res = run(graph, a, num_devices=2, program=program, repeats=3, warmup=1)
        sim = simulate(graph, cal.cluster, a, link_contention=True).makespan_s
        rows.append({"method": m, "measured_s": res.makespan_s, "simulated_s": sim, "trace": res.trace})
    best = min(rows, key=lambda r: r["measured_s"])
    chart = out_dir / f"ffnn_small_engine_gantt_{best['method']}.png"
    gantt(graph, cal.cluster, best["trace"], chart, title=f"ffnn (small) measured on the local engine, {best['method']}")
    return {"cluster": str(cal_path), "graph": f"ffnn (size=small, {graph.num_ops} ops)", "gantt_png": str(chart),
            "rows": [{k: v for k, v in r.items() if k != "trace"} for r in rows]}


def _print_engine_demo(real: dict) -> None:
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
