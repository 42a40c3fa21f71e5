"""End-to-end tests of `doppler graph build|info|convert|draw` and `doppler demo`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from doppler.cli import app
from doppler.ir.formats import load_graph, save_graph

runner = CliRunner()

TEXT = "5\n4\n0,0,1,2\n1,2,3,3\n10,2,einsummable\n20,3,formation\n30,4,select\n5,1,einsummable\n"


def run(*args: str):
    return runner.invoke(app, list(args))


def test_build_then_info_json(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    res = run("graph", "build", "llama_layer", "--set", "size=tiny", "-o", str(out))
    assert res.exit_code == 0, res.output
    res = run("graph", "info", str(out), "--devices", "4", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    graph = load_graph(out)
    assert info["num_ops"] == graph.num_ops and info["num_edges"] == graph.num_edges
    assert info["depth"] == graph.depth
    assert info["total_flops"] == pytest.approx(graph.flops.sum())
    assert 0 < info["critical_path_flops"] <= info["total_flops"]
    # unit cluster: 1 FLOP/s per device, so the bound is at least total work / 4 devices
    assert info["lower_bound_s"] >= info["total_flops"] / 4 - 1e-6
    assert info["num_devices"] == 4


def test_info_applies_the_graph_device_count_only_to_the_default_cluster(tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    assert run("graph", "build", "ffnn", "--set", "size=tiny", "--devices", "4", "-o", str(out)).exit_code == 0
    for args, devices in [((), 4), (("-c", "v100x8"), 8), (("--cluster", "p100x4:2"), 2), (("--devices", "3"), 3)]:
        res = run("graph", "info", str(out), *args, "--json")
        assert res.exit_code == 0, (args, res.output)
        assert json.loads(res.stdout)["num_devices"] == devices, args


def test_params_lists_keys_and_sizes() -> None:
    res = run("graph", "params", "llama_layer", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["defaults"]["dim"] == 4096 and "vocab_blocks" in info["defaults"]
    assert info["presets"]["tiny"]["dim"] < info["defaults"]["dim"]
    res = run("graph", "params")
    assert res.exit_code == 0 and all(w in res.stdout for w in ("chainmm", "ffnn", "llama_block", "random"))
    assert run("graph", "params", "resnet").exit_code == 2


def test_info_human_output(tmp_path: Path) -> None:
    p = tmp_path / "g.txt"
    p.write_text(TEXT)
    res = run("graph", "info", str(p))
    assert res.exit_code == 0, res.output
    assert "num_ops" in res.stdout and "lower_bound (unit)" in res.stdout
    assert " units" in res.stdout  # a text graph on the unit cluster: cost units, not seconds
    res = run("graph", "info", str(p), "--cluster", "p100x4")
    assert res.exit_code == 0 and "units" not in res.stdout


def test_convert_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "g.txt"
    src.write_text(TEXT)
    assert run("graph", "convert", str(src), str(tmp_path / "g.json")).exit_code == 0
    assert run("graph", "convert", str(tmp_path / "g.json"), str(tmp_path / "back.txt")).exit_code == 0
    assert (tmp_path / "back.txt").read_text() == TEXT


def test_draw_writes_a_png(tmp_path: Path) -> None:
    src = tmp_path / "g.txt"
    src.write_text(TEXT)
    res = run("graph", "draw", str(src), "-o", str(tmp_path / "g.png"))
    assert res.exit_code == 0, res.output
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, pattern",
    [
        (("graph", "build", "resnet", "-o", "x.json"), "resnet"),
        (("graph", "build", "ffnn", "--set", "bogus=1", "-o", "x.json"), "bogus"),
        (("graph", "build", "ffnn", "--set", "size", "-o", "x.json"), "size"),
        (("graph", "info", "missing.json"), "no such graph file"),
        (("graph", "info", "g.txt", "--devices", "0"), "--devices"),
        (("graph", "info", "g.txt", "--cluster", "nosuch"), "nosuch"),
        (("graph", "convert", "g.txt", "g.csv"), "unknown graph file extension"),
        (("graph", "info", "bad.txt"), "bad.txt:5"),
        (("graph", "build", "llama_model", "--set", "phase=decode", "--set", "context=0", "-o", "x.json"), "context=0"),
        (("graph", "build", "llama_model", "--set", "phase=decode", "--set", "context=1000001", "-o", "x.json"),
         "context=1000001"),
        (("graph", "build", "llama_model", "--set", "phase=serve", "-o", "x.json"), "phase='serve'"),
        (("graph", "build", "llama_model", "--set", "attention=flash", "-o", "x.json"), "attention='flash'"),
        (("graph", "build", "llama_model", "--set", "context=64", "-o", "x.json"), "context=64 applies to phase=decode"),
        (("graph", "build", "llama_model", "--set", "phase=decode", "--set", "context=8", "--set", "seq_len=4", "-o",
          "x.json"), "seq_len=4 with phase=decode"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path: Path, monkeypatch, args, pattern) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.txt").write_text(TEXT)
    (tmp_path / "bad.txt").write_text(TEXT.replace("10,2,einsummable", "10,x,einsummable"))
    res = run(*args)
    assert res.exit_code == 2, res.output
    message = res.stderr.strip()
    assert pattern in message
    assert "Traceback" not in res.output and len(message.splitlines()) == 1


def _check_demo(tmp_path: Path, names: list[str]) -> None:
    """`doppler demo --json` on a tiny budget: every method and the trained policy on each workload, the
    pictures, and the real-engine part."""
    res = run("demo", "--json", "--budget-s", "0.2", "--train-episodes", "16", "--il-episodes", "8", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert [w["name"] for w in obj["workloads"]] == names
    for w in obj["workloads"]:
        assert set(w["makespan_s"]) == {"round_robin_block", "critical_path", "heft", "metis", "enumerative", "anneal",
                                        "doppler zero-shot", "doppler"}
        assert Path(w["doppler_training_curve_png"]).is_file() and w["doppler_train_s"] > 0
        # one graph on one cluster: the demo's policy tells the devices apart
        assert json.loads((tmp_path / f"doppler_{w['name']}" / "config.json").read_text())["device_identity"] is True
        assert min(w["makespan_s"].values()) >= w["lower_bound_s"] * (1 - 1e-9)
        # anneal starts from the best of critical_path/heft/enumerative and never gets worse
        assert w["makespan_s"]["anneal"] <= min(w["makespan_s"][m] for m in ("critical_path", "heft", "enumerative"))
        assert Path(w["gantt_png"]).read_bytes()[:4] == b"\x89PNG"
        assert Path(w["graph_png"]).exists()
    real = obj["engine"]  # the real-engine part: calibrated cluster, measured next to simulated
    assert [r["method"] for r in real["rows"]] == ["single", "round_robin", "critical_path", "metis"]
    assert all(r["measured_s"] > 0 and r["simulated_s"] > 0 for r in real["rows"])
    assert Path(real["cluster"]).is_file() and Path(real["gantt_png"]).read_bytes()[:4] == b"\x89PNG"


def test_demo_runs_end_to_end_on_one_workload(tmp_path: Path, monkeypatch) -> None:
    """Every step of the demo on its smallest workload (chainmm); all four: test_demo_runs_end_to_end."""
    from doppler.cli import demo_cmd

    monkeypatch.setattr(demo_cmd, "WORKLOADS", ("chainmm",))
    _check_demo(tmp_path, ["chainmm"])


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    _check_demo(tmp_path, ["chainmm", "ffnn", "llama_block", "llama_layer"])


def test_demo_rejects_bad_budget() -> None:
    res = run("demo", "--budget-s", "0")
    assert res.exit_code == 2 and "--budget-s" in res.stderr
    res = run("demo", "--budget-s", "1e30")
    assert res.exit_code == 2 and "--budget-s: the time budget must be at most 604800 s" in res.stderr
    for option in ("--train-episodes", "--il-episodes"):  # (each ran until killed)
        res = run("demo", option, str(10**15))
        assert res.exit_code == 2 and "--il-episodes from 1 to 1,000,000" in res.stderr


def test_demo_refuses_an_output_directory_that_is_a_file_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    res = run("demo", "--out", str(tmp_path / "f" / "demo"))
    # make_run_dir's own wording: the demo's first step, before it writes or trains anything
    assert res.exit_code == 2 and "cannot be an output directory" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert "is a file, not a directory" in res.stderr and res.stdout == ""


def test_convert_to_text_needs_integer_costs_or_round(tmp_path: Path) -> None:
    from doppler import workloads
    from doppler.ir.formats import load_graph, save_graph

    g = workloads.build("random", num_ops=10, seed=0)  # lognormal (non-integer) costs
    src = tmp_path / "g.json"
    save_graph(g, src)
    res = run("graph", "convert", str(src), str(tmp_path / "g.txt"))
    assert res.exit_code == 2 and "g.txt" in res.output and "--round" in res.output and "np.float64" not in res.output
    assert not (tmp_path / "g.txt").exists()
    res = run("graph", "convert", str(src), str(tmp_path / "g.txt"), "--round")
    assert res.exit_code == 0, res.output
    back = load_graph(tmp_path / "g.txt")
    assert np.array_equal(back.flops, np.round(g.flops))


def test_ignore_fingerprint_uses_an_assignment_of_another_graph_version(tmp_path: Path) -> None:
    from doppler.ir.graph import from_edges

    g1 = from_edges([1, 2], [(0, 1)], [1, 1], name="v1")
    g2 = from_edges([1, 3], [(0, 1)], [1, 1], name="v2")  # same ops, another cost
    save_graph(g2, tmp_path / "g2.json")
    a = tmp_path / "a.json"
    a.write_text(json.dumps({"assignment": [0, 1], "graph_fingerprint": g1.fingerprint()}))
    res = run("simulate", str(tmp_path / "g2.json"), "-c", "unit:2", "-a", str(a))
    assert res.exit_code == 2 and "--ignore-fingerprint" in res.output
    res = run("simulate", str(tmp_path / "g2.json"), "-c", "unit:2", "-a", str(a), "--ignore-fingerprint")
    assert res.exit_code == 0, res.output


def test_info_does_not_wrap_a_long_path(tmp_path: Path) -> None:
    p = tmp_path / ("a_rather_long_directory_name_" * 4) / ("graph_file_with_a_long_name_" * 3 + ".txt")
    p.parent.mkdir()
    p.write_text(TEXT)
    res = run("graph", "info", str(p))
    assert res.exit_code == 0 and str(p) in res.stdout


EXAMPLE_MODELS = Path(__file__).resolve().parents[2] / "examples" / "models.py"


def test_import_then_assign_simulate_execute(tmp_path: Path) -> None:
    """A user's model, end to end: import (tiled), assign, simulate, execute on the local engine."""
    g = tmp_path / "mlp.json"
    res = run("graph", "import", f"{EXAMPLE_MODELS}:mlp", "-o", str(g), "--blocks", "256=2", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["num_ops"] == load_graph(g).num_ops > 11 and info["blocks"] == {"256": 2}
    a = tmp_path / "a.json"
    assert run("assign", str(g), "-c", "p100x4:2", "-m", "critical_path", "-o", str(a)).exit_code == 0
    res = run("simulate", str(g), "-a", str(a), "-c", "p100x4:2", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["makespan_s"] > 0
    res = run("execute", str(g), "-a", str(a), "--repeats", "1", "--warmup", "0", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["makespan_s"] > 0


@pytest.mark.parametrize(
    "args, match",
    [
        (["nosuchpkg_xyz:f"], "cannot import nosuchpkg_xyz"),
        ([f"{EXAMPLE_MODELS}:mlp", "--blocks", "256=3"], "do not divide"),
        ([f"{EXAMPLE_MODELS}:mlp", "--input-shape", "x=32x100"], "torch.export failed"),
        ([f"{EXAMPLE_MODELS}:mlp", "--dtype", "int8"], "--dtype"),
        ([f"{EXAMPLE_MODELS}:mlp", "--devices", "0"], "--devices"),
    ],
)
def test_import_bad_input_exits_2_in_one_line(tmp_path: Path, args: list[str], match: str) -> None:
    out = tmp_path / "g.json"
    res = run("graph", "import", *args, "-o", str(out))
    assert res.exit_code == 2, res.output
    assert match in res.output and len(res.output.strip().splitlines()) == 1
    assert not out.exists()


def test_info_gives_the_weights_against_the_clusters_budget(tmp_path: Path) -> None:
    from doppler.memory import weight_bytes

    out = tmp_path / "g.json"
    assert run("graph", "build", "llama_layer", "--set", "size=tiny", "-o", str(out)).exit_code == 0
    info = json.loads(run("graph", "info", str(out), "-c", "p100x4", "--json").stdout)
    assert info["weight_bytes"] == weight_bytes(load_graph(out)) > 0
    assert info["memory_budget_bytes"] == pytest.approx(4 * 16e9 * 0.9) and info["weights_fit"] is True
    tight = json.loads(run("graph", "info", str(out), "-c", "p100x4", "--memory-fraction", "1e-9", "--json").stdout)
    assert tight["weights_fit"] is False
    unlimited = json.loads(run("graph", "info", str(out), "--json").stdout)
    assert unlimited["memory_budget_bytes"] is None and unlimited["weights_fit"] is True
    human = run("graph", "info", str(out), "-c", "p100x4")
    assert "weights / memory budget (p100x4)" in human.stdout and "57.6 GB" in human.stdout


def test_info_counts_the_layer_units_of_a_whole_model(tmp_path: Path) -> None:
    g = tmp_path / "m.json"
    assert run("graph", "build", "llama_model", "--set", "size=tiny", "--set", "layers=5", "-o", str(g)).exit_code == 0
    res = run("graph", "info", str(g), "--json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    assert (stats["layer_units"], stats["repeated_layers"]) == (8, 5) and stats["ops_per_repeated_layer"] > 0
    plain = tmp_path / "f.json"
    assert run("graph", "build", "ffnn", "--set", "size=tiny", "-o", str(plain)).exit_code == 0
    assert "layer_units" not in json.loads(run("graph", "info", str(plain), "--json").stdout)


def test_build_a_decode_step_and_a_batch(tmp_path: Path) -> None:
    """``--set phase=decode --set context=N``: one new token per sequence over a KV cache of N positions."""
    from doppler.ir.slices import input_slices

    out = tmp_path / "d.json"
    res = run("graph", "build", "llama_model", "--set", "size=tiny", "--set", "phase=decode", "--set", "context=16",
              "--set", "batch=3", "-o", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    g = load_graph(out)
    assert (g.meta["phase"], g.meta["batch"], g.meta["context"]) == ("decode", 3, 16)
    assert g.meta["inputs"]["tokens"] == [3, 1] and g.meta["inputs"]["layers.1.k_cache"] == [3, 16, 2, 8]
    assert len(g.meta["structure"]["layers"]) == 2  # the layer structure survives the file
    slices = input_slices(g)
    assert all(w for name, w in zip(slices.names, slices.weight) if name.endswith("_cache"))


def test_info_shows_which_op_kinds_are_compute_or_memory_bound_on_the_cluster(tmp_path: Path) -> None:
    g = tmp_path / "m.json"  # (unfused attention: its softmax passes are memory-bound)
    assert run("graph", "build", "llama_model", "--set", "size=tiny", "--set", "attention=unfused", "-o", str(g)).exit_code == 0
    res = run("graph", "info", str(g), "-c", "h100x8:2", "--json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.stdout)
    rows = {(r["kind"], r["dtype"]): r for r in stats["roofline"]}
    graph = load_graph(g)
    assert sum(r["ops"] for r in rows.values()) == graph.num_ops  # one device model (two alike): every op once
    assert all(r["device"] == "gpu0" and r["alike"] == 2 and r["model"] == "roofline" for r in rows.values())
    assert all(r["compute_bound"] + r["memory_bound"] == r["ops"] for r in rows.values())
    assert rows[("softmax", "float16")]["memory_bound"] == rows[("softmax", "float16")]["ops"]
    for r in rows.values():  # effective rates never beat the H100's datasheet
        assert r["flop_rate"] <= 989.5e12 and r["byte_rate"] <= 3.35e12
        assert r["time_s"] > 0 and r["flop_rate"] == pytest.approx(r["flops"] / r["time_s"])
    assert stats["dtype_fallbacks"] == []
    human = run("graph", "info", str(g), "-c", "h100x8:2")
    assert human.exit_code == 0 and "memory-bound" in human.stdout and "gpu0 (+1 alike)" in human.stdout
    assert "roofline" not in json.loads(run("graph", "info", str(g), "--json").stdout)  # only with a cluster typed


def test_info_on_a_measured_cpu_cluster_counts_the_ops_bound_by_their_weights(tmp_path: Path) -> None:
    g = tmp_path / "m.json"
    assert run("graph", "build", "llama_model", "--set", "size=tiny", "-o", str(g)).exit_code == 0
    cal = tmp_path / "cal.json"  # a calibrated CPU cluster's shape: per-kind rates and a measured bandwidth
    cal.write_text(json.dumps({"format_version": 2, "name": "cal", "devices": [
        {"name": "cpu0", "kind": "cpu", "flops_per_s": 1e11, "flops_per_s_by_kind": {"add": 1e9}, "memory_bandwidth_Bps": 1e3}]}))
    stats = json.loads(run("graph", "info", str(g), "-c", str(cal), "--json").stdout)
    assert {r["model"] for r in stats["roofline"]} == {"measured"}
    matmul = next(r for r in stats["roofline"] if r["kind"] == "matmul")
    assert 0 < matmul["memory_bound"] < matmul["ops"]  # the weight products, not the attention's (activations alone)
    human = run("graph", "info", str(g), "-c", str(cal))
    assert human.exit_code == 0 and "cpu0 [measured]" in human.stdout


def test_info_says_which_dtypes_run_at_the_float32_peak(tmp_path: Path) -> None:
    g = tmp_path / "m.json"
    assert run("graph", "build", "llama_model", "--set", "size=tiny", "--set", "dtype=bfloat16", "-o", str(g)).exit_code == 0
    stats = json.loads(run("graph", "info", str(g), "-c", "v100x8", "--json").stdout)
    assert {(f["device"], f["dtype"]) for f in stats["dtype_fallbacks"]} == {(f"gpu{i}", "bfloat16") for i in range(8)}
    human = run("graph", "info", str(g), "-c", "v100x8")
    assert "bfloat16 matrix ops run at the float32 peak on gpu0" in " ".join(human.stdout.split())


def _bad_cluster(tmp_path: Path, **device) -> Path:
    dev = {"name": "gpu0", "peak_flops_by_dtype": {"float32": 6.7e13, "float16": 9.9e14},
           "memory_bandwidth_Bps": 3.35e12, "achieved_compute_fraction": 0.8, "achieved_memory_fraction": 0.8,
           "overhead_s": 5e-6}  # fmt: skip
    p = tmp_path / "box.json"
    p.write_text(json.dumps({"format_version": 2, "name": "box", "devices": [dev | device]}))
    return p


@pytest.mark.parametrize(
    "device,field",
    [({"memory_bandwidth_Bps": 0}, "memory_bandwidth_Bps"), ({"memory_bandwidth_Bps": -1}, "memory_bandwidth_Bps"),
     ({"peak_flops_by_dtype": {"float32": 0}}, "peak_flops_by_dtype['float32']"),
     ({"peak_flops_by_dtype": {"float32": 1e13, "float16": -5}}, "peak_flops_by_dtype['float16']"),
     ({"achieved_compute_fraction": 0}, "achieved_compute_fraction"),
     ({"achieved_memory_fraction": 1.01}, "achieved_memory_fraction"), ({"overhead_s": -1e-6}, "overhead_s")],
)  # fmt: skip
def test_a_bad_roofline_cluster_file_exits_2_in_one_line_naming_file_device_and_field(tmp_path: Path, device: dict,
                                                                                      field: str) -> None:  # fmt: skip
    g = tmp_path / "g.json"
    assert run("graph", "build", "ffnn", "--set", "size=tiny", "-o", str(g)).exit_code == 0
    p = _bad_cluster(tmp_path, **device)
    res = run("graph", "info", str(g), "-c", str(p))
    assert res.exit_code == 2, res.output
    line = " ".join(res.output.split())
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert str(p) in line and "gpu0" in line and field in line
