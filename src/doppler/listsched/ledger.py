"""The memory a list schedule has put on each device, so that its rules skip a device an op would overflow.

The model is :mod:`doppler.memory`'s: an op holds, on its device, every graph-input slice it reads (each
slice once per device). The ledger keeps, per device, the slices held and their bytes (``used``), and the
bytes of the slices held nowhere yet (``unheld[0]``). Op ``v`` has room on device ``d`` when

- ``used[d]`` plus the bytes of ``v``'s slices not yet held on ``d`` plus ``v``'s own output fit ``cap[d]``;
- and the room left on all devices after it still holds every slice held nowhere yet: a slice that ``v``
  would copy onto a second device takes room the other slices need. Outputs are not kept in ``used``: they live only while they are needed, which a
list schedule does not know; :func:`doppler.methods.assign` simulates the result and, where the live
activations overflow a device, schedules again with that device's cap lowered by the overflow.

An unlimited ledger (no budget) has room everywhere, so a rule that consults it decides as without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler.util.jit import jit
from doppler.ir.graph import DataflowGraph
from doppler.ir.slices import input_slices


@jit(cache=True)
def _held_anywhere(held, s):  # pragma: no cover - compiled
    for d in range(held.shape[1]):
        if held[s, d]:
            return True
    return False


@jit(cache=True)
def room_into(v, slice_ptr, slice_idx, slice_bytes, out_bytes, held, used, cap, unheld, out):  # pragma: no cover
    """``out[d]``: whether op ``v`` fits on device ``d`` (module docstring)."""
    nd = used.shape[0]
    free = 0.0
    for d in range(nd):
        free += max(cap[d] - used[d], 0.0)
    for d in range(nd):
        extra = 0.0
        copies = 0.0  # bytes of slices held elsewhere already
        for k in range(slice_ptr[v], slice_ptr[v + 1]):
            s = slice_idx[k]
            if not held[s, d]:
                extra += slice_bytes[s]
                if _held_anywhere(held, s):
                    copies += slice_bytes[s]
        out[d] = used[d] + extra + out_bytes[v] <= cap[d] and free - copies >= unheld[0]


@jit(cache=True)
def hold(v, d, slice_ptr, slice_idx, slice_bytes, held, used, unheld):  # pragma: no cover - compiled
    """Op ``v`` placed on device ``d``: its slices are held there from now on."""
    for k in range(slice_ptr[v], slice_ptr[v + 1]):
        s = slice_idx[k]
        if not held[s, d]:
            if not _held_anywhere(held, s):
                unheld[0] -= slice_bytes[s]
            held[s, d] = True
            used[d] += slice_bytes[s]


@dataclass
class MemoryLedger:
    """One list schedule's ledger (module docstring); :meth:`arrays` is what the compiled rules take."""

    slice_ptr: np.ndarray  # int64[n + 1]
    slice_idx: np.ndarray  # int64[nnz]
    slice_bytes: np.ndarray  # float64[S]
    out_bytes: np.ndarray  # float64[n]
    held: np.ndarray  # bool[S, D]
    used: np.ndarray  # float64[D]
    cap: np.ndarray  # float64[D]
    unheld: np.ndarray  # float64[1]: bytes of the slices no device holds yet

    @classmethod
    def build(cls, graph: DataflowGraph, num_devices: int, cap_bytes: np.ndarray | None) -> "MemoryLedger":
        """An empty ledger of ``graph`` on ``num_devices`` devices with per-device caps (None: unlimited)."""
        s = input_slices(graph)
        cap = np.full(num_devices, np.inf) if cap_bytes is None else np.asarray(cap_bytes, dtype=np.float64)
        return cls(s.op_ptr, s.slice_idx, s.nbytes, np.ascontiguousarray(graph.output_bytes, dtype=np.float64),
                   np.zeros((s.num_slices, num_devices), np.bool_), np.zeros(num_devices), cap.copy(),
                   np.array([s.nbytes.sum()]))  # fmt: skip

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.slice_ptr, self.slice_idx, self.slice_bytes, self.out_bytes, self.held, self.used, self.cap,
                self.unheld)  # fmt: skip

    def room(self, v: int) -> np.ndarray:
        """bool[D]: the devices op ``v`` fits on."""
        out = np.empty(self.used.shape[0], np.bool_)
        room_into(v, *self.arrays(), out)
        return out

    def hold(self, v: int, d: int) -> None:
        hold(v, d, self.slice_ptr, self.slice_idx, self.slice_bytes, self.held, self.used, self.unheld)
