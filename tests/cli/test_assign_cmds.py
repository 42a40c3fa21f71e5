"""End-to-end tests of `doppler assign` and `doppler compare`."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from doppler.ir.assignment import load_assignment
from doppler.cli import app
from doppler.hardware.files import save_cluster
from doppler.ir.formats import load_graph, save_graph

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory) -> Path:
    from doppler import workloads

    p = tmp_path_factory.mktemp("g") / "ffnn.json"
    save_graph(workloads.build("ffnn", size="tiny"), p)
    return p


def test_assign_writes_the_file(graph_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    res = run("assign", str(graph_file), "--cluster", "p100x4", "--method", "critical_path", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "critical_path" in res.stdout and "makespan" in res.stdout
    obj = json.loads(out.read_text())
    g = load_graph(graph_file)
    assert obj["method"] == "critical_path"
    assert obj["graph_fingerprint"] == g.fingerprint()
    assert len(obj["assignment"]) == g.num_ops
    a = load_assignment(out, g)
    from doppler.methods import assign
    from doppler.hardware.presets import cluster

    assert a.devices.tolist() == assign(g, cluster("p100x4"), "critical_path").devices.tolist()


def test_assign_json_with_budget_and_seed(graph_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    res = run(
        "assign", str(graph_file), "--cluster", "p100x4", "--method", "anneal",
        "--budget-s", "0.3", "--seed", "3", "-o", str(out), "--json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)
    assert row["method"] == "anneal" and row["seed"] == 3
    assert row["makespan_s"] >= row["lower_bound_s"] > 0
    assert row["estimated_makespan_s"] == pytest.approx(row["makespan_s"])
    assert out.exists()


def test_assign_heft_lookahead_is_never_worse_than_heft(graph_file: Path, tmp_path: Path) -> None:
    rows = {}
    for method in ("heft", "heft_lookahead"):
        res = run("assign", str(graph_file), "-c", "v100x8", "-m", method, "-o", str(tmp_path / f"{method}.json"),
                  "--json")  # fmt: skip
        assert res.exit_code == 0, res.output
        rows[method] = json.loads(res.stdout)
    assert rows["heft_lookahead"]["makespan_s"] <= rows["heft"]["makespan_s"] * (1 + 1e-9)
    assert rows["heft_lookahead"]["estimated_makespan_s"] == pytest.approx(rows["heft_lookahead"]["makespan_s"])


def test_assign_threads_same_search_and_bad_counts_exit_2(graph_file: Path, tmp_path: Path) -> None:
    """--threads sets the cores of anneal's simulations (that the search stays the same is
    tests/methods/test_anneal.py's); a count below 1, or a method that does not search, exits 2 with
    one line and writes nothing."""
    for threads in ("1", "2"):
        out = tmp_path / f"a{threads}.json"
        res = run("assign", str(graph_file), "-c", "p100x4", "-m", "anneal", "--budget-s", "0.3", "--seed", "2",
                  "--threads", threads, "-o", str(out), "--json")  # fmt: skip
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["makespan_s"] >= json.loads(res.stdout)["lower_bound_s"] > 0
    devices = []
    for threads in ("1", "3"):  # heft_lookahead: the rollout's devices side by side, the same assignment
        out = tmp_path / f"h{threads}.json"
        res = run("assign", str(graph_file), "-c", "p100x4", "-m", "heft_lookahead", "--threads", threads, "-o",
                  str(out))  # fmt: skip
        assert res.exit_code == 0, res.output
        devices.append(json.loads(out.read_text())["assignment"])
    assert devices[0] == devices[1]
    out = tmp_path / "bad.json"
    for args in (["-m", "anneal", "--threads", "0"], ["-m", "heft", "--threads", "2"]):
        res = run("assign", str(graph_file), "-c", "p100x4", *args, "-o", str(out))
        assert res.exit_code == 2 and "threads" in res.output and len(res.output.strip().splitlines()) == 1
        assert not out.exists()


def test_compare_json_and_csv(graph_file: Path, tmp_path: Path) -> None:
    from doppler.hardware.presets import cluster
    from doppler.methods import assign
    from doppler.sim import lower_bound, simulate

    csv_path = tmp_path / "cmp.csv"
    t0 = time.perf_counter()
    res = run(
        "compare", str(graph_file), "--cluster", "p100x4", "--methods", "round_robin,heft,critical_path",
        "--json", "--csv", str(csv_path),
    )  # fmt: skip
    wall_s = time.perf_counter() - t0
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["method"] for r in rows] == ["round_robin", "heft", "critical_path"]
    # the CLI's numbers against the library's, computed here on their own
    g, c = load_graph(graph_file), cluster("p100x4")
    lb = lower_bound(g, c)
    ms = {m: simulate(g, c, assign(g, c, m)).makespan_s for m in ("round_robin", "heft", "critical_path")}
    for r in rows:
        assert r["lower_bound_s"] == pytest.approx(lb) and r["makespan_s"] == pytest.approx(ms[r["method"]])
        assert r["ratio_to_lower_bound"] == pytest.approx(ms[r["method"]] / lb)
        assert r["ratio_to_critical_path"] == pytest.approx(ms[r["method"]] / ms["critical_path"])
        assert 0 < r["assign_time_s"] < wall_s  # seconds, per method, inside the command's own run time
    with csv_path.open() as f:
        got = list(csv.DictReader(f))
    assert [r["method"] for r in got] == ["round_robin", "heft", "critical_path"]
    assert float(got[0]["makespan_s"]) == pytest.approx(rows[0]["makespan_s"])


def test_compare_human_table(graph_file: Path) -> None:
    res = run("compare", str(graph_file), "--cluster", "p100x4:2", "--methods", "single,metis")
    assert res.exit_code == 0, res.output
    assert "single" in res.stdout and "metis" in res.stdout and "lower bound" in res.stdout


def test_compare_ratio_to_critical_path_when_not_listed(graph_file: Path) -> None:
    res = run("compare", str(graph_file), "--cluster", "p100x4", "--methods", "critical_path", "--json")
    ref = json.loads(res.stdout)[0]["makespan_s"]
    res = run("compare", str(graph_file), "--cluster", "p100x4", "--methods", "single", "--json")
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)[0]
    assert row["ratio_to_critical_path"] == pytest.approx(row["makespan_s"] / ref)


def test_unknown_method_exit_2(graph_file: Path, tmp_path: Path) -> None:
    res = run("assign", str(graph_file), "--cluster", "p100x4", "--method", "bogus", "-o", str(tmp_path / "a.json"))
    assert res.exit_code == 2
    assert "bogus" in res.output and "critical_path" in res.output
    assert not (tmp_path / "a.json").exists()
    res = run("compare", str(graph_file), "--cluster", "p100x4", "--methods", "heft,bogus")
    assert res.exit_code == 2 and "bogus" in res.output


@pytest.mark.parametrize("budget", ["0", "-2", "604801", "1e30"])  # (over a week: a search that would not end)
def test_bad_budget_exit_2(graph_file: Path, tmp_path: Path, budget: str) -> None:
    res = run(
        "assign", str(graph_file), "--cluster", "p100x4", "--method", "anneal",
        "--budget-s", budget, "-o", str(tmp_path / "a.json"),
    )  # fmt: skip
    assert res.exit_code == 2
    assert "budget" in res.output
    res = run("compare", str(graph_file), "--cluster", "p100x4", "--methods", "anneal", "--budget-s", budget)
    assert res.exit_code == 2


def test_bad_inputs_exit_2(graph_file: Path, tmp_path: Path) -> None:
    out = str(tmp_path / "a.json")
    missing = str(tmp_path / "missing.json")
    assert run("assign", missing, "--cluster", "p100x4", "--method", "heft", "-o", out).exit_code == 2
    assert run("assign", str(graph_file), "--cluster", "nosuch", "--method", "heft", "-o", out).exit_code == 2
    assert run("compare", str(graph_file), "--cluster", "p100x4", "--methods", " , ").exit_code == 2
    res = run("assign", str(graph_file), "--cluster", "p100x4", "--method", "heft", "--checkpoint", "x.pt", "-o", out)
    assert res.exit_code == 2 and "--checkpoint: method 'heft' has no option 'checkpoint'" in res.output


def test_too_few_devices_exit_2(graph_file: Path, tmp_path: Path) -> None:
    import numpy as np

    from doppler.methods import METHODS, register

    @register("test_needs_8", min_devices=8)
    def fn(graph, cluster, *, seed=0, budget_s=None):
        return np.zeros(graph.num_ops, dtype=np.int64)

    try:
        out = str(tmp_path / "a.json")
        res = run("assign", str(graph_file), "--cluster", "p100x4", "--method", "test_needs_8", "-o", out)
        assert res.exit_code == 2
        assert "at least 8 devices" in res.output
    finally:
        METHODS.pop("test_needs_8", None)


def test_compare_save_dir_writes_every_assignment(graph_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "saved"
    res = runner.invoke(app, ["compare", str(graph_file), "-c", "unit:2", "-m", "single,round_robin",
                              "--save-dir", str(out), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["assignment_file"] for r in rows] == [str(out / "single.json"), str(out / "round_robin.json")]
    g = load_graph(graph_file)
    assert load_assignment(out / "single.json", g).devices.tolist() == [0] * g.num_ops
    assert load_assignment(out / "round_robin.json", g).method == "round_robin"
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = runner.invoke(app, ["compare", str(graph_file), "-c", "unit:2", "-m", "single", "--save-dir", str(blocker)])
    assert bad.exit_code == 2 and "not a directory" in bad.output


def test_diff_shows_both_sides_and_the_moved_ops(graph_file: Path, tmp_path: Path) -> None:
    g = load_graph(graph_file)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([0] * g.num_ops))
    b.write_text(json.dumps([0] * (g.num_ops - 1) + [1]))
    res = runner.invoke(app, ["diff", str(graph_file), str(a), str(b), "-c", "unit:2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["moved_ops"] == 1 and out["moved"][0] == {"op": g.num_ops - 1, "name": g.op_name(g.num_ops - 1),
                                                         "from": 0, "to": 1}  # fmt: skip
    assert out["a"]["transfers"] == 0 and out["a"]["ops_per_device"] == [g.num_ops, 0]
    human = runner.invoke(app, ["diff", str(graph_file), str(a), str(b), "-c", "unit:2"])
    assert human.exit_code == 0 and "1 of" in human.stdout and "ops moved" in human.stdout
    short = tmp_path / "short.json"
    short.write_text("[0]")
    bad = runner.invoke(app, ["diff", str(graph_file), str(a), str(short), "-c", "unit:2"])
    assert bad.exit_code == 2 and "short.json" in bad.output


@pytest.mark.parametrize("args", [["assign", "G", "-c", "unit:2", "-m", "single", "-o", "DIR"],
                                  ["compare", "G", "-c", "unit:2", "-m", "single", "--csv", "DIR"],
                                  ["simulate", "G", "-c", "unit:2", "-a", "DIR"],
                                  ["simulate", "G", "-c", "DIR", "-a", "DIR"],
                                  ["graph", "convert", "G", "DIR"]])  # fmt: skip
def test_a_directory_where_a_file_belongs_is_exit_2_naming_it(graph_file: Path, tmp_path: Path, args) -> None:
    res = runner.invoke(app, [str(graph_file) if a == "G" else str(tmp_path) if a == "DIR" else a for a in args])
    assert res.exit_code == 2, res.output
    assert str(tmp_path) in res.output and "directory" in res.output.lower() and "Traceback" not in res.output


def test_anneal_init_starts_from_a_given_assignment(graph_file: Path, tmp_path: Path) -> None:
    g = load_graph(graph_file)
    start = tmp_path / "start.json"
    start.write_text(json.dumps([0] * g.num_ops))
    out = tmp_path / "a.json"
    res = run("assign", str(graph_file), "-c", "unit:2", "-m", "anneal", "--budget-s", "0.3", "--init", str(start),
              "-o", str(out), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["makespan_s"] <= float(g.flops.sum())  # never worse than its start (all on one device)
    bad = run("assign", str(graph_file), "-c", "unit:2", "-m", "heft", "--init", str(start), "-o", str(out))
    assert bad.exit_code == 2 and "--init" in bad.output


def _cluster_with_memory(tmp_path: Path, name: str, memory_bytes: float) -> Path:
    from dataclasses import replace

    from doppler.hardware.presets import cluster

    cl = cluster("p100x4")
    path = tmp_path / f"{name}.json"
    save_cluster(replace(cl, name=name, devices=[replace(d, memory_bytes=memory_bytes) for d in cl.devices]), path)
    return path


def test_a_graph_no_placement_fits_exits_2_and_ignore_memory_places_it(graph_file: Path, tmp_path: Path) -> None:
    small = _cluster_with_memory(tmp_path, "small", 100.0)
    out = tmp_path / "a.json"
    for args in (["assign", str(graph_file), "-c", str(small), "-m", "heft", "-o", str(out)],
                 ["compare", str(graph_file), "-c", str(small), "-m", "single,heft"]):  # fmt: skip
        res = run(*args)
        assert res.exit_code == 2 and "does not fit small: the weights alone need" in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1 and not out.exists()
    res = run("assign", str(graph_file), "-c", str(small), "-m", "single", "-o", str(out), "--ignore-memory", "--json")
    assert res.exit_code == 0 and out.exists() and "does not fit" in res.stderr
    row = json.loads(res.stdout)
    assert row["feasible"] is False and row["memory_budget_bytes"] == [90.0] * 4 and row["resident_bytes"][0] > 100


def test_compare_marks_the_placements_over_budget_and_never_calls_them_best(graph_file: Path, tmp_path: Path) -> None:
    from doppler import load_graph
    from doppler.memory import weight_bytes

    g = load_graph(graph_file)
    roomy = json.loads(run("compare", str(graph_file), "-c", "p100x4", "-m", "single,heft", "--json").stdout)
    single_peak = roomy[0]["peak_memory_bytes"][0]
    assert roomy[0]["feasible"] and roomy[0]["resident_bytes"][0] == weight_bytes(g) and roomy[0]["peak_memory_bytes"][1] == 0
    # a budget under what single holds on one device, above what heft spreads over four
    mid = _cluster_with_memory(tmp_path, "mid", single_peak * 0.95 / 0.9)
    res = run("compare", str(graph_file), "-c", str(mid), "-m", "single,heft,critical_path", "--json")
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in json.loads(res.stdout)}
    assert not rows["single"]["feasible"] and rows["single"]["memory_overruns"]
    assert rows["heft"]["feasible"] and rows["critical_path"]["feasible"]
    table = run("compare", str(graph_file), "-c", str(mid), "-m", "single,heft")
    assert table.exit_code == 0 and "fits" in table.stdout and "(over)" in table.stdout
    assert "over the memory budget: single" in table.stdout


def test_bad_seeds_sizes_and_overflowing_times_exit_2_with_one_line(graph_file: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    from doppler.hardware.presets import cluster

    for args in (["assign", str(graph_file), "-c", "p100x4", "-m", "random", "-o", str(tmp_path / "a.json")],
                 ["compare", str(graph_file), "-c", "p100x4", "-m", "random"]):  # fmt: skip
        res = run(*args, "--seed", "-5")
        assert res.exit_code == 2 and "the seed must be an integer >= 0, got -5" in res.output
    res = run("graph", "build", "random", "--set", "max_fan_in=10000000000", "-o", str(tmp_path / "r.json"))
    assert res.exit_code == 2 and "over the maximum of 20000000 edges" in res.output
    res = run("graph", "build", "random", "--set", "flops_median=1e308", "-o", str(tmp_path / "r.json"))
    assert res.exit_code == 2 and "gives costs that overflow" in res.output and "warning" not in res.output
    g = tmp_path / "big.json"
    g.write_text(json.dumps({"format": "doppler-graph", "version": 1, "name": "big",
                             "ops": {"kind": ["matmul", "matmul"], "flops": [1e249, 1e249], "output_bytes": [1, 1]},
                             "edges": {"src": [0], "dst": [1]}}))  # fmt: skip
    cl = cluster("p100x4")
    slow = tmp_path / "slow.json"
    save_cluster(replace(cl, name="slow", devices=[replace(d, peak_flops_by_dtype={"float32": 1e-100}) for d in cl.devices]), slow)
    for args in (["compare", str(g), "-c", str(slow), "-m", "single,critical_path"],
                 ["assign", str(g), "-c", str(slow), "-m", "heft", "-o", str(tmp_path / "h.json")]):  # fmt: skip
        res = run(*args)
        assert res.exit_code == 2, res.output
        assert "compute times overflow when added up (at op op0" in res.output and "warning" not in res.output
        assert "inf s" not in res.stdout and "nan" not in res.stdout
    res = run("assign", str(graph_file), "-c", "p100x4", "-m", "single", "-o", str(graph_file / "x.json"))
    assert res.exit_code == 2 and f"({graph_file} is a file, not a directory)" in res.output


def test_anneal_init_can_ignore_the_fingerprint(graph_file: Path, tmp_path: Path) -> None:
    start = tmp_path / "start.json"
    g = load_graph(graph_file)
    start.write_text(json.dumps({"assignment": [0] * g.num_ops, "graph_fingerprint": "0123456789abcdef"}))
    args = ["assign", str(graph_file), "-c", "unit:2", "-m", "anneal", "--budget-s", "0.2", "--init", str(start),
            "-o", str(tmp_path / "a.json")]  # fmt: skip
    assert run(*args).exit_code == 2
    assert run(*args, "--ignore-fingerprint").exit_code == 0


def test_paths_with_square_brackets_are_printed_as_given(graph_file: Path, tmp_path: Path) -> None:
    """rich reads "[b]" or "[red]" as markup and drops it, and ":fire:" as an emoji: each line must name
    the path the user gave."""
    d = tmp_path / "runs[b]" / "x[red]:fire:"  # and no emoji codes (rich's default would print a flame)
    d.mkdir(parents=True)
    g = d / "g[0].json"
    g.write_bytes(graph_file.read_bytes())
    out = d / "a[1].json"
    res = run("assign", str(g), "--cluster", "p100x4", "--method", "critical_path", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert out.is_file() and f"-> {out}\n" in res.stdout
    res = run("simulate", str(g), "-a", str(out), "--cluster", "p100x4")
    assert res.exit_code == 0, res.output
    txt = d / "g[3].txt"
    res = run("graph", "convert", str(g), str(txt))  # a line without any markup of its own
    assert res.exit_code == 0 and f"{g} -> {txt} (" in res.stdout, res.output
    missing = d / "missing[2].json"
    res = run("assign", str(missing), "--cluster", "p100x4", "--method", "critical_path", "-o", str(out))
    assert res.exit_code == 2
    assert f"error: {missing}: no such graph file" in res.output


def test_a_whole_model_is_placed_by_layers_and_one_too_big_for_the_cluster_exits_2(tmp_path: Path) -> None:
    g = tmp_path / "m.json"
    res = run("graph", "build", "llama_model", "--set", "size=small", "--set", "layers=6", "-o", str(g))
    assert res.exit_code == 0, res.output
    from doppler.memory import weight_bytes

    need = weight_bytes(load_graph(g))
    roomy = _cluster_with_memory(tmp_path, "roomy", need / 2.2 / 0.9)  # under half the weights per device
    for method in ("sequential_fill", "pipeline"):
        out = tmp_path / f"{method}.json"
        res = run("assign", str(g), "-c", str(roomy), "-m", method, "-o", str(out))
        assert res.exit_code == 0, res.output
        used = sorted(set(load_assignment(out).devices.tolist()))
        assert used == list(range(len(used))) and len(used) >= 2  # the first devices, in order
        assert method == "sequential_fill" or len(used) == 4
    small = _cluster_with_memory(tmp_path, "small", need / 5 / 0.9)  # four devices hold 80% of the weights
    res = run("assign", str(g), "-c", str(small), "-m", "pipeline", "-o", str(tmp_path / "no.json"))
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "does not fit small: the weights alone need" in res.output


def test_tensor_parallel_and_tp_pipeline_through_the_cli(tmp_path: Path) -> None:
    """The expert's placements by name, --tp for tp_pipeline, and each refusal exits 2 in one line."""
    g, tiny = tmp_path / "m.json", tmp_path / "tiny.json"
    sets = ["--set", "size=tiny", "--set", "n_kv_heads=4", "--set", "head_blocks=4", "--set", "hidden_blocks=4",
            "--set", "vocab_blocks=4"]  # fmt: skip
    assert run("graph", "build", "llama_model", *sets, "-o", str(g)).exit_code == 0
    assert run("graph", "build", "llama_model", "--set", "size=tiny", "-o", str(tiny)).exit_code == 0
    out = tmp_path / "tp.json"
    res = run("assign", str(g), "-c", "h100x8:4", "-m", "tensor_parallel", "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ops_per_device"] == np.bincount(load_assignment(out).devices).tolist()
    res = run("assign", str(g), "-c", "h100x8:4", "-m", "tp_pipeline", "--tp", "2", "-o", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert sorted(set(load_assignment(out).devices.tolist())) == [0, 1, 2, 3]
    rnd = tmp_path / "r.json"
    assert run("graph", "build", "random", "--set", "size=tiny", "-o", str(rnd)).exit_code == 0
    for args, message in (((str(tiny), "-c", "h100x8", "-m", "tensor_parallel"),
                           "tensor_parallel: head_blocks=2 does not divide over 8 devices (model.layers.0.self_attn"),
                          ((str(rnd), "-c", "h100x8", "-m", "tensor_parallel"), "has no layer structure"),
                          ((str(rnd), "-c", "h100x8", "-m", "tp_pipeline"), "has no layer structure"),
                          ((str(g), "-c", "h100x8:4", "-m", "tp_pipeline", "--tp", "3"),
                           "tp=3 must be a whole number that divides the 4 devices"),
                          ((str(g), "-c", "h100x8:4", "-m", "heft", "--tp", "2"), "--tp: method 'heft' has no option 'tp'")):  # fmt: skip
        res = run("assign", *args, "-o", str(tmp_path / "no.json"))
        assert res.exit_code == 2, res.output
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = run("compare", str(g), "-c", "unit:4", "-m", "tensor_parallel,tp_pipeline,sequential_fill,round_robin_block",
              "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = {r["method"]: r for r in json.loads(res.stdout)}
    assert set(rows) == {"tensor_parallel", "tp_pipeline", "sequential_fill", "round_robin_block"}
    assert rows["tensor_parallel"]["makespan_s"] < rows["sequential_fill"]["makespan_s"]
    assert rows["tp_pipeline"]["makespan_s"] <= rows["tensor_parallel"]["makespan_s"] * (1 + 1e-12)


def test_assign_sets_a_methods_options_by_name_and_refuses_an_unknown_one(graph_file: Path, tmp_path: Path) -> None:
    """`--set OPTION=VALUE` reaches the method, read by the type its options dataclass declares; an option the
    method does not have, a value not of its type or an option text does not set exits 2 in one line, naming it,
    before anything is read (the graph given does not exist) and without writing the output."""
    from doppler.hardware import presets
    from doppler.methods import assign

    out = tmp_path / "a.json"
    res = run("assign", str(graph_file), "-c", "p100x4", "-m", "anneal", "--seed", "1", "--set", "max_evals=64",
              "--set", "batch_size=16", "--set", "prune=false", "-o", str(out), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    alone = assign(load_graph(graph_file), presets.cluster("p100x4"), "anneal", seed=1, max_evals=64, batch_size=16)
    assert load_assignment(out).devices.tolist() == alone.devices.tolist()
    missing = str(tmp_path / "missing.json")
    for args, message in ((("-m", "anneal", "--set", "max_eval=5"), "--set 'max_eval=5': method 'anneal' has no option "
                           "'max_eval' (its options: max_evals, batch_size, cycle_evals, t_start, t_end, start, "
                           "extra_starts, threads, critical_share, prune, pool)"),
                          (("-m", "heft", "--set", "max_evals=5"), "method 'heft' has no option 'max_evals' (it takes "
                           "no options)"),
                          (("-m", "anneal", "--set", "max_evals=x"), "'x' is not a valid integer"),
                          (("-m", "anneal", "--set", "start=0"), "anneal's option start is not read from text; --init "
                           "sets it"),
                          (("-m", "gdp", "--plc-free"), "--plc-ties: method 'gdp' has no option 'plc_ties_only' (its "
                           "options: checkpoint, samples, threads)"),
                          (("-m", "anneal", "--threads", "2", "--set", "threads=2"), "threads is set by --threads too")):  # fmt: skip
        res = run("assign", missing, "-c", "p100x4", *args, "-o", str(tmp_path / "no.json"))
        assert res.exit_code == 2, res.output
        assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (tmp_path / "no.json").exists()
