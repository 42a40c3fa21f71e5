"""The placements people make by hand for models that do not fit one device: whole layers, in order.

Both methods place *units*, not ops (:func:`layer_units`): a decoder layer (the module path up to its
first numeric component, ``model.layers.3``) or a module outside the layers (``model.embed_tokens``,
``lm_head``), in the order the graph runs them. A unit's weight bytes are the weight slices its ops
read (:mod:`doppler.memory`), each held once per device.

* ``sequential_fill``: Hugging Face accelerate's ``infer_auto_device_map`` fill rule (its
  ``device_map="sequential"``): units in order, each on the current device while its weights fit the
  device's budget, then on to the next device.
* ``pipeline``: contiguous stages, one per device in the cluster's order (GPipe,
  ``torch.distributed.pipelining``), split to minimise the largest stage's compute time on its device
  (balanced by FLOPs on equal devices), every stage's weights within its device's budget.

Both are memory-aware: given ``memory_budget_bytes`` they keep each device's weights under it (the
registry places again with lower caps where live activations overflow, :func:`~doppler.methods.placement.
place_within`) and raise :class:`~doppler.methods.registry.MethodError` naming the unit that does not fit.
With one sequence in flight neither lets two devices work at once.
"""

from __future__ import annotations

import re

import numpy as np

from doppler import memory
from doppler.ir.assignment import Assignment
from doppler.ir.graph import DataflowGraph
from doppler.methods.registry import MethodError, PythonRun, register
from doppler.workloads.tiling import layer_key
from doppler.hardware.traffic import carry_traffic

#: at most this many units: finer ones (a graph whose ops record no module, placed by logical op or by op)
#: are merged into this many runs of consecutive ones, of about equal op counts
MAX_UNITS = 256


def layer_units(graph: DataflowGraph, max_units: int | None = MAX_UNITS) -> tuple[list[str], np.ndarray]:
    """The units of layer-granular placement and each op's unit (int64[n]), units numbered in the order the
    graph runs them (by their first op in topological order).

    A unit is the module path up to its first numeric component where the op records a module
    (:meth:`~doppler.ir.graph.DataflowGraph.op_modules`), else the module itself; an op recording none joins
    the unit of the op before it in topological order (the first such ops, the unit after them). A graph
    whose ops record no module is placed by logical op (its groups), and one without groups by op; more
    than ``max_units`` units (None: no limit) are merged into that many runs of consecutive ones.
    """
    n = graph.num_ops
    modules, index = graph.op_modules()
    if modules:
        keys = [layer_key(path) for path in modules]
        number = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        names = list(number)
        label = np.asarray([number[k] for k in keys] + [-1], np.int64)[index]
    elif graph.groups:
        names, label = [g.name for g in graph.groups], graph.group.astype(np.int64)
    else:
        names, label = [graph.op_label(v) for v in range(n)], np.arange(n, dtype=np.int64)
    order = graph.topo_order
    seq = label[order]
    known = np.flatnonzero(seq >= 0)
    if known.size == 0:
        return ["all"], np.zeros(n, np.int64)
    fill = np.maximum.accumulate(np.where(seq >= 0, np.arange(n), -1))  # the last known position so far
    seq = seq[np.where(fill >= 0, fill, known[0])]
    first = np.full(len(names), n, np.int64)
    np.minimum.at(first, seq, np.arange(n))
    used = np.flatnonzero(first < n)
    ranked = used[np.argsort(first[used], kind="stable")]
    renumber = np.full(len(names), -1, np.int64)
    renumber[ranked] = np.arange(ranked.size)
    unit = np.empty(n, np.int64)
    unit[order] = renumber[seq]
    names = [names[k] for k in ranked]
    if max_units is not None and len(names) > max_units:
        sizes = np.bincount(unit, minlength=len(names))
        run = np.minimum((np.cumsum(sizes) - sizes) * max_units // n, max_units - 1)
        merged = np.unique(run)
        run = np.searchsorted(merged, run)
        names = [f"{names[int(np.flatnonzero(run == r)[0])]}.." for r in range(merged.size)]
        unit = run[unit]
    return names, unit


def repeated_units(graph: DataflowGraph, min_repeats: int = 3) -> list[np.ndarray]:
    """The op ids (ascending) of each unit of the largest set of at least ``min_repeats`` repeats of one layer:
    units named ``prefix.<number>`` (``model.layers.0``, ``model.layers.1``, ...) whose ops, in id order, have
    the same kinds, FLOPs, output bytes and edges among themselves. Empty where the graph repeats no layer.
    A placement of one repeat maps onto every other op for op."""
    names, unit = layer_units(graph, max_units=None)
    n = graph.num_ops
    order = np.argsort(unit, kind="stable")  # by unit, in op id order inside each
    cuts = np.searchsorted(unit[order], np.arange(len(names) + 1))
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - cuts[unit[order]]  # an op's position inside its unit
    inside = unit[graph.src] == unit[graph.dst]
    edge_unit = unit[graph.src[inside]]
    edge_key = rank[graph.src[inside]] * n + rank[graph.dst[inside]]
    by = np.lexsort((edge_key, edge_unit))
    edge_key, edge_cuts = edge_key[by], np.searchsorted(edge_unit[by], np.arange(len(names) + 1))
    members: dict[str, list[int]] = {}
    for k, name in enumerate(names):
        m = re.fullmatch(r"(.*)\.\d+", name)
        if m:
            members.setdefault(m[1], []).append(k)
    best: list[np.ndarray] = []
    for units in members.values():
        ref = units[len(units) // 2]
        ref_ops, ref_edges = order[cuts[ref]:cuts[ref + 1]], edge_key[edge_cuts[ref]:edge_cuts[ref + 1]]
        same = []
        for k in units:
            ops = order[cuts[k]:cuts[k + 1]]
            if (ops.size == ref_ops.size and np.array_equal(graph.kind[ops], graph.kind[ref_ops])
                    and np.array_equal(graph.flops[ops], graph.flops[ref_ops])
                    and np.array_equal(graph.output_bytes[ops], graph.output_bytes[ref_ops])
                    and np.array_equal(edge_key[edge_cuts[k]:edge_cuts[k + 1]], ref_edges)):  # fmt: skip
                same.append(ops)
        if len(same) >= min_repeats and len(same) * same[0].size > sum(o.size for o in best):
            best = same
    return best


def block_graph(graph: DataflowGraph, ops: np.ndarray) -> DataflowGraph:
    """The graph of ``ops`` alone: their kinds, the edges among them (an edge from outside is dropped: its value
    is taken as present on every device) and their costs, each op's time on a cluster as in ``graph``
    (:func:`~doppler.hardware.traffic.carry_traffic`: the bytes it moves there, weights included); no specs, so no
    weights held (:mod:`doppler.memory`)."""
    local = np.full(graph.num_ops, -1, np.int64)
    local[ops] = np.arange(ops.size)
    inside = (local[graph.src] >= 0) & (local[graph.dst] >= 0)
    part = DataflowGraph.from_arrays(graph.flops[ops], graph.output_bytes[ops], local[graph.src[inside]],
                                     local[graph.dst[inside]], kind=graph.kind[ops], name=f"{graph.name}.block")  # fmt: skip
    carry_traffic(part, graph, ops)
    return part


def unit_weights(graph: DataflowGraph, unit: np.ndarray, num_units: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per unit, the weight slices its ops read (sorted ids), and the bytes of every slice."""
    slices = memory.input_slices(graph)
    ops, s = slices.op_slices()
    keep = slices.weight[s]
    key = np.unique(unit[ops[keep]] * max(slices.num_slices, 1) + s[keep])
    u, sl = key // max(slices.num_slices, 1), key % max(slices.num_slices, 1)
    cuts = np.searchsorted(u, np.arange(num_units + 1))
    return [sl[cuts[k]:cuts[k + 1]] for k in range(num_units)], slices.nbytes


def device_caps(cluster, memory_budget_bytes: np.ndarray | None) -> np.ndarray:
    d = int(cluster.num_devices)
    return np.full(d, np.inf) if memory_budget_bytes is None else np.asarray(memory_budget_bytes, np.float64)


def _gb(nbytes: float) -> str:
    from doppler.report import format_bytes

    return format_bytes(nbytes)


@register("sequential_fill", description="whole layers in order, each device filled to its memory budget before "
          "the next (accelerate's device_map)", python=PythonRun(), memory_aware=True)  # fmt: skip
def sequential_fill(graph: DataflowGraph, cluster, *, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """Units (:func:`layer_units`) in order on device 0 while its held weights stay within its budget, then on
    device 1, and so on; MethodError naming the first unit no remaining device has room for."""
    names, unit = layer_units(graph)
    reads, nbytes = unit_weights(graph, unit, len(names))
    caps = device_caps(cluster, memory_budget_bytes)
    held = np.zeros(nbytes.shape[0], bool)
    device, used = 0, 0.0
    place = np.empty(len(names), np.int64)
    for k, slices in enumerate(reads):
        new = slices[~held[slices]]
        need = float(nbytes[new].sum())
        while used + need > caps[device]:
            device += 1
            if device == caps.shape[0]:
                raise MethodError(f"sequential_fill: no device has room for {names[k]} ({_gb(float(nbytes[slices].sum()))}"
                                  f" of weights) after {k} of {len(names)} units; every device is filled to its "
                                  "budget")  # fmt: skip
            held[:] = False
            new, used = slices, 0.0
            need = float(nbytes[new].sum())
        held[new] = True
        used += need
        place[k] = device
    return Assignment(devices=place[unit], info={"units": len(names), "devices_used": int(place.max()) + 1})


def range_weights(reads: list[np.ndarray], nbytes: np.ndarray) -> np.ndarray:
    """``w[j, i]``: the weight bytes units ``j..i`` hold together (each slice once)."""
    u = len(reads)
    w = np.full((u, u), np.inf)
    for j in range(u):
        held = np.zeros(nbytes.shape[0], bool)
        total = 0.0
        for i in range(j, u):
            new = reads[i][~held[reads[i]]]
            held[new] = True
            total += float(nbytes[new].sum())
            w[j, i] = total
    return w


@register("pipeline", description="contiguous layer stages, one per device, balanced by compute time within the "
          "memory budget (GPipe)", python=PythonRun(), memory_aware=True)  # fmt: skip
def pipeline(graph: DataflowGraph, cluster, *, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """``min(devices, units)`` contiguous non-empty stages of units, stage ``s`` on device ``s``, that minimise
    the largest stage compute time on its device with every stage's weights within its device's budget
    (dynamic programming over split points); MethodError where no split fits."""
    names, unit = layer_units(graph)
    u = len(names)
    reads, nbytes = unit_weights(graph, unit, u)
    caps = device_caps(cluster, memory_budget_bytes)
    stages = min(int(cluster.num_devices), u)
    compute = np.asarray(cluster.compute_time_s(graph), np.float64)  # (n, D)
    per_unit = np.zeros((u, compute.shape[1]))
    np.add.at(per_unit, unit, compute)
    split = contiguous_stages(per_unit[:, :stages], range_weights(reads, nbytes), caps[:stages])
    if split is None:
        widest = max(range(u), key=lambda k: float(nbytes[reads[k]].sum()))
        raise MethodError(f"pipeline: no split of {u} units into {stages} contiguous stages keeps every stage's "
                          f"weights within its device's budget (the largest unit, {names[widest]}, holds "
                          f"{_gb(float(nbytes[reads[widest]].sum()))}; budgets "
                          f"{', '.join(_gb(c) for c in caps[:stages])})")  # fmt: skip
    stage_of, bottleneck_s = split
    return Assignment(devices=stage_of[unit], info={"units": u, "stages": stages, "bottleneck_stage_s": bottleneck_s})


def contiguous_stages(unit_s: np.ndarray, weights: np.ndarray, caps: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The split of units ``0..u-1`` into ``S = len(caps)`` contiguous non-empty stages (``S <= u``) that minimises
    the largest stage time, stage ``s`` taking ``unit_s[k, s]`` for unit ``k``, with the weights of every stage
    (``weights[j, i]`` for units ``j..i``, :func:`range_weights`) within its cap ``caps[s]`` (dynamic programming
    over split points): each unit's stage and the largest stage time, or None where no split fits."""
    u, stages = unit_s.shape[0], len(caps)
    prefix = np.concatenate([np.zeros((1, stages)), np.cumsum(unit_s, axis=0)])  # prefix[i, s]: units 0..i-1
    best = np.full((stages + 1, u + 1), np.inf)  # best[s, i]: units 0..i-1 in stages 0..s-1
    cut = np.zeros((stages + 1, u + 1), np.int64)
    best[0, 0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, u - (stages - s) + 1):
            j = np.arange(s - 1, i)  # stage s-1 holds units j..i-1
            fits = weights[j, i - 1] <= caps[s - 1]
            cost = np.where(fits, np.maximum(best[s - 1, j], prefix[i, s - 1] - prefix[j, s - 1]), np.inf)
            k = int(np.argmin(cost))
            best[s, i], cut[s, i] = cost[k], j[k]
    if not np.isfinite(best[stages, u]):
        return None
    stage_of = np.empty(u, np.int64)
    i = u
    for s in range(stages, 0, -1):
        j = int(cut[s, i])
        stage_of[j:i] = s - 1
        i = j
    return stage_of, float(best[stages, u])
