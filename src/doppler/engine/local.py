"""The local engine: one worker thread per device, one per ordered link, real kernels and copies.

Dispatch follows DESIGN.md §5 exactly, like the simulator, so that the
differences between the two are real-system effects:

* each device worker blocks on its own ready queue (a heap under a condition
  variable, no polling) and runs the op that became ready first (FIFO), ties by
  op id;
* when op ``u`` finishes on device ``a``, consumers on ``a`` see its output at
  once; for every other device ``b`` holding consumers, one transfer ``(u, b)``
  is queued on the worker of link ``a -> b``, which copies the output into a
  buffer preallocated in ``b``'s memory (threads share an address space, so
  without this copy transfers would be free). A link carries one transfer at a
  time in request order (ties by producer id): the simulator's
  ``link_contention=True`` mode;
* an op is ready once every input has arrived on its device; its ready time is
  that arrival.

Memory: every op's output is a fresh numpy array; :func:`doppler.malloc.tune_malloc`
keeps freed memory in the process for reuse (without it a run paid 0 to 40,000
page faults, up to +40% makespan, at random). Receive buffers are touched when
they are allocated, before the clock starts.

CPU devices run numpy kernels with one BLAS thread each (``threadpoolctl``);
numpy releases the GIL inside its kernels and ``sys.setswitchinterval`` is
lowered during a run so the Python glue between kernels hands over quickly.
Times are ``time.perf_counter()`` seconds from the moment the source ops are
released; inputs are placed and buffers allocated before that.

Failures never hang: a kernel that raises stops the run with an
:class:`EngineError` naming the op and device; a run past ``timeout_s`` stops
with one naming what was running; every thread is told to stop and joined.
"""

from __future__ import annotations

import heapq
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from doppler.engine.program import EngineError, PlacedProgram
from doppler.malloc import tune_malloc
from doppler.trace import Trace

__all__ = ["LocalRun", "run_local"]

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


@dataclass
class LocalRun:
    """One measured run: its trace and the op outputs (one array per op)."""

    trace: Trace
    values: list[np.ndarray | None]


def run_local(placed: PlacedProgram, *, timeout_s: float, keep_values: bool = True) -> LocalRun:
    """Execute ``placed`` once on local threads and return the trace (see the module docstring)."""
    from threadpoolctl import threadpool_limits

    tune_malloc()
    prog = placed.program
    g = prog.graph
    n, D = g.num_ops, placed.num_devices
    dev = placed.devices
    transfers = placed.transfers()
    tr_index = {key: k for k, key in enumerate(transfers)}
    # consumers of u on device b, and the number of distinct inputs each op waits for
    consumers: dict[tuple[int, int], list[int]] = {}
    for u in range(n):
        for v in g.successors(u):
            consumers.setdefault((u, int(dev[v])), []).append(int(v))
    waiting = np.diff(g.pred_ptr).astype(np.int64)
    # receive buffers, preallocated on the destination device and touched, so that no copy pays page faults
    recv: dict[tuple[int, int], np.ndarray] = {}
    for u, b in transfers:
        shape, dt = prog.output_template(u)
        buf = recv[(u, b)] = np.empty(shape, dtype=dt)
        buf.fill(0)
    values: list[np.ndarray | None] = [None] * n
    op_ready, op_start, op_end = np.zeros(n), np.zeros(n), np.zeros(n)
    T = len(transfers)
    tr_start, tr_end = np.zeros(T), np.zeros(T)

    dev_q = [_Queue() for _ in range(D)]
    link_q = {(a, b): _Queue() for a in range(D) for b in range(D) if a != b}
    locks = [threading.Lock() for _ in range(D)]  # guards `waiting` for ops on each device
    running: list[int] = [-1] * D
    done = threading.Event()
    state_lock = threading.Lock()
    finished = [0]
    failure: list[str] = []
    clock = time.perf_counter
    t0 = [0.0]

    def fail(msg: str) -> None:
        with state_lock:
            if not failure:
                failure.append(msg)
        done.set()

    def arrive(u: int, b: int, t: float) -> None:
        """u's output is now on device b: release the consumers there whose last input this was."""
        q = dev_q[b]
        with locks[b]:
            for v in consumers[(u, b)]:
                waiting[v] -= 1
                if t > op_ready[v]:  # arrivals can be processed out of order: ready = the latest
                    op_ready[v] = t
                if waiting[v] == 0:
                    q.put(op_ready[v], v)

    def device_worker(d: int) -> None:
        q = dev_q[d]
        tiles = placed.tile_operands
        ops_operands = prog.operands
        while True:
            v = q.get()
            if v is None:
                return
            running[d] = v
            arrays = [
                tile if tile is not None else (values[o.op] if dev[o.op] == d else recv[(o.op, d)])
                for o, tile in zip(ops_operands[v], tiles[v])
            ]
            start = clock() - t0[0]
            try:
                out = prog.kernel(v, d, arrays)
            except Exception as e:  # noqa: BLE001 - any kernel failure stops the run with a clear message
                fail(f"op {prog.label(v)} on device {d} failed: {type(e).__name__}: {e}")
                return
            end = clock() - t0[0]
            running[d] = -1
            values[v] = out
            op_start[v], op_end[v] = start, end
            for b in range(D):
                if (v, b) in consumers:
                    if b == d:
                        arrive(v, d, end)
                    else:
                        link_q[(d, b)].put(end, v)
            with state_lock:
                finished[0] += 1
                if finished[0] == n:
                    done.set()

    def link_worker(a: int, b: int) -> None:
        q = link_q[(a, b)]
        while True:
            u = q.get()
            if u is None:
                return
            k = tr_index[(u, b)]
            start = clock() - t0[0]
            try:
                np.copyto(recv[(u, b)], values[u], casting="unsafe")
            except Exception as e:  # noqa: BLE001
                fail(f"transfer of op {prog.label(u)} from device {a} to device {b} failed: {type(e).__name__}: {e}")
                return
            end = clock() - t0[0]
            tr_start[k], tr_end[k] = start, end
            arrive(u, b, end)

    threads = [threading.Thread(target=device_worker, args=(d,), name=f"doppler-dev{d}", daemon=True) for d in range(D)]
    threads += [
        threading.Thread(target=link_worker, args=ab, name=f"doppler-link{ab[0]}-{ab[1]}", daemon=True)
        for ab in link_q
        if any(key[1] == ab[1] and dev[key[0]] == ab[0] for key in transfers)
    ]
    old_switch = sys.getswitchinterval()
    try:
        with threadpool_limits(limits=1):
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            for th in threads:
                th.start()
            sources = np.flatnonzero(waiting == 0)
            t0[0] = clock()
            for v in sources:
                dev_q[int(dev[v])].put(0.0, int(v))
            if n == 0:
                done.set()
            ok = done.wait(timeout_s)
            at_timeout = (list(running), finished[0])  # what ran when the clock ran out, before stopping
    finally:
        for q in dev_q:
            q.stop()
        for q in link_q.values():
            q.stop()
        sys.setswitchinterval(old_switch)
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for th in threads:
            if th.is_alive():
                th.join(max(0.0, deadline - time.monotonic()))
    if failure:
        raise EngineError(failure[0])
    if not ok:
        busy = [f"op {prog.label(v)} on device {d}" for d, v in enumerate(at_timeout[0]) if v >= 0]
        left = n - at_timeout[1]
        what = "; running: " + ", ".join(busy) if busy else "; no op was running (waiting on inputs)"
        raise EngineError(f"the run passed its timeout of {timeout_s:g} s with {left} of {n} ops unfinished{what}")
    src = np.array([u for u, _ in transfers], dtype=np.int64)
    trace = Trace(
        op_device=dev.copy(),
        op_ready=op_ready,
        op_start=op_start,
        op_end=op_end,
        tr_src_op=src,
        tr_src_device=dev[src] if T else np.empty(0, np.int64),
        tr_dst_device=np.array([b for _, b in transfers], dtype=np.int64),
        tr_bytes=g.output_bytes[src].astype(np.float64) if T else np.empty(0),
        tr_start=tr_start,
        tr_end=tr_end,
        mode="engine:local",
    )
    return LocalRun(trace, values if keep_values else [])


def describe_local(num_devices: int) -> dict[str, Any]:
    """What the local engine's devices are, for reports."""
    return {"engine": "local", "devices": [f"cpu{d}" for d in range(num_devices)], "blas_threads_per_device": 1}
