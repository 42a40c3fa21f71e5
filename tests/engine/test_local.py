"""The local engine: outputs equal the untiled computation, traces obey the WC contract, faults never hang."""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import pytest

from doppler import workloads
from doppler.workloads import references
from doppler.ir.assignment import AssignmentError
from doppler.methods import assign
from doppler.engine import EngineError, RunOptions, build_program, run
from doppler.ir.graph import DataflowGraph
from doppler.hardware.presets import cluster

WORKLOADS = ("chainmm", "ffnn", "llama_block", "llama_layer")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch.cuda.is_available())


#: the local engine's device types this machine can run (CUDA ones only where a GPU is present)
DEVICE_TYPES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _has_cuda(), reason="no CUDA device here"))]


def _assignments(g: DataflowGraph, num_devices: int) -> dict[str, np.ndarray]:
    cl = cluster(f"cpu4:{num_devices}")
    return {
        "single": np.zeros(g.num_ops, np.int64),
        "round_robin": np.arange(g.num_ops) % num_devices,
        "critical_path": assign(g, cl, "critical_path").devices,
        "random": np.random.default_rng(1).integers(0, num_devices, g.num_ops),
    }


def check_trace(g: DataflowGraph, tr, num_devices: int) -> None:
    """The WC contract on a measured trace (docs/design.md, Execution semantics), up to clock resolution. On CPU
    devices (mode ``engine:local``) a device also makes the copies into it, one thing at a time."""
    eps = 1e-9
    n = g.num_ops
    copies_inbound = tr.mode == "engine:local"
    assert (tr.op_end >= tr.op_start - eps).all()
    assert (tr.op_start >= tr.op_ready - eps).all()
    for d in range(num_devices):  # one op (or inbound copy) at a time per device
        into = tr.tr_dst_device == d if copies_inbound else np.zeros(tr.num_transfers, dtype=bool)
        start = np.concatenate([tr.op_start[tr.op_device == d], tr.tr_start[into]])
        end = np.concatenate([tr.op_end[tr.op_device == d], tr.tr_end[into]])
        order = np.argsort(start)
        assert (start[order][1:] >= end[order][:-1] - eps).all()
    arrival = tr.arrival_s(g)
    need = set()
    for v in range(n):
        d = int(tr.op_device[v])
        for u in g.predecessors(v):
            u = int(u)
            if int(tr.op_device[u]) != d:
                need.add((u, d))
            assert tr.op_ready[v] >= arrival[(u, d)] - eps  # ready only after every input arrived
    got = list(zip(tr.tr_src_op.tolist(), tr.tr_dst_device.tolist()))
    assert len(got) == len(set(got)) and set(got) == need  # one transfer per (op, remote device)
    assert (tr.tr_start >= tr.op_end[tr.tr_src_op] - eps).all()
    assert (tr.tr_end >= tr.tr_start - eps).all()
    for a, b in set(zip(tr.tr_src_device.tolist(), tr.tr_dst_device.tolist())):  # one copy at a time per link
        ks = np.flatnonzero((tr.tr_src_device == a) & (tr.tr_dst_device == b))
        ks = ks[np.argsort(tr.tr_start[ks])]
        assert (tr.tr_start[ks[1:]] >= tr.tr_end[ks[:-1]] - eps).all()
    assert tr.makespan_s == pytest.approx(tr.op_end.max())


def tiny_float64_case(name: str):
    """(graph, reference outputs, float64 program) of a workload at size tiny."""
    g = workloads.build(name, size="tiny")
    x = references.make_inputs(g, seed=0, dtype=np.float64)
    return g, workloads.reference(g, x), build_program(g, inputs=x, dtype=np.float64)


@pytest.mark.parametrize("name", WORKLOADS)
def test_outputs_equal_untiled_numpy_tiny_float64(name: str) -> None:
    g, ref, prog = tiny_float64_case(name)
    for label, dev in _assignments(g, 3).items():
        res = run(g, dev, num_devices=3, program=prog)
        for k in ref:
            np.testing.assert_allclose(res.outputs[k], ref[k], rtol=1e-10, atol=1e-12, err_msg=f"{name}/{label}/{k}")
        check_trace(g, res.trace, 3)


@pytest.mark.parametrize("name", WORKLOADS)
def test_outputs_equal_untiled_numpy_small_float32(name: str) -> None:
    """The issue's sizes: every workload at size=small, in the graph's own float32, on 2 devices."""
    g = workloads.build(name, size="small")
    x = references.make_inputs(g, seed=0, dtype=np.float64)
    ref = workloads.reference(g, x)
    prog = build_program(g, inputs=x)
    assert prog.dtype == np.float32
    for label, dev in _assignments(g, 2).items():
        res = run(g, dev, num_devices=2, program=prog)
        for k in ref:
            scale = float(np.abs(ref[k]).max())
            np.testing.assert_allclose(res.outputs[k], ref[k], rtol=1e-3, atol=1e-4 * scale, err_msg=f"{name}/{label}/{k}")
        check_trace(g, res.trace, 2)


def test_repeats_keep_every_makespan_and_take_the_median() -> None:
    g = workloads.build("ffnn", size="tiny")
    res = run(g, np.arange(g.num_ops) % 2, num_devices=2, options=RunOptions(repeats=3, warmup=1))
    assert len(res.makespans_s) == 3 and all(m > 0 for m in res.makespans_s)
    assert res.makespan_s == pytest.approx(float(np.median(res.makespans_s)))
    assert res.trace.makespan_s in res.makespans_s  # the median run's trace
    assert res.to_json()["makespans_s"] == res.makespans_s


def test_cost_only_graph_runs_synthetic_kernels_sized_by_the_cluster() -> None:
    g = workloads.build("random", num_ops=12, width=4, seed=3)
    cl = cluster("unit:2")
    comp = cl.compute_time_s(g)[:, 0]
    scale = 0.004 / comp.max()  # the longest op lasts 4 ms
    dev = np.arange(g.num_ops) % 2
    res = run(g, dev, cluster=cl, time_scale=scale)
    check_trace(g, res.trace, 2)
    dur = res.trace.op_end - res.trace.op_start
    longest = int(np.argmax(comp))
    assert dur[longest] >= 0.5 * comp[longest] * scale  # the spin really ran (a loose bound: timing is noisy)
    assert res.outputs == {}
    with pytest.raises(EngineError, match="cost-only graph"):
        run(g, dev, num_devices=2)


def _thread_count() -> int:
    return sum(t.name.startswith("doppler-") for t in threading.enumerate())


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_kernel_failure_names_op_and_device_and_cleans_up(device_type: str) -> None:
    g = workloads.build("ffnn", size="tiny")
    prog = build_program(g, dtype=np.float64)
    bad = next(v for v in range(g.num_ops) if prog.specs[v]["kernel"] == "map")
    good_specs = prog.specs
    prog.specs = copy.deepcopy(good_specs)
    prog.specs[bad]["fn"] = "no_such_fn"
    dev = np.arange(g.num_ops) % 2
    with pytest.raises(EngineError, match=rf"op {bad}\b.*on device {dev[bad]} failed.*no_such_fn"):
        run(g, dev, num_devices=2, program=prog, options=RunOptions(device_type=device_type, timeout_s=30))
    assert _thread_count() == 0
    prog.specs = good_specs  # the process runs the next graph
    assert run(g, dev, num_devices=2, program=prog, options=RunOptions(device_type=device_type)).makespan_s > 0


@pytest.mark.parametrize("device_type", DEVICE_TYPES)
def test_timeout_stops_the_run_names_what_ran_and_next_run_works(device_type: str) -> None:
    from doppler.ir.graph import from_edges

    g = from_edges([1.0] * 4, [(0, 1), (1, 2), (2, 3)], [8.0] * 4, name="chain")
    cl = cluster("unit:2")
    t0 = time.perf_counter()
    with pytest.raises(EngineError, match=r"timeout of 0.2 s .* running: op 0 on device 0"):
        run(g, np.zeros(g.num_ops, np.int64), cluster=cl, time_scale=0.6,  # ops of 0.6 s
            options=RunOptions(device_type=device_type, timeout_s=0.2))
    assert time.perf_counter() - t0 < 10
    deadline = time.monotonic() + 20  # the abandoned spin finishes; its thread sees the stop and exits
    while _thread_count() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _thread_count() == 0
    small = workloads.build("ffnn", size="tiny")
    assert run(small, np.zeros(small.num_ops, np.int64), num_devices=1, options=RunOptions(device_type=device_type)).makespan_s > 0


def test_a_run_stopped_at_its_timeout_leaves_no_synthetic_kernel_spinning() -> None:
    """Ops of 10 minutes each, a timeout of 0.2 s: the spinning kernels see their run stop and return, so every
    worker thread has ended when run() raises (none left burning a core for the rest of its op)."""
    from doppler.ir.graph import from_edges

    g = from_edges([1.0] * 4, [(0, 2), (1, 3)], [8.0] * 4, name="pairs")
    t0 = time.perf_counter()
    with pytest.raises(EngineError, match=r"timeout of 0.2 s"):
        run(g, np.array([0, 1, 0, 1]), cluster=cluster("unit:2"), time_scale=600.0, options=RunOptions(timeout_s=0.2))
    assert time.perf_counter() - t0 < 10
    assert _thread_count() == 0


def test_bad_requests_are_clear_errors() -> None:
    g = workloads.build("ffnn", size="tiny")
    n = g.num_ops
    with pytest.raises(AssignmentError, match="entries"):
        run(g, [0] * (n - 1), num_devices=2)
    with pytest.raises(AssignmentError, match="device 5"):
        run(g, [5] * n, num_devices=2)
    with pytest.raises(EngineError, match="unknown engine"):
        run(g, [0] * n, options=RunOptions(engine="mpi"))
    with pytest.raises(EngineError, match="repeats"):
        run(g, [0] * n, options=RunOptions(repeats=0))
    with pytest.raises(EngineError, match="from 1 to 10000"):
        run(g, [0] * n, options=RunOptions(repeats=10**7))
    with pytest.raises(EngineError, match="timeout_s"):
        run(g, [0] * n, options=RunOptions(timeout_s=float("nan")))
    with pytest.raises(EngineError, match="at most"):
        run(g, [0] * n, num_devices=10_000)
    for scale in (float("nan"), 0.0, 1e12, "1"):  # (kernel graphs ignored it; 1e12 overflowed in a worker)
        with pytest.raises(EngineError, match="time-scale must be a number"):
            run(g, [0] * n, num_devices=2, time_scale=scale)
    with pytest.raises(EngineError, match="num_devices=3 does not match cluster"):
        run(g, [0] * n, num_devices=3, cluster=cluster("unit:2"))


def test_repeated_runs_do_not_leak_memory() -> None:
    psutil = pytest.importorskip("psutil")
    g = workloads.build("ffnn", size="small")
    prog = build_program(g)
    dev = np.arange(g.num_ops) % 2
    for _ in range(10):
        run(g, dev, num_devices=2, program=prog, keep_outputs=False)
    before = psutil.Process().memory_info().rss
    for _ in range(50):
        run(g, dev, num_devices=2, program=prog, keep_outputs=False)
    grown_mb = (psutil.Process().memory_info().rss - before) / 1e6
    assert grown_mb < 40, f"RSS grew by {grown_mb:.1f} MB over 50 runs"


def test_timeout_beyond_a_week_is_rejected() -> None:
    from doppler.engine import MAX_TIMEOUT_S

    g = workloads.build("ffnn", size="tiny")
    with pytest.raises(EngineError, match="a week"):
        run(g, [0] * g.num_ops, options=RunOptions(timeout_s=MAX_TIMEOUT_S * 2))


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no per-thread affinity here")
def test_cpu_worker_threads_are_pinned_to_their_device_core(monkeypatch) -> None:
    import os

    from doppler.engine.local import HostDevices

    cores = sorted(os.sched_getaffinity(0))
    seen: dict[object, set[int]] = {}

    def probe(key) -> None:
        HostDevices(3).bind_thread(key)
        seen[key] = os.sched_getaffinity(0)

    for key in (0, 1, 2):
        th = threading.Thread(target=probe, args=(key,))
        th.start()
        th.join()
    assert seen[0] == {cores[0]} and seen[2] == {cores[2 % len(cores)]}
    assert os.sched_getaffinity(0) == set(cores)  # the calling thread is untouched
    monkeypatch.setenv("DOPPLER_PIN_THREADS", "0")
    th = threading.Thread(target=probe, args=(1,))
    th.start()
    th.join()
    assert seen[1] == set(cores)


@pytest.mark.parametrize("method", ["heft", "round_robin"])
def test_the_measured_peak_memory_is_the_memory_model_of_the_measured_run(method: str) -> None:
    """The engine counts the arrays each worker holds as it allocates and releases them: per device, that is the
    memory model applied to the measured run's own trace (its timing decides when activations are freed, so
    the simulated run's peaks are not the yardstick), and never less than the device's resident weights."""
    from doppler.methods import assign
    from doppler.hardware.presets import cluster
    from doppler.sim import simulate

    g = workloads.build("llama_layer", size="tiny")
    cl = cluster("cpu4")
    a = assign(g, cl, method, ignore_memory=True)
    sim = simulate(g, cl, a, trace=True)
    assert sim.resident_bytes.sum() > 0.5 * sim.peak_memory_bytes.sum()  # a workload whose weights dominate
    for _ in range(3):
        res = run(g, a, num_devices=cl.num_devices, cluster=cl)
        np.testing.assert_allclose(res.peak_memory_bytes, res.trace.peak_memory_bytes(g, cl.num_devices), rtol=0.05)
        assert (res.peak_memory_bytes >= sim.resident_bytes).all()  # every device holds at least its weights
