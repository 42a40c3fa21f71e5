"""LOOKAHEAD: never worse than CRITICAL PATH, its branches are CRITICAL PATH completions, and its
labels are what the ``lookahead`` teacher imitates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler import cluster, workloads
from doppler.methods import assign
from doppler.methods.critical_path import critical_path_schedule
from doppler.methods.lookahead import lookahead_labels
from doppler.simulate import simulate, simulate_many


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000), ops=st.integers(2, 40), devices=st.integers(1, 5),
       preset=st.sampled_from(["p100x4", "unit:4", "v100x8"]))  # fmt: skip
def test_never_worse_than_critical_path_and_reports_its_simulated_makespan(seed, ops, devices, preset):
    g = workloads.build("random", num_ops=ops, seed=seed)
    cl = cluster(preset if preset != "unit:4" else f"unit:{devices}")
    la = assign(g, cl, "lookahead")
    cp = assign(g, cl, "critical_path")
    la_s, cp_s = simulate(g, cl, la).makespan_s, simulate(g, cl, cp).makespan_s
    assert la_s <= cp_s * (1 + 1e-9)
    assert la.estimated_makespan_s == pytest.approx(la_s, rel=1e-9)


def test_it_improves_on_critical_path_where_critical_path_is_poor():
    g = workloads.build("llama_layer")
    cl = cluster("v100x8")
    la_s = simulate(g, cl, assign(g, cl, "lookahead")).makespan_s
    cp_s = simulate(g, cl, assign(g, cl, "critical_path")).makespan_s
    assert la_s < 0.95 * cp_s


def test_a_branch_on_critical_paths_own_device_completes_to_critical_path():
    g = workloads.build("random", num_ops=40, seed=3)
    cl = cluster("p100x4")
    sched = critical_path_schedule(g, cl)
    order, devs = sched["order"], sched["assignment"][sched["order"]]
    cp_s = float(simulate_many(g, cl, sched["assignment"][None])[0])
    steps = np.array([0, 7, 19, 39])
    makespan_s, tied = lookahead_labels(g, cl, order, devs, steps)
    assert makespan_s.shape == tied.shape == (4, 4)
    np.testing.assert_allclose(makespan_s[np.arange(4), devs[steps]], cp_s, rtol=1e-12)
    assert (makespan_s.min(axis=1) <= cp_s * (1 + 1e-12)).all()
    assert tied.any(axis=1).all() and tied[np.arange(4), makespan_s.argmin(axis=1)].all()
    # at the last step every later op is placed: each branch differs from cp only in that op
    last_op = order[39]
    alt = np.tile(sched["assignment"], (4, 1))
    alt[:, last_op] = np.arange(4)
    np.testing.assert_allclose(makespan_s[3], simulate_many(g, cl, alt), rtol=1e-12)


def test_an_invalid_trajectory_is_refused():
    g = workloads.build("random", num_ops=20, seed=1)
    sched = critical_path_schedule(g, cluster("unit:2"))
    bad = sched["order"][::-1].copy()
    with pytest.raises(ValueError, match="not a candidate"):
        lookahead_labels(g, cluster("unit:2"), bad, np.zeros(20, np.int64), np.array([3]))
