"""``doppler simulate G --cluster C --assignment A.json [...]``: makespan of one assignment."""

import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.markup import escape

from doppler.cli._common import (GRAPH_ARG, CLUSTER_OPT,
    IGNORE_MEMORY_OPT, JSON_OPT, MEMORY_FRACTION_OPT, UserError, app, console, emit_json,
                                 handle_errors, hold_outputs, load_graph_and_cluster, memory_check,
                                 write_trace_files)  # fmt: skip

#: ``doppler simulate`` runs one simulation of a graph of up to this many ops as Python
#: (:mod:`doppler.util.jit`) unless numba has started: 0.27 s at 3,000 ops with its trace (0.45 s with
#: link contention), against about 1 s of numba's import and start-up
PYTHON_SIMULATION_MAX_OPS = 3000


@app.command("simulate")
def simulate_cmd(
    ctx: typer.Context,
    graph_path: Path = GRAPH_ARG,
    cluster_name: str = CLUSTER_OPT,
    assignment_path: Path = typer.Option(..., "--assignment", "-a", help="Assignment file (JSON object or bare list)."),
    mode: str = typer.Option("wc", "--mode", help="wc (work-conserving) or bsp (barrier per topological level)."),
    gantt_path: Optional[Path] = typer.Option(None, "--gantt", help="Write a Gantt chart (.png, .svg, .pdf, .jpg, ...: by extension)."),
    gantt_memory: bool = typer.Option(False, "--gantt-memory", help="--gantt: add a panel of the bytes each device holds over time, against its budget."),
    trace_path: Optional[Path] = typer.Option(None, "--trace", help="Write the per-op and per-transfer trace as JSON (with op names and kinds)."),
    chrome_path: Optional[Path] = typer.Option(None, "--chrome-trace", help="Write the trace in Chrome trace-event format (Perfetto, chrome://tracing)."),
    csv_path: Optional[Path] = typer.Option(None, "--ops-csv", help="Write a per-op table: op, name, kind, device, ready_s, start_s, end_s."),
    noise: float = typer.Option(0.0, "--noise", help="Lognormal noise sigma on every duration (0 = deterministic)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the noise."),
    link_contention: bool = typer.Option(False, "--link-contention", help="Serialise transfers per ordered link."),
    ignore_fingerprint: bool = typer.Option(False, "--ignore-fingerprint", help="Use an assignment made for another version of the graph (same op count)."),
    dispatch: str = typer.Option(
        "fifo", "--dispatch", help="fifo (ready ops run in arrival order) or priority (in op-id order; wc only)."
    ),
    memory_fraction: float = MEMORY_FRACTION_OPT,
    ignore_memory: bool = IGNORE_MEMORY_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Simulate one assignment on a cluster and report its makespan and memory per device (exit 2 if it does
    not fit the memory budget)."""
    with handle_errors():
        from doppler.ir.assignment import load_assignment
        from doppler.sim import check_dispatch, check_options, lower_bound, simulate

        check_options(mode, noise, seed)  # bad options fail before any file is read
        hold_outputs(ctx, files={"--gantt": gantt_path, "--trace": trace_path, "--chrome-trace": chrome_path,
                                 "--ops-csv": csv_path},
                     inputs={"G": graph_path, "--assignment": assignment_path, "--cluster": cluster_name})  # fmt: skip
        if gantt_path is not None:
            from doppler.report import figure_format

            figure_format(gantt_path)
        check_dispatch(dispatch, mode)
        graph, cl = load_graph_and_cluster(graph_path, cluster_name)
        assignment = load_assignment(assignment_path, graph, cl.num_devices, check_fingerprint=not ignore_fingerprint)
        from doppler.util.jit import as_python

        t0 = time.perf_counter()
        with as_python(graph.num_ops <= PYTHON_SIMULATION_MAX_OPS):  # one simulation: no numba start-up
            result = simulate(
                graph, cl, assignment, mode=mode, trace=True, noise_sigma=noise, seed=seed,
                link_contention=link_contention, dispatch=dispatch,
            )  # fmt: skip
            elapsed = time.perf_counter() - t0
            lb = lower_bound(graph, cl)
        chk = memory_check(graph, cl, result, memory_fraction, ignore_memory, str(assignment_path))
        from doppler.report import gantt

        if gantt_memory and gantt_path is None:
            raise UserError("--gantt-memory draws a panel of the Gantt chart: give --gantt too")
        if gantt_path is not None:
            gantt(graph, cl, result, gantt_path, lower_bound_s=lb,
                  memory_budget_bytes=chk.memory_budget_bytes if gantt_memory else None)  # fmt: skip
        out = _record(graph, cl, result, lb, chk, elapsed, mode=mode, dispatch=dispatch, noise=noise, seed=seed,
                      link_contention=link_contention)  # fmt: skip
        if gantt_path is not None:
            out["gantt"] = str(gantt_path)
        written = write_trace_files(result.trace, graph, [d.name for d in cl.devices], out, trace_path=trace_path,
                                    chrome_path=chrome_path, csv_path=csv_path)  # fmt: skip
        if json_out:
            emit_json(out)
            return
        _report(graph, cl, result, lb, chk, mode=mode, dispatch=dispatch, noise=noise)
        for label, p in [("gantt chart", gantt_path), *written]:
            if p is not None:
                console.print(f"{label} -> {p}", highlight=False)


def _record(graph, cl, result, lb: float, chk, elapsed_s: float, **options) -> dict:
    """The JSON record of one simulation (``--json``, and the basis of the trace files' metadata)."""
    tr = result.trace
    return {
        "makespan_s": result.makespan_s,
        "lower_bound_s": lb,
        "ratio_to_lower_bound": result.makespan_s / lb if lb > 0 else None,
        "mode": options["mode"],
        "dispatch": options["dispatch"],
        "graph": graph.name,
        "cluster": cl.name,
        "num_ops": graph.num_ops,
        "num_devices": cl.num_devices,
        "num_transfers": tr.num_transfers,
        "transfer_bytes": float(tr.tr_bytes.sum()),
        "utilisation": [float(u) for u in tr.utilisation(cl)],
        **chk.to_json(),
        "memory_bytes": [None if np.isinf(m) else float(m) for m in cl.memory_bytes],
        "noise_sigma": options["noise"],
        "seed": options["seed"],
        "link_contention": options["link_contention"],
        "elapsed_s": elapsed_s,
    }


def _report(graph, cl, result, lb: float, chk, *, mode: str, dispatch: str, noise: float) -> None:
    """The human summary: one line, then one row per device (ops, busy time, utilisation, resident weights,
    peak memory and the budget)."""
    from rich.table import Table
    from rich.text import Text

    from doppler.report import format_bytes, format_time

    tr = result.trace
    ratio = f" ({result.makespan_s / lb:.2f}x the lower bound)" if lb > 0 else ""
    if noise > 0:
        ratio += " (with noise, durations are random: the noise-free lower bound does not bind)"
    how = mode.upper() if dispatch == "fifo" else f"{mode.upper()}, {dispatch} dispatch"
    console.print(
        f"[bold]{escape(graph.name)}[/] on [bold]{escape(cl.name)}[/] ({how}): makespan "
        f"[bold]{format_time(result.makespan_s, cl)}[/], lower bound {format_time(lb, cl)}{ratio}; "
        f"{tr.num_transfers} transfers, {format_bytes(tr.tr_bytes.sum())} moved",
        markup=True,
        highlight=False,
    )
    util, busy = tr.utilisation(cl), tr.busy_s(cl.num_devices, cl.copies_inbound)
    ops_per_dev = np.bincount(tr.op_device, minlength=cl.num_devices)
    peak, budget = chk.peak_memory_bytes, chk.memory_budget_bytes
    table = Table(show_edge=False, header_style="bold")
    for col in ("device", "ops", "busy", "utilisation", "weights", "peak memory", "budget"):
        table.add_column(col, justify="left" if col == "device" else "right")
    for d, dev in enumerate(cl.devices):
        shown = format_bytes(peak[d])
        table.add_row(dev.name, str(int(ops_per_dev[d])), format_time(float(busy[d]), cl), f"{100 * util[d]:.1f}%",
                      format_bytes(chk.resident_bytes[d]), Text(shown, style="red") if peak[d] > budget[d] else shown,
                      format_bytes(budget[d]))  # fmt: skip
    console.print(table)


@app.command("diff")
def diff_cmd(
    graph_path: Path = GRAPH_ARG,
    first: Path = typer.Argument(..., metavar="A.json", help="First assignment."),
    second: Path = typer.Argument(..., metavar="B.json", help="Second assignment."),
    cluster_name: str = CLUSTER_OPT,
    ignore_fingerprint: bool = typer.Option(False, "--ignore-fingerprint", help="Use assignments made for another version of the graph."),
    json_out: bool = JSON_OPT,
) -> None:
    """Two assignments side by side: simulated makespan, ops per device, transfers, and the ops that moved."""
    from rich.table import Table

    with handle_errors():
        from doppler.ir.assignment import load_assignment
        from doppler.report import format_bytes, format_time
        from doppler.sim import simulate

        graph, cl = load_graph_and_cluster(graph_path, cluster_name)
        sides = []
        for path in (first, second):
            a = load_assignment(path, graph, cl.num_devices, check_fingerprint=not ignore_fingerprint)
            tr = simulate(graph, cl, a, trace=True).trace
            assert tr is not None
            sides.append({"file": str(path), "method": a.method, "makespan_s": tr.makespan_s,
                          "ops_per_device": np.bincount(a.devices, minlength=cl.num_devices).tolist(),
                          "transfers": tr.num_transfers, "transfer_bytes": float(tr.tr_bytes.sum()),
                          "devices": a.devices})  # fmt: skip
        moved = np.flatnonzero(sides[0]["devices"] != sides[1]["devices"])
        out = {
            "graph": graph.name,
            "cluster": cl.name,
            "a": {k: v for k, v in sides[0].items() if k != "devices"},
            "b": {k: v for k, v in sides[1].items() if k != "devices"},
            "moved_ops": int(moved.size),
            "moved": [{"op": int(v), "name": graph.op_name(int(v)), "from": int(sides[0]["devices"][v]),
                       "to": int(sides[1]["devices"][v])} for v in moved],  # fmt: skip
            "makespan_ratio_b_over_a": sides[1]["makespan_s"] / sides[0]["makespan_s"] if sides[0]["makespan_s"] > 0 else None,
        }
        if json_out:
            emit_json(out)
            return
        table = Table(title=f"{graph.name} on {cl.name}", show_edge=False, header_style="bold")
        table.add_column("")
        for side in sides:
            table.add_column(Path(side["file"]).name, justify="right")
        table.add_row("method", *(s["method"] for s in sides))
        table.add_row("simulated makespan", *(format_time(s["makespan_s"], cl) for s in sides))
        table.add_row("ops per device", *(" ".join(map(str, s["ops_per_device"])) for s in sides))
        table.add_row("transfers", *(str(s["transfers"]) for s in sides))
        table.add_row("bytes moved", *(format_bytes(s["transfer_bytes"]) for s in sides))
        console.print(table)
        shown = ", ".join(f"{m['name']} {m['from']}->{m['to']}" for m in out["moved"][:8])
        more = f" (+{moved.size - 8} more)" if moved.size > 8 else ""
        console.print(f"{moved.size} of {graph.num_ops} ops moved{': ' + shown + more if moved.size else ''}",
                      highlight=False)  # fmt: skip
