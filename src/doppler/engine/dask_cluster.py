"""The Dask engine's clusters: a cached client per scheduler (our own LocalCluster of same-host,
single-threaded workers, or an external scheduler), opened on first use and discarded when broken.
"""

from __future__ import annotations

import atexit
import threading
from dataclasses import dataclass, field
from typing import Any

import dask
from distributed import Client, LocalCluster, Nanny, Worker

from doppler.engine.program import EngineError, synthetic_kernel

__all__ = ["Conn", "close_clusters", "discard", "get_conn", "local_client"]

#: longest wait for a LocalCluster to start, a client to connect, the set-up of a run (seconds)
SETUP_TIMEOUT_S = 60.0
#: how long to wait for an external scheduler to have enough workers (seconds)
WORKER_WAIT_S = 2.0
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


def _open(scheduler: str | None, num_devices: int) -> Conn:
    key: tuple[str, Any] = ("local", num_devices) if scheduler is None else ("remote", scheduler)
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
                    scheduler_kwargs={"dashboard_address": ":0"},  # no fixed port (dashboard itself off)
                )
                client = Client(cluster, set_as_default=False, timeout=SETUP_TIMEOUT_S)
        else:
            client = Client(scheduler, set_as_default=False, timeout=SETUP_TIMEOUT_S)
        try:
            client.wait_for_workers(num_devices, timeout=SETUP_TIMEOUT_S if cluster is not None else WORKER_WAIT_S)
        except TimeoutError:
            pass  # counted below
        threads = {str(a): int(t) for a, t in client.nthreads().items()}
        workers = sorted(threads)
        if len(workers) < num_devices:
            raise EngineError(f"the Dask scheduler has {len(workers)} workers, {num_devices} devices need as many")
        client.run(_warm_worker, workers=workers)
        client.get_task_stream(count=0)  # installs the scheduler's task-stream plugin
        return Conn(client, cluster, workers, key, threads)
    except EngineError:
        _close(client, cluster)
        raise
    except Exception as e:  # noqa: BLE001
        _close(client, cluster)
        where = "a LocalCluster" if scheduler is None else f"the Dask scheduler at {scheduler}"
        raise EngineError(f"could not start or reach {where}: {type(e).__name__}: {e}") from e


def _close(client: Any, cluster: Any) -> None:
    for obj in (client, cluster):
        if obj is None:
            continue
        try:
            obj.close(timeout=CLOSE_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a broken cluster may not close cleanly; it is abandoned
            pass


def get_conn(scheduler: str | None, num_devices: int) -> Conn:
    key: tuple[str, Any] = ("local", num_devices) if scheduler is None else ("remote", scheduler)
    with _LOCK:
        conn = _CONNS.get(key)
        if conn is not None and conn.client.status != "running":
            discard(conn)
            conn = None
        if conn is not None and len(conn.workers) < num_devices:  # an external cluster may have grown since
            discard(conn)
            conn = None
        if conn is None:
            conn = _open(scheduler, num_devices)
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
