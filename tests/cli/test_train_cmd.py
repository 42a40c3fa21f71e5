"""End-to-end tests of `doppler train` and of `doppler assign -m doppler` with its checkpoint
(tiny runs: 30 ops on unit:2, a handful of updates)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from doppler.ir.assignment import load_assignment
from doppler.cli import app
from doppler.ir.formats import load_graph

runner = CliRunner()

TRAIN_ARGS = ("-c", "unit:2", "--episodes", "64", "--il-episodes", "16", "--batch", "8")


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def one_json(res) -> dict:
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stdout
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def assert_usage_error(res, *words: str) -> str:
    """Exit 2 with exactly one line on stderr that mentions every word."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert "internal error" not in lines[0] and "Traceback" not in res.output
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny training run: (dir, graph file, other graph file, run dir, JSON summary)."""
    d = tmp_path_factory.mktemp("train")
    g = d / "g.json"
    res = run("graph", "build", "random", "--set", "num_ops=30", "-o", g)
    assert res.exit_code == 0, res.output
    other = d / "other.json"
    res = run("graph", "build", "random", "--set", "num_ops=30", "--set", "seed=7", "-o", other)
    assert res.exit_code == 0, res.output
    run_dir = d / "RUN"
    res = run("train", g, *TRAIN_ARGS, "--threads", "1", "-o", run_dir, "--json")
    assert res.exit_code == 0, res.output
    return d, g, other, run_dir, one_json(res)


def test_train_json_summary_and_run_dir(trained) -> None:
    _, g, _, run_dir, summary = trained
    graph = load_graph(g)
    assert graph.num_ops == 30
    for key in ("run_dir", "checkpoint", "training_curve", "il_episodes", "episodes", "elapsed_s", "graphs"):
        assert key in summary, key
    assert summary["episodes"] == 64 and summary["il_episodes"] == 16
    assert len(summary["graphs"]) == 1
    row = summary["graphs"][0]
    for key in ("graph", "num_ops", "greedy_makespan_s", "best_makespan_s", "critical_path_makespan_s", "lower_bound_s"):
        assert key in row, key
    assert row["num_ops"] == 30
    assert row["greedy_makespan_s"] >= row["lower_bound_s"] * (1 - 1e-9) > 0
    assert row["best_makespan_s"] >= row["lower_bound_s"] * (1 - 1e-9)
    assert row["critical_path_makespan_s"] >= row["lower_bound_s"] * (1 - 1e-9)
    # the run directory
    assert json.loads((run_dir / "config.json").read_text())["torch_threads"] == 1  # --threads 1
    assert (run_dir / "checkpoint.pt").stat().st_size > 1000
    assert not (run_dir / ".doppler.lock").exists()  # one writer's lock, gone with the run
    assert Path(summary["checkpoint"]) == run_dir / "checkpoint.pt"
    png = run_dir / "training_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    events = [p for p in (run_dir / "tensorboard").iterdir() if p.name.startswith("events.out.tfevents")]
    assert events and events[0].stat().st_size > 0
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["episodes"] == 64 and cfg["il_episodes"] == 16 and cfg["batch"] == 8
    assert cfg["stages"] == ["il", "sim"] and cfg["teacher"] == "critical_path"
    assert "enumerative" in cfg["sim_seed_methods"]  # the default warm start
    best = load_assignment(run_dir / "best_assignment.json", graph)
    assert best.devices.shape == (30,) and set(best.devices.tolist()) <= {0, 1}


def test_warm_start_none_turns_it_off(tmp_path: Path, trained) -> None:
    _, g, _, _, _ = trained
    res = run("train", g, "-c", "unit:2", "--stages", "il,sim", "--il-episodes", "8", "--episodes", "8", "--batch", "4",
              "--warm-start", "none", "-o", tmp_path / "R", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "R" / "config.json").read_text())["sim_seed_methods"] == []


def test_local_search_options_reach_the_config(tmp_path: Path, trained) -> None:
    _, g, _, _, _ = trained
    res = run("train", g, "-c", "unit:2", "--stages", "il,sim", "--il-episodes", "8", "--episodes", "8", "--batch", "4",
              "--search-every", "4", "--search-evals", "200", "--distill-on-policy", "0.5", "-o", tmp_path / "R",
              "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "R" / "config.json").read_text())
    assert (cfg["search_every"], cfg["search_evals"], cfg["distill_on_policy"]) == (4, 200, 0.5)


def test_train_human_summary(tmp_path: Path, trained) -> None:
    _, g, _, _, _ = trained
    res = run("train", g, "-c", "unit:2", "--stages", "il", "--il-episodes", "8", "-o", tmp_path / "R")
    assert res.exit_code == 0, res.output
    assert "trained 8 imitation + 0 RL episodes" in res.stdout
    assert "greedy" in res.stdout and "critical_path" in res.stdout
    assert (tmp_path / "R" / "checkpoint.pt").is_file()


def test_assign_with_checkpoint_greedy_and_samples(tmp_path: Path, trained) -> None:
    _, g, _, run_dir, summary = trained
    graph = load_graph(g)
    out = tmp_path / "a.json"
    res = run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", run_dir / "checkpoint.pt", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    greedy = one_json(res)
    a = load_assignment(out, graph)
    assert a.devices.shape == (30,)
    # the saved policy decodes to what the trainer's own greedy evaluation saw
    assert greedy["makespan_s"] == pytest.approx(summary["graphs"][0]["greedy_makespan_s"], rel=1e-9)
    # deterministic
    out2 = tmp_path / "a2.json"
    res = run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", run_dir / "checkpoint.pt", "-o", out2)
    assert res.exit_code == 0, res.output
    np.testing.assert_array_equal(load_assignment(out2, graph).devices, a.devices)
    # best of greedy and 8 samples is never worse than greedy
    out3 = tmp_path / "a3.json"
    res = run("assign", g, "-c", "unit:2", "-m", "doppler", "--checkpoint", run_dir / "checkpoint.pt",
              "--samples", "8", "-o", out3, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    sampled = one_json(res)
    assert sampled["makespan_s"] <= greedy["makespan_s"] * (1 + 1e-12)
    assert load_assignment(out3, graph).devices.shape == (30,)


def test_resume_continues(tmp_path: Path, trained) -> None:
    _, g, _, run_dir, summary = trained
    run2 = tmp_path / "RUN"
    shutil.copytree(run_dir, run2)
    before = (run2 / "checkpoint.pt").read_bytes()
    res = run("train", g, "-c", "unit:2", "--episodes", "80", "--il-episodes", "16", "--batch", "8",
              "-o", run2, "--resume", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    s = one_json(res)
    assert s["episodes"] == 80 > summary["episodes"]
    assert s["il_episodes"] == 16  # Stage I was already complete
    assert (run2 / "checkpoint.pt").read_bytes() != before
    from doppler.policy.architectures import read_checkpoint

    ck = read_checkpoint(run2 / "checkpoint.pt")
    assert ck["episode"] == 80 and ck["il_episode"] == 16
    history = [h for h in json.loads(ck["history"]) if not h["stage_distill"]]
    # the resumed history extends the old one: 2 imitation updates + 8 + 2 RL updates
    assert len(history) == 2 + 8 + 2
    assert [round(h["episode"]) for h in history if h["stage_il"] == 0.0] == [8 * k for k in range(1, 11)]


# ============================================================================ bad input -> exit 2
@pytest.mark.parametrize(
    "extra,words",
    [
        (("--stages", "il,foo"), ["foo", "stage"]),
        (("--stages", "il,real", "--engine", "mpi"), ["mpi", "engine"]),
        (("--stages", "real", "--real-episodes", "0"), ["--real-episodes"]),
        (("--stages", " , "), ["stage"]),
        (("--stages", ""), ["--stages is empty"]),
        (("--teacher", "nope"), ["nope", "teacher"]),
        (("--list-schedule", "fifo"), ["fifo", "list schedule"]),
        (("--list-schedule", "heft", "--method", "gdp"), ["--list-schedule", "gdp"]),
        (("--list-schedule", "heft", "--teacher", "lookahead"), ["lookahead", "critical_path"]),
        (("--list-schedule", "heft", "--init", "pretrained"), ["--list-schedule", "--init"]),
        (("--episodes", "0"), ["--episodes"]),
        (("--batch", "0"), ["--batch"]),
        (("--baseline", "median"), ["median"]),
        (("--warm-start", "heft,nosuch"), ["warm start", "nosuch"]),
        (("--search-every", "-1"), ["--search-every"]),
        (("--threads", "0"), ["--threads"]),
        (("--threads", "100000"), ["--threads must be at most 256"]),
        (("--distill-on-policy", "nan"), ["--distill-on-policy"]),
        (("--self-improve", "-1"), ["--self-improve"]),
        (("--stages", "il,real", "--engine", "dask", "--device-type", "cuda"), ["cuda", "dask"]),
        pytest.param(("--stages", "il,real", "--device-type", "cuda"), ["no CUDA device"],
                     marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU is here")),
    ],
    ids=["unknown-stage", "real-engine", "real-episodes-0", "no-stage", "empty-stages", "teacher", "list-schedule", "list-schedule-gdp", "list-schedule-lookahead", "list-schedule-init", "episodes-0", "batch-0", "baseline",
         "warm-start", "search-every", "threads-0", "threads-huge", "distill-on-policy-nan", "self-improve-negative", "dask-cuda", "cuda-without-gpu"],
)
def test_train_bad_options_exit_2(tmp_path: Path, trained, extra, words) -> None:
    _, g, _, _, _ = trained
    out = tmp_path / "R"
    res = run("train", g, "-c", "unit:2", "--episodes", "16", "--il-episodes", "8", "--batch", "8", *extra, "-o", out)
    assert_usage_error(res, *words)
    assert not (out / "checkpoint.pt").exists()


def test_train_bad_graph_or_cluster_exit_2(tmp_path: Path, trained) -> None:
    _, g, _, _, _ = trained
    assert_usage_error(run("train", g, g, "-c", "unit:2", "-o", tmp_path / "R"), "the same graph as")
    copy = tmp_path / "copy.json"  # the same graph under another name
    shutil.copy(g, copy)
    assert_usage_error(run("train", g, copy, "-c", "unit:2", "-o", tmp_path / "R"), "copy.json: the same graph as")
    assert_usage_error(run("train", tmp_path / "missing.json", "-c", "unit:2", "-o", tmp_path / "R"))
    assert_usage_error(run("train", g, "-c", "nosuch", "-o", tmp_path / "R"))


def test_train_refuses_existing_run_without_resume(tmp_path: Path, trained) -> None:
    _, g, _, run_dir, _ = trained
    before = (run_dir / "checkpoint.pt").stat().st_mtime_ns
    res = run("train", g, *TRAIN_ARGS, "-o", run_dir)
    assert_usage_error(res, "--resume")
    assert (run_dir / "checkpoint.pt").stat().st_mtime_ns == before


def test_resume_errors_exit_2(tmp_path: Path, trained) -> None:
    _, g, other, run_dir, _ = trained
    assert_usage_error(run("train", g, *TRAIN_ARGS, "-o", tmp_path / "empty", "--resume"), "resume")
    run2 = tmp_path / "RUN"
    shutil.copytree(run_dir, run2)
    assert_usage_error(run("train", g, "-c", "unit:3", "--episodes", "80", "--il-episodes", "16", "-o", run2,
                           "--resume"), "cluster")  # fmt: skip
    assert_usage_error(run("train", other, "-c", "unit:2", "--episodes", "80", "--il-episodes", "16", "-o", run2,
                           "--resume"), "other graphs")  # fmt: skip
    before = (run2 / "checkpoint.pt").read_bytes()
    for extra, words in [(("--method", "gdp"), ["--method gdp", "run's doppler"]),
                         (("--batch", "4"), ["--batch 4", "run's 8"]),
                         (("--no-device-identity",), ["--no-device-identity"]),
                         (("--episodes", "8"), ["--episodes 8", "already done"])]:  # fmt: skip
        assert_usage_error(run("train", g, "-c", "unit:2", "-o", run2, "--resume", *extra), *words)
    assert (run2 / "checkpoint.pt").read_bytes() == before  # refused before any training
    res = run("train", g, "-c", "unit:2", "-o", run2, "--resume", "--json")  # no --episodes: the run's own length
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["episodes"] == 64  # (TRAIN_ARGS), not --episodes' default of 4000


def _assign(g, out, *extra):
    return run("assign", g, "-c", "unit:2", "-m", "doppler", "-o", out, *extra)


def test_assign_bad_inputs_exit_2(tmp_path: Path, trained) -> None:
    _, g, other, run_dir, _ = trained
    ckpt = run_dir / "checkpoint.pt"
    out = tmp_path / "a.json"
    assert_usage_error(_assign(g, out, "--checkpoint", ckpt, "--samples", "0"), "--samples")
    assert_usage_error(_assign(g, out, "--samples", "100000000"), "--samples", "1,000,000")  # not 715 GiB of uniforms
    res = _assign(g, tmp_path / "shipped.json")  # no --checkpoint: the shipped pretrained policy, and it says so
    assert res.exit_code == 0 and "zero-shot" in res.stdout and "pretrained" in res.stdout, res.output
    assert_usage_error(_assign(g, out, "--checkpoint", tmp_path / "nope.pt"), "nope.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(ckpt.read_bytes()[:100])
    assert_usage_error(_assign(g, out, "--checkpoint", truncated), "truncated.pt", "checkpoint")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    assert_usage_error(_assign(g, out, "--checkpoint", garbage), "garbage.pt", "checkpoint")
    not_ours = tmp_path / "not_ours.pt"
    import torch

    torch.save({"format": "something-else", "x": torch.zeros(2)}, not_ours)
    assert_usage_error(_assign(g, out, "--checkpoint", not_ours), "not_ours.pt")
    # a single-graph policy with position features refuses another graph...
    assert_usage_error(_assign(other, out, "--checkpoint", ckpt), "fingerprints differ")
    assert not out.exists()
    # ...but places its own graph on another cluster, zero-shot (the paper's hardware transfer)
    res = run("assign", g, "-c", "unit:3", "-m", "doppler", "--checkpoint", ckpt, "-o", out)
    assert res.exit_code == 0 and "zero-shot" in res.stdout, res.output
    assert load_assignment(out, load_graph(g), 3).devices.max() <= 2


def test_checkpoint_is_loadable_weights_only(trained) -> None:
    _, _, _, run_dir, _ = trained
    from doppler.policy.architectures import load_policy
    from doppler.policy.checkpoint import CHECKPOINT_FORMAT

    policy, meta = load_policy(run_dir)  # a run directory works too
    assert meta["format"] == CHECKPOINT_FORMAT
    assert meta["episode"] == 64 and meta["il_episode"] == 16
    assert [g["num_ops"] for g in meta["graphs"]] == [30]
    assert not policy.training
    assert os.path.getsize(run_dir / "checkpoint.pt") > 0


def test_compare_includes_doppler_with_a_checkpoint(trained) -> None:
    _, g, _, run_dir, _ = trained
    res = run("compare", g, "-c", "unit:2", "-m", "critical_path,doppler", "--checkpoint", run_dir / "checkpoint.pt",
              "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["method"] for r in rows] == ["critical_path", "doppler"]
    assert all(r["makespan_s"] >= r["lower_bound_s"] for r in rows)
    res = run("compare", g, "-c", "unit:2", "-m", "critical_path,doppler", "--json")  # the shipped policy
    assert res.exit_code == 0, res.output
    assert [r["method"] for r in json.loads(res.stdout)] == ["critical_path", "doppler"]


def test_a_single_head_ablation_trains_and_assigns_from_the_command_line(trained, tmp_path: Path) -> None:
    _, g, _, _, _ = trained
    run_dir = tmp_path / "PLC"
    res = run("train", g, *TRAIN_ARGS, "--method", "doppler_plc", "--set", "distill_updates=2", "-o", run_dir, "--json")
    assert res.exit_code == 0, res.output
    out = tmp_path / "a.json"
    res = run("assign", g, "-c", "unit:2", "--method", "doppler_plc", "--checkpoint", run_dir / "checkpoint.pt",
              "-o", out, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert load_assignment(out, load_graph(g), 2).devices.shape == (30,)
    res = run("compare", g, "-c", "unit:2", "--methods", "critical_path,doppler_plc", "--checkpoint",
              run_dir / "checkpoint.pt", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    # a checkpoint of one method given to another, and an unknown method: one line, exit 2
    assert_usage_error(run("assign", g, "-c", "unit:2", "--method", "doppler", "--checkpoint", run_dir / "checkpoint.pt",
                           "-o", out), "doppler_plc checkpoint", "--method doppler_plc")  # fmt: skip
    assert_usage_error(run("train", g, *TRAIN_ARGS, "--method", "placetto", "-o", tmp_path / "X"), "unknown method",
                       "doppler_sel", "placeto")  # fmt: skip


@pytest.mark.parametrize("method", ["single_policy", "gdp", "placeto"])
def test_a_learned_baseline_trains_and_assigns_from_the_command_line(trained, tmp_path: Path, method: str) -> None:
    _, g, _, _, _ = trained
    run_dir = tmp_path / method
    # (two distillation updates run that stage as the default's up to 1,000 do, in a fraction of the time)
    res = run("train", g, "-c", "unit:2", "--episodes", "16", "--il-episodes", "8", "--batch", "8", "--method", method,
              "--set", "distill_updates=2", "-o", run_dir, "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    out = tmp_path / "a.json"
    ckpt = run_dir / "checkpoint.pt"
    res = run("assign", g, "-c", "unit:2", "--method", method, "--checkpoint", ckpt, "-o", out, "--json")
    assert res.exit_code == 0, res.output
    assert load_assignment(out, load_graph(g), 2).devices.shape == (30,)
    res = run("compare", g, "-c", "unit:2", "--methods", f"critical_path,{method}", "--checkpoint", ckpt, "--json")
    assert res.exit_code == 0, res.output
    assert [r["method"] for r in json.loads(res.stdout)] == ["critical_path", method]
    # resume continues the run; another method's checkpoint, or GDP/PLACETO on another device count: exit 2
    res = run("train", g, "-c", "unit:2", "--episodes", "24", "-o", run_dir, "--resume", "--json")
    assert res.exit_code == 0, res.output
    assert one_json(res)["episodes"] >= 24
    assert_usage_error(run("assign", g, "-c", "unit:2", "--method", "doppler", "--checkpoint", ckpt, "-o", out),
                       f"{method} checkpoint", f"--method {method}")  # fmt: skip
    other_count = run("assign", g, "-c", "unit:4", "--method", method, "--checkpoint", ckpt, "-o", out)
    if method != "single_policy":  # one output unit per device
        assert_usage_error(other_count, "2 device outputs", "4 devices")
    else:  # like DOPPLER's: a one-graph checkpoint serves its own graph on any cluster
        assert other_count.exit_code == 0 and "zero-shot" in other_count.stdout, other_count.output
    assert_usage_error(run("train", g, "-c", "unit:2", "--method", "doppler", "--init", ckpt, "-o", tmp_path / "I"),
                       f"this one is {method}")  # fmt: skip


def test_train_help_shows_the_defaults() -> None:
    """Help texts say their defaults in parentheses: in square brackets rich took them for markup and dropped them."""
    res = run("train", "--help")
    assert res.exit_code == 0
    text = " ".join(res.output.replace("│", " ").split())
    assert "(default: 1024)" in text and "--threads" in text and "(default: 2;" in text


def test_compare_takes_one_checkpoint_per_learned_method(tmp_path: Path, trained) -> None:
    _, g, _, run_dir, _ = trained
    ckpt = str(run_dir / "checkpoint.pt")
    for extra in (["--checkpoint", f"doppler={ckpt}"], ["--checkpoint", ckpt]):
        res = run("compare", g, "-c", "unit:2", "-m", "heft,doppler", *extra, "--json")
        assert res.exit_code == 0, res.output
        assert [r["method"] for r in json.loads(res.stdout)] == ["heft", "doppler"]
    for methods, extra, words in [("doppler,gdp", ["--checkpoint", ckpt], ["lists 2 learned methods", "METHOD=PATH"]),
                                  ("heft", ["--checkpoint", f"gdp={ckpt}"], ["gdp is not in --methods"]),
                                  ("doppler", ["--checkpoint", f"doppler={ckpt}", "--checkpoint", f"doppler={ckpt}"],
                                   ["two checkpoints for doppler"])]:  # fmt: skip
        assert_usage_error(run("compare", g, "-c", "unit:2", "-m", methods, *extra), *words)


def test_set_and_memory_options_reach_the_config(tmp_path: Path, trained) -> None:
    _, g, _, _, _ = trained
    base = ("train", g, "-c", "unit:2", "--stages", "il,sim", "--il-episodes", "8", "--episodes", "8", "--batch", "4")
    res = run(*base, "--set", "lr=1e-3", "--set", "hidden=16", "--memory-fraction", "0.5", "-o", tmp_path / "R", "--json")
    assert res.exit_code == 0, res.output
    cfg = json.loads((tmp_path / "R" / "config.json").read_text())
    assert (cfg["lr"], cfg["hidden"], cfg["memory_fraction"]) == (1e-3, 16, 0.5)
    res = run(*base, "--ignore-memory", "-o", tmp_path / "S", "--json")
    assert res.exit_code == 0 and json.loads((tmp_path / "S" / "config.json").read_text())["memory_fraction"] is None
    assert_usage_error(run(*base, "--set", "lr=fast", "-o", tmp_path / "T"), "--set 'lr=fast'", "not a number")
    assert_usage_error(run(*base, "--set", "batch=4", "-o", tmp_path / "U"), "has an option of its own: --batch")
    assert_usage_error(run(*base, "--memory-fraction", "2", "-o", tmp_path / "V"), "--memory-fraction")
    assert not any((tmp_path / name).exists() and any((tmp_path / name).iterdir()) for name in "TUV")


def _files(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (the TensorBoard events too) and its bytes."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("extra, words", [
    (("--episodes", "1000000000000000"), ["--episodes must be at most 1,000,000 (a doppler train run"]),
    (("--il-episodes", str(10**30)), ["--il-episodes must be at most 1,000,000"]),
    (("--real-episodes", "100001", "--stages", "il,sim,real"), ["--real-episodes must be at most 100,000"]),
    (("--search-evals", str(10**12)), ["--search-evals must be at most 10,000,000"]),
    (("--search-every", str(10**12)), ["--search-every must be at most 1,000,000,000"]),
    (("--set", "distill_updates=1000000"), ["--set distill_updates must be at most 100,000"]),
    (("--set", "checkpoint_every=1e15"), ["'1e15' is not a whole number"]),
])  # fmt: skip
def test_huge_counts_are_refused_in_one_line_before_any_work(tmp_path: Path, trained, extra, words) -> None:
    """`train --episodes 1e15` once ran until it was killed, with no message."""
    _, g, _, _, _ = trained
    out = tmp_path / "R"
    assert_usage_error(run("train", g, "-c", "unit:2", *extra, "-o", out), *words)
    assert not out.exists()


def test_a_count_that_is_not_a_whole_number_is_refused(tmp_path: Path, trained) -> None:
    """(click's usage error: one line from the real entry point, tests/fuzz/test_entry_point.py)"""
    _, g, _, _, _ = trained
    for option in ("--episodes", "--il-episodes", "--real-episodes", "--search-evals"):
        res = run("train", g, "-c", "unit:2", option, "1e15", "-o", tmp_path / "R")
        assert res.exit_code == 2 and "'1e15' is not a valid int" in res.output, res.output
    assert not (tmp_path / "R").exists()


def _poisoned_copy(run_dir: Path, tmp_path: Path, change) -> Path:
    from tests.fuzz.checkpoints import rewrite_checkpoint

    d = tmp_path / "RUN"
    shutil.copytree(run_dir, d)
    rewrite_checkpoint(d / "checkpoint.pt", change)
    return d


def _nan_moment(ck) -> None:
    st = ck["optimizer"]["state"][0]
    st["exp_avg"] = st["exp_avg"] * float("nan")


@pytest.mark.parametrize("change, words", [
    (_nan_moment, ["checkpoint.pt: a damaged checkpoint", "exp_avg of parameter 0 holds values that are not finite"]),
    (lambda ck: ck.update(config=ck["config"].replace('"episodes": 64', '"episodes": 1000000000000000')),
     ["checkpoint.pt: a damaged checkpoint: its configuration does not hold (--episodes must be at most"]),
    (lambda ck: ck.update(episode=10**6), ["episode is 1000000, not an integer from 0 to 71"]),
])  # fmt: skip
def test_a_poisoned_resume_exits_2_and_writes_nothing(tmp_path: Path, trained, change, words) -> None:
    """A run whose optimizer state held NaN once resumed with exit 0 and saved NaN weights, which the next assign
    refused: now it is one line naming the run, and every file of the run directory stays as it was."""
    _, g, _, run_dir, _ = trained
    d = _poisoned_copy(run_dir, tmp_path, change)
    before = _files(d)
    for extra in ((), ("--episodes", "72")):
        assert_usage_error(run("train", g, "-c", "unit:2", "-o", d, "--resume", *extra), str(d), *words)
        assert _files(d) == before


def test_a_resume_whose_config_json_was_edited_exits_2_and_writes_nothing(tmp_path: Path, trained) -> None:
    _, g, _, run_dir, _ = trained
    d = tmp_path / "RUN"
    shutil.copytree(run_dir, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "episodes": 10**15}))
    before = _files(d)
    assert_usage_error(run("train", g, "-c", "unit:2", "-o", d, "--resume"), str(d / "config.json"),
                       "--episodes must be at most 1,000,000,000")  # fmt: skip
    (d / "config.json").write_text(json.dumps({**config, "lr": 0.5}))
    before = _files(d)
    assert_usage_error(run("train", g, "-c", "unit:2", "-o", d, "--resume"), str(d / "config.json"),
                       "lr is 0.5, but the run's checkpoint says 0.003")  # fmt: skip
    assert _files(d) == before


def test_a_diverged_run_exits_1_fresh_or_2_from_a_saved_state_and_keeps_its_checkpoint(tmp_path: Path, trained,
                                                                                     monkeypatch) -> None:  # fmt: skip
    """An update that makes a weight NaN stops the run in one line; from a saved state (--resume, --init), which
    is then the likelier cause, with exit 2, else 1 (a bug of ours, or of the hyper-parameters)."""
    import torch

    from doppler.policy.architectures import load_policy

    _, g, _, run_dir, _ = trained
    d = tmp_path / "RUN"
    shutil.copytree(run_dir, d)
    before = _files(d)
    step = torch.optim.Adam.step

    def poisoned(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        with torch.no_grad():
            self.param_groups[0]["params"][0].view(-1)[0] = float("nan")
        return out

    monkeypatch.setattr(torch.optim.Adam, "step", poisoned)
    res = run("train", g, "-c", "unit:2", "-o", d, "--resume", "--episodes", "72")
    line = assert_usage_error(res, "training diverged in the update after 16 Stage I and 64 Stage II episodes",
                              f"{d} keeps its last checkpoint (the run started from {d}")  # fmt: skip
    assert "holds values that are not finite" in line
    assert _files(d) == before  # (its first update diverged: not even a TensorBoard event file)
    load_policy(d)
    fresh = tmp_path / "FRESH"
    res = run("train", g, *TRAIN_ARGS, "--threads", "1", "-o", fresh)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 1 and len(lines) == 1 and "training diverged in the update after 0 Stage I" in lines[0]
    assert not (fresh / "checkpoint.pt").exists()  # (its first update diverged: nothing to keep)


# ============================================================================ options from the configuration
#: the options of each command that set no configuration field (every other one is generated from a field)
OWN_OPTIONS = {
    "train": {"graph_paths", "cluster_name", "output", "resume", "init", "ignore_memory", "weights_path", "set_",
              "json_out"},
    "pretrain": {"output", "budget_h", "workers", "resume", "init", "json_out"},
}  # fmt: skip


def _shown(value) -> str:
    return (",".join(value) or "none") if isinstance(value, tuple) else f"{value:g}" if isinstance(value, float) else str(value)


@pytest.mark.parametrize("command", ["train", "pretrain"])
def test_every_config_option_is_its_fields_option_with_the_commands_default_and_help(command: str) -> None:
    """Each option that sets a TrainConfig field is made from the field: its names and help from the field's
    metadata, its default the command's configuration's (TrainConfig's for train, pretrain_config's for
    pretrain), shown in `--help`; any other option is one of the command's own (an option added by hand for a
    field fails here)."""
    import dataclasses

    import typer.main

    from doppler.train.config import Option, TrainConfig, pretrain_config

    defaults = TrainConfig() if command == "train" else pretrain_config()
    fields = {f.name: f.metadata["option"] for f in dataclasses.fields(TrainConfig)
              if "option" in f.metadata and command in f.metadata["option"].commands}  # fmt: skip
    assert len(fields) >= (20 if command == "train" else 6)
    params = {p.name: p for p in typer.main.get_command(app).commands[command].params}
    assert set(params) - {"help"} == set(fields) | OWN_OPTIONS[command], set(params) ^ (set(fields) | OWN_OPTIONS[command])
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"})  # (at 80, rich cuts long option names)
    assert res.exit_code == 0, res.output
    shown = "".join(res.output.replace("│", " ").split())  # (no spaces: rich wraps lines at spaces and hyphens)
    for name, own in fields.items():
        assert isinstance(own, Option)
        p = params[name]
        assert p.default is None and [*p.opts, *p.secondary_opts] == [d for decl in own.decls for d in decl.split("/")]
        default = getattr(defaults, name)
        if default is not None:  # (a None default is told in words: "on where the device head is learned")
            assert "{default}" in own.help, name
        assert p.help == own.help.format(default=_shown(default)), name
        assert "".join(p.help.split()) in shown and own.flag in shown, name
    if command == "train":
        assert "(default:1024)" in shown and "(default:il,sim;with--init:sim)" in shown
    else:
        assert "(default:heft;" in shown and "(default:1;" in shown  # pretraining's own list schedule and threads


#: for each option of `train` that sets a field: what the command line gives and the field's value it makes
TRAIN_VALUES = {
    "stages": (["--stages", "il"], ("il",)), "episodes": (["--episodes", "16"], 16),
    "il_episodes": (["--il-episodes", "8"], 8), "batch": (["--batch", "4"], 4),
    "baseline": (["--baseline", "mean"], "mean"), "self_improve_coef": (["--self-improve", "0.5"], 0.5),
    "search_every": (["--search-every", "0"], 0), "search_evals": (["--search-evals", "100"], 100),
    "distill_on_policy": (["--distill-on-policy", "0.5"], 0.5), "teacher": (["--teacher", "heft"], "heft"),
    "method": (["-m", "doppler_sel"], "doppler_sel"), "op_features": (["--op-features", "structural"], "structural"),
    "device_identity": (["--no-device-identity"], False), "list_schedule": (["--list-schedule", "heft"], "heft"),
    "real_episodes": (["--real-episodes", "8"], 8), "sim_seed_methods": (["--warm-start", "heft, metis"], ("heft", "metis")),
    "engine": (["--engine", "dask"], "dask"), "engine_device_type": (["--device-type", "cuda"], "cuda"),
    "seed": (["--seed", "3"], 3), "torch_threads": (["--threads", "1"], 1), "device": (["--device", "cuda"], "cuda"),
    "memory_fraction": (["--memory-fraction", "0.5"], 0.5),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TRAIN_VALUES))
def test_each_train_option_sets_its_own_field_and_no_other(tmp_path: Path, monkeypatch, name: str) -> None:
    from doppler.cli import train_cmd
    from doppler.train.config import TrainConfig

    assert set(TRAIN_VALUES) == {o.name for o in train_cmd.TRAIN_OPTIONS}  # a new option needs its row here
    seen = []

    def stop(graph_paths, cluster_name, cfg, *args, **kw):
        seen.append(cfg)
        raise train_cmd.UserError("stopped before training")

    monkeypatch.setattr(train_cmd, "_trainer", stop)
    args, value = TRAIN_VALUES[name]
    assert_usage_error(run("train", tmp_path / "g.json", "-c", "unit:2", *args, "-o", tmp_path / "R"), "stopped")
    want = dataclasses.replace(TrainConfig(), **{name: value})
    assert seen == [want] and getattr(TrainConfig(), name) != value
