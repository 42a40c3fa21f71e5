"""LOOKAHEAD and HEFT_LOOKAHEAD: never worse than the rule they roll out, and their branches are that
rule's completions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler import cluster, workloads
from doppler.methods import assign
from doppler.methods.critical_path import critical_path_schedule
from doppler.sim import simulate


@pytest.mark.parametrize("method, base", [("lookahead", "critical_path"), ("heft_lookahead", "heft")])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), ops=st.integers(2, 40), devices=st.integers(1, 5),
       preset=st.sampled_from(["p100x4", "unit:4", "v100x8"]))  # fmt: skip
def test_never_worse_than_the_rule_it_rolls_out_and_reports_its_simulated_makespan(method, base, seed, ops, devices,
                                                                                    preset):  # fmt: skip
    g = workloads.build("random", num_ops=ops, seed=seed)
    cl = cluster(preset if preset != "unit:4" else f"unit:{devices}")
    rolled = assign(g, cl, method)
    rolled_s, base_s = simulate(g, cl, rolled).makespan_s, simulate(g, cl, assign(g, cl, base)).makespan_s
    assert rolled_s <= base_s * (1 + 1e-9)
    assert rolled.estimated_makespan_s == pytest.approx(rolled_s, rel=1e-9)


@pytest.mark.parametrize("method, base", [("lookahead", "critical_path"), ("heft_lookahead", "heft")])
def test_it_improves_on_the_rule_where_the_rule_is_poor(method, base):
    g = workloads.build("llama_layer")
    cl = cluster("v100x8")
    assert simulate(g, cl, assign(g, cl, method)).makespan_s < 0.95 * simulate(g, cl, assign(g, cl, base)).makespan_s


def test_a_branch_on_critical_paths_own_device_completes_to_critical_path():
    """At any step of CRITICAL PATH's own trajectory, its completion with the op on the rule's device is
    CRITICAL PATH's assignment; on another device, it differs in that op at least."""
    from doppler.listsched import critical_path_completion, empty_state, est_into, place, take_candidate
    from doppler.methods.lookahead import _Arrays

    g = workloads.build("random", num_ops=40, seed=3)
    cl = cluster("p100x4")
    sched = critical_path_schedule(g, cl)
    order, devs = sched["order"], sched["assignment"][sched["order"]]
    arr = _Arrays(g, cl)
    (pred_ptr, pred_idx, pred_bytes, succ_ptr, succ_idx), (comp, lat, inv) = arr.graph_arrays, arr.cost_arrays
    dev, start, finish, free, assigned, indeg, cand, pos, ncand = empty_state(arr.indeg0, cl.num_devices)
    est, out = np.empty(cl.num_devices), np.empty(g.num_ops, np.int64)
    for h, v in enumerate(order):
        if h in (0, 7, 19, 39):
            for d in range(cl.num_devices):
                critical_path_completion(v, d, arr.key, *arr.graph_arrays, *arr.cost_arrays, dev, start, finish, free,
                                         assigned, indeg, cand, pos, ncand, out)  # fmt: skip
                assert out[v] == d
                if d == devs[h]:
                    np.testing.assert_array_equal(out, sched["assignment"])
            np.testing.assert_array_equal(dev[order[:h]], devs[:h])  # the completions left the state as it was
        est_into(v, pred_ptr, pred_idx, pred_bytes, lat, inv, dev, finish, free, est)
        place(v, devs[h], est[devs[h]], comp, dev, start, finish, free, assigned)
        ncand = take_candidate(v, succ_ptr, succ_idx, indeg, cand, pos, ncand)


# ------------------------------------------------------------------ HEFT_LOOKAHEAD
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_rollout_step_is_heft_completions_and_their_makespans(threads):
    from doppler.methods import _rollout_loops as R
    from doppler.listsched import empty_schedule, heft_list_schedule, heft_place
    from doppler.methods.heft import heft_inputs
    from doppler.sim import SimContext

    g = workloads.build("random", num_ops=40, seed=3)
    cl = cluster("p100x4")
    order, _, arrays = heft_inputs(g, cl)
    pred_ptr, pred_idx, pred_bytes, comp, lat, inv = arrays
    heft_dev = heft_list_schedule(order, *arrays)[0]
    np.testing.assert_array_equal(heft_dev, assign(g, cl, "heft").devices)
    ctx = SimContext(g, cl)
    sim = (ctx.arrays, *ctx.noise(0.0, 0))
    out, vals = np.empty((3, 40), np.int64), np.empty(3)
    for h in (0, 17, 39):
        v = order[h]
        own = int(heft_dev[v])
        state = list(empty_schedule(40, 4))
        for u in order[:h]:  # HEFT's own schedule of the ops before step h
            state[3:5] = heft_place(u, heft_dev[u], *arrays, *state)
        best = R.rollout_step(order, h, own, arrays, state[:6], sim, threads, np.inf, out, vals)
        others = [d for d in range(4) if d != own]  # the rows, in device order; HEFT's own device is left out
        for row, d in zip(out, others):
            # the reference: HEFT itself, with op v able to run on device d only (the prefix is HEFT's own
            # choices, so HEFT makes them again)
            only_d = comp.copy()
            only_d[v, np.arange(4) != d] = np.inf
            np.testing.assert_array_equal(row, heft_list_schedule(order, pred_ptr, pred_idx, pred_bytes, only_d, lat, inv)[0])
        assert (out[:, v] == others).all()
        exact = ctx.simulate_many(out)
        # no cap: a row stops early (inf) only once it is sure to lose to an earlier row of its thread;
        # every other row, and the best, are exact
        done = np.isfinite(vals)
        np.testing.assert_array_equal(vals[done], exact[done])
        assert (exact[~done] > exact.min()).all()
        assert best == np.argmin(exact) and vals[best] == exact.min()
        # with a cap, the rows that cannot beat it may stop early, but the best one below it stays exact
        cap = float(np.sort(exact)[1]) if exact.min() < np.sort(exact)[1] else float(exact.min()) * 1.5
        best = R.rollout_step(order, h, own, arrays, state[:6], sim, threads, cap, out, vals)
        assert best == np.argmin(exact) and vals[best] == exact.min()
        assert (vals >= exact * (1 - 1e-12)).all()


def test_heft_lookahead_with_a_budget_stops_early_and_stays_valid():
    g = workloads.build("llama_layer")
    cl = cluster("v100x8")
    events = []
    quick = assign(g, cl, "heft_lookahead", budget_s=1e-9, on_progress=events.append)
    assert events == [] and quick.info["rollout_steps"] == 0  # the budget ran out before the first step
    np.testing.assert_array_equal(quick.devices, assign(g, cl, "heft").devices)
    full = assign(g, cl, "heft_lookahead", on_progress=events.append)
    assert full.info["rollout_steps"] == g.num_ops
    assert [e.done for e in events] == list(range(1, g.num_ops + 1)) and events[-1].total == g.num_ops
    assert events[-1].stats["evals"] == 1 + g.num_ops * (cl.num_devices - 1)
    assert events[-1].stats["best_makespan_s"] == pytest.approx(full.estimated_makespan_s, rel=1e-12)
