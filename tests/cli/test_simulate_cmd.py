"""End-to-end tests of `doppler simulate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from doppler.cli import app
from doppler.hardware.files import save_cluster
from doppler.ir.formats import save_graph
from doppler.ir.graph import from_edges

runner = CliRunner()


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    g = from_edges([2, 1, 1, 1, 1], [(1, 2), (1, 3), (0, 4)], [0, 1, 0, 0, 0], name="tiny")
    gp = tmp_path / "g.json"
    save_graph(g, gp)
    good = tmp_path / "a.json"
    good.write_text(json.dumps({"assignment": [0, 1, 1, 0, 0], "method": "manual"}))
    short = tmp_path / "short.json"
    short.write_text(json.dumps([0, 1, 1]))
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps([0, 1, 1, 0, 7]))
    return {"graph": gp, "good": good, "short": short, "unknown": unknown, "dir": tmp_path}


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_simulate_human_output(files) -> None:
    res = run("simulate", files["graph"], "--cluster", "unit:2", "--assignment", files["good"])
    assert res.exit_code == 0, res.output
    assert "makespan" in res.output and "4 units" in res.output  # unit-cost cluster: cost units, not seconds
    assert "gpu0" in res.output and "utilisation" in res.output


def test_simulate_json_gantt_and_trace(files) -> None:
    png, tj = files["dir"] / "g.png", files["dir"] / "t.json"
    res = run(
        "simulate", files["graph"], "--cluster", "unit:2", "--assignment", files["good"],
        "--json", "--gantt", png, "--trace", tj,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["makespan_s"] == 4.0
    assert out["lower_bound_s"] == 3.0  # the chain 0 -> 4
    assert out["mode"] == "wc" and out["num_ops"] == 5 and out["num_devices"] == 2
    assert out["utilisation"] == pytest.approx([1.0, 0.5])
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(tj.read_text())["ops"]["start_s"] == [0, 0, 1, 2, 3]


def test_simulate_bsp_noise_contention(files) -> None:
    res = run(
        "simulate", files["graph"], "-c", "unit:2", "-a", files["good"], "--mode", "bsp",
        "--noise", "0.1", "--seed", "3", "--link-contention", "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["mode"] == "bsp" and out["makespan_s"] > 0


@pytest.mark.parametrize(
    "key,extra,msg",
    [
        ("short", [], "3 entries but graph"),
        ("unknown", [], "assigned to device 7"),
        ("good", ["--mode", "async"], "unknown simulation mode"),
        ("good", ["--noise", "nan"], "noise_sigma"),
        ("good", ["--dispatch", "lifo"], "unknown dispatch 'lifo' (use one of: fifo, priority)"),
        ("good", ["--dispatch", "priority", "--mode", "bsp"], 'dispatch="priority" needs mode="wc"'),
    ],
)
def test_simulate_bad_input_exits_2(files, key: str, extra: list[str], msg: str) -> None:
    res = run("simulate", files["graph"], "--cluster", "unit:2", "--assignment", files[key], *extra)
    assert res.exit_code == 2, res.output
    assert msg in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_simulate_priority_dispatch(tmp_path: Path) -> None:
    """d0 is busy until 4 while op 2 becomes ready at 3 and op 1 at 3.5: FIFO runs op 2 first,
    --dispatch priority (op-id order) runs op 1 first."""
    gp, ap = tmp_path / "g.json", tmp_path / "a.json"
    save_graph(from_edges([4, 1, 1, 3, 0.5], [(3, 2), (4, 1)], [0, 0, 0, 0, 0], name="late"), gp)
    ap.write_text(json.dumps([0, 0, 0, 1, 1]))
    starts = {}
    for dispatch in ("fifo", "priority"):
        tj = tmp_path / f"{dispatch}.json"
        res = run("simulate", gp, "-c", "unit:2", "-a", ap, "--dispatch", dispatch, "--trace", tj, "--json")
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["dispatch"] == dispatch and out["makespan_s"] == 6.0
        starts[dispatch] = json.loads(tj.read_text())["ops"]["start_s"]
    assert starts == {"fifo": [0, 5, 4, 0, 3], "priority": [0, 4, 5, 0, 3]}
    res = run("simulate", gp, "-c", "unit:2", "-a", ap, "--dispatch", "priority")
    assert res.exit_code == 0, res.output
    assert "priority dispatch" in res.output


@pytest.mark.parametrize("name,msg", [("p100x9", "unknown cluster"), ("v100x8:4", "fixed 8-device"), ("missing.json", "no such cluster file")])
def test_simulate_bad_cluster_exits_2(files, name: str, msg: str) -> None:
    res = run("simulate", files["graph"], "--cluster", name, "--assignment", files["good"])
    assert res.exit_code == 2, res.output
    assert msg in res.output


def test_simulate_missing_graph_exits_2(files) -> None:
    res = run("simulate", files["dir"] / "nope.json", "--cluster", "unit", "--assignment", files["good"])
    assert res.exit_code == 2, res.output


def test_simulate_writes_chrome_trace_and_ops_csv(files) -> None:
    d = files["dir"]
    res = run("simulate", files["graph"], "--cluster", "unit:2", "--assignment", files["good"],
              "--chrome-trace", d / "c.json", "--ops-csv", d / "o.csv", "--trace", d / "t.json", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["chrome_trace"] == str(d / "c.json") and out["ops_csv"] == str(d / "o.csv")
    assert "traceEvents" in json.loads((d / "c.json").read_text())
    assert (d / "o.csv").read_text().splitlines()[0] == "op,name,kind,device,ready_s,start_s,end_s"
    assert "name" in json.loads((d / "t.json").read_text())["ops"]


def test_gantt_format_follows_the_extension_and_unknown_ones_exit_2(files) -> None:
    d = files["dir"]
    bad = run("simulate", files["graph"], "--cluster", "unit:2", "--assignment", files["good"], "--gantt", d / "g.bmp")
    assert bad.exit_code == 2 and "g.bmp" in bad.output and ".bmp" in bad.output and "png" in bad.output
    assert not (d / "g.bmp").exists()
    ok = run("simulate", files["graph"], "--cluster", "unit:2", "--assignment", files["good"], "--gantt", d / "g.jpg")
    assert ok.exit_code == 0, ok.output
    assert (d / "g.jpg").read_bytes()[:3] == b"\xff\xd8\xff"  # JPEG, not PNG bytes under a .jpg name


def _graph_file(d, name: str, ops: dict, edges: dict):
    p = d / f"{name}.json"
    p.write_text(json.dumps({"format": "doppler-graph", "version": 1, "name": name,
                             "ops": {"kind": ["matmul"] * len(ops["flops"]), **ops}, "edges": edges}))  # fmt: skip
    return p


def test_clean_one_line_messages_for_bad_costs_edges_and_devices(files) -> None:
    d = files["dir"]
    big = _graph_file(d, "big", {"flops": [1e308, 1e308], "output_bytes": [1, 1]}, {"src": [0], "dst": [1]})
    res = run("graph", "info", big)
    assert res.exit_code == 2 and "op 0" in res.output and "overflows" in res.output and "inf" not in res.output
    short = _graph_file(d, "short", {"flops": [1, 1], "output_bytes": [1, 1]}, {"src": [0, 1], "dst": [1]})
    res = run("graph", "info", short)
    assert res.exit_code == 2 and "one per edge" in res.output
    dup = _graph_file(d, "dup", {"flops": [1, 1], "output_bytes": [1, 1]}, {"src": [0, 0], "dst": [1, 1]})
    res = run("graph", "info", dup)
    assert res.exit_code == 0 and "warning: graph 'dup': merged 1 duplicate edge(s)" in res.output
    assert "UserWarning" not in res.output and "graph.py" not in res.output
    for text, needle in (("[0, 1e30]", "device 1e+30, not a device index"), ("[0, 0.5]", "non-integer device 0.5"),
                         ("[0, 5]", "device 5, but the cluster has devices 0..1")):  # fmt: skip
        a = d / "bad_a.json"
        a.write_text(text)
        res = run("simulate", dup, "--cluster", "unit:2", "--assignment", a)
        assert res.exit_code == 2 and needle in res.output and "bad_a.json" in res.output, res.output
        assert "np.float64" not in res.output


def _small_memory_cluster(d: Path, memory_bytes: float) -> Path:
    from dataclasses import replace

    from doppler.hardware.presets import cluster

    cl = cluster("p100x4:2")
    cl = replace(cl, name="small", devices=[replace(dv, memory_bytes=memory_bytes) for dv in cl.devices])
    p = d / "small.json"
    save_cluster(cl, p)
    return p


def test_memory_is_reported_and_a_placement_over_budget_exits_2_writing_nothing(files) -> None:
    d = files["dir"]
    roomy = run("simulate", files["graph"], "-c", _small_memory_cluster(d, 1e9), "-a", files["good"], "--json")
    assert roomy.exit_code == 0, roomy.output
    out = json.loads(roomy.stdout)
    assert out["peak_memory_bytes"] == [1.0, 1.0] and out["resident_bytes"] == [0.0, 0.0]  # op 1 (1 byte), its copy
    assert out["memory_bytes"] == [1e9, 1e9] and out["memory_budget_bytes"] == [0.9e9, 0.9e9] and out["feasible"]
    tight = _small_memory_cluster(d, 1.0)  # a budget of 0.9 B
    trace = d / "t.json"
    refused = run("simulate", files["graph"], "-c", tight, "-a", files["good"], "--trace", trace)
    assert refused.exit_code == 2 and "gpu0 holds 1 B at peak (0 B of it weights), over its budget of 1 B" in refused.output
    assert "Traceback" not in refused.output and not trace.exists() and len(refused.output.strip().splitlines()) == 1
    warned = run("simulate", files["graph"], "-c", tight, "-a", files["good"], "--ignore-memory", "--json")
    assert warned.exit_code == 0 and "warning:" in warned.stderr and "does not fit" in warned.stderr
    assert json.loads(warned.stdout)["feasible"] is False
    fits = run("simulate", files["graph"], "-c", tight, "-a", files["good"], "--memory-fraction", "1", "--json")
    assert fits.exit_code == 0 and json.loads(fits.stdout)["feasible"] is True
    bad = run("simulate", files["graph"], "-c", tight, "-a", files["good"], "--memory-fraction", "1.5")
    assert bad.exit_code == 2 and "--memory-fraction must be a number in (0, 1]" in bad.output


def test_times_are_seconds_on_real_clusters(files) -> None:
    res = run("simulate", files["graph"], "-c", "p100x4:2", "-a", files["good"])
    assert res.exit_code == 0 and "units" not in res.output and " µs" in res.output


def test_gantt_memory_adds_a_panel_and_needs_the_gantt(files) -> None:
    png, mem_png = files["dir"] / "plain.png", files["dir"] / "mem.png"
    args = ("simulate", files["graph"], "-c", "p100x4:2", "-a", files["good"])
    assert run(*args, "--gantt", png).exit_code == 0
    assert run(*args, "--gantt", mem_png, "--gantt-memory").exit_code == 0
    assert mem_png.stat().st_size > png.stat().st_size  # (a second panel)
    alone = run(*args, "--gantt-memory")
    assert alone.exit_code == 2 and "give --gantt too" in alone.output
