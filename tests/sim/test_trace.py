"""Trace exports: JSON with op names, Chrome trace-event format, per-op CSV."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from doppler import workloads
from doppler.hardware.presets import cluster
from doppler.sim import simulate


@pytest.fixture()
def traced():
    g = workloads.build("ffnn", size="tiny")
    cl = cluster("p100x4")
    dev = np.arange(g.num_ops) % 4
    return g, cl, simulate(g, cl, dev, trace=True).trace


def test_json_with_the_graph_names_every_op(traced, tmp_path) -> None:
    g, _, tr = traced
    tr.save(tmp_path / "t.json", g)
    ops = json.loads((tmp_path / "t.json").read_text())["ops"]
    assert ops["name"] == [g.op_name(v) for v in range(g.num_ops)]
    assert ops["kind"] == g.kind_labels() and ops["group"] == g.group.tolist()
    assert all(len(b) >= 1 for b in ops["block"])
    assert "name" not in tr.to_json()["ops"]  # without the graph: indices only, as before


def test_chrome_trace_has_one_event_per_op_and_transfer_on_their_tracks(traced, tmp_path) -> None:
    g, cl, tr = traced
    names = [d.name for d in cl.devices]
    tr.save_chrome_trace(tmp_path / "c.json", g, names)
    events = json.loads((tmp_path / "c.json").read_text())["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] != "transfer"]
    moves = [e for e in events if e["ph"] == "X" and e["cat"] == "transfer"]
    assert len(ops) == g.num_ops and len(moves) == tr.num_transfers
    for e in ops:
        v = e["args"]["op"]
        assert e["tid"] == tr.op_device[v] and e["name"] == g.op_name(v)
        assert e["ts"] == pytest.approx(tr.op_start[v] * 1e6) and e["dur"] == pytest.approx((tr.op_end[v] - tr.op_start[v]) * 1e6)
    track_names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all(track_names[e["tid"]] in names for e in ops)
    assert all(" -> " in track_names[e["tid"]] for e in moves)  # transfers on link tracks, not device tracks
    assert sum(e["args"]["bytes"] for e in moves) == pytest.approx(float(tr.tr_bytes.sum()))


def test_ops_csv_round_trips_the_times(traced, tmp_path) -> None:
    g, _, tr = traced
    tr.save_ops_csv(tmp_path / "o.csv", g)
    rows = list(csv.DictReader((tmp_path / "o.csv").open()))
    assert len(rows) == g.num_ops
    assert [int(r["device"]) for r in rows] == tr.op_device.tolist()
    assert [float(r["end_s"]) for r in rows] == tr.op_end.tolist()  # repr keeps every digit
    assert rows[0]["kind"] == g.kind_labels()[0]


# ------------------------------------------------------------------ device memory
def _slow_peak(g, tr, num_devices: int) -> np.ndarray:
    """Obviously-correct reference: list every buffer with loops, then sum what is live at every allocation time."""
    bufs = []  # (device, alloc, free, bytes)
    for u in range(g.num_ops):
        d = int(tr.op_device[u])
        succ = [int(v) for v in g.successors(u)]
        if not succ:
            free = tr.makespan_s
        else:
            free = max([float(tr.op_end[u])] + [float(tr.op_end[v]) for v in succ if tr.op_device[v] == d]
                       + [float(tr.tr_end[k]) for k in range(tr.num_transfers) if tr.tr_src_op[k] == u])  # fmt: skip
        bufs.append((d, float(tr.op_start[u]), free, float(g.output_bytes[u])))
    for k in range(tr.num_transfers):
        u, b = int(tr.tr_src_op[k]), int(tr.tr_dst_device[k])
        free = max(float(tr.op_end[v]) for v in g.successors(u) if tr.op_device[v] == b)
        bufs.append((b, float(tr.tr_start[k]), free, float(tr.tr_bytes[k])))
    users = set(g.meta.get("user_inputs") or ())
    itemsize = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}[g.meta.get("dtype", "float32")]
    resident = np.zeros(num_devices)
    held, last_read = set(), {}
    for u, spec in enumerate(g.specs or []):
        d = int(tr.op_device[u])
        for ref in (spec or {}).get("inputs", []):
            if "input" not in ref:
                continue
            key = (ref["input"], str(ref["slice"]), d)
            nbytes = float(np.prod([hi - lo for lo, hi in ref["slice"]])) * itemsize
            if ref["input"] in users:  # an activation input: live from 0 until its last reader on d ends
                last_read[key] = (max(last_read.get(key, (0.0, 0.0))[0], float(tr.op_end[u])), nbytes)
            elif key not in held:  # a weight: resident for the whole run, each slice once per device
                held.add(key)
                resident[d] += nbytes
    bufs += [(d, 0.0, free, nbytes) for (_, _, d), (free, nbytes) in last_read.items()]
    peak = np.zeros(num_devices)
    for d, t, _, _ in bufs:
        live = sum(nb for e, a, f, nb in bufs if e == d and (a <= t < f or a == f == t))
        peak[d] = max(peak[d], live)
    return peak + resident


def test_peak_memory_of_a_chain_on_one_device_is_two_buffers() -> None:
    from doppler.ir.graph import DataflowGraph

    g = DataflowGraph.from_arrays([1.0, 2.0, 3.0], [10.0, 20.0, 40.0], [0, 1], [1, 2])
    tr = simulate(g, cluster("unit:2"), [0, 0, 0], trace=True).trace
    # op 1 runs while op 0's output (read) and its own output (written) are live: 30; op 2: 20 + 40
    assert tr.peak_memory_bytes(g, 2).tolist() == [60.0, 0.0]


def test_peak_memory_counts_received_copies_on_the_receiver() -> None:
    from doppler.ir.graph import DataflowGraph

    # 0 -> 1 (other device) -> 2 (back on the first): the copy of 0 lives on device 1 until 1 ends
    g = DataflowGraph.from_arrays([1.0, 1.0, 1.0], [8.0, 4.0, 2.0], [0, 1], [1, 2])
    tr = simulate(g, cluster("unit:2"), [0, 1, 0], trace=True).trace
    assert tr.num_transfers == 2
    assert tr.peak_memory_bytes(g, 2).tolist() == [8.0, 12.0]  # device 0: 8 until sent, then 4 (copy) + 2


@pytest.mark.parametrize("seed", range(6))
def test_peak_memory_equals_a_slow_reference_on_random_graphs(seed: int) -> None:
    g = workloads.build("random", num_ops=60, seed=seed)
    cl = cluster("p100x4")
    dev = np.random.default_rng(seed).integers(0, 4, g.num_ops)
    tr = simulate(g, cl, dev, trace=True, link_contention=seed % 2 == 1).trace
    np.testing.assert_allclose(tr.peak_memory_bytes(g, 4), _slow_peak(g, tr, 4), rtol=1e-12)
    assert tr.to_json(g, 4)["peak_memory_bytes"] == tr.peak_memory_bytes(g, 4).tolist()


@pytest.mark.parametrize("name", ["ffnn", "llama_block"])
@pytest.mark.parametrize("seed", range(3))
def test_peak_memory_with_weights_and_activation_inputs_equals_the_slow_reference(name: str, seed: int) -> None:
    g = workloads.build(name, size="tiny")
    cl = cluster("p100x4")
    dev = np.random.default_rng(seed).integers(0, 4, g.num_ops)
    result = simulate(g, cl, dev, trace=True)
    np.testing.assert_allclose(result.peak_memory_bytes, _slow_peak(g, result.trace, 4), rtol=1e-12)
    assert result.resident_bytes.sum() > 0 and (result.peak_memory_bytes > result.resident_bytes).all()


def test_peak_memory_of_a_single_device_run_is_at_most_all_outputs(traced) -> None:
    g, cl, _ = traced
    tr = simulate(g, cl, np.zeros(g.num_ops, dtype=np.int64), trace=True).trace
    peak = tr.peak_memory_bytes(g, cl.num_devices)
    assert 0 < peak[0] <= g.output_bytes.sum() and peak[1:].tolist() == [0.0, 0.0, 0.0]
