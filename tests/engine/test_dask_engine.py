"""The Dask engine (``run(..., engine="dask")``) on a LocalCluster of 2 single-threaded workers.

One LocalCluster serves the module (cached by the engine, closed at the end);
each fault test discards it, as the engine does after any failure, and then
checks that the next run gets a healthy one.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import threading
import time

import numpy as np
import pytest

pytest.importorskip("distributed")

from doppler import workloads  # noqa: E402
from doppler.workloads import references
from doppler.engine import EngineError, RunOptions, build_program, run  # noqa: E402
from doppler.engine import dask_cluster, dask_engine  # noqa: E402
from doppler.ir.graph import DataflowGraph  # noqa: E402
from doppler.hardware.presets import cluster  # noqa: E402

D = 2
EPS = 1e-6


@pytest.fixture(scope="module", autouse=True)
def local_cluster():
    dask_cluster.local_client(D)  # start (and warm) the module's LocalCluster once
    yield
    dask_cluster.close_clusters()


def synthetic_graph(n: int, src, dst, name: str = "g") -> DataflowGraph:
    return DataflowGraph.from_arrays(np.ones(n), np.full(n, 64.0), np.asarray(src, np.int64),
                                     np.asarray(dst, np.int64), name=name)  # fmt: skip


def small_run() -> None:
    """A run that must succeed (after a fault: on a fresh cluster)."""
    g = synthetic_graph(4, [0, 1, 2], [1, 2, 3])
    res = run(g, [0, 1, 0, 1], num_devices=D, options=RunOptions(engine="dask"), cluster=cluster("unit:2"), time_scale=1e-3)
    assert res.trace.num_ops == 4 and res.makespan_s > 0
    check_trace(g, res.trace)


def check_trace(g: DataflowGraph, tr, eps: float = EPS) -> None:
    assert tr.mode == "engine:dask"
    assert np.all(tr.op_start >= tr.op_ready - eps)
    assert np.all(tr.op_end >= tr.op_start)
    assert np.all(tr.op_ready >= -eps)
    for d in np.unique(tr.op_device):
        ops = np.flatnonzero(tr.op_device == d)
        ops = ops[np.argsort(tr.op_start[ops], kind="stable")]
        assert np.all(tr.op_start[ops[1:]] >= tr.op_end[ops[:-1]] - eps), f"ops overlap on device {d}"
    for v in range(g.num_ops):
        for u in g.predecessors(v):
            if tr.op_device[u] == tr.op_device[v]:
                assert tr.op_start[v] >= tr.op_end[u] - eps
            assert tr.op_ready[v] >= tr.op_end[u] - eps
    pairs = list(zip(tr.tr_src_op.tolist(), tr.tr_dst_device.tolist()))
    assert pairs == sorted(pairs) and len(set(pairs)) == len(pairs)
    for k, (u, b) in enumerate(pairs):
        assert tr.tr_end[k] >= tr.tr_start[k] >= tr.op_end[u] - eps
        assert tr.tr_src_device[k] != b and b != tr.op_device[u]
        assert tr.tr_bytes[k] == g.output_bytes[u]
    assert tr.makespan_s == pytest.approx(float(tr.op_end.max()))


def assignments(n: int) -> dict[str, np.ndarray]:
    return {
        "single": np.zeros(n, np.int64),
        "round_robin": np.arange(n) % D,
        "random": np.random.default_rng(0).integers(0, D, n),
    }


def test_outputs_of_every_workload_at_small_size_match_reference() -> None:
    """The issue's sizes (float32, the graphs' own dtype), every workload, under critical_path."""
    from doppler.methods import assign

    for workload in ("chainmm", "ffnn", "llama_block", "llama_layer"):
        g = workloads.build(workload, size="small")
        x = references.make_inputs(g, seed=0, dtype=np.float64)
        ref = workloads.reference(g, x)
        a = assign(g, cluster(f"cpu4:{D}"), "critical_path").devices
        res = run(g, a, num_devices=D, options=RunOptions(engine="dask"), program=build_program(g, inputs=x))
        for k in ref:
            scale = float(np.abs(ref[k]).max())
            np.testing.assert_allclose(res.outputs[k], ref[k], rtol=1e-3, atol=1e-4 * scale, err_msg=f"{workload}/{k}")
        check_trace(g, res.trace)


@pytest.mark.parametrize("workload", ["chainmm", "ffnn", "llama_block", "llama_layer"])
def test_outputs_match_reference(workload):
    g = workloads.build(workload, size="tiny")
    x = references.make_inputs(g, seed=0, dtype=np.float64)
    prog = build_program(g, inputs=x, dtype=np.float64)
    ref = workloads.reference(g, x)
    for name, a in assignments(g.num_ops).items():
        res = run(g, a, num_devices=D, options=RunOptions(engine="dask"), program=prog)
        assert res.engine == "dask" and res.num_devices == D
        assert set(res.outputs) == set(ref)
        for k in ref:
            assert np.allclose(res.outputs[k], ref[k]), f"{workload} {name}: output {k} differs"
        check_trace(g, res.trace)
        # Dask moves each remote output once per destination device, as the model says
        moved = list(zip(res.trace.tr_src_op.tolist(), res.trace.tr_dst_device.tolist()))
        assert moved == prog.place(np.asarray(a), D).transfers()
        info = res.info
        assert info["local_cluster"] and len(info["workers"]) == D and info["workers"] == sorted(info["workers"])
        assert info["threads_per_worker"] == [1] * D
        assert 0 < info["overhead_per_op_s"] < 0.1


def test_repeats_keep_values_and_info():
    g = workloads.build("ffnn", size="tiny")
    a = np.arange(g.num_ops) % D
    res = run(g, a, num_devices=D, options=RunOptions(engine="dask", repeats=3), seed=1, keep_outputs=False)
    assert len(res.makespans_s) == 3 and res.outputs == {}
    assert res.makespan_s == pytest.approx(float(np.median(res.makespans_s)))
    check_trace(g, res.trace)
    runs, info = dask_engine.run_dask(
        build_program(g, seed=1).place(a, D), repeats=2, timeout_s=60.0, scheduler=None, keep_values=True
    )
    assert len(runs) == 2 and runs[0].values == []  # outputs are gathered from the last repeat only
    values = runs[-1].values
    assert len(values) == g.num_ops and all(isinstance(v, np.ndarray) for v in values)
    check_trace(g, runs[0].trace)
    assert info["scheduler"].startswith("tcp://127.0.0.1:")
    import json

    json.dumps(info)


def test_priority_among_ready_sources():
    """Independent ops on one device, ready together, run lowest op id first (Dask's priority, not FIFO)."""
    g = synthetic_graph(6, [], [])
    res = run(g, np.zeros(6, np.int64), num_devices=D, options=RunOptions(engine="dask"), cluster=cluster("unit:2"), time_scale=5e-3)
    tr = res.trace
    assert list(np.argsort(tr.op_start, kind="stable")) == list(range(6))
    assert np.all(tr.op_ready <= tr.op_start[0] + EPS)  # every source is ready when the gate opens
    check_trace(g, tr)


def test_synthetic_transfers_measured():
    """Synthetic ops alternating over 2 devices: every edge is one measured transfer feeding the consumer."""
    n = 8
    g = DataflowGraph.from_arrays(np.ones(n), np.full(n, 2e6), np.arange(n - 1), np.arange(1, n), name="chain")
    res = run(g, np.arange(n) % D, num_devices=D, options=RunOptions(engine="dask"), cluster=cluster("unit:2"),
              time_scale=2e-3, keep_outputs=False)  # fmt: skip
    tr = res.trace
    check_trace(g, tr)
    assert tr.num_transfers == n - 1
    np.testing.assert_array_equal(tr.tr_src_op, np.arange(n - 1))
    np.testing.assert_array_equal(tr.tr_dst_device, (np.arange(1, n)) % D)
    np.testing.assert_array_equal(tr.tr_src_device, np.arange(n - 1) % D)
    # the consumer became ready when its input's fetch ended
    np.testing.assert_allclose(tr.op_ready[1:], tr.tr_end, atol=EPS)


def test_kernel_failure_names_the_op_then_recovers():
    g = workloads.build("llama_block", size="tiny")
    x = references.make_inputs(g, seed=0, dtype=np.float64)
    prog = build_program(g, inputs=x, dtype=np.float64)
    v = next(i for i, s in enumerate(prog.specs) if s["kernel"] == "map")
    prog.specs = list(prog.specs)
    prog.specs[v] = copy.deepcopy(prog.specs[v])
    prog.specs[v]["fn"] = "no_such_fn"
    a = np.arange(g.num_ops) % D
    with pytest.raises(EngineError) as err:
        run(g, a, num_devices=D, options=RunOptions(engine="dask", timeout_s=30), program=prog)
    msg = str(err.value)
    assert f"op {prog.label(v)}" in msg and f"device {a[v]}" in msg
    small_run()


def _sleepy_chain(n: int, seconds: float) -> tuple[DataflowGraph, object]:
    g = synthetic_graph(n, np.arange(n - 1), np.arange(1, n), name="sleepy")
    return g, build_program(g, cluster=cluster("unit:2"), time_scale=seconds)


def test_killed_worker_raises_then_recovers():
    g, prog = _sleepy_chain(16, 0.25)  # ~4 s of work alternating over both devices
    client = dask_cluster.local_client(D)
    workers = sorted(client.nthreads())
    pids = client.run(os.getpid)
    out: dict[str, object] = {}

    def target() -> None:
        try:
            run(g, np.arange(16) % D, num_devices=D, options=RunOptions(engine="dask", timeout_s=60), program=prog)
            out["result"] = "finished"
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    th = threading.Thread(target=target, daemon=True)
    t0 = time.monotonic()
    th.start()
    # wait until the graph is running (some op is processing), then kill device 1's worker
    while time.monotonic() - t0 < 30:
        if any(any("-op" in str(k) for k in keys) for keys in client.processing().values()):
            break
        time.sleep(0.02)
    time.sleep(0.4)
    os.kill(pids[workers[1]], signal.SIGKILL)
    th.join(30)
    assert not th.is_alive(), "the run hung after its worker died"
    err = out.get("error")
    assert isinstance(err, EngineError), out
    assert "device 1" in str(err) and "died" in str(err)
    assert time.monotonic() - t0 < 30
    small_run()


def test_timeout_raises_quickly_then_recovers():
    g = workloads.build("random", num_ops=20)
    c = cluster("unit:2")
    scale = 0.5 / float(np.median(c.compute_time_s(g)))
    a = np.arange(g.num_ops) % D
    t0 = time.monotonic()
    with pytest.raises(EngineError, match="timeout of 0.3 s"):
        run(g, a, num_devices=D, options=RunOptions(engine="dask", timeout_s=0.3), cluster=c, time_scale=scale, keep_outputs=False)
    assert time.monotonic() - t0 < 15
    small_run()


def test_too_few_workers_for_an_external_scheduler():
    client = dask_cluster.local_client(D)
    addr = client.scheduler.address
    g = synthetic_graph(3, [0, 1], [1, 2])
    # the module's own 2-worker cluster, reached by address: 3 devices are too many
    with pytest.raises(EngineError, match="3 devices"):
        run(g, [0, 1, 2], num_devices=3, options=RunOptions(engine="dask", scheduler=addr), cluster=cluster("unit:3"))
    res = run(g, [0, 1, 0], num_devices=D, options=RunOptions(engine="dask", scheduler=addr), cluster=cluster("unit:2"), time_scale=1e-3)
    assert res.info["scheduler"] == addr and res.info["local_cluster"] is False
    check_trace(g, res.trace, eps=5e-3)  # an external cluster's times carry Dask's clock-offset estimate


def test_a_workers_address_is_refused_at_once_as_not_a_scheduler():
    addr = sorted(dask_cluster.local_client(D).nthreads())[0]
    t0 = time.monotonic()
    with pytest.raises(EngineError, match=rf"scheduler at {re.escape(addr)}: .* \w*Worker, not a scheduler"):
        dask_cluster.get_conn(addr, D, timeout_s=5.0)
    assert time.monotonic() - t0 < 5


def test_measure_overhead():
    per_op = dask_engine.measure_overhead(D, num_ops=30)
    assert 0 < per_op < 0.1


def test_repeated_dask_runs_do_not_keep_their_data(monkeypatch) -> None:
    """A run scatters input tiles and makes outputs (~90 MB for ffnn, size small); none of it
    may stay behind in this process.

    Known limit: Dask's in-process scheduler and client keep a few MB of history per run
    here, which recycling the LocalCluster every RECYCLE_AFTER_RUNS runs bounds only in
    part; so the check is that the growth per run is a small fraction of the data a run
    moves, which catches any run's tiles or outputs being kept."""
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(dask_engine, "RECYCLE_AFTER_RUNS", 10)
    g = workloads.build("ffnn", size="small")
    prog = build_program(g)
    a = np.arange(g.num_ops) % D
    data_per_run = sum(t.nbytes for t in prog.tiles) + float(g.output_bytes.sum())
    for _ in range(5):
        run(g, a, num_devices=D, options=RunOptions(engine="dask"), program=prog, keep_outputs=False)
    before = psutil.Process().memory_info().rss
    for _ in range(10):  # a recycle (after run 10) among them; one run's data kept would be 4x the bound
        run(g, a, num_devices=D, options=RunOptions(engine="dask"), program=prog, keep_outputs=False)
    grown_per_run = (psutil.Process().memory_info().rss - before) / 10
    assert grown_per_run < 0.25 * data_per_run, f"{grown_per_run / 1e6:.1f} MB per run of {data_per_run / 1e6:.0f} MB moved"
