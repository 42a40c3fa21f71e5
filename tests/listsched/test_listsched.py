"""The shared list-schedule state: critical_path reproduces its pre-refactor assignments
exactly, and the batched state equals B independent single states."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from doppler import assign, cluster, workloads
from doppler.hardware.costs import CostModel
from doppler.listsched import NUM_DEVICE_FEATURES, PlacementState

DATA = Path(__file__).parents[1] / "data"
REFERENCE = json.loads((DATA / "critical_path_reference.json").read_text())


@pytest.mark.parametrize("case", sorted(REFERENCE))
def test_critical_path_matches_pre_refactor_reference(case):
    # Recorded with the critical_path implementation from before the list-schedule state
    # was shared with the policy (tests/data/critical_path_reference.json), on the presets of that time:
    # their cluster files (tests/data/clusters_v1/, format version 1) still load with the same costs.
    workload, params, cluster_name = case.split("|")
    g = workloads.build(workload, **json.loads(params))
    old = DATA / "clusters_v1" / f"{cluster_name}.json"
    a = assign(g, cluster(old if old.exists() else cluster_name), "critical_path")
    ref = REFERENCE[case]
    assert a.devices.tolist() == ref["assignment"]
    assert a.estimated_makespan_s == pytest.approx(ref["estimated_makespan_s"], rel=1e-12)


def test_batched_state_equals_independent_states():
    g = workloads.build("random", num_ops=60, seed=3)
    cm = CostModel.build(g, cluster("p100x4"))
    rng = np.random.default_rng(0)
    B = 5
    batched = PlacementState(g, cm, batch=B)
    singles = [PlacementState(g, cm, batch=1) for _ in range(B)]
    for v in g.topo_order:
        ops = np.full(B, v)
        devs = rng.integers(0, 4, size=B)
        est = batched.est(ops)
        feats = batched.features(ops)
        assert feats.shape == (B, 4, NUM_DEVICE_FEATURES)
        np.testing.assert_array_equal(feats[:, :, 4], est)
        for b, s in enumerate(singles):
            e1 = s.est(ops[b : b + 1])
            np.testing.assert_array_equal(e1[0], est[b])
            s.place(ops[b : b + 1], devs[b : b + 1], e1[:, devs[b]])
        batched.place(ops, devs, est[np.arange(B), devs])
    for b, s in enumerate(singles):
        np.testing.assert_array_equal(batched.finish_s[b], s.finish_s[0])
        np.testing.assert_array_equal(batched.dev[b], s.dev[0])


def test_insertion_keeps_busy_intervals_sorted_with_zero_length_ops():
    """Busy [0, 5) and [5, 10); a zero-length op ready at 3 goes to 5; then [12, 20). An op of
    length 2 ready at 7 must start at 10, after [5, 10), not inside it."""
    from doppler.listsched import insert_busy, insertion_starts_into

    start, end, count = np.zeros((1, 8)), np.zeros((1, 8)), np.zeros(1, np.int64)

    def place(ready: float, length: float) -> float:
        out = np.zeros((1, 11))
        out[0, 4] = ready
        insertion_starts_into(0, np.array([[length]]), start, end, count, out)
        s = out[0, 4]
        insert_busy(0, s, s + length, start, end, count)
        return s

    assert place(0.0, 5.0) == 0.0 and place(5.0, 5.0) == 5.0
    assert place(3.0, 0.0) == 5.0
    assert place(12.0, 8.0) == 12.0
    assert np.all(np.diff(end[0, : count[0]]) >= 0)
    assert place(7.0, 2.0) == 10.0
    assert place(0.0, 2.0) == 20.0  # [10, 12) is taken now; no earlier gap fits


@pytest.mark.parametrize("cluster_name", ["p100x4", "v100x8", "unit:3"])
def test_python_twins_of_the_device_features_equal_the_kernels_bit_for_bit(cluster_name):
    """The Python-float twins that a fresh `doppler assign` runs (`doppler.util.jit.as_python`) against the
    compiled loops, step by step along random schedules of a graph with zero-length ops and
    zero-byte edges, under both list-schedule models: every raw feature column, float64. HEFT's
    insertion is also compared on rows it did not compute itself."""
    from doppler.ir.graph import from_edges
    from doppler.listsched.state import (
        _features_into_lists,
        _heft_features_into_lists,
        _insertion_starts_into_lists,
        features_into,
        heft_features_into,
        insert_busy,
        insertion_starts_into,
        place,
        pred_comm_s,
    )

    rng = np.random.default_rng(len(cluster_name))
    n = 60
    edges = [(i, j) for j in range(1, n) for i in rng.choice(j, size=min(j, 3), replace=False) if rng.random() < 0.7]
    flops = np.where(rng.random(n) < 0.2, 0.0, rng.uniform(1e9, 1e11, n))
    g = from_edges(flops, edges, output_bytes=np.where(rng.random(n) < 0.2, 0.0, rng.uniform(1e3, 1e8, n)))
    cl = cluster(cluster_name)
    cm = CostModel.build(g, cl)
    nd = cl.num_devices
    arrays = (np.ascontiguousarray(g.pred_ptr, dtype=np.int64), np.ascontiguousarray(g.pred_idx, dtype=np.int64),
              np.ascontiguousarray(cm.pred_bytes(g), dtype=np.float64), pred_comm_s(g, cm))  # fmt: skip
    comp, lat, inv = cm.compute_s, cm.latency_s, cm.inv_bw
    for heft_model in (False, True):
        dev, start, finish = np.full(n, -1, np.int64), np.zeros(n), np.zeros(n)
        free, assigned, never_free = np.zeros(nd), np.zeros(nd), np.zeros(nd)
        busy_start, busy_end, busy_count = np.zeros((nd, n)), np.zeros((nd, n)), np.zeros(nd, np.int64)
        for v in g.topo_order:
            state = (*arrays, comp, lat, inv, dev, start, finish, never_free if heft_model else free, assigned)
            compiled, python = np.zeros((nd, NUM_DEVICE_FEATURES)), np.full((nd, NUM_DEVICE_FEATURES), np.nan)
            features_into(v, *state, compiled)
            _features_into_lists(v, *state, python)
            np.testing.assert_array_equal(python, compiled)
            if heft_model:
                other = rng.random((nd, NUM_DEVICE_FEATURES))  # any rows, not only features_into's
                for raw in (compiled, other):
                    twin = raw.copy()
                    insertion_starts_into(v, comp, busy_start, busy_end, busy_count, raw)
                    _insertion_starts_into_lists(v, comp, busy_start, busy_end, busy_count, twin)
                    np.testing.assert_array_equal(twin, raw)
                fused, fused_twin = np.zeros_like(compiled), np.full_like(compiled, np.nan)
                heft_features_into(v, *state, busy_start, busy_end, busy_count, fused)
                _heft_features_into_lists(v, *state, busy_start, busy_end, busy_count, fused_twin)
                np.testing.assert_array_equal(fused, compiled)  # (now with the insertion applied)
                np.testing.assert_array_equal(fused_twin, compiled)
            d = int(rng.integers(nd))
            est_d = compiled[d, 4]
            place(v, d, est_d, comp, dev, start, finish, free, assigned)
            if heft_model:
                insert_busy(d, est_d, est_d + comp[v, d], busy_start, busy_end, busy_count)
        assert (busy_count.sum() == n) if heft_model else (dev >= 0).all()
