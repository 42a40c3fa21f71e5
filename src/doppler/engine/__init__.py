"""Real work-conserving execution of dataflow graphs: :func:`run` -> :class:`ExecutionResult`.

Two backends share one interface and one :class:`~doppler.engine.program.Program`:

* ``"local"`` (the default): one thread per device on this machine
  (:mod:`doppler.engine.local`), CPU devices running numpy kernels and making
  the copies into them, or CUDA devices running torch kernels with one more
  thread and copy stream per link (``device_type="cuda"``);
* ``"dask"``: a ``dask.distributed`` cluster, one single-threaded worker per
  device (:mod:`doppler.engine.dask_engine`), for graphs that outgrow one machine.

Both return the simulator's :class:`~doppler.sim.trace.Trace`, so Gantt charts,
critical paths and comparisons work on measured runs exactly as on simulated
ones. The engine never imports the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from doppler.ir.assignment import Assignment, as_devices, check_assignment
from doppler.engine.program import EngineError, Program, build_program
from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.util.io import check_seed
from doppler.sim.trace import Trace

__all__ = ["DEVICE_TYPES", "ENGINES", "EngineError", "ExecutionResult", "Program", "RunOptions", "build_program", "run"]

ENGINES = ("local", "dask")
#: what a local engine's devices are: CPU workers (numpy) or CUDA devices (torch on the GPU)
DEVICE_TYPES = ("cpu", "cuda")
#: the most devices a local run may use (one thread per device; on CUDA devices one more per ordered link)
MAX_LOCAL_DEVICES = 64
#: most repeats of one measurement (an accidental 10**7 would run for hours)
MAX_REPEATS = 10_000
DEFAULT_TIMEOUT_S = 600.0
#: the longest timeout accepted (a week; the platform's wait primitives overflow far beyond)
MAX_TIMEOUT_S = 7 * 24 * 3600.0


@dataclass
class ExecutionResult:
    """A measured execution: median makespan, every repeat, the median repeat's trace, the outputs."""

    makespan_s: float
    makespans_s: list[float]
    trace: Trace
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    engine: str = "local"
    num_devices: int = 1
    info: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: np.ndarray | None = None  # the median run's, per device, measured (None: not measured)

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "num_devices": self.num_devices,
            "makespan_s": self.makespan_s,
            "makespans_s": list(self.makespans_s),
            **self.info,
        }


def check_options(engine: str, num_devices: int, repeats: int, timeout_s: float, seed: int = 0,
                  device_type: str = "cpu") -> None:  # fmt: skip
    """Raise EngineError for an unknown engine or device type, or a bad device count, repeat count, timeout or seed."""
    if engine not in ENGINES:
        raise EngineError(f"unknown engine {engine!r} (known: {', '.join(ENGINES)})")
    if device_type not in DEVICE_TYPES:
        raise EngineError(f"unknown device type {device_type!r} (known: {', '.join(DEVICE_TYPES)})")
    if engine == "dask" and device_type != "cpu":
        raise EngineError("the dask engine runs CPU devices only; use the local engine for CUDA devices")
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) or not 1 <= num_devices:
        raise EngineError(f"the number of devices must be an integer >= 1, got {num_devices!r}")
    if engine == "local" and num_devices > MAX_LOCAL_DEVICES:
        raise EngineError(f"the local engine runs at most {MAX_LOCAL_DEVICES} devices, got {num_devices}")
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or not 1 <= repeats <= MAX_REPEATS:
        raise EngineError(f"repeats must be an integer from 1 to {MAX_REPEATS}, got {repeats!r}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and 0 < timeout_s <= MAX_TIMEOUT_S):
        raise EngineError(f"timeout_s must be a number > 0 and <= {MAX_TIMEOUT_S:g} (a week), got {timeout_s!r}")
    check_seed(seed, EngineError)


#: the largest time_scale: a cost-only graph's kernels last this many times the cluster's op times
MAX_TIME_SCALE = 1e6


def check_time_scale(time_scale: float) -> None:
    """``time_scale`` (the synthetic kernels' length over the cluster's op times) is a number in (0, 1e6]."""
    ok = isinstance(time_scale, (int, float, np.integer, np.floating)) and not isinstance(time_scale, bool)
    if not (ok and math.isfinite(time_scale) and 0 < time_scale <= MAX_TIME_SCALE):
        raise EngineError(f"--time-scale must be a number in (0, {MAX_TIME_SCALE:g}], got {time_scale!r}")


@dataclass(frozen=True)
class RunOptions:
    """How :func:`run` measures: on which ``engine`` (``local`` or ``dask``) and ``device_type`` (``cpu`` or
    ``cuda``: the local engine; with more devices than GPUs each GPU is split into logical devices with their own
    streams), at which Dask ``scheduler`` (its address; None: a LocalCluster on 127.0.0.1), how many
    ``repeats`` (the makespan is their median) after how many ``warmup`` runs (not kept: the first run of a
    process pays page faults and cold caches), each bounded by ``timeout_s``."""

    engine: str = "local"
    device_type: str = "cpu"
    scheduler: str | None = None
    repeats: int = 1
    warmup: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S

    def check(self, num_devices: int, seed: int = 0) -> None:
        """EngineError for an unknown engine or device type, or a bad device count, repeat or warm-up count,
        timeout or seed."""
        check_options(self.engine, num_devices, self.repeats, self.timeout_s, seed, self.device_type)
        w = self.warmup
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or not 0 <= w <= MAX_REPEATS:
            raise EngineError(f"warmup must be an integer from 0 to {MAX_REPEATS}, got {w!r}")


def run(
    graph: DataflowGraph,
    assignment: "Assignment | Sequence[int] | np.ndarray",
    *,
    options: RunOptions = RunOptions(),
    num_devices: int | None = None,
    program: Program | None = None,
    cluster: Cluster | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
    keep_outputs: bool = True,
) -> ExecutionResult:
    """Execute ``graph`` under ``assignment`` for real as ``options`` say; the makespan is the median of the repeats.

    ``num_devices`` defaults to one more than the largest device index used (or
    the cluster's device count). ``program`` reuses a prepared
    :class:`Program` (inputs already made); otherwise one is built from
    ``seed`` (real kernels) or ``cluster`` x ``time_scale`` (synthetic kernels
    for cost-only graphs). ``keep_outputs``: assemble the last run's outputs.
    """
    engine, device_type, scheduler = options.engine, options.device_type, options.scheduler
    repeats, warmup, timeout_s = options.repeats, options.warmup, options.timeout_s
    devices = as_devices(assignment)
    if num_devices is None:
        num_devices = cluster.num_devices if cluster is not None else int(devices.max(initial=0)) + 1
    options.check(num_devices, seed)
    check_time_scale(time_scale)
    if cluster is not None and num_devices != cluster.num_devices:
        raise EngineError(f"num_devices={num_devices} does not match cluster {cluster.name!r}, which has "
                          f"{cluster.num_devices} devices")  # fmt: skip
    devices = check_assignment(graph, devices, num_devices)
    if program is None:
        program = build_program(graph, cluster=cluster, time_scale=time_scale, seed=seed)
    elif program.graph is not graph:
        raise EngineError("the program was built for a different graph")
    if engine == "dask" and program.checkpoint is not None:
        raise EngineError("the dask engine does not read weights from a checkpoint (its workers would each need the "
                          "file); use the local engine")  # fmt: skip
    total = int(warmup) + repeats
    if engine == "local":
        from doppler.engine.local import make_devices, run_local

        hw = make_devices(device_type, int(num_devices))
        placed = program.place(devices, num_devices, hw)
        info: dict[str, Any] = {"device_type": device_type, "devices": hw.names()}
        runs = [run_local(placed, timeout_s=timeout_s, keep_values=keep_outputs and r == total - 1, devices=hw)
                for r in range(total)]  # fmt: skip
    else:
        from doppler.engine.dask_engine import run_dask

        placed = program.place(devices, num_devices)
        runs, info = run_dask(placed, repeats=total, timeout_s=timeout_s, scheduler=scheduler, keep_values=keep_outputs)
    runs = runs[int(warmup):]  # warm-up runs are not kept
    traces = [r.trace for r in runs]
    values = runs[-1].values
    makespans = [t.makespan_s for t in traces]
    order = np.argsort(makespans, kind="stable")
    median_run = int(order[(len(order) - 1) // 2])
    outputs: dict[str, np.ndarray] = {}
    if keep_outputs and values and not program.is_synthetic and graph.meta.get("outputs"):
        from doppler.workloads.references import assemble_outputs

        outputs = assemble_outputs(graph, values)
    return ExecutionResult(
        makespan_s=float(np.median(makespans)),
        makespans_s=[float(m) for m in makespans],
        trace=traces[median_run],
        outputs=outputs,
        engine=engine,
        num_devices=int(num_devices),
        info=info,
        peak_memory_bytes=runs[median_run].peak_memory_bytes,
    )
