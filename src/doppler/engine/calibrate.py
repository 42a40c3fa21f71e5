"""``doppler calibrate``: measure an engine's devices and links and write a :class:`Cluster`.

What is measured, and how (so that the simulator sees what a real run sees):

* **Kernels.** A calibration graph (:func:`calibration_graph`) holds every op
  kind our workloads produce (matmul, add, elementwise, softmax, norm, rotary,
  mask_fill, fill, select, reduce) at several sizes, built with the same tile
  builder as the workloads but belonging to none of them. It runs on the
  engine itself under several balanced random assignments, so every device is
  busy while it is measured, outputs are freshly allocated and written, and
  operands arrive by real transfers. Per device and op kind we fit
  ``time = a + flops / rate`` by non-negative least squares on relative error
  (every op counts as much as every other, whatever its size).
* **Dispatch.** The engine's own per-op cost between kernels (waking a worker,
  the Python glue) is the median gap ``start - max(ready, previous end on the
  device)``; it is added to every kind's fixed time ``a``.
* **Links.** Per ordered device pair, ``copy time = latency + bytes /
  bandwidth`` fitted on the run's real transfers (outputs of many sizes),
  plus the median hand-off delay from the producer's finish to the copy's
  start when whatever makes the copy was idle: the link, or on CPU devices,
  which make their inbound copies themselves (``copies_inbound``), the
  receiving device. There, a previous item on a device is an op or a copy.
* **Memory** (CPU devices of the local engine): each device's ``memory_bandwidth_Bps``, from STREAM's
  copy (``a = b``) and add (``a = b + c``) kernels in numpy on float64 arrays of ``stream_bytes`` each,
  run on every device's thread at once, each pinned and limited to one BLAS thread as the engine's
  workers are. Bytes count as STREAM counts them (2 and 3 arrays per element); a kernel's rate is its
  median over the repeats, and the device's bandwidth is its faster kernel's. With it each device is a
  *measured* device (:mod:`doppler.hardware.cluster`): no op reads its weights faster than this bandwidth.
* **Weights** (the same devices): the calibration graph's operands are placed just before each run, in
  cache; a model's weights and tables are not. A second graph (:func:`memory_graph`) holds copies of table
  tiles (``formation`` ops, no FLOPs), ``WEIGHT_ARRAYS x stream_bytes`` of inputs per device in all (past the
  cache as STREAM's arrays are), each tile read once per run, run as the calibration graph is. Per device:
  ``time = a + bytes read / B``; ``B`` is the device's ``weight_read_Bps_by_kind["formation"]`` (none where
  no time per byte is measured). Products of few rows by weight tiles took no longer than the fit on
  square tiles predicts, so they are not measured (docs/research/cpu_roofline.md).

The result is a cluster JSON (``overhead_s_by_kind``, ``flops_per_s_by_kind``, ``memory_bandwidth_Bps``,
``weight_read_Bps_by_kind``, per-pair links) that ``doppler simulate``/``validate`` load like any preset.
"""

from __future__ import annotations

import datetime
import functools
import platform
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Sequence

import numpy as np
from scipy.optimize import nnls

from doppler.engine import MAX_REPEATS, RunOptions, check_options, run
from doppler.engine.program import EngineError, build_program
from doppler.ir.graph import DataflowGraph, OpKind
from doppler.util.progress import ProgressEvent, ProgressFn
from doppler.hardware.cluster import Cluster, Device
from doppler.hardware.traffic import op_traffic
from doppler.sim.trace import Trace

__all__ = ["CalibrationResult", "calibrate", "calibration_graph", "fit_cluster", "measure_memory_bandwidth", "memory_graph"]

#: default matrix sizes of the calibration graph (each op kind at each size, tiled 2x2)
DEFAULT_SIZES = (128, 256, 512, 1024)
#: the largest matrix size (``--sizes``): ten 4096 x 4096 float32 matrices hold 640 MB
MAX_SIZE = 4096
#: bytes of each array of the memory measurement (three per device): past most CPUs' last-level cache
DEFAULT_STREAM_BYTES = 128 * 2**20
#: the bounds of ``stream_bytes`` (``--stream-bytes``): three arrays of at most 1 GiB per device
MIN_STREAM_BYTES, MAX_STREAM_BYTES = 2**16, 2**30
#: times each memory kernel runs on each device (the rate is their median)
STREAM_REPEATS = 5
#: the memory graph's weights per device, in arrays of ``stream_bytes`` (as far past the cache as STREAM's)
WEIGHT_ARRAYS = 2
#: the most tiles of one group of the memory graph (its ops per run: at most 5 x this per size)
MAX_MEMORY_TILES = 128


def _check_sizes(sizes: Sequence[int]) -> list[int]:
    out = [int(n) for n in sizes]
    for n in out:
        if n < 4 or n % 4 or n > MAX_SIZE:
            raise EngineError(f"calibration size {n} must be a multiple of 4 from 4 to {MAX_SIZE}")
    return out


def calibration_graph(sizes: Sequence[int] = DEFAULT_SIZES, dtype: str = "float32") -> DataflowGraph:
    """Every op kind of our workloads at each size ``n`` (``n x n`` tensors cut in 2 x 2 tiles)."""
    from doppler.workloads.tiling import TileBuilder, tiled_rmsnorm, tiled_softmax

    b = TileBuilder("calibration", dtype)
    for n in _check_sizes(sizes):
        A = b.input(f"A{n}", (n, n), (2, 2))
        B = b.input(f"B{n}", (n, n), (2, 2))
        w = b.input(f"w{n}", (n,), (2,), {"init": "norm_weight"})
        cos = b.input(f"cos{n}", (n, n), (2, 2), {"init": "rope_cos", "theta": 10000.0})
        sin = b.input(f"sin{n}", (n, n), (2, 2), {"init": "rope_sin", "theta": 10000.0})
        C = b.contract("ik,kj->ij", A, B, name=f"matmul{n}")
        b.map("relu", "ij->ij", C, name=f"relu{n}")
        b.map("silu_mul", "ij,ij->ij", A, B, name=f"silu{n}")
        b.map("add", "ij,ij->ij", A, B, name=f"add{n}")
        tiled_softmax(b, A, "ij", "j", scale=0.5, name=f"softmax{n}")
        tiled_rmsnorm(b, B, w, eps=1e-6, name=f"norm{n}", rows="i")
        b.map("rotary", "ij,ij,ij->ij", A, cos, sin, name=f"rotary{n}", kind=OpKind.ROTARY)
        b.map("causal_mask", "ij->ij", B, name=f"mask{n}", kind=OpKind.MASK_FILL,
              tile_params=lambda off: {"row_offset": off["i"], "col_offset": off["j"]})  # fmt: skip
        M = b.fill("causal_mask", "ij", (n, n), (2, 2), name=f"fill{n}", kind=OpKind.MASK_FILL,
                   tile_params=lambda off: {"row_offset": off["i"], "col_offset": off["j"]})  # fmt: skip
        b.map("add", "ij,ij->ij", C, M, name=f"maskadd{n}", kind=OpKind.MASK_FILL)
        b.select(A, [None, (0, n // 4)], name=f"select{n}")
        b.reduce("ij->i", B, how="sum", name=f"reduce{n}")
        b.output(f"out{n}", C)
    return b.finish("calibration", {"sizes": [int(s) for s in sizes], "dtype": dtype})


def memory_graph(weight_bytes: int, sizes: Sequence[int] = DEFAULT_SIZES, dtype: str = "float32") -> DataflowGraph:
    """Ops that read graph inputs of about ``weight_bytes`` in all, each tile once per run: past the cache, as
    a model's weights and tables are.

    For each size ``n`` of ``sizes`` from 256 up (the largest if none is): ``T`` copies of ``n x n`` tiles of a
    table (``formation`` ops, as a model's re-tiling copies). Every table holds an equal share of
    ``weight_bytes`` (``T`` from 2 to :data:`MAX_MEMORY_TILES`)."""
    from doppler.ir.kernels import DTYPE_BYTES
    from doppler.workloads.tiling import TileBuilder

    sizes = _check_sizes(sizes)
    if isinstance(weight_bytes, bool) or not isinstance(weight_bytes, (int, np.integer)) or weight_bytes <= 0:
        raise EngineError(f"weight_bytes must be an integer > 0, got {weight_bytes!r}")
    b = TileBuilder("calibration_memory", dtype)
    big = [n for n in sizes if n >= 256] or [max(sizes)]
    itemsize = DTYPE_BYTES[dtype]
    for n in big:
        tiles = min(max(2, round(weight_bytes / len(big) / (n * n * itemsize))), MAX_MEMORY_TILES)
        table = b.input(f"table{n}", (tiles * n, n), (tiles, 1))
        b.blockwise(f"copy{n}", OpKind.FORMATION, "assemble", (tiles * n, n), (tiles, 1),
                    lambda blk, t=table: [dict(t.tiles[blk])], lambda blk, n=n: {"at": [[[0, n], [0, n]]]})  # fmt: skip
    return b.finish("calibration_memory", {"sizes": big, "dtype": dtype, "weight_bytes": int(weight_bytes)})


@dataclass
class CalibrationResult:
    """The fitted cluster and the fit's quality per (device, kind) and per link; ``traces`` and ``memory_traces``:
    the measured runs of the calibration graph and of the memory graph (none where not run)."""

    cluster: Cluster
    kernel_fits: list[dict[str, Any]] = field(default_factory=list)
    link_fits: list[dict[str, Any]] = field(default_factory=list)
    dispatch_s: float = 0.0
    runs: int = 0
    memory_fits: list[dict[str, Any]] = field(default_factory=list)
    traces: list[Trace] = field(default_factory=list, repr=False)
    memory_traces: list[Trace] = field(default_factory=list, repr=False)


def _physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the system does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def _check_stream_bytes(stream_bytes: Any) -> None:
    if isinstance(stream_bytes, bool) or not isinstance(stream_bytes, int) or \
            not MIN_STREAM_BYTES <= stream_bytes <= MAX_STREAM_BYTES:  # fmt: skip
        raise EngineError(f"stream_bytes must be an integer from {MIN_STREAM_BYTES:,} to {MAX_STREAM_BYTES:,}, "
                          f"got {stream_bytes!r}")  # fmt: skip


def measure_memory_bandwidth(num_devices: int, stream_bytes: int = DEFAULT_STREAM_BYTES,
                             repeats: int = STREAM_REPEATS) -> list[dict[str, Any]]:  # fmt: skip
    """Per CPU device of the local engine: ``{"device", "copy_Bps", "add_Bps", "bandwidth_Bps"}``, the
    bytes/s of STREAM's copy and add kernels on arrays of ``stream_bytes`` (module docstring), measured
    on ``num_devices`` threads at once, each set up as the engine's worker of that device."""
    import threading
    import time

    from threadpoolctl import threadpool_limits

    from doppler.engine.local import HostDevices

    _check_stream_bytes(stream_bytes)
    total = 3 * stream_bytes * num_devices
    physical = _physical_memory_bytes()
    if physical is not None and total > physical / 2:
        raise EngineError(f"the memory measurement would hold 3 arrays of {stream_bytes:,} bytes on each of {num_devices} "
                          f"devices ({total:,} bytes), over half of this machine's {physical:,}: give a smaller "
                          "--stream-bytes")  # fmt: skip
    host = HostDevices(num_devices)
    n = stream_bytes // 8
    kernels = (("copy", 2, lambda a, b, c: np.copyto(a, b)), ("add", 3, lambda a, b, c: np.add(b, c, out=a)))
    barrier = threading.Barrier(num_devices)
    seconds = np.zeros((num_devices, len(kernels), repeats))
    failed: list[BaseException] = []

    def worker(d: int) -> None:
        try:
            host.bind_thread(d)
            a, b, c = np.full(n, 0.0), np.ones(n), np.ones(n)  # all written (np.zeros is lazy): no faults timed
            for k, (_, _, kernel) in enumerate(kernels):
                for r in range(repeats):
                    barrier.wait()  # every device streams at once, as in a run
                    t0 = time.perf_counter()
                    kernel(a, b, c)
                    seconds[d, k, r] = time.perf_counter() - t0
        except BaseException as e:  # noqa: BLE001 (reported below, in the calling thread)
            failed.append(e)
            barrier.abort()

    with threadpool_limits(limits=1):
        threads = [threading.Thread(target=worker, args=(d,), name=f"doppler-stream{d}", daemon=True)
                   for d in range(num_devices)]  # fmt: skip
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if failed:
        err = next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), failed[0])
        if isinstance(err, MemoryError):
            raise EngineError(f"the memory measurement could not allocate 3 arrays of {stream_bytes:,} bytes on each "
                              f"of {num_devices} devices (give a smaller --stream-bytes)") from None  # fmt: skip
        raise err
    fits = []
    for d in range(num_devices):
        rates = {name: per_element * n * 8 / max(float(np.median(seconds[d, k])), 1e-9)
                 for k, (name, per_element, _) in enumerate(kernels)}  # fmt: skip
        fits.append({"device": d, "copy_Bps": rates["copy"], "add_Bps": rates["add"],
                     "bandwidth_Bps": max(rates.values())})  # fmt: skip
    return fits


def _fit_affine(x: np.ndarray, t: np.ndarray) -> tuple[float, float, float]:
    """(a, b, median relative error) of ``t ~ a + b x`` with a, b >= 0, fitted on relative error."""
    A = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
    coef, _ = nnls(A, np.ones_like(t))
    a, b = float(coef[0]), float(coef[1])
    pred = a + b * x
    return a, b, float(np.median(np.abs(pred - t) / t))


def _waits(ready: np.ndarray, start: np.ndarray, end: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per item: (start - max(ready, end of the previous item of its group), was the group idle at ready?).

    A group (a device, a link) runs its items one at a time; "previous" is by start time."""
    wait = np.empty(len(start))
    idle = np.empty(len(start), dtype=bool)
    for grp in np.unique(groups):
        ks = np.flatnonzero(groups == grp)
        ks = ks[np.argsort(start[ks], kind="stable")]
        prev_end = np.concatenate([[-np.inf], end[ks[:-1]]])
        wait[ks] = start[ks] - np.maximum(ready[ks], np.maximum(prev_end, 0.0))
        idle[ks] = prev_end <= ready[ks]
    return wait, idle


def _device_items(trace: Trace, copies_inbound: bool) -> tuple[np.ndarray, ...]:
    """(ready, start, end, device, is_copy) of what each device runs: its ops, and with
    ``copies_inbound`` the copies into it (ready when their producer finished)."""
    n, T = trace.num_ops, trace.num_transfers if copies_inbound else 0
    ready = np.concatenate([trace.op_ready, trace.op_end[trace.tr_src_op][:T]])
    start = np.concatenate([trace.op_start, trace.tr_start[:T]])
    end = np.concatenate([trace.op_end, trace.tr_end[:T]])
    device = np.concatenate([trace.op_device, trace.tr_dst_device[:T]])
    return ready, start, end, device, np.arange(n + T) >= n


def _dispatch_gaps(trace: Trace, copies_inbound: bool = False) -> np.ndarray:
    """Per op: start - max(ready, end of the previous op or inbound copy on its device)."""
    ready, start, end, device, is_copy = _device_items(trace, copies_inbound)
    return _waits(ready, start, end, device)[0][~is_copy]


def _handoff_delays(trace: Trace, copies_inbound: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per transfer whose maker (its link; with ``copies_inbound``, its receiving device) was idle
    when it was requested: (src device, dst device, copy start - producer end)."""
    src_end = trace.op_end[trace.tr_src_op]
    if copies_inbound:
        ready, start, end, device, is_copy = _device_items(trace, True)
        keep = _waits(ready, start, end, device)[1][is_copy]
    else:
        link = trace.tr_src_device * (int(trace.tr_dst_device.max(initial=0)) + 1) + trace.tr_dst_device
        keep = _waits(src_end, trace.tr_start, trace.tr_end, link)[1]
    return trace.tr_src_device[keep], trace.tr_dst_device[keep], (trace.tr_start - src_end)[keep]


def _per_op(graph: DataflowGraph, traces: Sequence[Trace]) -> tuple[np.ndarray, ...]:
    """Every op of every run of ``graph``: (device, duration, FLOPs, kind code)."""
    dev = np.concatenate([t.op_device for t in traces])
    dur = np.maximum(np.concatenate([t.op_end - t.op_start for t in traces]), 1e-7)
    return dev, dur, np.tile(graph.flops, len(traces)), np.tile(graph.kind.astype(np.int64), len(traces))


def _kinds_on(dev: np.ndarray, kinds: np.ndarray, d: int) -> Iterator[tuple[str, np.ndarray]]:
    """(kind label, mask of its ops on device ``d``) for each kind with at least 2 ops there (enough to fit)."""
    for k in np.unique(kinds):
        sel = (dev == d) & (kinds == k)
        if sel.sum() >= 2:
            yield OpKind(int(k)).label, sel


def _fit_weight_reads(graph: DataflowGraph, traces: Sequence[Trace], d: int, rates: dict[str, float],
                      overheads: dict[str, float], dispatch: float) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Device ``d``'s read rate per kind of :func:`memory_graph` ``graph`` (copies: no FLOPs), from its measured
    ``traces`` (module docstring), and one fit row per kind. Each kind is added to ``rates`` (no FLOPs) and
    ``overheads`` (its fitted fixed time plus ``dispatch``)."""
    dev, dur, _, kinds = _per_op(graph, traces)
    read = np.tile(op_traffic(graph).input_bytes, len(traces))
    weight_rates: dict[str, float] = {}
    fits: list[dict[str, Any]] = []
    for label, sel in _kinds_on(dev, kinds, d):
        t, nbytes = dur[sel], read[sel]
        # a fixed time and the bytes (all bytes, where every op reads as many)
        a, inv_bytes, _ = _fit_affine(nbytes, t) if np.ptp(nbytes) > 0 else (0.0, float(np.median(t / nbytes)), 0.0)
        rates[label], overheads[label] = 1e30, a + dispatch
        pred = a + nbytes * inv_bytes
        if inv_bytes > 0:
            weight_rates[label] = 1.0 / inv_bytes
        fits.append({"device": d, "kind": label, "n": int(sel.sum()), "overhead_s": a, "flops_per_s": rates[label],
                     "median_rel_error": float(np.median(np.abs(pred - t) / t)), "section": "memory",
                     "weight_read_Bps": weight_rates.get(label)})  # fmt: skip
    return weight_rates, fits


def fit_cluster(graph: DataflowGraph, traces: Sequence[Trace], num_devices: int, *, name: str = "calibrated",
                meta: dict[str, Any] | None = None, device_kind: str = "cpu",
                copies_inbound: bool = False, memory_bytes: float | None = None,
                memory_bandwidth_Bps: Sequence[float] | None = None,
                memory: tuple[DataflowGraph, Sequence[Trace]] | None = None) -> CalibrationResult:  # fmt: skip
    """Fit a :class:`Cluster` to measured traces of ``graph`` (see the module docstring).

    ``device_kind`` (``"cpu"`` or ``"gpu"``) names the devices ``cpu0``... or ``gpu0``...;
    ``copies_inbound``: the engine's devices made the copies into them (CPU workers); ``memory_bytes``: each
    device's memory (None: unlimited), which no run measures (CPU workers share the host's memory);
    ``memory_bandwidth_Bps``: each device's measured memory bandwidth (None: plain devices, bytes cost nothing);
    ``memory``: a :func:`memory_graph` and its measured traces, from which each kind it holds gets its
    ``weight_read_Bps_by_kind`` (with ``memory_bandwidth_Bps``)."""
    if not traces:
        raise EngineError("calibration needs at least one measured run")
    dev, dur, flops, kinds = _per_op(graph, traces)
    gaps = np.concatenate([_dispatch_gaps(t, copies_inbound) for t in traces])
    if gaps.size == 0:
        raise EngineError("calibration measured no ops, so no dispatch gaps")
    dispatch = float(np.median(gaps))
    devices: list[Device] = []
    kernel_fits: list[dict[str, Any]] = []
    for d in range(num_devices):
        rates: dict[str, float] = {}
        overheads: dict[str, float] = {}
        for label, sel in _kinds_on(dev, kinds, d):
            x, t = flops[sel], dur[sel]
            if np.ptp(x) > 0:
                a, inv_rate, err = _fit_affine(x, t)
            else:
                a, inv_rate, err = float(np.median(t)), 0.0, float(np.median(np.abs(t - np.median(t)) / t))
            rates[label] = min(1.0 / inv_rate, 1e30) if inv_rate > 0 else 1e30  # no FLOPs (select): all overhead
            overheads[label] = a + dispatch
            kernel_fits.append({"device": d, "kind": label, "n": int(sel.sum()), "overhead_s": a,
                                "flops_per_s": rates[label], "median_rel_error": err})  # fmt: skip
        weight_rates: dict[str, float] = {}
        if memory is not None:
            weight_rates, fits = _fit_weight_reads(*memory, d, rates, overheads, dispatch)
            kernel_fits += fits
        mm = rates.get("matmul", max(rates.values()) if rates else 1e9)
        devices.append(
            Device(name=f"{device_kind}{d}", kind=device_kind, flops_per_s=mm, flops_per_s_by_kind=rates,
                   overhead_s=dispatch, overhead_s_by_kind=overheads, copies_inbound=copies_inbound,
                   memory_bytes=float("inf") if memory_bytes is None else float(memory_bytes),
                   memory_bandwidth_Bps=None if memory_bandwidth_Bps is None else float(memory_bandwidth_Bps[d]),
                   weight_read_Bps_by_kind=weight_rates if memory_bandwidth_Bps is not None else {})  # fmt: skip
        )
    bw = np.full((num_devices, num_devices), np.inf)
    lat = np.zeros((num_devices, num_devices))
    tr_src = np.concatenate([t.tr_src_device for t in traces])
    tr_dst = np.concatenate([t.tr_dst_device for t in traces])
    tr_bytes = np.concatenate([t.tr_bytes for t in traces])
    tr_dur = np.maximum(np.concatenate([t.tr_end - t.tr_start for t in traces]), 1e-7)
    h_src, h_dst, h_del = (np.concatenate(h) for h in zip(*[_handoff_delays(t, copies_inbound) for t in traces]))
    link_fits: list[dict[str, Any]] = []
    all_pairs = [(a, b) for a in range(num_devices) for b in range(num_devices) if a != b]
    for a, b in all_pairs:
        sel = (tr_src == a) & (tr_dst == b)
        if sel.sum() < 2 or np.ptp(tr_bytes[sel]) == 0:
            continue
        l0, inv_bw, err = _fit_affine(tr_bytes[sel], tr_dur[sel])
        hsel = (h_src == a) & (h_dst == b)
        handoff = float(np.median(h_del[hsel])) if hsel.any() else 0.0
        bw[a, b] = 1.0 / inv_bw if inv_bw > 0 else 1e15
        lat[a, b] = l0 + max(handoff, 0.0)
        link_fits.append({"src": a, "dst": b, "n": int(sel.sum()), "latency_s": lat[a, b], "bandwidth_Bps": bw[a, b],
                          "handoff_s": handoff, "median_rel_error": err})  # fmt: skip
    fitted = [(a, b) for a, b in all_pairs if np.isfinite(bw[a, b])]
    if num_devices > 1 and not fitted:
        raise EngineError("calibration saw no transfers to fit the links from (use at least 2 devices)")
    for a, b in all_pairs:  # a pair never exercised gets the mean of the others
        if not np.isfinite(bw[a, b]):
            bw[a, b] = float(np.mean([bw[p] for p in fitted]))
            lat[a, b] = float(np.mean([lat[p] for p in fitted]))
    cluster = Cluster(name=name, devices=devices, bandwidth_Bps=bw, latency_s=lat, meta=dict(meta or {}))
    return CalibrationResult(cluster, kernel_fits, link_fits, dispatch, len(traces))


def calibrate(
    num_devices: int,
    *,
    options: RunOptions | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    runs: int = 4,
    seed: int = 0,
    progress: ProgressFn | None = None,
    memory_bytes: float | None = None,
    stream_bytes: int = DEFAULT_STREAM_BYTES,
) -> CalibrationResult:
    """Run the calibration graph ``runs`` times under balanced random assignments (on the engine and device type
    ``options`` name; None: the local engine's CPU devices; its repeats and warm-up are calibrate's own) and fit a
    cluster whose
    devices have ``memory_bytes`` each (None: unlimited); on the local engine's CPU devices, measure each
    device's memory bandwidth on arrays of ``stream_bytes`` and its weight-read rates on :func:`memory_graph` too
    (module docstring)."""
    from doppler.engine.local import DEVICE_SETS

    options = RunOptions() if options is None else replace(options, repeats=1, warmup=0)
    engine, device_type = options.engine, options.device_type
    check_options(engine, num_devices, 1, options.timeout_s, seed, device_type)
    if isinstance(runs, bool) or not isinstance(runs, int) or not 1 <= runs <= MAX_REPEATS:
        raise EngineError(f"runs must be an integer from 1 to {MAX_REPEATS}, got {runs!r}")
    graph = calibration_graph(sizes)
    measures_memory = engine == "local" and device_type == "cpu"
    graphs = [graph]
    if measures_memory:
        _check_stream_bytes(stream_bytes)
        weight_bytes = WEIGHT_ARRAYS * stream_bytes * num_devices
        physical = _physical_memory_bytes()
        if physical is not None and 2 * weight_bytes > physical / 2:  # its inputs, and their copies on the devices
            raise EngineError(f"the weights of the memory graph ({weight_bytes:,} bytes, {WEIGHT_ARRAYS} x --stream-bytes "
                              f"per device) and their copies would take over half of this machine's {physical:,} "
                              "bytes: give a smaller --stream-bytes")  # fmt: skip
        graphs.append(memory_graph(weight_bytes, sizes))
    memory_fits = measure_memory_bandwidth(num_devices, stream_bytes) if measures_memory else []
    rng = np.random.default_rng(seed)
    measured: list[list[Trace]] = []
    for g in graphs:
        run_on = functools.partial(run, g, options=options, num_devices=num_devices, program=build_program(g, seed=seed),
                                   keep_outputs=False)  # fmt: skip
        run_on(np.arange(g.num_ops) % num_devices)  # warm-up (page faults, caches), not kept
        measured.append([])
        for r in range(runs):
            measured[-1].append(run_on(rng.permutation(np.arange(g.num_ops) % num_devices)).trace)
            if progress is not None:
                progress(ProgressEvent("calibrate", len(measured[:-1]) * runs + r + 1, runs * len(graphs), "runs"))
    traces = measured[0]
    meta = {
        "source": f"doppler calibrate --engine {engine} --devices {num_devices} --device-type {device_type}",
        "engine": engine,
        "device_type": device_type,
        "calibrated_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.platform(),
        "sizes": [int(s) for s in sizes],
        "runs": int(runs),
    }
    if measures_memory:
        meta["stream_bytes"] = int(stream_bytes)
    name = f"{engine}-{device_type}{num_devices}-calibrated"
    copies = engine == "local" and DEVICE_SETS[device_type].copies_inbound
    res = fit_cluster(graph, traces, num_devices, name=name, meta=meta, device_kind="gpu" if device_type == "cuda" else "cpu",
                      copies_inbound=copies, memory_bytes=memory_bytes,
                      memory_bandwidth_Bps=[f["bandwidth_Bps"] for f in memory_fits] if memory_fits else None,
                      memory=(graphs[1], measured[1]) if measures_memory else None)  # fmt: skip
    res.cluster.meta["dispatch_s"] = res.dispatch_s
    res.memory_fits = memory_fits
    res.traces, res.memory_traces = measured[0], measured[1] if measures_memory else []
    return res
