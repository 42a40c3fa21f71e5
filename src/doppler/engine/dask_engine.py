"""The Dask engine: one single-threaded ``dask.distributed`` worker per device.

:func:`run_dask` executes a :class:`~doppler.engine.program.PlacedProgram` on a
Dask cluster and returns one :class:`~doppler.sim.trace.Trace` per repeat (mode
``"engine:dask"``), like the local engine (:mod:`doppler.engine.local`).

Cluster
    ``scheduler="tcp://host:port"`` connects to a running scheduler, which must
    have at least ``num_devices`` workers; **device ``d`` is the ``d``-th worker
    in sorted (lexicographic) address order**; extra workers get no work. Each
    worker should run one thread (``--nthreads 1``) with one BLAS thread
    (``OMP_NUM_THREADS=1``), and doppler must be importable on the scheduler
    and the workers. Without a scheduler a ``LocalCluster`` on 127.0.0.1 is
    started: ``num_devices`` worker processes of one thread and one BLAS thread
    each; work stealing, the active memory manager, the profiler and memory
    limits (spilling) off. It is cached per device count (repeated runs do not
    pay start-up) until :func:`~doppler.engine.dask_cluster.close_clusters` (run
    at exit). Reaching a scheduler waits at most ``timeout_s`` (capped at ``SETUP_TIMEOUT_S``),
    starting the LocalCluster at most ``SETUP_TIMEOUT_S`` (:mod:`~doppler.engine.dask_cluster`).

Execution
    Input tiles are scattered to their device's worker before the clock starts
    (a tile used on two devices is placed on both, as in
    :meth:`~doppler.engine.program.Program.place`). Every op is one task pinned
    to its device's worker (``workers=[addr], allow_other_workers=False``),
    with a unique key per repeat, ``pure=False`` and the static priority
    ``-op_id``. **Dask does not run ready tasks in FIFO order**: a worker with
    several ready tasks queued runs the one of highest priority, here the
    lowest op id (the simulator's ``simulate(..., dispatch="priority")``); a
    task that reaches an idle worker starts at once. **Inputs are fetched
    lazily**: a worker fetches an op's remote inputs only once the scheduler
    has seen all of them finish and hands it the op, so a transfer starts when
    its consumer becomes runnable, not when its producer finishes (outputs are
    not pushed eagerly); a worker fetches each remote output once for all
    its consumers. Every dependent op also pays a scheduler round trip (the
    producer's completion goes to the scheduler, which dispatches the
    consumer): see :func:`measure_overhead`.

    The whole graph is submitted before the clock starts, behind one gate task
    per worker thread blocked on the run's ``distributed.Event`` (:func:`_run_once`);
    once every source op sits in its worker's ready queue the event is set, and
    each worker starts its sources in priority order, with no scheduler round trip.

Timings
    Op times come from Dask's task stream and transfers from each worker's incoming-transfer log,
    in seconds from **the moment the first gate task finished**: scatter, submission and the
    event's round trip are set-up, outside the makespan; ``timeout_s`` counts from the moment the
    event is set. :mod:`doppler.engine.dask_trace` states how each field of the trace is read.

Failures never hang: a kernel that raises stops the run with an
:class:`~doppler.engine.program.EngineError` naming the op and device; a worker
that dies (its address leaves the scheduler) with one naming the device; a run
past ``timeout_s`` with one naming what was running. The futures are cancelled,
the gate released and the cluster discarded (a LocalCluster is closed, its
processes killed; an external scheduler only loses our client). Outputs are
gathered only for real kernels (a synthetic program's outputs are filler bytes).
"""

from __future__ import annotations

import itertools
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from distributed import Event, get_task_stream, wait

from doppler.engine.dask_cluster import SETUP_TIMEOUT_S, Conn, discard, get_conn, on_thread
from doppler.engine.dask_trace import build_trace
from doppler.engine.program import EngineError, PlacedProgram, RunRecord, build_program, synthetic_kernel
from doppler.ir.kernels import run_op_numpy
from doppler.sim.trace import Trace

__all__ = ["measure_overhead", "run_dask"]

#: how often a running graph is checked for dead workers (seconds)
POLL_S = 0.2
#: wait for the first of at most this many unfinished sinks; more: wait for all, POLL_S at a time
MAX_FIRST_COMPLETED = 64
#: runs after which our LocalCluster is closed and a fresh one started: its in-process scheduler
#: keeps about 2 MB of history per run of a 168-op graph (submitted graphs, messages) that
#: Dask's own limits do not bound (measured: linear growth over 300 runs)
RECYCLE_AFTER_RUNS = 100
#: ops of the no-op chain behind ``info["overhead_per_op_s"]`` (measured once per cluster)
OVERHEAD_CHAIN_OPS = 40
_RUN_IDS = itertools.count()  # run ids are unique within this process


# ------------------------------------------------------------------ worker-side code (module level, picklable)
class DaskOpError(RuntimeError):
    """Raised inside a worker by an op whose kernel failed; the message names the op and device."""


@dataclass(eq=False)
class _OpTask:
    """Task callable of op ``v`` on ``device``: ``run_op_numpy`` on its own ``spec`` (the Program is not shipped),
    or with no spec a synthetic spin of ``seconds`` writing ``nbytes`` (its inputs are received, unused)."""

    v: int
    label: str
    device: int
    spec: dict[str, Any] | None = None
    dtype: Any = None
    seconds: float = 0.0
    nbytes: int = 0

    def __call__(self, *arrays: np.ndarray) -> np.ndarray:
        try:
            if self.spec is None:
                return synthetic_kernel(self.seconds, self.nbytes, self.v)
            return run_op_numpy(self.spec, arrays, label=self.label, dtype=self.dtype)
        except Exception as e:  # noqa: BLE001 - any kernel failure stops the run with a clear message
            raise DaskOpError(f"op {self.label} on device {self.device} failed: {type(e).__name__}: {e}") from None


def _gate(name: str, timeout: float) -> None:
    """Hold this worker's thread until the run's event is set (then the clock starts)."""
    if not Event(name).wait(timeout):
        raise TimeoutError(f"gate {name} was never opened")


def _incoming_transfers(
    prefix: str, since: float, dask_worker: Any = None
) -> list[tuple[float, float, str, list[str]]]:
    """This worker's fetches of keys starting with ``prefix`` that ended after ``since``:
    (start, stop, source worker, keys). The log is read from its newest entry back."""
    out = []
    for rec in reversed(dask_worker.transfer_incoming_log):
        if float(rec["stop"]) < since:
            break
        keys = [k for k in rec.get("keys", ()) if isinstance(k, str) and k.startswith(prefix)]
        if keys:
            out.append((float(rec["start"]), float(rec["stop"]), str(rec.get("who", "")), keys))
    return out


def _worker_task_states(keys: list[str], dask_worker: Any = None) -> dict[str, str]:
    """The state of each of ``keys`` that this worker holds (e.g. ``"executing"``, ``"ready"``)."""
    tasks = dask_worker.state.tasks
    return {k: str(tasks[k].state) for k in keys if k in tasks}


def _scheduler_known(keys: list[str], dask_scheduler: Any = None) -> int:
    """How many of ``keys`` the scheduler holds."""
    return sum(1 for k in keys if k in dask_scheduler.tasks)


def _scheduler_executing(prefix: str, dask_scheduler: Any = None) -> dict[str, list[str]]:
    """Per worker, the keys with ``prefix`` it reported executing (else those assigned to it)."""
    out: dict[str, list[str]] = {}
    for addr, ws in dask_scheduler.workers.items():
        keys = [ts.key for ts in getattr(ws, "executing", {}) if str(ts.key).startswith(prefix)]
        if not keys:
            keys = sorted(ts.key for ts in ws.processing if str(ts.key).startswith(prefix))[:1]
        out[addr] = keys
    return out


# ------------------------------------------------------------------ one run
def _task_callables(placed: PlacedProgram) -> list[_OpTask]:
    prog, dev = placed.program, placed.devices
    out: list[_OpTask] = []
    for v in range(prog.num_ops):
        d = int(dev[v])
        if prog.is_synthetic:
            seconds = float(prog.synthetic_s[v, d])  # type: ignore[index]
            out.append(_OpTask(v, prog.label(v), d, seconds=seconds, nbytes=int(prog.graph.output_bytes[v])))
        else:
            out.append(_OpTask(v, prog.label(v), d, prog.specs[v], prog.dtype))  # type: ignore[index]
    return out


def _failure_message(futs: list[Any], placed: PlacedProgram) -> str | None:
    """The message of the first failed op future, if any."""
    for v, f in enumerate(futs):
        d = int(placed.devices[v])
        if f.status == "error":
            try:
                exc = f.exception(timeout=5)
            except Exception as e:  # noqa: BLE001
                exc = e
            if isinstance(exc, DaskOpError):
                return str(exc)
            return f"op {placed.program.label(v)} on device {d} failed: {type(exc).__name__}: {exc}"
        if f.status == "cancelled":
            return f"op {placed.program.label(v)} on device {d} was cancelled by the Dask scheduler"
    return None


def _raise_if_dead(conn: Conn, num_devices: int) -> None:
    """An EngineError naming every device whose worker has left the scheduler, if any has."""
    live = set(conn.client.nthreads())
    dead = [d for d in range(num_devices) if conn.workers[d] not in live]
    if dead:
        what = ", ".join(f"device {d} ({conn.workers[d]})" for d in dead)
        raise EngineError(f"the Dask worker of {what} died during the run") from None


def _timeout_message(conn: Conn, futs: list[Any], placed: PlacedProgram, prefix: str, timeout_s: float) -> str:
    n = len(futs)
    left = sum(1 for f in futs if f.status != "finished")
    busy: list[str] = []
    with suppress(Exception):  # the message is best effort
        executing = conn.client.run_on_scheduler(_scheduler_executing, prefix)
        for d in range(placed.num_devices):
            for k in executing.get(conn.workers[d], []):
                tail = str(k)[len(prefix) :]
                if tail.isdigit():
                    busy.append(f"op {placed.program.label(int(tail))} on device {d}")
    what = "; running: " + ", ".join(busy) if busy else "; no op was running (waiting on inputs)"
    return f"the run passed its timeout of {timeout_s:g} s with {left} of {n} ops unfinished{what}"


def _poll(ready: Callable[[], bool], deadline: float, what: str) -> None:
    """Call ``ready()`` with a growing pause (1 ms doubling to 50 ms) until it is true; past ``deadline``, an
    EngineError saying that ``what`` (did not happen) within :data:`SETUP_TIMEOUT_S`."""
    delay = 0.001
    while not ready():
        if time.monotonic() > deadline:
            raise EngineError(f"set-up: {what} within {SETUP_TIMEOUT_S:g} s")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _await_workers(conn: Conn, want: dict[int, list[str]], states: tuple[str, ...], what: str,
                   num_devices: int, deadline: float) -> None:  # fmt: skip
    """Wait until every key in ``want[d]`` is in one of ``states`` on device ``d``'s worker."""
    want = {d: keys for d, keys in want.items() if keys}
    every = [k for keys in want.values() for k in keys]
    addrs = [conn.workers[d] for d in want]

    def ready() -> bool:
        try:
            got = conn.client.run(_worker_task_states, every, workers=addrs)
        except Exception:  # noqa: BLE001 - a worker that cannot answer: dead, or a real error
            _raise_if_dead(conn, num_devices)
            raise
        if all(got.get(conn.workers[d], {}).get(k) in states for d, keys in want.items() for k in keys):
            return True
        _raise_if_dead(conn, num_devices)
        return False

    if want:
        _poll(ready, deadline, f"{what} did not happen")


def _await_run(conn: Conn, futs: list[Any], sinks: np.ndarray, placed: PlacedProgram, prefix: str,
               timeout_s: float) -> None:  # fmt: skip
    """Wait for every op; raise EngineError on a kernel failure, a dead worker or the timeout.

    Only the sinks are waited on (every op precedes one, and a failure reaches
    every sink downstream of it), to keep the client's work -- which shares an
    event loop with our LocalCluster's scheduler -- small during the run.
    """
    client = conn.client
    pending = {futs[int(v)] for v in sinks}
    now = time.monotonic()
    deadline = now + timeout_s
    next_check = now + POLL_S
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise EngineError(_timeout_message(conn, futs, placed, prefix, timeout_s))
        how = "FIRST_COMPLETED" if len(pending) <= MAX_FIRST_COMPLETED else "ALL_COMPLETED"
        with suppress(Exception), client.as_current():  # a timeout, or a cancelled future (its status tells)
            wait(list(pending), timeout=min(POLL_S, remaining), return_when=how)
        done = {f for f in pending if f.status != "pending"}
        if any(f.status != "finished" for f in done):
            raise EngineError(_failure_message(futs, placed) or "a Dask task failed")
        pending -= done
        if pending and time.monotonic() >= next_check:
            _raise_if_dead(conn, placed.num_devices)
            next_check = time.monotonic() + POLL_S
    msg = _failure_message(futs, placed)
    if msg:  # pragma: no cover - a finished sink implies finished ancestors
        raise EngineError(msg)


def _run_once(
    conn: Conn,
    placed: PlacedProgram,
    calls: list[Any],
    tile_futs: dict[int, Any],
    *,
    timeout_s: float,
    keep_values: bool,
) -> tuple[Trace, list[np.ndarray | None]]:
    """One repeat: gates, then the graph, then open the gates and wait; the trace and (maybe) the outputs.

    1. Each device worker's thread(s) are taken by a gate task blocked on the
       run's ``Event``; we wait until every gate is executing.
    2. Every op is submitted (pinned, priority ``-v``); we wait until the
       scheduler holds them all and every source op sits in its worker's
       ready queue, behind the gate.
    3. The event is set: each worker runs its ready ops by priority, with no
       scheduler round trip. (Gating the sources through a dummy argument
       instead would hand them to an idle worker one message at a time, in the
       scheduler's set order, not by priority.)
    """
    client = conn.client
    prog = placed.program
    g = prog.graph
    n, D = g.num_ops, placed.num_devices
    dev = placed.devices
    run_id = f"doppler-{uuid.uuid4().hex[:10]}-{next(_RUN_IDS)}"
    prefix, gate_prefix = f"{run_id}-op", f"{run_id}-gate"
    event = Event(run_id, client=client)
    sources = np.flatnonzero(np.diff(g.pred_ptr) == 0)
    sinks = np.flatnonzero(np.diff(g.succ_ptr) == 0)
    gates: list[Any] = []
    futs: list[Any] = [None] * n
    ok = False
    stream = get_task_stream(client=client)
    stream.__enter__()
    try:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        gate_timeout = SETUP_TIMEOUT_S + timeout_s
        gate_keys: dict[int, list[str]] = {}
        for d in range(D):
            addr = conn.workers[d]
            gate_keys[d] = [f"{gate_prefix}{d}-{i}" for i in range(max(1, conn.threads.get(addr, 1)))]
            for key in gate_keys[d]:
                gates.append(client.submit(_gate, run_id, gate_timeout, key=key, workers=[addr],
                                           allow_other_workers=False, pure=False, priority=1 << 30))  # fmt: skip
        _await_workers(conn, gate_keys, ("executing",), "the gate tasks starting", D, deadline)
        for v in g.topo_order.tolist():
            d = int(dev[v])
            args = [
                tile_futs[id(tile)] if tile is not None else futs[o.op]
                for o, tile in zip(prog.operands[v], placed.tile_operands[v])
            ]
            futs[v] = client.submit(calls[v], *args, key=f"{prefix}{v}", workers=[conn.workers[d]],
                                    allow_other_workers=False, pure=False, priority=-v)  # fmt: skip
        keys = [f.key for f in futs]
        _poll(lambda: conn.client.run_on_scheduler(_scheduler_known, keys) >= len(keys), deadline,
              "the Dask scheduler did not take the graph")  # fmt: skip
        src_keys = {d: [f"{prefix}{int(v)}" for v in sources if int(dev[v]) == d] for d in range(D)}
        _await_workers(conn, src_keys, ("ready", "constrained"), "the source ops reaching their workers", D, deadline)
        event.set()
        _await_run(conn, futs, sinks, placed, prefix, timeout_s)
        ok = True
    finally:
        with suppress(Exception):
            event.set()  # release any gate still waiting, whatever happened
        if not ok:
            with suppress(Exception):
                client.cancel([f for f in futs + gates if f is not None], force=True)
    stream.__exit__(None, None, None)
    records = [r for r in stream.data if str(r.get("key", "")).startswith(run_id)]
    gate_starts = [
        float(ss["start"])
        for r in records
        if str(r.get("key", "")).startswith(gate_prefix)
        for ss in r.get("startstops", ())
        if ss.get("action") == "compute"
    ]
    since = min(gate_starts) - 1.0 if gate_starts else 0.0  # nothing of ours moved before the gates ran
    fetches = _bounded(lambda: client.run(_incoming_transfers, prefix, since, workers=conn.workers[:D]),
                       "collecting the workers' transfer logs")  # fmt: skip
    trace = build_trace(placed, conn.workers, records, fetches, prefix, gate_prefix)
    values: list[np.ndarray | None] = []
    if keep_values and not prog.is_synthetic:
        values = list(_bounded(lambda: client.gather(futs), "gathering the outputs"))
    with suppress(Exception):
        event.clear()
    client.cancel(futs + gates)
    return trace, values


def _bounded(fn: Any, what: str, timeout_s: float = SETUP_TIMEOUT_S) -> Any:
    """``fn()`` on a helper thread, an EngineError if it takes longer than ``timeout_s`` (a worker
    that dies after the run but before its results are collected must not hang the caller)."""
    box = on_thread(fn, "doppler-dask-collect", timeout_s)
    if not box:
        raise EngineError(f"Dask: {what} took longer than {timeout_s:g} s (a worker died after the run?)")
    if "error" in box:
        raise EngineError(f"Dask: {what} failed: {type(box['error']).__name__}: {box['error']}")
    return box["value"]


def run_dask(
    placed: PlacedProgram,
    *,
    repeats: int,
    timeout_s: float,
    scheduler: str | None,
    keep_values: bool,
) -> tuple[list[RunRecord], dict[str, Any]]:
    """Run ``placed`` ``repeats`` times on Dask: (one :class:`RunRecord` per repeat, info).

    The last repeat's record holds one array per op, gathered to this process only when
    ``keep_values`` (the others hold none). ``info``: the scheduler's address, the worker of each
    device, whether the cluster is a LocalCluster started here, the threads
    of each device's worker, and Dask's overhead per dependent op
    (``overhead_per_op_s``: a chain of no-op ops, as :func:`measure_overhead`,
    measured once per cluster). See the module docstring.
    """
    D = int(placed.num_devices)
    conn = get_conn(scheduler, D, timeout_s)  # reaching a --scheduler waits at most timeout_s too
    try:
        if conn.overhead_s is None:
            conn.overhead_s = _chain_overhead(conn, OVERHEAD_CHAIN_OPS)
        calls = _task_callables(placed)
        # device-local input tiles, scattered once to their worker, before any clock
        per_device: dict[int, dict[int, np.ndarray]] = {}
        for v, tiles in enumerate(placed.tile_operands):
            for tile in tiles:
                if tile is not None:
                    per_device.setdefault(int(placed.devices[v]), {})[id(tile)] = tile
        tile_futs: dict[int, Any] = {}
        for d, tiles in per_device.items():
            scattered = conn.client.scatter(list(tiles.values()), workers=[conn.workers[d]], broadcast=False,
                                            hash=False, timeout=SETUP_TIMEOUT_S)  # fmt: skip
            tile_futs.update(zip(tiles, scattered))
        records = [RunRecord(*_run_once(conn, placed, calls, tile_futs, timeout_s=timeout_s,
                                        keep_values=keep_values and r == repeats - 1))
                   for r in range(repeats)]  # fmt: skip
        if tile_futs:
            conn.client.cancel(list(tile_futs.values()))
        conn.runs += repeats
    except EngineError:
        discard(conn)
        raise
    except Exception as e:  # noqa: BLE001 - a broken cluster is discarded, the error named
        discard(conn)
        raise EngineError(f"the Dask run failed: {type(e).__name__}: {e}") from e
    info = {
        "scheduler": str(conn.client.scheduler.address),
        "workers": list(conn.workers[:D]),
        "local_cluster": conn.cluster is not None,
        "threads_per_worker": [conn.threads.get(w, 0) for w in conn.workers[:D]],
        "overhead_per_op_s": conn.overhead_s,
    }
    if conn.cluster is not None and conn.runs >= RECYCLE_AFTER_RUNS:
        discard(conn)  # the next run starts a fresh LocalCluster (bounded memory over long trainings)
    return records, info


# ------------------------------------------------------------------ overhead
def _chain_overhead(conn: Conn, num_ops: int, op_seconds: float = 0.0) -> float:
    from doppler.ir.graph import DataflowGraph
    from doppler.hardware.presets import unit

    g = DataflowGraph.from_arrays(np.ones(num_ops), np.full(num_ops, 8.0), np.arange(num_ops - 1),
                                  np.arange(1, num_ops), name="noop-chain")  # fmt: skip
    placed = build_program(g, cluster=unit(1), time_scale=op_seconds).place(np.zeros(num_ops, dtype=np.int64), 1)
    calls = _task_callables(placed)
    best = float("inf")
    for _ in range(2):
        trace, _ = _run_once(conn, placed, calls, {}, timeout_s=SETUP_TIMEOUT_S + 2 * num_ops * op_seconds,
                             keep_values=False)  # fmt: skip
        kernels = float((trace.op_end - trace.op_start).sum())
        best = min(best, (trace.makespan_s - kernels) / num_ops)
    return best


def measure_overhead(
    num_devices: int = 1, *, num_ops: int = 200, op_seconds: float = 0.0, scheduler: str | None = None
) -> float:
    """Dask's time per dependent op (seconds): (makespan - kernel time) / ops of a chain on one worker.

    The chain has ``num_ops`` synthetic ops of ``op_seconds`` each (writing 8
    bytes) on device 0 of the cached cluster of ``num_devices`` devices, so
    every op waits for the previous one: what is left beyond the kernels is the
    per-op round trip -- the worker reports the finished producer to the
    scheduler, which hands the consumer to the worker. Best of two runs.

    With no-op kernels (the default) this is bounded below by the scheduler's
    message batching: Dask sends to a worker at most once per 5 ms (and a
    worker to the scheduler once per 2 ms), so a chain of very short ops pays
    about 5 ms per op; ops longer than that pay only the round trip (about
    3 ms on a 2-core machine). ``benchmarks/dask_overhead.py`` prints both.
    """
    conn = get_conn(scheduler, int(num_devices))
    try:
        return _chain_overhead(conn, int(num_ops), float(op_seconds))
    except Exception:
        discard(conn)
        raise
