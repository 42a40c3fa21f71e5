"""The local engine: one worker thread per device, one per ordered link, real kernels and copies.

Dispatch follows docs/design.md (Execution semantics) exactly, like the simulator, so that the
differences between the two are real-system effects:

* each device worker blocks on its own ready queue (a heap under a condition
  variable, no polling) and runs the op that became ready first (FIFO), ties by
  op id;
* when op ``u`` finishes on device ``a``, consumers on ``a`` see its output at
  once; for every other device ``b`` holding consumers, one transfer ``(u, b)``
  copies the output into a buffer preallocated in ``b``'s memory (threads share
  an address space, so without this copy transfers would be free). Who copies
  depends on the devices (``copies_inbound``):

  - CPU devices: ``b``'s own worker, as one more item of its ready queue keyed by
    ``u``'s finish (ties: ops first, then transfers in (producer, device)
    order). A CPU has no copy engine: the copy takes a core, and a thread per
    link would only time-share the receiver's core with its kernels, slowing
    them at random where there is no spare core (the simulator's
    ``Device.copies_inbound``, which the calibrated cluster carries);
  - CUDA devices: the worker of link ``a -> b`` on its own copy stream, so copies
    overlap kernels. A link carries one transfer at a time in request order
    (ties by producer id): the simulator's ``link_contention=True`` mode;
* an op is ready once every input has arrived on its device; its ready time is
  that arrival.

Memory: every op's output is a fresh numpy array; :func:`doppler.util.malloc_tuning.tune_malloc` keeps freed
memory in the process for reuse (without it a run pays a random number of page faults). Receive
buffers are touched when they are allocated, before the clock starts. Each device's held bytes are
counted as its arrays are allocated and released (:class:`_Meter`, the rules of :mod:`doppler.memory`);
the largest total is the run's ``peak_memory_bytes`` (CUDA devices with a GPU each:
``torch.cuda.max_memory_allocated``).

Devices (``device_type``):

* ``"cpu"`` (:class:`HostDevices`): numpy kernels with one BLAS thread each
  (``threadpoolctl``); numpy releases the GIL inside its kernels and
  ``sys.setswitchinterval`` is lowered during a run so the Python glue between
  kernels hands over quickly. Times are ``time.perf_counter()`` seconds from the
  moment the source ops are released.
* ``"cuda"`` (:class:`CudaDevices`): torch kernels on the GPU, the same
  arithmetic (:func:`doppler.ir.kernels.run_op_torch`). Each device has its own
  compute stream and each link its own copy stream, so kernels and copies
  overlap; with more devices than GPUs each GPU is split into logical devices
  (devices ``0..k-1`` on GPU 0, and so on), which share its multiprocessors.
  A worker launches one kernel, records CUDA events around it and waits for
  its end event (the GIL is released while it waits), so a device runs one op
  at a time as the simulator assumes; op and copy times are read from the
  events afterwards, relative to an event recorded when the clock starts.

Inputs are placed before the clock starts. An op's ready time in the trace (its
last input's arrival: the producer's end on the same device, or the copy's end)
is computed from the measured times.

Failures never hang: a kernel that raises stops the run with an
:class:`EngineError` naming the op and device; a run past ``timeout_s`` stops
with one naming what was running; every thread is told to stop and joined.
"""

from __future__ import annotations

import heapq
import os
import sys
import threading
import time
from contextlib import contextmanager, suppress
from typing import Any, Iterator, Sequence

import numpy as np

from doppler.engine.program import RUN_STATE, EngineError, PlacedProgram, RunRecord, cuda_sleep_rate, spin_rate_per_s
from doppler.util.malloc_tuning import tune_malloc
from doppler.sim.trace import Trace

__all__ = ["DEVICE_SETS", "CudaDevices", "HostDevices", "RunRecord", "make_devices", "run_local"]

#: GIL switch interval during a run (seconds); Python's default is 5 ms
SWITCH_INTERVAL_S = 2e-5
#: how long stopped threads get to finish their current kernel before being abandoned
JOIN_TIMEOUT_S = 2.0


class _Queue:
    """A min-heap of (key, id) under a condition variable; ``get`` blocks until an item or a stop."""

    __slots__ = ("cond", "heap", "stopped")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.heap: list[tuple[float, int]] = []
        self.stopped = False

    def put(self, key: float, item: int) -> None:
        with self.cond:
            heapq.heappush(self.heap, (key, item))
            self.cond.notify()

    def get(self) -> int | None:
        with self.cond:
            while not self.heap and not self.stopped:
                self.cond.wait()
            if self.stopped:
                return None
            return heapq.heappop(self.heap)[1]

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class HostDevices:
    """CPU devices: numpy kernels, one BLAS thread each, host-clock times (seconds from the start)."""

    device_type = "cpu"
    #: input tiles are copied afresh for each run (see :meth:`Program.place`)
    keeps_inputs = False
    #: a transfer is a copy made by the receiving device's worker (a CPU has no copy engine)
    copies_inbound = True

    def __init__(self, num_devices: int) -> None:
        self.num_devices = int(num_devices)
        self.t0 = 0.0

    def names(self) -> list[str]:
        return [f"cpu{d}" for d in range(self.num_devices)]

    def place(self, array: np.ndarray, d: int) -> np.ndarray:
        """A copy of ``array`` in device ``d``'s memory."""
        return np.array(array, copy=True)

    def adopt(self, array: np.ndarray, d: int) -> np.ndarray:
        """``array``, freshly made for device ``d`` alone (a weight tile read from a checkpoint), in its memory."""
        return array

    def empty(self, shape: tuple[int, ...], dtype: Any, d: int) -> np.ndarray:
        """A receive buffer on ``d``, touched so that no copy into it pays page faults."""
        buf = np.empty(shape, dtype=dtype)
        buf.fill(0)
        return buf

    @contextmanager
    def session(self, links: Sequence[tuple[int, int]]) -> Iterator[None]:
        """Run-wide settings; ``links`` are the (src, dst) device pairs the run copies over."""
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            yield

    def prepare(self, prog: Any, num_ops: int, num_transfers: int) -> None:
        """Before the clock: measure what kernels need (the synthetic spin's rate)."""
        if prog.is_synthetic:
            spin_rate_per_s()

    def bind_thread(self, key: Any) -> None:
        """Called first in every device worker thread with its device index.

        Pins the thread to one core of those this process may use: device ``d`` to the
        ``d``-th (modulo their number), so that the operating system does not move device workers
        between cores during a run. ``DOPPLER_PIN_THREADS=0`` turns pinning off."""
        if os.environ.get("DOPPLER_PIN_THREADS", "1") != "0" and hasattr(os, "sched_setaffinity"):
            cores = sorted(os.sched_getaffinity(0))
            with suppress(OSError):  # a sandbox may refuse; the run stays correct, only less repeatable
                os.sched_setaffinity(0, {cores[key % len(cores)]})

    def start_clock(self) -> None:
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def kernel(self, prog: Any, v: int, d: int, arrays: list[Any]) -> tuple[Any, float, float, float]:
        """Run op ``v`` on ``d``: (output, start token, end token, end as a host time)."""
        start = self.now()
        out = prog.kernel(v, d, arrays)
        end = self.now()
        return out, start, end, end

    def copy(self, dst: np.ndarray, src: np.ndarray, a: int, b: int, k: int) -> tuple[float, float, float]:
        """Transfer ``k``: copy ``src`` (on ``a``) into ``dst`` (on ``b``): (start token, end token, end as a host time)."""
        start = self.now()
        np.copyto(dst, src, casting="unsafe")
        end = self.now()
        return start, end, end

    def seconds(self, tokens: Sequence[Any]) -> np.ndarray:
        """Tokens as seconds from the start of the clock."""
        return np.asarray(tokens, dtype=np.float64)

    def to_host(self, value: Any) -> np.ndarray:
        return value

    def peak_memory_bytes(self) -> None:
        """None: the engine's own count of the arrays each worker holds is the measurement."""
        return None


class CudaDevices:
    """CUDA devices: one compute stream per device, one copy stream per link, CUDA-event times.

    ``num_devices`` logical devices are spread over the visible GPUs in blocks
    (with one GPU, all of them share it).
    """

    device_type = "cuda"
    #: input tiles stay on the GPU between runs of one program (they are never written)
    keeps_inputs = True
    #: transfers run on per-link copy streams, overlapping kernels
    copies_inbound = False
    #: seconds of matrix products run on each GPU just before the clock starts, so that a run does not
    #: begin on an idle, down-clocked GPU (its clocks ramp up over milliseconds)
    warmup_s = 0.02

    def __init__(self, num_devices: int) -> None:
        from doppler.ir.kernels import TorchOps

        try:
            import torch
        except ImportError:  # pragma: no cover - torch is a dependency
            raise EngineError("CUDA devices need torch") from None
        if not torch.cuda.is_available():
            raise EngineError("no CUDA device is visible here (torch.cuda.is_available() is false): use CPU devices")
        self.torch = torch
        self.num_devices = int(num_devices)
        gpus = torch.cuda.device_count()
        per_gpu = -(-self.num_devices // gpus)
        self.gpu = [d // per_gpu for d in range(self.num_devices)]
        self.gpus = sorted(set(self.gpu))
        self.ops = [TorchOps(f"cuda:{g}") for g in self.gpu]
        self.compute = [torch.cuda.Stream(device=f"cuda:{g}") for g in self.gpu]
        self.links: dict[tuple[int, int], Any] = {}
        self.t0: dict[int, Any] = {}
        self.host_t0 = 0.0
        # per GPU (CUDA events belong to one device): a pair of timing events per op and per transfer
        self.op_events: dict[int, list[tuple[Any, Any]]] = {g: [] for g in self.gpus}
        self.tr_events: dict[int, list[tuple[Any, Any]]] = {g: [] for g in self.gpus}

    def names(self) -> list[str]:
        gpu = self.gpu
        return [f"cuda:{g}" if gpu.count(g) == 1 else f"cuda:{g}/{d - gpu.index(g)}" for d, g in enumerate(gpu)]

    def place(self, array: np.ndarray, d: int) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(array)).to(self.ops[d].device, copy=True)

    def adopt(self, array: np.ndarray, d: int) -> Any:
        """A host array made for device ``d`` alone (a weight tile), uploaded to it; the host copy is dropped."""
        return self.place(array, d)

    def empty(self, shape: tuple[int, ...], dtype: Any, d: int) -> Any:
        ops = self.ops[d]
        return self.torch.zeros(shape, dtype=ops.dtype(np.dtype(dtype)), device=ops.device)

    @contextmanager
    def session(self, links: Sequence[tuple[int, int]]) -> Iterator[None]:
        for a, b in links:
            if (a, b) not in self.links:
                self.links[(a, b)] = self.torch.cuda.Stream(device=self.ops[b].device)
        yield

    def _events(self, pool: list[tuple[Any, Any]], count: int, gpu: int) -> None:
        """Grow ``pool`` to ``count`` pairs of timing events on ``gpu``, created now (at their first record)."""
        torch = self.torch
        while len(pool) < count:
            pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for ev in pair:
                ev.record(torch.cuda.current_stream(gpu))
            pool.append(pair)

    def prepare(self, prog: Any, num_ops: int, num_transfers: int) -> None:
        if prog.is_synthetic:
            for ops in {str(o.device): o for o in self.ops}.values():
                cuda_sleep_rate(ops)
        for g in self.op_events:
            self._events(self.op_events[g], num_ops, g)
            self._events(self.tr_events[g], num_transfers, g)
            self.torch.cuda.synchronize(g)
        self._warm_up()

    def _warm_up(self) -> None:
        """Keep every GPU busy for about :attr:`warmup_s` with matrix products, then wait for them."""
        torch = self.torch
        for g in self.gpus:
            with torch.cuda.device(g):
                x = torch.ones((2048, 2048), device=f"cuda:{g}")
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                x = x @ x
                end.record()
                end.synchronize()
                reps = int(self.warmup_s / max(begin.elapsed_time(end) / 1e3, 1e-6))
                for _ in range(min(reps, 10_000)):
                    x = x @ x * 1e-3
        for g in self.gpus:
            torch.cuda.synchronize(g)

    def bind_thread(self, key: Any) -> None:
        """A device worker launches on its compute stream, a link worker on its copy stream (thread-local)."""
        stream = self.compute[key] if isinstance(key, int) else self.links[key]
        self.torch.cuda.set_device(stream.device)
        self.torch.cuda.set_stream(stream)

    def start_clock(self) -> None:
        torch = self.torch
        for g in self.gpus:
            torch.cuda.synchronize(g)
            torch.cuda.reset_peak_memory_stats(g)
        self.t0 = {}
        for g in self.gpus:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream(g))
            self.t0[g] = ev
        for ev in self.t0.values():
            ev.synchronize()
        self.host_t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.host_t0

    def kernel(self, prog: Any, v: int, d: int, arrays: list[Any]) -> tuple[Any, Any, Any, float]:
        """Launch on this thread's stream (see :meth:`bind_thread`) between two events; wait for the end one."""
        begin, end = self.op_events[self.gpu[d]][v]
        begin.record()
        out = prog.kernel(v, d, arrays, self.ops[d])
        end.record()
        end.synchronize()
        return out, (self.gpu[d], begin), (self.gpu[d], end), self.now()

    def copy(self, dst: Any, src: Any, a: int, b: int, k: int) -> tuple[Any, Any, float]:
        begin, end = self.tr_events[self.gpu[b]][k]
        begin.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        return (self.gpu[b], begin), (self.gpu[b], end), self.now()

    def seconds(self, tokens: Sequence[Any]) -> np.ndarray:
        return np.array([self.t0[g].elapsed_time(ev) / 1e3 for g, ev in tokens], dtype=np.float64)

    def to_host(self, value: Any) -> np.ndarray:
        return value.detach().cpu().numpy()

    def peak_memory_bytes(self) -> np.ndarray | None:
        """``torch.cuda.max_memory_allocated`` since the clock started, per device, where every device has a GPU
        of its own (else None: the engine's own count)."""
        if len(self.gpus) != self.num_devices:
            return None
        return np.array([float(self.torch.cuda.max_memory_allocated(g)) for g in self.gpu])


_CUDA_DEVICE_SETS: dict[int, CudaDevices] = {}


DEVICE_SETS: dict[str, type] = {"cpu": HostDevices, "cuda": CudaDevices}


def make_devices(device_type: str, num_devices: int) -> "HostDevices | CudaDevices":
    """The device set of a local run: ``"cpu"`` or ``"cuda"`` (one cached set of streams per device count)."""
    if device_type == "cuda":
        if num_devices not in _CUDA_DEVICE_SETS:
            _CUDA_DEVICE_SETS[num_devices] = CudaDevices(num_devices)
        return _CUDA_DEVICE_SETS[num_devices]
    return HostDevices(num_devices)


def _ready_times(placed: PlacedProgram, op_end: np.ndarray, transfers: list[tuple[int, int]], tr_end: np.ndarray) -> np.ndarray:
    """Per op: when its last input arrived on its device (0 for ops without inputs)."""
    g, dev, D = placed.program.graph, placed.devices, placed.num_devices
    ready = np.zeros(g.num_ops)
    if g.num_edges == 0:
        return ready
    src, dst = g.src.astype(np.int64), g.dst.astype(np.int64)
    arrival = op_end[src].copy()
    remote = dev[src] != dev[dst]
    if remote.any():
        keys = np.array([u * D + b for u, b in transfers], dtype=np.int64)
        k = np.searchsorted(keys, src[remote] * D + dev[dst[remote]])
        arrival[remote] = tr_end[k]
    np.maximum.at(ready, dst, arrival)
    return ready


def run_local(placed: PlacedProgram, *, timeout_s: float, keep_values: bool = True,
              devices: "HostDevices | CudaDevices | None" = None) -> RunRecord:  # fmt: skip
    """Execute ``placed`` once on local threads and return the trace (see the module docstring).

    ``devices`` must be the device set the program was placed on (default: CPU devices).
    """
    tune_malloc()
    ex = _Execution(placed, devices if devices is not None else HostDevices(placed.num_devices), keep_values)
    ok, at_timeout = ex.start_and_wait(timeout_s)
    if ex.failure:
        raise EngineError(ex.failure[0])
    if not ok:
        n, label = ex.n, ex.prog.label
        busy = [f"op {label(v)} on device {d}" for d, v in enumerate(at_timeout[0]) if v >= 0]
        what = "; running: " + ", ".join(busy) if busy else "; no op was running (waiting on inputs)"
        raise EngineError(f"the run passed its timeout of {timeout_s:g} s with {n - at_timeout[1]} of {n} ops "
                          f"unfinished{what}")  # fmt: skip
    peak = ex.hw.peak_memory_bytes()
    return RunRecord(ex.trace(), [ex.hw.to_host(x) if x is not None else None for x in ex.values] if keep_values else [],
                     ex.meter.peak.copy() if peak is None else peak)  # fmt: skip


class _Meter:
    """Bytes held per device, and the most held at once, updated from any thread. The engine allocates input
    tiles before the clock (a weight's held for the whole run, a slice of an activation input until its last
    reader there ends), an op's output at the op's start until its last reader on the device and its last
    copy have ended (a graph output until the end), a received copy at the copy's start until its last reader
    there ends; outputs not kept for the caller are dropped at that moment."""

    def __init__(self, num_devices: int) -> None:
        self.held = np.zeros(num_devices)
        self.peak = np.zeros(num_devices)
        self.lock = threading.Lock()

    def alloc(self, d: int, nbytes: float) -> None:
        with self.lock:
            self.held[d] += nbytes
            self.peak[d] = max(self.peak[d], self.held[d])

    def release(self, d: int, nbytes: float) -> None:
        with self.lock:
            self.held[d] -= nbytes


class _Execution:
    """One run of a placed program: its queues, worker threads and what they record."""

    def __init__(self, placed: PlacedProgram, hw: "HostDevices | CudaDevices", keep_values: bool) -> None:
        self.placed, self.prog, self.hw = placed, placed.program, hw
        g = self.prog.graph
        self.n, self.D = n, D = g.num_ops, placed.num_devices
        self.dev = dev = placed.devices
        self.transfers = transfers = placed.transfers()
        self.tr_index = {key: k for k, key in enumerate(transfers)}
        # consumers of u on device b, and the number of distinct inputs each op waits for
        self.consumers: dict[tuple[int, int], list[int]] = {}
        for u in range(n):
            for v in g.successors(u):
                self.consumers.setdefault((u, int(dev[v])), []).append(int(v))
        self.waiting = np.diff(g.pred_ptr).astype(np.int64)
        # receive buffers, preallocated (and touched) on the destination device
        self.recv: dict[tuple[int, int], Any] = {}
        for u, b in transfers:
            shape, dt = self.prog.output_template(u)
            self.recv[(u, b)] = hw.empty(shape, dt, b)
        self.values: list[Any] = [None] * n
        self.keep_values = keep_values
        self._plan_memory(g, dev, transfers)
        self.ready_key = np.zeros(n)  # host time of the latest arrival: the FIFO key
        self.op_start: list[Any] = [0.0] * n
        self.op_end: list[Any] = [0.0] * n
        T = len(transfers)
        self.tr_start: list[Any] = [0.0] * T
        self.tr_end: list[Any] = [0.0] * T
        self.dev_q = [_Queue() for _ in range(D)]
        self.on_device = hw.copies_inbound
        self.link_q = {} if self.on_device else {(a, b): _Queue() for a in range(D) for b in range(D) if a != b}
        self.used_links = [ab for ab in self.link_q if any(k[1] == ab[1] and dev[k[0]] == ab[0] for k in transfers)]
        self.locks = [threading.Lock() for _ in range(D)]  # guards `waiting` for ops on each device
        self.running: list[int] = [-1] * D
        self.done = threading.Event()
        self.state_lock = threading.Lock()
        self.finished = 0
        self.failure: list[str] = []

    def _plan_memory(self, g: Any, dev: np.ndarray, transfers: list[tuple[int, int]]) -> None:
        """What the meter counts down: readers left of each (tile, device) and of each received copy, and the
        uses left of each output on its own device (its readers there and its copies)."""
        self.meter = _Meter(self.D)
        users = set(g.meta.get("user_inputs") or ())
        self.tile_left: dict[tuple[int, int], int] = {}
        self.tile_bytes: dict[tuple[int, int], float] = {}
        for v, ops in enumerate(self.prog.operands):
            for t in {o.tile for o in ops if o.tile >= 0}:
                key = (t, int(dev[v]))
                self.tile_left[key] = self.tile_left.get(key, 0) + 1
                self.tile_bytes[key] = float(self.prog.tiles[t].nbytes)
        self.weight_tiles = {t for t, name in enumerate(self.prog.tile_inputs) if name not in users}
        self.uses_left = np.array([len(self.consumers.get((u, int(dev[u])), ())) for u in range(self.n)], np.int64)
        np.add.at(self.uses_left, np.array([u for u, _ in transfers], dtype=np.int64), 1)  # and one per copy
        self.recv_left = {(u, b): len(self.consumers[(u, b)]) for u, b in transfers}
        self.out_bytes = np.asarray(g.output_bytes, dtype=np.float64)

    def _used(self, v: int, d: int) -> None:
        """Op ``v`` ended on device ``d``: release what it was the last reader of there."""
        for t in {o.tile for o in self.prog.operands[v] if o.tile >= 0}:
            key = (t, d)
            self.tile_left[key] -= 1
            if self.tile_left[key] == 0 and t not in self.weight_tiles:
                self.meter.release(d, self.tile_bytes[key])
        for u in self.prog.graph.predecessors(v).tolist():
            if int(self.dev[u]) == d:
                self._output_used(u)
            else:
                self.recv_left[(u, d)] -= 1
                if self.recv_left[(u, d)] == 0:
                    self.meter.release(d, self.out_bytes[u])
                    if not self.keep_values:
                        self.recv[(u, d)] = None

    def _output_used(self, u: int) -> None:
        with self.locks[int(self.dev[u])]:
            self.uses_left[u] -= 1
            last = self.uses_left[u] == 0
        if last:
            self.meter.release(int(self.dev[u]), self.out_bytes[u])
            if not self.keep_values:
                self.values[u] = None

    def fail(self, msg: str) -> None:
        with self.state_lock:
            if not self.failure:
                self.failure.append(msg)
        self.done.set()

    def arrive(self, u: int, b: int, t: float) -> None:
        """u's output is now on device b: release the consumers there whose last input this was."""
        q = self.dev_q[b]
        with self.locks[b]:
            for v in self.consumers[(u, b)]:
                self.waiting[v] -= 1
                if t > self.ready_key[v]:  # arrivals can be processed out of order: ready = the latest
                    self.ready_key[v] = t
                if self.waiting[v] == 0:
                    q.put(self.ready_key[v], v)

    def device_worker(self, d: int) -> None:
        self.hw.bind_thread(d)
        RUN_STATE.stop = self.stopping  # (a synthetic kernel returns early once the run stops)
        q, n, dev, values, recv = self.dev_q[d], self.n, self.dev, self.values, self.recv
        tiles = self.placed.tile_operands
        ops_operands = self.prog.operands
        while True:
            v = q.get()
            if v is None:
                return
            if v >= n:  # a transfer into d (copies_inbound): its index is v - n
                if not self.copy(v - n, d):
                    return
                continue
            self.running[d] = v
            self.meter.alloc(d, self.out_bytes[v])
            try:  # (gathering the operands too: whatever fails, the run stops with one message, no hang)
                arrays = [
                    tile if tile is not None else (values[o.op] if dev[o.op] == d else recv[(o.op, d)])
                    for o, tile in zip(ops_operands[v], tiles[v])
                ]
                out, start, end, key = self.hw.kernel(self.prog, v, d, arrays)
            except Exception as e:  # noqa: BLE001 - any kernel failure stops the run with a clear message
                self.fail(f"op {self.prog.label(v)} on device {d} failed: {type(e).__name__}: {e}")
                return
            self.running[d] = -1
            values[v] = out
            self.op_start[v], self.op_end[v] = start, end
            self._used(v, d)
            self.send(v, d, key)
            with self.state_lock:
                self.finished += 1
                if self.finished == n:
                    self.done.set()

    def send(self, v: int, d: int, key: float) -> None:
        """Op v finished on d: its consumers on d are released, every other consumer device gets a copy."""
        for b in range(self.D):
            if (v, b) in self.consumers:
                if b == d:
                    self.arrive(v, d, key)
                elif self.on_device:
                    self.dev_q[b].put(key, self.n + self.tr_index[(v, b)])
                else:
                    self.link_q[(d, b)].put(key, v)

    def copy(self, k: int, b: int) -> bool:
        """Make transfer ``k`` into device ``b``; False if it failed (the run is stopped)."""
        u = self.transfers[k][0]
        a = int(self.dev[u])
        self.meter.alloc(b, self.out_bytes[u])
        try:
            start, end, key = self.hw.copy(self.recv[(u, b)], self.values[u], a, b, k)
        except Exception as e:  # noqa: BLE001 - any copy failure stops the run with a clear message
            self.fail(f"transfer of op {self.prog.label(u)} from device {a} to device {b} failed: {type(e).__name__}: {e}")
            return False
        self.tr_start[k], self.tr_end[k] = start, end
        self._output_used(u)
        self.arrive(u, b, key)
        return True

    def link_worker(self, a: int, b: int) -> None:
        self.hw.bind_thread((a, b))
        q = self.link_q[(a, b)]
        while True:
            u = q.get()
            if u is None or not self.copy(self.tr_index[(u, b)], b):
                return

    def start_and_wait(self, timeout_s: float) -> tuple[bool, tuple[list[int], int]]:
        """Start the workers and the clock, release the source ops, wait for the last op or the timeout,
        then stop every thread. Returns (finished in time, (op running per device, ops done) at the end)."""
        hw, n = self.hw, self.n
        threads = [threading.Thread(target=self.device_worker, args=(d,), name=f"doppler-dev{d}", daemon=True)
                   for d in range(self.D)]  # fmt: skip
        threads += [
            threading.Thread(target=self.link_worker, args=ab, name=f"doppler-link{ab[0]}-{ab[1]}", daemon=True)
            for ab in self.used_links
        ]
        old_switch = sys.getswitchinterval()
        self.stopping = threading.Event()
        try:
            with hw.session(self.used_links):
                hw.prepare(self.prog, n, len(self.transfers))
                sys.setswitchinterval(SWITCH_INTERVAL_S)
                for th in threads:
                    th.start()
                sources = np.flatnonzero(self.waiting == 0)
                for (_, d), nbytes in self.tile_bytes.items():  # the input tiles, placed before the clock
                    self.meter.alloc(d, nbytes)
                hw.start_clock()
                for v in sources:
                    self.dev_q[int(self.dev[v])].put(0.0, int(v))
                if n == 0:
                    self.done.set()
                ok = self.done.wait(timeout_s)
                at_timeout = (list(self.running), self.finished)  # what ran when the clock ran out, before stopping
        finally:
            self.stopping.set()
            for q in [*self.dev_q, *self.link_q.values()]:
                q.stop()
            sys.setswitchinterval(old_switch)
            deadline = time.monotonic() + JOIN_TIMEOUT_S
            for th in threads:
                if th.is_alive():
                    th.join(max(0.0, deadline - time.monotonic()))
        return ok, at_timeout

    def trace(self) -> Trace:
        """The run's trace in seconds from the start of the clock."""
        hw, dev, transfers = self.hw, self.dev, self.transfers
        start_s, end_s = hw.seconds(self.op_start), hw.seconds(self.op_end)
        tr_start_s, tr_end_s = hw.seconds(self.tr_start), hw.seconds(self.tr_end)
        src = np.array([u for u, _ in transfers], dtype=np.int64)
        T = len(transfers)
        return Trace(
            op_device=dev.copy(),
            op_ready=_ready_times(self.placed, end_s, transfers, tr_end_s),
            op_start=start_s,
            op_end=end_s,
            tr_src_op=src,
            tr_src_device=dev[src] if T else np.empty(0, np.int64),
            tr_dst_device=np.array([b for _, b in transfers], dtype=np.int64),
            tr_bytes=self.prog.graph.output_bytes[src].astype(np.float64) if T else np.empty(0),
            tr_start=tr_start_s,
            tr_end=tr_end_s,
            mode="engine:local" if hw.device_type == "cpu" else f"engine:local:{hw.device_type}",
        )
