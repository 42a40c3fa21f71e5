"""Devices and links: how long an op takes on a device, how long a transfer takes.

A :class:`Cluster` is a list of :class:`Device` plus two ``D x D`` matrices for the ordered device
pairs: ``bandwidth_Bps`` (bytes/s) and ``latency_s``. Moving ``b`` bytes from device ``i`` to ``j != i``
takes ``latency_s[i, j] + b / bandwidth_Bps[i, j]``; staying on a device is free (the diagonal is ignored).

An op's time on a device (:meth:`Cluster.compute_time_s`, the one owner every consumer asks) is
``overhead + work``, ``overhead`` the device's ``overhead_s_by_kind[kind]`` if given, else its
``overhead_s`` (a kernel launch and the engine's dispatch). ``work`` depends on the device:

* a **plain** device (``flops_per_s``; every cluster file of format version 1): ``flops / rate``, ``rate``
  its ``flops_per_s_by_kind[kind]`` if given, else ``flops_per_s``;
* a **measured** device (``flops_per_s`` and ``memory_bandwidth_Bps``, format version 2; what ``doppler
  calibrate`` writes for CPU workers): ``max(flops / rate, input_bytes / memory_bandwidth_Bps)``, the plain
  rate and a measured bandwidth, ``input_bytes`` the graph-input slices the op reads (weights, tables:
  :mod:`doppler.hardware.traffic`). For a kind in its ``weight_read_Bps_by_kind`` (the rate at which ops of that
  kind were measured reading their weights from memory, past the time their FLOPs take on operands in cache),
  ``max(flops / rate + input_bytes / weight rate, input_bytes / memory_bandwidth_Bps)``: the weights' read adds
  to the FLOPs' time. No op reads its weights faster than the device's memory delivers them; what an op of the
  run just wrote (activations) is costed by the rate alone, measured on operands in cache;
* a **roofline** device (``peak_flops_by_dtype`` and ``memory_bandwidth_Bps``, format version 2):
  ``max(flops / (peak x achieved_compute_fraction), bytes_moved / (memory_bandwidth_Bps x
  achieved_memory_fraction))`` with the op's bytes moved and number format from :mod:`doppler.hardware.traffic`.
  ``peak`` is, for a matrix kind (matmul, einsummable, unknown: tensor cores), the peak of the op's
  dtype (float32 ops take ``float32``, the non-tensor-core peak, unless the graph says ``tf32``); for a
  kind in :data:`VECTOR_KINDS` (elementwise maps, norms, softmax, reductions: CUDA cores, computing in
  float32 whatever the stored dtype, as PyTorch's ``opmath`` does) ``vector_flops_per_s`` (default: the
  float32 peak). A dtype without a peak runs at the float32 peak (:meth:`Cluster.dtype_fallbacks` names
  them; ``doppler graph info`` says so). A kind in ``flops_per_s_by_kind`` keeps the plain time (a
  rate given for a kind wins, with no bytes term).

A device with ``streams = s`` runs up to ``s`` ops at once, each at full speed (docs/design.md, Execution
semantics). A device with ``copies_inbound`` makes the copies of the transfers into it itself, queued with
its ops (a CPU worker has no copy engine; ``doppler calibrate`` sets it for CPU devices); otherwise
transfers run on their links, beside the ops.

JSON format (:meth:`Cluster.to_json`; :mod:`doppler.hardware.files` saves and loads it; docs/formats.md has
every field)::

    {"format_version": 2, "name": "mybox",
     "devices": [{"name": "gpu0", "kind": "gpu",
                  "peak_flops_by_dtype": {"float32": 6.7e13, "float16": 9.9e14},
                  "memory_bandwidth_Bps": 3.35e12, "achieved_compute_fraction": 0.8,
                  "achieved_memory_fraction": 0.8, "overhead_s": 5e-6, "memory_bytes": 8e10},
                 {"name": "cpu0", "kind": "cpu", "flops_per_s": 5e10, "flops_per_s_by_kind": {"add": 2e9},
                  "memory_bandwidth_Bps": 3e9, "weight_read_Bps_by_kind": {"matmul": 1.5e9},
                  "overhead_s_by_kind": {"add": 1e-5}, "streams": 1, "copies_inbound": true}],
     "default_link": {"bandwidth_Bps": 1.2e10, "latency_s": 1e-5},
     "links": [{"src": "gpu0", "dst": "cpu0", "bandwidth_Bps": 2.5e10, "latency_s": 8e-6}, ...],
     "meta": {...}}

A file without ``format_version`` is version 1: plain devices only, exactly the meaning it always had.
Links are *ordered* pairs (``src -> dst``), named by device name or index; every ordered pair of distinct
devices needs a link, listed or covered by ``default_link``. A missing or duplicate pair, a non-positive
bandwidth or peak, a fraction outside (0, 1], a negative latency or overhead, or an unknown field is an
error naming the file, the field and the device(s). Presets and :func:`~doppler.hardware.presets.cluster` (a
preset name or a cluster file) are in :mod:`doppler.hardware.presets`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from doppler.ir.graph import DataflowGraph, OpKind
from doppler.util.io import to_jsonable
from doppler.hardware.traffic import op_traffic

DEVICE_KINDS = ("cpu", "gpu")

#: the most devices a cluster may have (the link matrices hold D x D entries; the simulator's
#: per-device state grows with D x ops), documented in docs/cli.md
MAX_DEVICES = 1024
#: the most ops one device runs at once (its ``streams``; far past any GPU's or CPU's)
MAX_STREAMS = 4096

#: op-kind label -> OpKind code (per-kind rates are looked up for every op of every simulated graph)
_KIND_CODES = {k.label: k.value for k in OpKind}

#: the cluster-file format version :meth:`Cluster.to_json` writes (:mod:`doppler.hardware.files` reads 1 too)
FORMAT_VERSION = 2

#: the number formats a roofline device may give a peak for (``peak_flops_by_dtype``): dense (non-sparse)
#: datasheet peaks; ``float32`` is the non-tensor-core peak, ``tf32`` the tensor-core one for float32
#: inputs, ``float8`` covers e4m3 and e5m2, ``float64`` the non-tensor-core peak (matrix and vector ops alike);
#: ``float32`` is required (the fallback of every other dtype)
PEAK_DTYPES = ("float32", "tf32", "float16", "bfloat16", "float8", "float64")

#: op kinds that run on the vector units (CUDA cores), not on matrix units (tensor cores): elementwise
#: maps, norms, softmax, reductions, selections and the text format's data-movement optypes
VECTOR_KINDS = ("add", "elementwise", "softmax", "norm", "rotary", "mask_fill", "select", "reduce", "fill",
                "formation", "complexer", "squeezer")  # fmt: skip


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


def _peak_key(dtype: str, float32_matmul: str) -> str:
    """The ``peak_flops_by_dtype`` key a matrix op of number format ``dtype`` runs at (before any fallback)."""
    if dtype == "float32" and float32_matmul == "tf32":
        return "tf32"
    return "float8" if dtype.startswith("float8") else dtype


def _op_classes(graph: DataflowGraph, dtype: np.ndarray, dtype_names: tuple[str, ...]) -> tuple[np.ndarray, list]:
    """Ops alike for the roofline: per op, the index of its (kind label, dtype name) class, and the classes."""
    codes = graph.kind.astype(np.int64) * len(dtype_names) + dtype
    classes, inv = np.unique(codes, return_inverse=True)
    return inv, [(OpKind(int(c) // len(dtype_names)).label, dtype_names[int(c) % len(dtype_names)]) for c in classes]


@dataclass(frozen=True)
class Device:
    """One execution device: a GPU or a CPU worker, plain or roofline (see the module docstring)."""

    name: str
    kind: str = "gpu"  # "cpu" | "gpu"
    flops_per_s: float = 1.0  # a plain device's FLOP/s (a roofline device ignores it)
    flops_per_s_by_kind: dict[str, float] = field(default_factory=dict)  # OpKind label -> FLOP/s override
    memory_bytes: float = float("inf")
    streams: int = 1
    overhead_s: float = 0.0  # fixed seconds per op (kernel launch + dispatch)
    overhead_s_by_kind: dict[str, float] = field(default_factory=dict)  # OpKind label -> overhead override
    #: transfers into this device are copies its own worker makes, queued with its ops (a CPU worker,
    #: which has no copy engine); otherwise a transfer runs on its link, beside the device's ops
    copies_inbound: bool = False
    #: dense datasheet peak FLOP/s of the matrix units per number format (:data:`PEAK_DTYPES`); non-empty:
    #: a roofline device
    peak_flops_by_dtype: dict[str, float] = field(default_factory=dict)
    #: peak FLOP/s of the vector units, for :data:`VECTOR_KINDS` (None: the float32 peak)
    vector_flops_per_s: float | None = None
    #: memory bandwidth: a roofline device's datasheet figure, or a measured device's measured one
    memory_bandwidth_Bps: float | None = None
    achieved_compute_fraction: float = 1.0  # share of the peaks the device's kernels reach, in (0, 1]
    achieved_memory_fraction: float = 1.0  # share of the memory bandwidth they reach, in (0, 1]
    #: a measured device: OpKind label -> bytes/s at which ops of that kind read their weights (graph-input
    #: slices) from memory, a time added to their FLOPs' (module docstring; ``doppler calibrate`` measures it)
    weight_read_Bps_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def roofline(self) -> bool:
        """Whether op times here follow the roofline (``peak_flops_by_dtype`` given), not ``flops_per_s``."""
        return bool(self.peak_flops_by_dtype)

    @property
    def costs_bytes(self) -> bool:
        """Whether an op's bytes moved can bound its time here (a roofline or a measured device)."""
        return self.memory_bandwidth_Bps is not None

    @property
    def model(self) -> str:
        """``roofline``, ``measured`` or ``plain`` (module docstring)."""
        return "roofline" if self.roofline else "measured" if self.costs_bytes else "plain"

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
        self._validate_roofline(at)

    def _validate_roofline(self, at: str) -> None:
        """The roofline fields, each a finite number > 0, fractions in (0, 1]: peaks need a bandwidth; a bandwidth
        alone makes a measured device; the vector rate and the fractions need peaks."""
        peaks = self.peak_flops_by_dtype
        if not isinstance(peaks, dict):
            raise ClusterError(f"{at}: peak_flops_by_dtype must be an object mapping number formats to FLOP/s")
        for key, value in peaks.items():
            if key not in PEAK_DTYPES:
                raise ClusterError(f"{at}: peak_flops_by_dtype: unknown number format {key!r} (known: "
                                   f"{', '.join(PEAK_DTYPES)})")  # fmt: skip
            if not _finite_positive(value):
                raise ClusterError(f"{at}: peak_flops_by_dtype[{key!r}] must be a finite number > 0, got {value!r}")
        if peaks and "float32" not in peaks:
            raise ClusterError(f"{at}: peak_flops_by_dtype must give float32 (the peak of every number format "
                               "it does not list)")  # fmt: skip
        for label, value in (("vector_flops_per_s", self.vector_flops_per_s),
                             ("memory_bandwidth_Bps", self.memory_bandwidth_Bps)):  # fmt: skip
            if value is not None and not _finite_positive(value):
                raise ClusterError(f"{at}: {label} must be a finite number > 0, got {value!r}")
        for label in ("achieved_compute_fraction", "achieved_memory_fraction"):
            value = getattr(self, label)
            if not _finite_positive(value) or value > 1:
                raise ClusterError(f"{at}: {label} must be a number in (0, 1], got {value!r}")
        roofline_only = ["vector_flops_per_s"] if self.vector_flops_per_s is not None else []
        roofline_only += [label for label in ("achieved_compute_fraction", "achieved_memory_fraction")
                          if getattr(self, label) != 1.0]  # fmt: skip
        if peaks and self.memory_bandwidth_Bps is None:
            raise ClusterError(f"{at}: a roofline device (peak_flops_by_dtype) needs memory_bandwidth_Bps")
        if not peaks and roofline_only:
            raise ClusterError(f"{at}: {roofline_only[0]} needs peak_flops_by_dtype (a roofline device)")
        _check_by_kind(at, "weight_read_Bps_by_kind", self.weight_read_Bps_by_kind, "bytes/s", _finite_positive, "> 0")
        if self.weight_read_Bps_by_kind and (peaks or self.memory_bandwidth_Bps is None):
            raise ClusterError(f"{at}: weight_read_Bps_by_kind needs a measured device (flops_per_s and "
                               "memory_bandwidth_Bps, no peak_flops_by_dtype)")  # fmt: skip

    def rate(self, kind: int | str | OpKind) -> float:
        """FLOP/s of this plain device for ops of ``kind`` (a roofline device: :meth:`op_rate`)."""
        label = OpKind(kind).label if not isinstance(kind, str) else OpKind.parse(kind).label
        return float(self.flops_per_s_by_kind.get(label, self.flops_per_s))

    def op_rate(self, kind: str, dtype: str, float32_matmul: str = "float32") -> tuple[float, float, bool]:
        """``(FLOP/s, bytes/s, fell_back)`` an op of ``kind`` (label) computing in ``dtype`` achieves here:
        the bytes rate is ``inf`` where bytes cost nothing (a plain device, a kind in a roofline device's
        ``flops_per_s_by_kind``); ``fell_back``: the dtype has no peak here and runs at the float32 one."""
        overrides = {OpKind.parse(str(k)).label: v for k, v in self.flops_per_s_by_kind.items()}
        if not self.roofline:
            bytes_rate = math.inf if self.memory_bandwidth_Bps is None else float(self.memory_bandwidth_Bps)
            return float(overrides.get(kind, self.flops_per_s)), bytes_rate, False
        if kind in overrides:
            return float(overrides[kind]), math.inf, False
        bytes_rate = float(self.memory_bandwidth_Bps) * self.achieved_memory_fraction  # type: ignore[arg-type]
        if kind in VECTOR_KINDS:
            peak = self.vector_flops_per_s if self.vector_flops_per_s is not None else self.peak_flops_by_dtype["float32"]
            if dtype == "float64" and "float64" in self.peak_flops_by_dtype:  # computed in float64, not float32
                peak = min(peak, self.peak_flops_by_dtype["float64"])
            return float(peak) * self.achieved_compute_fraction, bytes_rate, False
        key = _peak_key(dtype, float32_matmul)
        peak = self.peak_flops_by_dtype.get(key)
        fell_back = peak is None
        if fell_back:
            peak = self.peak_flops_by_dtype["float32"]
        return float(peak) * self.achieved_compute_fraction, bytes_rate, fell_back

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "kind": self.kind}
        if self.roofline:
            out["peak_flops_by_dtype"] = {str(k): float(v) for k, v in self.peak_flops_by_dtype.items()}
            if self.vector_flops_per_s is not None:
                out["vector_flops_per_s"] = float(self.vector_flops_per_s)
            out["memory_bandwidth_Bps"] = float(self.memory_bandwidth_Bps)  # type: ignore[arg-type]
            out["achieved_compute_fraction"] = float(self.achieved_compute_fraction)
            out["achieved_memory_fraction"] = float(self.achieved_memory_fraction)
        else:
            out["flops_per_s"] = float(self.flops_per_s)
            if self.memory_bandwidth_Bps is not None:
                out["memory_bandwidth_Bps"] = float(self.memory_bandwidth_Bps)
            if self.weight_read_Bps_by_kind:
                out["weight_read_Bps_by_kind"] = {str(k): float(v) for k, v in self.weight_read_Bps_by_kind.items()}
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


@dataclass(frozen=True)
class OpTimes:
    """The terms of an op's time on a device, per (op, device): ``compute_s`` (FLOPs over the achieved
    FLOP/s), ``memory_s`` (bytes moved, on a measured device its weight bytes, over the achieved
    bandwidth; 0 where bytes cost nothing: a plain device, a kind with its own rate on a roofline device),
    ``overhead_s``; ``fallbacks``: ``(device, dtype)`` pairs run at the float32 peak for want of their own
    (:meth:`Cluster.dtype_fallbacks`); ``weights_s`` (None: 0): on a measured device, the weight bytes of an
    op of a kind in its ``weight_read_Bps_by_kind`` over that rate, added to ``compute_s``."""

    compute_s: np.ndarray
    memory_s: np.ndarray
    overhead_s: np.ndarray
    fallbacks: tuple[tuple[str, str], ...] = ()
    weights_s: np.ndarray | None = None

    @property
    def total_s(self) -> np.ndarray:
        """``overhead + max(compute + weights, memory)``: :meth:`Cluster.compute_time_s`."""
        if self.weights_s is None:
            return self.overhead_s + np.maximum(self.compute_s, self.memory_s)
        return self.overhead_s + np.maximum(self.compute_s + self.weights_s, self.memory_s)

    @property
    def memory_bound(self) -> np.ndarray:
        """Per (op, device): whether the bytes take longer than the FLOPs. bool[n, D]."""
        return self.memory_s > self.compute_s


@dataclass(frozen=True)
class RooflineRow:
    """The ops of one (kind, dtype) on one device model (:meth:`Cluster.roofline_rows`): ``device`` (the
    first of ``alike`` devices alike), ``model`` (:attr:`Device.model`), how many ``ops``, of which
    ``compute_bound`` (their FLOPs take longer than their bytes, or the device is plain) and
    ``memory_bound``; their FLOPs, bytes moved and seconds there (launch overheads included), and the
    effective rates: ``flop_rate`` = FLOPs / seconds, ``byte_rate`` = bytes / seconds."""

    device: str
    alike: int
    model: str
    kind: str
    dtype: str
    ops: int
    compute_bound: int
    memory_bound: int
    flops: float
    bytes_moved: float
    time_s: float
    flop_rate: float
    byte_rate: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
        """A plain device's FLOP/s per (OpKind code, device): float64[len(OpKind), D] (a roofline device's
        times depend on each op's bytes and dtype too: :meth:`op_times`)."""
        return self._per_kind_matrix("flops_per_s", "flops_per_s_by_kind")

    def overhead_matrix(self) -> np.ndarray:
        """Fixed seconds per op per (OpKind code, device): float64[len(OpKind), D]."""
        return self._per_kind_matrix("overhead_s", "overhead_s_by_kind")

    @property
    def roofline(self) -> bool:
        """Whether any device follows the roofline (module docstring)."""
        return any(d.roofline for d in self.devices)

    @property
    def costs_bytes(self) -> bool:
        """Whether an op's bytes moved can bound its time on any device (a roofline or a measured device)."""
        return any(d.costs_bytes for d in self.devices)

    def compute_time_s(self, graph: DataflowGraph) -> np.ndarray:
        """Seconds each op takes on each device: float64[num_ops, D] (the module docstring's rule)."""
        if self.costs_bytes:
            return self.op_times(graph).total_s
        kinds = graph.kind.astype(np.int64)
        with np.errstate(over="ignore"):  # inf: caught by check_times, which names the op
            t = graph.flops[:, None] / self.throughput_matrix()[kinds]
            if any(d.overhead_s or d.overhead_s_by_kind for d in self.devices):
                t = t + self.overhead_matrix()[kinds]
        return t

    def _first_alike(self) -> list[int]:
        """Per device, the index of the first device alike (every field but the name equal)."""
        seen: dict[str, int] = {}
        return [seen.setdefault(repr(replace(d, name="").to_json()), j) for j, d in enumerate(self.devices)]

    def op_times(self, graph: DataflowGraph) -> "OpTimes":
        """The terms of :meth:`compute_time_s` per (op, device) (:class:`OpTimes`), computed per class of
        ops alike (kind, dtype) and device model, then spread over the ops in bulk."""
        traffic = op_traffic(graph) if self.costs_bytes else None
        if traffic is None:
            inv, labels = _op_classes(graph, np.zeros(graph.num_ops, np.int64), ("float32",))
            mode, moved = "float32", np.zeros(graph.num_ops)
        else:
            inv, labels = _op_classes(graph, traffic.dtype, traffic.dtype_names)
            mode, moved = traffic.float32_matmul, traffic.bytes_moved
        rates = np.empty((len(labels), self.num_devices))
        byte_rates = np.empty((len(labels), self.num_devices))
        missing: dict[int, list[str]] = {}  # a first device alike -> the dtypes it has no peak for
        first = self._first_alike()
        for j, dev in enumerate(self.devices):
            if first[j] != j:  # a device like one before: the same column
                rates[:, j], byte_rates[:, j] = rates[:, first[j]], byte_rates[:, first[j]]
                continue
            missing[j] = []
            for u, (kind, dtype) in enumerate(labels):
                rates[u, j], byte_rates[u, j], fell_back = dev.op_rate(kind, dtype, mode)
                if fell_back and dtype not in missing[j]:
                    missing[j].append(dtype)
        fallbacks = tuple((dev.name, dtype) for dev, f in zip(self.devices, first) for dtype in missing[f])
        with np.errstate(over="ignore"):  # inf: caught by check_times, which names the op
            compute = graph.flops[:, None] / rates[inv]
            memory = moved[:, None] / byte_rates[inv]
            measured = [j for j, dev in enumerate(self.devices) if dev.model == "measured"]
            if measured and traffic is not None:  # a measured device: its weight bytes (module docstring)
                memory[:, measured] = traffic.input_bytes[:, None] / byte_rates[inv][:, measured]
            weights = self._weight_read_s(graph, traffic) if measured and traffic is not None else None
        return OpTimes(compute, memory, self.overhead_matrix()[graph.kind.astype(np.int64)], fallbacks, weights)

    def _weight_read_s(self, graph: DataflowGraph, traffic: Any) -> np.ndarray | None:
        """Per (op, device): the weight bytes over the device's ``weight_read_Bps_by_kind`` rate of the op's kind
        (0 for a kind without one); None when no device has any."""
        if not any(dev.weight_read_Bps_by_kind for dev in self.devices):
            return None
        per_byte = np.zeros((len(OpKind), self.num_devices))
        for j, dev in enumerate(self.devices):
            for label, rate in dev.weight_read_Bps_by_kind.items():
                per_byte[OpKind.parse(label).value, j] = 1.0 / float(rate)
        return traffic.input_bytes[:, None] * per_byte[graph.kind.astype(np.int64)]

    def dtype_fallbacks(self, graph: DataflowGraph) -> tuple[tuple[str, str], ...]:
        """``(device, dtype)`` for every number format of the graph's matrix ops that a roofline device
        has no peak for: those ops run at its float32 peak (module docstring)."""
        return self.op_times(graph).fallbacks if self.roofline else ()

    def roofline_rows(self, graph: DataflowGraph) -> list["RooflineRow"]:
        """Per device model (devices alike share one row set, named after the first) and per (op kind,
        dtype): how many ops are compute-bound and memory-bound there, and the rates they achieve
        (:class:`RooflineRow`), ordered by device, then by time spent."""
        times = self.op_times(graph)
        traffic = op_traffic(graph)
        inv, labels = _op_classes(graph, traffic.dtype, traffic.dtype_names)
        first = self._first_alike()
        rows: list[RooflineRow] = []
        for j in sorted(set(first)):
            dev = self.devices[j]
            per = [np.bincount(inv, weights=w, minlength=len(labels))
                   for w in (np.ones(graph.num_ops), times.memory_bound[:, j], graph.flops, traffic.bytes_moved,
                             times.total_s[:, j])]  # fmt: skip
            found = []
            for u, (kind, dtype) in enumerate(labels):
                ops, mem, flops, moved, seconds = (float(a[u]) for a in per)
                per_s = 1.0 / seconds if seconds > 0 else 0.0
                found.append(RooflineRow(dev.name, first.count(j), dev.model, kind, dtype,
                                         int(ops), int(ops - mem), int(mem), flops, moved, seconds, flops * per_s,
                                         moved * per_s))  # fmt: skip
            rows += sorted(found, key=lambda r: -r.time_s)
        return rows

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
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "devices": [d.to_json() for d in self.devices],
            "links": links,
            "meta": to_jsonable(self.meta),
        }

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
