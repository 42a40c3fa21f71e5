"""Clusters: the time model, JSON round trips and validation errors (presets: test_presets.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from doppler.cluster_file import cluster_from_json, load_cluster
from doppler.graph import OpKind, from_edges
from doppler.hardware import Cluster, ClusterError, Device, homogeneous
from doppler.presets import cluster


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
    cl.save(p)
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
    from doppler.hardware import MAX_DEVICES

    assert cluster(f"unit:{MAX_DEVICES}").num_devices == MAX_DEVICES
    for text in (f"unit:{MAX_DEVICES + 1}", "unit:100000000"):
        with pytest.raises(ClusterError, match=rf"at most {MAX_DEVICES} devices"):
            cluster(text)
    devs = [Device(f"d{i}") for i in range(MAX_DEVICES + 1)]
    n = len(devs)
    with pytest.raises(ClusterError, match=rf"at most {MAX_DEVICES}"):
        Cluster("big", devs, np.ones((n, n)), np.zeros((n, n)))


def test_a_cluster_file_of_a_million_devices_is_refused_before_any_device_is_built(tmp_path, monkeypatch) -> None:
    import doppler.cluster_file as cluster_file
    from doppler.hardware import MAX_DEVICES

    p = tmp_path / "c.json"
    p.write_text('{"devices": [' + ",".join(["{}"] * 1_000_000) + "]}")  # (written compactly: 3 MB)
    monkeypatch.setattr(cluster_file, "_device_from_json", lambda *a: pytest.fail("a device was built"))
    with pytest.raises(ClusterError) as e:
        load_cluster(p)
    assert str(e.value) == f"{p}: 'devices' lists 1,000,000 devices; at most {MAX_DEVICES:,} are supported"


def test_a_links_list_longer_than_the_ordered_pairs_is_refused_before_its_links_are_read(monkeypatch) -> None:
    import doppler.cluster_file as cluster_file

    obj = _obj()
    obj["links"] += [{"src": "a", "dst": "b"}]
    monkeypatch.setattr(cluster_file, "_endpoint", lambda *a: pytest.fail("a link was read"))
    with pytest.raises(ClusterError, match=r"'links' lists 3 links, more than the 2 ordered pairs of its 2 devices"):
        cluster_from_json(obj, source="c.json")


def test_a_cluster_built_in_python_names_what_is_wrong() -> None:
    from doppler.hardware import Cluster, ClusterError, Device, homogeneous

    devs = [Device("a", 1.0), Device("b", 1.0)]
    for kw, match in [(dict(name=None), "name must be a non-empty string"), (dict(meta=[1]), "meta must be a dict"),
                      (dict(bandwidth_Bps=[[1, 1], [1]]), "bandwidth_Bps must be a matrix of numbers"),
                      (dict(latency_s=[["a", "b"], ["c", "d"]]), "latency_s must be a matrix of numbers")]:  # fmt: skip
        args = dict(name="x", devices=devs, bandwidth_Bps=np.ones((2, 2)), latency_s=np.zeros((2, 2))) | kw
        with pytest.raises(ClusterError, match=match):
            Cluster(**args)
    with pytest.raises(ClusterError, match="bandwidth_Bps"):
        homogeneous("x", 2, flops_per_s=1.0, bandwidth_Bps="a")
