"""``doppler assign`` (run one method, write the assignment file) and ``doppler
compare`` (run several methods and tabulate their simulated makespans)."""

import csv
import time
import io
from pathlib import Path
from typing import Any, Optional

import numpy as np
import typer
from rich.markup import escape

from doppler.cli._common import (GRAPH_ARG, CLUSTER_OPT,
    
    JSON_OPT,
    IGNORE_MEMORY_OPT,
    UserError,
    app,
    MEMORY_FRACTION_OPT,
    console,
    emit_json,
    handle_errors,
    hold_outputs,
    live_progress,
    load_graph_and_cluster,
    memory_check,
)
from doppler.cli.method_options import flag_help
from doppler.util.io import atomic_write_text, check_outputs_apart, refuse_link


#: the flags of `assign` that set a method's option, and the option each sets
OPTION_FLAGS = {"--checkpoint": "checkpoint", "--samples": "samples", "--plc-ties/--plc-free": "plc_ties_only",
                "--init": "start", "--threads": "threads", "--tp": "tp"}  # fmt: skip


def _method_options(spec: Any, flags: dict[str, Any], items: list[str]) -> dict[str, Any]:
    """The option values of ``assign``'s method by name: the option flags given (``flags``, by flag; None: not
    given) and the ``--set`` items. A UserError in one line, before anything is read, naming a flag or item
    that sets an option the method does not have (listing the ones it has), or one option set twice."""
    from doppler.cli.method_options import parse_settings

    values = parse_settings(spec, items)
    names = spec.option_names()
    valid = f"its options: {', '.join(names)}" if names else "it takes no options"
    for flag, value in flags.items():
        name = OPTION_FLAGS[flag]
        if value is None:
            continue
        if name not in names:
            raise UserError(f"{flag.split('/')[0]}: method {spec.name!r} has no option {name!r} ({valid})")
        if name in values:
            raise UserError(f"--set {name}=...: {name} is set by {flag.split('/')[0]} too; give it once")
        values[name] = value
    return values


def _assign_with_progress(graph, cl, method: str, **kw: Any):
    """Run a search method with a live bar on stderr: time used of the budget, best makespan so far."""
    from doppler.methods import assign
    from doppler.report import format_time

    def describe(ev: Any) -> str:
        return f"best {format_time(ev.stats['best_makespan_s'], cl)} after {ev.stats['evals']:,} simulations"

    with live_progress(describe, labels={"anneal": method}) as on_progress:
        return assign(graph, cl, method, on_progress=on_progress, **kw)


@app.command("assign")
def assign_cmd(
    ctx: typer.Context,
    graph_path: Path = GRAPH_ARG,
    cluster_name: str = CLUSTER_OPT,
    method: str = typer.Option(..., "--method", "-m", help="Assignment method (see `doppler compare --help`)."),
    output: Path = typer.Option(..., "-o", "--output", help="Assignment file to write (JSON)."),
    budget_s: Optional[float] = typer.Option(None, "--budget-s", help="Wall-clock budget for search methods (s), counted from the command's start (reading the graph included); the first search after an install also compiles its loops, once, outside the budget."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    checkpoint: Optional[Path] = typer.Option(None, "--checkpoint", help="Checkpoint of a learned method."),
    samples: Optional[int] = typer.Option(None, "--samples", help=flag_help("a learned method", "doppler", "samples")),
    plc_ties: Optional[bool] = typer.Option(None, "--plc-ties/--plc-free",
                                            help=flag_help("doppler", "doppler", "plc_ties_only")),
    init: Optional[Path] = typer.Option(None, "--init", help="anneal: start from this assignment file."),
    threads: Optional[int] = typer.Option(None, "--threads", help=flag_help("anneal, heft_lookahead, doppler --budget-s",
                                                                             "anneal", "threads")),
    ignore_fingerprint: bool = typer.Option(False, "--ignore-fingerprint", help="--init: use an assignment made for another version of the graph (same op count)."),
    tp: Optional[int] = typer.Option(None, "--tp", help=flag_help("tp_pipeline", "tp_pipeline", "tp")),
    memory_fraction: float = MEMORY_FRACTION_OPT,
    ignore_memory: bool = IGNORE_MEMORY_OPT,
    set_: list[str] = typer.Option([], "--set", metavar="OPTION=VALUE", help="An option of the method (repeatable), "
                                   "e.g. max_evals=2000 for anneal; `doppler methods NAME` lists a method's options."),
    json_out: bool = JSON_OPT,
) -> None:
    """Assign every op of a graph to a device with one method and write the assignment file (within each
    device's memory budget, or exit 2 saying what does not fit). ``--budget-s`` counts from the command's
    start: reading the graph is taken from the search's time (at most half of it). An option the method
    does not have exits 2, naming it, before anything is read."""
    t_command = time.perf_counter()
    with handle_errors():
        from doppler.ir.assignment import save_assignment
        from doppler.methods import assign, check_budget, get_method

        spec = get_method(method)
        check_budget(budget_s)
        if threads is not None and threads < 1:
            raise UserError(f"--threads must be >= 1, got {threads}")
        flags = {"--checkpoint": checkpoint, "--samples": samples, "--plc-ties/--plc-free": plc_ties,
                 "--init": init, "--threads": threads, "--tp": tp}  # fmt: skip
        options = _method_options(spec, flags, set_)
        # (--init may be the output: it is read in full first, and refining an assignment in place is a use)
        hold_outputs(ctx, files={"--output": output},  # one writer: anneal may run for long
                     inputs={"G": graph_path, "--cluster": cluster_name, "--checkpoint": options.get("checkpoint")})  # fmt: skip
        graph, cl = load_graph_and_cluster(graph_path, cluster_name)
        if init is not None:
            from doppler.ir.assignment import load_assignment

            options["start"] = load_assignment(init, graph, cl.num_devices,
                                               check_fingerprint=not ignore_fingerprint).devices  # fmt: skip
        options = spec.options_from(None, options)
        kw: dict[str, Any] = {"memory_fraction": memory_fraction, "ignore_memory": ignore_memory, "options": options}
        from doppler.util.jit import as_python
        from doppler.methods.placement import runs_as_python
        from doppler.report import format_time
        from doppler.sim import lower_bound, traced

        small_job = runs_as_python(graph, cl.num_devices, method, budget_s, options)
        search_s = None if budget_s is None else max(budget_s - (time.perf_counter() - t_command), budget_s / 2)
        with as_python(small_job):  # one small job: no numba start-up, and no live progress
            if spec.uses_budget and not small_job:
                a = _assign_with_progress(graph, cl, method, seed=seed, budget_s=search_s, **kw)
            else:
                a = assign(graph, cl, method, seed=seed, budget_s=search_s, **kw)
            result = traced(graph, cl, a)
            lb = float(lower_bound(graph, cl))
        makespan = float(result.makespan_s)
        chk = memory_check(graph, cl, result, memory_fraction, ignore_memory, f"{method}'s placement of {graph_path}")
        save_assignment(a, output)
        counts = [int(c) for c in np.bincount(a.devices, minlength=cl.num_devices)]
        row = {
            "method": method,
            "output": str(output),
            "graph": graph.name,
            "cluster": cl.name,
            "num_ops": graph.num_ops,
            "num_devices": cl.num_devices,
            "ops_per_device": counts,
            "makespan_s": makespan,
            "lower_bound_s": lb,
            **chk.to_json(),
            "assign_time_s": a.assign_time_s,
            "estimated_makespan_s": a.estimated_makespan_s,
            "seed": seed,
            "budget_s": budget_s,
        }
        if "zero_shot" in a.info:  # a learned policy's: each a flag but the checkpoint's path
            for key in ("zero_shot", "pretrained", "checkpoint", "plc_ties_only", "device_identity_left_out"):
                row[key] = a.info.get(key) if key == "checkpoint" else bool(a.info.get(key))
        if json_out:
            emit_json(row)
        else:
            console.print(
                f"[bold]{method}[/]: {graph.num_ops} ops on {cl.num_devices} devices of {escape(cl.name)} "
                f"(ops per device {counts}) in {a.assign_time_s:.3f} s -> {escape(str(output))}\n"
                f"simulated makespan {format_time(makespan, cl)}, {makespan / lb:.3f}x the lower bound "
                f"({format_time(lb, cl)})",
                markup=True,
                highlight=False,
            )
            if a.info.get("pretrained"):
                console.print("zero-shot: the shipped pretrained policy (no --checkpoint), trained on other graphs "
                              "and clusters than these", highlight=False)  # fmt: skip
            elif a.info.get("zero_shot"):
                console.print("zero-shot: the policy was trained on this graph, but on another cluster"
                              if a.info.get("trained_on_graph") else "zero-shot: the policy was not trained on this graph",
                              highlight=False)  # fmt: skip
            if a.info.get("device_identity_left_out"):
                console.print(f"device identity left out: the policy learned a state for each of the "
                              f"{a.info['device_identity_left_out']} devices of the cluster it was trained on, "
                              "not this one", highlight=False)  # fmt: skip
            if a.info.get("plc_ties_only"):
                console.print("the device head broke only the ties of the policy's list-schedule rule "
                              "(--plc-free: any device)", highlight=False)  # fmt: skip


def _compare_checkpoints(items: list[str], names: list[str]) -> dict[str, Path]:
    """``compare``'s checkpoint per learned method: ``METHOD=PATH`` items, or one ``PATH`` when ``names`` lists
    exactly one learned method."""
    from doppler.policy import LEARNED_METHODS

    learned = [m for m in names if m in LEARNED_METHODS]
    out: dict[str, Path] = {}
    for item in items:
        method, sep, path = item.partition("=")
        if not (sep and method in LEARNED_METHODS):
            if len(learned) != 1:
                raise UserError(f"--checkpoint {item}: --methods lists {len(learned)} learned methods; name the one "
                                "it is for (--checkpoint METHOD=PATH)")  # fmt: skip
            method, path = learned[0], item
        elif method not in learned:
            raise UserError(f"--checkpoint {item}: {method} is not in --methods")
        if method in out:
            raise UserError(f"--checkpoint: two checkpoints for {method}")
        out[method] = Path(path)
    return out


def _largest(values: list) -> float | str:
    """The largest of per-device figures, for a CSV cell (an unlimited budget: empty)."""
    finite = [v for v in values if v is not None]
    return "" if len(finite) < len(values) or not finite else max(finite)


@app.command("compare")
def compare_cmd(
    ctx: typer.Context,
    graph_path: Path = GRAPH_ARG,
    cluster_name: str = CLUSTER_OPT,
    methods: str = typer.Option(
        "single,round_robin,random,critical_path,heft,metis,enumerative,anneal",
        "--methods",
        "-m",
        help="Comma-separated method names.",
    ),
    budget_s: Optional[float] = typer.Option(None, "--budget-s", help="Wall-clock budget per search method (s); the first search after an install also compiles its loops, once, outside the budget."),
    seed: int = typer.Option(0, "--seed", help="Random seed."),
    checkpoints: list[str] = typer.Option([], "--checkpoint", help="Checkpoint of a learned method in --methods: "
                                          "METHOD=PATH (repeatable, one per learned method), or PATH when --methods "
                                          "lists one learned method (doppler without one: the shipped policy)."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Also write the table as CSV."),
    save_dir: Optional[Path] = typer.Option(None, "--save-dir", help="Save every method's assignment as DIR/METHOD.json."),
    memory_fraction: float = MEMORY_FRACTION_OPT,
    ignore_memory: bool = IGNORE_MEMORY_OPT,
    json_out: bool = JSON_OPT,
) -> None:
    """Run several methods on one graph and compare their simulated makespans and whether each placement fits
    the memory budget."""
    with handle_errors():
        from doppler.ir.assignment import save_assignment
        from doppler.methods import check_budget, compare, get_method

        names = [m.strip() for m in methods.split(",") if m.strip()]
        for m in names:
            get_method(m)
        check_budget(budget_s)
        if save_dir is not None:
            refuse_link(save_dir, f"--save-dir {save_dir}")
        if save_dir is not None and save_dir.exists() and not save_dir.is_dir():
            raise UserError(f"--save-dir {save_dir}: exists and is not a directory")
        saves = {f"--save-dir ({m})": save_dir / f"{m}.json" for m in names} if save_dir is not None else {}
        chosen = _compare_checkpoints(checkpoints, names)
        check_outputs_apart({"G": graph_path, "--cluster": cluster_name,
                             **{f"--checkpoint ({m})": p for m, p in chosen.items()}},
                            {"--csv": csv_path, **saves})  # every output checked before any method runs  # fmt: skip
        hold_outputs(ctx, dirs={"--save-dir": save_dir}, files={"--csv": csv_path})
        graph, cl = load_graph_and_cluster(graph_path, cluster_name)
        with live_progress(lambda ev: f"running [bold]{ev.stats['method']}[/]", labels={"compare": "methods"},
                           counts=True) as on_progress:  # fmt: skip
            rows = compare(graph, cl, names, seed=seed, budget_s=budget_s, on_progress=on_progress,
                           method_options={m: {"checkpoint": p} for m, p in chosen.items()},
                           memory_fraction=memory_fraction, ignore_memory=ignore_memory)  # fmt: skip
        if csv_path is not None:
            buf = io.StringIO()
            per_device = ("resident_bytes", "peak_memory_bytes", "memory_budget_bytes")
            fields = [k for k in rows[0].to_json() if k != "memory_overruns"]
            w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")  # per device: the largest
            w.writeheader()
            for r in rows:
                row = r.to_json()
                w.writerow({k: ("" if row[k] is None else _largest(row[k]) if k in per_device else row[k])
                            for k in fields})  # fmt: skip
            atomic_write_text(csv_path, buf.getvalue())
        saved = []
        if save_dir is not None:
            for r in rows:
                path = save_dir / f"{r.method}.json"
                save_assignment(r.assignment, path)
                saved.append(str(path))
        if json_out:
            emit_json([r.to_json() | ({"assignment_file": saved[i]} if saved else {}) for i, r in enumerate(rows)])
            return
        from doppler.report import comparison_table, format_time

        title = f"{graph.name} ({graph.num_ops} ops) on {cl.name} ({cl.num_devices} devices)"
        console.print(comparison_table(rows, title, cl))
        over = [f"{r.method} ({'; '.join(r.memory_overruns)})" for r in rows if r.memory_overruns]
        if over:
            console.print(f"[red]over the memory budget:[/] {escape(', '.join(over))}", markup=True, highlight=False)
        console.print(f"lower bound {format_time(rows[0].lower_bound_s, cl)}", highlight=False)
        if csv_path is not None:
            console.print(f"wrote {csv_path}", highlight=False)
        if saved:
            console.print(f"assignments -> {save_dir}/METHOD.json ({len(saved)} files)", highlight=False)
