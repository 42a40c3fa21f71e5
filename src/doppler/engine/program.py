"""What an engine runs: one callable per op and where its operands come from.

A :class:`Program` is built once per (graph, inputs) and is backend-neutral:
the local thread engine and the Dask engine both call ``program.kernel(v,
operands)``. Graphs with op specs run their real kernels (the numpy whitelist
of :mod:`doppler.ir.kernels`, on the real tile shapes); cost-only graphs (imported
text files, random graphs) run *synthetic* kernels: a GIL-free spin sized to the
op's compute time on a given cluster, writing an output buffer of the op's
``output_bytes`` so that transfers move real bytes.

:meth:`Program.place` resolves input tiles for one assignment: each op's input
tiles are copied into its device's memory before the clock starts. A model's own
weights (``build_program(checkpoint=..., weights=...)``) are tiles of a checkpoint,
each read from the file for each device that reads it when it is placed
(:mod:`doppler.engine.weights`).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import Cluster
from doppler.ir.kernels import DTYPE_BYTES, run_op, run_op_numpy
from doppler.sim.trace import Trace

__all__ = ["EngineError", "Operand", "PlacedProgram", "Program", "RunRecord", "build_program", "spin_rate_per_s", "synthetic_kernel", "synthetic_kernel_cuda"]

#: largest output buffer a synthetic op may allocate (bytes), so a cost-only graph cannot exhaust memory
MAX_SYNTHETIC_OUTPUT_BYTES = 1 << 30


class EngineError(RuntimeError):
    """A run failed (kernel error, timeout, dead worker) or cannot start; the message names the op and device."""


@dataclass(frozen=True)
class Operand:
    """One kernel operand: the output of op ``op`` (``op >= 0``), or input tile number ``tile``."""

    op: int = -1
    tile: int = -1


# ------------------------------------------------------------------ synthetic spin
@functools.cache
def _spin_fn() -> Callable[[int], float]:
    """A numba ``nogil`` busy loop of ``k`` dependent multiply-adds (real CPU work, no GIL held)."""
    import numba

    @numba.njit(nogil=True, cache=True)
    def spin(k: int) -> float:  # pragma: no cover - compiled
        x = 1.0
        for _ in range(k):
            x = x * 0.999999 + 1e-7
        return x

    spin(10)
    return spin


@functools.cache
def spin_rate_per_s() -> float:
    """Iterations per second of the synthetic spin on one core (measured once per process)."""
    spin = _spin_fn()
    k = 200_000
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        spin(k)
        best = min(best, time.perf_counter() - t0)
    return k / max(best, 1e-9)


#: the calling thread's run (a local engine's worker sets ``stop``, the event set when its run stops): a synthetic
#: kernel spins in slices of :data:`SPIN_SLICE_S` and returns early once it is set, so a run stopped at its
#: timeout leaves no thread spinning on
RUN_STATE = threading.local()
SPIN_SLICE_S = 0.01


def synthetic_kernel(seconds: float, nbytes: int, fill: int = 0) -> np.ndarray:
    """Spin ``seconds`` of real CPU work without the GIL (less if the calling thread's run stops:
    :data:`RUN_STATE`), then write and return ``nbytes`` fresh bytes."""
    if seconds > 0:
        rate, stop = spin_rate_per_s(), getattr(RUN_STATE, "stop", None)
        left = int(seconds * rate)
        step = left if stop is None else max(1, int(SPIN_SLICE_S * rate))
        while left > 0 and not (stop is not None and stop.is_set()):
            _spin_fn()(min(step, left))
            left -= step
    out = np.empty(int(nbytes), dtype=np.uint8)
    out.fill(int(fill) & 0xFF)
    return out


_CUDA_CYCLES_PER_S: dict[str, float] = {}


def cuda_sleep_rate(ops: Any) -> float:
    """GPU clock cycles per second of ``torch.cuda._sleep`` on ``ops.device`` (measured once per process).

    The rate is the median of several 20 ms sleeps after one to let the clock settle: the SM
    clock, which ``_sleep`` counts, changes with load, so synthetic GPU kernels are only as exact
    as the clock is steady."""
    key = str(ops.device)
    if key not in _CUDA_CYCLES_PER_S:
        torch = ops.torch
        rate, rates = 1.5e9, []
        for _ in range(6):
            cycles = int(0.02 * rate)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(ops.device):
                begin.record()
                torch.cuda._sleep(cycles)
                end.record()
            end.synchronize()
            rate = cycles / max(begin.elapsed_time(end) / 1e3, 1e-9)
            rates.append(rate)
        _CUDA_CYCLES_PER_S[key] = float(np.median(rates[1:]))
    return _CUDA_CYCLES_PER_S[key]


def synthetic_kernel_cuda(seconds: float, nbytes: int, fill: int, ops: Any) -> Any:
    """The GPU version: ``torch.cuda._sleep`` for ``seconds`` on the current stream, then a fresh filled buffer."""
    torch = ops.torch
    if seconds > 0:
        torch.cuda._sleep(int(seconds * cuda_sleep_rate(ops)))
    return torch.full((int(nbytes),), int(fill) & 0xFF, dtype=torch.uint8, device=ops.device)


# ------------------------------------------------------------------ the program
@dataclass
class Program:
    """Per-op kernels and operand sources of one graph (see the module docstring)."""

    graph: DataflowGraph
    operands: list[list[Operand]]  # per op, in kernel order
    tiles: list[Any]  # distinct input tiles: host arrays, or WeightTile slices of a checkpoint read when placed
    synthetic_s: np.ndarray | None  # float64[n, D]: synthetic durations, None for real kernels
    dtype: Any
    specs: list[dict[str, Any]] | None = None
    labels: list[str] = field(default_factory=list)
    #: input tiles already copied to a device that keeps them between runs ((tile, device set, device) -> copy)
    device_tiles: dict[tuple[int, int, int], Any] = field(default_factory=dict, repr=False)
    tile_inputs: list[str] = field(default_factory=list)  # the input tensor each tile is a slice of
    #: where the :class:`WeightTile` among ``tiles`` are read from (``--weights``)
    checkpoint: Any = None

    @property
    def num_ops(self) -> int:
        return self.graph.num_ops

    @property
    def is_synthetic(self) -> bool:
        return self.synthetic_s is not None

    def label(self, v: int) -> str:
        return self.labels[v]

    def kernel(self, v: int, device: int, arrays: Sequence[Any], ops: Any = None) -> Any:
        """Run op ``v``'s kernel on ``arrays`` (its operands, in order) and return a fresh output.

        ``ops``: a :class:`~doppler.ir.kernels.TorchOps` to run on torch tensors of its device; default numpy.
        """
        if self.specs is not None:
            if ops is None:
                return run_op_numpy(self.specs[v], arrays, label=self.labels[v], dtype=self.dtype)
            return run_op(self.specs[v], arrays, label=self.labels[v], dtype=self.dtype, xp=ops)
        seconds, nbytes = float(self.synthetic_s[v, device]), int(self.graph.output_bytes[v])  # type: ignore[index]
        if ops is None:
            return synthetic_kernel(seconds, nbytes, v)
        return synthetic_kernel_cuda(seconds, nbytes, v, ops)

    def output_template(self, v: int) -> tuple[tuple[int, ...], Any]:
        """(shape, dtype) of op ``v``'s output, for preallocated receive buffers."""
        if self.specs is not None:
            return tuple(int(s) for s in self.specs[v]["shape"]), self.dtype
        return (int(self.graph.output_bytes[v]),), np.uint8

    def place(self, devices: np.ndarray, num_devices: int, hw: Any = None) -> "PlacedProgram":
        """Copy every op's input tiles into its device's memory (once per (tile, device)).

        ``hw``: the engine's device set (its ``place(array, d)`` makes the copy); default host memory. A weight
        tile (:class:`WeightTile`) is read from the checkpoint for each device that reads
        it, and only its slice: the program keeps no host copy of it.
        """
        local: dict[tuple[int, int], Any] = {}
        per_op: list[list[np.ndarray | None]] = []
        for v, ops in enumerate(self.operands):
            d = int(devices[v])
            for t in [o.tile for o in ops if o.tile >= 0]:
                if (t, d) in local:
                    continue
                if hw is not None and hw.keeps_inputs:  # read-only: one upload per program and device
                    if (t, id(hw), d) not in self.device_tiles:
                        self.device_tiles[(t, id(hw), d)] = self._place_tile(t, d, hw)
                    local[(t, d)] = self.device_tiles[(t, id(hw), d)]
                else:
                    local[(t, d)] = self._place_tile(t, d, hw)
            per_op.append([local[(o.tile, d)] if o.tile >= 0 else None for o in ops])
        if self.checkpoint is not None:
            self.checkpoint.close()  # the memory maps: every tile is read out of them
        return PlacedProgram(self, np.asarray(devices, dtype=np.int64), num_devices, per_op)

    def _place_tile(self, t: int, d: int, hw: Any) -> Any:
        """Input tile ``t`` in device ``d``'s memory: a copy of a host tile, or a weight tile read from the
        checkpoint (a fresh array, handed to the device as it is)."""
        tile = self.tiles[t]
        if isinstance(tile, np.ndarray):
            return np.array(tile, copy=True) if hw is None else hw.place(tile, d)
        array = self.checkpoint.read(tile.key, tile.bounds, tile.dtype)
        return array if hw is None else hw.adopt(array, d)


@dataclass
class RunRecord:
    """One measured run, by either engine: its trace and the op outputs (one host array per op; empty
    when they were not kept)."""

    trace: "Trace"
    values: list[np.ndarray | None]
    peak_memory_bytes: np.ndarray | None = None  # per device, measured by the engine (None: not measured)


@dataclass
class PlacedProgram:
    """A program bound to one assignment: device-local input tiles and the transfers it needs."""

    program: Program
    devices: np.ndarray
    num_devices: int
    tile_operands: list[list[np.ndarray | None]]  # per op: the device-local tile, None where an op output goes

    def transfers(self) -> list[tuple[int, int]]:
        """(producer op, destination device) of every transfer, sorted (one per op and remote device)."""
        g, dev = self.program.graph, self.devices
        return sorted({(u, int(dev[v])) for u, v in zip(g.src.tolist(), g.dst.tolist()) if dev[u] != dev[v]})


@dataclass(frozen=True)
class WeightTile:
    """The slice of checkpoint tensor ``key`` that one graph input tile is: read when placed on a device."""

    input: str  # the graph input
    key: str  # the checkpoint's key for it (its state_dict key, the key it is saved under, or one tied to it)
    bounds: tuple[tuple[int, int], ...]  # [lo, hi) per axis of the stored tensor
    dtype: np.dtype  # what the tile is read into (the program's element type)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(hi - lo for lo, hi in self.bounds)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize



def _input_tiles(graph: DataflowGraph, inputs: dict[str, np.ndarray], dtype: Any,
                 weights: dict[str, str]) -> tuple[list[list[Operand]], list[Any], list[str]]:  # fmt: skip
    """Each op's operands: another op's output, which must be one of its predecessors (it arrives over an
    edge), or a tile of a named input tensor: a slice of an array of ``inputs``, or of a checkpoint tensor
    (``weights``: graph input -> checkpoint key) to be read when placed."""
    shapes = graph.meta.get("inputs") or {}
    tiles: list[Any] = []
    names: list[str] = []
    tile_ids: dict[tuple[str, str], int] = {}
    operands: list[list[Operand]] = []
    for v in range(graph.num_ops):
        spec = graph.specs[v]  # type: ignore[index]
        label = graph.op_label(v)
        if spec is None:
            raise EngineError(f"op {label} has no spec, so it cannot run (a graph needs specs on every op or none)")
        row: list[Operand] = []
        preds = None
        for ref in spec.get("inputs", []):
            if not isinstance(ref, dict) or ("op" in ref) == ("input" in ref):
                raise EngineError(f"op {label}: operand {ref!r} must name exactly one of an op or an input")
            if "op" in ref:
                preds = set(graph.predecessors(v).tolist()) if preds is None else preds
                u = ref["op"]
                if isinstance(u, bool) or not isinstance(u, (int, np.integer)) or int(u) not in preds:
                    raise EngineError(f"op {label}: operand op {u!r} is not one of its predecessors (an op's output "
                                      "reaches it only over an edge of the graph)")  # fmt: skip
                row.append(Operand(op=int(u)))
                continue
            name = ref.get("input")
            if name not in inputs and name not in weights:
                raise EngineError(f"op {label}: input tensor {name!r} was not provided")
            sl = ref.get("slice")
            key = (name, repr(sl))
            if key not in tile_ids:
                tile_ids[key] = len(tiles)
                if name in weights:
                    tiles.append(WeightTile(name, weights[name], _bounds(sl, shapes.get(name), label), np.dtype(dtype)))
                else:
                    full = inputs[name]
                    tile = full if sl is None else full[tuple(slice(int(lo), int(hi)) for lo, hi in sl)]
                    ids = (graph.meta.get("input_init", {}).get(name) or {}).get("init") == "index"
                    # token ids stay exact integers: float16 holds them only up to 2048
                    tiles.append(np.ascontiguousarray(tile, dtype=np.promote_types(dtype, np.float32) if ids else dtype))
                names.append(name)
            row.append(Operand(tile=tile_ids[key]))
        operands.append(row)
    return operands, tiles, names


def _bounds(sl: Any, shape: Any, label: str) -> tuple[tuple[int, int], ...]:
    """A weight tile's ``[lo, hi)`` per axis: its operand's ``slice``, or the whole input of ``shape``."""
    dims = [int(s) for s in shape or ()]
    if sl is None:
        return tuple((0, s) for s in dims)
    ok = (isinstance(sl, list) and len(sl) == len(dims)
          and all(isinstance(b, list) and len(b) == 2 and all(isinstance(x, int) for x in b) for b in sl)
          and all(0 <= lo < hi <= s for (lo, hi), s in zip(sl, dims)))  # fmt: skip
    if not ok:
        raise EngineError(f"op {label}: slice {sl!r} does not fit its input of shape {dims}")
    return tuple((int(lo), int(hi)) for lo, hi in sl)


def build_program(
    graph: DataflowGraph,
    *,
    inputs: dict[str, np.ndarray] | None = None,
    cluster: Cluster | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
    dtype: Any = None,
    checkpoint: Any = None,
    weights: dict[str, str] | None = None,
) -> Program:
    """The :class:`Program` of ``graph``.

    With op specs: real kernels on ``inputs`` (default: ``references.make_inputs(graph, seed)``)
    in ``dtype`` (default: the graph's dtype). Without: synthetic kernels lasting
    ``time_scale x`` the op's compute time on ``cluster`` (required then).

    ``checkpoint`` and ``weights`` (graph input -> checkpoint key, :func:`doppler.engine.weights.bind`): those
    inputs are read from the checkpoint, tile by tile, when placed; ``inputs`` (default: drawn with ``seed``)
    then gives the others.
    """
    labels = [graph.op_label(v) for v in range(graph.num_ops)]
    if graph.specs is not None and any(s is not None for s in graph.specs):
        from doppler.workloads.references import make_inputs

        dtype = np.dtype(dtype or graph.meta.get("dtype", "float32"))
        if dtype.name not in DTYPE_BYTES:
            raise EngineError(f"dtype {dtype.name} is not one of {', '.join(DTYPE_BYTES)}")
        weights = dict(weights or {})
        if weights and checkpoint is None:
            raise EngineError("weights bound by name need the checkpoint they are read from")
        if inputs is None:
            rest = None if not weights else [n for n in graph.meta.get("inputs", {}) if n not in weights]
            inputs = make_inputs(graph, seed=seed, dtype=dtype, names=rest)
        operands, tiles, names = _input_tiles(graph, dict(inputs), dtype, weights)
        return Program(graph, operands, tiles, None, dtype, list(graph.specs), labels,  # type: ignore[arg-type]
                       tile_inputs=names, checkpoint=checkpoint if weights else None)  # fmt: skip
    if cluster is None:
        raise EngineError(
            f"graph {graph.name!r} has no op specs (a cost-only graph): give a cluster so that its synthetic kernels "
            "can be sized to each op's compute time"
        )
    if not (math.isfinite(time_scale) and time_scale >= 0):
        raise EngineError(f"time_scale must be a finite number >= 0, got {time_scale!r}")
    big = np.flatnonzero(graph.output_bytes > MAX_SYNTHETIC_OUTPUT_BYTES)
    if big.size:
        v = int(big[0])
        raise EngineError(
            f"op {labels[v]}: output of {graph.output_bytes[v]:.3g} bytes is over the synthetic-kernel limit of "
            f"{MAX_SYNTHETIC_OUTPUT_BYTES} bytes"
        )
    operands = [[Operand(op=int(u)) for u in graph.predecessors(v)] for v in range(graph.num_ops)]
    seconds = cluster.compute_time_s(graph) * float(time_scale)
    return Program(graph, operands, [], np.ascontiguousarray(seconds), np.uint8, None, labels)
