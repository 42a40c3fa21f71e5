"""Cluster presets, and :func:`cluster`, which resolves a preset name or a cluster file.

:func:`cluster` takes a preset name, ``name:N`` for a homogeneous preset with ``N`` devices (``unit:8``,
``cpu4:2``, ``p100x4:2``, ``h100x8:4``), or the path of a JSON file
(:func:`~doppler.hardware.files.save_cluster` writes one).
``v100x8`` is heterogeneous (its NVLink topology is the fixed DGX-1 hybrid cube-mesh), so it only exists
with 8 devices: ``v100x8:8`` is accepted, any other count is a :class:`ClusterError`.

Where the GPU presets' numbers come from
----------------------------------------
Every GPU preset is a box of roofline devices (:mod:`doppler.hardware.cluster`) built from one :class:`Gpu`:

* **Peaks and memory bandwidth** from the GPU's datasheet, named in each builder's docstring. Peaks are
  dense: NVIDIA's datasheets print tensor-core peaks with 2:4 sparsity, twice the dense figure, which
  every table below halves. ``float32`` is the non-tensor-core peak; ``tf32`` the tensor-core peak for
  float32 inputs, used only where a graph asks for it (``meta["float32_matmul"] = "tf32"``). A GPU
  without a format (bfloat16 on a V100, float8 before Ada and Hopper) runs it at its float32 peak.
* **Achieved compute fraction**: the share of the peak large dense matrix products reach with the
  vendor library, from published measurements (the ``torch.matmul`` maximum-achievable-FLOPS table
  of *Machine Learning Engineering Open Book*, S. Bekman: A100 SXM 271.2 of 312 TFLOP/s bf16, 0.87;
  H100 SXM 794.5 of 989, 0.80). GPUs without a published measurement there (P100, V100, L40S) take
  0.7, the fraction these presets used before the roofline (large-tile SGEMM on a P100). The
  H200 takes the H100's 0.80: same GH100 die, same 700 W limit.
* **Achieved memory fraction** 0.8 on every GPU: STREAM-like copy and triad kernels reach 80-90 % of
  the datasheet bandwidth on HBM GPUs; the low end, one constant (the fraction used before).
* **Launch overhead** 5 us per op on every GPU: the host-side cost of one kernel launch through the
  CUDA runtime (a few microseconds, the reason CUDA graphs exist: NVIDIA technical blog *Getting
  Started with CUDA Graphs*). Ops are not fused and not captured in a CUDA graph.
* **Links**: point-to-point bandwidth as achieved (80 % of NVLink's per-direction figure, 76 % of a
  PCIe link's), latency including the ``cudaMemcpyPeerAsync`` launch and synchronisation.

These constants are one per GPU and never tuned per graph or per result.

Other presets: ``unit`` (4 devices, 1 FLOP/s, 1 byte/s, zero latency: imported DOPPLER text graphs run
in their own cost units on it) and ``cpu4`` (4 local CPU workers: PLACEHOLDER plain rates until
``doppler calibrate`` measures real ones: 50 GFLOP/s, memory-bound kinds at 20 GB/s over 8 bytes per
FLOP, 5 GB/s and 50 us between workers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from doppler.hardware.files import load_cluster
from doppler.hardware.cluster import MAX_DEVICES, VECTOR_KINDS, Cluster, ClusterError, Device, homogeneous


@dataclass(frozen=True)
class Gpu:
    """One GPU model: datasheet peaks (dense FLOP/s per number format), memory bandwidth and size, and its
    documented achieved fractions and launch overhead (module docstring)."""

    model: str
    peak_flops_by_dtype: dict[str, float]
    memory_bandwidth_Bps: float
    memory_bytes: float
    achieved_compute_fraction: float
    achieved_memory_fraction: float = 0.8
    overhead_s: float = 5e-6

    def device(self, name: str) -> Device:
        """A roofline :class:`Device` of this GPU named ``name``."""
        return Device(name, kind="gpu", peak_flops_by_dtype=dict(self.peak_flops_by_dtype),
                      memory_bandwidth_Bps=self.memory_bandwidth_Bps, memory_bytes=self.memory_bytes,
                      achieved_compute_fraction=self.achieved_compute_fraction,
                      achieved_memory_fraction=self.achieved_memory_fraction, overhead_s=self.overhead_s)  # fmt: skip


#: Tesla P100 PCIe 16 GB (NVIDIA Tesla P100 PCIe datasheet): 9.3 TFLOP/s float32, 18.7 float16 (no
#: tensor cores), 4.7 float64, CoWoS HBM2 732 GB/s
P100_PCIE = Gpu("Tesla P100 PCIe 16 GB", {"float32": 9.3e12, "float16": 18.7e12, "float64": 4.7e12}, 732e9, 16e9, 0.7)
#: Tesla V100 SXM2 16 GB (NVIDIA Tesla V100 datasheet): 15.7 TFLOP/s float32, 7.8 float64, 125 float16 tensor cores
#: (Volta has no bfloat16 and no TF32), HBM2 900 GB/s
V100_SXM2 = Gpu("Tesla V100 SXM2 16 GB", {"float32": 15.7e12, "float16": 125e12, "float64": 7.8e12}, 900e9, 16e9, 0.7)
#: A100 SXM4 80 GB (NVIDIA A100 Tensor Core GPU datasheet): 19.5 TFLOP/s float32, 9.7 float64 (non-tensor-core), 156 TF32, 312
#: float16 and bfloat16 (dense), HBM2e 2,039 GB/s; no float8
A100_SXM4_80GB = Gpu("A100 SXM4 80 GB", {"float32": 19.5e12, "tf32": 156e12, "float16": 312e12, "bfloat16": 312e12,
                                       "float64": 9.7e12},
                     2.039e12, 80e9, 0.87)  # fmt: skip
#: H100 SXM5 80 GB (NVIDIA H100 Tensor Core GPU datasheet, sparse figures halved): 67 TFLOP/s float32,
#: 34 float64 (non-tensor-core), 494.5 TF32, 989.5 float16 and bfloat16, 1,979 float8, HBM3 3.35 TB/s
_HOPPER_PEAKS = {"float32": 67e12, "float64": 34e12, "tf32": 989e12 / 2, "float16": 1979e12 / 2, "bfloat16": 1979e12 / 2,
                 "float8": 3958e12 / 2}  # fmt: skip
H100_SXM5 = Gpu("H100 SXM5 80 GB", _HOPPER_PEAKS, 3.35e12, 80e9, 0.80)
#: H200 SXM 141 GB (NVIDIA H200 Tensor Core GPU datasheet): the H100 SXM's peaks, HBM3e 4.8 TB/s
H200_SXM = Gpu("H200 SXM 141 GB", _HOPPER_PEAKS, 4.8e12, 141e9, 0.80)
#: L40S 48 GB (NVIDIA L40S datasheet, sparse figures halved): 91.6 TFLOP/s float32 (float64 at Ada's 1/64 of it, which the datasheet does not list), 183 TF32, 362.05
#: float16 and bfloat16, 733 float8, GDDR6 864 GB/s; PCIe Gen4 x16, no NVLink
L40S = Gpu("L40S 48 GB", {"float32": 91.6e12, "float64": 91.6e12 / 64, "tf32": 366e12 / 2, "float16": 362.05e12, "bfloat16": 362.05e12,
                          "float8": 1466e12 / 2}, 864e9, 48e9, 0.7)  # fmt: skip


def unit(num_devices: int = 4) -> Cluster:
    """1 FLOP/s, 1 byte/s, zero latency: imported DOPPLER text graphs run in their own cost units."""
    name = "unit" if num_devices == 4 else f"unit:{num_devices}"
    return homogeneous(name, num_devices, flops_per_s=1.0, bandwidth_Bps=1.0, latency_s=0.0, meta={"preset": "unit"})


def _gpu_box(preset: str, num_devices: int, native: int, gpu: Gpu, *, link_Bps: float, link_latency_s: float,
             source: str) -> Cluster:  # fmt: skip
    """``num_devices`` GPUs of one model with every pair linked alike (named ``preset:N`` off its native count)."""
    if isinstance(num_devices, bool) or not isinstance(num_devices, (int, np.integer)) or num_devices < 1:
        raise ClusterError(f"a cluster needs at least one device, got {num_devices!r}")
    d = int(num_devices)
    return Cluster(name=preset if d == native else f"{preset}:{d}", devices=[gpu.device(f"gpu{i}") for i in range(d)],
                   bandwidth_Bps=np.full((d, d), float(link_Bps)), latency_s=np.full((d, d), float(link_latency_s)),
                   meta={"preset": preset, "gpu": gpu.model, "source": source})  # fmt: skip


def p100x4(num_devices: int = 4) -> Cluster:
    """The paper's machine: Tesla P100 PCIe 16 GB (:data:`P100_PCIE`, from the NVIDIA Tesla P100 PCIe
    datasheet; the paper names no NVLink topology, so the PCIe card), peer to peer over PCIe 3.0 x16
    through a PCIe switch: 15.75 GB/s theoretical per direction, 12 GB/s achieved, 10 us; every pair
    alike."""
    return _gpu_box("p100x4", num_devices, 4, P100_PCIE, link_Bps=12e9, link_latency_s=10e-6,
                    source="NVIDIA Tesla P100 PCIe datasheet; PCIe 3.0 x16 peer to peer")  # fmt: skip


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
    """DGX-1 with 8x Tesla V100 SXM2 16 GB (:data:`V100_SXM2`, from the NVIDIA Tesla V100 datasheet),
    hybrid cube-mesh NVLink 2.0: 25 GB/s per direction per link, six links per GPU to four peers
    (``nvidia-smi topo -m`` on a DGX-1V): two quads {0,1,2,3} and {4,5,6,7}, fully connected inside,
    plus i <-> i+4. Pairs with one link (NV1): 22 GB/s achieved; with two (NV2): 44 GB/s; both 8 us.
    The other pairs (e.g. 0 <-> 5) go over PCIe and the host (cross-socket UPI): about 9 GB/s
    achieved, 20 us."""
    d = 8
    nvlink_Bps_per_link, nvlink_lat = 22e9, 8e-6
    host_Bps, host_lat = 9e9, 20e-6
    bw = np.full((d, d), host_Bps)
    lat = np.full((d, d), host_lat)
    for (i, j), links in DGX1_V100_NVLINKS.items():
        for a, b in ((i, j), (j, i)):
            bw[a, b] = nvlink_Bps_per_link * links
            lat[a, b] = nvlink_lat
    meta = {"preset": "v100x8", "gpu": V100_SXM2.model,
            "source": "NVIDIA Tesla V100 datasheet; DGX-1V hybrid cube-mesh NVLink 2.0"}  # fmt: skip
    return Cluster(name="v100x8", devices=[V100_SXM2.device(f"gpu{i}") for i in range(d)], bandwidth_Bps=bw,
                   latency_s=lat, meta=meta)  # fmt: skip


def a100x8(num_devices: int = 8) -> Cluster:
    """HGX A100 with 8x A100 SXM4 80 GB (:data:`A100_SXM4_80GB`, from the NVIDIA A100 Tensor Core GPU
    datasheet), NVLink 3 through NVSwitch (all pairs
    alike): 600 GB/s per GPU in both directions together, 300 per direction; 240 GB/s achieved point to
    point, 5 us."""
    return _gpu_box("a100x8", num_devices, 8, A100_SXM4_80GB, link_Bps=240e9, link_latency_s=5e-6,
                    source="NVIDIA A100 Tensor Core GPU datasheet; NVLink 3 via NVSwitch")  # fmt: skip


def h100x8(num_devices: int = 8) -> Cluster:
    """HGX H100 with 8x H100 SXM5 80 GB (:data:`H100_SXM5`, from the NVIDIA H100 Tensor Core GPU datasheet),
    NVLink 4 through NVSwitch (all pairs alike):
    900 GB/s per GPU in both directions together, 450 per direction; 360 GB/s achieved point to point, 5 us."""
    return _gpu_box("h100x8", num_devices, 8, H100_SXM5, link_Bps=360e9, link_latency_s=5e-6,
                    source="NVIDIA H100 Tensor Core GPU datasheet; NVLink 4 via NVSwitch")  # fmt: skip


def h200x8(num_devices: int = 8) -> Cluster:
    """HGX H200 with 8x H200 SXM 141 GB (:data:`H200_SXM`, from the NVIDIA H200 Tensor Core GPU datasheet),
    NVLink 4 through NVSwitch as the HGX H100:
    360 GB/s achieved point to point, 5 us."""
    return _gpu_box("h200x8", num_devices, 8, H200_SXM, link_Bps=360e9, link_latency_s=5e-6,
                    source="NVIDIA H200 Tensor Core GPU datasheet; NVLink 4 via NVSwitch")  # fmt: skip


def l40sx8(num_devices: int = 8) -> Cluster:
    """A PCIe server with 8x L40S 48 GB (:data:`L40S`, from the NVIDIA L40S datasheet) and no NVLink:
    peer traffic crosses PCIe Gen4 x16 (64 GB/s both directions together, 31.5 per direction after
    encoding) through the PCIe switches and the host. 24 GB/s achieved (76 % of the link, the share
    ``p100x4`` takes of PCIe 3.0), 10 us (a peer copy's launch and synchronisation, as ``p100x4``).
    Every pair alike, so that ``l40sx8:N`` exists; pairs under different CPU sockets are slower in a
    real box (write a cluster file for those)."""
    return _gpu_box("l40sx8", num_devices, 8, L40S, link_Bps=24e9, link_latency_s=10e-6,
                    source="NVIDIA L40S datasheet; PCIe Gen4 x16 peer to peer through the host, no NVLink")  # fmt: skip


def cpu4(num_devices: int = 4) -> Cluster:
    """Local CPU workers; PLACEHOLDER plain rates until calibration replaces them (module docstring)."""
    mem_rate = 20e9 / 8.0  # 20 GB/s over 8 bytes per FLOP (a float32 read and write per FLOP)
    return homogeneous(
        "cpu4" if num_devices == 4 else f"cpu4:{num_devices}",
        num_devices,
        kind="cpu",
        flops_per_s=50e9,
        flops_per_s_by_kind={k: mem_rate for k in VECTOR_KINDS},
        bandwidth_Bps=5e9,
        latency_s=50e-6,
        meta={"preset": "cpu4", "source": "placeholder, to be replaced by `doppler calibrate`"},
    )


#: preset name -> (builder, native device count, whether ``name:N`` may change the count)
PRESETS: dict[str, tuple[Callable[..., Cluster], int, bool]] = {
    "unit": (unit, 4, True),
    "p100x4": (p100x4, 4, True),
    "v100x8": (lambda n=8: v100x8(), 8, False),
    "a100x8": (a100x8, 8, True),
    "h100x8": (h100x8, 8, True),
    "h200x8": (h200x8, 8, True),
    "l40sx8": (l40sx8, 8, True),
    "cpu4": (cpu4, 4, True),
}

_PRESET_RE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)(?::(.*))?$")


def cluster(name_or_path: "str | Path | Cluster") -> Cluster:
    """A preset (``p100x4``), a preset with a device count (``unit:8``) or a cluster JSON file; a
    :class:`Cluster` is returned as it is.

    The one place a cluster name is resolved: the CLI, :func:`doppler.simulate`, :func:`doppler.assign`,
    ``compare`` and ``Trainer.create`` all call it. Heterogeneous presets (``v100x8``) only accept their
    own device count. A name that is neither a preset nor a file is a one-line :class:`ClusterError`
    naming it and listing the presets.
    """
    if isinstance(name_or_path, Cluster):
        return name_or_path
    if isinstance(name_or_path, Path):
        return load_cluster(name_or_path)
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        got = repr(name_or_path) if isinstance(name_or_path, str) else type(name_or_path).__name__
        raise ClusterError(f"a cluster must be a Cluster, a preset name ({', '.join(PRESETS)}) or a cluster JSON file "
                           f"path, got {got}")  # fmt: skip
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
