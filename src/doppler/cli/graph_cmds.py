"""``doppler graph build|info|convert|draw`` and ``doppler demo``."""

import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.markup import escape

from doppler.cli._common import (GRAPH_ARG,
    JSON_OPT, MEMORY_FRACTION_OPT, UserError, as_user_error, console, emit_json,
                                 err_console, graph_app, handle_errors, hold_outputs)  # fmt: skip
from doppler.ir.formats import load_graph, save_graph
from doppler.ir.analysis import critical_path, summary



def _cluster_for(name: str, devices: int | None):
    """A cluster preset or file; with ``devices``, a homogeneous preset of that size."""
    from doppler.hardware.presets import cluster

    if devices is not None:
        if devices < 1:
            raise UserError(f"--devices must be >= 1, got {devices}")
        if ":" in name or name.endswith(".json"):
            raise UserError("--devices cannot be combined with a cluster file or a 'name:N' cluster")
        return cluster(f"{name}:{devices}")
    return cluster(name)


@graph_app.command("build")
def build_cmd(
    ctx: typer.Context,
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
        hold_outputs(ctx, files={"--output": output}, inputs={})  # before the build, which can take seconds
        t0 = time.perf_counter()
        graph = workloads.build(workload, **params)
        if devices is not None:
            if devices < 1:
                raise UserError(f"--devices must be >= 1, got {devices}")
            graph.meta["devices"] = devices
        save_graph(graph, output)
        elapsed = time.perf_counter() - t0
        stats = summary(graph)
        if json_out:
            emit_json({**stats, "path": str(output), "elapsed_s": elapsed})
        else:
            console.print(
                f"built [bold]{workload}[/]: {stats['num_ops']} ops, {stats['num_edges']} edges, "
                f"depth {stats['depth']}, {stats['total_flops']:.3g} FLOPs -> {escape(str(output))} ({elapsed:.2f} s)",
                markup=True,
            )


@graph_app.command("import")
def import_cmd(
    ctx: typer.Context,
    source: str = typer.Argument(..., help="A factory 'package.module:function' or 'file.py:function' returning "
                                            "(module, example_inputs), or a torch.export program (.pt2)."),
    output: Path = typer.Option(..., "-o", "--output", help="Graph file to write (.json)."),
    input_shape: list[str] = typer.Option([], "--input-shape", help="NAME=DIMS, e.g. x=2x64x256: redraw a forward "
                                           "input at this shape (repeatable)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="Element type the graph's bytes are counted in "
                                        "(default: the model parameters' own)."),
    blocks: list[str] = typer.Option([], "--blocks", help="SIZE=K: split every axis of this size into K blocks, "
                                      "e.g. 4096=4 (repeatable)."),
    devices: Optional[int] = typer.Option(None, "--devices", help="Intended device count, recorded in the graph; "
                                          "without --blocks it also picks a tiling (weight dimensions split N ways)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Import a PyTorch model (torch.export) as a tile-level dataflow graph."""
    with handle_errors():
        from doppler.importer import GraphImportError, import_model, parse_blocks, parse_input_shapes

        if dtype not in (None, "float16", "bfloat16", "float32", "float64"):
            raise UserError(f"--dtype must be float16, bfloat16, float32 or float64, got {dtype!r}")
        from doppler.hardware.cluster import MAX_DEVICES

        if devices is not None and not 1 <= devices <= MAX_DEVICES:
            raise UserError(f"--devices must be in 1..{MAX_DEVICES} (the largest cluster), got {devices}")
        # a factory's file ('file.py:function') or a .pt2 program is an input the output must not replace
        hold_outputs(ctx, files={"--output": output},
                     inputs={"SOURCE": source.rsplit(":", 1)[0] if ":" in source else source})  # fmt: skip
        t0 = time.perf_counter()
        with as_user_error(GraphImportError):
            graph = import_model(source, input_shapes=parse_input_shapes(input_shape), blocks=parse_blocks(blocks),
                                 dtype=dtype, devices=devices)  # fmt: skip
        save_graph(graph, output)
        elapsed = time.perf_counter() - t0
        stats = summary(graph)
        if json_out:
            emit_json({**stats, "path": str(output), "elapsed_s": elapsed, "blocks": graph.meta["params"]["blocks"]})
        else:
            tiling = ", ".join(f"{k}={v}" for k, v in graph.meta["params"]["blocks"].items()) or "untiled"
            console.print(f"imported [bold]{escape(str(source))}[/]: {stats['num_ops']} ops, {stats['num_edges']} edges, "
                          f"{stats['total_flops']:.3g} FLOPs ({escape(tiling)}) -> {escape(str(output))} ({elapsed:.2f} s)",
                          markup=True, highlight=False)  # fmt: skip


@graph_app.command("params")
def params_cmd(
    workload: Optional[str] = typer.Argument(None, help="A workload name; all workloads if omitted."),
    json_out: bool = JSON_OPT,
) -> None:
    """List the --set keys a workload accepts, with their value at each size."""
    from rich.table import Table

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
    graph_path: Path = GRAPH_ARG,
    devices: Optional[int] = typer.Option(None, "--devices", help="Device count for the lower bound."),
    cluster_name: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster preset or JSON file for the "
                                               "lower bound (default: unit, with the graph's recorded device count)."),
    memory_fraction: float = MEMORY_FRACTION_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Size, depth, total work, critical path and makespan lower bound of a graph; its weights against the
    cluster's memory budget; with --cluster, per op kind and dtype, how many ops are compute-bound and
    memory-bound there and the rates they achieve."""
    from rich.table import Table

    with handle_errors():
        from doppler.sim import lower_bound

        graph = load_graph(graph_path)
        typed = cluster_name is not None
        if cluster_name is None:  # the graph's own device count applies only to the default cluster, never to one typed
            cluster_name, devices = "unit", devices if devices is not None else graph.meta.get("devices")
        cl = _cluster_for(cluster_name, devices)
        stats = summary(graph)
        stats["critical_path_ops"] = len(critical_path(graph))
        stats["cluster"] = cl.name
        stats["num_devices"] = cl.num_devices
        stats["lower_bound_s"] = lower_bound(graph, cl)
        from doppler import memory

        with as_user_error(memory.MemoryBudgetError):
            budget = memory.budget_bytes(cl, memory_fraction)
        stats["weight_bytes"] = memory.weight_bytes(graph)
        stats["memory_budget_bytes"] = None if np.isinf(budget).any() else float(budget.sum())
        stats["weights_fit"] = bool(stats["weight_bytes"] <= budget.sum())
        from doppler.methods.layered import layer_units, repeated_units

        if graph.op_modules()[0]:  # where ops record their modules: the layers that place whole
            repeats = repeated_units(graph)
            stats["layer_units"] = len(layer_units(graph, max_units=None)[0])
            stats["repeated_layers"] = len(repeats)
            stats["ops_per_repeated_layer"] = int(repeats[0].size) if repeats else 0
        stats["cost_only"] = bool(graph.meta.get("cost_only"))  # built on the meta device: no values to execute
        if typed:
            stats["roofline"] = [row.to_json() for row in cl.roofline_rows(graph)]
            stats["dtype_fallbacks"] = [{"device": d, "dtype": t} for d, t in cl.dtype_fallbacks(graph)]
        if json_out:
            emit_json(stats)
            return
        console.print(str(graph_path), highlight=False, soft_wrap=True)  # not a table title: it would wrap
        table = Table(show_header=False)
        table.add_column(style="bold")
        table.add_column(justify="right")
        for key in ("name", "num_ops", "num_edges", "depth", "critical_path_ops"):
            table.add_row(key, str(stats[key]))
        for key in ("total_flops", "critical_path_flops", "total_output_bytes"):
            table.add_row(key, f"{stats[key]:.4g}")
        table.add_row("ops_by_kind", ", ".join(f"{k} {v}" for k, v in stats["ops_by_kind"].items()))
        from doppler.report import format_bytes, format_time

        table.add_row(f"lower_bound ({cl.name})", format_time(stats["lower_bound_s"], cl))
        offer = "unlimited" if stats["memory_budget_bytes"] is None else format_bytes(stats["memory_budget_bytes"])
        table.add_row(f"weights / memory budget ({cl.name})", f"{format_bytes(stats['weight_bytes'])} / {offer}"
                      + ("" if stats["weights_fit"] else " (do not fit)"))  # fmt: skip
        if "layer_units" in stats:
            table.add_row("layer units", f"{stats['layer_units']}, of which {stats['repeated_layers']} repeat one layer"
                          f" of {stats['ops_per_repeated_layer']} ops")  # fmt: skip
        from doppler.ir.graph import NO_WEIGHTS

        if stats["cost_only"] and graph.meta["cost_only"] == NO_WEIGHTS:
            table.add_row("values", "no weights: cost-only (built on the meta device), execute --weights runs it")
        elif stats["cost_only"]:
            table.add_row("values", "none: cost-only (built on the meta device), execute refuses it")
        table.add_row("fingerprint", stats["fingerprint"])
        console.print(table)
        if typed:
            _print_roofline(stats, cl)


def _print_roofline(stats: dict, cl) -> None:
    """``graph info``'s table of op kinds on the cluster's devices, and the dtypes run at the float32 peak."""
    from rich.table import Table

    from doppler.report import format_time

    table = Table(title=f"op kinds on {cl.name}: compute- or memory-bound (effective rates include launch overheads)",
                  title_justify="left", show_edge=False, header_style="bold")  # fmt: skip
    for col in ("device", "kind", "dtype", "ops", "compute-bound", "memory-bound", "time", "FLOP/s", "bytes/s"):
        table.add_column(col, justify="left" if col in ("device", "kind", "dtype") else "right")
    for r in stats["roofline"]:
        device = r["device"] + (f" (+{r['alike'] - 1} alike)" if r["alike"] > 1 else "") + \
            ("" if r["model"] == "roofline" else f" [{r['model']}]")
        table.add_row(device, r["kind"], r["dtype"], str(r["ops"]), str(r["compute_bound"]),  # (no markup: plain text)
                      str(r["memory_bound"]), format_time(r["time_s"], cl), f"{r['flop_rate']:.3g}",
                      f"{r['byte_rate']:.3g}")  # fmt: skip
    console.print(table)
    fallbacks: dict[str, list[str]] = {}
    for f in stats["dtype_fallbacks"]:
        fallbacks.setdefault(f["dtype"], []).append(f["device"])
    for dtype, names in fallbacks.items():
        console.print(f"note: {dtype} matrix ops run at the float32 peak on {', '.join(names)} "
                      f"(no {dtype} peak there)", highlight=False)  # fmt: skip (no markup: plain text)


@graph_app.command("convert")
def convert_cmd(
    ctx: typer.Context,
    input_path: Path = typer.Argument(..., metavar="IN", help="Graph file to read (.json or .txt)."),
    output_path: Path = typer.Argument(..., metavar="OUT", help="Graph file to write (.json or .txt)."),
    round_costs: bool = typer.Option(False, "--round", help="Round costs to integers (the text format needs integers)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Convert between the native JSON and the DOPPLER text format (by extension)."""
    with handle_errors():
        hold_outputs(ctx, files={"OUT": output_path}, inputs={"IN": input_path})
        graph = load_graph(input_path)
        save_graph(graph, output_path, round_costs=round_costs)
        if json_out:
            emit_json({"input": str(input_path), "output": str(output_path), "num_ops": graph.num_ops,
                       "num_edges": graph.num_edges, "fingerprint": graph.fingerprint()})
        else:
            console.print(f"{input_path} -> {output_path} ({graph.num_ops} ops, {graph.num_edges} edges)")


@graph_app.command("draw")
def draw_cmd(
    ctx: typer.Context,
    graph_path: Path = GRAPH_ARG,
    output: Path = typer.Option(..., "-o", "--output", help="Image to write (.png, .svg, .pdf, .jpg, ...: by extension)."),
    max_ops: int = typer.Option(5000, "--max-ops", help="Refuse to draw larger graphs."),
) -> None:
    """Draw a graph as a layered picture, ops coloured by kind."""
    with handle_errors():
        from doppler.report import draw_graph, figure_format

        figure_format(output)  # an unsupported extension fails before any work
        hold_outputs(ctx, files={"--output": output}, inputs={"G": graph_path})
        graph = load_graph(graph_path)
        if graph.num_ops > max_ops:
            raise UserError(f"{graph_path}: {graph.num_ops} ops is too many to draw legibly (limit --max-ops {max_ops})")
        draw_graph(graph, output)
        err_console.print(f"wrote {output}")
