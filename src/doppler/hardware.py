"""Devices and links: how long an op takes on a device, how long a transfer takes.

A :class:`Cluster` is a list of :class:`Device` plus two ``D x D`` matrices for
the ordered device pairs: ``bandwidth_Bps`` (bytes/s) and ``latency_s``. Moving
``b`` bytes from device ``i`` to ``j != i`` takes ``latency_s[i, j] + b /
bandwidth_Bps[i, j]``; staying on a device is free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from doppler.graph import DataflowGraph, OpKind


class ClusterError(ValueError):
    """A cluster description is invalid; the message names the device or field."""


@dataclass(frozen=True)
class Device:
    """One execution device: a GPU or a CPU worker."""

    name: str
    kind: str = "gpu"  # "cpu" | "gpu"
    flops_per_s: float = 1.0
    flops_per_s_by_kind: dict[str, float] = field(default_factory=dict)  # OpKind label -> FLOP/s override
    memory_bytes: float = float("inf")
    streams: int = 1


@dataclass
class Cluster:
    """A set of devices and the links between every ordered pair."""

    name: str
    devices: list[Device]
    bandwidth_Bps: np.ndarray  # float64[D, D]
    latency_s: np.ndarray  # float64[D, D]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bandwidth_Bps = np.asarray(self.bandwidth_Bps, dtype=np.float64)
        self.latency_s = np.asarray(self.latency_s, dtype=np.float64)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def streams(self) -> np.ndarray:
        return np.array([d.streams for d in self.devices], dtype=np.int64)

    def throughput_matrix(self) -> np.ndarray:
        """FLOP/s per (OpKind code, device): float64[len(OpKind), D]."""
        out = np.empty((len(OpKind), self.num_devices))
        for j, dev in enumerate(self.devices):
            out[:, j] = dev.flops_per_s
            for label, rate in dev.flops_per_s_by_kind.items():
                out[OpKind.parse(label).value, j] = rate
        return out

    def compute_time_s(self, graph: DataflowGraph) -> np.ndarray:
        """Seconds each op takes on each device: float64[num_ops, D]."""
        return graph.flops[:, None] / self.throughput_matrix()[graph.kind.astype(np.int64)]

    def transfer_time_s(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Seconds to move ``nbytes`` between every ordered device pair: shape (..., D, D), zero diagonal."""
        b = np.asarray(nbytes, dtype=np.float64)[..., None, None]
        t = self.latency_s + b / self.bandwidth_Bps
        eye = np.eye(self.num_devices, dtype=bool)
        return np.where(eye, 0.0, t)

    def mean_transfer_time_s(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Average over distinct device pairs of the transfer time (for device-independent features)."""
        d = self.num_devices
        if d == 1:
            return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
        off = ~np.eye(d, dtype=bool)
        mean_lat = self.latency_s[off].mean()
        mean_inv_bw = (1.0 / self.bandwidth_Bps[off]).mean()
        return mean_lat + np.asarray(nbytes, dtype=np.float64) * mean_inv_bw

    def mean_compute_time_s(self, graph: DataflowGraph) -> np.ndarray:
        """Per-op compute time averaged over devices (for b-levels on heterogeneous clusters)."""
        return self.compute_time_s(graph).mean(axis=1)

    def fastest_compute_time_s(self, graph: DataflowGraph) -> np.ndarray:
        return self.compute_time_s(graph).min(axis=1)


def homogeneous(
    name: str,
    num_devices: int,
    *,
    kind: str = "gpu",
    flops_per_s: float,
    bandwidth_Bps: float,
    latency_s: float = 0.0,
    memory_bytes: float = float("inf"),
    streams: int = 1,
    meta: dict[str, Any] | None = None,
) -> Cluster:
    """``num_devices`` identical devices, all pairs linked alike."""
    if num_devices < 1:
        raise ClusterError(f"a cluster needs at least one device, got {num_devices}")
    devices = [
        Device(f"{kind}{i}", kind=kind, flops_per_s=flops_per_s, memory_bytes=memory_bytes, streams=streams)
        for i in range(num_devices)
    ]
    bw = np.full((num_devices, num_devices), float(bandwidth_Bps))
    lat = np.full((num_devices, num_devices), float(latency_s))
    np.fill_diagonal(lat, 0.0)
    return Cluster(name=name, devices=devices, bandwidth_Bps=bw, latency_s=lat, meta=dict(meta or {}))


def unit(num_devices: int = 4) -> Cluster:
    """1 FLOP/s, 1 byte/s, zero latency: imported DOPPLER text graphs run in their own cost units."""
    return homogeneous(f"unit:{num_devices}", num_devices, flops_per_s=1.0, bandwidth_Bps=1.0, latency_s=0.0)
