"""Running registered methods: :func:`assign` runs one by name, :func:`compare` runs several and
:func:`score` simulates each.

:func:`assign` validates the request (the seed, the time budget, the method's options by name, the
device count) before the method runs, times the call (``assign_time_s``), checks the result and
stamps ``method`` and ``graph_fingerprint``.

Memory (:mod:`doppler.memory`): unless ``ignore_memory``, :func:`assign` returns only a placement
that fits every device's budget (``memory_bytes x memory_fraction``). Before the method runs it refuses
a graph that no placement fits (the weights alone, or one op alone, need more than the devices offer);
a memory-aware method (``register(..., memory_aware=True)``) is given the budget as
``memory_budget_bytes``; and the result is simulated and refused, naming the device, if its peak is
over budget. Where even holding everything at once fits the smallest budget, nothing is checked.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from doppler.util import io as io_util
from doppler import memory
from doppler.ir.assignment import Assignment, check_assignment
from doppler.ir.graph import DataflowGraph
from doppler.memory import DEFAULT_MEMORY_FRACTION
from doppler.hardware.presets import cluster as resolve_cluster
from doppler.methods.registry import PYTHON_RUNS, MethodError, MethodSpec, get_method
from doppler.util.progress import ProgressEvent, ProgressFn

#: a process that has not started numba (:mod:`doppler.util.jit`) runs one assignment of a graph of up to this
#: many ops as Python, by a method that allows it (``register(..., python=PythonRun(...))``): up to this size
#: a cheap method's Python run costs less than numba's import and start-up (benchmarks/cold_assign.py)
PYTHON_ASSIGN_MAX_OPS = 3000

#: how many times a memory-aware method places again, each device's cap lowered by its overflow, when the
#: simulated peak of its placement (live activations on top of the weights it counted) is over budget (a
#: search given a time budget runs once, and so do methods that keep to the budget themselves: ``anneal``)
MEMORY_RETRIES = 3

#: the longest search budget (``--budget-s``), in seconds: a week (a search of 1e30 s would never end)
MAX_BUDGET_S = 7 * 24 * 3600.0


def runs_as_python(graph: DataflowGraph, num_devices: int, method: str, budget_s: float | None = None,
                   options: Any = None) -> bool:  # fmt: skip
    """Whether one call of ``method`` (with ``options``, :meth:`~doppler.methods.registry.MethodSpec.options_from`)
    on ``graph`` and a cluster of ``num_devices`` should run its kernels as Python
    (:func:`doppler.util.jit.as_python`) rather than start numba: the method allows it for this call
    (:class:`~doppler.methods.registry.PythonRun`), the graph has at most :data:`PYTHON_ASSIGN_MAX_OPS` ops
    (and ops x devices within the method's ``max_work``), and numba has not started in this process."""
    from doppler.util.jit import started

    spec = get_method(method)
    run = PYTHON_RUNS.get(method)
    if run is None or graph.num_ops > PYTHON_ASSIGN_MAX_OPS or started():
        return False
    if run.max_work is not None and graph.num_ops * num_devices > run.max_work:
        return False
    return run.rule is True or bool(run.rule(spec.options_from(options), budget_s))


def check_budget(budget_s: float | None) -> None:
    """MethodError unless ``budget_s`` is None or a number of seconds in (0, :data:`MAX_BUDGET_S`]."""
    if budget_s is None:
        return
    try:
        b = float(budget_s)
    except (TypeError, ValueError):
        raise MethodError(f"the time budget must be a number of seconds, got {budget_s!r}") from None
    if not math.isfinite(b) or b <= 0:
        raise MethodError(f"the time budget must be a positive number of seconds, got {budget_s!r}")
    if b > MAX_BUDGET_S:
        raise MethodError(f"the time budget must be at most {MAX_BUDGET_S:g} s (a week), got {budget_s!r}")


def check_seed(seed: Any) -> int:
    """A seed is an integer >= 0 (:func:`doppler.util.io.check_seed`); else a :class:`MethodError`."""
    return io_util.check_seed(seed, MethodError)


@dataclass(frozen=True)
class _Request:
    """One checked call of a method: its options, the call's arguments, and the memory rule (``memory_fraction``
    None: memory ignored; ``refuse_over`` False: a placement over budget is returned, ``info["memory_feasible"]``
    False, rather than refused, as :func:`compare` scores it)."""

    spec: MethodSpec
    options: Any
    seed: int = 0
    budget_s: float | None = None
    on_progress: ProgressFn | None = None
    memory_fraction: float | None = DEFAULT_MEMORY_FRACTION
    refuse_over: bool = True


def assign(
    graph: DataflowGraph,
    cluster: Any,
    method: str = "critical_path",
    *,
    seed: int = 0,
    budget_s: float | None = None,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    ignore_memory: bool = False,
    on_progress: ProgressFn | None = None,
    options: Any = None,
    **values: Any,
) -> Assignment:
    """Run method ``method`` and return its :class:`Assignment`.

    ``seed`` makes randomised methods reproducible; ``budget_s`` is a wall-clock budget for search
    methods (the others are not given it); ``on_progress`` gets a search's progress events. The
    method's options: ``options`` (an instance of its options class, ``doppler methods NAME`` lists
    them) and further keyword arguments by name on top (e.g. ``max_evals`` for ``anneal``); an
    unknown name is a :class:`MethodError` before the method runs. The placement fits each device's
    ``memory_bytes x memory_fraction``, or :class:`MethodError` says why (the module docstring);
    ``ignore_memory`` places without looking at memory.
    """
    spec = get_method(method)
    req = _Request(spec, spec.options_from(options, values), seed, budget_s, on_progress,
                   None if ignore_memory else memory_fraction)  # fmt: skip
    return _assign(graph, cluster, req)


def _assign(graph: DataflowGraph, cluster: Any, req: _Request) -> Assignment:
    """:func:`assign` of a request whose options are built."""
    spec, method = req.spec, req.spec.name
    if not isinstance(graph, DataflowGraph):
        raise MethodError(f"expected a DataflowGraph, got {type(graph).__name__} (a file: doppler.load_graph(path))")
    check_budget(req.budget_s)
    req = replace(req, seed=check_seed(req.seed))
    cluster = resolve_cluster(cluster)  # a Cluster, or a preset name or a cluster file as on the CLI
    from doppler.hardware.costs import CostModel

    cluster.check_times(graph, CostModel.build(graph, cluster).compute_s)  # finite op times, before any work
    d = int(cluster.num_devices)
    if d < spec.min_devices:
        raise MethodError(
            f"method {method!r} needs at least {spec.min_devices} devices, but cluster "
            f"{getattr(cluster, 'name', '?')!r} has {d}"
        )
    budget = _memory_budget(graph, cluster, req.memory_fraction)
    t0 = time.perf_counter()
    out, chk, tries = _place(req, graph, cluster, budget)
    out.assign_time_s = float(time.perf_counter() - t0)
    out.graph_fingerprint = graph.fingerprint()
    if chk is not None and not chk.feasible and req.refuse_over:
        from doppler.report import memory_overruns

        aware = f" after {tries} tries" if tries > 1 else "" if spec.memory_aware else f" ({method} does not place by memory)"
        raise MethodError(f"{method}'s placement of {graph.name} does not fit{aware}: {'; '.join(memory_overruns(chk))}"
                          " (--ignore-memory places it anyway)")  # fmt: skip
    return out


def place_within(spec: MethodSpec, graph: DataflowGraph, cluster: Any, budget: np.ndarray | None, *, seed: int = 0,
                 options: Any = None) -> tuple[Assignment, "memory.MemoryCheck | None", int]:  # fmt: skip
    """Run ``spec`` with ``options`` and no time budget, within the per-device memory ``budget`` (None: memory
    ignored), as :func:`assign` places (:func:`_place`): the last placement, its memory check (None without a
    budget) and the tries made."""
    return _place(_Request(spec, spec.options_from(options), seed), graph, cluster, budget)


def _place(req: _Request, graph: DataflowGraph, cluster: Any,
           budget: np.ndarray | None) -> tuple[Assignment, "memory.MemoryCheck | None", int]:  # fmt: skip
    """Run the request's method (no memory when ``budget`` is None). With a per-device ``budget``, a memory-aware
    method is given it as ``memory_budget_bytes``; its placement is simulated (kept as its
    :attr:`~Assignment.simulation`, ``info["memory_feasible"]``), and where a device is over, a method that
    allows it (``memory_retries``; not a search given a time budget) places again with fewer weights
    allowed there, up to :data:`MEMORY_RETRIES` times. Returns the last placement, its memory check (None
    without a budget) and the tries made."""
    spec = req.spec
    caps, chk = budget, None
    retry = spec.memory_aware and spec.memory_retries and not (spec.uses_budget and req.budget_s)  # (a timed search: once)
    tries = 1 + (MEMORY_RETRIES if budget is not None and retry else 0)
    for attempt in range(tries):
        try:
            out = spec.call(graph, cluster, req.options, seed=req.seed, budget_s=req.budget_s,
                            on_progress=req.on_progress, memory_budget_bytes=caps)  # fmt: skip
        except MethodError as e:
            if attempt == 0:
                raise
            from doppler.report import memory_overruns

            raise MethodError(f"{spec.name}'s placement of {graph.name} does not fit: {'; '.join(memory_overruns(chk))}; "
                              f"placed again with room kept for the live activations, {e} (--ignore-memory places "
                              "it anyway)") from None  # fmt: skip
        out.devices = check_assignment(graph, out.devices, int(cluster.num_devices))
        out.method = spec.name
        if budget is None:
            return out, None, 1
        from doppler.sim import traced

        result = traced(graph, cluster, out)
        out.simulation = (graph, cluster, result)
        chk = memory.against(cluster, result.resident_bytes, result.peak_memory_bytes, budget)
        out.info["memory_feasible"] = chk.feasible
        if chk.feasible:
            break
        over = chk.peak_memory_bytes - chk.memory_budget_bytes  # a device over: fewer weights there, by more than that
        caps = np.where(over > 0, np.minimum(caps, chk.resident_bytes) - 1.25 * over, caps)
    return out, chk, attempt + 1


def _memory_budget(graph: DataflowGraph, cluster: Any, memory_fraction: float | None) -> np.ndarray | None:
    """The per-device budget a placement must keep, or None where memory cannot matter (ignored, unlimited,
    or everything fits the smallest device at once); MethodError where no placement fits."""
    if memory_fraction is None:
        return None
    try:
        budget = memory.budget_bytes(cluster, memory_fraction)
    except memory.MemoryBudgetError as e:
        raise MethodError(str(e)) from None
    slices = memory.input_slices(graph)
    if memory.always_fits(graph, budget, slices):
        return None
    short = memory.shortfall(graph, budget, slices)
    if short is not None:
        from doppler.report import shortfall_reason

        raise MethodError(f"{graph.name} does not fit {cluster.name}: {shortfall_reason(graph, cluster, short, memory_fraction)}"
                          " (--ignore-memory places it anyway)")  # fmt: skip
    return budget


def no_room(graph: DataflowGraph, used: np.ndarray, cap: np.ndarray, v: int, placed: int, method: str) -> MethodError:
    """The error of a memory-aware list schedule that found no device with room for op ``v`` after ``placed``
    ops, with the input bytes (``used``) it had put on each device against its cap."""
    from doppler.report import format_bytes

    held = ", ".join(f"{format_bytes(float(u))} of {format_bytes(float(c))}" for u, c in zip(used, cap))
    return MethodError(f"{method}: no device has room for op {graph.op_label(v)} after {placed} of {graph.num_ops} ops "
                       f"(weights and inputs held per device: {held})")  # fmt: skip


@dataclass
class CompareRow:
    """One method's line of :func:`compare`: its assignment scored in the simulator."""

    method: str
    makespan_s: float
    lower_bound_s: float
    peak_memory_bytes: list[float]  # per device, the resident weights included
    resident_bytes: list[float]  # per device
    memory_budget_bytes: list[float | None]  # per device (None: unlimited)
    feasible: bool  # every device within its budget
    memory_overruns: list[str]  # one phrase per device over its budget
    assign_time_s: float | None
    estimated_makespan_s: float | None
    assignment: Assignment
    ratio_to_lower_bound: float | None = None
    ratio_to_critical_path: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field but the assignment, in the order ``doppler compare --json`` prints them."""
        return {k: getattr(self, k) for k in ("method", "makespan_s", "lower_bound_s", "ratio_to_lower_bound",
                "ratio_to_critical_path", "assign_time_s", "estimated_makespan_s", "feasible", "resident_bytes",
                "peak_memory_bytes", "memory_budget_bytes", "memory_overruns")}  # fmt: skip


def score(graph: DataflowGraph, cluster: Any, a: Assignment, lower_bound_s: float, method: str | None = None,
          memory_fraction: float = DEFAULT_MEMORY_FRACTION) -> CompareRow:  # fmt: skip
    """A :class:`CompareRow` of assignment ``a`` (named ``method``, default ``a.method``), simulated, its memory
    against the budget of ``memory_fraction``."""
    from doppler.report import memory_overruns
    from doppler.sim import traced

    result = traced(graph, cluster, a)
    chk = memory.check(graph, cluster, result.resident_bytes, result.peak_memory_bytes, memory_fraction)
    budget = [None if math.isinf(b) else float(b) for b in chk.memory_budget_bytes]
    return CompareRow(method=method or a.method, makespan_s=float(result.makespan_s), lower_bound_s=lower_bound_s,
                      peak_memory_bytes=chk.peak_memory_bytes.tolist(), resident_bytes=chk.resident_bytes.tolist(),
                      memory_budget_bytes=budget, feasible=chk.feasible, memory_overruns=memory_overruns(chk),
                      assign_time_s=a.assign_time_s, estimated_makespan_s=a.estimated_makespan_s, assignment=a)  # fmt: skip


def compare(
    graph: DataflowGraph,
    cluster: Any,
    methods: list[str],
    *,
    seed: int = 0,
    budget_s: float | None = None,
    on_progress: ProgressFn | None = None,
    method_options: dict[str, Any] | None = None,
    memory_fraction: float = DEFAULT_MEMORY_FRACTION,
    ignore_memory: bool = False,
) -> list[CompareRow]:
    """Run each method and score its assignment in the WC simulator: one :class:`CompareRow` per
    method, whose ``ratio_to_critical_path`` is against critical_path (run as the reference if not
    in ``methods``). Memory-aware methods place within the budget (unless ``ignore_memory``); a
    placement over it is kept, its row not ``feasible``; a graph no placement fits is a MethodError.
    ``on_progress`` gets a ``"compare"`` event before each method runs (done: the methods finished;
    ``stats["method"]``: the one starting). ``method_options[name]``: the options of one method, an
    instance of its options class or values by name (e.g. ``{"doppler": {"checkpoint": path}}``), each
    checked before any method runs.
    """
    from doppler.sim import lower_bound, simulate

    if not methods:
        raise MethodError("no methods to compare: give at least one method name")
    duplicated = sorted({m for m in methods if methods.count(m) > 1})
    if duplicated:
        raise MethodError(f"method(s) named more than once: {', '.join(duplicated)}")
    given = method_options or {}
    fraction = None if ignore_memory else memory_fraction
    reqs = [_Request(get_method(m), get_method(m).options_from(given.get(m)), seed, budget_s, None, fraction, False)
            for m in methods]  # fmt: skip
    check_budget(budget_s)
    check_seed(seed)
    cluster = resolve_cluster(cluster)
    lb = float(lower_bound(graph, cluster))
    rows: list[CompareRow] = []
    for i, req in enumerate(reqs):
        if on_progress is not None:
            on_progress(ProgressEvent("compare", i, len(methods), "methods", {"method": req.spec.name}))
        rows.append(score(graph, cluster, _assign(graph, cluster, req), lb, memory_fraction=memory_fraction))
    ref = next((r.makespan_s for r in rows if r.method == "critical_path"), None)
    if ref is None:
        if on_progress is not None:
            on_progress(ProgressEvent("compare", len(methods), len(methods), "methods", {"method": "critical_path"}))
        cp = _assign(graph, cluster, _Request(get_method("critical_path"), None, 0, None, None, fraction, False))
        ref = float(simulate(graph, cluster, cp).makespan_s)
    for r in rows:
        r.ratio_to_lower_bound = r.makespan_s / lb if lb > 0 else None
        r.ratio_to_critical_path = r.makespan_s / ref if ref > 0 else None
    return rows
