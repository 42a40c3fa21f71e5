"""Cluster presets, and :func:`cluster`, which resolves a preset name or a cluster file.

:func:`cluster` takes a preset name, ``name:N`` for a homogeneous preset with
``N`` devices (``unit:8``, ``cpu4:2``, ``p100x4:2``, ``h100x8:4``), or the path
of a JSON file written by :meth:`Cluster.save`. ``v100x8`` is heterogeneous (its
NVLink topology is the fixed DGX-1 hybrid cube-mesh), so it only exists with 8
devices: ``v100x8:8`` is accepted, any other count is a :class:`ClusterError`.

Where the preset numbers come from
----------------------------------
Compute: datasheet peak FP32 FLOP/s times an achieved fraction of 0.7 (what
cuBLAS SGEMM reaches on the large tiles these graphs use). Ops that are
memory-bound (add, elementwise, softmax, norm, rotary, mask_fill, select,
reduce, fill and the text format's formation/complexer/squeezer) get a per-kind
rate instead: achieved memory bandwidth (0.8 x datasheet HBM bandwidth)
divided by 8 bytes moved per FLOP (one FP32 read and one FP32 write per
FLOP; an add of two tiles moves 12 B/FLOP, softmax about 2 B/FLOP). Transfer
latencies include the ``cudaMemcpyPeerAsync`` launch and synchronisation
overhead (several microseconds), not only wire latency.

* ``unit``: 4 devices, 1 FLOP/s, 1 byte/s, zero latency. Imported DOPPLER
  text graphs run in their own cost units on it (compute -> seconds, comm ->
  seconds).
* ``p100x4``: the paper's machine, 4x Tesla P100 16 GB. We assume the PCIe
  card (the paper does not name an NVLink topology): 9.3 TFLOP/s FP32 peak ->
  6.5 TFLOP/s; HBM2 732 GB/s -> 73 GFLOP/s for memory-bound kinds. GPUs talk
  peer-to-peer over PCIe 3.0 x16 (15.75 GB/s theoretical, about 12 GB/s
  achieved) through a PCIe switch, so every pair is alike: 12 GB/s, 10 us.
* ``v100x8``: a DGX-1 with Tesla V100 SXM2 16 GB. 15.7 TFLOP/s FP32 peak ->
  11.0 TFLOP/s; HBM2 900 GB/s -> 90 GFLOP/s memory-bound. NVLink 2.0 runs
  25 GB/s per direction per link; the hybrid cube-mesh gives each GPU six
  links to four peers (``nvidia-smi topo -m`` on a DGX-1V): two quads
  {0,1,2,3} and {4,5,6,7}, fully connected inside, plus i <-> i+4. Pairs with
  one link (NV1): 22 GB/s achieved; with two links (NV2): 44 GB/s; both 8 us.
  The other pairs (e.g. 0 <-> 5) have no NVLink and go over PCIe and the host
  (cross-socket UPI): about 9 GB/s achieved, 20 us.
* ``h100x8``: an HGX H100 SXM5 with NVSwitch, every pair alike. 67 TFLOP/s
  FP32 (non-tensor-core) peak -> 46.9 TFLOP/s; HBM3 3.35 TB/s -> 335 GFLOP/s
  memory-bound. NVLink 4 gives 450 GB/s per direction per GPU; about 360 GB/s
  achieved point-to-point, 5 us.
* ``cpu4``: 4 local CPU worker processes. PLACEHOLDER numbers until
  ``doppler calibrate`` measures the real ones: 50 GFLOP/s per worker (a few
  AVX2 cores running SGEMM), 2.5 GFLOP/s for memory-bound kinds (20 GB/s), and
  5 GB/s with 50 us latency between workers (a shared-memory copy plus the
  hand-off).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import numpy as np

from doppler.cluster_file import load_cluster
from doppler.hardware import MAX_DEVICES, Cluster, ClusterError, Device, homogeneous

#: op kinds whose kernels are limited by memory bandwidth rather than FLOP/s (see module docstring)
MEMORY_BOUND_KINDS = (
    "add",
    "elementwise",
    "softmax",
    "norm",
    "rotary",
    "mask_fill",
    "select",
    "reduce",
    "fill",
    "formation",
    "complexer",
    "squeezer",
)

#: achieved fraction of datasheet FP32 peak for compute-bound kinds
ACHIEVED_COMPUTE_FRACTION = 0.7
#: achieved fraction of datasheet memory bandwidth for memory-bound kinds
ACHIEVED_MEMORY_FRACTION = 0.8
#: bytes moved per FLOP by a memory-bound kernel
MEMORY_BOUND_BYTES_PER_FLOP = 8.0



def gpu_rates(peak_fp32_flops: float, hbm_Bps: float) -> tuple[float, dict[str, float]]:
    """(achieved compute-bound FLOP/s, per-kind rates for memory-bound kinds)."""
    compute = peak_fp32_flops * ACHIEVED_COMPUTE_FRACTION
    mem = hbm_Bps * ACHIEVED_MEMORY_FRACTION / MEMORY_BOUND_BYTES_PER_FLOP
    return compute, {k: mem for k in MEMORY_BOUND_KINDS}


def unit(num_devices: int = 4) -> Cluster:
    """1 FLOP/s, 1 byte/s, zero latency: imported DOPPLER text graphs run in their own cost units."""
    name = "unit" if num_devices == 4 else f"unit:{num_devices}"
    return homogeneous(name, num_devices, flops_per_s=1.0, bandwidth_Bps=1.0, latency_s=0.0, meta={"preset": "unit"})


def _gpu_box(preset: str, num_devices: int, native: int, *, peak_fp32_flops: float, hbm_Bps: float,
             link_Bps: float, link_latency_s: float, memory_bytes: float, source: str) -> Cluster:  # fmt: skip
    """``num_devices`` equal GPUs with every pair linked alike (named ``preset:N`` off its native count)."""
    rate, by_kind = gpu_rates(peak_fp32_flops, hbm_Bps)
    return homogeneous(preset if num_devices == native else f"{preset}:{num_devices}", num_devices, kind="gpu",
                       flops_per_s=rate, flops_per_s_by_kind=by_kind, bandwidth_Bps=link_Bps,
                       latency_s=link_latency_s, memory_bytes=memory_bytes,
                       meta={"preset": preset, "source": source})  # fmt: skip


def p100x4(num_devices: int = 4) -> Cluster:
    """The paper's machine: Tesla P100 16 GB (PCIe), peer-to-peer over PCIe 3.0 x16."""
    return _gpu_box("p100x4", num_devices, 4, peak_fp32_flops=9.3e12, hbm_Bps=732e9, link_Bps=12e9,
                    link_latency_s=10e-6, memory_bytes=16e9,
                    source="Tesla P100 PCIe datasheet; PCIe 3.0 x16 P2P")  # fmt: skip


#: NVLink links between GPU pairs of a DGX-1 with V100 (``nvidia-smi topo -m``: NV1 / NV2); absent = no NVLink
DGX1_V100_NVLINKS: dict[tuple[int, int], int] = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip


def v100x8() -> Cluster:
    """DGX-1 with 8x Tesla V100 SXM2 16 GB, hybrid cube-mesh NVLink 2.0 (6 links per GPU)."""
    rate, by_kind = gpu_rates(15.7e12, 900e9)
    d = 8
    nvlink_Bps_per_link, nvlink_lat = 22e9, 8e-6
    host_Bps, host_lat = 9e9, 20e-6
    bw = np.full((d, d), host_Bps)
    lat = np.full((d, d), host_lat)
    for (i, j), links in DGX1_V100_NVLINKS.items():
        for a, b in ((i, j), (j, i)):
            bw[a, b] = nvlink_Bps_per_link * links
            lat[a, b] = nvlink_lat
    devices = [
        Device(f"gpu{i}", kind="gpu", flops_per_s=rate, flops_per_s_by_kind=dict(by_kind), memory_bytes=16e9)
        for i in range(d)
    ]
    return Cluster(
        name="v100x8",
        devices=devices,
        bandwidth_Bps=bw,
        latency_s=lat,
        meta={"preset": "v100x8", "source": "Tesla V100 SXM2 datasheet; DGX-1V hybrid cube-mesh NVLink 2.0"},
    )


def h100x8(num_devices: int = 8) -> Cluster:
    """HGX H100 SXM5 80 GB with NVSwitch (all pairs alike)."""
    return _gpu_box("h100x8", num_devices, 8, peak_fp32_flops=67e12, hbm_Bps=3.35e12, link_Bps=360e9,
                    link_latency_s=5e-6, memory_bytes=80e9,
                    source="H100 SXM5 datasheet; NVLink 4 via NVSwitch")  # fmt: skip


def cpu4(num_devices: int = 4) -> Cluster:
    """Local CPU workers; PLACEHOLDER numbers until calibration replaces them."""
    mem_rate = 20e9 / MEMORY_BOUND_BYTES_PER_FLOP
    return homogeneous(
        "cpu4" if num_devices == 4 else f"cpu4:{num_devices}",
        num_devices,
        kind="cpu",
        flops_per_s=50e9,
        flops_per_s_by_kind={k: mem_rate for k in MEMORY_BOUND_KINDS},
        bandwidth_Bps=5e9,
        latency_s=50e-6,
        meta={"preset": "cpu4", "source": "placeholder, to be replaced by `doppler calibrate`"},
    )


#: preset name -> (builder, native device count, whether ``name:N`` may change the count)
PRESETS: dict[str, tuple[Callable[..., Cluster], int, bool]] = {
    "unit": (unit, 4, True),
    "p100x4": (p100x4, 4, True),
    "v100x8": (lambda n=8: v100x8(), 8, False),
    "h100x8": (h100x8, 8, True),
    "cpu4": (cpu4, 4, True),
}

_PRESET_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)(?::(.*))?$")


def cluster(name_or_path: "str | Path | Cluster") -> Cluster:
    """A preset (``p100x4``), a preset with a device count (``unit:8``) or a cluster JSON file.

    Heterogeneous presets (``v100x8``) only accept their own device count.
    """
    if isinstance(name_or_path, Cluster):
        return name_or_path
    if isinstance(name_or_path, Path):
        return load_cluster(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ClusterError(f"a cluster must be a preset name or a JSON file path, got {name_or_path!r}")
    text = name_or_path.strip()
    m = _PRESET_RE.match(text)
    if m and m.group(1) in PRESETS and not Path(text).is_file():
        base, count_text = m.group(1), m.group(2)
        builder, native, scalable = PRESETS[base]
        if count_text is None:
            return builder(native)
        try:
            count = int(count_text)
        except ValueError:
            raise ClusterError(f"cluster {text!r}: the device count after ':' must be an integer, got {count_text!r}") from None
        if count < 1:
            raise ClusterError(f"cluster {text!r}: the device count must be >= 1, got {count}")
        if count > MAX_DEVICES:
            raise ClusterError(f"cluster {text!r}: at most {MAX_DEVICES} devices are supported, got {count}")
        if not scalable and count != native:
            raise ClusterError(
                f"cluster {text!r}: preset {base!r} has a fixed {native}-device topology; "
                f"use {base!r} (or {base}:{native}), or write a cluster JSON file"
            )
        return builder(count)
    p = Path(text)
    if p.suffix.lower() == ".json" or p.exists() or "/" in text or "\\" in text:
        return load_cluster(p)
    known = ", ".join(PRESETS)
    raise ClusterError(f"unknown cluster {text!r}: not a preset ({known}, optionally with :N) nor a cluster JSON file")
