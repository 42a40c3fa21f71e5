"""The memory model: weights resident where they are read, each slice once per device, a budget per device,
and the memory-aware list schedulers that keep every device within it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler import cluster, memory, workloads
from doppler.methods import MethodError, assign
from doppler.sim import simulate


def _paper_box(memory_bytes: float = 16e9):
    """The paper's 4x P100 16 GB over PCIe with plain per-FLOP rates (the p100x4 preset before the roofline:
    :func:`doppler.workloads.corpus.gpu_rates`). The tests below tighten a budget under the peak of a free schedule
    that overfills one device; the roofline's free schedules spread the weights evenly, leaving no such room."""
    from doppler.workloads.corpus import gpu_rates
    from doppler.hardware.cluster import homogeneous

    rate, by_kind = gpu_rates(9.3e12, 732e9)
    return homogeneous(f"paper@{memory_bytes:g}", 4, flops_per_s=rate, flops_per_s_by_kind=by_kind, bandwidth_Bps=12e9,
                       latency_s=10e-6, memory_bytes=memory_bytes)  # fmt: skip


def test_a_weight_slice_is_held_once_per_device_that_reads_it():
    g = workloads.build("ffnn", size="tiny")
    s = memory.input_slices(g)
    assert set(np.array(s.names)[~s.weight]) == {"X"}  # the forward's argument; W1, b1, W2, b2 are weights
    ops, sl = s.op_slices()
    w = sl[s.weight[sl]]
    shared = int(np.bincount(w).argmax())  # a weight slice several ops read
    readers = ops[sl == shared]
    assert len(readers) >= 2
    one = np.zeros(g.num_ops, np.int64)
    assert memory.resident_bytes(g, one, 2)[0] == memory.weight_bytes(g)  # every slice once on device 0
    two = one.copy()
    two[readers[0]] = 1  # one reader moves: the slice is now held on both devices
    res = memory.resident_bytes(g, two, 2)
    assert res[1] >= s.nbytes[shared] and res.sum() >= memory.weight_bytes(g) + s.nbytes[shared]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), name=st.sampled_from(["ffnn", "llama_block", "chainmm"]))
def test_resident_bytes_need_no_simulation_and_the_trace_adds_exactly_them(seed, name):
    g = workloads.build(name, size="tiny")
    c = cluster("v100x8")
    dev = np.random.default_rng(seed).integers(0, c.num_devices, g.num_ops)
    r = simulate(g, c, dev, trace=True)
    want = memory.resident_bytes(g, dev, c.num_devices)
    assert np.array_equal(r.resident_bytes, want)
    assert np.array_equal(r.peak_memory_bytes, want + r.trace.activation_peak_bytes(g, c.num_devices))
    # every device holds at most everything at once: the bound under which nothing needs checking
    s = memory.input_slices(g)
    assert r.peak_memory_bytes.max() <= s.nbytes.sum() + g.output_bytes.sum()


def test_a_graph_without_recorded_user_inputs_counts_every_input_as_a_weight():
    g = workloads.build("ffnn", size="tiny")
    old = dataclasses.replace(g, meta={k: v for k, v in g.meta.items() if k != "user_inputs"})
    assert memory.weight_bytes(old) > memory.weight_bytes(g)
    assert memory.input_slices(old).weight.all()


def test_budget_is_memory_times_the_fraction_and_null_memory_is_unlimited():
    c = cluster("p100x4")
    assert memory.budget_bytes(c).tolist() == [16e9 * 0.9] * 4
    assert memory.budget_bytes(c, 0.5).tolist() == [8e9] * 4
    assert np.isinf(memory.budget_bytes(cluster("unit:3"))).all()
    for bad in (0, 1.5, -0.1, "x", True, float("nan")):
        with pytest.raises(memory.MemoryBudgetError, match="--memory-fraction"):
            memory.budget_bytes(c, bad)


def test_a_shortfall_names_the_weights_or_the_op_that_cannot_fit():
    g = workloads.build("ffnn", size="tiny")
    w = memory.weight_bytes(g)
    assert memory.shortfall(g, np.full(4, w / 5)).op == -1  # the weights alone need more than 4 x w/5
    s = memory.input_slices(g)
    ops, sl = s.op_slices()
    own = np.bincount(ops, weights=s.nbytes[sl], minlength=g.num_ops) + g.output_bytes
    short = memory.shortfall(g, np.full(8, own.max() * 0.99))
    assert short is not None and short.op == int(own.argmax())
    assert memory.shortfall(g, np.full(4, w)) is None


@pytest.mark.parametrize("method", ["heft", "critical_path", "lookahead", "heft_lookahead", "enumerative"])
@pytest.mark.parametrize("name", ["llama_block", "llama_layer"])
def test_memory_aware_list_schedulers_place_within_the_budget(method, name):
    """Where the unlimited schedule overfills a device of a graph whose weights dominate, the memory-aware one
    keeps each device within its budget when simulated, or says it cannot; with room to spare it is the
    unlimited schedule."""
    g = workloads.build(name) if name == "llama_layer" else workloads.build(name, size="tiny")
    c = _paper_box()
    free = assign(g, c, method)
    free_peak = simulate(g, c, free, trace=True).peak_memory_bytes
    assert np.array_equal(assign(g, c, method, memory_fraction=1.0).devices, free.devices)  # nothing binds
    fitted = 0
    for share in (0.98, 0.9, 0.8):
        tight = _paper_box(free_peak.max() * share / memory.DEFAULT_MEMORY_FRACTION)
        try:
            a = assign(g, tight, method)
        except MethodError as e:
            assert "does not fit" in str(e) or "no device has room" in str(e)
            continue
        r = simulate(g, tight, a, trace=True)
        assert (r.peak_memory_bytes <= memory.budget_bytes(tight)).all() and a.info["memory_feasible"]
        fitted += 1
    assert fitted >= 1


def test_a_method_that_does_not_place_by_memory_is_refused_naming_the_device():
    g = workloads.build("llama_layer")
    c = _paper_box(1e9)
    with pytest.raises(MethodError, match=r"single's placement of llama_layer does not fit \(single does not place "
                                          r"by memory\): gpu0 holds .* at peak"):  # fmt: skip
        assign(g, c, "single")
    a = assign(g, c, "single", ignore_memory=True)
    assert (a.devices == 0).all()
    assert assign(g, c, "heft").info["memory_feasible"]


def test_where_live_activations_overflow_every_try_the_error_says_so():
    """tiny ffnn holds six times more activations than weights: lowering the weights' caps cannot make room,
    and after its tries the method names the device still over budget."""
    g = workloads.build("ffnn", size="tiny")
    c = _paper_box()
    peak = simulate(g, c, assign(g, c, "heft"), trace=True).peak_memory_bytes
    tight = _paper_box(peak.max() * 0.98 / memory.DEFAULT_MEMORY_FRACTION)
    with pytest.raises(MethodError, match=r"heft's placement of ffnn does not fit( after \d tries)?: gpu\d holds"):
        assign(g, tight, "heft")


def test_anneal_searches_within_the_budget_from_a_start_that_fits():
    g = workloads.build("llama_layer")
    c = _paper_box()
    free = simulate(g, c, assign(g, c, "anneal", max_evals=2000), trace=True)
    tight = _paper_box(free.peak_memory_bytes.max() * 0.98 / memory.DEFAULT_MEMORY_FRACTION)
    a = assign(g, tight, "anneal", max_evals=2000)
    r = simulate(g, tight, a, trace=True)
    assert (r.peak_memory_bytes <= memory.budget_bytes(tight)).all() and a.info["memory_feasible"]
    assert r.makespan_s <= simulate(g, tight, assign(g, tight, a.info["start_method"])).makespan_s * (1 + 1e-12)
    again = assign(g, tight, "anneal", max_evals=2000)  # deterministic for a seed and an evaluation count
    assert np.array_equal(again.devices, a.devices)


def test_anneal_without_a_budget_searches_as_before():
    g = workloads.build("llama_block", size="tiny")
    c = cluster("v100x8")
    assert np.array_equal(assign(g, c, "anneal", max_evals=800).devices,
                          assign(g, c, "anneal", max_evals=800, ignore_memory=True).devices)  # fmt: skip


def test_doppler_keeps_the_best_decode_that_fits_and_searches_within_the_budget():
    g = workloads.build("llama_layer")
    c = _paper_box()
    free = simulate(g, c, assign(g, c, "doppler", samples=8), trace=True)
    tight = _paper_box(free.peak_memory_bytes.max() * 0.95 / memory.DEFAULT_MEMORY_FRACTION)
    for kw in ({"samples": 8}, {"budget_s": 0.5}):
        try:
            a = assign(g, tight, "doppler", **kw)
        except MethodError as e:  # every decode over budget: refused, naming the device
            assert "does not fit" in str(e) and "samples" in kw
            continue
        r = simulate(g, tight, a, trace=True)
        assert (r.peak_memory_bytes <= memory.budget_bytes(tight)).all() and a.info["memory_feasible"]


def test_dopplers_decode_puts_each_op_only_where_it_has_room():
    """The shipped policy's greedy decode, masked by the memory ledger, fits where the unmasked one does not;
    with no room anywhere for an op the decode says which step."""
    from doppler.policy.decode import RolloutError, make_plan
    from doppler.policy.features import graph_features
    from doppler.policy.infer import load_shipped

    g = workloads.build("llama_layer")
    c = _paper_box()
    free = simulate(g, c, assign(g, c, "doppler"), trace=True)
    tight = _paper_box(free.peak_memory_bytes.max() * 0.9 / memory.DEFAULT_MEMORY_FRACTION)
    with pytest.raises(MethodError, match="does not fit"):
        assign(g, tight, "single")
    a = assign(g, tight, "doppler")
    r = simulate(g, tight, a, trace=True)
    assert (r.peak_memory_bytes <= memory.budget_bytes(tight)).all()
    assert r.makespan_s <= free.makespan_s * 1.05  # masking alone costs little here
    policy = load_shipped()
    gf = graph_features(g, c)
    with pytest.raises(RolloutError, match="no device has room"):
        policy.decode(gf, make_plan(g.num_ops, batch=1, mode="greedy", memory_budget_bytes=np.full(4, 1e6)),
                      policy.heads(gf))  # fmt: skip


@pytest.mark.parametrize("method", ["gdp", "placeto", "single_policy"])
def test_the_learned_baselines_choose_only_devices_with_room(method):
    """GDP, PLACETO and the single policy, under a budget, choose each op's device among the devices with
    room: every sampled episode keeps its weights within the caps, and the scores give no probability
    elsewhere."""
    import torch

    from doppler.policy.architectures import build_policy
    from doppler.policy.decode import make_plan
    from doppler.policy.features import graph_features
    from doppler.policy.rollout import evaluate_actions, run_plan

    g = workloads.build("llama_block", size="tiny")
    gf = graph_features(g, cluster("p100x4"))
    budget = np.full(4, memory.weight_bytes(g) * 0.3)
    enc = build_policy(method, num_devices=4, hidden=16, steps=2, mlp_hidden=16).encode(gf)
    ro = run_plan(gf, enc, make_plan(g.num_ops, batch=4, mode="sample", eps=0.3, rng=np.random.default_rng(0),
                                     memory_budget_bytes=budget))  # fmt: skip
    assert all((memory.resident_bytes(g, a, 4) <= budget).all() for a in ro.assignment)
    sc = evaluate_actions(enc, ro)
    assert torch.isfinite(sc.logp_plc).all() and torch.isfinite(sc.entropy_plc).all()
    assert torch.isfinite(sc.logp_sel).all() and torch.isfinite(sc.entropy_sel).all()
    no_room = ~torch.isfinite(sc.plc_logp)
    assert no_room.any()  # the budget bound somewhere, and there the device had no probability
    if ro.room is not None:
        assert torch.equal(no_room, torch.from_numpy(~ro.room))
