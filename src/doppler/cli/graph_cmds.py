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
        table = Table(title=f"{graph_path}", show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column(justify="right")
        for key in ("name", "num_ops", "num_edges", "depth", "critical_path_ops"):
            table.add_row(key, str(stats[key]))
        table.add_row("total_flops", f"{stats['total_flops']:.4g}")
        table.add_row("critical_path_flops", f"{stats['critical_path_flops']:.4g}")
        table.add_row("total_output_bytes", f"{stats['total_output_bytes']:.4g}")
        table.add_row("ops_by_kind", ", ".join(f"{k} {v}" for k, v in stats["ops_by_kind"].items()))
        table.add_row(f"lower_bound_s ({cl.name})", f"{stats['lower_bound_s']:.6g}")
        table.add_row("fingerprint", stats["fingerprint"])
        console.print(table)


@graph_app.command("convert")
def convert_cmd(
    input_path: Path = typer.Argument(..., metavar="IN", help="Graph file to read (.json or .txt)."),
    output_path: Path = typer.Argument(..., metavar="OUT", help="Graph file to write (.json or .txt)."),
    json_out: bool = JSON_OPT,
) -> None:
    """Convert between the native JSON and the DOPPLER text format (by extension)."""
    with handle_errors():
        graph = load_graph(input_path)
        save_graph(graph, output_path)
        if json_out:
            emit_json({"input": str(input_path), "output": str(output_path), "num_ops": graph.num_ops,
                       "num_edges": graph.num_edges, "fingerprint": graph.fingerprint()})
        else:
            console.print(f"{input_path} -> {output_path} ({graph.num_ops} ops, {graph.num_edges} edges)")


@graph_app.command("draw")
def draw_cmd(
    graph_path: Path = typer.Argument(..., metavar="G", help="Graph file (.json or .txt)."),
    output: Path = typer.Option(..., "-o", "--output", help="PNG file to write."),
    max_ops: int = typer.Option(5000, "--max-ops", help="Refuse to draw larger graphs."),
) -> None:
    """Draw a graph as a layered picture, ops coloured by kind."""
    with handle_errors():
        from doppler.drawing import draw_graph

        graph = load_graph(graph_path)
        if graph.num_ops > max_ops:
            raise UserError(f"{graph_path}: {graph.num_ops} ops is too many to draw legibly (limit --max-ops {max_ops})")
        draw_graph(graph, output)
        err_console.print(f"wrote {output}")


@app.command("demo")
def demo_cmd(json_out: bool = JSON_OPT) -> None:
    """Build the four paper workloads and print their statistics."""
    with handle_errors():
        from doppler import hardware, workloads
        from doppler.simulate import lower_bound

        cl = hardware.cluster("p100x4")
        rows = []
        for name in ("chainmm", "ffnn", "llama_block", "llama_layer"):
            t0 = time.perf_counter()
            graph = workloads.build(name)
            stats = graph.summary()
            stats["build_s"] = time.perf_counter() - t0
            stats["lower_bound_s"] = lower_bound(graph, cl)
            rows.append(stats)
        if json_out:
            emit_json({"cluster": cl.name, "workloads": rows})
            return
        table = Table(title=f"The four paper workloads (paper sizes), lower bound on {cl.name}")
        for col in ("workload", "ops", "edges", "depth", "GFLOP", "crit. path GFLOP", "lower bound (ms)"):
            table.add_column(col, justify="right" if col != "workload" else "left")
        for r in rows:
            table.add_row(r["name"], str(r["num_ops"]), str(r["num_edges"]), str(r["depth"]),
                          f"{r['total_flops'] / 1e9:.1f}", f"{r['critical_path_flops'] / 1e9:.1f}",
                          f"{r['lower_bound_s'] * 1e3:.2f}")
        console.print(table)
