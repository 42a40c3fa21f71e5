"""The cost model: per-(op, device) compute times and per-edge transfer times, shared by the
list schedulers (critical path, HEFT, enumerative, METIS), the policy's features and the
simulator's context, and the integer priority keys every list scheduler orders by.

A transfer of edge ``e = (u, v)`` from device ``a`` to device ``b != a`` takes
``latency[a, b] + edge_bytes[e] * inv_bw[a, b]`` (the producer's output bytes over
the link, docs/design.md, Execution semantics); staying on a device is free (``latency`` and ``inv_bw``
have a zero diagonal). Device-independent quantities (b-levels, upward ranks) use
the **mean** compute time of an op over devices and the **mean** transfer time of
an edge over ordered pairs of distinct devices (:meth:`CostModel.mean_transfer_s`).

For textbook examples (HEFT, Topcuoglu et al. 2002) the model can be built from
explicit costs instead of a cluster: ``compute_s[n, D]`` per (op, device) and
``comm_s[E]`` per edge (the time of that edge between any two distinct devices).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.ir.analysis import b_level


@dataclass
class CostModel:
    compute_s: np.ndarray  # float64[n, D]
    edge_bytes: np.ndarray  # float64[E] (bytes, or seconds when inv_bw is 1 off-diagonal)
    latency_s: np.ndarray  # float64[D, D], zero diagonal
    inv_bw: np.ndarray  # float64[D, D], zero diagonal

    @property
    def num_devices(self) -> int:
        return int(self.compute_s.shape[1])

    @classmethod
    def build(
        cls,
        graph: DataflowGraph,
        cluster=None,
        *,
        compute_s: np.ndarray | None = None,
        comm_s: np.ndarray | None = None,
    ) -> "CostModel":
        n, m = graph.num_ops, graph.num_edges
        if compute_s is None:
            if cluster is None:
                raise ValueError("give a cluster or an explicit compute_s[n, D]")
            comp = np.asarray(cluster.compute_time_s(graph), dtype=np.float64)
        else:
            comp = np.asarray(compute_s, dtype=np.float64)
            if comp.ndim == 1:
                comp = comp[:, None]
        if comp.ndim != 2 or comp.shape[0] != n:
            raise ValueError(f"compute_s must have shape (num_ops={n}, D), got {comp.shape}")
        d = comp.shape[1]
        eye = np.eye(d, dtype=bool)
        if comm_s is not None:
            eb = np.asarray(comm_s, dtype=np.float64).reshape(-1)
            if eb.shape != (m,):
                raise ValueError(f"comm_s must have one entry per edge ({m}), got shape {eb.shape}")
            lat = np.zeros((d, d))
            inv = np.where(eye, 0.0, 1.0)
        else:
            if cluster is None:
                raise ValueError("give a cluster or an explicit comm_s[E]")
            if cluster.num_devices != d:
                raise ValueError(f"compute_s has {d} devices but the cluster has {cluster.num_devices}")
            eb = graph.output_bytes[graph.src].astype(np.float64)
            lat = np.where(eye, 0.0, np.asarray(cluster.latency_s, dtype=np.float64))
            with np.errstate(divide="ignore"):
                inv = np.where(eye, 0.0, 1.0 / np.asarray(cluster.bandwidth_Bps, dtype=np.float64))
        return cls(compute_s=comp, edge_bytes=eb, latency_s=lat, inv_bw=inv)

    # ------------------------------------------------------------ means
    def mean_compute_s(self) -> np.ndarray:
        return self.compute_s.mean(axis=1)

    def mean_transfer_s(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Time to move ``nbytes`` averaged over ordered pairs of distinct devices (0 if D == 1)."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        d = self.num_devices
        if d == 1:
            return np.zeros_like(nbytes)
        off = ~np.eye(d, dtype=bool)
        return self.latency_s[off].mean() + nbytes * self.inv_bw[off].mean()

    def mean_edge_comm_s(self) -> np.ndarray:
        """Per-edge transfer time averaged over ordered pairs of distinct devices (0 if D == 1)."""
        return self.mean_transfer_s(self.edge_bytes)

    def b_level(self, graph: DataflowGraph) -> np.ndarray:
        """Longest path to an exit with mean compute and mean communication costs."""
        return b_level(graph, self.mean_compute_s(), self.mean_edge_comm_s())

    def pred_bytes(self, graph: DataflowGraph) -> np.ndarray:
        """``edge_bytes`` in predecessor-CSR slot order (aligned with ``graph.pred_idx``)."""
        return self.edge_bytes[graph.pred_eid]


def priority_key(values: np.ndarray) -> np.ndarray:
    """Integer keys that order ``values`` but treat values equal up to a relative
    ``1e-12`` of the largest magnitude as ties (so floating-point noise in b-levels
    and ranks never decides a tie; ties then fall to the documented rule)."""
    x = np.asarray(values, dtype=np.float64)
    top = float(np.abs(x).max()) if x.size else 0.0
    if top == 0.0 or not np.isfinite(top):
        return np.zeros(x.shape, dtype=np.int64)
    return np.rint(x / top * 1e12).astype(np.int64)
