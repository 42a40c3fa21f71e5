"""Calibration recovers known costs; validation and the engine oracle run end to end."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from doppler import workloads
from doppler.hardware.files import cluster_from_json, save_cluster
from doppler.engine import EngineError, RunOptions
from doppler.engine.calibrate import (_dispatch_gaps, _handoff_delays, calibrate, calibration_graph, fit_cluster,
                                      memory_graph)
from doppler.engine.validate import agreement, validate, validation_assignments
from doppler.ir.graph import OpKind
from doppler.ir.slices import input_slices
from doppler.hardware.cluster import Cluster, Device
from doppler.hardware.presets import cluster
from doppler.sim import simulate


def test_calibration_graph_has_every_workload_kind() -> None:
    g = calibration_graph((16, 32))
    used = set()
    for name in ("chainmm", "ffnn", "llama_block", "llama_layer"):
        used |= set(workloads.build(name, size="tiny").kind_labels())
    assert used <= set(g.kind_labels())
    assert g.meta["workload"] == "calibration"


def test_fit_cluster_recovers_the_costs_of_a_simulated_run() -> None:
    """Traces made by the simulator on a known cluster fit back to that cluster's numbers."""
    g = calibration_graph((16, 32, 64))
    rates = {"matmul": 5e9, "add": 7e8, "softmax": 1e9}
    over = {"matmul": 3e-5, "add": 1e-5, "softmax": 2e-5}

    devs = [Device(f"cpu{d}", kind="cpu", flops_per_s=2e9, flops_per_s_by_kind=rates, overhead_s=4e-6,
                   overhead_s_by_kind=over) for d in range(2)]  # fmt: skip
    bw = np.array([[np.inf, 3e9], [4e9, np.inf]])
    lat = np.array([[0.0, 5e-5], [6e-5, 0.0]])
    truth = Cluster("truth", devs, bw, lat)
    rng = np.random.default_rng(0)
    traces = [
        simulate(g, truth, rng.integers(0, 2, g.num_ops), trace=True, link_contention=True).trace for _ in range(3)
    ]
    fit = fit_cluster(g, traces, 2).cluster
    # the simulator has no dispatch gaps, so the fitted fixed times are the kernels' own
    for label in rates:
        k = OpKind.parse(label).value
        assert fit.throughput_matrix()[k, 0] == pytest.approx(rates[label], rel=1e-6)
        assert fit.overhead_matrix()[k, 1] == pytest.approx(over[label], rel=1e-6, abs=1e-12)
    assert fit.bandwidth_Bps[0, 1] == pytest.approx(3e9, rel=1e-6)
    assert fit.latency_s[1, 0] == pytest.approx(6e-5, rel=1e-6)
    back = cluster_from_json(fit.to_json())  # the overheads survive the file format
    a = rng.integers(0, 2, g.num_ops)
    assert simulate(g, back, a).makespan_s == pytest.approx(simulate(g, truth, a).makespan_s, rel=1e-6)


def test_fit_cluster_recovers_the_weight_read_rates_of_the_memory_graph() -> None:
    """Square tiles whose operands are in cache take ``a + FLOPs / rate``; the memory graph's copies take a
    fixed time and their bytes at a known rate: the fit gives the rate and the fixed time back, and keeps the
    square tiles' fit."""
    g, mg = calibration_graph((16, 32, 64)), memory_graph(2**20, (128, 256, 512))  # (tiles of 256 and 512)
    assert {f"copy{n}" for n in (256, 512)} == {mg.op_name(v).split("[")[0] for v in range(mg.num_ops)}
    rates, over = {"matmul": 5e9, "add": 7e8, "formation": 1e30}, {"matmul": 3e-5, "add": 1e-5, "formation": 2e-5}
    reads = {"formation": 4e8}
    devs = [Device(f"cpu{d}", kind="cpu", flops_per_s=2e9, flops_per_s_by_kind=rates, overhead_s=4e-6,
                   overhead_s_by_kind=over, memory_bandwidth_Bps=1e15) for d in range(2)]  # fmt: skip
    bw, lat = np.array([[np.inf, 3e9], [4e9, np.inf]]), np.array([[0.0, 5e-5], [6e-5, 0.0]])
    in_cache = Cluster("in_cache", [replace(d, memory_bandwidth_Bps=None) for d in devs], bw, lat)
    from_memory = Cluster("from_memory", [replace(d, weight_read_Bps_by_kind=reads) for d in devs], bw, lat)
    rng = np.random.default_rng(2)
    traces = [simulate(g, in_cache, rng.integers(0, 2, g.num_ops), trace=True).trace for _ in range(2)]
    mem_traces = [simulate(mg, from_memory, rng.integers(0, 2, mg.num_ops), trace=True).trace for _ in range(2)]
    fit = fit_cluster(g, traces, 2, memory_bandwidth_Bps=[1e15, 1e15], memory=(mg, mem_traces)).cluster
    for dev in fit.devices:
        assert dev.weight_read_Bps_by_kind == pytest.approx(reads, rel=1e-6)
        assert dev.overhead_s_by_kind["formation"] == pytest.approx(2e-5, rel=1e-6)
        assert dev.flops_per_s_by_kind["matmul"] == pytest.approx(5e9, rel=1e-6)
    a = rng.integers(0, 2, mg.num_ops)
    assert simulate(mg, fit, a).makespan_s == pytest.approx(simulate(mg, from_memory, a).makespan_s, rel=1e-6)
    with pytest.raises(EngineError, match="weight_bytes must be an integer > 0"):
        memory_graph(0)


def test_fit_cluster_recovers_links_when_devices_make_their_copies() -> None:
    """With copies_inbound a copy waits for its receiving device; the fitted latency is still the
    link's own (the wait behind the device's ops is not taken for a hand-off delay)."""
    from dataclasses import replace

    g = calibration_graph((16, 32, 64))
    devs = [Device(f"cpu{d}", kind="cpu", flops_per_s=2e9, overhead_s=4e-6, copies_inbound=True) for d in range(2)]
    truth = Cluster("truth", devs, np.array([[np.inf, 3e9], [4e9, np.inf]]), np.array([[0.0, 5e-5], [6e-5, 0.0]]))
    rng = np.random.default_rng(1)
    traces = [simulate(g, truth, rng.integers(0, 2, g.num_ops), trace=True).trace for _ in range(3)]
    assert any((t.tr_start > t.op_end[t.tr_src_op]).any() for t in traces)  # some copies did wait
    for t in traces:  # the simulator has no dispatch or hand-off cost: every gap seen on the device timeline is 0
        assert np.allclose(_dispatch_gaps(t, copies_inbound=True), 0.0, atol=1e-15)
        assert np.allclose(_handoff_delays(t, copies_inbound=True)[2], 0.0, atol=1e-15)
    # read as if copies ran on links, the waits behind the device would pass for gaps and hand-offs
    assert any((_dispatch_gaps(t) > 1e-9).any() for t in traces)
    assert any((_handoff_delays(t)[2] > 1e-9).any() for t in traces)
    fit = fit_cluster(g, traces, 2, copies_inbound=True).cluster
    assert fit.copies_inbound.all()
    assert fit.latency_s[0, 1] == pytest.approx(5e-5, rel=1e-6) and fit.latency_s[1, 0] == pytest.approx(6e-5, rel=1e-6)
    assert fit.bandwidth_Bps[1, 0] == pytest.approx(4e9, rel=1e-6)
    assert fit.devices[0].overhead_s == pytest.approx(0.0, abs=1e-12)  # no dispatch gaps in a simulated trace
    a = rng.integers(0, 2, g.num_ops)
    back = cluster_from_json(fit.to_json())
    assert back.copies_inbound.all()
    assert simulate(g, back, a).makespan_s == pytest.approx(simulate(g, truth, a).makespan_s, rel=1e-6)
    assert not replace(devs[0], copies_inbound=False).copies_inbound


def test_calibrate_end_to_end_writes_a_loadable_cluster(tmp_path) -> None:
    res = calibrate(2, sizes=(32, 64), runs=1, stream_bytes=2**20)
    path = tmp_path / "cal.json"
    save_cluster(res.cluster, path)
    cl = cluster(str(path))
    assert cl.num_devices == 2 and all(d.kind == "cpu" for d in cl.devices)
    assert cl.copies_inbound.all()  # CPU workers make the copies into them
    assert res.dispatch_s >= 0 and res.kernel_fits and res.link_fits
    assert np.isfinite(cl.bandwidth_Bps[0, 1]) and cl.latency_s[0, 1] >= 0
    g = workloads.build("ffnn", size="tiny")
    assert simulate(g, cl, np.arange(g.num_ops) % 2).makespan_s > 0
    # measured devices: no op reads its weights faster than the measured memory bandwidth
    assert [d.model for d in cl.devices] == ["measured"] * 2
    assert [d.memory_bandwidth_Bps for d in cl.devices] == [f["bandwidth_Bps"] for f in res.memory_fits]
    slices = input_slices(g)
    ops, k = slices.op_slices()
    read = np.bincount(ops, weights=slices.nbytes[k], minlength=g.num_ops)
    floor = read[:, None] / np.array([d.memory_bandwidth_Bps for d in cl.devices])
    assert read.any() and (cl.compute_time_s(g) >= floor).all()
    # the memory graph ran too: its copies (formation) read at a measured rate, which bounds each copy's time
    memory = [f for f in res.kernel_fits if f.get("section") == "memory"]
    assert {f["kind"] for f in memory} == {"formation"} and all(f["n"] > 0 for f in memory)
    assert all("formation" in d.weight_read_Bps_by_kind for d in cl.devices)
    with pytest.raises(EngineError, match="stream_bytes must be an integer from 65,536"):
        calibrate(2, sizes=(32,), runs=1, stream_bytes=10)


def test_the_memory_measurement_refuses_arrays_past_half_the_machine(monkeypatch) -> None:
    from doppler.engine import calibrate as calibrate_module

    monkeypatch.setattr(calibrate_module, "_physical_memory_bytes", lambda: 2**19)
    with pytest.raises(EngineError, match="393,216 bytes.*over half of this machine's 524,288: give a smaller --stream-bytes"):
        calibrate_module.measure_memory_bandwidth(2, 2**16)
    with pytest.raises(EngineError, match="memory graph .*262,144 bytes, 2 x --stream-bytes per device.* over half"):
        calibrate_module.calibrate(2, sizes=(32,), runs=1, stream_bytes=2**16)
    fits = calibrate_module.measure_memory_bandwidth(1, 2**16, repeats=2)  # 196,608 bytes: under half
    assert fits[0]["bandwidth_Bps"] == max(fits[0]["copy_Bps"], fits[0]["add_Bps"]) > 0
    with pytest.raises(EngineError, match="multiple of 4"):
        calibrate(2, sizes=(30,), runs=1)
    with pytest.raises(EngineError, match="calibration size 1000000000000000 must be a multiple of 4 from 4 to 4096"):
        calibrate(2, sizes=(10**15,), runs=1)  # (it allocated until a MemoryError)
    with pytest.raises(EngineError, match="runs must be an integer from 1 to 10000"):
        calibrate(2, sizes=(32,), runs=10**15)


def test_validation_assignments_are_distinct_and_span_the_baselines() -> None:
    g = workloads.build("ffnn", size="tiny")
    cl = cluster("cpu4:2")
    cases = validation_assignments(g, cl, 16, seed=0)
    assert len(cases) == 16
    assert len({c[1].tobytes() for c in cases}) == 16
    labels = [c[0] for c in cases]
    names = {part for label in labels if "~" not in label for part in label.split("=")}
    assert any(label.startswith("partial") for label in labels)  # offloads fill the makespan range
    assert {"single", "round_robin", "critical_path", "heft", "random"} <= names  # agreeing methods share a case
    assert any("~" in label for label in labels) or len(labels) == 16


def test_validate_end_to_end_reports_the_agreement() -> None:
    g = workloads.build("ffnn", size="tiny")
    cl = cluster("cpu4:2")
    res = validate(g, cl, options=RunOptions(repeats=2, warmup=1), n=6, seed=0)
    js = res.to_json()
    for key in ("spearman", "mean_abs_pct_error", "max_abs_pct_error", "bias_pct", "retest_spearman", "n"):
        assert key in js
    assert js["n"] == 6 and len(js["assignments"]) == 6
    # each row is the simulator's makespan of one validation assignment and the median of its measured runs
    cases = dict(validation_assignments(g, cl, 6, seed=0))
    for r in res.rows:
        assert r["simulated_s"] == pytest.approx(simulate(g, cl, cases[r["label"]], link_contention=True).makespan_s)
        assert len(r["measured_repeats_s"]) == 2 and min(r["measured_repeats_s"]) > 0
        assert r["measured_s"] == pytest.approx(float(np.median(r["measured_repeats_s"])))
    assert -1.0 <= res.spearman <= 1.0 and -1.0 <= res.retest_spearman <= 1.0


def test_agreement_statistics_on_a_hand_example() -> None:
    # medians of the repeats: [2, 2, 4, 8]; simulated [1, 2, 6, 8] -> errors -50%, 0%, +50%, 0%
    measured = np.array([[1.0, 3.0], [2.0, 2.0], [4.0, 4.0], [7.0, 9.0]])
    res = agreement(["a", "b", "c", "d"], np.array([1.0, 2.0, 6.0, 8.0]), measured, info={})
    assert [r["measured_s"] for r in res.rows] == [2.0, 2.0, 4.0, 8.0]
    assert res.mean_abs_pct_error == pytest.approx(25.0)
    assert res.max_abs_pct_error == pytest.approx(50.0)
    assert res.bias_pct == pytest.approx(0.0)
    # ranks: simulated 1 < 2 < 6 < 8; medians tie at 2 -> 1.5, 1.5, 3, 4
    assert res.spearman == pytest.approx(np.corrcoef([1, 2, 3, 4], [1.5, 1.5, 3, 4])[0, 1])
    assert res.retest_spearman == pytest.approx(0.8)  # repeat 0 ranks [1, 2, 3, 4], repeat 1 [2, 1, 3, 4]
    single = agreement(["a", "b"], np.array([1.0, 1.0]), np.array([[1.0], [2.0]]), info={})
    assert single.retest_spearman is None and single.bias_pct == pytest.approx(-25.0)

