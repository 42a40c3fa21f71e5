"""``doppler methods`` and ``doppler clusters`` (what exists), and ``doppler --version``."""

from typing import Any, Optional

import typer

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
def methods_cmd(json_out: bool = JSON_OPT) -> None:
    """List the placement methods: name, what it does, whether it uses a search budget."""
    from rich.table import Table

    with handle_errors():
        from doppler.methods import get_method, list_methods

        rows = []
        for name in list_methods():
            spec = get_method(name)
            rows.append({"name": name, "description": spec.description, "min_devices": spec.min_devices,
                         "uses_budget": spec.uses_budget, "deterministic": spec.deterministic})  # fmt: skip
        if json_out:
            emit_json(rows)
            return
        table = Table(show_edge=False, header_style="bold")
        for col in ("method", "budget", "deterministic", "description"):
            table.add_column(col)
        for r in rows:
            table.add_row(r["name"], "yes" if r["uses_budget"] else "-", "yes" if r["deterministic"] else "seeded",
                          r["description"])  # fmt: skip
        console.print(table)


def _cluster_row(name: str, scalable: bool) -> dict[str, Any]:
    import numpy as np

    from doppler.presets import cluster

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
        from doppler.presets import PRESETS
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
