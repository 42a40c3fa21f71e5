"""CRITICAL PATH list scheduling: DOPPLER's imitation-learning teacher (docs/design.md, The method).

The algorithm, exactly:

1. Static priorities. ``b_level[v]`` is the longest path from ``v`` to an exit,
   counting compute and communication, where an op's compute is its **mean**
   compute time over the cluster's devices and an edge's communication is the
   **mean** transfer time of the producer's ``output_bytes`` over ordered pairs
   of distinct devices (``CostModel.mean_transfer_s``; 0 on one device).
2. Repeat ``|V|`` times. The candidate set ``C_h`` holds the unplaced ops whose
   predecessors are all placed. **SEL**: take the candidate with the largest
   b-level (ties: lowest op id; b-levels that differ by less than ``1e-12``
   times the largest b-level of the graph count as tied, so rounding noise
   never decides). **PLC**: for every device ``d`` estimate the earliest start
   time::

       EST(v, d) = max(free[d], max_{u in pred(v)} finish[u] + xfer(u, dev[u] -> d))

   where ``xfer`` is ``latency + bytes / bandwidth`` of the link (0 on the same
   device) and ``free[d]`` is the finish time of the last op put on ``d`` (no
   insertion into idle gaps). Put ``v`` on the device with the smallest EST
   (ties: lowest device id, where devices whose EST is within a relative
   :data:`~doppler.listsched.TIE_RTOL` (``1e-9``) of the minimum count as
   tied; the device's ``streams`` setting is ignored: one op at a time),
   then ``finish[v] = EST + compute(v, d)``
   with ``d``'s own compute time and ``free[d] = finish[v]``.

With a memory budget (``memory_budget_bytes``, given by :func:`~doppler.methods.assign`), PLC skips
the devices where the op would overflow the budget (:mod:`doppler.listsched.ledger`); where none has
room the method fails, naming the op.

The rules and their state live in :mod:`doppler.listsched`; this module runs them and records them.
The list schedule's length (the largest ``finish``) is reported as the method's
``estimated_makespan_s``; the real makespan comes from the WC simulator.

:func:`critical_path_trace` exposes every step (candidate set, chosen op, the EST
of each device for it, and the tied-best candidates and devices) as arrays for
the imitation stage.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.methods.placement import no_room
from doppler.methods.registry import PythonRun, register
from doppler.hardware.costs import CostModel, priority_key
from doppler.ir.graph import DataflowGraph
from doppler.listsched import PlacementState, earliest_start_device
from doppler.listsched.ledger import MemoryLedger


@dataclass
class CriticalPathTrace:
    """Every step of the teacher. Step ``h`` places op ``order[h]`` on ``devices[h]``.

    Candidates of step ``h`` are ``cand_ops[cand_ptr[h]:cand_ptr[h+1]]`` (ascending
    op id); ``cand_tied`` marks those tied for the largest b-level (the chosen op
    is always among them). ``est_s[h]`` is the estimated earliest start of
    ``order[h]`` on each device; ``device_tied[h]`` marks the devices tied for the
    smallest. Per-op arrays (``assignment``, ``start_s``, ``finish_s``,
    ``b_level``) are indexed by op id.
    """

    order: np.ndarray  # int64[n]
    devices: np.ndarray  # int64[n]
    est_s: np.ndarray  # float64[n, D]
    device_tied: np.ndarray  # bool[n, D]
    cand_ptr: np.ndarray  # int64[n + 1]
    cand_ops: np.ndarray  # int64[sum |C_h|]
    cand_tied: np.ndarray  # bool[sum |C_h|]
    b_level: np.ndarray  # float64[n]
    assignment: np.ndarray  # int64[n]
    start_s: np.ndarray  # float64[n]
    finish_s: np.ndarray  # float64[n]
    makespan_s: float

    def candidates(self, h: int) -> np.ndarray:
        return self.cand_ops[self.cand_ptr[h] : self.cand_ptr[h + 1]]

    def tied_candidates(self, h: int) -> np.ndarray:
        return self.candidates(h)[self.cand_tied[self.cand_ptr[h] : self.cand_ptr[h + 1]]]

    def tied_devices(self, h: int) -> np.ndarray:
        return np.flatnonzero(self.device_tied[h])


class _Record:
    """What :func:`_schedule` records at each step for :class:`CriticalPathTrace` (the candidate sets,
    their b-level ties, every device's EST and the devices tied for the smallest)."""

    def __init__(self, n: int, nd: int, key: np.ndarray, roots: list[int]) -> None:
        self.key = key
        self.est_s = np.empty((n, nd))
        self.device_tied = np.zeros((n, nd), dtype=bool)
        self.cand_set = set(roots)
        self.cand_ptr = np.zeros(n + 1, dtype=np.int64)
        self.cand_chunks: list[np.ndarray] = []
        self.tied_chunks: list[np.ndarray] = []

    def candidates(self, h: int) -> None:
        """Step ``h``'s candidates (ascending op id) and those tied for the largest b-level."""
        cands = np.fromiter(sorted(self.cand_set), dtype=np.int64, count=len(self.cand_set))
        ck = self.key[cands]
        self.cand_chunks.append(cands)
        self.tied_chunks.append(ck == ck.max())
        self.cand_ptr[h + 1] = self.cand_ptr[h] + cands.size

    def fields(self) -> dict:
        return dict(
            est_s=self.est_s,
            device_tied=self.device_tied,
            cand_ptr=self.cand_ptr,
            cand_ops=np.concatenate(self.cand_chunks) if self.cand_chunks else np.empty(0, np.int64),
            cand_tied=np.concatenate(self.tied_chunks) if self.tied_chunks else np.empty(0, bool),
        )


def _schedule(graph: DataflowGraph, cm: CostModel, record: bool, ledger: MemoryLedger | None = None) -> dict:
    """CRITICAL PATH's list schedule (module docstring): SEL pops the candidate heap keyed on (largest
    b-level, lowest op id), the rule of :func:`~doppler.listsched.largest_key_candidate`; PLC is
    :func:`~doppler.listsched.earliest_start_device` on the state's EST, over the devices with room in
    ``ledger`` (None: all)."""
    n, nd = graph.num_ops, cm.num_devices
    bl = cm.b_level(graph)
    succ_ptr = graph.succ_ptr.tolist()
    succ_idx = graph.succ_idx.tolist()
    indeg = np.diff(graph.pred_ptr).tolist()
    key = priority_key(bl)
    neg_key = (-key).tolist()

    heap = [(neg_key[v], v) for v in range(n) if indeg[v] == 0]
    heapq.heapify(heap)
    state = PlacementState(graph, cm, batch=1)
    one_op = np.zeros(1, dtype=np.int64)
    one_dev = np.zeros(1, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    chosen_dev = np.empty(n, dtype=np.int64)
    ties = np.empty(nd, dtype=bool)
    rec = _Record(n, nd, key, [v for _, v in heap]) if record else None

    for h in range(n):
        if rec is not None:
            rec.candidates(h)
        _, v = heapq.heappop(heap)
        one_op[0] = v
        est = state.est(one_op)
        if ledger is not None:
            room = ledger.room(v)
            if not room.any():
                raise no_room(graph, ledger.used, ledger.cap, v, h, "critical_path")
            est[0, ~room] = np.inf
        d = int(earliest_start_device(est[0], ties))
        if ledger is not None:
            ledger.hold(v, d)
        one_dev[0] = d
        state.place(one_op, one_dev, est[:, d])
        order[h] = v
        chosen_dev[h] = d
        if rec is not None:
            rec.est_s[h] = est[0]
            rec.device_tied[h] = ties
            rec.cand_set.discard(v)
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[k]
            indeg[w] -= 1
            if indeg[w] == 0:
                heapq.heappush(heap, (neg_key[w], w))
                if rec is not None:
                    rec.cand_set.add(w)

    finish = state.finish_s[0]
    out = {
        "order": order,
        "devices": chosen_dev,
        "b_level": bl,
        "assignment": state.dev[0],
        "start_s": state.start_s[0],
        "finish_s": finish,
        "makespan_s": float(finish.max()) if n else 0.0,
    }
    if rec is not None:
        out.update(rec.fields())
    return out


def critical_path_schedule(
    graph: DataflowGraph,
    cluster=None,
    *,
    compute_s: np.ndarray | None = None,
    comm_s: np.ndarray | None = None,
    record: bool = False,
    memory_budget_bytes: np.ndarray | None = None,
) -> dict:
    """The teacher's list schedule: a dict with ``assignment``, ``order``, ``devices``, ``start_s``,
    ``finish_s``, ``b_level``, ``makespan_s``; with ``record``, every step's record too (the other
    fields of :class:`CriticalPathTrace`).

    ``compute_s[n, D]`` / ``comm_s[E]`` override the cluster's costs (for tests
    and imported graphs with explicit costs). ``memory_budget_bytes[D]``: place within it (module docstring).
    """
    cm = CostModel.build(graph, cluster, compute_s=compute_s, comm_s=comm_s)
    ledger = None if memory_budget_bytes is None else MemoryLedger.build(graph, cm.num_devices, memory_budget_bytes)
    return _schedule(graph, cm, record, ledger)


def critical_path_trace(graph: DataflowGraph, cluster=None, **costs: np.ndarray | None) -> CriticalPathTrace:
    """Run the teacher and record every step (see :class:`CriticalPathTrace`); ``costs``: ``compute_s``
    and ``comm_s``, as :func:`critical_path_schedule` takes them."""
    return CriticalPathTrace(**critical_path_schedule(graph, cluster, record=True, **costs))


@register("critical_path", description="list scheduling: largest b-level first, earliest-start device",
          python=PythonRun(), memory_aware=True)
def critical_path(graph: DataflowGraph, cluster, *, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """DOPPLER's CRITICAL PATH teacher (deterministic)."""
    res = critical_path_schedule(graph, cluster, memory_budget_bytes=memory_budget_bytes)
    return Assignment(devices=res["assignment"], estimated_makespan_s=res["makespan_s"])
