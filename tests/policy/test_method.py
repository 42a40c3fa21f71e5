"""`doppler` as a method: the shipped pretrained policy by default, and search from the policy's
decodes under a budget."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from doppler import cluster, workloads
from doppler.methods import MethodError, assign
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, PRETRAINED_DIR
from doppler.train.pretrain import Pretrainer, pretrain_config
from doppler.sim import simulate, traced
from doppler.policy.architectures import read_checkpoint


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("pt")
    pt = Pretrainer.create(pretrain_config(hidden=16, mlp_hidden=16, mp_steps=2, il_episodes=16, batch=4,
                                           search_evals=50, torch_threads=1), budget_s=3600)  # fmt: skip
    for _ in range(3):
        pt.update()
    pt.save(d)
    return d / "checkpoint.pt"


def test_the_shipped_policy_is_the_default_small_and_safe_to_load():
    assert PRETRAINED_CHECKPOINT.is_file() and (PRETRAINED_DIR / "MODEL_CARD.md").is_file()
    assert PRETRAINED_CHECKPOINT.stat().st_size < 5 * 2**20
    ck = read_checkpoint(PRETRAINED_CHECKPOINT)  # weights_only=True inside
    assert ck["graphs"] == [] and ck["policy_config"]["op_features"] == "structural"
    g = workloads.build("llama_layer")
    a = assign(g, cluster("v100x8"), "doppler")
    assert a.info["pretrained"] and a.info["zero_shot"]
    assert a.devices.shape == (g.num_ops,)


def test_zero_shot_device_choices_break_the_rules_ties_unless_told_otherwise():
    """The shipped policy (HEFT's list schedule), zero-shot: every op's device is one HEFT's
    earliest-finish rule ties for first at its step; ``plc_ties_only=False`` lets the head choose
    any device (on this row it leaves the tied set); only DOPPLER's dual policy has the option."""
    from doppler.policy.features import graph_features
    from doppler.policy.infer import load_shipped
    from doppler.policy.decode import make_plan

    g, cl = workloads.build("llama_block"), cluster("v100x8")
    gf = graph_features(g, cl)
    for ties in (True, False):
        a = assign(g, cl, "doppler", **({} if ties else {"plc_ties_only": False}))
        assert a.info["plc_ties_only"] is ties
        ro = load_shipped().decode(gf, make_plan(g.num_ops, batch=1, mode="greedy", plc_ties_only=ties))
        np.testing.assert_array_equal(ro.assignment[0], a.devices)
        assert bool(ro.est_tied[0, np.arange(g.num_ops), ro.step_device[0]].all()) is ties
    with pytest.raises(MethodError, match="method 'single_policy' has no option 'plc_ties_only'"):
        assign(g, cl, "single_policy", plc_ties_only=True)


def test_missing_shipped_policy_is_a_clear_error(monkeypatch, tmp_path):
    import doppler.policy.checkpoint

    monkeypatch.setattr(doppler.policy.checkpoint, "PRETRAINED_CHECKPOINT", tmp_path / "gone.pt")
    with pytest.raises(MethodError, match="shipped pretrained policy is missing"):
        assign(workloads.build("ffnn", size="tiny"), cluster("unit:2"), "doppler")


def test_a_corrupted_checkpoint_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(MethodError, match="not a readable doppler checkpoint"):
        assign(workloads.build("ffnn", size="tiny"), cluster("unit:2"), "doppler", checkpoint=bad)


def test_missing_checkpoint_paths_are_clear_errors(tmp_path):
    g, cl = workloads.build("ffnn", size="tiny"), cluster("unit:2")
    with pytest.raises(MethodError, match="gone.pt: no such checkpoint"):
        assign(g, cl, "doppler", checkpoint=tmp_path / "gone.pt")
    with pytest.raises(MethodError, match="a directory without checkpoint.pt"):
        assign(g, cl, "doppler", checkpoint=tmp_path)
    import os

    os.mkfifo(tmp_path / "pipe.pt")  # torch.load would block on it
    with pytest.raises(MethodError, match="pipe.pt: not a regular file"):
        assign(g, cl, "doppler", checkpoint=tmp_path / "pipe.pt")


def test_one_decode_hands_its_traced_run_to_the_caller(tiny_ckpt):
    g, cl = workloads.build("random", num_ops=60, seed=3), cluster("p100x4")
    one = assign(g, cl, "doppler", checkpoint=tiny_ckpt)
    fresh = simulate(g, cl, one, trace=True)
    kept = traced(g, cl, one)
    assert kept is one.simulation[2] and kept.makespan_s == fresh.makespan_s == one.estimated_makespan_s
    np.testing.assert_array_equal(kept.trace.op_end, fresh.trace.op_end)
    np.testing.assert_array_equal(kept.peak_memory_bytes, fresh.peak_memory_bytes)
    other = cluster("p100x4")  # an equal cluster, but not the one it ran on: simulated anew
    assert traced(g, other, one) is not kept and traced(g, other, one).makespan_s == kept.makespan_s
    one.devices = (one.devices + 1) % cl.num_devices  # devices changed since: simulated anew
    again = traced(g, cl, one)
    assert again is not kept and again.makespan_s == simulate(g, cl, one).makespan_s
    np.testing.assert_array_equal(again.trace.op_device, one.devices)
    best_of = assign(g, cl, "doppler", checkpoint=tiny_ckpt, samples=4)
    assert traced(g, cl, best_of).makespan_s == best_of.estimated_makespan_s
    searched = assign(g, cl, "doppler", checkpoint=tiny_ckpt, budget_s=0.2)  # the search's best: not simulated here
    assert searched.simulation is None
    assert traced(g, cl, searched).makespan_s == pytest.approx(searched.estimated_makespan_s, rel=1e-12)


def test_budget_search_never_loses_to_the_policy_or_the_cheap_methods(tiny_ckpt):
    g, cl = workloads.build("random", num_ops=60, seed=3), cluster("p100x4")
    a = assign(g, cl, "doppler", checkpoint=tiny_ckpt, budget_s=0.5)
    got = simulate(g, cl, a).makespan_s
    assert got == pytest.approx(a.estimated_makespan_s)
    assert got <= a.info["policy_makespan_s"] * (1 + 1e-12)
    for m in ("critical_path", "heft", "metis"):
        assert got <= simulate(g, cl, assign(g, cl, m)).makespan_s * (1 + 1e-12)
    assert a.info["search"]["evals"] > 0


def test_budget_search_samples_stop_at_the_policy_share_of_the_budget(tiny_ckpt, monkeypatch):
    import doppler.policy.method as method

    g, cl = workloads.build("random", num_ops=60, seed=3), cluster("p100x4")
    monkeypatch.setattr(method, "SEARCH_SAMPLE_SHARE", 1.0)  # room for every sample
    assert assign(g, cl, "doppler", checkpoint=tiny_ckpt, budget_s=2.0).info["samples"] == method.SEARCH_SAMPLES
    monkeypatch.setattr(method, "SEARCH_SAMPLE_SHARE", 0.0)  # the greedy decode has used it all
    assert assign(g, cl, "doppler", checkpoint=tiny_ckpt, budget_s=0.5).info["samples"] == 0
    assert assign(g, cl, "doppler", checkpoint=tiny_ckpt, samples=5).info["samples"] == 5  # --samples K: exactly K


def test_samples_drawn_in_chunks_are_the_samples_of_one_batch():
    from doppler.policy.decode import make_plan

    one = make_plan(30, batch=12, mode="sample", rng=np.random.default_rng(4))
    rng = np.random.default_rng(4)
    chunks = [make_plan(30, batch=4, mode="sample", rng=rng) for _ in range(3)]
    np.testing.assert_array_equal(one.uniforms, np.concatenate([c.uniforms for c in chunks]))


def test_samples_in_batches_keep_the_best_of_greedy_and_every_sample(tiny_ckpt, monkeypatch):
    import doppler.policy.method as method
    from doppler.policy.architectures import load_policy
    from doppler.policy.decode import make_plan
    from doppler.policy.features import graph_features
    from doppler.policy.rollout import run_plan
    from doppler.sim import simulate_many

    g, cl = workloads.build("random", num_ops=40, seed=2), cluster("p100x4")
    policy, _ = load_policy(tiny_ckpt)
    gf = graph_features(g, cl)
    with torch.no_grad():
        enc = policy.encode(gf)
        greedy = run_plan(gf, enc, make_plan(gf.num_ops, batch=1, mode="greedy")).assignment
        drawn = run_plan(gf, enc, make_plan(gf.num_ops, batch=7, mode="sample", rng=np.random.default_rng(5))).assignment
    every = simulate_many(g, cl, np.concatenate([greedy, drawn]))
    for batch in (1, 3, 7):  # batches of 1, a remainder, and one batch
        monkeypatch.setattr(method, "SAMPLES_BATCH", batch)
        a = assign(g, cl, "doppler", checkpoint=tiny_ckpt, samples=7, seed=5, plc_ties_only=False)
        assert a.info["samples"] == 7
        assert a.estimated_makespan_s == pytest.approx(every.min(), rel=1e-12)


@pytest.mark.parametrize("k", [0, -2, 1_000_001])
def test_samples_out_of_range_are_refused(tiny_ckpt, k):
    with pytest.raises(MethodError, match="--samples"):
        assign(workloads.build("ffnn", size="tiny"), cluster("unit:2"), "doppler", checkpoint=tiny_ckpt, samples=k)


def test_budget_must_be_positive(tiny_ckpt):
    with pytest.raises(MethodError, match="positive"):
        assign(workloads.build("ffnn", size="tiny"), cluster("unit:2"), "doppler", checkpoint=tiny_ckpt, budget_s=0)


def test_structural_policies_ignore_position_features():
    import torch

    from doppler.policy.features import graph_features
    from doppler.policy.networks import DopplerPolicy

    g = workloads.build("ffnn")
    gf = graph_features(g, cluster("p100x4"))
    torch.manual_seed(0)
    pol = DopplerPolicy(hidden=16, steps=2, mlp_hidden=16, op_features="structural")
    with torch.no_grad():
        a = pol.encode(gf).sel_score
        gf.op_x[:, 5:] = np.random.default_rng(0).random(gf.op_x[:, 5:].shape)
        b = pol.encode(gf).sel_score
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="op_features"):
        DopplerPolicy(op_features="ids")


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"not a checkpoint", "not a zip archive"),  # (torch's legacy unpickler is never reached)
        (pickle.dumps({"a": 1}), "not a zip archive"),
        (b"", "the file ends early"),
        (b"PK\x03\x04 cut short", "a damaged or cut-short zip archive: File is not a zip file"),  # (zipfile's words:
        # an archive zipfile cannot read is not handed to torch, whose reader the bounds would not cover)
    ],
)
def test_an_unreadable_checkpoint_is_named_in_one_short_line(tmp_path, content, reason):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(content)
    with pytest.raises(MethodError) as e:
        assign(workloads.build("ffnn", size="tiny"), cluster("unit:2"), "doppler", checkpoint=bad)
    msg = str(e.value)
    assert msg.startswith(f"{bad}: not a readable doppler checkpoint (") and reason in msg, msg
    assert "\n" not in msg and "weights_only" not in msg and len(msg) < len(str(bad)) + 200, msg


def test_samples_report_their_progress_in_batches():
    from doppler.policy.method import SAMPLES_BATCH

    events = []
    g = workloads.build("ffnn", size="tiny")
    a = assign(g, cluster("unit:2"), "doppler", samples=SAMPLES_BATCH + 5, on_progress=events.append)
    assert [e.done for e in events] == [SAMPLES_BATCH, SAMPLES_BATCH + 5] and {e.task for e in events} == {"samples"}
    best = [e.stats["best_makespan_s"] for e in events]
    assert best[1] <= best[0] and best[1] == pytest.approx(a.estimated_makespan_s)


@pytest.mark.parametrize("scale", [1e30, float("nan")])
def test_weights_that_overflow_decode_to_a_valid_assignment_and_nan_weights_are_refused(tmp_path, scale):
    # NaN scores compare false everywhere: the compiled arg-max once returned -1, and the decoder
    # indexed with it until the interpreter died (SIGBUS)
    from doppler.policy.architectures import read_checkpoint
    from doppler.policy.checkpoint import resolve_checkpoint

    ck = read_checkpoint(resolve_checkpoint(None)[0])
    ck["state_dict"] = {k: w * scale if w.is_floating_point() else w for k, w in ck["state_dict"].items()}
    bad = tmp_path / "checkpoint.pt"
    torch.save(ck, bad)
    g, cl = workloads.build("ffnn", size="tiny"), cluster("v100x8")
    if scale != scale:
        with pytest.raises(MethodError, match="not finite numbers"):
            assign(g, cl, "doppler", checkpoint=bad)
        return
    for kw in ({}, {"samples": 8}):
        a = assign(g, cl, "doppler", checkpoint=bad, **kw)
        assert a.devices.shape == (g.num_ops,) and 0 <= a.devices.min() and a.devices.max() < cl.num_devices


@pytest.mark.parametrize("samples", [1.5, "8", True])
def test_samples_must_be_a_whole_number(samples):
    with pytest.raises(MethodError, match="--samples must be a whole number"):
        assign(workloads.build("ffnn", size="tiny"), cluster("unit:2"), "doppler", samples=samples)
