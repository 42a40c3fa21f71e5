"""Devices and links: how long an op takes on a device, how long a transfer takes.

A :class:`Cluster` is a list of :class:`Device` plus two ``D x D`` matrices for
the ordered device pairs: ``bandwidth_Bps`` (bytes/s) and ``latency_s``. Moving
``b`` bytes from device ``i`` to ``j != i`` takes ``latency_s[i, j] + b /
bandwidth_Bps[i, j]``; staying on a device is free (the diagonal is ignored).
An op of kind ``k`` with ``f`` FLOPs takes ``overhead + f / rate`` seconds on a
device, where ``rate`` is the device's ``flops_per_s_by_kind[k]`` if given, else
its ``flops_per_s``, and ``overhead`` its ``overhead_s_by_kind[k]`` if given, else
its ``overhead_s`` (0 by default: the presets model GPUs at full speed;
``doppler calibrate`` fits both for a real engine, where a kernel launch and the
engine's dispatch cost a fixed time per op). A device with ``streams = s`` runs up to ``s`` ops at once, each
at full speed (docs/design.md, Execution semantics). A device with ``copies_inbound`` makes the copies of
the transfers into it itself, queued with its ops (a CPU worker has no copy
engine; ``doppler calibrate`` sets it for CPU devices); otherwise transfers run
on their links, beside the ops.

JSON format (``Cluster.to_json``)::

    {"name": "mybox",
     "devices": [{"name": "gpu0", "kind": "gpu", "flops_per_s": 1e13,
                  "flops_per_s_by_kind": {"add": 9e10},   # optional
                  "overhead_s": 2e-5, "overhead_s_by_kind": {"add": 1e-5},  # optional
                  "memory_bytes": 1.6e10,                  # optional, null = unlimited
                  "streams": 1,                            # optional, default 1
                  "copies_inbound": true}, ...],           # optional, default false (see above)
     "default_link": {"bandwidth_Bps": 1.2e10, "latency_s": 1e-5},  # optional
     "links": [{"src": "gpu0", "dst": "gpu1", "bandwidth_Bps": 2.5e10, "latency_s": 8e-6}, ...],
     "meta": {...}}                                        # optional, free-form

Links are *ordered* pairs (``src -> dst``), named by device name or index. Every
ordered pair of distinct devices needs a link, either listed or covered by
``default_link``; a missing pair, a duplicate pair, a non-positive bandwidth,
a negative latency or an unknown field is an error naming the file, the field
and the device(s).

Presets (``p100x4``, ``v100x8``, ...) and :func:`~doppler.presets.cluster`, which resolves a preset
name or a cluster file, are in :mod:`doppler.presets`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from doppler.graph import DataflowGraph, OpKind
from doppler.io_util import to_jsonable, write_json

DEVICE_KINDS = ("cpu", "gpu")

#: the most devices a cluster may have (the link matrices hold D x D entries; the simulator's
#: per-device state grows with D x ops), documented in docs/cli.md
MAX_DEVICES = 1024
#: the most ops one device runs at once (its ``streams``; far past any GPU's or CPU's)
MAX_STREAMS = 4096

#: op-kind label -> OpKind code (per-kind rates are looked up for every op of every simulated graph)
_KIND_CODES = {k.label: k.value for k in OpKind}


class ClusterError(ValueError):
    """A cluster description is invalid; the message names the file, field or device."""


#: every sum of op or transfer times on a cluster must stay below this (see Cluster.check_times)
MAX_TOTAL_TIME = 1e250


def _finite_positive(x: float) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _finite_nonneg(x: float) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _check_by_kind(at: str, field_name: str, values: Any, unit: str, ok: Callable[[Any], bool], bound: str) -> None:
    """A per-kind override map: known op kinds only, each value passing ``ok``."""
    if not isinstance(values, dict):
        raise ClusterError(f"{at}: {field_name} must be an object mapping op kinds to {unit}")
    for label, value in values.items():
        try:
            OpKind.parse(str(label))
        except ValueError as e:
            raise ClusterError(f"{at}: {field_name}: {e}") from None
        if not ok(value):
            raise ClusterError(f"{at}: {field_name}[{label!r}] must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True)
class Device:
    """One execution device: a GPU or a CPU worker."""

    name: str
    kind: str = "gpu"  # "cpu" | "gpu"
    flops_per_s: float = 1.0
    flops_per_s_by_kind: dict[str, float] = field(default_factory=dict)  # OpKind label -> FLOP/s override
    memory_bytes: float = float("inf")
    streams: int = 1
    overhead_s: float = 0.0  # fixed seconds per op (kernel launch + dispatch)
    overhead_s_by_kind: dict[str, float] = field(default_factory=dict)  # OpKind label -> overhead override
    #: transfers into this device are copies its own worker makes, queued with its ops (a CPU worker,
    #: which has no copy engine); otherwise a transfer runs on its link, beside the device's ops
    copies_inbound: bool = False

    def validate(self, where: str = "") -> None:
        """Raise ClusterError unless every field is sensible."""
        at = f"{where}device {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ClusterError(f"{where}a device has an empty or non-string name {self.name!r}")
        if self.kind not in DEVICE_KINDS:
            raise ClusterError(f"{at}: kind must be one of {', '.join(DEVICE_KINDS)}, got {self.kind!r}")
        if not _finite_positive(self.flops_per_s):
            raise ClusterError(f"{at}: flops_per_s must be a finite number > 0, got {self.flops_per_s!r}")
        _check_by_kind(at, "flops_per_s_by_kind", self.flops_per_s_by_kind, "FLOP/s", _finite_positive, "> 0")
        if not _finite_nonneg(self.overhead_s):
            raise ClusterError(f"{at}: overhead_s must be a finite number >= 0, got {self.overhead_s!r}")
        _check_by_kind(at, "overhead_s_by_kind", self.overhead_s_by_kind, "seconds", _finite_nonneg, ">= 0")
        mem = self.memory_bytes
        if isinstance(mem, bool) or not isinstance(mem, (int, float, np.floating, np.integer)) or not (mem > 0):
            raise ClusterError(f"{at}: memory_bytes must be > 0 (or null for unlimited), got {mem!r}")
        if (isinstance(self.streams, bool) or not isinstance(self.streams, (int, np.integer))
                or not 1 <= self.streams <= MAX_STREAMS):  # fmt: skip
            raise ClusterError(f"{at}: streams must be an integer from 1 to {MAX_STREAMS}, got {self.streams!r}")
        if not isinstance(self.copies_inbound, (bool, np.bool_)):
            raise ClusterError(f"{at}: copies_inbound must be true or false, got {self.copies_inbound!r}")

    def rate(self, kind: int | str | OpKind) -> float:
        """FLOP/s of this device for ops of ``kind``."""
        label = OpKind(kind).label if not isinstance(kind, str) else OpKind.parse(kind).label
        return float(self.flops_per_s_by_kind.get(label, self.flops_per_s))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind, "flops_per_s": float(self.flops_per_s)}
        if self.flops_per_s_by_kind:
            out["flops_per_s_by_kind"] = {str(k): float(v) for k, v in self.flops_per_s_by_kind.items()}
        if self.overhead_s:
            out["overhead_s"] = float(self.overhead_s)
        if self.overhead_s_by_kind:
            out["overhead_s_by_kind"] = {str(k): float(v) for k, v in self.overhead_s_by_kind.items()}
        out["memory_bytes"] = None if math.isinf(self.memory_bytes) else float(self.memory_bytes)
        out["streams"] = int(self.streams)
        if self.copies_inbound:
            out["copies_inbound"] = True
        return out




@dataclass(eq=False)
class Cluster:
    """A set of devices and the links between every ordered pair.

    Treat a Cluster as immutable once built: a simulator context holds arrays
    derived from it. Use :meth:`scaled_links` or :func:`dataclasses.replace`
    to derive a variant.
    """

    name: str
    devices: list[Device]
    bandwidth_Bps: np.ndarray  # float64[D, D]
    latency_s: np.ndarray  # float64[D, D]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ClusterError(f"a cluster's name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.devices, (list, tuple)):
            raise ClusterError(f"cluster {self.name!r}: devices must be a list of Device, got {type(self.devices).__name__}")
        if not isinstance(self.meta, dict):
            raise ClusterError(f"cluster {self.name!r}: meta must be a dict, got {type(self.meta).__name__}")
        self.devices = list(self.devices)
        for label in ("bandwidth_Bps", "latency_s"):
            try:
                setattr(self, label, np.array(getattr(self, label), dtype=np.float64))
            except (ValueError, TypeError):
                raise ClusterError(f"cluster {self.name!r}: {label} must be a matrix of numbers (one row per device, "
                                   "all rows as long)") from None  # fmt: skip
        self.validate()

    # ------------------------------------------------------------ validation
    def validate(self, where: str = "") -> None:
        """Raise ClusterError (prefixed by ``where``) unless the cluster is well formed."""
        d = len(self.devices)
        if d < 1:
            raise ClusterError(f"{where}cluster {self.name!r} has no devices")
        if d > MAX_DEVICES:
            raise ClusterError(f"{where}cluster {self.name!r} has {d} devices; at most {MAX_DEVICES} are supported")
        seen: dict[str, int] = {}
        for i, dev in enumerate(self.devices):
            if not isinstance(dev, Device):
                raise ClusterError(f"{where}devices[{i}] is not a Device")
            dev.validate(where)
            if dev.name in seen:
                raise ClusterError(f"{where}devices {seen[dev.name]} and {i} have the same name {dev.name!r}")
            seen[dev.name] = i
        for label, mat in (("bandwidth_Bps", self.bandwidth_Bps), ("latency_s", self.latency_s)):
            if mat.shape != (d, d):
                raise ClusterError(f"{where}{label} must be a {d}x{d} matrix (one entry per ordered device pair), got shape {mat.shape}")
        off = ~np.eye(d, dtype=bool)
        for label, mat, ok, bound in (("bandwidth_Bps", self.bandwidth_Bps, self.bandwidth_Bps > 0, "> 0"),
                                      ("latency_s", self.latency_s, self.latency_s >= 0, ">= 0")):  # fmt: skip
            bad = off & ~(np.isfinite(mat) & ok)
            if bad.any():
                i, j = (int(x) for x in np.argwhere(bad)[0])
                raise ClusterError(f"{where}link {self.devices[i].name} -> {self.devices[j].name}: {label} must be a "
                                   f"finite number {bound}, got {mat[i, j]!r}")  # fmt: skip
        # the diagonal means nothing (same device is free); keep it canonical
        np.fill_diagonal(self.latency_s, 0.0)
        np.fill_diagonal(self.bandwidth_Bps, np.inf)

    # ------------------------------------------------------------- accessors
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def streams(self) -> np.ndarray:
        return np.array([d.streams for d in self.devices], dtype=np.int64)

    @property
    def copies_inbound(self) -> np.ndarray:
        """Per device: are transfers into it copies made by the device itself (see :class:`Device`)? bool[D]."""
        return np.array([bool(d.copies_inbound) for d in self.devices], dtype=np.bool_)

    @property
    def memory_bytes(self) -> np.ndarray:
        """Each device's memory (``inf`` where unlimited): float64[D]."""
        return np.array([d.memory_bytes for d in self.devices], dtype=np.float64)

    @property
    def unit_cost(self) -> bool:
        """True for clusters whose times are abstract cost units, not seconds (the ``unit``
        preset, or ``"meta": {"time_unit": "unit"}`` in a cluster file): output says "units"."""
        return self.meta.get("preset") == "unit" or self.meta.get("time_unit") == "unit"

    def device_index(self, name_or_index: str | int) -> int:
        """Index of a device given its name or index; ClusterError if unknown."""
        if isinstance(name_or_index, (int, np.integer)) and not isinstance(name_or_index, bool):
            if 0 <= int(name_or_index) < self.num_devices:
                return int(name_or_index)
        else:
            for i, dev in enumerate(self.devices):
                if dev.name == name_or_index:
                    return i
        names = ", ".join(d.name for d in self.devices)
        raise ClusterError(f"cluster {self.name!r} has no device {name_or_index!r} (devices: {names})")

    def _per_kind_matrix(self, default: str, by_kind: str) -> np.ndarray:
        """A device field per (OpKind code, device), with its per-kind overrides: float64[len(OpKind), D]."""
        out = np.empty((len(OpKind), self.num_devices))
        for j, dev in enumerate(self.devices):
            out[:, j] = getattr(dev, default)
            for label, value in getattr(dev, by_kind).items():
                code = _KIND_CODES.get(label)
                out[OpKind.parse(label).value if code is None else code, j] = value
        return out

    def throughput_matrix(self) -> np.ndarray:
        """FLOP/s per (OpKind code, device): float64[len(OpKind), D]."""
        return self._per_kind_matrix("flops_per_s", "flops_per_s_by_kind")

    def overhead_matrix(self) -> np.ndarray:
        """Fixed seconds per op per (OpKind code, device): float64[len(OpKind), D]."""
        return self._per_kind_matrix("overhead_s", "overhead_s_by_kind")

    def compute_time_s(self, graph: DataflowGraph) -> np.ndarray:
        """Seconds each op takes on each device: float64[num_ops, D]."""
        kinds = graph.kind.astype(np.int64)
        with np.errstate(over="ignore"):  # inf: caught by check_times, which names the op
            t = graph.flops[:, None] / self.throughput_matrix()[kinds]
            if any(d.overhead_s or d.overhead_s_by_kind for d in self.devices):
                t = t + self.overhead_matrix()[kinds]
        return t

    def check_times(self, graph: DataflowGraph, compute_s: np.ndarray) -> None:
        """ClusterError unless every sum of op and transfer times of ``graph`` here stays finite
        (below ``MAX_TOTAL_TIME``): tiny FLOP/s or bandwidths can overflow costs that are fine alone.
        ``compute_s`` is :meth:`compute_time_s` of the graph (the simulator's context has it)."""
        t = compute_s
        off = ~np.eye(self.num_devices, dtype=bool)
        slowest_link_s_per_byte = float((1.0 / self.bandwidth_Bps[off]).max()) if off.any() else 0.0
        latency = float(self.latency_s[off].max()) if off.any() else 0.0
        with np.errstate(over="ignore", invalid="ignore"):
            per_op = [("compute", t.max(axis=1)), ("transfer", latency + graph.output_bytes * slowest_link_s_per_byte)]
            for what, times in per_op:
                running = np.cumsum(times)
                bad = np.flatnonzero(~(np.isfinite(running) & (running <= MAX_TOTAL_TIME)))
                if bad.size:
                    v = int(bad[0])
                    raise ClusterError(
                        f"cluster {self.name!r}: the graph's {what} times overflow when added up (at op "
                        f"{graph.op_name(v)}, which alone takes {times[v]:.3g} s; sums must stay below "
                        f"{MAX_TOTAL_TIME:g} s): check the cluster's flops_per_s, bandwidths and latencies"
                    )

    def transfer_time_s(self, nbytes: np.ndarray | float) -> np.ndarray:
        """Seconds to move ``nbytes`` between every ordered device pair: shape (..., D, D), zero diagonal."""
        b = np.asarray(nbytes, dtype=np.float64)[..., None, None]
        with np.errstate(invalid="ignore"):
            t = self.latency_s + b / self.bandwidth_Bps
        eye = np.eye(self.num_devices, dtype=bool)
        return np.where(eye, 0.0, t)

    def is_homogeneous(self) -> bool:
        """All devices alike and all links alike."""
        d0 = self.devices[0]
        same_dev = all(replace(dv, name=d0.name) == d0 for dv in self.devices)  # every field but the name
        if self.num_devices == 1:
            return same_dev
        off = ~np.eye(self.num_devices, dtype=bool)
        return bool(same_dev and np.ptp(self.bandwidth_Bps[off]) == 0 and np.ptp(self.latency_s[off]) == 0)

    # --------------------------------------------------------------- variants
    def scaled_links(self, factor: float) -> "Cluster":
        """A copy whose every link is ``factor`` times slower (bandwidth / factor, latency * factor)."""
        if not _finite_positive(factor):
            raise ClusterError(f"scaled_links: factor must be a finite number > 0, got {factor!r}")
        meta = dict(self.meta)
        meta["link_scale"] = float(meta.get("link_scale", 1.0)) * float(factor)
        name = f"{self.name}*links/{factor:g}" if factor != 1 else self.name
        return replace(self, name=name, bandwidth_Bps=self.bandwidth_Bps / factor, latency_s=self.latency_s * factor,
                       meta=meta)  # fmt: skip

    def with_streams(self, streams: int) -> "Cluster":
        """A copy where every device runs ``streams`` ops at once."""
        devices = [replace(d, streams=streams) for d in self.devices]
        return replace(self, name=f"{self.name}+streams{streams}", devices=devices, meta=dict(self.meta))

    # ---------------------------------------------------------------- JSON
    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (see the module docstring for the format)."""
        links = []
        for i, a in enumerate(self.devices):
            for j, b in enumerate(self.devices):
                if i != j:
                    links.append(
                        {
                            "src": a.name,
                            "dst": b.name,
                            "bandwidth_Bps": float(self.bandwidth_Bps[i, j]),
                            "latency_s": float(self.latency_s[i, j]),
                        }
                    )
        return {
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
            "links": links,
            "meta": to_jsonable(self.meta),
        }

    def save(self, path: str | Path) -> None:
        """Write the cluster as JSON, atomically."""
        write_json(path, self.to_json(), indent=1)

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, devices={self.num_devices})"


# --------------------------------------------------------------------------- builders
def homogeneous(
    name: str,
    num_devices: int,
    *,
    kind: str = "gpu",
    flops_per_s: float,
    flops_per_s_by_kind: dict[str, float] | None = None,
    bandwidth_Bps: float,
    latency_s: float = 0.0,
    memory_bytes: float = float("inf"),
    streams: int = 1,
    meta: dict[str, Any] | None = None,
) -> Cluster:
    """``num_devices`` identical devices, all pairs linked alike."""
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) or num_devices < 1:
        raise ClusterError(f"a cluster needs at least one device, got {num_devices!r}")
    devices = [
        Device(
            f"{kind}{i}",
            kind=kind,
            flops_per_s=flops_per_s,
            flops_per_s_by_kind=dict(flops_per_s_by_kind or {}),
            memory_bytes=memory_bytes,
            streams=streams,
        )
        for i in range(num_devices)
    ]
    bw = np.full((num_devices, num_devices), bandwidth_Bps, dtype=object)  # (Cluster checks they are numbers)
    lat = np.full((num_devices, num_devices), latency_s, dtype=object)
    return Cluster(name=name, devices=devices, bandwidth_Bps=bw, latency_s=lat, meta=dict(meta or {}))
