"""Presets: valid, round-trip through cluster files, name:N, the DGX-1 topology and per-kind rates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from doppler.graph import OpKind, from_edges
from doppler.hardware import ClusterError
from doppler.presets import DGX1_V100_NVLINKS, PRESETS, cluster


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_round_trip(name: str, tmp_path: Path) -> None:
    c = cluster(name)
    c.validate()
    assert c.num_devices == PRESETS[name][1]
    p = tmp_path / f"{name}.json"
    c.save(p)
    back = cluster(str(p))
    assert [d.to_json() for d in back.devices] == [d.to_json() for d in c.devices]
    np.testing.assert_array_equal(back.bandwidth_Bps, c.bandwidth_Bps)
    np.testing.assert_array_equal(back.latency_s, c.latency_s)
    assert back.name == c.name and back.meta == c.meta
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left no temp file


def test_unit_preset() -> None:
    c = cluster("unit")
    assert c.num_devices == 4
    assert all(d.flops_per_s == 1.0 and not d.flops_per_s_by_kind for d in c.devices)
    g = from_edges([3.0, 5.0], [(0, 1)], [7.0, 0.0])
    np.testing.assert_array_equal(c.compute_time_s(g), [[3.0] * 4, [5.0] * 4])
    tt = c.transfer_time_s(7.0)
    assert tt[0, 1] == 7.0 and tt[2, 2] == 0.0


@pytest.mark.parametrize("spec,count", [("unit:8", 8), ("cpu4:2", 2), ("p100x4:2", 2), ("h100x8:4", 4), ("v100x8:8", 8), (" unit:1 ", 1)])
def test_name_with_count(spec: str, count: int) -> None:
    c = cluster(spec)
    assert c.num_devices == count
    assert c.is_homogeneous() or spec.startswith("v100")


@pytest.mark.parametrize(
    "spec,msg",
    [
        ("v100x8:4", "fixed 8-device topology"),
        ("unit:0", ">= 1"),
        ("unit:x", "must be an integer"),
        ("tpu", "unknown cluster 'tpu'"),
        ("", "preset name or a JSON file"),
        ("nope.json", "nope.json: no such cluster file"),
    ],
)
def test_bad_cluster_names(spec: str, msg: str) -> None:
    with pytest.raises(ClusterError, match=msg):
        cluster(spec)


def test_v100_is_the_dgx1_hybrid_cube_mesh() -> None:
    c = cluster("v100x8")
    assert not c.is_homogeneous()
    np.testing.assert_array_equal(c.bandwidth_Bps, c.bandwidth_Bps.T)
    links = np.zeros((8, 8), int)
    for (i, j), k in DGX1_V100_NVLINKS.items():
        links[i, j] = links[j, i] = k
    assert np.all(links.sum(axis=1) == 6)  # six NVLink 2.0 links per V100
    assert np.all((links > 0).sum(axis=1) == 4)  # to four peers
    for i in range(8):
        assert links[i, (i + 4) % 8] > 0  # the cube's cross edges
        quad = range(0, 4) if i < 4 else range(4, 8)
        assert all(links[i, j] > 0 for j in quad if j != i)  # quads fully connected
    off = ~np.eye(8, dtype=bool)
    nv2 = c.bandwidth_Bps[links == 2]
    nv1 = c.bandwidth_Bps[links == 1]
    host = c.bandwidth_Bps[(links == 0) & off]
    assert nv2.min() > nv1.max() > host.max()
    assert c.latency_s[0, 5] > c.latency_s[0, 1]


def test_per_kind_rates_of_gpu_presets() -> None:
    c = cluster("p100x4")
    g = from_edges([1e9, 1e9], [], [0, 0], kind=[OpKind.MATMUL, OpKind.ADD])
    t = c.compute_time_s(g)
    assert t[1, 0] > 10 * t[0, 0]  # an add is memory-bound
    assert c.devices[0].rate("add") == c.devices[0].rate(OpKind.ADD)
