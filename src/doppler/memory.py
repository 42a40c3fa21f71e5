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

from doppler.ir.graph import DataflowGraph
from doppler.ir.slices import InputSlices, input_slices


class Cluster(Protocol):
    """What the memory model reads of a :class:`doppler.hardware.cluster.Cluster`, named here without importing it
    (hardware sits above memory in the layers)."""

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
