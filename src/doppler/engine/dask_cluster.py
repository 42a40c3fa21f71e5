"""The Dask engine's clusters: a cached client per scheduler (our own LocalCluster of same-host,
single-threaded workers, or an external scheduler), opened on first use and discarded when broken.

Every wait is bounded. Reaching an external scheduler takes at most the run's ``timeout_s``, capped
at :data:`SETUP_TIMEOUT_S` (plus :data:`CONNECT_GRACE_S`), then :data:`WORKER_WAIT_S` for its workers;
starting our LocalCluster (its worker processes, our client's connection, the workers registering)
takes at most :data:`SETUP_TIMEOUT_S`, whatever ``timeout_s`` (a short time-out meant for runs must not
fail a cold start); closing a cluster at most :data:`CLOSE_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, Callable

import dask
from distributed import Client, LocalCluster, Nanny, Worker

from doppler.engine.program import EngineError, synthetic_kernel

__all__ = ["Conn", "close_clusters", "discard", "get_conn", "local_client"]

#: longest wait for a LocalCluster to start, a client to connect, the set-up of a run (seconds)
SETUP_TIMEOUT_S = 60.0
#: how long to wait for an external scheduler to have enough workers, once connected (seconds)
WORKER_WAIT_S = 2.0
#: how long past its own time-out Dask's connection attempt may take to report its error before it is given up (seconds)
CONNECT_GRACE_S = 1.0
#: how long a failed run's cluster gets to close (seconds)
CLOSE_TIMEOUT_S = 10.0
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _warm_worker(dask_worker: Any = None) -> float:
    """Import the kernels, compile the synthetic spin and pin BLAS to one thread, before any clock starts."""
    from threadpoolctl import threadpool_limits

    from doppler.engine.program import spin_rate_per_s

    threadpool_limits(limits=1)  # not a context: stays in force in this worker process
    synthetic_kernel(0.0, 8, 0)
    return spin_rate_per_s()


class SameHostWorker(Worker):
    """A worker on the scheduler's host: it reports raw clock times (no estimated clock offset)."""

    @property  # type: ignore[override]
    def scheduler_delay(self) -> float:
        return 0.0

    @scheduler_delay.setter
    def scheduler_delay(self, value: float) -> None:
        pass


class SameHostNanny(Nanny):
    """The nanny of a :class:`SameHostWorker` (what our LocalCluster starts)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["worker_class"] = SameHostWorker
        super().__init__(*args, **kwargs)


@dataclass
class Conn:
    """A client connected to a Dask cluster, with one worker per device."""

    client: Any
    cluster: Any  # a LocalCluster we own, or None for an external scheduler
    workers: list[str]  # sorted addresses (device d = workers[d] for d < num_devices)
    key: tuple[str, Any]
    threads: dict[str, int] = field(default_factory=dict)
    overhead_s: float | None = None
    runs: int = 0  # repeats run on this connection (a LocalCluster is recycled after RECYCLE_AFTER_RUNS)


_CONNS: dict[tuple[str, Any], Conn] = {}
_LOCK = threading.RLock()


def _local_config() -> dict[str, Any]:
    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    env.update(_ONE_THREAD)
    return {
        "distributed.scheduler.work-stealing": False,
        "distributed.scheduler.active-memory-manager.start": False,
        "distributed.worker.profile.enabled": False,
        # bounded histories (the in-process scheduler keeps them): enough for one run's transfers and
        # task-stream records of graphs up to 20k ops, without growing by megabytes per run for ever
        "distributed.admin.low-level-log-length": 20_000,
        "distributed.scheduler.dashboard.tasks.task-stream-length": 20_000,
        "distributed.nanny.pre-spawn-environ": env,
    }


def _probe(address: str, timeout_s: float) -> None:
    """Raise unless a Dask scheduler at ``address`` answers Dask's handshake and says what it is within
    ``timeout_s``.

    Dask's ``Client(address, timeout=...)`` retries a refused connection until its time-out (which
    overrides ``distributed.comm.timeouts.connect``), but waits for ever on the handshake of a peer that
    accepts the connection and never answers; and a peer that is not a scheduler (other bytes, a worker)
    leaves a half-made client whose clean-up at exit waits twice the time-out. This probe is one bounded
    exchange on its own event loop (on a helper thread: the caller may run one), closed whatever happens.
    """
    from distributed.comm import connect

    async def handshake() -> None:
        comm = await connect(address, timeout=timeout_s)  # retries a refused connection until timeout_s
        try:
            await comm.write({"op": "identity"})
            kind = str((await comm.read()).get("type", "?"))
        finally:
            await comm.close()
        if "Scheduler" not in kind:  # a worker's or a nanny's address, say
            raise ConnectionError(f"it is a Dask {kind}, not a scheduler")

    error = on_thread(lambda: asyncio.run(asyncio.wait_for(handshake(), timeout_s + CONNECT_GRACE_S)),
                      "doppler-dask-probe").get("error")  # fmt: skip
    if isinstance(error, asyncio.TimeoutError):
        raise TimeoutError(f"no answer within {timeout_s:g} s (not a Dask scheduler's port?)")
    if isinstance(error, OSError):  # refused until the time-out, no such host, a closed connection, not a scheduler
        raise error
    if error is not None:  # bytes that are not Dask's (an absurd frame length, ...)
        raise ConnectionError(f"the peer does not speak Dask's protocol ({type(error).__name__}: "
                              f"{_first_line(str(error))[:120]})")  # fmt: skip


def on_thread(fn: Callable[[], Any], name: str, timeout_s: float | None = None) -> dict[str, Any]:
    """``fn()`` on a daemon helper thread, waited for at most ``timeout_s`` (None: until it ends): ``{"value":
    its result}``, ``{"error": what it raised}``, or ``{}`` while it still runs."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    th = threading.Thread(target=call, name=name, daemon=True)
    th.start()
    th.join(timeout_s)
    return {} if th.is_alive() else box


def _open(scheduler: str | None, num_devices: int, connect_timeout_s: float, key: tuple[str, Any]) -> Conn:
    cluster = client = None
    try:
        if scheduler is None:
            with dask.config.set(_local_config()):
                cluster = LocalCluster(
                    n_workers=num_devices,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    memory_limit=0,
                    worker_class=SameHostNanny,
                    env=dict(_ONE_THREAD),
                    death_timeout=SETUP_TIMEOUT_S,  # a worker process that does not start in time fails the start
                    scheduler_kwargs={"dashboard_address": ":0"},  # no fixed port (dashboard itself off)
                )
                client = Client(cluster, set_as_default=False, timeout=SETUP_TIMEOUT_S)
        else:
            _probe(scheduler, connect_timeout_s)
            client = Client(scheduler, set_as_default=False, timeout=connect_timeout_s)
        with suppress(TimeoutError):  # counted below
            client.wait_for_workers(num_devices, timeout=SETUP_TIMEOUT_S if cluster is not None else WORKER_WAIT_S)
        threads = {str(a): int(t) for a, t in client.nthreads().items()}
        workers = sorted(threads)
        if len(workers) < num_devices:
            at = "" if scheduler is None else f" at {scheduler}"
            raise EngineError(f"the Dask scheduler{at} has {len(workers)} workers, {num_devices} devices need as many")
        client.run(_warm_worker, workers=workers)
        client.get_task_stream(count=0)  # installs the scheduler's task-stream plugin
        return Conn(client, cluster, workers, key, threads)
    except EngineError:
        _close(client, cluster)
        raise
    except Exception as e:  # noqa: BLE001
        _close(client, cluster)
        what = "start a LocalCluster" if scheduler is None else f"reach the Dask scheduler at {scheduler}"
        raise EngineError(f"could not {what}: {type(e).__name__}: {_first_line(str(e))}") from e


def _first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""


def _close(client: Any, cluster: Any) -> None:
    for obj in (client, cluster):
        if obj is not None:
            with suppress(Exception):  # a broken cluster may not close cleanly; it is abandoned
                obj.close(timeout=CLOSE_TIMEOUT_S)


def get_conn(scheduler: str | None, num_devices: int, timeout_s: float = SETUP_TIMEOUT_S) -> Conn:
    """The cached connection for ``scheduler`` (None: our LocalCluster of ``num_devices`` workers), opened
    if there is none or it is broken; reaching an external scheduler waits at most ``timeout_s`` (capped
    at :data:`SETUP_TIMEOUT_S`). Raises EngineError, naming the scheduler, if it cannot be opened."""
    key: tuple[str, Any] = ("local", num_devices) if scheduler is None else ("remote", scheduler)
    with _LOCK:
        conn = _CONNS.get(key)
        # a broken client, or an external cluster that may have grown since: opened afresh
        if conn is not None and (conn.client.status != "running" or len(conn.workers) < num_devices):
            discard(conn)
            conn = None
        if conn is None:
            conn = _open(scheduler, num_devices, min(float(timeout_s), SETUP_TIMEOUT_S), key)
            _CONNS[key] = conn
        return conn


def discard(conn: Conn) -> None:
    with _LOCK:
        if _CONNS.get(conn.key) is conn:
            del _CONNS[conn.key]
    _close(conn.client, conn.cluster)


def close_clusters() -> None:
    """Close every cached LocalCluster and client (also run at interpreter exit)."""
    with _LOCK:
        conns = list(_CONNS.values())
        _CONNS.clear()
    for conn in conns:
        _close(conn.client, conn.cluster)


atexit.register(close_clusters)


def local_client(num_devices: int) -> Any:
    """The cached ``distributed.Client`` of the LocalCluster for ``num_devices`` devices (started if needed)."""
    return get_conn(None, num_devices).client
