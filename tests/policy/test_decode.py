"""Greedy choices tie within GREEDY_TIE_RTOL (lowest id wins), so one ulp of float32 rounding,
which differs between CPUs and between torch and numpy, cannot reorder identical ops."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler.policy.decode import GREEDY_TIE_RTOL, choose, pick


def test_pick_greedy_ties_within_tolerance_go_to_the_lowest_id():
    top = 1381.7
    ulp = float(np.spacing(np.float32(top)))  # what BLAS rounding moves a float32 score by
    scores = np.array([top - 50.0, top, top + 2 * ulp, top - 1.0])
    idx = np.array([3, 2, 1, 0])
    assert pick(scores, idx, 4, 1, 0.0, 0.0, 0.0) == 1  # 2 and 1 tie; 1 is lower
    scores[1] = top + 10.0  # clearly best
    assert pick(scores, idx, 4, 1, 0.0, 0.0, 0.0) == 1
    scores[2] = top + 12.0
    assert pick(scores, idx, 4, 1, 0.0, 0.0, 0.0) == 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=9), st.integers(0, 2**31 - 1))
def test_greedy_choice_is_the_lowest_index_within_tolerance_of_the_max(values, seed):
    w = np.asarray(values, dtype=np.float64)
    top = w.max()
    want = int(np.flatnonzero(w >= top - GREEDY_TIE_RTOL * max(abs(top), 1.0))[0])
    idx = np.random.default_rng(seed).permutation(len(w)).astype(np.int64)
    assert pick(w, idx, len(w), 1, 0.0, 0.0, 0.0) == want
    assert int(choose(w[None, :], False, np.zeros(1), np.zeros(1), 0.0)[0]) == want
    # a perturbation of one float32 ulp on every score does not change the choice, unless a score
    # sits right at the edge of the tolerance
    noisy = w + np.spacing(np.abs(w).astype(np.float32)).astype(np.float64) * np.random.default_rng(seed).choice([-1, 1], len(w))
    edge = np.abs(w - (top - GREEDY_TIE_RTOL * max(abs(top), 1.0))) < 4 * np.spacing(np.float32(max(abs(top), 1.0)))
    if not edge.any():
        assert pick(noisy, idx, len(w), 1, 0.0, 0.0, 0.0) == want
