"""The simulator's Python side: :class:`SimContext` (one graph and cluster's arrays, built once; it
checks an assignment and options, runs :mod:`doppler.sim.loops` and builds the result) and the
public functions :func:`simulate`, :func:`simulate_many`, :func:`lower_bound` and :func:`traced`.

A loop that simulates many assignments of one graph holds its own context (``ctx = context(g, c)``),
so each call pays only for the checks and the event loop. The public functions take the graph and
cluster on each call; they find the context of the pair in a small per-thread cache (:class:`_Cache`)
that holds neither the graph nor the cluster alive: graphs and clusters are immutable (their
docstrings say so), so a context built once stays right for as long as both exist.
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from doppler.ir.assignment import Assignment, AssignmentError, as_devices, check_assignment
from doppler.hardware.costs import CostModel
from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.util.io import check_seed
from doppler.ir.slices import InputSlices, input_slices
from doppler.hardware.presets import cluster as resolve_cluster
from doppler.sim.bounds import critical_path_bound, work_bound
from doppler.sim.loops import ARRAYS, sim_loop, sim_many
from doppler.sim.trace import Trace

MODES = ("wc", "bsp")
DISPATCHES = ("fifo", "priority")

#: largest accepted lognormal noise sigma (see check_options)
MAX_NOISE_SIGMA = 3.0


class SimulationError(ValueError):
    """Bad simulator options (mode, noise, seed, ...); the message says which."""


# =========================================================================== results
@dataclass
class SimResult:
    """``makespan_s`` (seconds) and, with ``trace=True``, the :class:`Trace`, the peak bytes held per
    device and the resident weight bytes among them (the model is :mod:`doppler.memory`'s)."""

    makespan_s: float
    trace: Trace | None = None
    mode: str = "wc"
    peak_memory_bytes: np.ndarray | None = None  # float64[D], with trace=True
    resident_bytes: np.ndarray | None = None  # float64[D], with trace=True


# =========================================================================== context
class SimContext:
    """Static per-(graph, cluster) arrays, built once; reuse it for many assignments.

    Hold one in loops: ``ctx = context(g, c); ctx.makespan(devices)``. :attr:`arrays` is the tuple
    the loops take first (:mod:`doppler.sim.loops`); its arrays are also attributes by name.
    """

    def __init__(self, graph: DataflowGraph, cluster: Cluster) -> None:
        self.graph = graph
        self.cluster = cluster
        self.num_ops = n = graph.num_ops
        self.num_devices = cluster.num_devices
        self.num_edges = graph.num_edges
        self.succ_ptr = np.ascontiguousarray(graph.succ_ptr, dtype=np.int64)
        self.succ_idx = np.ascontiguousarray(graph.succ_idx, dtype=np.int64)
        self.indeg = np.ascontiguousarray(np.diff(graph.pred_ptr), dtype=np.int64)
        self.level = np.ascontiguousarray(graph.level, dtype=np.int64)
        self.lvl_ops = np.lexsort((np.arange(n), self.level)).astype(np.int64)
        self.lvl_ptr = np.zeros(int(self.level.max()) + 2, dtype=np.int64)
        np.cumsum(np.bincount(self.level), out=self.lvl_ptr[1:])
        self.comp = np.ascontiguousarray(CostModel.build(graph, cluster).compute_s, dtype=np.float64)
        cluster.check_times(graph, self.comp)
        self.out_bytes = np.ascontiguousarray(graph.output_bytes, dtype=np.float64)
        self.lat = np.ascontiguousarray(cluster.latency_s, dtype=np.float64)
        self.bw = np.ascontiguousarray(cluster.bandwidth_Bps, dtype=np.float64)
        self.streams = np.ascontiguousarray(cluster.streams, dtype=np.int64)
        self.copies_in = np.ascontiguousarray(cluster.copies_inbound, dtype=np.bool_)
        self.arrays = tuple(getattr(self, name) for name in ARRAYS)
        self._slices: InputSlices | None = None
        self._ones_n = np.ones(n)
        self._ones_e = np.ones(max(self.num_edges, 1))
        self._noise_cache: tuple[float, int, np.ndarray, np.ndarray] | None = None
        self._fingerprints: set[str] = set()  # assignment fingerprints found to be this graph's
        self._lower_bound: float | None = None

    # ------------------------------------------------------------------ options
    def noise(self, sigma: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Multiplicative duration factors (per op, per successor slot)."""
        if sigma == 0.0:
            return self._ones_n, self._ones_e
        c = self._noise_cache
        if c is not None and c[0] == sigma and c[1] == seed:
            return c[2], c[3]
        rng = np.random.default_rng(seed)
        z = rng.standard_normal(self.num_ops + self.num_edges)
        f = np.exp(sigma * z - 0.5 * sigma * sigma)
        op_f = np.ascontiguousarray(f[: self.num_ops])
        edge_f = np.ascontiguousarray(f[self.num_ops :]) if self.num_edges else self._ones_e
        self._noise_cache = (sigma, seed, op_f, edge_f)
        return op_f, edge_f

    # ------------------------------------------------------------------ running
    def _outputs(self, new: bool) -> tuple[np.ndarray, ...]:
        """The loop's output arrays: new ones (a traced run keeps them), else the set reused by untraced
        runs (calls hold the GIL, so one set per context is safe)."""
        sc = None if new else self.__dict__.get("_scratch_arrays")
        if sc is None:
            n, E = self.num_ops, max(self.num_edges, 1)
            sc = (np.empty(n), np.empty(n), np.empty(n), np.empty(E, np.int64), np.empty(E, np.int64), np.empty(E), np.empty(E))
            if not new:
                self.__dict__["_scratch_arrays"] = sc
        return sc

    def _devices(self, assignment: Any) -> np.ndarray:
        """The device array; int64 contiguous arrays of the right length pass through unchecked
        (the loop range-checks them), anything else goes through check_assignment."""
        if isinstance(assignment, Assignment) and assignment.graph_fingerprint:
            self._check_fingerprint(assignment.graph_fingerprint)
        arr = assignment.devices if isinstance(assignment, Assignment) else assignment
        if (
            type(arr) is np.ndarray
            and arr.dtype == np.int64
            and arr.ndim == 1
            and arr.shape[0] == self.num_ops
            and arr.flags.c_contiguous
        ):
            return arr
        dev = check_assignment(self.graph, as_devices(assignment), self.num_devices)
        return np.ascontiguousarray(dev, dtype=np.int64)

    def _check_fingerprint(self, fp: str) -> None:
        """An :class:`Assignment` made for another graph (its fingerprint says so) is refused, as the CLI
        refuses such a file; the graph's fingerprints are hashed once per context."""
        if fp in self._fingerprints:
            return
        if not self.graph.matches_fingerprint(fp):
            raise AssignmentError(f"the assignment was made for another graph than {self.graph.name!r} (its "
                                  "graph_fingerprint differs); pass its .devices to simulate it anyway")  # fmt: skip
        self._fingerprints.add(fp)

    def _dispatch_key(self, dispatch: str, priority: Any, mode: str) -> np.ndarray | None:
        """The per-op priority key (float64) for ``dispatch="priority"``, None for FIFO."""
        if not check_dispatch(dispatch, mode, priority is not None):
            return None
        if self.copies_in.any():
            names = ", ".join(d.name for d in self.cluster.devices if d.copies_inbound)
            raise SimulationError(
                f"priority dispatch does not model devices that make their own inbound copies "
                f"(copies_inbound: {names}); use FIFO dispatch with cluster {self.cluster.name!r}"
            )
        if priority is None:
            k = self.__dict__.get("_id_key")
            if k is None:
                k = self.__dict__["_id_key"] = np.arange(self.num_ops, dtype=np.float64)
            return k
        return _check_priority(priority, self.num_ops)

    def _run(
        self,
        dev: np.ndarray,
        mode: str,
        trace: bool,
        sigma: float,
        seed: int,
        contention: bool,
        key: np.ndarray | None = None,
    ) -> SimResult:
        op_f, edge_f = self.noise(sigma, seed)
        ready, start, end, tsrc, tdst, tstart, tend = self._outputs(new=trace)
        mk, ntr = sim_loop(self.arrays, dev, op_f, edge_f, mode == "bsp", contention, key, ready, start, end, tsrc,
                             tdst, tstart, tend, np.inf)  # fmt: skip
        if ntr < 0:  # a device index out of range: let check_assignment word the error
            check_assignment(self.graph, dev, self.num_devices)
            raise AssignmentError("the assignment has a device index out of range")  # pragma: no cover
        if not trace:
            return SimResult(float(mk), None, mode)
        return self.result(dev, mode, float(mk), ready, start, end, tsrc[:ntr], tdst[:ntr], tstart[:ntr], tend[:ntr])

    def result(self, dev: np.ndarray, mode: str, makespan_s: float, op_ready: np.ndarray, op_start: np.ndarray,
               op_end: np.ndarray, tr_src_op: np.ndarray, tr_dst_device: np.ndarray, tr_start: np.ndarray,
               tr_end: np.ndarray) -> SimResult:  # fmt: skip
        """A traced :class:`SimResult` from per-op and per-transfer arrays (also used by the reference
        simulators of the tests, so that every implementation builds its trace the same way)."""
        tsrc = np.array(tr_src_op, dtype=np.int64)
        tr = Trace(
            op_device=dev.copy(),
            op_ready=op_ready,
            op_start=op_start,
            op_end=op_end,
            tr_src_op=tsrc,
            tr_src_device=dev[tsrc],
            tr_dst_device=np.array(tr_dst_device, dtype=np.int64),
            tr_bytes=self.out_bytes[tsrc],
            tr_start=np.array(tr_start, dtype=np.float64),
            tr_end=np.array(tr_end, dtype=np.float64),
            mode=mode,
        )
        slices = self.input_slices()
        resident = tr.resident_bytes(self.graph, self.num_devices, slices)
        peak = resident + tr.activation_peak_bytes(self.graph, self.num_devices, slices)
        return SimResult(makespan_s, tr, mode, peak, resident)

    def fits_memory(self, devices: np.ndarray, budget_bytes: np.ndarray) -> bool:
        """Whether assignment ``devices`` keeps every device's peak within ``budget_bytes[D]`` (one traced run;
        the model is :mod:`doppler.memory`'s)."""
        return bool(np.all(self.simulate(devices, trace=True).peak_memory_bytes <= budget_bytes))

    def input_slices(self) -> InputSlices:
        """The graph-input slices its ops read (:func:`doppler.ir.slices.input_slices`), found once."""
        if self._slices is None:
            self._slices = input_slices(self.graph)
        return self._slices

    def simulate(
        self,
        assignment: "Assignment | Sequence[int] | np.ndarray",
        *,
        mode: str = "wc",
        trace: bool = False,
        noise_sigma: float = 0.0,
        seed: int = 0,
        link_contention: bool = False,
        dispatch: str = "fifo",
        priority: "np.ndarray | Sequence[float] | None" = None,
    ) -> SimResult:
        """Simulate ``assignment`` (device index per op).

        ``mode``: ``"wc"`` (work-conserving, the default) or ``"bsp"`` (a barrier per
        topological level). ``trace=True`` records per-op and per-transfer times.
        ``noise_sigma``/``seed``: seeded lognormal noise on every duration.
        ``link_contention``: one transfer at a time per ordered link.
        ``dispatch``: ``"fifo"`` (ready ops run in order of readiness, the default)
        or ``"priority"`` (WC only: ready ops run by ``priority``, one number per op,
        lower first, ties by op id; the op id when ``priority`` is None).
        Raises :class:`~doppler.ir.assignment.AssignmentError` for a wrong-length or
        out-of-range assignment and :class:`SimulationError` for bad options.
        """
        if mode != "wc" or noise_sigma != 0.0 or seed != 0:
            mode, noise_sigma, seed = check_options(mode, noise_sigma, seed)
        key = None if dispatch == "fifo" and priority is None else self._dispatch_key(dispatch, priority, mode)
        return self._run(self._devices(assignment), mode, bool(trace), noise_sigma, seed, bool(link_contention), key)

    def makespan(self, devices: "np.ndarray | Assignment | Sequence[int]") -> float:
        """Fast path for hot loops: WC, no noise, no trace (same result as ``simulate(...).makespan_s``)."""
        return self._run(self._devices(devices), "wc", False, 0.0, 0, False).makespan_s

    def simulate_many(
        self,
        assignments: np.ndarray | Sequence[Sequence[int]],
        *,
        mode: str = "wc",
        noise_sigma: float = 0.0,
        seed: int = 0,
        link_contention: bool = False,
        dispatch: str = "fifo",
        priority: "np.ndarray | Sequence[float] | None" = None,
    ) -> np.ndarray:
        """Makespans of a batch ``assignments[B, num_ops]``: ``float64[B]``.

        Row ``b`` equals ``simulate(assignments[b], same options).makespan_s`` (with noise, every
        row uses the same ``seed``: common random numbers; with ``dispatch="priority"``, every row
        uses the same ``priority``)."""
        mode, sigma, seed = check_options(mode, noise_sigma, seed)
        key = self._dispatch_key(dispatch, priority, mode)
        devs = _check_batch(self.graph, assignments, self.num_devices)
        if devs.shape[0] == 0:
            return np.empty(0)
        op_f, edge_f = self.noise(sigma, seed)
        return sim_many(self.arrays, devs, op_f, edge_f, mode == "bsp", bool(link_contention), key)

    # ------------------------------------------------------------------ bounds
    def lower_bound(self) -> float:
        """See :func:`lower_bound` (computed once)."""
        if self._lower_bound is None:
            self._lower_bound = max(critical_path_bound(self.graph, self.comp), work_bound(self.graph, self.cluster))
        return self._lower_bound


def context(graph: DataflowGraph, cluster: "Cluster | str") -> SimContext:
    """A new :class:`SimContext` of (graph, cluster): hold it to simulate many assignments of one graph.
    ``cluster`` may also be a preset name (``"p100x4"``, ``"unit:8"``) or a cluster JSON path, as on
    the CLI."""
    cluster = resolve_cluster(cluster)
    if not isinstance(graph, DataflowGraph):
        raise SimulationError(f"expected a DataflowGraph, got {type(graph).__name__}")
    return SimContext(graph, cluster)


def check_options(mode: str, noise_sigma: float, seed: int) -> tuple[str, float, int]:
    if mode not in MODES:
        raise SimulationError(f"unknown simulation mode {mode!r} (use one of: {', '.join(MODES)})")
    try:
        sigma = float(noise_sigma)
    except (TypeError, ValueError):
        raise SimulationError(f"noise_sigma must be a number >= 0, got {noise_sigma!r}") from None
    if not math.isfinite(sigma) or sigma < 0:
        raise SimulationError(f"noise_sigma must be a finite number >= 0, got {noise_sigma!r}")
    if sigma > MAX_NOISE_SIGMA:
        raise SimulationError(
            f"noise_sigma must be <= {MAX_NOISE_SIGMA:g}, got {noise_sigma!r}: at sigma {MAX_NOISE_SIGMA:g} the durations "
            f"at +2 and -2 standard deviations already differ {math.exp(4 * MAX_NOISE_SIGMA):.0f}x, and larger values overflow"
        )
    check_seed(seed, SimulationError)
    return mode, sigma, int(seed)


def check_dispatch(dispatch: str, mode: str, has_priority: bool = False) -> bool:
    """Validate ``dispatch`` (and that it fits ``mode`` and a given ``priority``); True for priority dispatch."""
    if dispatch not in DISPATCHES:
        raise SimulationError(f"unknown dispatch {dispatch!r} (use one of: {', '.join(DISPATCHES)})")
    if dispatch == "fifo":
        if has_priority:
            raise SimulationError('priority is only used with dispatch="priority" (got dispatch="fifo")')
        return False
    if mode != "wc":
        raise SimulationError(f'dispatch="priority" needs mode="wc" (got mode={mode!r})')
    return True


def _check_priority(priority: Any, num_ops: int) -> np.ndarray:
    """``priority`` as a contiguous float64 array, one number (not NaN) per op."""
    try:
        arr = np.asarray(priority)
    except (TypeError, ValueError):
        raise SimulationError("priority must be a 1-D sequence of numbers, one per op") from None
    if arr.dtype.kind not in "iuf":
        raise SimulationError(f"priority must hold numbers (one per op), got values of type {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] != num_ops:
        raise SimulationError(f"priority must have one number per op ({num_ops}), got shape {arr.shape}")
    key = np.array(arr, dtype=np.float64, order="C")  # a private, writable copy: one loop specialization
    bad = np.flatnonzero(np.isnan(key))
    if bad.size:
        raise SimulationError(f"priority of op {int(bad[0])} is NaN ({bad.size} NaN values in all)")
    return key


def _check_batch(graph: DataflowGraph, assignments: Any, num_devices: int) -> np.ndarray:
    arr = np.asarray(assignments)
    if arr.ndim != 2:
        raise AssignmentError(f"assignments must be a 2-D array [batch, num_ops], got shape {arr.shape}")
    if arr.shape[1] != graph.num_ops:
        raise AssignmentError(
            f"each assignment has {arr.shape[1]} entries but graph {graph.name!r} has {graph.num_ops} ops"
        )
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            b, i = (int(x) for x in np.argwhere(bad)[0])
            raise AssignmentError(f"assignment {b}: op {graph.op_label(i)} has a non-integer device {float(arr[b, i]):g}")
    elif arr.dtype.kind not in "iu" and arr.size:
        raise AssignmentError(f"assignments must hold device indices, got values of type {arr.dtype}")
    devs = np.ascontiguousarray(arr, dtype=np.int64)
    bad = (devs < 0) | (devs >= num_devices)
    if bad.any():
        b, i = (int(x) for x in np.argwhere(bad)[0])
        raise AssignmentError(
            f"assignment {b}: op {graph.op_label(i)} is assigned to device {int(devs[b, i])}, "
            f"but the cluster has devices 0..{num_devices - 1}"
        )
    return devs


# =========================================================================== the public functions' cache
class _WeakAttribute:
    """An attribute held through a weak reference (in ``_<name>_ref``): reading it gives the object
    while something else keeps it alive, then None."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.ref_name = f"_{name}_ref"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else getattr(obj, self.ref_name)()

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.ref_name, weakref.ref(value))


class _WeakContext(SimContext):
    """A :class:`SimContext` that holds its graph and cluster weakly: the cache's, which must not keep
    them alive (a public function holds both while it uses the context)."""

    graph = _WeakAttribute()
    cluster = _WeakAttribute()


class _Cache:
    """The contexts of the last :attr:`SIZE` (graph, cluster) pairs that a thread passed to the public
    functions, most recent first: a loop that calls ``simulate(g, c, a)`` builds one context, not one
    per call. Keyed by the objects themselves, weakly (never by ``id()``, which a new object may
    reuse); an entry goes when its graph or cluster does. Per thread, as a held context is: a context
    reuses scratch arrays between calls."""

    SIZE = 4

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, graph: DataflowGraph, cluster: "Cluster | str") -> SimContext:
        if not (isinstance(graph, DataflowGraph) and isinstance(cluster, Cluster)):
            return context(graph, cluster)  # checks them; a preset name or a path is resolved on each call
        entries = getattr(self._local, "entries", None)  # [(graph ref, cluster ref, [context])]
        if entries is None:
            entries = self._local.entries = []
        for i, (g, c, box) in enumerate(entries):
            if g() is graph and c() is cluster:  # both alive (the caller holds them): box still holds the context
                if i:
                    entries.insert(0, entries.pop(i))
                return box[0]
        ctx = _WeakContext(graph, cluster)
        box = [ctx]

        def drop(_: weakref.ref) -> None:  # the graph or the cluster is gone: free its context now
            box.clear()

        entries.insert(0, (weakref.ref(graph, drop), weakref.ref(cluster, drop), box))
        entries[:] = [e for e in entries if e[2]][: self.SIZE]
        return ctx


_CACHE = _Cache()


# =========================================================================== public API
def simulate(graph: DataflowGraph, cluster: Cluster, assignment: "Assignment | Sequence[int] | np.ndarray",
             **options: Any) -> SimResult:  # fmt: skip
    """Simulate ``graph`` on ``cluster`` under ``assignment`` (device index per op):
    :meth:`SimContext.simulate`, with its options, on the pair's context (built on the first call)."""
    return _CACHE.get(graph, cluster).simulate(assignment, **options)


def traced(graph: DataflowGraph, cluster: Cluster, assignment: Assignment) -> SimResult:
    """The traced WC run of a method's ``assignment``: the method's own (:attr:`Assignment.simulation`)
    where it made one of these devices on this very graph and cluster, else a new one."""
    if assignment.simulation is not None:
        g, c, result = assignment.simulation
        if g is graph and c is cluster and np.array_equal(result.trace.op_device, assignment.devices):
            return result
    return simulate(graph, cluster, assignment, trace=True)


def simulate_many(graph: DataflowGraph, cluster: Cluster, assignments: np.ndarray | Sequence[Sequence[int]],
                  **options: Any) -> np.ndarray:  # fmt: skip
    """Makespans of a batch ``assignments[B, num_ops]``: :meth:`SimContext.simulate_many`, with its
    options, on the pair's context (built on the first call)."""
    return _CACHE.get(graph, cluster).simulate_many(assignments, **options)


def lower_bound(graph: DataflowGraph, cluster: Cluster) -> float:
    """Seconds no assignment can beat (noise-free), in WC and BSP, with or without link contention:
    the larger of :func:`~doppler.sim.bounds.critical_path_bound` (the compute-only critical path,
    each op on its fastest device) and :func:`~doppler.sim.bounds.work_bound` (the total work over the
    total device speed, streams counted, done correctly for per-kind rates)."""
    return _CACHE.get(graph, cluster).lower_bound()
