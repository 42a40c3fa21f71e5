"""The registry of placement methods and the one interface they share.

Every method is a function ``fn(graph, cluster, *, seed, budget_s, **kw)`` that returns an
:class:`~doppler.assignment.Assignment` (or a bare device array), registered under a name
with :func:`register`. :func:`assign` runs one by name: it validates the request, times the
call (``assign_time_s``), checks the result and stamps ``method`` and ``graph_fingerprint``.
:func:`compare` runs several and scores each in the simulator.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Union

import numpy as np

from doppler.assignment import Assignment, check_assignment
from doppler import io_util
from doppler.graph import DataflowGraph
from doppler.progress import ProgressEvent, ProgressFn


class MethodError(ValueError):
    """A method was asked for something it cannot do (unknown name, bad budget, too few devices, ...)."""


MethodFn = Callable[..., "Assignment | np.ndarray"]


#: a process that has not started numba (:mod:`doppler._jit`) runs one assignment of a graph of up to this
#: many ops as Python, by a method that allows it (``register(..., as_python=...)``): up to this size a
#: cheap method's Python run costs less than numba's import and start-up (benchmarks/cold_assign.py)
PYTHON_ASSIGN_MAX_OPS = 3000

#: ``as_python`` of a method: never, always (up to PYTHON_ASSIGN_MAX_OPS ops), or when a predicate of the
#: call's ``budget_s`` and keyword arguments holds
AsPython = Union[bool, Callable[..., bool]]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    fn: MethodFn
    description: str = ""
    min_devices: int = 1
    uses_budget: bool = False  # True: honours budget_s (others ignore it)
    deterministic: bool = True  # same inputs -> same assignment, whatever the seed
    as_python: AsPython = False  # one small call may run its kernels as Python (runs_as_python)
    python_max_work: int | None = None  # ... and only up to this many ops x devices (None: no limit of its own)


METHODS: dict[str, MethodSpec] = {}



def register(
    name: str,
    *,
    description: str = "",
    min_devices: int = 1,
    uses_budget: bool = False,
    deterministic: bool = True,
    as_python: AsPython = False,
    python_max_work: int | None = None,
) -> Callable[[MethodFn], MethodFn]:
    """Decorator: register ``fn(graph, cluster, *, seed, budget_s, **kw)`` under ``name``. ``as_python``:
    whether one call on a small graph may run as Python (:func:`runs_as_python`); ``python_max_work``:
    the most ops x devices for which it may (for a method whose Python cost grows with both)."""

    def deco(fn: MethodFn) -> MethodFn:
        doc = description or (fn.__doc__ or "").strip().split("\n")[0]
        METHODS[name] = MethodSpec(name, fn, doc, min_devices, uses_budget, deterministic, as_python, python_max_work)
        return fn

    return deco


def runs_as_python(graph: DataflowGraph, num_devices: int, method: str, budget_s: float | None = None,
                   **kw: Any) -> bool:  # fmt: skip
    """Whether one call of ``method`` on ``graph`` and a cluster of ``num_devices`` should run its kernels
    as Python (:func:`doppler._jit.as_python`) rather than start numba: the method allows it for this
    call, the graph has at most :data:`PYTHON_ASSIGN_MAX_OPS` ops (and ops x devices within the method's
    ``python_max_work``), and numba has not started in this process."""
    from doppler._jit import started

    spec = get_method(method)
    rule, max_work = spec.as_python, spec.python_max_work
    too_big = graph.num_ops > PYTHON_ASSIGN_MAX_OPS or (max_work is not None and graph.num_ops * num_devices > max_work)
    if rule is False or too_big or started():
        return False
    return rule is True or bool(rule(budget_s=budget_s, **kw))


def list_methods() -> list[str]:
    """Names of every registered method (built-in first, in registration order)."""
    return list(METHODS)


def get_method(name: str) -> MethodSpec:
    spec = METHODS.get(name)
    if spec is None:
        raise MethodError(f"unknown method {name!r} (known: {', '.join(list_methods())})")
    return spec


def check_budget(budget_s: float | None) -> None:
    if budget_s is None:
        return
    try:
        b = float(budget_s)
    except (TypeError, ValueError):
        raise MethodError(f"the time budget must be a number of seconds, got {budget_s!r}") from None
    if not math.isfinite(b) or b <= 0:
        raise MethodError(f"the time budget must be a positive number of seconds, got {budget_s!r}")


def check_seed(seed: Any) -> int:
    """A seed is an integer >= 0 (:func:`doppler.io_util.check_seed`); else a :class:`MethodError`."""
    return io_util.check_seed(seed, MethodError)


def assign(
    graph: DataflowGraph,
    cluster: Any,
    method: str = "critical_path",
    *,
    seed: int = 0,
    budget_s: float | None = None,
    **kw: Any,
) -> Assignment:
    """Run method ``method`` and return its :class:`Assignment`.

    ``seed`` makes randomised methods reproducible; ``budget_s`` is a wall-clock
    budget for search methods (others ignore it); further keyword arguments go to
    the method (e.g. ``max_evals`` for ``anneal``).
    """
    spec = get_method(method)
    if not isinstance(graph, DataflowGraph):
        raise MethodError(f"expected a DataflowGraph, got {type(graph).__name__} (a file: doppler.load_graph(path))")
    check_budget(budget_s)
    seed = check_seed(seed)
    if not hasattr(cluster, "num_devices"):  # a preset name or a cluster file, as on the CLI
        from doppler.presets import cluster as resolve_cluster

        cluster = resolve_cluster(cluster)
    from doppler.costs import CostModel

    cluster.check_times(graph, CostModel.build(graph, cluster).compute_s)  # finite op times, before any work
    d = int(cluster.num_devices)
    if d < spec.min_devices:
        raise MethodError(
            f"method {method!r} needs at least {spec.min_devices} devices, but cluster "
            f"{getattr(cluster, 'name', '?')!r} has {d}"
        )
    t0 = time.perf_counter()
    try:
        out = spec.fn(graph, cluster, seed=seed, budget_s=budget_s, **kw)
    except TypeError as e:
        unexpected = re.search(r"unexpected keyword argument '(\w+)'", str(e)) if kw else None
        if unexpected:  # (names the option the method refused, not the caller's other, internal ones)
            raise MethodError(f"method {method!r} does not accept the option {unexpected.group(1)!r}") from None
        raise
    elapsed = time.perf_counter() - t0
    if not isinstance(out, Assignment):
        out = Assignment(devices=np.asarray(out))
    out.devices = check_assignment(graph, out.devices, d)
    out.method = method
    out.assign_time_s = float(elapsed)
    out.graph_fingerprint = graph.fingerprint()
    return out



@dataclass
class CompareRow:
    """One method's line of :func:`compare`: its assignment scored in the simulator."""

    method: str
    makespan_s: float
    lower_bound_s: float
    peak_memory_bytes: list[float]  # per device
    memory_overruns: list[str]  # one phrase per device over its memory
    assign_time_s: float | None
    estimated_makespan_s: float | None
    assignment: Assignment
    ratio_to_lower_bound: float | None = None
    ratio_to_critical_path: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Every field but the assignment, in the order ``doppler compare --json`` prints them."""
        return {k: getattr(self, k) for k in ("method", "makespan_s", "lower_bound_s", "ratio_to_lower_bound",
                "ratio_to_critical_path", "assign_time_s", "estimated_makespan_s", "peak_memory_bytes",
                "memory_overruns")}  # fmt: skip


def score(graph: DataflowGraph, cluster: Any, a: Assignment, lower_bound_s: float, method: str | None = None) -> CompareRow:
    """A :class:`CompareRow` of assignment ``a`` (named ``method``, default ``a.method``), simulated."""
    from doppler.report import memory_overruns
    from doppler.sim import traced

    result = traced(graph, cluster, a)
    peak = result.peak_memory_bytes
    return CompareRow(method=method or a.method, makespan_s=float(result.makespan_s), lower_bound_s=lower_bound_s,
                      peak_memory_bytes=peak.tolist(), memory_overruns=memory_overruns(peak, cluster),
                      assign_time_s=a.assign_time_s, estimated_makespan_s=a.estimated_makespan_s, assignment=a)  # fmt: skip


def compare(
    graph: DataflowGraph,
    cluster: Any,
    methods: list[str],
    *,
    seed: int = 0,
    budget_s: float | None = None,
    on_progress: ProgressFn | None = None,
    method_kwargs: dict[str, dict[str, Any]] | None = None,
) -> list[CompareRow]:
    """Run each method and score its assignment in the WC simulator: one :class:`CompareRow` per
    method, whose ``ratio_to_critical_path`` is against critical_path (run as the reference if not
    in ``methods``). ``on_progress`` gets a ``"compare"`` event before each method runs (done: the
    methods finished; ``stats["method"]``: the one starting). ``method_kwargs[name]``: extra options of one method (e.g.
    ``{"doppler": {"checkpoint": path}}``).
    """
    from doppler.sim import lower_bound, simulate

    if not methods:
        raise MethodError("no methods to compare: give at least one method name")
    duplicated = sorted({m for m in methods if methods.count(m) > 1})
    if duplicated:
        raise MethodError(f"method(s) named more than once: {', '.join(duplicated)}")
    for m in methods:
        get_method(m)
    check_budget(budget_s)
    check_seed(seed)
    if not hasattr(cluster, "num_devices"):
        from doppler.presets import cluster as resolve_cluster

        cluster = resolve_cluster(cluster)
    lb = float(lower_bound(graph, cluster))
    rows: list[CompareRow] = []
    for i, m in enumerate(methods):
        if on_progress is not None:
            on_progress(ProgressEvent("compare", i, len(methods), "methods", {"method": m}))
        a = assign(graph, cluster, m, seed=seed, budget_s=budget_s, **(method_kwargs or {}).get(m, {}))
        rows.append(score(graph, cluster, a, lb))
    ref = next((r.makespan_s for r in rows if r.method == "critical_path"), None)
    if ref is None:
        if on_progress is not None:
            on_progress(ProgressEvent("compare", len(methods), len(methods), "methods", {"method": "critical_path"}))
        ref = float(simulate(graph, cluster, assign(graph, cluster, "critical_path")).makespan_s)
    for r in rows:
        r.ratio_to_lower_bound = r.makespan_s / lb if lb > 0 else None
        r.ratio_to_critical_path = r.makespan_s / ref if ref > 0 else None
    return rows
