"""The training distribution of a transferable policy, and the held-out split it is judged on.

A pretrained policy must place graphs and clusters it has never seen, so it is trained on a
*distribution* of (graph, cluster) pairs, a fresh pair per update, never on one instance.

**Graphs** (:func:`sample_graph`): every workload family but ``llama_layer`` (``chainmm``,
``ffnn``, ``llama_block``) at random sizes and tilings (block counts over batch, sequence,
model and hidden dimensions), and ``random`` layered DAGs with varied width, fan-in, window
and compute-to-communication ratio; :data:`TRAIN_OPS` = 30 to 1,000 ops.

**Clusters** (:func:`sample_cluster`): 2 to 16 devices; topologies all-to-all, ring (a transfer
between non-neighbours crosses several hops: bandwidth divided by the hop count, latency
multiplied by it), two nodes joined by a slow link, and NVLink-style partial meshes (each pair
linked fast with some probability, by one link or two as in a DGX-1, otherwise over the host); all devices equal, or a mix of two
speeds; device rates of a P100, a V100 or an H100 and link speeds from 0.1x to 10x the preset's.

**Held out** (:func:`held_out_split`), never drawn in training: the whole ``llama_layer``
family; every family above the training range (1,000 to 5,000 ops); the ``v100x8`` and
``h100x8`` topologies; a cluster of three device speeds (training mixes at most two); and 32
devices (training has at most 16).

**Shifted validation** (:func:`shifted_validation_split`): training graphs on clusters that
neither training nor the held-out split draws (17 to 24 devices; four nodes joined by slow links;
three or four device speeds on 4 to 12 devices). It chooses among options that should transfer
(checkpoints, decode rules) without looking at the held-out split.

Everything is drawn from one ``numpy.random.Generator``: the same seed gives the same pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler import workloads
from doppler.ir.graph import DataflowGraph
from doppler.hardware.cluster import VECTOR_KINDS, Cluster, Device
from doppler.hardware.presets import cluster as preset

TRAIN_OPS = (30, 1000)  #: the op counts training graphs are drawn from (inclusive)
TRAIN_DEVICES = (2, 16)  #: the device counts training clusters are drawn from (inclusive)
TRAIN_FAMILIES = ("chainmm", "ffnn", "llama_block", "random")
HELD_OUT_FAMILIES = ("llama_layer",)
TOPOLOGIES = ("all_to_all", "ring", "two_nodes", "partial_mesh")
SHIFTED_TOPOLOGIES = ("four_nodes",)  #: drawn only by the shifted validation split
SHIFTS = ("devices", "four_nodes", "speeds")  #: how a shifted validation cluster differs from training ones

#: (peak fp32 FLOP/s, HBM bytes/s, fast-link bytes/s, latency s) of the GPUs clusters are built from
_GPUS = {
    "p100": (9.3e12, 732e9, 12e9, 10e-6),
    "v100": (15.7e12, 900e9, 44e9, 8e-6),
    "h100": (67e12, 3.35e12, 360e9, 5e-6),
}


def gpu_rates(peak_fp32_flops: float, hbm_Bps: float) -> tuple[float, dict[str, float]]:
    """The plain per-FLOP rates the training clusters' GPUs have (the model the pretrained policy learned
    on, kept as it was): (compute-bound FLOP/s, per-kind FLOP/s of :data:`VECTOR_KINDS`) = (0.7 x the
    float32 peak, 0.8 x the memory bandwidth over 8 bytes per FLOP)."""
    compute = peak_fp32_flops * 0.7
    mem = hbm_Bps * 0.8 / 8.0
    return compute, {k: mem for k in VECTOR_KINDS}


class CorpusError(ValueError):
    """A corpus request that cannot be met (reported with exit code 2)."""


# ============================================================================ graphs
def _pow2(rng: np.random.Generator, lo: int, hi: int) -> int:
    """A random power of two in ``[2**lo, 2**hi]``."""
    return 2 ** int(rng.integers(lo, hi + 1))


def _family_params(family: str, rng: np.random.Generator) -> dict:
    """Random sizes and tilings of one workload family (block counts always divide their dimension)."""
    if family == "chainmm":
        return {"n": _pow2(rng, 10, 13), "row_blocks": _pow2(rng, 1, 3), "col_blocks": _pow2(rng, 1, 3),
                "inner_blocks": _pow2(rng, 0, 3)}  # fmt: skip
    if family == "ffnn":
        return {"batch": _pow2(rng, 10, 13), "d_in": _pow2(rng, 10, 13), "d_hidden": _pow2(rng, 11, 14),
                "d_out": _pow2(rng, 10, 12), "batch_blocks": _pow2(rng, 0, 3), "in_blocks": _pow2(rng, 0, 2),
                "hidden_blocks": _pow2(rng, 1, 3), "out_blocks": _pow2(rng, 0, 2)}  # fmt: skip
    if family in ("llama_block", "llama_layer"):
        dim = int(rng.choice([1024, 2048, 4096]))
        p = {"batch": int(rng.choice([1, 2, 4])), "seq_len": _pow2(rng, 8, 11), "dim": dim, "n_heads": dim // 128,
             "head_dim": 128, "hidden": int(dim * 8 // 3 // 256 * 256), "batch_blocks": 1,
             "seq_blocks": _pow2(rng, 0, 2), "dim_blocks": _pow2(rng, 1, 2), "head_blocks": _pow2(rng, 1, 3),
             "hidden_blocks": _pow2(rng, 1, 3)}  # fmt: skip
        p["batch_blocks"] = min(p["batch"], _pow2(rng, 0, 1))
        if family == "llama_layer":
            p.update(vocab=32000, vocab_blocks=_pow2(rng, 1, 3))
        return p
    if family == "random":
        n = int(np.exp(rng.uniform(np.log(TRAIN_OPS[0]), np.log(TRAIN_OPS[1]))))
        return {"num_ops": n, "width": int(rng.integers(2, 33)), "max_fan_in": int(rng.integers(1, 6)),
                "window": int(rng.integers(1, 5)), "flops_median": float(10 ** rng.uniform(9, 11.5)),
                "flops_sigma": float(rng.uniform(0.3, 1.5)), "bytes_median": float(10 ** rng.uniform(6, 8.5)),
                "bytes_sigma": float(rng.uniform(0.3, 1.5)), "seed": int(rng.integers(2**31))}  # fmt: skip
    raise CorpusError(f"unknown graph family {family!r} (use one of: {', '.join(TRAIN_FAMILIES + HELD_OUT_FAMILIES)})")


def sample_graph(rng: np.random.Generator, families: tuple[str, ...] = TRAIN_FAMILIES,
                 ops: tuple[int, int] = TRAIN_OPS) -> DataflowGraph:  # fmt: skip
    """A random graph of one of ``families`` with ``ops[0] <= num_ops <= ops[1]`` (redrawn until it fits)."""
    for _ in range(200):
        family = str(families[int(rng.integers(len(families)))])
        g = workloads.build(family, **_family_params(family, rng))
        if ops[0] <= g.num_ops <= ops[1]:
            return g
    raise CorpusError(f"no graph of {', '.join(families)} with {ops[0]}..{ops[1]} ops in 200 draws")


# ============================================================================ clusters
def _hops(topology: str, d: int, rng: np.random.Generator) -> np.ndarray:
    """``[d, d]`` link class: 1 = a fast direct link, 0.5 = two of them, k > 1 = k hops, 0 = the slow path."""
    idx = np.arange(d)
    if topology == "all_to_all":
        return np.ones((d, d))
    if topology == "ring":
        gap = np.abs(idx[:, None] - idx[None, :])
        return np.maximum(np.minimum(gap, d - gap), 1).astype(float)
    if topology == "two_nodes":
        half = max(1, d // 2)
        same = (idx[:, None] < half) == (idx[None, :] < half)
        return np.where(same, 1.0, 0.0)  # 0 marks the slow inter-node link
    if topology == "four_nodes":  # shifted validation only, never in training
        node = idx * 4 // d
        return np.where(node[:, None] == node[None, :], 1.0, 0.0)
    if topology == "partial_mesh":
        linked = np.triu(rng.random((d, d)) < rng.uniform(0.3, 0.7), 1)
        ring = np.zeros((d, d), dtype=bool)
        ring[idx, (idx + 1) % d] = True  # keep every GPU on at least one fast link, as NVLink meshes do
        linked = linked | np.triu(ring | ring.T, 1)
        linked = linked | linked.T
        double = np.triu(rng.random((d, d)) < rng.uniform(0.0, 0.5), 1)  # NVLink pairs joined by two links
        double = double | double.T
        return np.where(linked, np.where(double, 0.5, 1.0), 0.0)
    raise CorpusError(f"unknown topology {topology!r} (use one of: {', '.join(TOPOLOGIES + SHIFTED_TOPOLOGIES)})")


def make_cluster(name: str, rates: list[float], mem_rate: float, fast_Bps: float, latency_s: float,
                 topology: str, rng: np.random.Generator, slow_factor: float = 0.1) -> Cluster:  # fmt: skip
    """A GPU cluster: device ``i`` runs compute-bound kinds at ``rates[i]`` FLOP/s (memory-bound kinds
    at ``mem_rate`` scaled alike); links per ``topology`` (slow paths at ``slow_factor`` of ``fast_Bps``)."""
    d = len(rates)
    top = max(rates)
    _, by_kind = gpu_rates(1.0, 1.0)
    devices = [Device(f"gpu{i}", kind="gpu", flops_per_s=r, flops_per_s_by_kind={k: mem_rate * r / top for k in by_kind})
               for i, r in enumerate(rates)]  # fmt: skip
    hops = _hops(topology, d, rng)
    bw = np.where(hops > 0, fast_Bps / np.where(hops > 0, hops, 1.0), fast_Bps * slow_factor)
    lat = np.where(hops > 0, latency_s * np.maximum(hops, 1), latency_s * 4)
    return Cluster(name=name, devices=devices, bandwidth_Bps=bw, latency_s=lat,
                   meta={"preset": "corpus", "topology": topology})  # fmt: skip


def _draw_gpu(rng: np.random.Generator) -> tuple[str, float, float, float, float]:
    """A GPU kind of :data:`_GPUS`: ``(name, compute-bound FLOP/s, memory-bound FLOP/s, fast-link bytes/s, latency s)``."""
    gpu = str(rng.choice(list(_GPUS)))
    peak, hbm, link, lat = _GPUS[gpu]
    rate, by_kind = gpu_rates(peak, hbm)
    return gpu, rate, next(iter(by_kind.values())), link, lat


def _with_links(rng: np.random.Generator, label: str, rates: list[float], mem_rate: float, link: float, lat: float,
                topology: str) -> Cluster:  # fmt: skip
    """:func:`make_cluster` with links at 0.1x to 10x ``link`` and a slow path at 5-30% of that."""
    link_scale = float(10 ** rng.uniform(-1, 1))
    return make_cluster(f"{label}-links{link_scale:.2g}", rates, mem_rate, link * link_scale, lat, topology, rng,
                        slow_factor=float(rng.uniform(0.05, 0.3)))  # fmt: skip


def sample_cluster(rng: np.random.Generator, devices: tuple[int, int] = TRAIN_DEVICES) -> Cluster:
    """A random training cluster (module docstring)."""
    d = int(rng.integers(devices[0], devices[1] + 1))
    gpu, rate, mem_rate, link, lat = _draw_gpu(rng)
    rates = [rate] * d
    mixed = bool(rng.random() < 0.35)
    if mixed:  # a mix of two speeds: a random share of the devices runs 1.5x to 4x slower
        slow = rng.random(d) < rng.uniform(0.25, 0.75)
        factor = rng.uniform(1.5, 4.0)
        rates = [rate / factor if s else rate for s in slow]
    topology = str(rng.choice(TOPOLOGIES))
    if gpu == "h100" and topology == "all_to_all":  # that is h100x8's (NVSwitch) topology: held out
        topology = str(rng.choice(TOPOLOGIES[1:]))
    return _with_links(rng, f"{gpu}x{d}-{topology}{'-mixed' if mixed else ''}", rates, mem_rate, link, lat, topology)


def sample_pair(rng: np.random.Generator) -> tuple[DataflowGraph, Cluster]:
    """One training pair: a graph of the training families and sizes on a training cluster."""
    return sample_graph(rng), sample_cluster(rng)


# ============================================================================ held out
@dataclass(frozen=True)
class HeldOutCase:
    """One row of the held-out split: a graph and a cluster no training pair is drawn from."""

    name: str
    graph: DataflowGraph
    cluster: Cluster
    why: str  # what makes it unseen


def mixed3_cluster() -> Cluster:
    """Held out: 8 V100-class GPUs of three speeds (1x, 1/2x, 1/3x), all-to-all at V100 NVLink speed."""
    peak, hbm, link, lat = _GPUS["v100"]
    rate, by_kind = gpu_rates(peak, hbm)
    rates = [rate] * 3 + [rate / 2] * 3 + [rate / 3] * 2
    return make_cluster("mixed3x8", rates, next(iter(by_kind.values())), link / 2, lat, "all_to_all",
                        np.random.default_rng(0))  # fmt: skip


def held_out_split(*, quick: bool = False) -> list[HeldOutCase]:
    """The held-out rows (``quick``: the first four, for smoke tests)."""
    big_llama = dict(seq_blocks=4, dim_blocks=4, head_blocks=8, hidden_blocks=8)
    rows = [
        ("llama_layer/p100x4", workloads.build("llama_layer"), preset("p100x4"), "family"),
        ("llama_layer/v100x8", workloads.build("llama_layer"), preset("v100x8"), "family, topology"),
        ("llama_block/v100x8", workloads.build("llama_block"), preset("v100x8"), "topology"),
        ("ffnn/h100x8", workloads.build("ffnn"), preset("h100x8"), "topology"),
        ("chainmm/mixed3x8", workloads.build("chainmm", row_blocks=4, col_blocks=4, inner_blocks=2), mixed3_cluster(),
         "three device speeds"),
        ("llama_layer-973/h100x8", workloads.build("llama_layer", seq_blocks=2, head_blocks=8, hidden_blocks=8,
                                                    vocab_blocks=8), preset("h100x8"), "family, topology"),
        ("ffnn-1k/p100x4:32", workloads.build("ffnn", batch_blocks=8, in_blocks=4, hidden_blocks=8, out_blocks=8),
         preset("p100x4:32"), "size, 32 devices"),
        ("llama_block-2k/v100x8", workloads.build("llama_block", **big_llama), preset("v100x8"), "size, topology"),
        ("chainmm-2k/mixed3x8", workloads.build("chainmm", row_blocks=16, col_blocks=8, inner_blocks=4),
         mixed3_cluster(), "size, three device speeds"),
        ("random-3k/h100x8:16", workloads.build("random", num_ops=3000, width=24, seed=7), preset("h100x8:16"),
         "size, topology"),
    ]  # fmt: skip
    cases = [HeldOutCase(n, g, c, why) for n, g, c, why in rows]
    return cases[:4] if quick else cases


#: the seed of the validation pairs (training streams use small seeds: ``TrainConfig.seed + 1``)
VALIDATION_SEED = 2**20


def validation_split(k: int = 12, seed: int = VALIDATION_SEED) -> list[HeldOutCase]:
    """``k`` pairs of the training distribution from a stream training never draws: for choosing
    among checkpoints without looking at the held-out split."""
    rng = np.random.default_rng(seed)
    pairs = [sample_pair(rng) for _ in range(k)]
    return [HeldOutCase(f"val{i}:{g.name}/{c.name}", g, c, "validation (training distribution)")
            for i, (g, c) in enumerate(pairs)]  # fmt: skip


#: the seed of the shifted validation pairs
SHIFTED_VALIDATION_SEED = 2**21


def shifted_cluster(rng: np.random.Generator, shift: str) -> Cluster:
    """A cluster outside both the training distribution and the held-out split (module docstring):
    ``devices``: 17 to 24 equal GPUs on a training topology; ``four_nodes``: 8 to 16 equal GPUs in four
    nodes joined by slow links; ``speeds``: 4 to 12 GPUs of three or four speeds (1x to 1/4x), all-to-all
    or a partial mesh. GPU kinds and link speeds are drawn as in training."""
    gpu, rate, mem_rate, link, lat = _draw_gpu(rng)
    if shift == "devices":  # (not h100 all-to-all: h100x8's NVSwitch topology is held out)
        d, topology = int(rng.integers(17, 25)), str(rng.choice(TOPOLOGIES[1:] if gpu == "h100" else TOPOLOGIES))
        rates, label = [rate] * d, topology
    elif shift == "four_nodes":
        d, topology = int(rng.integers(8, 17)), "four_nodes"
        rates, label = [rate] * d, topology
    elif shift == "speeds":
        d, topology = int(rng.integers(4, 13)), str(rng.choice(["all_to_all", "partial_mesh"]))
        factors = np.concatenate([[1.0], np.sort(rng.uniform(1.3, 4.0, int(rng.integers(2, 4))))])
        rates, label = [rate / float(factors[i % len(factors)]) for i in range(d)], f"{topology}-speeds{len(factors)}"
    else:
        raise CorpusError(f"unknown shift {shift!r} (use one of: {', '.join(SHIFTS)})")
    return _with_links(rng, f"{gpu}x{d}-{label}", rates, mem_rate, link, lat, topology)


def shifted_validation_split(k: int = 24, seed: int = SHIFTED_VALIDATION_SEED) -> list[HeldOutCase]:
    """``k`` pairs of a training graph on a :func:`shifted_cluster` (the shifts in turn): for choosing
    among options that should transfer, without looking at the held-out split."""
    rng = np.random.default_rng(seed)
    shifts = [SHIFTS[i % len(SHIFTS)] for i in range(k)]
    pairs = [(sample_graph(rng), shifted_cluster(rng, shift)) for shift in shifts]
    return [HeldOutCase(f"shift{i}:{g.name}/{c.name}", g, c, f"shifted validation ({shift})")
            for i, ((g, c), shift) in enumerate(zip(pairs, shifts))]  # fmt: skip
