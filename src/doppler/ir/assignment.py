"""An assignment of ops to devices: the output of every method, the input of the
simulator and the engine, and its file format.

File format: ``{"assignment": [device index per op, in op-id order], "method":
"...", "graph_fingerprint": "..."}``; a bare JSON list is accepted on input.
:func:`save_assignment` writes one, :func:`load_assignment` reads one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.util.io import read_json, write_json


class AssignmentError(ValueError):
    """An assignment does not fit its graph or cluster; the message names the op or device."""


@dataclass
class Assignment:
    """Device index per op, plus where it came from."""

    devices: np.ndarray  # int64[num_ops]
    method: str = "manual"
    assign_time_s: float = 0.0
    estimated_makespan_s: float | None = None
    graph_fingerprint: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    #: ``(graph, cluster, result)``: the method's own traced WC simulation of ``devices`` (default options;
    #: ``result`` a ``doppler.sim.SimResult``), where it ran one; a caller that reports the schedule
    #: on the same graph and cluster need not simulate it again (``doppler.sim.traced``; not saved)
    simulation: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.devices = _device_array(self.devices)

    def __len__(self) -> int:
        return int(self.devices.shape[0])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "assignment": [int(d) for d in self.devices],
            "method": self.method,
            "graph_fingerprint": self.graph_fingerprint,
            "assign_time_s": self.assign_time_s,
        }
        if self.estimated_makespan_s is not None:
            out["estimated_makespan_s"] = self.estimated_makespan_s
        return out


def as_devices(assignment: "Assignment | Sequence[int] | np.ndarray") -> np.ndarray:
    """The device array of an Assignment or of any sequence of device indices."""
    if isinstance(assignment, Assignment):
        return assignment.devices
    return _device_array(assignment)


def _device_array(values: Any) -> np.ndarray:
    """``values`` as a 1-D int64 array of device indices, or an :class:`AssignmentError` saying why not
    (not 1-D, not whole numbers, not numbers): nothing is truncated or wrapped by the cast."""
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError):
        raise AssignmentError("an assignment must be a list of device indices (integers), got a ragged or "
                              "mixed sequence") from None  # fmt: skip
    if arr.ndim != 1:
        raise AssignmentError(f"an assignment must be a 1-D list of device indices, got shape {arr.shape}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) >= 2**62:
        raise AssignmentError(f"op {int(np.argmax(arr))} has device {int(arr.max())}, not a device index")
    if arr.dtype.kind == "f":
        flat = arr.reshape(-1)
        with np.errstate(invalid="ignore"):
            bad_mask = ~np.isfinite(flat) | (flat != np.round(flat)) | (np.abs(flat) >= 2**62)
        if bad_mask.any():
            bad = int(np.flatnonzero(bad_mask)[0])
            x = float(flat[bad])
            if math.isfinite(x) and abs(x) < 2**62:
                raise AssignmentError(f"op {bad} has a non-integer device {x:g}")
            raise AssignmentError(f"op {bad} has device {x:g}, not a device index")
    elif arr.dtype.kind not in "iu" and arr.size:
        raise AssignmentError("an assignment must be a list of device indices (integers), "
                              f"got {'text' if arr.dtype.kind in 'US' else 'values that are not numbers'}")  # fmt: skip
    return arr.astype(np.int64).reshape(-1)


def check_assignment(graph: DataflowGraph, devices: np.ndarray, num_devices: int) -> np.ndarray:
    """Raise AssignmentError unless ``devices`` has one valid device index per op."""
    devices = as_devices(devices)
    if devices.shape[0] != graph.num_ops:
        raise AssignmentError(
            f"the assignment has {devices.shape[0]} entries but graph {graph.name!r} has {graph.num_ops} ops"
        )
    _check_range(devices, num_devices, graph.op_label)
    return devices


def _check_range(devices: np.ndarray, num_devices: int, op_label: Any = str) -> None:
    """AssignmentError naming the first op (by ``op_label(i)``) whose device is not in ``0..num_devices - 1``."""
    bad = np.flatnonzero((devices < 0) | (devices >= num_devices))
    if bad.size:
        i = int(bad[0])
        raise AssignmentError(
            f"op {op_label(i)} is assigned to device {int(devices[i])}, "
            f"but the cluster has devices 0..{num_devices - 1}"
            + (f" ({bad.size - 1} more ops are out of range)" if bad.size > 1 else "")
        )


def save_assignment(assignment: Assignment, path: str | Path) -> None:
    """Write ``assignment`` to ``path`` as an assignment file (:meth:`Assignment.to_json`), atomically."""
    write_json(path, assignment.to_json())


def load_assignment(
    path: str | Path, graph: DataflowGraph | None = None, num_devices: int | None = None, *, check_fingerprint: bool = True
) -> Assignment:
    """Read an assignment file; with ``graph``, check its length and (unless told not to) its
    fingerprint; with ``num_devices``, that every device index is in range (errors name the file)."""
    p = Path(path)
    obj = read_json(p, "assignment file", AssignmentError)
    if isinstance(obj, list):
        values, method, fp = obj, "file", None
    elif isinstance(obj, dict) and isinstance(obj.get("assignment"), list):
        values, method, fp = obj["assignment"], str(obj.get("method", "file")), obj.get("graph_fingerprint")
    else:
        raise AssignmentError(f'{p}: expected a JSON list or an object with an "assignment" list')
    if fp is not None and not isinstance(fp, str):
        raise AssignmentError(f"{p}: graph_fingerprint must be a string (or null), got {type(fp).__name__}")
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
            raise AssignmentError(f"{p}: entry {i} (op {i}) is {v!r}, not a device index")
    try:
        devices = as_devices(values)
    except AssignmentError as e:
        raise AssignmentError(f"{p}: {e}") from None
    if graph is not None:
        if devices.shape[0] != graph.num_ops:
            raise AssignmentError(
                f"{p}: the assignment has {devices.shape[0]} entries but graph {graph.name!r} has {graph.num_ops} ops"
            )
        if check_fingerprint and fp is not None and not graph.matches_fingerprint(fp):
            raise AssignmentError(
                f"{p}: made for a different graph (fingerprint {fp[:40]!r}, this graph is {graph.fingerprint()!r}; "
                "--ignore-fingerprint uses it anyway if the ops are the same)"
            )
        if not check_fingerprint and fp is not None:  # told to use it for this graph: it is now this graph's
            fp = graph.fingerprint()
    if num_devices is not None:
        try:
            if graph is not None:
                check_assignment(graph, devices, num_devices)
            else:  # (ops named by their index)
                _check_range(devices, num_devices)
        except AssignmentError as e:
            raise AssignmentError(f"{p}: {e}") from None
    return Assignment(devices=devices, method=method, graph_fingerprint=fp)
