"""The memory model, its one owner: what a placement holds on each device, and how much each may hold.

What a device holds (docs/cli.md, "Device memory"):

1. **Weights are resident.** A graph input that is not one of the forward's arguments
   (``graph.meta["user_inputs"]``): a parameter or a constant such as a weight, a rotary table or a
   mask. It is held on every device that runs at least one op reading it, for the whole run (weights
   stay loaded between runs, so they are not freed after their last reader). Only the slices the
   device's ops read are held, each distinct slice once per device; a slice read on two devices is
   held on both. A graph whose metadata names no user inputs (a file saved before they were recorded)
   counts every input as a weight.
2. **Activations live while they are needed.** Op outputs and received copies live as
   :meth:`doppler.sim.trace.Trace.memory_intervals` says; a slice of an activation input (a forward
   argument: token ids, ``x``) is live on a device from the start of the run until its last reader
   there ends.
3. **Peak** per device = resident bytes + the peak of the live activation bytes.
4. **Budget** per device = its ``memory_bytes`` x ``memory_fraction`` (default
   :data:`DEFAULT_MEMORY_FRACTION`: headroom for kernel workspace and the allocator, as accelerate's
   ``max_memory`` leaves). A device whose ``memory_bytes`` is null is unlimited.

Resident bytes are a per-device sum over the assignment (:func:`resident_bytes`), computed without
simulating; the simulator's trace adds exactly these numbers to its peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from doppler.ir.graph import DataflowGraph, GraphError, once_per_graph
from doppler.ir.kernels import DTYPE_BYTES


class Cluster(Protocol):
    """What the memory model reads of a :class:`doppler.hardware.cluster.Cluster`, named here without importing it
    (hardware costs ops through :mod:`doppler.hardware.traffic`, which reads :func:`input_slices`)."""

    devices: list[Any]

    @property
    def num_devices(self) -> int: ...

    @property
    def memory_bytes(self) -> np.ndarray: ...

#: share of each device's memory that placements may fill (``--memory-fraction``)
DEFAULT_MEMORY_FRACTION = 0.9
#: the help of ``--memory-fraction`` (``{default}``: the command's default)
MEMORY_FRACTION_HELP = ("Share of each device's memory_bytes that a placement may fill (the rest is left for kernel workspace "
                        "and the allocator); a device with no memory_bytes is unlimited (default: {default}).")


class MemoryBudgetError(ValueError):
    """A placement does not fit the devices' memory, or a bad memory option (exit 2 on the CLI)."""


@dataclass(frozen=True)
class InputSlices:
    """The distinct slices of graph inputs that the ops read: ``nbytes[s]`` and ``weight[s]`` (False: a
    slice of an activation input) per slice ``s``, its input's name, and per op ``v`` the slices it reads,
    ``slice_idx[op_ptr[v]:op_ptr[v + 1]]`` (CSR)."""

    names: list[str]
    nbytes: np.ndarray  # float64[S]
    weight: np.ndarray  # bool[S]
    op_ptr: np.ndarray  # int64[n + 1]
    slice_idx: np.ndarray  # int64[nnz]

    @property
    def num_slices(self) -> int:
        return int(self.nbytes.shape[0])

    def op_slices(self) -> tuple[np.ndarray, np.ndarray]:
        """(op, slice) of every read, as two aligned arrays."""
        ops = np.repeat(np.arange(self.op_ptr.shape[0] - 1, dtype=np.int64), np.diff(self.op_ptr))
        return ops, self.slice_idx


def input_slices(graph: DataflowGraph) -> InputSlices:
    """The graph-input slices its op specs read (:class:`InputSlices`), found once per graph. A graph
    without specs reads none."""
    return _input_slices_once(graph)


def _find_input_slices(graph: DataflowGraph) -> InputSlices:
    meta = graph.meta if isinstance(graph.meta, dict) else {}
    shapes = meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {}
    users = meta.get("user_inputs") or ()
    if not isinstance(users, (list, tuple)) or not all(isinstance(u, str) for u in users):
        raise GraphError(f"graph {graph.name!r}: meta.user_inputs must be a list of input names, got {users!r:.60}")
    itemsize = DTYPE_BYTES.get(str(meta.get("dtype", "float32")), 4)  # (the graph's dtype; float32 if none)
    index: dict[tuple, int] = {}
    names: list[str] = []
    nbytes: list[float] = []
    ptr = np.zeros(graph.num_ops + 1, dtype=np.int64)
    idx: list[int] = []
    for v, spec in enumerate(graph.specs or ()):
        refs = spec.get("inputs", ()) if isinstance(spec, dict) else ()
        first = len(idx)
        for ref in refs if isinstance(refs, (list, tuple)) else ():
            name = ref.get("input") if isinstance(ref, dict) else None
            if name is None:
                continue
            key = _plain_slice_key(name, ref.get("slice"))  # (a well-formed slice, without the checks' calls)
            if key is None:
                key, extent = _slice_of(graph, v, ref, shapes)
            else:
                extent = [hi - lo for lo, hi in key[1]]
            s = index.get(key)
            if s is None and key[1] and name in shapes:
                _check_inside(graph, v, key, shapes[name])
            if s is None:
                s = index[key] = len(names)
                names.append(str(name))
                nbytes.append(math.prod(float(e) for e in extent) * itemsize)
            if s not in idx[first:]:  # (an op reads a few slices: a scan beats a set)
                idx.append(s)
        ptr[v + 1] = len(idx)
    users = set(users)
    return InputSlices(names, np.asarray(nbytes, dtype=np.float64), np.array([n not in users for n in names], bool),
                       ptr, np.asarray(idx, dtype=np.int64))  # fmt: skip


def _check_inside(graph: DataflowGraph, v: int, key: tuple, shape: object) -> None:
    """GraphError naming op ``v`` unless the slice ``key`` (input, bounds) lies inside the input's declared
    ``shape`` (``meta.inputs``): as many dimensions, each bound at most its size."""
    name, bounds = key
    if not isinstance(shape, (list, tuple)) or len(shape) != len(bounds) or any(
            not isinstance(d, int) or hi > d for (_, hi), d in zip(bounds, shape)):  # fmt: skip
        raise GraphError(f"op {graph.op_label(v)}: its slice {[list(b) for b in bounds]!s:.80} of input {name!r:.60} "
                         f"does not lie inside the input's shape {shape!s:.60} (meta.inputs)")  # fmt: skip


_input_slices_once = once_per_graph(_find_input_slices)


def _plain_slice_key(name: object, bounds: object) -> tuple | None:
    """The key :func:`_slice_of` gives a reference to input ``name`` with slice ``bounds``, where ``name`` is a
    string and ``bounds`` a list of ``[lo, hi]`` pairs of plain ints, else None (then :func:`_slice_of` decides)."""
    if type(name) is not str or type(bounds) is not list:
        return None
    try:
        key = tuple([(lo, hi) for lo, hi in bounds])
    except (TypeError, ValueError):
        return None
    for lo, hi in key:
        if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi:
            return None
    return name, key


def _slice_of(graph: DataflowGraph, v: int, ref: dict, shapes: dict) -> tuple[tuple, list]:
    """The key ``(input, bounds)`` and the extent of the input slice an operand reference reads: its
    ``slice`` (``[[lo, hi], ...]``), else the whole input (its ``meta.inputs`` shape, else the ref's
    ``shape``). GraphError naming the op where the reference is malformed."""
    name = ref["input"]
    if not isinstance(name, str):
        raise GraphError(f"op {graph.op_label(v)}: an operand's input {name!r:.60} is not an input name (a string)")

    def whole_numbers(x: object) -> bool:
        return isinstance(x, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                    for i in x)  # fmt: skip

    bounds = ref.get("slice")
    if bounds is not None:
        if not (isinstance(bounds, (list, tuple)) and all(whole_numbers(b) and len(b) == 2 and b[0] <= b[1]
                                                          for b in bounds)):  # fmt: skip
            raise GraphError(f"op {graph.op_label(v)}: input {name!r}: slice {bounds!r:.60} is not a list of "
                             "[lo, hi] pairs (0 <= lo <= hi)")  # fmt: skip
        return (name, tuple((int(lo), int(hi)) for lo, hi in bounds)), [hi - lo for lo, hi in bounds]
    shape = shapes.get(name, ref.get("shape"))
    if not whole_numbers(shape):
        raise GraphError(f"op {graph.op_label(v)}: input {name!r:.60} has no slice and no known shape")
    return (name, ()), list(shape)


def resident_bytes(graph: DataflowGraph, devices: np.ndarray, num_devices: int,
                   slices: InputSlices | None = None) -> np.ndarray:  # fmt: skip
    """Per device, the weight bytes an assignment holds for the whole run: each distinct weight slice that
    one of the device's ops reads, once (rule 1 of the module docstring). No simulation."""
    slices = slices if slices is not None else input_slices(graph)
    ops, s = slices.op_slices()
    keep = slices.weight[s]
    key = np.unique(s[keep] * num_devices + np.asarray(devices, dtype=np.int64)[ops[keep]])  # (slice, device) pairs
    held = np.bincount(key % num_devices, weights=slices.nbytes[key // num_devices], minlength=num_devices)
    return held.astype(np.float64)


def activation_input_intervals(graph: DataflowGraph, devices: np.ndarray, op_end: np.ndarray, num_devices: int,
                               slices: InputSlices | None = None) -> tuple[np.ndarray, ...]:  # fmt: skip
    """(device, alloc_s, free_s, bytes) of every activation-input slice a device holds: from 0 until the end
    of its last reader there (rule 2)."""
    slices = slices if slices is not None else input_slices(graph)
    ops, s = slices.op_slices()
    keep = ~slices.weight[s]
    nd = int(num_devices)
    key = s[keep] * nd + np.asarray(devices, dtype=np.int64)[ops[keep]]
    uniq, inv = np.unique(key, return_inverse=True)
    free = np.zeros(uniq.shape[0])
    np.maximum.at(free, inv, np.asarray(op_end, dtype=np.float64)[ops[keep]])
    return uniq % nd, np.zeros(uniq.shape[0]), free, slices.nbytes[uniq // nd]


def weight_bytes(graph: DataflowGraph, slices: InputSlices | None = None) -> float:
    """The bytes of every weight slice the graph reads, each once: what one device holding all ops holds."""
    slices = slices if slices is not None else input_slices(graph)
    return float(slices.nbytes[slices.weight].sum())


def check_fraction(memory_fraction: float) -> float:
    """``memory_fraction`` as a float in (0, 1], else :class:`MemoryBudgetError`."""
    try:
        f = float(memory_fraction)
    except (TypeError, ValueError):
        raise MemoryBudgetError(f"--memory-fraction must be a number in (0, 1], got {memory_fraction!r}") from None
    if isinstance(memory_fraction, bool) or not 0 < f <= 1:
        raise MemoryBudgetError(f"--memory-fraction must be a number in (0, 1], got {memory_fraction!r}")
    return f


def budget_bytes(cluster: "Cluster", memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> np.ndarray:
    """Per device, the bytes a placement may hold: ``memory_bytes x memory_fraction`` (inf: unlimited)."""
    return cluster.memory_bytes * check_fraction(memory_fraction)


def always_fits(graph: DataflowGraph, budget: np.ndarray, slices: InputSlices | None = None) -> bool:
    """Whether every assignment fits: all weights, every op output and every activation input held at
    once (more than any device can hold in any run) stay within the smallest budget."""
    slices = slices if slices is not None else input_slices(graph)
    most = slices.nbytes.sum() + float(np.sum(graph.output_bytes))
    return bool(most <= float(np.min(budget))) if len(budget) else True


@dataclass
class MemoryCheck:
    """A placement's memory against the budget, per device: ``resident_bytes``, ``peak_memory_bytes`` (the
    resident bytes included), ``memory_budget_bytes`` (inf: unlimited) and whether every device fits."""

    resident_bytes: np.ndarray
    peak_memory_bytes: np.ndarray
    memory_budget_bytes: np.ndarray
    device_names: list[str]

    @property
    def feasible(self) -> bool:
        return bool(np.all(self.peak_memory_bytes <= self.memory_budget_bytes))

    def over(self) -> np.ndarray:
        """The devices whose peak is over their budget (:func:`doppler.report.memory_overruns` words them)."""
        return np.flatnonzero(self.peak_memory_bytes > self.memory_budget_bytes)

    def to_json(self) -> dict[str, object]:
        inf_to_none = lambda a: [None if math.isinf(x) else float(x) for x in a]  # noqa: E731
        return {"resident_bytes": self.resident_bytes.tolist(), "peak_memory_bytes": self.peak_memory_bytes.tolist(),
                "memory_budget_bytes": inf_to_none(self.memory_budget_bytes), "feasible": self.feasible}  # fmt: skip


def check(graph: DataflowGraph, cluster: "Cluster", resident: np.ndarray, peak: np.ndarray,
          memory_fraction: float | None = DEFAULT_MEMORY_FRACTION) -> MemoryCheck:  # fmt: skip
    """A traced run's ``resident`` and ``peak`` bytes per device against the budget (``memory_fraction``
    None: unlimited, as ``--ignore-memory``)."""
    budget = np.full(cluster.num_devices, np.inf) if memory_fraction is None else budget_bytes(cluster, memory_fraction)
    return against(cluster, resident, peak, budget)


def against(cluster: "Cluster", resident: np.ndarray, peak: np.ndarray, budget: np.ndarray) -> MemoryCheck:
    """A traced run's ``resident`` and ``peak`` bytes per device against a per-device ``budget``."""
    return MemoryCheck(np.asarray(resident, float), np.asarray(peak, float), np.asarray(budget, float),
                       [d.name for d in cluster.devices])  # fmt: skip


@dataclass(frozen=True)
class Shortfall:
    """Why no placement can fit, found before any method runs: the weights alone need ``need_bytes`` where
    all budgets together offer ``offer_bytes`` (``op`` -1), or op ``op`` alone (its weight and input slices
    and its output) needs more than the largest budget."""

    need_bytes: float
    offer_bytes: float
    op: int = -1


def shortfall(graph: DataflowGraph, budget: np.ndarray, slices: InputSlices | None = None) -> Shortfall | None:
    """A :class:`Shortfall` that no method can place around, or None."""
    slices = slices if slices is not None else input_slices(graph)
    total = float(np.sum(budget))
    if weight_bytes(graph, slices) > total:
        return Shortfall(weight_bytes(graph, slices), total)
    ops, s = slices.op_slices()
    own = np.bincount(ops, weights=slices.nbytes[s], minlength=graph.num_ops) + graph.output_bytes
    v = int(np.argmax(own)) if graph.num_ops else -1
    if v >= 0 and own[v] > float(np.max(budget)):
        return Shortfall(float(own[v]), float(np.max(budget)), v)
    return None
