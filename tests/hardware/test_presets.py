"""Presets: valid, round-trip through cluster files, name:N, the DGX-1 topology, datasheet numbers and their
sources, and the roofline's rates on them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from doppler.hardware import presets
from doppler.hardware.files import save_cluster
from doppler.ir.graph import OpKind, from_edges
from doppler.hardware.cluster import ClusterError
from doppler.hardware.presets import DGX1_V100_NVLINKS, PRESETS, cluster


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_round_trip(name: str, tmp_path: Path) -> None:
    c = cluster(name)
    c.validate()
    assert c.num_devices == PRESETS[name][1]
    p = tmp_path / f"{name}.json"
    save_cluster(c, p)
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


@pytest.mark.parametrize("spec,count", [("unit:8", 8), ("cpu4:2", 2), ("p100x4:2", 2), ("h100x8:4", 4), ("v100x8:8", 8),
                                        (" unit:1 ", 1), ("a100x8:3", 3), ("h200x8:1", 1), ("l40sx8:16", 16)])  # fmt: skip
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
        ("tpu", r"^unknown cluster 'tpu': not a preset \(unit, p100x4, .*, cpu4, optionally with :N\) nor a cluster JSON file$"),
        ("", r"^a cluster must be a Cluster, a preset name \(unit, p100x4, .*\) or a cluster JSON file path, got ''$"),
        (3, r"^a cluster must be a Cluster, a preset name \(unit, .*\) or a cluster JSON file path, got int$"),
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


def test_an_add_is_memory_bound_and_a_matmul_compute_bound_on_a_gpu_preset() -> None:
    c = cluster("p100x4")
    # 1 GFLOP each; the add moves 12 GB (two float32 reads and a write per FLOP), the matmul 12 MB
    g = from_edges([1e9, 1e9], [], [12e6, 12e9], kind=[OpKind.MATMUL, OpKind.ADD])
    t = c.compute_time_s(g)[:, 0]
    assert t[0] == pytest.approx(5e-6 + 1e9 / (9.3e12 * 0.7))  # float32 peak x achieved, plus the launch
    assert t[1] == pytest.approx(5e-6 + 12e9 / (732e9 * 0.8))  # datasheet HBM2 x achieved
    assert t[1] > 10 * t[0]


_HOPPER = {"float32": 67, "float64": 34, "tf32": 494.5, "float16": 989.5, "bfloat16": 989.5, "float8": 1979}
#: (preset, the datasheet its docstring names, dense peaks in TFLOP/s, memory bandwidth in TB/s, memory in GB)
DATASHEETS = [
    ("p100x4", "NVIDIA Tesla P100 PCIe datasheet", {"float32": 9.3, "float16": 18.7, "float64": 4.7}, 0.732, 16),
    ("v100x8", "NVIDIA Tesla V100 datasheet", {"float32": 15.7, "float16": 125, "float64": 7.8}, 0.9, 16),
    ("a100x8", "NVIDIA A100 Tensor Core GPU datasheet", {"float32": 19.5, "tf32": 156, "float16": 312, "bfloat16": 312, "float64": 9.7},
     2.039, 80),
    ("h100x8", "NVIDIA H100 Tensor Core GPU datasheet", _HOPPER, 3.35, 80),
    ("h200x8", "NVIDIA H200 Tensor Core GPU datasheet", _HOPPER, 4.8, 141),
    ("l40sx8", "NVIDIA L40S datasheet", {"float32": 91.6, "float64": 91.6 / 64, "tf32": 183, "float16": 362.05, "bfloat16": 362.05,
                                         "float8": 733}, 0.864, 48),
]  # fmt: skip


@pytest.mark.parametrize("name,datasheet,peaks_tflops,hbm_TBps,memory_GB", DATASHEETS)
def test_gpu_presets_carry_their_datasheet_numbers_and_name_their_source(name: str, datasheet: str, peaks_tflops: dict,
                                                                         hbm_TBps: float, memory_GB: float) -> None:  # fmt: skip
    c = cluster(name)
    assert c.roofline and len({repr(d.to_json() | {"name": ""}) for d in c.devices}) == 1  # one GPU model per box
    dev = c.devices[0]
    assert dev.peak_flops_by_dtype == pytest.approx({k: v * 1e12 for k, v in peaks_tflops.items()})
    assert dev.memory_bandwidth_Bps == pytest.approx(hbm_TBps * 1e12) and dev.memory_bytes == memory_GB * 1e9
    assert 0 < dev.achieved_compute_fraction <= 1 and 0 < dev.achieved_memory_fraction <= 1
    assert 0 < dev.overhead_s <= 2e-5  # a launch: microseconds
    assert "datasheet" in c.meta["source"] and c.meta["gpu"]
    doc = " ".join((getattr(presets, name).__doc__ or "").split())
    assert datasheet in doc and datasheet in c.meta["source"]


def test_the_pcie_box_has_no_nvlink_and_its_links_are_pcie_speed() -> None:
    pcie, nvlink = cluster("l40sx8"), cluster("h100x8")
    off = ~np.eye(8, dtype=bool)
    assert pcie.bandwidth_Bps[off].max() <= 31.5e9  # PCIe Gen4 x16, one direction, after encoding
    assert pcie.bandwidth_Bps[off].max() * 10 < nvlink.bandwidth_Bps[off].min()
    assert pcie.latency_s[off].min() > nvlink.latency_s[off].max()
    assert "no NVLink" in pcie.meta["source"]


def test_cpu4_stays_a_plain_calibration_placeholder() -> None:
    c = cluster("cpu4")
    assert not c.roofline and "calibrate" in c.meta["source"]
    assert c.devices[0].rate("add") == c.devices[0].rate(OpKind.ADD) == 2.5e9
