"""``doppler execute`` (run one assignment for real), ``doppler calibrate`` (measure the
engine's devices and links into a cluster file) and ``doppler validate`` (simulator
versus engine on many assignments)."""

import dataclasses
import functools
import inspect
import math
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.markup import escape

from doppler.cli._common import (GRAPH_ARG,
    IGNORE_MEMORY_OPT, JSON_OPT, MEMORY_FRACTION_OPT, UserError, app, as_user_error, console,
                                 emit_json, handle_errors, hold_outputs, live_progress, memory_check,
                                 write_trace_files)  # fmt: skip

ENGINE_OPT = typer.Option("local", "--engine", "-e", help="local (threads on this machine) or dask.")
SCHEDULER_OPT = typer.Option(
    None, "--scheduler", help="Dask: address of a running scheduler (tcp://host:8786); default: a LocalCluster on 127.0.0.1."
)
TIMEOUT_OPT = typer.Option(
    600.0, "--timeout", help="Seconds one run may take before it is stopped; also bounds reaching a --scheduler (at most 60 s)."
)
DEVICE_TYPE_OPT = typer.Option(
    "cpu", "--device-type", help="Local engine devices: cpu (numpy workers) or cuda (torch on the GPU; more devices than GPUs split each GPU)."
)
TIME_SCALE_OPT = typer.Option(1.0, "--time-scale", help="Cost-only graphs: synthetic kernel time = this x the cluster's op time.")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The option block ``calibrate`` and ``validate`` share, declared once: each field's default is its
    typer option. A command takes the block as one parameter ``= ENGINE_OPTIONS`` under
    :func:`engine_options`; the fields are the keyword arguments of the same names of
    :func:`doppler.engine.calibrate.calibrate` and fields of :class:`doppler.engine.RunOptions` (``validate``)."""

    scheduler: Optional[str] = SCHEDULER_OPT
    timeout_s: float = TIMEOUT_OPT
    device_type: str = DEVICE_TYPE_OPT


#: the default that marks a command's EngineOptions parameter (see :func:`engine_options`)
ENGINE_OPTIONS: Any = object()


def engine_options(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with its parameter ``= ENGINE_OPTIONS`` spelled out as the fields of
    :class:`EngineOptions`, in its place, for typer (so ``--help`` lists them there); the command
    receives them as one EngineOptions."""
    sig = inspect.signature(command)
    (slot,) = [p.name for p in sig.parameters.values() if p.default is ENGINE_OPTIONS]
    fields = dataclasses.fields(EngineOptions)
    block = [inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=f.default, annotation=f.type)
             for f in fields]  # fmt: skip

    @functools.wraps(command)
    def with_engine_options(*args: Any, **kwargs: Any) -> None:
        kwargs[slot] = EngineOptions(**{f.name: kwargs.pop(f.name) for f in fields})
        command(*args, **kwargs)

    params = [q for p in sig.parameters.values() for q in (block if p.name == slot else [p])]
    with_engine_options.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return with_engine_options


def _engine_cluster(cluster_name: Optional[str], devices: Optional[int]):
    """The cluster to simulate (and size synthetic kernels) with, and the device count."""
    from doppler.hardware.presets import cluster

    if cluster_name is not None:
        cl = cluster(cluster_name)
        if devices is not None and devices != cl.num_devices:
            raise UserError(f"--devices {devices} does not match cluster {cl.name!r}, which has {cl.num_devices} devices")
        return cl, cl.num_devices
    n = 2 if devices is None else devices
    if n < 1:
        raise UserError(f"--devices must be >= 1, got {n}")
    return cluster(f"cpu4:{n}"), n


@app.command("execute")
def execute_cmd(
    ctx: typer.Context,
    graph_path: Path = GRAPH_ARG,
    assignment_path: Path = typer.Option(..., "--assignment", "-a", help="Assignment file."),
    engine: str = ENGINE_OPT,
    devices: Optional[int] = typer.Option(None, "--devices", "-d", help="Number of engine devices (default: the cluster's, else 2)."),
    cluster_name: Optional[str] = typer.Option(
        None, "--cluster", "-c", help="Cluster to compare with (a `doppler calibrate` file); sizes synthetic kernels of cost-only graphs."
    ),
    repeats: int = typer.Option(3, "--repeats", "-r", help="Runs; the makespan is their median."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed runs first (page faults, cold caches)."),
    time_scale: float = TIME_SCALE_OPT,
    seed: int = typer.Option(0, "--seed", help="Seed of the random input tensors."),
    check: bool = typer.Option(False, "--check", help="Compare the outputs with the untiled numpy computation (imported models: the graph evaluated with numpy in one place)."),
    gantt_path: Optional[Path] = typer.Option(None, "--gantt", help="Write a Gantt chart of the median run."),
    trace_path: Optional[Path] = typer.Option(None, "--trace", help="Write the median run's trace as JSON (with op names and kinds)."),
    chrome_path: Optional[Path] = typer.Option(None, "--chrome-trace", help="Write the median run in Chrome trace-event format (Perfetto)."),
    csv_path: Optional[Path] = typer.Option(None, "--ops-csv", help="Write the median run as a per-op table (CSV)."),
    scheduler: Optional[str] = SCHEDULER_OPT,
    timeout_s: float = TIMEOUT_OPT,
    ignore_fingerprint: bool = typer.Option(False, "--ignore-fingerprint", help="Use an assignment made for another version of the graph."),
    device_type: str = DEVICE_TYPE_OPT,
    memory_fraction: float = MEMORY_FRACTION_OPT,
    ignore_memory: bool = IGNORE_MEMORY_OPT,
    weights_path: Optional[Path] = typer.Option(None, "--weights", help="The model's own weights for a graph made by `graph import` (also one imported on the meta device): a .safetensors file, or a directory with model.safetensors.index.json or model.safetensors (save_pretrained). Each tile's slice is read onto the device that reads it. Pickle checkpoints (.bin) are refused."),
    input_ids: Optional[str] = typer.Option(None, "--input-ids", help="Token ids of a causal LM instead of random ones: a file (JSON list of integers, or integers separated by white space or commas), or a count (that many random ids with --seed; the graph's input size)."),
    reference: Optional[str] = typer.Option(None, "--reference", help="With --weights and --check: compare the logits with this factory's module (FILE.py:FUNCTION, your code: it runs) loaded with the same weights and run forward in torch."),
    json_out: bool = JSON_OPT,
) -> None:
    """Execute one assignment on a real engine and report the measured makespan (an assignment over the
    cluster's memory budget, as simulated, is refused before it runs)."""
    with handle_errors():

        from doppler.ir.assignment import load_assignment
        from doppler.engine import RunOptions, check_options, check_time_scale, run
        from doppler.ir.formats import load_graph
        from doppler.sim import simulate

        cl, num_devices = _engine_cluster(cluster_name, devices)
        check_options(engine, num_devices, repeats, timeout_s, seed, device_type)
        check_time_scale(time_scale)
        _check_weight_options(weights_path, reference, check, engine)
        if gantt_path is not None:
            from doppler.report import figure_format

            figure_format(gantt_path)
        hold_outputs(ctx, files={"--gantt": gantt_path, "--trace": trace_path, "--chrome-trace": chrome_path,
                                 "--ops-csv": csv_path},
                     inputs={"G": graph_path, "--assignment": assignment_path, "--cluster": cluster_name,
                             "--weights": weights_path, "--input-ids": input_ids})  # fmt: skip
        graph = load_graph(graph_path)
        bound = _bound_inputs(graph, str(graph_path), weights_path, input_ids, seed)  # before the assignment's faults
        synthetic = not (graph.specs and any(sp is not None for sp in graph.specs))  # a cost-only graph
        if check and synthetic:
            raise UserError(f"--check: graph {graph.name!r} has no workload outputs to check (a cost-only graph)")
        assignment = load_assignment(assignment_path, graph, num_devices, check_fingerprint=not ignore_fingerprint)
        chk = memory_check(graph, cl, simulate(graph, cl, assignment, trace=True), memory_fraction, ignore_memory,
                           str(assignment_path))  # before the run, as the simulator counts memory  # fmt: skip
        options = RunOptions(engine=engine, device_type=device_type, scheduler=scheduler, repeats=repeats, warmup=warmup,
                             timeout_s=timeout_s)  # fmt: skip
        res = run(graph, assignment, options=options, num_devices=num_devices, program=bound.program if bound else None,
                  cluster=cl, time_scale=time_scale, seed=seed)  # fmt: skip
        sim = simulate(graph, cl, assignment, link_contention=True).makespan_s
        if synthetic:  # cost-only graph: its kernels ran time_scale x the cluster's times
            sim *= time_scale
        out: dict[str, Any] = {
            "graph": graph.name,
            "cluster": cl.name,
            **res.to_json(),
            "simulated_makespan_s": sim,
            "simulated_with_link_contention": True,
            "time_scale": time_scale if synthetic else None,
            "sim_error_pct": (sim - res.makespan_s) / res.makespan_s * 100 if res.makespan_s > 0 else None,
            "num_transfers": res.trace.num_transfers,
            "transfer_bytes": float(res.trace.tr_bytes.sum()),
            "peak_memory_bytes": None if res.peak_memory_bytes is None else res.peak_memory_bytes.tolist(),
            "simulated_peak_memory_bytes": chk.peak_memory_bytes.tolist(),
            "memory_budget_bytes": chk.to_json()["memory_budget_bytes"],
        }
        if bound is not None and bound.checkpoint is not None:
            out["weights"] = str(weights_path)
            out["weight_bytes_read"] = float(sum(n for _, _, n in bound.checkpoint.reads))
        if check and reference is not None:
            out.update(_check_against_reference(graph, res, bound, reference))
        elif check:
            out.update(_check_outputs(graph, res.outputs, seed, bound.user_inputs if bound else {}))
        names = res.info.get("devices") or [f"cpu{d}" for d in range(num_devices)]
        written = write_trace_files(res.trace, graph, names, out,
                                    trace_path=trace_path, chrome_path=chrome_path, csv_path=csv_path)  # fmt: skip
        if gantt_path is not None:
            from doppler.report import gantt

            gantt(graph, cl, res.trace, gantt_path, title=f"{graph.name}: measured on {engine} ({num_devices} {device_type} devices)")
            out["gantt"] = str(gantt_path)
        if json_out:
            emit_json(out)
        else:
            _report_run(graph, res, out, engine=engine, device_type=device_type, cl=cl, repeats=repeats,
                        time_scale=time_scale if synthetic else None, written=[("gantt chart", gantt_path), *written])  # fmt: skip
        if check and not out["outputs_match"]:
            raise typer.Exit(1)


def _check_weight_options(weights_path: Optional[Path], reference: Optional[str], check: bool, engine: str) -> None:
    """The combinations of --weights, --reference and --check that mean something."""
    if reference is not None and weights_path is None:
        raise UserError("--reference compares with the model run on the same weights: give --weights too")
    if reference is not None and not check:
        raise UserError("--reference is what --check compares with: give --check too")
    if check and weights_path is not None and reference is None:
        raise UserError("--check with --weights compares with the model itself: give --reference FILE.py:FACTORY")
    if weights_path is not None and engine != "local":
        raise UserError("--weights: the dask engine does not read checkpoints (each worker would need the file); "
                        "use --engine local")  # fmt: skip


def _bound_inputs(graph, source: str, weights_path: Optional[Path], input_ids: Optional[str], seed: int):
    """With --weights or --input-ids, the :class:`~doppler.engine.weights.BoundProgram` to run (None: the engine
    draws every input from --seed). A cost-only graph without --weights is refused here, in one line."""
    from doppler.engine.weights import WeightsError, bound_program
    from doppler.workloads.references import require_values

    if weights_path is None:
        require_values(graph, source)
    if weights_path is None and input_ids is None:
        return None
    with as_user_error(WeightsError):
        return bound_program(graph, source, weights_path, input_ids, seed)


def _check_against_reference(graph, res, bound: Any, reference: str) -> dict[str, Any]:
    """--check --reference: the run's logits against the factory's module on the same weights and inputs."""
    from doppler.engine.model_check import coarser, compare_logits, reference_outputs
    from doppler.engine.weights import WeightsError

    dtype = coarser(str(graph.meta.get("dtype", "float32")), *{how["dtype"] for how in graph.meta["weights"].values()})
    with as_user_error(WeightsError):
        ref = reference_outputs(reference, bound.checkpoint, graph, bound.user_inputs)
        return compare_logits(res.outputs, ref, source=reference, dtype=dtype).to_json()


def _check_outputs(graph, outputs: dict, seed: int, given: dict) -> dict[str, Any]:
    """Compare an engine run's outputs with numpy: a built-in workload's untiled reference, or for an
    imported model the graph evaluated with numpy in one place (float64 inputs of the same seed, and the
    ``given`` ones: --input-ids)."""
    import numpy as np

    if not outputs:
        raise UserError(f"graph {graph.name!r} has no workload outputs to check (a cost-only graph)")
    from doppler.ir.kernels import evaluate_numpy
    from doppler.workloads import WORKLOADS, reference
    from doppler.workloads.references import assemble_outputs, make_inputs

    x = make_inputs(graph, seed=seed, dtype=np.float64) | {k: np.asarray(v, dtype=np.float64) for k, v in given.items()}
    if graph.meta.get("workload") in WORKLOADS:
        ref = reference(graph, x)
    else:
        ref = assemble_outputs(graph, evaluate_numpy(graph, x))
    tol = 1e-3 if outputs[next(iter(outputs))].dtype != np.float64 else 1e-9
    errs = {k: float(np.max(np.abs(outputs[k] - ref[k])) / max(float(np.max(np.abs(ref[k]))), 1e-30)) for k in ref}
    return {"max_rel_error": errs, "outputs_match": bool(all(e <= tol for e in errs.values()))}


def _report_run(graph, res, out: dict, *, engine: str, device_type: str, cl, repeats: int, time_scale: float | None,
                written: list) -> None:  # fmt: skip
    """The human summary of ``execute``: measured vs simulated makespan, the check, the files written."""
    from doppler.report import format_bytes, format_time

    reps = ", ".join(format_time(m) for m in res.makespans_s)
    console.print(
        f"[bold]{escape(graph.name)}[/] on the {engine} engine ({out['num_devices']} {device_type} devices): "
        f"measured makespan [bold]{format_time(res.makespan_s)}[/] (median of {repeats}: {reps}); simulated on "
        f"{escape(cl.name)}{f' x {time_scale:g}' if time_scale is not None else ''} with link contention, as the "
        f"engine moves data (`simulate --link-contention`): {format_time(out['simulated_makespan_s'])} "
        f"({out['sim_error_pct']:+.1f}%); {res.trace.num_transfers} transfers, "
        f"{format_bytes(res.trace.tr_bytes.sum())} moved",
        markup=True,
        highlight=False,
    )
    if out.get("peak_memory_bytes") is not None:
        pairs = ", ".join(f"{format_bytes(m)} / {format_bytes(s)}"
                          for m, s in zip(out["peak_memory_bytes"], out["simulated_peak_memory_bytes"]))  # fmt: skip
        console.print(f"peak memory per device, measured / simulated: {pairs}", highlight=False)
    if "weights" in out:
        console.print(f"weights: {format_bytes(out['weight_bytes_read'])} read from {out['weights']}, each tile onto "
                      "the device that reads it", highlight=False)  # fmt: skip
    if "reference" in out:
        verdict = "[green]match[/]" if out["outputs_match"] else "[red]DO NOT match[/]"
        console.print(f"logits {verdict} {escape(out['reference'])}'s forward on the same weights: max error "
                      f"{out['max_abs_error']:.2g} ({max(out['max_rel_error'].values()):.2g} of the largest logit, "
                      f"tolerance {out['tolerance']:.0e}); top-1 token agrees at {out['top1_agree']} of "
                      f"{out['positions_checked']} positions", markup=True, highlight=False)  # fmt: skip
    elif "outputs_match" in out:
        verdict = "[green]match[/]" if out["outputs_match"] else "[red]DO NOT match[/]"
        console.print(f"outputs {verdict} the numpy reference (max relative error "
                      f"{max(out['max_rel_error'].values()):.2g})", markup=True)  # fmt: skip
    for label, p in written:
        if p is not None:
            console.print(f"{label} -> {p}", highlight=False)


@app.command("calibrate")
@engine_options
def calibrate_cmd(
    ctx: typer.Context,
    output: Path = typer.Option(..., "--output", "-o", help="Cluster JSON file to write."),
    engine: str = ENGINE_OPT,
    devices: int = typer.Option(2, "--devices", "-d", help="Number of engine devices to calibrate."),
    runs: int = typer.Option(4, "--runs", help="Measured runs of the calibration graph."),
    sizes: str = typer.Option("128,256,512,1024", "--sizes", help="Comma-separated matrix sizes of the calibration graph."),
    seed: int = typer.Option(0, "--seed", help="Seed of the inputs and the assignments."),
    memory_bytes: Optional[float] = typer.Option(None, "--memory-bytes", help="Each device's memory in bytes, written to the cluster (CPU workers share the host's memory, so no run measures it; default: unlimited); placements keep within --memory-fraction of it."),
    stream_bytes: float = typer.Option(128 * 2**20, "--stream-bytes", help="Local CPU devices: bytes of each of the 3 arrays per device that measure its memory bandwidth (STREAM copy and add); make them well past the last-level cache."),
    opts: EngineOptions = ENGINE_OPTIONS,
    json_out: bool = JSON_OPT,
) -> None:
    """Measure the engine's kernels (per device and op kind) and links; write a cluster the simulator loads."""
    with handle_errors():
        from doppler.hardware.files import save_cluster
        from doppler.engine import MAX_REPEATS, RunOptions, check_options
        from doppler.engine.calibrate import MAX_STREAM_BYTES, MIN_STREAM_BYTES, calibrate

        check_options(engine, devices, 1, opts.timeout_s, seed, opts.device_type)
        try:
            size_list = [int(s) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise UserError(f"--sizes must be comma-separated integers, got {sizes!r}") from None
        if not size_list:
            raise UserError("--sizes is empty")
        if not 1 <= runs <= MAX_REPEATS:
            raise UserError(f"--runs must be from 1 to {MAX_REPEATS:,}, got {runs}")
        if memory_bytes is not None and not (math.isfinite(memory_bytes) and memory_bytes > 0):
            raise UserError(f"--memory-bytes must be a number of bytes > 0, got {memory_bytes!r}")
        if not (math.isfinite(stream_bytes) and MIN_STREAM_BYTES <= stream_bytes <= MAX_STREAM_BYTES):
            raise UserError(f"--stream-bytes must be from {MIN_STREAM_BYTES:,} to {MAX_STREAM_BYTES:,} bytes, got "
                            f"{stream_bytes!r}")  # fmt: skip
        hold_outputs(ctx, files={"--output": output}, inputs={})  # writable? before the measurements
        with live_progress(labels={"calibrate": "calibrating"}, counts=True) as on_progress:
            res = calibrate(devices, options=RunOptions(engine=engine, **dataclasses.asdict(opts)), sizes=size_list,
                            runs=runs, seed=seed, progress=on_progress, memory_bytes=memory_bytes,
                            stream_bytes=int(stream_bytes))  # fmt: skip
        save_cluster(res.cluster, output)
        out = {
            "cluster": str(output),
            "engine": engine,
            "device_type": opts.device_type,
            "num_devices": devices,
            "runs": res.runs,
            "dispatch_s": res.dispatch_s,
            "kernels": res.kernel_fits,
            "links": res.link_fits,
            "memory": res.memory_fits,
        }
        if json_out:
            emit_json(out)
            return
        from rich.table import Table

        from doppler.report import format_time

        dev_name = "gpu" if opts.device_type == "cuda" else "cpu"
        table = Table(title=f"kernels ({engine}, {devices} {opts.device_type} devices, dispatch {format_time(res.dispatch_s)} per op)",
                      show_edge=False, header_style="bold")  # fmt: skip
        for col in ("device", "kind", "ops", "fixed", "GFLOP/s", "weights GB/s", "median |err|"):
            table.add_column(col, justify="left" if col in ("device", "kind") else "right")
        for f in res.kernel_fits:
            rate = "-" if f["flops_per_s"] >= 1e29 else f"{f['flops_per_s'] / 1e9:.3g}"
            weights = f.get("weight_read_Bps")
            table.add_row(f"{dev_name}{f['device']}", f["kind"] + (" (weights)" if f.get("section") == "memory" else ""),
                          str(f["n"]), format_time(f["overhead_s"]), rate,
                          "-" if weights is None else f"{weights / 1e9:.3g}", f"{100 * f['median_rel_error']:.0f}%")  # fmt: skip
        console.print(table)
        made_by = "the receiving device" if res.cluster.copies_inbound.any() else "each link, beside the ops"
        links = Table(title=f"links (copies made by {made_by})", show_edge=False, header_style="bold")
        for col in ("link", "copies", "latency", "GB/s", "median |err|"):
            links.add_column(col, justify="left" if col == "link" else "right")
        for f in res.link_fits:
            links.add_row(f"{dev_name}{f['src']} -> {dev_name}{f['dst']}", str(f["n"]), format_time(f["latency_s"]),
                          f"{f['bandwidth_Bps'] / 1e9:.3g}", f"{100 * f['median_rel_error']:.0f}%")  # fmt: skip
        console.print(links)
        if res.memory_fits:
            memory = Table(title=f"memory (STREAM kernels, {int(stream_bytes):,} bytes per array, every device at once)",
                           show_edge=False, header_style="bold")  # fmt: skip
            for col in ("device", "copy GB/s", "add GB/s", "bandwidth GB/s"):
                memory.add_column(col, justify="left" if col == "device" else "right")
            for f in res.memory_fits:
                memory.add_row(f"{dev_name}{f['device']}", f"{f['copy_Bps'] / 1e9:.3g}", f"{f['add_Bps'] / 1e9:.3g}",
                               f"{f['bandwidth_Bps'] / 1e9:.3g}")  # fmt: skip
            console.print(memory)
        console.print(f"cluster -> {output}", highlight=False)


@app.command("validate")
@engine_options
def validate_cmd(
    ctx: typer.Context,
    graph_path: Path = GRAPH_ARG,
    cluster_name: str = typer.Option(..., "--cluster", "-c", help="Calibrated cluster JSON (from `doppler calibrate`)."),
    engine: str = ENGINE_OPT,
    n: int = typer.Option(30, "--n", help="Number of assignments."),
    repeats: int = typer.Option(3, "--repeats", "-r", help="Runs per assignment (interleaved, shuffled); median taken."),
    seed: int = typer.Option(0, "--seed", help="Seed of the assignments, inputs and run order."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the simulated-vs-measured scatter plot (.png, .svg, .pdf, ...: by extension)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write every assignment's numbers as JSON."),
    dispatch: str = typer.Option("fifo", "--dispatch", help="Simulator dispatch rule: fifo (local engine) or priority (dask)."),
    time_scale: float = TIME_SCALE_OPT,
    opts: EngineOptions = ENGINE_OPTIONS,
    json_out: bool = JSON_OPT,
) -> None:
    """Run many assignments through simulator and engine; report rank correlation and error."""
    with handle_errors():

        from doppler.engine import RunOptions, check_options, check_time_scale
        from doppler.engine.validate import MAX_ASSIGNMENTS, scatter_plot, validate
        from doppler.ir.formats import load_graph
        from doppler.hardware.presets import cluster
        from doppler.util.io import write_json
        from doppler.workloads.references import require_values

        cl = cluster(cluster_name)
        check_options(engine, cl.num_devices, repeats, opts.timeout_s, seed, opts.device_type)
        check_time_scale(time_scale)
        if not 2 <= n <= MAX_ASSIGNMENTS:
            raise UserError(f"--n must be from 2 to {MAX_ASSIGNMENTS:,}, got {n}")
        if dispatch not in ("fifo", "priority"):
            raise UserError(f"--dispatch must be fifo or priority, got {dispatch!r}")
        if plot is not None:
            from doppler.report import figure_format

            figure_format(plot)
        hold_outputs(ctx, files={"--plot": plot, "--output": output},
                     inputs={"G": graph_path, "--cluster": cluster_name})  # fmt: skip
        graph = load_graph(graph_path)
        require_values(graph, str(graph_path))
        with live_progress(labels={"validate": "validating"}, counts=True) as on_progress:
            options = RunOptions(engine=engine, repeats=repeats, warmup=1, **dataclasses.asdict(opts))
            res = validate(graph, cl, options=options, n=n, seed=seed, dispatch=dispatch, time_scale=time_scale,
                           progress=on_progress)  # fmt: skip
        if plot is not None:
            scatter_plot(res, plot)
        if output is not None:
            write_json(output, res.to_json(), indent=1)
        summary = {k: v for k, v in res.to_json().items() if k != "assignments"}
        if plot is not None:
            summary["plot"] = str(plot)
        if json_out:
            emit_json(summary)
            return
        rt = "n/a" if res.retest_spearman is None else f"{res.retest_spearman:.3f}"
        console.print(
            f"[bold]{escape(graph.name)}[/] on {escape(cl.name)} ({engine} engine), {res.n} assignments x {repeats} runs:\n"
            f"  Spearman rank correlation [bold]{res.spearman:.3f}[/] (the engine against itself: {rt})\n"
            f"  mean |error| [bold]{res.mean_abs_pct_error:.1f}%[/], max {res.max_abs_pct_error:.1f}%, "
            f"bias {res.bias_pct:+.1f}% (positive: the simulator overestimates)",
            markup=True,
            highlight=False,
        )
        if plot is not None:
            console.print(f"scatter plot -> {plot}", highlight=False)
