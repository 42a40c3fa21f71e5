"""LOOKAHEAD and HEFT_LOOKAHEAD: one-step rollout over CRITICAL PATH or HEFT, judged by the WC simulator.

The rollout algorithm (Bertsekas's "rollout", the "pilot method" of Duin and Voss) applied
to the CRITICAL PATH list scheduler. Ops are taken in CRITICAL PATH's order (largest b-level
first). For the op ``v`` of step ``h`` and every device ``d``:

1. put ``v`` on ``d``;
2. place every later op as CRITICAL PATH would (largest b-level candidate, earliest-start
   device) from that state on (:func:`doppler.listsched.critical_path_completion`);
3. simulate the finished assignment with the work-conserving simulator.

``v`` goes to the device whose completion finishes first; on a tie, to CRITICAL PATH's own
choice. Because CRITICAL PATH's choice completes to the assignment the previous step already
scored, the simulated makespan never rises from step to step: LOOKAHEAD is never worse than
CRITICAL PATH. It costs ``|V| x D`` completions and simulations.

HEFT_LOOKAHEAD is the same rollout over HEFT: ops in HEFT's order (upward rank), each op tried on
every device with the ops before it where earlier steps put them, every later op placed by HEFT's
rule (earliest finish with insertion, :func:`doppler.listsched.heft_completion`), each completion
simulated. Never worse than HEFT, for the same reason. It costs ``|V| x D`` HEFT completions
(``O(|V|^2 D^2)``). The devices of one step are tried side by side on every core
(:mod:`doppler.methods._rollout_loops`; the same assignment on any number; its times are in
docs/research/anneal.md, "Speed"). With ``budget_s`` it stops deciding when the time is up and
returns HEFT's completion of the ops decided so far (anytime).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.hardware.costs import CostModel, priority_key
from doppler.ir.graph import DataflowGraph
from doppler.listsched import (
    critical_path_completion, earliest_start_device, empty_schedule, empty_state, est_into, heft_list_schedule, heft_place,
    largest_key_candidate, place, take_candidate,
)  # fmt: skip
from doppler.listsched.ledger import MemoryLedger
from doppler.methods.placement import no_room, place_within
from doppler.methods.registry import get_method, option, register
from doppler.methods.threads import THREADS_HELP, search_threads
from doppler.util.progress import ProgressEvent, ProgressFn
from doppler.sim import SimContext

#: a step leaves the rule's choice only for a completion that simulates shorter by more than this (relative)
IMPROVE_RTOL = 1e-12


class _Arrays:
    """The compiled functions' view of one graph on one cluster."""

    def __init__(self, graph: DataflowGraph, cluster) -> None:
        cm = CostModel.build(graph, cluster)
        i64 = lambda a: np.ascontiguousarray(a, dtype=np.int64)  # noqa: E731
        self.key = i64(priority_key(cm.b_level(graph)))
        self.graph_arrays = (i64(graph.pred_ptr), i64(graph.pred_idx),
                             np.ascontiguousarray(cm.pred_bytes(graph), dtype=np.float64),
                             i64(graph.succ_ptr), i64(graph.succ_idx))  # fmt: skip
        self.indeg0 = i64(np.diff(graph.pred_ptr))
        self.cost_arrays = (cm.compute_s, cm.latency_s, cm.inv_bw)
        self.num_devices = cm.num_devices


def lookahead_schedule(graph: DataflowGraph, cluster,
                       memory_budget_bytes: np.ndarray | None = None) -> tuple[np.ndarray, float]:  # fmt: skip
    """The LOOKAHEAD assignment and its simulated makespan (see the module docstring); with
    ``memory_budget_bytes[D]``, each op chooses among the devices with room for it
    (:mod:`doppler.listsched.ledger`)."""
    arr = _Arrays(graph, cluster)
    n, nd = graph.num_ops, arr.num_devices
    (pred_ptr, pred_idx, pred_bytes, succ_ptr, succ_idx), (comp, lat, inv) = arr.graph_arrays, arr.cost_arrays
    dev, start, finish, free, assigned, indeg, cand, pos, ncand = empty_state(arr.indeg0, nd)
    branches = np.empty((nd, n), np.int64)
    ctx = SimContext(graph, cluster)
    est = np.empty(nd)
    ties = np.empty(nd, np.bool_)
    best_s = np.inf
    ledger = None if memory_budget_bytes is None else MemoryLedger.build(graph, nd, memory_budget_bytes)
    for h in range(n):
        v = int(largest_key_candidate(arr.key, cand, ncand))
        for d in range(nd):
            critical_path_completion(v, d, arr.key, *arr.graph_arrays, *arr.cost_arrays, dev, start, finish, free, assigned,
                    indeg, cand, pos, ncand, branches[d])  # fmt: skip
        makespan_s = ctx.simulate_many(branches)
        est_into(v, pred_ptr, pred_idx, pred_bytes, lat, inv, dev, finish, free, est)
        if ledger is not None:
            room = ledger.room(v)
            if not room.any():
                raise no_room(graph, ledger.used, ledger.cap, v, h, "lookahead")
            est[~room] = np.inf
            makespan_s[~room] = np.inf
        d = int(earliest_start_device(est, ties))
        if makespan_s.min() < makespan_s[d] * (1.0 - IMPROVE_RTOL):
            d = int(np.argmin(makespan_s))
        best_s = float(makespan_s[d])
        if ledger is not None:
            ledger.hold(v, d)
        place(v, d, est[d], comp, dev, start, finish, free, assigned)
        ncand = take_candidate(v, succ_ptr, succ_idx, indeg, cand, pos, ncand)
    return dev, best_s


@register("lookahead", description="critical_path with one-step rollout: each op tries every device, "
                                   "completes as critical_path, keeps the best simulated", memory_aware=True)  # fmt: skip
def lookahead(graph: DataflowGraph, cluster, *, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """LOOKAHEAD (deterministic): never worse than critical_path."""
    devices, makespan_s = lookahead_schedule(graph, cluster, memory_budget_bytes)
    return Assignment(devices=devices, estimated_makespan_s=makespan_s)


def heft_lookahead_schedule(graph: DataflowGraph, cluster, budget_s: float | None = None,
                            on_progress: ProgressFn | None = None, threads: int | None = None,
                            memory_budget_bytes: np.ndarray | None = None) -> tuple[np.ndarray, float, int]:  # fmt: skip
    """The HEFT_LOOKAHEAD assignment, its simulated makespan and the number of steps decided by the
    rollout (see the module docstring). With ``budget_s`` (counted from this call, numba's start
    included), the steps not reached in time keep HEFT's choice. ``threads``: the cores that take a
    step's devices side by side (default: every core this process may use; the same result). With
    ``memory_budget_bytes[D]``, it starts from memory-aware HEFT (placed again where live activations
    overflow, :func:`~doppler.methods.placement.place_within`) and keeps a step's better completion only
    if that fits the budget when simulated."""
    from doppler.methods import _rollout_loops as R
    from doppler.methods.heft import heft_inputs

    t0 = time.perf_counter()
    order, _, arrays = heft_inputs(graph, cluster)
    n, nd = graph.num_ops, arrays[3].shape[1]
    ctx = SimContext(graph, cluster)
    if memory_budget_bytes is None:
        devices = heft_list_schedule(order, *arrays)[0]
    else:
        devices = place_within(get_method("heft"), graph, cluster, memory_budget_bytes)[0].devices
    best_s = float(ctx.simulate_many(devices[None, :])[0])
    if nd == 1:
        return devices, best_s, n  # nothing to choose
    sim = (ctx.arrays, *ctx.noise(0.0, 0))
    threads = search_threads(threads, nd - 1)
    branches = np.empty((nd - 1, n), np.int64)  # every device but HEFT's own, in device order
    makespan_s = np.empty(nd - 1)
    state = list(empty_schedule(n, nd))  # HEFT's schedule of the ops decided so far (heft_place's arguments)
    decided = 0
    for h in range(n):
        if budget_s is not None and time.perf_counter() - t0 >= budget_s:
            break
        v = order[h]
        own = int(devices[v])  # HEFT's choice: its branch is the current assignment, already simulated
        k = R.rollout_step(order, h, own, arrays, state[:6], sim, threads, best_s, branches, makespan_s)
        if makespan_s[k] < best_s * (1.0 - IMPROVE_RTOL) and (
                memory_budget_bytes is None or ctx.fits_memory(branches[k], memory_budget_bytes)):  # fmt: skip
            devices = branches[k].copy()
            best_s = float(makespan_s[k])
        state[3:5] = heft_place(v, devices[v], *arrays, *state)
        decided = h + 1
        if on_progress is not None:
            on_progress(ProgressEvent("heft_lookahead", decided, n, "ops",
                                      {"evals": 1 + decided * (nd - 1), "best_makespan_s": best_s}))  # fmt: skip
    return devices, best_s, decided


@dataclass(frozen=True)
class HeftLookaheadOptions:
    """The options of ``heft_lookahead``."""

    threads: int | None = option(None, THREADS_HELP, flag="--threads")


@register("heft_lookahead", options=HeftLookaheadOptions, description="heft with one-step rollout: each op tries "
          "every device, completes as heft, keeps the best simulated; --budget-s makes it anytime", memory_aware=True,
          memory_retries=False)  # fmt: skip
def heft_lookahead(graph: DataflowGraph, cluster, options: HeftLookaheadOptions, *, budget_s: float | None = None,
                   on_progress: ProgressFn | None = None, memory_budget_bytes: np.ndarray | None = None) -> Assignment:  # fmt: skip
    """HEFT_LOOKAHEAD: never worse than heft. ``info["rollout_steps"]``: the ops the rollout decided (all of
    them, unless ``budget_s`` ran out first). ``options.threads``: cores (default all; the same assignment)."""
    devices, makespan_s, decided = heft_lookahead_schedule(graph, cluster, budget_s, on_progress, options.threads,
                                                           memory_budget_bytes)  # fmt: skip
    return Assignment(devices=devices, estimated_makespan_s=makespan_s, info={"rollout_steps": decided})
