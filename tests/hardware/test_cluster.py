"""Clusters: the time model, JSON round trips and validation errors (presets: test_presets.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doppler import workloads
from doppler.hardware.files import cluster_from_json, load_cluster, save_cluster
from doppler.ir.graph import OpKind, from_edges
from doppler.hardware.cluster import Cluster, ClusterError, Device, homogeneous
from doppler.hardware.presets import cluster


def test_scaled_links() -> None:
    c = cluster("p100x4")
    s = c.scaled_links(4.0)
    off = ~np.eye(4, dtype=bool)
    np.testing.assert_allclose(s.transfer_time_s(1e6)[off], 4.0 * c.transfer_time_s(1e6)[off])
    assert s.devices == c.devices and s.meta["link_scale"] == 4.0
    assert c.bandwidth_Bps[0, 1] == 12e9  # the original is untouched
    with pytest.raises(ClusterError, match="factor"):
        c.scaled_links(0)


def _obj() -> dict:
    return {
        "name": "box",
        "devices": [{"name": "a", "flops_per_s": 1e12}, {"name": "b", "kind": "cpu", "flops_per_s": 2e11, "streams": 2}],
        "links": [
            {"src": "a", "dst": "b", "bandwidth_Bps": 1e9, "latency_s": 1e-5},
            {"src": 1, "dst": 0, "bandwidth_Bps": 2e9, "latency_s": 0},
        ],
    }


def test_from_json_minimal_and_default_link() -> None:
    c = cluster_from_json(_obj())
    assert c.bandwidth_Bps[0, 1] == 1e9 and c.bandwidth_Bps[1, 0] == 2e9
    assert c.devices[1].streams == 2 and c.devices[0].memory_bytes == float("inf")
    obj = _obj()
    obj["devices"].append({"name": "c", "flops_per_s": 1.0})
    obj["default_link"] = {"bandwidth_Bps": 5.0, "latency_s": 0.5}
    c3 = cluster_from_json(obj)
    assert c3.bandwidth_Bps[2, 0] == 5.0 and c3.latency_s[0, 2] == 0.5 and c3.bandwidth_Bps[0, 1] == 1e9


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda o: o["links"].pop(), "no link from device 'b' to 'a'"),
        (lambda o: o["links"][0].update(bandwidth_Bps=0), r"links\[0\] \(a -> b\): bandwidth_Bps must be a finite number > 0"),
        (lambda o: o["links"][0].update(bandwidth_Bps=-3.0), "bandwidth_Bps must be a finite number > 0"),
        (lambda o: o["links"][0].update(latency_s=-1), "latency_s must be a finite number >= 0"),
        (lambda o: o["links"][0].update(dst="zz"), "dst 'zz' is not a device"),
        (lambda o: o["links"][0].update(dst="a"), "to itself"),
        (lambda o: o["links"].append(dict(o["links"][0])), "listed twice"),
        (lambda o: o["links"][0].update(speed=1), r"links\[0\]: unknown field\(s\) 'speed'"),
        (lambda o: o.update(gpus=3), r"unknown field\(s\) 'gpus'"),
        (lambda o: o["devices"][0].update(flop_s=1), r"devices\[0\]: unknown field\(s\) 'flop_s'"),
        (lambda o: o["devices"][0].update(flops_per_s=0), r"devices\[0\]: device 'a': flops_per_s must be"),
        (lambda o: o["devices"][0].pop("flops_per_s"), r"devices\[0\] \('a'\): missing field 'flops_per_s'"),
        (lambda o: o["devices"][0].update(kind="tpu"), "kind must be one of cpu, gpu"),
        (lambda o: o["devices"][1].update(streams=0), "streams must be an integer from 1 to 4096"),
        (lambda o: o["devices"][1].update(name="a"), "two devices are named 'a'"),
        (lambda o: o["devices"][0].update(flops_per_s_by_kind={"conv": 1.0}), "unknown op kind 'conv'"),
        (lambda o: o.update(devices=[]), "non-empty list"),
        (lambda o: o.pop("devices"), "missing field 'devices'"),
        (lambda o: o.update(meta={"time_unit": "weeks"}), "meta.time_unit must be"),
        (lambda o: o["devices"][1].update(streams=2**70), "streams must be an integer from 1 to 4096"),
    ],
)
def test_json_validation_errors_name_file_and_field(mutate, msg: str, tmp_path: Path) -> None:
    obj = _obj()
    mutate(obj)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ClusterError, match=msg) as e:
        cluster(str(p))
    assert str(p) in str(e.value)


def test_invalid_json_file_names_line(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_text('{"name": "x",\n "devices": [,]}')
    with pytest.raises(ClusterError, match=r"c\.json:2: not valid JSON"):
        cluster(p)


def test_an_integer_past_a_float_is_an_error_naming_the_field(tmp_path: Path) -> None:
    """JSON integers have no limit: 10**400 once reached float() and ended in 'internal error: OverflowError'
    (found by tests/fuzz/test_cluster_and_assignment_files.py)."""
    obj = _obj()
    obj["devices"][0]["flops_per_s"] = 10**400
    p = tmp_path / "c.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ClusterError, match=r"c\.json: devices\[0\] \('a'\): flops_per_s is an integer too large"):
        cluster(p)


def test_a_kind_key_of_the_file_is_shown_quoted(tmp_path: Path) -> None:
    """A key "\x1e" (a line break to Python's splitlines) was shown as it was (found by tests/fuzz)."""
    obj = _obj()
    obj["devices"][0]["flops_per_s_by_kind"] = {"\x1e": None}
    p = tmp_path / "c.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ClusterError, match=r"flops_per_s_by_kind: '\\x1e' must be a number, got None"):
        cluster(p)


def test_constructor_validation() -> None:
    with pytest.raises(ClusterError, match="at least one device"):
        homogeneous("x", 0, flops_per_s=1.0, bandwidth_Bps=1.0)
    with pytest.raises(ClusterError, match="2x2 matrix"):
        Cluster("x", [Device("a"), Device("b")], np.ones((3, 3)), np.zeros((3, 3)))
    with pytest.raises(ClusterError, match="link a -> b: bandwidth_Bps"):
        Cluster("x", [Device("a"), Device("b")], np.array([[1.0, np.nan], [1.0, 1.0]]), np.zeros((2, 2)))
    # the diagonal is meaningless and made canonical
    c = Cluster("x", [Device("a"), Device("b")], np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([[5.0, 0.0], [0.0, 5.0]]))
    assert c.latency_s[0, 0] == 0.0 and c.transfer_time_s(3.0)[1, 1] == 0.0


def test_device_index_and_with_streams() -> None:
    c = cluster("unit:3")
    assert c.device_index("gpu2") == 2 and c.device_index(1) == 1
    with pytest.raises(ClusterError, match="no device 'gpu9'"):
        c.device_index("gpu9")
    assert list(c.with_streams(3).streams) == [3, 3, 3]


# ---------------------------------------------------------------- fixed per-op overheads
def test_overheads_add_to_compute_time_and_survive_the_file_format(tmp_path) -> None:
    g = from_edges([4.0, 8.0], [(0, 1)], [1.0, 1.0], kind=[OpKind.MATMUL, OpKind.ADD])
    dev = Device("cpu0", kind="cpu", flops_per_s=2.0, overhead_s=0.5, overhead_s_by_kind={"add": 1.5})
    cl = Cluster("c", [dev], np.zeros((1, 1)), np.zeros((1, 1)))
    np.testing.assert_allclose(cl.compute_time_s(g)[:, 0], [4 / 2 + 0.5, 8 / 2 + 1.5])
    p = tmp_path / "c.json"
    save_cluster(cl, p)
    back = load_cluster(p)
    np.testing.assert_allclose(back.compute_time_s(g), cl.compute_time_s(g))
    assert not back.is_homogeneous() or back.num_devices == 1


@pytest.mark.parametrize(
    "field, value, needle",
    [("overhead_s", -1.0, "overhead_s must be"), ("overhead_s_by_kind", {"add": -1}, "overhead_s_by_kind"),
     ("overhead_s_by_kind", {"nokind": 1e-6}, "nokind")],
)  # fmt: skip
def test_bad_overheads_are_errors_naming_the_device(tmp_path, field, value, needle) -> None:
    obj = {"name": "c", "devices": [{"name": "cpu0", "kind": "cpu", "flops_per_s": 1e9, field: value}]}
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ClusterError, match=needle) as e:
        load_cluster(p)
    assert "cpu0" in str(e.value)


def test_device_count_above_the_maximum_is_rejected_before_building() -> None:
    from doppler.hardware.cluster import MAX_DEVICES

    assert cluster(f"unit:{MAX_DEVICES}").num_devices == MAX_DEVICES
    for text in (f"unit:{MAX_DEVICES + 1}", "unit:100000000"):
        with pytest.raises(ClusterError, match=rf"at most {MAX_DEVICES} devices"):
            cluster(text)
    devs = [Device(f"d{i}") for i in range(MAX_DEVICES + 1)]
    n = len(devs)
    with pytest.raises(ClusterError, match=rf"at most {MAX_DEVICES}"):
        Cluster("big", devs, np.ones((n, n)), np.zeros((n, n)))


def test_a_cluster_file_of_a_million_devices_is_refused_before_any_device_is_built(tmp_path, monkeypatch) -> None:
    import doppler.hardware.files as cluster_file
    from doppler.hardware.cluster import MAX_DEVICES

    p = tmp_path / "c.json"
    p.write_text('{"devices": [' + ",".join(["{}"] * 1_000_000) + "]}")  # (written compactly: 3 MB)
    monkeypatch.setattr(cluster_file, "_device_from_json", lambda *a: pytest.fail("a device was built"))
    with pytest.raises(ClusterError) as e:
        load_cluster(p)
    assert str(e.value) == f"{p}: 'devices' lists 1,000,000 devices; at most {MAX_DEVICES:,} are supported"


def test_a_links_list_longer_than_the_ordered_pairs_is_refused_before_its_links_are_read(monkeypatch) -> None:
    import doppler.hardware.files as cluster_file

    obj = _obj()
    obj["links"] += [{"src": "a", "dst": "b"}]
    monkeypatch.setattr(cluster_file, "_endpoint", lambda *a: pytest.fail("a link was read"))
    with pytest.raises(ClusterError, match=r"'links' lists 3 links, more than the 2 ordered pairs of its 2 devices"):
        cluster_from_json(obj, source="c.json")


def test_a_cluster_built_in_python_names_what_is_wrong() -> None:
    from doppler.hardware.cluster import Cluster, ClusterError, Device, homogeneous

    devs = [Device("a", 1.0), Device("b", 1.0)]
    for kw, match in [(dict(name=None), "name must be a non-empty string"), (dict(meta=[1]), "meta must be a dict"),
                      (dict(bandwidth_Bps=[[1, 1], [1]]), "bandwidth_Bps must be a matrix of numbers"),
                      (dict(latency_s=[["a", "b"], ["c", "d"]]), "latency_s must be a matrix of numbers")]:  # fmt: skip
        args = dict(name="x", devices=devs, bandwidth_Bps=np.ones((2, 2)), latency_s=np.zeros((2, 2))) | kw
        with pytest.raises(ClusterError, match=match):
            Cluster(**args)
    with pytest.raises(ClusterError, match="bandwidth_Bps"):
        homogeneous("x", 2, flops_per_s=1.0, bandwidth_Bps="a")


# ---------------------------------------------------------------- the roofline
def _gpu(name: str = "g0", **kw) -> Device:
    fields = dict(kind="gpu", peak_flops_by_dtype={"float32": 10.0, "float16": 100.0, "tf32": 40.0},
                  memory_bandwidth_Bps=8.0, achieved_compute_fraction=0.5, achieved_memory_fraction=0.25,
                  overhead_s=1.0)  # fmt: skip
    return Device(name, **(fields | kw))


def _one(dev: Device) -> Cluster:
    return Cluster("c", [dev], np.zeros((1, 1)), np.zeros((1, 1)))


def test_a_roofline_op_takes_overhead_plus_the_larger_of_its_flops_and_its_bytes() -> None:
    # op 0: a float16 matmul, 100 FLOPs, 4 bytes out; op 1 reads it and writes 20 bytes
    g = from_edges([100.0, 10.0], [(0, 1)], [4.0, 20.0], kind=[OpKind.MATMUL, OpKind.ADD], meta={"dtype": "float16"})
    times = _one(_gpu()).op_times(g)
    np.testing.assert_allclose(times.compute_s[:, 0], [100 / (100 * 0.5), 10 / (10 * 0.5)])  # add: the vector rate
    np.testing.assert_allclose(times.memory_s[:, 0], [4 / 2.0, (4 + 20) / 2.0])  # bytes in + out over 8 x 0.25 B/s
    np.testing.assert_allclose(_one(_gpu()).compute_time_s(g)[:, 0], [1 + max(2, 2), 1 + max(2, 12)])
    assert times.memory_bound[:, 0].tolist() == [False, True]


def test_dtype_rules_float32_is_not_tf32_unless_the_graph_says_so_and_a_missing_dtype_falls_back() -> None:
    kinds = [OpKind.MATMUL, OpKind.SOFTMAX]
    specs = [{"dtype": "float32"}, {"dtype": "float32"}]
    plain = from_edges([40.0, 40.0], [], kind=kinds, specs=specs)
    tf32 = from_edges([40.0, 40.0], [], kind=kinds, specs=specs, meta={"float32_matmul": "tf32"})
    dev = _gpu(overhead_s=0.0, achieved_compute_fraction=1.0, vector_flops_per_s=20.0)
    np.testing.assert_allclose(_one(dev).compute_time_s(plain)[:, 0], [40 / 10, 40 / 20])
    np.testing.assert_allclose(_one(dev).compute_time_s(tf32)[:, 0], [40 / 40, 40 / 20])  # vector ops: no tensor cores
    bf16 = from_edges([40.0, 40.0, 40.0], [], kind=[OpKind.MATMUL] * 3,
                      specs=[{"dtype": "bfloat16"}, {"dtype": "float8_e4m3fn"}, None], meta={"dtype": "float16"})  # fmt: skip
    np.testing.assert_allclose(_one(dev).compute_time_s(bf16)[:, 0], [40 / 10, 40 / 10, 40 / 100])
    assert _one(dev).dtype_fallbacks(bf16) == (("g0", "bfloat16"), ("g0", "float8_e4m3fn"))
    assert _one(dev).dtype_fallbacks(plain) == ()
    with_fp8 = _gpu(peak_flops_by_dtype={"float32": 10.0, "float8": 400.0}, overhead_s=0.0, achieved_compute_fraction=1.0)
    assert _one(with_fp8).compute_time_s(bf16)[1, 0] == pytest.approx(40 / 400)


def test_calibrated_per_kind_rates_and_overheads_win_on_a_roofline_device() -> None:
    g = from_edges([100.0, 10.0], [(0, 1)], [4.0, 20.0], kind=[OpKind.MATMUL, OpKind.ADD], meta={"dtype": "float16"})
    dev = _gpu(flops_per_s_by_kind={"ADD": 5.0}, overhead_s_by_kind={"matmul": 0.5})
    t = _one(dev).compute_time_s(g)[:, 0]
    np.testing.assert_allclose(t, [0.5 + 2.0, 1.0 + 10 / 5.0])  # the add: no bytes term, its calibrated rate
    assert not _one(dev).op_times(g).memory_bound[1, 0]


def test_plain_and_roofline_devices_mix_and_devices_alike_share_their_rows() -> None:
    g = from_edges([100.0], [], [4.0], kind=[OpKind.MATMUL], meta={"dtype": "float16"})
    c = Cluster("mix", [_gpu("a"), Device("cpu", kind="cpu", flops_per_s=50.0), _gpu("b")], np.ones((3, 3)),
                np.zeros((3, 3)))  # fmt: skip
    np.testing.assert_allclose(c.compute_time_s(g)[0], [1 + 2.0, 2.0, 1 + 2.0])
    rows = c.roofline_rows(g)
    assert [(r.device, r.alike, r.model) for r in rows] == [("a", 2, "roofline"), ("cpu", 1, "plain")]
    assert rows[0].flop_rate == pytest.approx(100 / 3.0) and rows[0].byte_rate == pytest.approx(4 / 3.0)


def _input_bytes(g) -> np.ndarray:
    """Per op: the bytes of the graph-input slices it reads (weights, tables), from its specs."""
    from doppler.ir.slices import input_slices

    slices = input_slices(g)
    ops, k = slices.op_slices()
    return np.bincount(ops, weights=slices.nbytes[k], minlength=g.num_ops)


def test_a_measured_device_takes_the_larger_of_its_rate_and_its_weight_bytes_over_its_bandwidth(tmp_path) -> None:
    g = workloads.build("llama_model", size="tiny")
    read = _input_bytes(g)
    dev = Device("cpu0", kind="cpu", flops_per_s=1e9, flops_per_s_by_kind={"add": 2e8}, overhead_s=1e-5,
                 overhead_s_by_kind={"matmul": 3e-5}, memory_bandwidth_Bps=1e6)  # fmt: skip
    plain = Cluster("p", [replace(dev, memory_bandwidth_Bps=None)], np.zeros((1, 1)), np.zeros((1, 1)))
    measured = _one(dev)
    assert measured.devices[0].model == "measured" and plain.devices[0].model == "plain" and not measured.roofline
    overhead = plain.overhead_matrix()[g.kind.astype(np.int64), 0]
    expected = overhead + np.maximum(plain.compute_time_s(g)[:, 0] - overhead, read / 1e6)
    np.testing.assert_allclose(measured.compute_time_s(g)[:, 0], expected, rtol=1e-12)
    assert (read > 0).any() and (measured.compute_time_s(g)[read > 0, 0] > plain.compute_time_s(g)[read > 0, 0]).all()
    assert np.array_equal(measured.compute_time_s(g)[read == 0, 0], plain.compute_time_s(g)[read == 0, 0])
    rows = measured.roofline_rows(g)
    assert {r.model for r in rows} == {"measured"} and sum(r.memory_bound for r in rows) == int((read > 0).sum())
    path = tmp_path / "m.json"
    save_cluster(measured, path)
    assert json.loads(path.read_text())["devices"][0]["memory_bandwidth_Bps"] == 1e6
    assert load_cluster(path).devices == measured.devices


@st.composite
def _ops_on_a_measured_cpu(draw):
    name = draw(st.sampled_from(["ffnn", "chainmm", "llama_layer", "llama_model"]))
    labels = [k.label for k in OpKind if k != OpKind.INPUT]
    rate = st.floats(1e3, 1e15)
    devices = [Device(f"cpu{d}", kind="cpu", flops_per_s=draw(rate),
                      flops_per_s_by_kind=draw(st.dictionaries(st.sampled_from(labels), rate, max_size=6)),
                      overhead_s=draw(st.floats(0, 1e-3)), memory_bandwidth_Bps=draw(st.floats(1e6, 1e13)),
                      weight_read_Bps_by_kind=draw(st.dictionaries(st.sampled_from(labels), st.floats(1e5, 1e14), max_size=3)))
               for d in range(draw(st.integers(1, 3)))]  # fmt: skip
    d = len(devices)
    return workloads.build(name, size="tiny"), Cluster("cal", devices, np.ones((d, d)), np.zeros((d, d)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops_on_a_measured_cpu())
def test_no_op_on_a_measured_cpu_reads_its_weights_faster_than_the_bandwidth(case) -> None:
    """Nor faster than its kind's weight-read rate (the products of few rows calibrate measures), FLOPs added."""
    g, c = case
    read = _input_bytes(g)
    bound = read[:, None] / np.array([dev.memory_bandwidth_Bps for dev in c.devices])
    t = c.compute_time_s(g)
    assert (t >= bound * (1 - 1e-12)).all() and (t[bound > 0] > 0).all()
    plain = Cluster("plain", [replace(dev, memory_bandwidth_Bps=None, weight_read_Bps_by_kind={}) for dev in c.devices],
                    c.bandwidth_Bps, c.latency_s)  # fmt: skip
    for j, dev in enumerate(c.devices):
        for label, rate in dev.weight_read_Bps_by_kind.items():
            ops = g.kind == OpKind.parse(label).value
            reads = plain.compute_time_s(g)[ops, j] + read[ops] / rate
            assert (t[ops, j] >= reads * (1 - 1e-12)).all()


def test_a_measured_device_adds_its_weight_read_time_and_round_trips(tmp_path: Path) -> None:
    """A kind with a weight-read rate: FLOPs' time plus weight bytes over that rate (or the bandwidth's floor, if
    longer); the other kinds keep the larger of the two; the field survives a file, and a file without it loads
    with the times it always had."""
    g = workloads.build("llama_model", size="tiny")
    read = _input_bytes(g)
    dev = Device("cpu0", kind="cpu", flops_per_s=1e9, overhead_s=1e-5, memory_bandwidth_Bps=1e7)
    before = _one(dev)
    after = _one(replace(dev, weight_read_Bps_by_kind={"matmul": 2e6, "formation": 5e7}))
    mm = g.kind == OpKind.MATMUL.value
    assert (read[mm] > 0).any()
    flops_s = g.flops / 1e9 + 1e-5
    np.testing.assert_allclose(after.compute_time_s(g)[mm, 0], flops_s[mm] + read[mm] / 2e6, rtol=1e-12)
    np.testing.assert_array_equal(after.compute_time_s(g)[~mm, 0], before.compute_time_s(g)[~mm, 0])
    fast = _one(replace(dev, weight_read_Bps_by_kind={"matmul": 1e12}))  # the bandwidth still bounds it
    assert (fast.compute_time_s(g)[mm, 0] >= 1e-5 + read[mm] / 1e7 - 1e-15).all()
    path = tmp_path / "m.json"
    save_cluster(after, path)
    assert json.loads(path.read_text())["devices"][0]["weight_read_Bps_by_kind"] == {"matmul": 2e6, "formation": 5e7}
    assert load_cluster(path).devices == after.devices
    save_cluster(before, path)
    assert "weight_read_Bps_by_kind" not in json.loads(path.read_text())["devices"][0]
    np.testing.assert_array_equal(load_cluster(path).compute_time_s(g), before.compute_time_s(g))


def test_a_version_1_file_keeps_exactly_its_old_times(tmp_path: Path) -> None:
    """A cluster file written before roofline devices existed (no format_version: the old p100x4 preset)
    gives bit-identical times: FLOPs over its per-kind rate, no bytes term, no overhead."""
    old = {"name": "p100x4", "devices": [{"name": f"gpu{i}", "kind": "gpu", "flops_per_s": 6.51e12,
                                          "flops_per_s_by_kind": {"add": 7.32e10, "softmax": 7.32e10},
                                          "memory_bytes": 16e9, "streams": 1} for i in range(2)],
           "default_link": {"bandwidth_Bps": 12e9, "latency_s": 1e-5}, "meta": {"preset": "p100x4"}}  # fmt: skip
    p = tmp_path / "old.json"
    p.write_text(json.dumps(old))
    c = load_cluster(p)
    assert not c.roofline
    rng = np.random.default_rng(0)
    kinds = rng.choice([int(OpKind.MATMUL), int(OpKind.ADD), int(OpKind.SOFTMAX), int(OpKind.NORM)], 50)
    g = from_edges(rng.uniform(1e6, 1e12, 50), [(i, i + 1) for i in range(49)], rng.uniform(1e3, 1e9, 50), kind=kinds,
                   meta={"dtype": "float16"})  # fmt: skip
    rate = np.where(np.isin(kinds, [int(OpKind.ADD), int(OpKind.SOFTMAX)]), 7.32e10, 6.51e12)
    expected = g.flops / rate
    assert np.array_equal(c.compute_time_s(g), np.stack([expected, expected], axis=1))
    save_cluster(c, tmp_path / "new.json")
    again = json.loads((tmp_path / "new.json").read_text())
    assert again["format_version"] == 2 and "peak_flops_by_dtype" not in again["devices"][0]
    assert np.array_equal(load_cluster(tmp_path / "new.json").compute_time_s(g), c.compute_time_s(g))


def _roofline_obj(**device) -> dict:
    dev = {"name": "gpu0", "peak_flops_by_dtype": {"float32": 6.7e13, "float16": 9.9e14},
           "memory_bandwidth_Bps": 3.35e12, "achieved_compute_fraction": 0.8, "achieved_memory_fraction": 0.8,
           "overhead_s": 5e-6}  # fmt: skip
    return {"format_version": 2, "name": "box", "devices": [dev | device]}


def test_a_roofline_device_round_trips_through_a_version_2_file(tmp_path: Path) -> None:
    p = tmp_path / "r.json"
    p.write_text(json.dumps(_roofline_obj(vector_flops_per_s=3e13)))
    c = load_cluster(p)
    assert c.roofline and c.devices[0].vector_flops_per_s == 3e13
    save_cluster(c, tmp_path / "back.json")
    assert load_cluster(tmp_path / "back.json").devices == c.devices


@pytest.mark.parametrize(
    "obj,msg",
    [
        (_roofline_obj(memory_bandwidth_Bps=0), r"devices\[0\]: device 'gpu0': memory_bandwidth_Bps must be a finite number > 0"),
        (_roofline_obj(memory_bandwidth_Bps=-1e12), "memory_bandwidth_Bps must be a finite number > 0"),
        (_roofline_obj(peak_flops_by_dtype={"float32": 0}), r"peak_flops_by_dtype\['float32'\] must be a finite number > 0"),
        (_roofline_obj(peak_flops_by_dtype={"float16": 1e14}), "peak_flops_by_dtype must give float32"),
        (_roofline_obj(peak_flops_by_dtype={"float32": 1e13, "int8": 1e14}), "unknown number format 'int8'"),
        (_roofline_obj(achieved_compute_fraction=0), r"achieved_compute_fraction must be a number in \(0, 1\]"),
        (_roofline_obj(achieved_memory_fraction=1.5), r"achieved_memory_fraction must be a number in \(0, 1\]"),
        (_roofline_obj(overhead_s=-1e-6), "overhead_s must be a finite number >= 0"),
        (_roofline_obj(vector_flops_per_s=-1), "vector_flops_per_s must be a finite number > 0"),
        (_roofline_obj(flops_per_s=1e12), "give flops_per_s .* or peak_flops_by_dtype .*, not both"),
        ({**_roofline_obj(), "format_version": 3}, "format_version must be one of 1, 2, got 3"),
        ({k: v for k, v in _roofline_obj().items() if k != "format_version"}, "is a roofline field: give the file"),
        ({"format_version": 2, "devices": [{"name": "c", "flops_per_s": 1.0, "memory_bandwidth_Bps": 1.0,
                                            "achieved_memory_fraction": 0.5}]},
         "achieved_memory_fraction needs peak_flops_by_dtype"),
        ({"format_version": 2, "devices": [{"name": "c", "flops_per_s": 1.0, "memory_bandwidth_Bps": 0}]},
         r"devices\[0\]: device 'c': memory_bandwidth_Bps must be a finite number > 0"),
        ({"devices": [{"name": "c", "flops_per_s": 1.0, "memory_bandwidth_Bps": 1.0}]}, "is a roofline field: give the file"),
        ({"format_version": 2, "devices": [{"name": "c", "peak_flops_by_dtype": {"float32": 1.0}}]},
         "missing field 'memory_bandwidth_Bps'"),
        ({"devices": [{"name": "c", "flops_per_s": 1.0, "weight_read_Bps_by_kind": {"matmul": 1.0}}]},
         "'weight_read_Bps_by_kind' is a measured device's field: give the file"),
        ({"format_version": 2, "devices": [{"name": "c", "flops_per_s": 1.0, "weight_read_Bps_by_kind": {"matmul": 1.0}}]},
         "weight_read_Bps_by_kind needs memory_bandwidth_Bps"),
        (_roofline_obj(weight_read_Bps_by_kind={"matmul": 1e9}), "weight_read_Bps_by_kind needs a measured device"),
        ({"format_version": 2, "devices": [{"name": "c", "flops_per_s": 1.0, "memory_bandwidth_Bps": 1.0,
                                            "weight_read_Bps_by_kind": {"matmul": 0}}]},
         r"device 'c': weight_read_Bps_by_kind\['matmul'\] must be a finite number > 0"),
        ({"format_version": 2, "devices": [{"name": "c", "flops_per_s": 1.0, "memory_bandwidth_Bps": 1.0,
                                            "weight_read_Bps_by_kind": {"gemm": 1.0}}]},
         "weight_read_Bps_by_kind: unknown op kind"),
    ],
)  # fmt: skip
def test_bad_roofline_fields_are_errors_naming_file_device_and_field(obj: dict, msg: str, tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ClusterError, match=msg) as e:
        load_cluster(p)
    assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)


# ---------------------------------------------------------------- physics: nothing beats its datasheet roofline
_DTYPES = ["float32", "float16", "bfloat16", "float8_e4m3fn", "float64"]
_KINDS = [int(k) for k in OpKind if k != OpKind.INPUT]


def _datasheet_bound_s(name: str, dtype: str, flops: float, moved: float) -> float:
    """The op's datasheet roofline on GPU preset ``name``: its FLOPs over the datasheet peak of its dtype (the
    float32 peak where the GPU has none for it) or its bytes over the datasheet bandwidth, the larger."""
    from tests.hardware.test_presets import DATASHEETS

    _, _, peaks_tflops, hbm_TBps, _ = next(row for row in DATASHEETS if row[0] == name)
    peak = peaks_tflops.get("float8" if dtype.startswith("float8") else dtype, peaks_tflops["float32"])
    return max(flops / (peak * 1e12), moved / (hbm_TBps * 1e12))


@st.composite
def _ops_on_a_preset(draw):
    from tests.hardware.test_presets import DATASHEETS

    n = draw(st.integers(1, 12))
    edges = [(u, v) for v in range(1, n) for u in draw(st.lists(st.integers(0, v - 1), max_size=2, unique=True))]
    flops = draw(st.lists(st.floats(0, 1e13), min_size=n, max_size=n))
    out = draw(st.lists(st.floats(0, 1e10), min_size=n, max_size=n))
    kinds = draw(st.lists(st.sampled_from(_KINDS), min_size=n, max_size=n))
    specs = [{"dtype": d} for d in draw(st.lists(st.sampled_from(_DTYPES), min_size=n, max_size=n))]
    name = draw(st.sampled_from([row[0] for row in DATASHEETS]))
    count = draw(st.integers(1, 3)) if name != "v100x8" else 8
    return from_edges(flops, edges, out, kind=kinds, specs=specs), cluster(f"{name}:{count}"), name


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops_on_a_preset())
def test_no_op_on_a_gpu_preset_is_faster_than_its_datasheet_roofline(case) -> None:
    g, c, name = case
    t = c.compute_time_s(g)
    for v in range(g.num_ops):
        moved = g.output_bytes[v] + sum(g.output_bytes[u] for u in set(g.pred_idx[g.pred_ptr[v]:g.pred_ptr[v + 1]]))
        bound = _datasheet_bound_s(name, g.specs[v]["dtype"], float(g.flops[v]), float(moved))
        assert np.all(t[v] >= bound * (1 - 1e-12)), (name, OpKind(int(g.kind[v])).label, g.specs[v]["dtype"])
        assert np.all(t[v] > 0)  # a launch is never free on a GPU preset


def _llama2_7b_on_one_gpu(preset: str, **params: object) -> tuple:
    """LLaMA-2-7B (``llama_model``'s defaults: float16, a prefill of 2,048 tokens) with every block count 1 and
    ``params``, all on one GPU of ``preset``: (graph, cluster, simulated makespan)."""
    from doppler.sim import simulate

    g = workloads.build("llama_model", head_blocks=1, hidden_blocks=1, dim_blocks=1, vocab_blocks=1, **params)
    c = cluster(f"{preset}:1")
    return g, c, simulate(g, c, np.zeros(g.num_ops, dtype=np.int64)).makespan_s


H100_DENSE_FP16_FLOPS = 1979e12 / 2  # the H100 SXM datasheet's sparse float16 tensor-core peak, halved
A100_HBM_BPS = 2.039e12  # the A100 SXM4 80 GB datasheet's memory bandwidth


def test_llama2_7b_fp16_prefill_on_one_h100_is_never_faster_than_its_roofline() -> None:
    g, c, makespan = _llama2_7b_on_one_gpu("h100x8", attention="unfused")
    roofline = g.flops.sum() / H100_DENSE_FP16_FLOPS
    assert g.meta["dtype"] == "float16" and 2.7e13 < g.flops.sum() < 3.0e13  # 2 x 6.7e9 params x 2,048 tokens + attention
    assert makespan >= roofline
    times = c.op_times(g)
    matmul = g.kind == OpKind.MATMUL
    assert times.compute_s[matmul, 0].sum() >= g.flops[matmul].sum() / H100_DENSE_FP16_FLOPS
    # the unfused attention's score tensor (32 heads x 2,048 x 2,048 per layer) is read and written by the
    # mask and the four softmax passes: memory-bound, about as long as the whole roofline on its own
    attention = np.isin(g.kind, [int(OpKind.SOFTMAX), int(OpKind.MASK_FILL)])
    assert times.memory_bound[attention, 0].all() and times.total_s[attention, 0].sum() > 0.8 * roofline


def test_llama2_7b_fp16_prefill_on_one_h100_within_twice_its_roofline() -> None:
    """The issue's bar: with fused attention (the default), at most 2x the graph's FLOPs at the dense float16
    peak, and never faster than them; the causal kernel skips the masked half of the scores, so the fused
    graph has fewer FLOPs than the unfused one."""
    g, c, makespan = _llama2_7b_on_one_gpu("h100x8")
    unfused, _, slower = _llama2_7b_on_one_gpu("h100x8", attention="unfused")
    roofline = g.flops.sum() / H100_DENSE_FP16_FLOPS
    assert roofline <= makespan <= 2 * roofline
    assert g.flops.sum() < unfused.flops.sum() and makespan < slower
    assert not np.isin(g.kind, [int(OpKind.SOFTMAX), int(OpKind.MASK_FILL)]).any()  # no score tensor to pass over


def test_llama2_7b_fp16_decode_on_one_a100_within_2_3x_reading_its_weights_and_cache() -> None:
    """The issue's decode bar: one decode step (batch 1, a KV cache of 2,048 positions) on one A100 takes at
    most 2.3x the time to read its weights and KV cache at the datasheet's bandwidth, and never less."""
    g, _, makespan = _llama2_7b_on_one_gpu("a100x8", phase="decode", context=2048)
    cache = [name for name in g.meta["inputs"] if name.endswith(("k_cache", "v_cache"))]
    assert len(cache) == 2 * 32 and g.meta["inputs"][cache[0]] == [1, 2048, 32, 128]
    read_s = sum(float(np.prod(shape)) for shape in g.meta["inputs"].values()) * 2 / A100_HBM_BPS
    assert 13e9 < read_s * A100_HBM_BPS < 15e9  # 6.7e9 fp16 parameters and 1 GiB of cache
    assert read_s <= makespan <= 2.3 * read_s
