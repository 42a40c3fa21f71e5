"""Lower bounds on the makespan, valid for every assignment, in WC and BSP, with or without link
contention (noise-free). :func:`doppler.sim.lower_bound` is the larger of the two below, computed
once per :class:`~doppler.sim.SimContext`:

* :func:`critical_path_bound`: the compute-only critical path, each op timed on its fastest device;
* :func:`work_bound`: the total work over the total device speed (streams counted), done correctly
  where devices differ by op kind or by op.
"""

from __future__ import annotations

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.ir.analysis import critical_path_length


def critical_path_bound(graph: DataflowGraph, compute_s: np.ndarray) -> float:
    """The longest path of compute times, each op on its fastest device (``compute_s[n, D]``, the
    seconds of each op on each device; transfers cost nothing here)."""
    return float(critical_path_length(graph, compute_s=compute_s.min(axis=1)))


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


def work_bound(graph: DataflowGraph, cluster: Cluster, compute_s: np.ndarray | None = None) -> float:
    """Total-work lower bound on the makespan, valid whatever each op takes on each device.

    With ``c[v, d] = compute_s[v, d] / streams[d]`` the seconds of makespan op ``v`` takes of device
    ``d``'s capacity, any schedule gives a feasible point of the LP ``min T  s.t.  sum_d x[v, d] = 1,
    sum_v c[v, d] x[v, d] <= T``. Its dual says that for every probability vector ``beta`` over
    devices, ``sum_v min_d beta_d c[v, d]`` is a lower bound: we evaluate that closed form, so the
    bound is valid whatever ``beta``. ``beta`` comes from the dual LP over op kinds (scipy HiGHS) with
    each kind's total ``C[k, d] = sum_{v of kind k} c[v, d]``, which is the exact LP where times are
    per-kind rates (a plain cluster: then, with one rate for every kind, it is exactly the total FLOPs
    over the total speed). (Naively dividing each op's time by the devices' summed speed for its kind is
    **not** a bound: two devices each fast at a different kind beat it.) ``compute_s`` defaults to
    :meth:`Cluster.compute_time_s` (overheads included).
    """
    t = cluster.compute_time_s(graph) if compute_s is None else np.asarray(compute_s, dtype=np.float64)
    c = t / cluster.streams[None, :].astype(np.float64)  # [n, D]
    kinds = graph.kind.astype(np.int64)
    C = np.stack([np.bincount(kinds, weights=c[:, d], minlength=int(kinds.max()) + 1) for d in range(c.shape[1])],
                 axis=1)  # [K, D]  # fmt: skip
    present = np.flatnonzero(C.sum(axis=1) > 0)
    if present.size == 0:
        return 0.0
    C = C[present]
    with np.errstate(divide="ignore"):
        speed = np.where(C > 0, 1.0 / C, 0.0)  # [K, D]: the share of kind k device d does per unit makespan
    betas = [speed.sum(axis=0) / speed.sum()]
    # Devices that differ by one speed factor for every kind (rank one): the column-sum beta is already the
    # LP's optimum; skip the solver and scipy's import.
    if not np.allclose(speed[:, :1] * speed[:1, :], speed[:1, :1] * speed, rtol=1e-9, atol=0.0):
        beta = _dual_lp_beta(np.ones(C.shape[0]), C)
        if beta is not None:
            betas.append(beta)
    best = 0.0
    for beta in betas:
        beta = np.clip(beta, 0.0, None)
        if beta.sum() <= 0:
            continue
        beta = beta / beta.sum()
        best = max(best, float((beta[None, :] * c).min(axis=1).sum()))
    return best
