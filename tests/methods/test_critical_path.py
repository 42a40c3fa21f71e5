"""CRITICAL PATH teacher: a hand-computed schedule and the structure of its step trace."""

from __future__ import annotations

import numpy as np
import pytest

from doppler.methods import assign, critical_path_trace
from doppler.ir.graph import from_edges
from doppler.hardware.presets import unit


def diamond():
    # 0 -> {1, 2} -> 3 ; compute = flops, transfer = output bytes on the unit cluster
    return from_edges([2, 3, 1, 2], [(0, 1), (0, 2), (1, 3), (2, 3)], output_bytes=[1, 2, 1, 0])


def test_hand_computed_schedule_on_two_unit_devices():
    # unit:2 -> op time = flops, transfer = bytes (latency 0, 1 B/s); with 2 devices the
    # mean transfer time over distinct pairs is just the bytes.
    # b-levels: b3 = 2; b1 = 3 + (2 + b3) = 7; b2 = 1 + (1 + b3) = 4; b0 = 2 + max(1 + 7, 1 + 4) = 10.
    # step 1: C = {0}; EST = [0, 0] -> tie -> device 0; op 0 runs [0, 2]; free = [2, 0].
    # step 2: C = {1, 2}; b1 = 7 > b2 = 4 -> op 1. EST d0 = max(2, 2) = 2, d1 = max(0, 2 + 1) = 3
    #         -> device 0, runs [2, 5]; free = [5, 0].
    # step 3: C = {2}. EST d0 = max(5, 2) = 5, d1 = max(0, 2 + 1) = 3 -> device 1, runs [3, 4].
    # step 4: C = {3}; inputs 1 (d0, done 5, 2 B) and 2 (d1, done 4, 1 B).
    #         EST d0 = max(5, 5, 4 + 1) = 5, d1 = max(4, 5 + 2, 4) = 7 -> device 0, runs [5, 7].
    g = diamond()
    tr = critical_path_trace(g, unit(2))
    np.testing.assert_allclose(tr.b_level, [10, 7, 4, 2])
    assert tr.order.tolist() == [0, 1, 2, 3]
    assert tr.assignment.tolist() == [0, 0, 1, 0]
    assert tr.devices.tolist() == [0, 0, 1, 0]
    np.testing.assert_allclose(tr.est_s, [[0, 0], [2, 3], [5, 3], [5, 7]])
    np.testing.assert_allclose(tr.start_s, [0, 2, 3, 5])
    np.testing.assert_allclose(tr.finish_s, [2, 5, 4, 7])
    assert tr.makespan_s == pytest.approx(7.0)
    assert [tr.candidates(h).tolist() for h in range(4)] == [[0], [1, 2], [2], [3]]
    assert [tr.tied_candidates(h).tolist() for h in range(4)] == [[0], [1], [2], [3]]
    assert [tr.tied_devices(h).tolist() for h in range(4)] == [[0, 1], [0], [1], [0]]
    a = assign(g, unit(2), "critical_path")
    assert a.devices.tolist() == [0, 0, 1, 0]
    assert a.estimated_makespan_s == pytest.approx(7.0)


def test_hand_computed_heavy_transfer_keeps_chain_together():
    # Chain 0 -> 1 -> 2 plus an independent op 3, on unit:2; outputs are expensive (10 B).
    # b-levels: b2 = 1, b1 = 1 + 10 + 1 = 12, b0 = 1 + 10 + 12 = 23, b3 = 5.
    # step 1: C = {0, 3}: op 0 (23 > 5) -> EST [0, 0] -> device 0, [0, 1]; free [1, 0].
    # step 2: C = {1, 3}: op 1 (12 > 5) -> EST d0 = 1, d1 = 0 + ... max(0, 1 + 10) = 11 -> device 0, [1, 2].
    # step 3: C = {2, 3}: op 3 (5 > 1) -> EST d0 = 2, d1 = 0 -> device 1, [0, 5].
    # step 4: C = {2}: EST d0 = max(2, 2) = 2, d1 = max(5, 2 + 10) = 12 -> device 0, [2, 3].
    g = from_edges([1, 1, 1, 5], [(0, 1), (1, 2)], output_bytes=[10, 10, 10, 10])
    tr = critical_path_trace(g, unit(2))
    assert tr.order.tolist() == [0, 1, 3, 2]
    assert tr.assignment.tolist() == [0, 0, 0, 1]
    assert [tr.candidates(h).tolist() for h in range(4)] == [[0, 3], [1, 3], [2, 3], [2]]
    np.testing.assert_allclose(tr.finish_s, [1, 2, 3, 5])
    assert tr.makespan_s == pytest.approx(5.0)


def test_ties_go_to_lowest_op_and_device():
    # four identical independent ops on unit:2: all b-levels tie -> ids in order; devices 0, 1, 0, 1
    g = from_edges([1, 1, 1, 1], [])
    tr = critical_path_trace(g, unit(2))
    assert tr.order.tolist() == [0, 1, 2, 3]
    assert tr.assignment.tolist() == [0, 1, 0, 1]
    assert tr.tied_candidates(0).tolist() == [0, 1, 2, 3]
    assert tr.tied_devices(0).tolist() == [0, 1]


def test_trace_is_consistent_on_a_workload():
    from doppler import workloads
    from doppler.hardware.presets import cluster

    g = workloads.build("ffnn", size="tiny")
    c = cluster("p100x4")
    tr = critical_path_trace(g, c)
    n, d = g.num_ops, c.num_devices
    assert sorted(tr.order.tolist()) == list(range(n))
    assert tr.est_s.shape == (n, d) and tr.device_tied.shape == (n, d)
    placed = np.zeros(n, bool)
    for h in range(n):
        v, dv = int(tr.order[h]), int(tr.devices[h])
        cands = tr.candidates(h)
        assert v in cands and v in tr.tied_candidates(h)
        # every candidate has all predecessors placed, and is not placed yet
        for u in cands:
            assert placed[g.predecessors(int(u))].all() and not placed[u]
        assert tr.device_tied[h, dv] and dv == int(np.flatnonzero(tr.device_tied[h])[0])
        assert tr.est_s[h, dv] == pytest.approx(tr.est_s[h].min())
        assert tr.start_s[v] == pytest.approx(tr.est_s[h, dv])
        placed[v] = True
    assert tr.assignment[tr.order].tolist() == tr.devices.tolist()
    assert assign(g, c, "critical_path").devices.tolist() == tr.assignment.tolist()
