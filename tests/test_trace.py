"""Trace exports: JSON with op names, Chrome trace-event format, per-op CSV."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from doppler import workloads
from doppler.hardware import cluster
from doppler.simulate import simulate


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
