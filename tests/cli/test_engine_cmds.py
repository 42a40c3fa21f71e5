"""End-to-end tests of `doppler execute`, `doppler calibrate`, `doppler validate` and `train --stages ...,real`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from doppler import workloads
from doppler.cli import app
from doppler.ir.formats import save_graph

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("engine_cli")
    g = workloads.build("ffnn", size="tiny")
    gp = d / "g.json"
    save_graph(g, gp)
    a = d / "a.json"
    a.write_text(json.dumps({"assignment": (np.arange(g.num_ops) % 2).tolist()}))
    short = d / "short.json"
    short.write_text(json.dumps([0, 1]))
    cal = d / "cal.json"
    res = run("calibrate", "-o", cal, "--devices", 2, "--runs", 1, "--sizes", "32,64", "--stream-bytes", "4e6", "--json")
    assert res.exit_code == 0, res.output
    return {"graph": gp, "a": a, "short": short, "cal": cal, "dir": d, "cal_out": json.loads(res.stdout)}


def test_calibrate_json_and_cluster_file(files) -> None:
    cl = json.loads(files["cal"].read_text())
    assert [dv["kind"] for dv in cl["devices"]] == ["cpu", "cpu"]
    assert "overhead_s_by_kind" in cl["devices"][0] and "flops_per_s_by_kind" in cl["devices"][0]
    assert cl["meta"]["engine"] == "local" and cl["meta"]["stream_bytes"] == 4_000_000
    memory = files["cal_out"]["memory"]  # each device's STREAM rates; its bandwidth is the faster kernel's
    assert [m["device"] for m in memory] == [0, 1]
    for m, dev in zip(memory, cl["devices"]):
        assert dev["memory_bandwidth_Bps"] == m["bandwidth_Bps"] == max(m["copy_Bps"], m["add_Bps"]) > 0
    # the memory graph: table copies, their tables read from memory
    weights = [k for k in files["cal_out"]["kernels"] if k.get("section") == "memory"]
    assert {(k["device"], k["kind"]) for k in weights} == {(d, "formation") for d in (0, 1)}
    for k, dev in zip([k for k in weights if k["kind"] == "formation"], cl["devices"]):
        assert dev["weight_read_Bps_by_kind"]["formation"] == k["weight_read_Bps"] > 0


def test_execute_json_keys_check_and_plots(files) -> None:
    d = files["dir"]
    res = run("execute", files["graph"], "-a", files["a"], "-c", files["cal"], "--repeats", 2, "--check",
              "--gantt", d / "g.png", "--trace", d / "t.json", "--chrome-trace", d / "c.json", "--ops-csv", d / "o.csv",
              "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("makespan_s", "makespans_s", "simulated_makespan_s"):
        assert key in out
    assert len(out["makespans_s"]) == 2 and out["outputs_match"] is True
    assert (d / "g.png").stat().st_size > 1000
    assert json.loads((d / "t.json").read_text())["mode"] == "engine:local"
    events = json.loads((d / "c.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" and e["cat"] != "transfer" for e in events) == 168  # ffnn tiny: one per op
    assert len((d / "o.csv").read_text().splitlines()) == 1 + 168


def test_execute_human_output_without_cluster(files) -> None:
    res = run("execute", files["graph"], "-a", files["a"], "--devices", 2, "--repeats", 1)
    assert res.exit_code == 0, res.output
    assert "measured makespan" in res.output and "simulated" in res.output and "with link contention" in res.output


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--engine", "mpi"], "unknown engine"),
        (["--repeats", "0"], "repeats"),
        (["--warmup", "100000"], "warmup must be an integer from 0 to 10000"),
        (["--time-scale", "nan"], "--time-scale must be a number in (0, 1e+06]"),
        (["--time-scale", "0"], "--time-scale"),
        (["--time-scale", "1e12"], "--time-scale"),
        (["--devices", "3", "-c", "CAL"], "does not match"),
        (["--timeout", "-1"], "timeout"),
        (["--device-type", "tpu"], "unknown device type 'tpu'"),
        (["--engine", "dask", "--device-type", "cuda"], "CPU devices only"),
    ],
)
def test_execute_bad_options_exit_2(files, extra, needle) -> None:
    extra = [str(files["cal"]) if x == "CAL" else x for x in extra]
    res = run("execute", files["graph"], "-a", files["a"], *extra)
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_execute_wrong_assignment_exit_2(files) -> None:
    res = run("execute", files["graph"], "-a", files["short"])
    assert res.exit_code == 2 and "short.json" in res.output


def test_validate_json_and_plot(files) -> None:
    d = files["dir"]
    res = run("validate", files["graph"], "-c", files["cal"], "--n", 5, "--repeats", 2, "--plot", d / "v.png",
              "-o", d / "v.json", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("spearman", "mean_abs_pct_error", "max_abs_pct_error", "bias_pct", "retest_spearman", "n"):
        assert key in out
    assert out["n"] == 5
    assert (d / "v.png").stat().st_size > 1000
    assert len(json.loads((d / "v.json").read_text())["assignments"]) == 5
    bad = run("validate", files["graph"], "-c", files["cal"], "--n", 1)
    assert bad.exit_code == 2 and "--n" in bad.output
    bad = run("validate", files["graph"], "-c", files["cal"], "--n", 10**15)  # (it ran until killed)
    assert bad.exit_code == 2 and "--n must be from 2 to 10,000" in bad.output


def test_calibrate_bounds_its_runs_and_sizes(tmp_path: Path) -> None:
    res = run("calibrate", "-o", tmp_path / "cal.json", "--runs", 10**15)
    assert res.exit_code == 2 and "--runs must be from 1 to 10,000" in res.output
    res = run("calibrate", "-o", tmp_path / "cal.json", "--runs", 1, "--sizes", f"32,{10**15}")
    assert res.exit_code == 2 and "must be a multiple of 4 from 4 to 4096" in res.output
    for bad in ("1e15", "100", "nan"):
        res = run("calibrate", "-o", tmp_path / "cal.json", "--runs", 1, "--sizes", "32", "--stream-bytes", bad)
        assert res.exit_code == 2 and "--stream-bytes must be from 65,536 to 1,073,741,824 bytes" in res.output
    assert not (tmp_path / "cal.json").exists()


def test_train_with_a_real_stage(files) -> None:
    out_dir = files["dir"] / "run"
    res = run("train", files["graph"], "-c", files["cal"], "--stages", "il,sim,real", "--il-episodes", 16,
              "--episodes", 16, "--real-episodes", 16, "-o", out_dir, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["real_episodes"] == 16
    g = out["graphs"][0]
    assert g["greedy_measured_makespan_s"] > 0 and g["best_makespan_s"] > 0
    import torch

    ck = torch.load(out_dir / "checkpoint.pt", weights_only=True)
    assert ck["real_episode"] == 16
    hist = json.loads(ck["history"])
    assert any(h.get("stage_real") for h in hist)


def test_execute_cost_only_text_graph_with_synthetic_kernels(tmp_path) -> None:
    from doppler.ir.graph import DataflowGraph

    g = workloads.build("random", num_ops=12, width=4, seed=1)
    h = DataflowGraph.from_arrays(np.round(g.flops / 1e8), np.round(g.output_bytes / 1e3), g.src, g.dst, name="r")
    gp = tmp_path / "r.txt"
    save_graph(h, gp)
    a = tmp_path / "a.json"
    a.write_text(json.dumps((np.arange(h.num_ops) % 2).tolist()))
    res = run("execute", gp, "-a", a, "-c", "unit:2", "--time-scale", "1e-5", "--repeats", 1, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["time_scale"] == 1e-5 and out["makespan_s"] > 0
    from doppler.ir.formats import load_graph
    from doppler.hardware.presets import cluster
    from doppler.sim import simulate

    raw = simulate(load_graph(gp), cluster("unit:2"), np.arange(h.num_ops) % 2, link_contention=True).makespan_s
    assert out["simulated_makespan_s"] == pytest.approx(raw * 1e-5)  # scaled like the synthetic kernels
    val = run("validate", gp, "-c", "unit:2", "--time-scale", "1e-5", "--n", 4, "--repeats", 2, "--json")
    assert val.exit_code == 0, val.output
    assert json.loads(val.stdout)["n"] == 4
    # ops of 0.04-1.8 s (unscaled: up to 365 s), a device's share over 3 s, 10x the timeout: a spin under way when
    # the clock runs out finishes on its worker thread (at --time-scale 1 it kept two cores busy for minutes)
    res = run("execute", gp, "-a", a, "-c", "unit:2", "--time-scale", "0.005", "--timeout", "0.3", "--repeats", 1)
    assert res.exit_code == 2 and "timeout of 0.3 s" in res.output and "Traceback" not in res.output


def test_device_type_cuda_runs_on_a_gpu_or_says_there_is_none(files) -> None:
    import torch

    res = run("execute", files["graph"], "-a", files["a"], "-c", files["cal"], "--repeats", 1, "--device-type", "cuda",
              "--json")  # fmt: skip
    if torch.cuda.is_available():
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["device_type"] == "cuda"
    else:
        assert res.exit_code == 2 and "no CUDA device is visible" in res.output and "Traceback" not in res.output
    cal = run("calibrate", "-o", files["dir"] / "gpu.json", "--device-type", "cuda", "--runs", 1, "--sizes", "32,64")
    assert cal.exit_code == (0 if torch.cuda.is_available() else 2), cal.output


def synthetic_graph_file(d: Path) -> Path:
    """A 4-op cost-only graph and an assignment of it to 2 devices (a.json), in ``d``."""
    from doppler.ir.graph import DataflowGraph

    g = DataflowGraph.from_arrays(np.ones(4), np.full(4, 64.0), np.array([0, 1, 2]), np.array([1, 2, 3]), name="chain")
    save_graph(g, d / "g.txt")
    (d / "a.json").write_text(json.dumps([0, 1, 0, 1]))
    return d / "g.txt"


def _babble(sock: socket.socket) -> None:
    """Answer every connection with bytes that are not Dask's (an SSH server's banner)."""
    while True:
        try:
            conn, _ = sock.accept()
        except OSError:  # the test closed the socket
            return
        with conn:
            conn.sendall(b"SSH-2.0-OpenSSH_8.9p1\r\n" * 50)


@pytest.mark.parametrize("command, peer", [("execute", "refused"), ("execute", "silent"), ("execute", "babbling"),
                                           ("validate", "refused"), ("calibrate", "refused")])  # fmt: skip
def test_an_unreachable_scheduler_fails_within_the_timeout_in_one_line(tmp_path, command, peer) -> None:
    """Nothing listens on the port (Dask retries until the time-out), something accepts and never
    answers (Dask's handshake alone would wait for ever), or something answers with other bytes (a
    half-made Dask client would wait at exit): exit 2 within --timeout, the process gone."""
    g = synthetic_graph_file(tmp_path)
    args = {"execute": ["-a", tmp_path / "a.json", "-c", "unit:2"], "validate": ["-c", "unit:2", "--n", 2],
            "calibrate": ["-o", tmp_path / "cal.json", "--runs", 1, "--sizes", "32"]}[command]  # fmt: skip
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, so no other process takes the port meanwhile
        if peer != "refused":
            sock.listen()  # silent: the kernel completes the TCP handshake; nobody ever reads or writes
        if peer == "babbling":
            threading.Thread(target=_babble, args=(sock,), daemon=True).start()
        # else not listening: every connection is refused
        addr = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
        pos = [] if command == "calibrate" else [g]
        t0 = time.monotonic()
        argv = [sys.executable, "-m", "doppler", command, *map(str, [*pos, *args]), "--engine", "dask",
                "--scheduler", addr, "--timeout", "3"]  # fmt: skip
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        took = time.monotonic() - t0
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and addr in errors[0], res.stderr
    assert took < 40, took  # --timeout 3, and a loaded machine's start-up; the old wait was 60 s (silent: for ever)


def test_the_timeout_help_states_the_connection_bound() -> None:
    from doppler.cli.engine_cmds import TIMEOUT_OPT
    from doppler.engine.dask_cluster import SETUP_TIMEOUT_S

    assert f"at most {SETUP_TIMEOUT_S:g} s" in TIMEOUT_OPT.help


def test_execute_refuses_an_assignment_over_the_memory_budget_before_it_runs(files) -> None:
    from dataclasses import replace

    from doppler.hardware.cluster import Cluster
    from doppler.hardware.files import load_cluster, save_cluster

    tight = files["dir"] / "tight.json"
    cl: Cluster = load_cluster(files["cal"])
    save_cluster(replace(cl, devices=[replace(d, memory_bytes=500.0) for d in cl.devices]), tight)
    trace = files["dir"] / "tight_trace.json"
    res = run("execute", files["graph"], "-a", files["a"], "-c", tight, "--repeats", 1, "--trace", trace)
    assert res.exit_code == 2 and "does not fit: cpu0 holds" in res.output and not trace.exists()
    res = run("execute", files["graph"], "-a", files["a"], "-c", tight, "--repeats", 1, "--ignore-memory", "--json")
    assert res.exit_code == 0 and "does not fit" in res.stderr
    out = json.loads(res.stdout)
    assert out["memory_budget_bytes"] == [450.0, 450.0] and max(out["simulated_peak_memory_bytes"]) > 450


# ------------------------------------------------------------------ a model run with its own weights
HF_MODELS = Path(__file__).resolve().parents[2] / "examples" / "hf_models.py"


def _one_line_exit_2(res, needle: str) -> None:
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and needle in lines[0] and "Traceback" not in res.output, res.output


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> dict[str, Path]:
    """tiny_llama imported on the meta device for 2 devices, placed by anneal, and its weights saved by
    save_pretrained in shards."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HF_MODELS.parent))
    import hf_models

    d = tmp_path_factory.mktemp("tiny_llama")
    hf_models.save("tiny_llama", str(d / "ckpt"), max_shard_size="100KB")
    g, a = d / "g.json", d / "a.json"
    assert run("graph", "import", f"{HF_MODELS}:tiny_llama", "-o", g, "--devices", 2).exit_code == 0
    res = run("assign", g, "-c", "cpu4:2", "-m", "anneal", "--budget-s", 1, "--threads", 1, "-o", a)
    assert res.exit_code == 0, res.output
    return {"g": g, "a": a, "ckpt": d / "ckpt", "dir": d, "ref": f"{HF_MODELS}:tiny_llama"}


def test_execute_weights_check_reference_input_ids(tiny_llama) -> None:
    """A graph imported on the meta device runs with its checkpoint; its logits are the module's; the report
    keeps one measured and one simulated peak per device, and they agree."""
    t = tiny_llama
    ids = t["dir"] / "ids.json"
    ids.write_text(json.dumps([list(range(7, 23))]))
    res = run("execute", t["g"], "-a", t["a"], "-c", "cpu4:2", "--weights", t["ckpt"], "--check", "--reference", t["ref"],
              "--input-ids", ids, "--repeats", 1, "--warmup", 0, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["outputs_match"] is True and out["top1_agree"] == out["positions_checked"] == 16
    assert out["checked_output"] in out["max_rel_error"] and max(out["max_rel_error"].values()) < 1e-5
    assert out["tolerance"] == 1e-4
    assert len(out["peak_memory_bytes"]) == len(out["simulated_peak_memory_bytes"]) == 2
    np.testing.assert_allclose(out["peak_memory_bytes"], out["simulated_peak_memory_bytes"], rtol=0.15)
    # each worker reads its placement's weight slices only: every stored weight (tiny_llama ties its
    # embedding and head: one tensor) at least once, and no more than what the placement keeps resident
    from safetensors import safe_open

    from doppler.ir.assignment import load_assignment
    from doppler.ir.formats import load_graph
    from doppler.memory import resident_bytes

    graph = load_graph(t["g"])
    resident = resident_bytes(graph, load_assignment(t["a"], graph, 2).devices, 2)
    stored = 0
    for f in t["ckpt"].glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            stored += sum(4 * int(np.prod(st.get_slice(k).get_shape())) for k in st.keys())  # float32
    assert stored <= out["weight_bytes_read"] <= resident.sum()
    human = run("execute", t["g"], "-a", t["a"], "--weights", t["ckpt"], "--check", "--reference", t["ref"],
                "--input-ids", 16, "--repeats", 1)  # fmt: skip
    assert human.exit_code == 0, human.output
    assert "logits match" in human.output and "top-1 token agrees at 16 of 16 positions" in human.output


def test_execute_weights_faults_exit_2_in_one_line(tiny_llama, tmp_path) -> None:
    """A checkpoint missing one key, one with a wrong shape, a .bin, and option mix-ups: exit 2, one line."""
    import torch
    from safetensors.torch import load_file, save_file

    t = tiny_llama
    state = {}
    for f in sorted(t["ckpt"].glob("*.safetensors")):
        state.update(load_file(str(f)))
    save_file({k: v for k, v in state.items() if k != "model.layers.1.self_attn.o_proj.weight"}, str(tmp_path / "missing.safetensors"))
    save_file({**state, "model.layers.0.mlp.up_proj.weight": torch.zeros(176, 32)}, str(tmp_path / "shape.safetensors"))
    torch.save(state, tmp_path / "pytorch_model.bin")
    base = ("execute", t["g"], "-a", t["a"], "--repeats", 1)
    for extra, needle in (
        (["--weights", tmp_path / "missing.safetensors"], "no tensor 'model.layers.1.self_attn.o_proj.weight'"),
        (["--weights", tmp_path / "shape.safetensors"], "'model.layers.0.mlp.up_proj.weight' has shape [176, 32]"),
        (["--weights", tmp_path / "pytorch_model.bin"], "a pickle checkpoint (torch.save): loading it would run"),
        (["--weights", tmp_path / "nowhere"], "no such file or directory"),
        (["--weights", t["ckpt"], "--check"], "give --reference"),
        (["--check", "--reference", t["ref"]], "give --weights too"),
        (["--weights", t["ckpt"], "--reference", t["ref"]], "give --check too"),
        (["--weights", t["ckpt"], "--engine", "dask"], "the dask engine does not read checkpoints"),
        (["--weights", t["ckpt"], "--input-ids", 9], "holds 16 ids"),
        ([], "built on the meta device (cost-only), it has no weights to execute"),
    ):  # fmt: skip
        _one_line_exit_2(run(*base, *extra), needle)
    _one_line_exit_2(run(*base, "--weights", t["ckpt"], "--check", "--reference", f"{HF_MODELS}:gpt2"),
                     "no tensor 'transformer.wte.weight', which the reference")


def test_execute_weights_on_a_graph_without_keys_exit_2(files, tiny_llama) -> None:
    _one_line_exit_2(run("execute", files["graph"], "-a", files["a"], "--weights", tiny_llama["ckpt"]),
                     "the graph records no state_dict keys")


@pytest.mark.slow
def test_a_58m_llama_from_its_config_to_checked_logits(tmp_path) -> None:
    """docs/run_weights.md's walk-through on a 58 M-parameter LLaMA (232 MB in float32) and 2 CPU workers:
    save_pretrained in shards, import on the meta device, anneal, execute with its weights against the
    module. Each worker's measured peak is within 15% of the simulated one, and holds its placement's weight
    slices only: the bytes read from the checkpoint are the placement's resident weights. (`make test-all`;
    `make test` checks each of these on tiny_llama: test_execute_weights_check_reference_input_ids.)"""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HF_MODELS.parent))
    import hf_models

    from doppler.ir.assignment import load_assignment
    from doppler.ir.formats import load_graph
    from doppler.memory import resident_bytes

    ckpt, g, a = tmp_path / "ckpt", tmp_path / "g.json", tmp_path / "a.json"
    hf_models.save("llama_58m", str(ckpt), max_shard_size="50MB")
    assert (ckpt / "model.safetensors.index.json").is_file() and len(list(ckpt.glob("*.safetensors"))) >= 4
    res = run("graph", "import", f"{HF_MODELS}:llama_58m", "-o", g, "--devices", 2)
    assert res.exit_code == 0, res.output
    res = run("assign", g, "-c", "cpu4:2", "-m", "anneal", "--budget-s", 2, "--threads", 1, "-o", a)
    assert res.exit_code == 0, res.output
    res = run("execute", g, "-a", a, "-c", "cpu4:2", "--weights", ckpt, "--check", "--reference",
              f"{HF_MODELS}:llama_58m", "--input-ids", 32, "--repeats", 1, "--warmup", 0, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["outputs_match"] is True and out["top1_agree"] == out["positions_checked"] == 32
    measured, simulated = np.array(out["peak_memory_bytes"]), np.array(out["simulated_peak_memory_bytes"])
    assert measured.shape == (2,) and np.all(np.abs(measured - simulated) <= 0.15 * simulated)
    graph = load_graph(g)
    resident = resident_bytes(graph, load_assignment(a, graph, 2).devices, 2)
    weights = sum(4 * np.prod(h["shape"]) for h in graph.meta["weights"].values())
    assert weights > 2.2e8 and out["weight_bytes_read"] <= resident.sum() and out["weight_bytes_read"] >= weights


def test_train_stage_three_with_weights(tiny_llama) -> None:
    """train --weights: Stage III measures the meta-imported model run on its checkpoint."""
    t = tiny_llama
    out_dir = t["dir"] / "run"
    res = run("train", t["g"], "-c", "cpu4:2", "--stages", "il,sim,real", "--il-episodes", 8, "--episodes", 8,
              "--real-episodes", 8, "--batch", 8, "--threads", 1, "--weights", t["ckpt"], "-o", out_dir, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["real_episodes"] == 8 and out["graphs"][0]["greedy_measured_makespan_s"] > 0
    for extra, needle in ((["--stages", "il,sim"], "give --stages with real"),
                          (["--stages", "il,sim,real", "--engine", "dask"], "the dask engine does not read checkpoints")):  # fmt: skip
        bad = run("train", t["g"], "-c", "cpu4:2", *extra, "--weights", t["ckpt"], "-o", t["dir"] / "bad")
        _one_line_exit_2(bad, needle)


def test_calibrate_memory_bytes_gives_each_device_a_budget(tmp_path) -> None:
    cal = tmp_path / "cal.json"
    res = run("calibrate", "-o", cal, "--devices", 2, "--runs", 1, "--sizes", "32", "--memory-bytes", 2e8, "--json")
    assert res.exit_code == 0, res.output
    assert [d["memory_bytes"] for d in json.loads(cal.read_text())["devices"]] == [2e8, 2e8]
    _one_line_exit_2(run("calibrate", "-o", tmp_path / "x.json", "--memory-bytes", -1), "--memory-bytes must be")


def test_execute_input_ids_on_a_graph_with_weights_checks_against_the_same_ids(tmp_path) -> None:
    """--input-ids without --weights: the graph's own (random) weights, the given token ids, and --check's
    numpy evaluation of the same ids."""
    pytest.importorskip("transformers")
    g, a, ids = tmp_path / "g.json", tmp_path / "a.json", tmp_path / "ids.txt"
    assert run("graph", "import", f"{HF_MODELS}:llama", "-o", g, "--input-shape", "input_ids=1x8").exit_code == 0
    assert run("assign", g, "-c", "cpu4:2", "-m", "round_robin", "-o", a).exit_code == 0
    ids.write_text("5 7 11 13 17 19 23 29")
    res = run("execute", g, "-a", a, "--input-ids", ids, "--check", "--repeats", 1, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["outputs_match"] is True
    ids.write_text("5 7 11 13 17 19 23 512")
    _one_line_exit_2(run("execute", g, "-a", a, "--input-ids", ids), "id 512 at position 7 is outside the vocabulary")
