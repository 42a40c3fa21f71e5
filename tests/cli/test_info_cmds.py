"""End-to-end tests of `doppler --version`, `doppler methods` and `doppler clusters`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from doppler import __version__
from doppler.methods import list_methods
from doppler.cli import app
from doppler.hardware.presets import PRESETS

runner = CliRunner()


def test_version() -> None:
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"doppler {__version__}"


def test_methods_lists_every_registered_method() -> None:
    res = runner.invoke(app, ["methods", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["name"] for r in rows] == list_methods()
    assert {r["name"] for r in rows if r["uses_budget"]} == {"anneal", "heft_lookahead", "doppler", "doppler_sel", "doppler_plc",
                                                                "single_policy", "gdp", "placeto"}
    human = runner.invoke(app, ["methods"])
    assert human.exit_code == 0 and "critical_path" in human.stdout and "doppler" in human.stdout
    assert "placeto" in human.stdout and "gdp" in human.stdout


def test_methods_name_lists_a_methods_options_from_its_dataclass() -> None:
    """`doppler methods NAME` shows each option of the method's options dataclass: type, default, the flag that
    sets it, and its help; a method without options says so; an unknown name exits 2 in one line."""
    from doppler.methods import get_method

    res = runner.invoke(app, ["methods", "anneal", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert list(rows) == get_method("anneal").option_names()
    assert rows["max_evals"] == {"name": "max_evals", "type": "int | none", "default": "none", "flag": "--set",
                                 "help": rows["max_evals"]["help"]} and "evaluations" in rows["max_evals"]["help"]  # fmt: skip
    assert rows["threads"]["flag"] == "--threads" and rows["start"]["flag"] == "--init"
    assert rows["batch_size"]["default"] == "8" and rows["prune"]["type"] == "true|false"
    assert rows["extra_starts"]["flag"] == "python only"
    human = runner.invoke(app, ["methods", "tp_pipeline"])
    assert human.exit_code == 0 and "tp" in human.stdout and "--tp" in human.stdout and "divisor" in human.stdout
    res = runner.invoke(app, ["methods", "heft"])
    assert res.exit_code == 0 and "no options" in res.stdout
    res = runner.invoke(app, ["methods", "nope"])
    assert res.exit_code == 2 and "unknown method 'nope'" in res.output and len(res.output.strip().splitlines()) == 1
    listed = {r["name"]: r["options"] for r in json.loads(runner.invoke(app, ["methods", "--json"]).stdout)}
    assert listed["heft"] == [] and listed["doppler"] == ["checkpoint", "samples", "threads", "plc_ties_only"]


def test_clusters_lists_every_preset_with_devices_rates_and_links() -> None:
    res = runner.invoke(app, ["clusters", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert set(rows) == set(PRESETS)
    p = rows["p100x4"]
    assert p["devices"] == 4 and p["device_count_settable"]
    assert p["link_bandwidth_Bps"] == [12e9, 12e9] and p["link_latency_s"] == [1e-5, 1e-5]
    assert not rows["v100x8"]["device_count_settable"]
    lo, hi = rows["v100x8"]["link_bandwidth_Bps"]
    assert lo < hi  # the DGX-1's NVLink and PCIe pairs differ
    h100 = rows["h100x8"]
    assert h100["model"] == "roofline" and h100["gpu"] == "H100 SXM5 80 GB"
    assert h100["peak_flops_by_dtype"]["float16"] == pytest.approx(989.5e12) and h100["memory_bandwidth_Bps"] == 3.35e12
    assert h100["flops_per_s"] == [pytest.approx(67e12 * 0.8)] * 8  # a float32 matmul: the non-tensor-core peak
    assert rows["cpu4"]["model"] == "plain" and rows["cpu4"]["memory_bandwidth_Bps"] is None
    human = runner.invoke(app, ["clusters"])
    assert human.exit_code == 0 and "h100x8" in human.stdout and "GB/s" in human.stdout
    assert all(name in human.stdout for name in ("a100x8", "h200x8", "l40sx8", "L40S 48 GB", "3350 GB/s"))
