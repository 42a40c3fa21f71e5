"""``doppler methods`` and ``doppler clusters`` (what exists), and ``doppler --version``."""

from typing import Any, Optional

import typer
from rich.markup import escape

from doppler.cli._common import JSON_OPT, app, console, emit_json, handle_errors



def _version(value: bool) -> None:
    if value:
        from doppler import __version__

        console.print(f"doppler {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def main_options(
    version: Optional[bool] = typer.Option(
        None, "--version", callback=_version, is_eager=True, help="Print doppler's version and exit."
    ),
) -> None:
    """Learn where each op of a dataflow graph should run on a work-conserving multi-device engine."""


@app.command("methods")
def methods_cmd(
    name: Optional[str] = typer.Argument(None, metavar="[NAME]", help="One method: list its options."),
    json_out: bool = JSON_OPT,
) -> None:
    """List the placement methods: name, what it does, whether it uses a search budget, its options. With NAME,
    that method's options: type, default, the flag that sets it (else `assign --set NAME=VALUE`) and help."""
    from rich.table import Table

    with handle_errors():
        from doppler.cli.method_options import options_of, to_text
        from doppler.methods import get_method, list_methods

        if name is not None:
            spec = get_method(name)
            opts = [{"name": o.name, "type": o.type_name, "default": to_text(o.default), "flag": o.flag or ("--set" if o.type else "python only"),
                     "help": o.help} for o in options_of(spec)]  # fmt: skip
            if json_out:
                emit_json(opts)
                return
            console.print(f"[bold]{name}[/]: {escape(spec.description)}", markup=True, highlight=False)
            if not opts:
                console.print("no options", highlight=False)
                return
            table = Table(show_edge=False, header_style="bold")
            for col in ("option", "type", "default", "set by", "help"):
                table.add_column(col)
            for o in opts:
                table.add_row(o["name"], o["type"], o["default"], o["flag"], o["help"])
            console.print(table)
            return
        rows = []
        for m in list_methods():
            spec = get_method(m)
            rows.append({"name": m, "description": spec.description, "min_devices": spec.min_devices,
                         "uses_budget": spec.uses_budget, "deterministic": spec.deterministic,
                         "options": spec.option_names()})  # fmt: skip
        if json_out:
            emit_json(rows)
            return
        table = Table(show_edge=False, header_style="bold", caption="doppler methods NAME: a method's options")
        for col in ("method", "budget", "deterministic", "options", "description"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["name"], "yes" if r["uses_budget"] else "-", "yes" if r["deterministic"] else "seeded",
                          str(len(r["options"])) if r["options"] else "-", r["description"])  # fmt: skip
        console.print(table)


def _cluster_row(name: str, scalable: bool) -> dict[str, Any]:
    import numpy as np

    from doppler.hardware.presets import cluster

    cl = cluster(name)
    off = ~np.eye(cl.num_devices, dtype=bool)
    bw = cl.bandwidth_Bps[off] if cl.num_devices > 1 else np.array([np.inf])
    lat = cl.latency_s[off] if cl.num_devices > 1 else np.array([0.0])
    return {
        "name": name,
        "devices": cl.num_devices,
        "device_count_settable": scalable,
        "kind": cl.devices[0].kind,
        "model": "roofline" if cl.roofline else "plain",
        "flops_per_s": [float(d.op_rate("matmul", "float32")[0]) for d in cl.devices],
        "peak_flops_by_dtype": cl.devices[0].peak_flops_by_dtype or None,
        "memory_bandwidth_Bps": cl.devices[0].memory_bandwidth_Bps,
        "gpu": cl.meta.get("gpu"),
        "link_bandwidth_Bps": [float(bw.min()), float(bw.max())],
        "link_latency_s": [float(lat.min()), float(lat.max())],
    }


@app.command("clusters")
def clusters_cmd(json_out: bool = JSON_OPT) -> None:
    """List the cluster presets: device count, the GPU, achieved float32 matmul FLOP/s and float16 peak per
    device, memory bandwidth, link bandwidths and latencies."""
    from rich.table import Table

    with handle_errors():
        from doppler.hardware.presets import PRESETS
        from doppler.report import format_time

        rows = [_cluster_row(name, scalable) for name, (_, _, scalable) in PRESETS.items()]
        if json_out:
            emit_json(rows)
            return
        table = Table(show_edge=False, header_style="bold",
                      caption="name:N sets the device count of the presets marked 'yes'; a JSON file works too")  # fmt: skip
        for col in ("preset", "devices", "name:N", "device", "fp32 FLOP/s", "fp16 peak", "memory", "link bandwidth",
                    "link latency"):  # fmt: skip
            table.add_column(col, justify="left" if col in ("preset", "device") else "right")

        def span(lo: float, hi: float, fmt) -> str:
            return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"

        for r in rows:
            flops = span(min(r["flops_per_s"]), max(r["flops_per_s"]), lambda x: f"{x:.3g}")
            gbs = lambda x: f"{x / 1e9:.3g} GB/s" if x >= 1e6 else f"{x:g} B/s"  # noqa: E731
            bw = span(*r["link_bandwidth_Bps"], gbs)
            lat = span(*r["link_latency_s"], format_time)
            fp16 = (r["peak_flops_by_dtype"] or {}).get("float16")
            mem = r["memory_bandwidth_Bps"]
            table.add_row(r["name"], str(r["devices"]), "yes" if r["device_count_settable"] else "no",
                          r["gpu"] or r["kind"], flops, "-" if fp16 is None else f"{fp16:.3g}",
                          "-" if mem is None else f"{mem / 1e9:.4g} GB/s", bw, lat)  # fmt: skip
        console.print(table)
