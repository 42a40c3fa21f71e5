"""Lower bounds on the makespan, valid for every assignment, in WC and BSP, with or without link
contention (noise-free). :func:`doppler.sim.lower_bound` is the larger of the two below, computed
once per :class:`~doppler.sim.SimContext`:

* :func:`critical_path_bound`: the compute-only critical path, each op timed on its fastest device;
* :func:`work_bound`: the total work over the total device speed (streams counted), done correctly
  for per-kind rates.
"""

from __future__ import annotations

import numpy as np

from doppler.graph import DataflowGraph
from doppler.hardware import Cluster


def critical_path_bound(graph: DataflowGraph, compute_s: np.ndarray) -> float:
    """The longest path of compute times, each op on its fastest device (``compute_s[n, D]``, the
    seconds of each op on each device; transfers cost nothing here)."""
    return float(graph.critical_path_length(compute_s=compute_s.min(axis=1)))


def _dual_lp_beta(W: np.ndarray, c: np.ndarray) -> np.ndarray | None:
    """The dual LP's beta of :func:`work_bound` (scipy HiGHS), or None if the solver fails."""
    K, D = c.shape
    try:
        from scipy.optimize import linprog

        # variables: alpha[K] (free), beta[D] >= 0; maximise W.alpha
        # s.t. alpha_k - c[k, d] beta_d <= 0, sum beta = 1
        A = np.zeros((K * D, K + D))
        for k in range(K):
            A[k * D : (k + 1) * D, k] = 1.0
            A[k * D : (k + 1) * D, K:] = -np.diag(c[k])
        res = linprog(
            np.concatenate([-W, np.zeros(D)]),
            A_ub=A,
            b_ub=np.zeros(K * D),
            A_eq=np.concatenate([np.zeros(K), np.ones(D)])[None, :],
            b_eq=[1.0],
            bounds=[(None, None)] * K + [(0, None)] * D,
            method="highs",
        )
    except Exception:  # noqa: BLE001 - the proportional beta still gives a valid bound
        return None
    return np.asarray(res.x[K:]) if res.status == 0 else None


def work_bound(graph: DataflowGraph, cluster: Cluster) -> float:
    """Total-work lower bound on the makespan, valid with per-kind device rates.

    With ``W_k`` the FLOPs of kind ``k`` and ``c[k, d] = 1 / (rate[k, d] *
    streams[d])`` the seconds device ``d`` needs per FLOP of kind ``k`` (per
    unit of makespan), any schedule gives a feasible point of the LP
    ``min T  s.t.  sum_d y[k, d] = W_k,  sum_k c[k, d] y[k, d] <= T``. Its dual
    says that for every probability vector ``beta`` over devices,
    ``sum_k W_k * min_d beta_d c[k, d]`` is a lower bound. We take ``beta``
    from solving the dual LP (scipy HiGHS) and evaluate that closed form, so
    the bound is valid whatever the solver tolerance. When every device has
    one rate for all kinds present this is exactly ``total FLOPs / sum_d
    (rate_d * streams_d)``. (Naively dividing each op's FLOPs by the sum of
    the devices' rates *for its kind* is **not** a bound: two devices each
    fast at a different kind beat it.)
    """
    kinds = graph.kind.astype(np.int64)
    W = np.bincount(kinds, weights=graph.flops, minlength=len(cluster.throughput_matrix()))
    present = np.flatnonzero(W > 0)
    if present.size == 0:
        return 0.0
    W = W[present]
    cap = cluster.throughput_matrix()[present] * cluster.streams[None, :].astype(np.float64)  # [K, D]
    if np.all(cap == cap[0:1]):
        return float(W.sum() / cap[0].sum())
    c = 1.0 / cap
    betas = [cap.sum(axis=0) / cap.sum()]
    # Devices that differ by one speed factor for every kind (cap[k, d] = r_k * s_d, rank one): the
    # column-sum beta (proportional to s_d) is already the LP's optimum; skip the solver and scipy's import.
    if not np.allclose(cap[:, :1] * cap[:1, :], cap[:1, :1] * cap, rtol=1e-9, atol=0.0):
        beta = _dual_lp_beta(W, c)
        if beta is not None:
            betas.append(beta)
    best = 0.0
    for beta in betas:
        beta = np.clip(beta, 0.0, None)
        if beta.sum() <= 0:
            continue
        beta = beta / beta.sum()
        best = max(best, float((W * (beta[None, :] * c).min(axis=1)).sum()))
    return best
