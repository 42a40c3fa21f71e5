"""HEFT against the textbook example (Topcuoglu, Hariri and Wu, IEEE TPDS 13(3), 2002, Fig. 2)."""

from __future__ import annotations

import numpy as np
import pytest

from doppler.methods import assign, heft_schedule
from doppler.ir.graph import from_edges
from doppler.hardware.presets import unit

# computation cost of n1..n10 on P1, P2, P3
W = np.array(
    [[14, 16, 9], [13, 19, 18], [11, 13, 19], [13, 8, 17], [12, 13, 10],
     [13, 16, 9], [7, 15, 11], [5, 11, 14], [18, 12, 20], [21, 7, 16]],
    dtype=float,
)  # fmt: skip
# (from, to, communication cost), tasks numbered from 1 as in the paper
EDGES = [
    (1, 2, 18), (1, 3, 12), (1, 4, 9), (1, 5, 11), (1, 6, 14), (2, 8, 19), (2, 9, 16), (3, 7, 23),
    (4, 8, 27), (4, 9, 23), (5, 9, 13), (6, 8, 15), (7, 10, 17), (8, 10, 11), (9, 10, 13),
]  # fmt: skip


def textbook():
    g = from_edges(W.mean(axis=1), [(a - 1, b - 1) for a, b, _ in EDGES])
    comm = np.array([c for *_, c in EDGES], dtype=float)
    assert g.src.tolist() == [a - 1 for a, _, _ in EDGES]  # edge order kept, so comm lines up
    return g, comm


def test_textbook_example_schedule_length_80():
    g, comm = textbook()
    s = heft_schedule(g, compute_s=W, comm_s=comm)
    # upward ranks from the paper's Table 2
    np.testing.assert_allclose(
        s.rank_u, [108.0, 77.0, 80.0, 80.0, 69.0, 63.333, 42.667, 35.667, 44.333, 14.667], atol=1e-3
    )
    assert (s.order + 1).tolist() == [1, 3, 4, 2, 5, 6, 9, 7, 8, 10]
    assert s.makespan_s == pytest.approx(80.0)
    # the paper's Fig. 4(a) schedule (processors numbered from 1)
    assert (s.assignment + 1).tolist() == [3, 1, 3, 2, 3, 2, 3, 1, 2, 2]
    np.testing.assert_allclose(s.start_s, [0, 27, 9, 18, 28, 26, 38, 57, 56, 73])
    np.testing.assert_allclose(s.finish_s, [9, 40, 28, 26, 38, 42, 49, 62, 68, 80])


def test_insertion_uses_idle_gaps():
    # op 0 (long) on d0; op 1 depends on 0 with a huge transfer -> stays on d0 after a gap?
    # Simpler: one device; op 2 arrives late in the list but is independent and fits a gap.
    # chain 0 -> 1 with 0 costing 1, a 10-unit transfer-free wait can't occur on one device,
    # so use explicit costs on 2 devices where the gap on d1 is used.
    # ops: 0 (d0:1, d1:100), 1 (d0:100, d1:1) with edge 0->1 comm 5; 2 independent small op.
    comp = np.array([[1.0, 100.0], [100.0, 1.0], [2.0, 2.0]])
    g = from_edges(comp.mean(axis=1), [(0, 1)])
    s = heft_schedule(g, compute_s=comp, comm_s=np.array([5.0]))
    # order by rank: 0 (50.5 + 5 + 50.5 = 106), 1 (50.5), 2 (2)
    # 0 -> d0 [0, 1]; 1 -> d1 ready at 6 -> [6, 7]; 2: d0 free at 1 -> [1, 3]; d1 gap [0, 6] -> [0, 2]
    # EFT d0 = 3, d1 = 2 -> d1 inserted before op 1.
    assert s.assignment.tolist() == [0, 1, 1]
    np.testing.assert_allclose(s.start_s, [0, 6, 0])
    assert s.makespan_s == pytest.approx(7.0)


def test_heft_method_on_cluster():
    g = from_edges([2, 3, 1, 2], [(0, 1), (0, 2), (1, 3), (2, 3)], output_bytes=[1, 2, 1, 0])
    a = assign(g, unit(2), "heft")
    assert a.method == "heft"
    assert a.estimated_makespan_s == pytest.approx(7.0)
