"""The expert's placements of a transformer: Megatron-LM's tensor parallelism, alone and as pipeline stages.

Both read the graph's :class:`~doppler.workloads.tiling.ModelStructure` (``graph.meta["structure"]``: the logical ops of
the embedding, of each decoder layer, of the final norm and of the vocabulary head, and which of them are the
projections Megatron-LM splits) and place every tile op on a *tensor-parallel group* of ``t`` devices:

* **Column-parallel projections** (query, key, value, gate, up; the vocabulary head): a partial product goes to
  the device of its weight tile's output block, in contiguous runs (block ``i`` of ``B`` on device
  ``i // (B / t)``: device ``r`` holds the ``r``-th slice of the heads, of the hidden units, of the vocabulary),
  and the sum over its contraction blocks (where the model dimension is split) with it.
* **Row-parallel projections** (output, down): a partial product goes to the device of its weight tile's input
  block, the device that computed those heads or hidden units: each device forms the partial product of its
  own slice.
* **What lies between** (rotary, scores, mask, softmax, the attention-weighted values, a decode step's
  attention to its KV cache, SiLU x up) follows its inputs: an op that reads an op of a head or hidden slice
  runs where that slice is (the input with the most bytes, where it reads two).
* **What Megatron repeats on every device** (the embedding, RMSNorms, residual adds) and the sums of the
  row-parallel partial products (Megatron's all-reduce): our IR runs each op once, so these are spread by
  block, round robin over the group (block ``k`` of a logical op on device ``k mod t``). They are a few percent
  of a layer's work, and spreading them keeps every device's share even. A residual add, the partial sums it
  reads and the norm that reads it have one grid, so block ``k`` of the residual stream stays on one device
  (a reduce-scatter), and the column-parallel projections gather the norm's blocks from every device (an
  all-gather). With one block (``dim_blocks=1``) they all run on the group's first device.

``tensor_parallel`` makes one group of every device. ``tp_pipeline`` makes ``D / t`` groups of ``t``
consecutive devices, each a pipeline stage of contiguous units (:func:`~doppler.methods.layered.layer_units`:
the embedding, each decoder layer, the final norm, the head), split as ``pipeline`` splits them: the largest
stage's compute time (divided by ``t``) as small as it can be with every stage's weights (over ``t`` devices)
within their budgets. Its option ``tp`` is ``t``; by default it tries every ``t`` that divides the devices and
that the graph's blocks divide over, and keeps the placement with the smallest simulated makespan (ties: the
larger ``t``), as an engineer tunes ``tensor_parallel_size``.

Both are memory-aware: a placement whose weights and KV cache (:mod:`doppler.memory`) are over a device's budget
is refused, naming the device. Both refuse in one line a graph with no layer structure (a ``random`` graph, a
``chainmm``) and one whose head, hidden or vocabulary blocks do not divide over the devices of a group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler import memory
from doppler.ir.assignment import Assignment
from doppler.ir.graph import DataflowGraph, GraphError
from doppler.ir.kernels import parse_eq
from doppler.methods.layered import contiguous_stages, device_caps, layer_units, range_weights, unit_weights
from doppler.methods.registry import MethodError, option, register
from doppler.methods.simple import flat_block_index
from doppler.workloads.tiling import ModelStructure, model_structure

#: the ``llama_model`` key that sets each split's block count (named in refusals)
BLOCK_KEYS = {"head": "head_blocks", "hidden": "hidden_blocks", "vocab": "vocab_blocks"}


@dataclass(frozen=True)
class Projections:
    """The tile ops of the split projections: per op ``role`` (0: not a projection, 1: column-parallel, 2:
    row-parallel) and, for projections, the ``index`` of its weight tile's block along the split dimension out
    of ``count`` blocks; ``counts``: (block key, blocks, module) of each projection."""

    role: np.ndarray  # int8[n]
    index: np.ndarray  # int64[n]
    count: np.ndarray  # int64[n]
    counts: list[tuple[str, int, str]]

    def undivided(self, t: int) -> tuple[str, int, str] | None:
        """The first projection whose blocks do not divide over ``t`` devices, or None."""
        return next((c for c in self.counts if c[1] % t), None)


def structure_of(graph: DataflowGraph, method: str) -> ModelStructure:
    """The graph's layer structure, or MethodError in one line where it has none to split."""
    try:
        structure = model_structure(graph)
    except GraphError as e:
        raise MethodError(f"{method}: {graph.name}: {e}") from None
    if structure is None or not structure.layers or not (structure.column_parallel and structure.row_parallel):
        raise MethodError(f"{method}: {graph.name} has no layer structure (decoder layers whose ops record their "
                          "modules, with query/key/value, output, gate/up and down projections: build llama_model "
                          "or import a LLaMA-style model)")  # fmt: skip
    return structure


def projections(graph: DataflowGraph, structure: ModelStructure, method: str) -> Projections:
    """Where each projection's tile ops sit along the split dimension, read from the weight tile each reads
    (its slice of the weight, and the weight's letters in the op's einsum: the output letters of a
    column-parallel product, the contracted ones of a row-parallel one)."""
    n = graph.num_ops
    role, index, count = np.zeros(n, np.int8), np.zeros(n, np.int64), np.ones(n, np.int64)
    order = np.argsort(graph.group, kind="stable")
    cuts = np.searchsorted(graph.group[order], np.arange(len(graph.groups) + 1))
    users = set(graph.meta.get("user_inputs") or ())
    shapes = graph.meta.get("inputs") or {}
    counts = []
    for r, splits in ((1, structure.column_parallel), (2, structure.row_parallel)):
        for split, gids in splits.items():
            for gid in gids:
                ops = order[cuts[gid]:cuts[gid + 1]]
                module = graph.groups[gid].module or graph.groups[gid].name
                for v in ops:
                    index[v], count[v] = _weight_block(graph, int(v), users, shapes, r == 1, method)
                    role[v] = r
                if ops.size:
                    counts.append((BLOCK_KEYS[split], int(count[ops[0]]), module))
    return Projections(role, index, count, counts)


def _weight_block(graph: DataflowGraph, v: int, users: set, shapes: dict, column: bool, method: str) -> tuple[int, int]:
    """(block index, blocks) of op ``v``'s weight tile along the output (``column``) or input axes of the weight."""
    spec = graph.specs[v] if graph.specs is not None else None
    refs = spec.get("inputs", []) if isinstance(spec, dict) else []
    k = next((i for i, r in enumerate(refs) if isinstance(r, dict) and "input" in r and r["input"] not in users), None)
    where = f"{method}: op {graph.op_label(v)}"
    if k is None or not isinstance(spec.get("eq"), str):
        raise MethodError(f"{where} is a projection that reads no weight through an einsum")
    ref = refs[k]
    shape = shapes.get(ref["input"])
    if "xform" in ref or not isinstance(shape, list):
        raise MethodError(f"{where} reads its weight {ref['input']!r} through a layout change or without a "
                          "recorded shape: its split axis is unknown")  # fmt: skip
    try:
        ins, out = parse_eq(spec["eq"], len(refs))
    except ValueError as e:
        raise MethodError(f"{where}: {e}") from None
    bounds = ref.get("slice") or [[0, s] for s in shape]
    idx, blocks = 0, 1
    try:
        for axis, letter in enumerate(ins[k]):
            if (letter in out) == column:
                lo, hi = (int(b) for b in bounds[axis])
                size, whole = hi - lo, int(shape[axis])
                if size <= 0 or whole % size or lo % size:
                    raise ValueError
                idx, blocks = idx * (whole // size) + lo // size, blocks * (whole // size)
    except (TypeError, ValueError, IndexError):
        raise MethodError(f"{where} reads a tile of {ref['input']!r} that is not one of equal blocks") from None
    return idx, blocks


def tp_local(graph: DataflowGraph, proj: Projections, t: int) -> np.ndarray:
    """Each op's device inside a tensor-parallel group of ``t`` devices (int64[n], 0..t-1), by the module
    docstring's rule, in topological order."""
    n = graph.num_ops
    local = np.zeros(n, np.int64)
    sliced = np.zeros(n, bool)  # the op works on one head/hidden slice, and its readers follow it
    spread = flat_block_index(graph) % t
    split = proj.role > 0
    local[split] = proj.index[split] // (proj.count[split] // t)
    ptr, pred, nbytes = graph.pred_ptr, graph.pred_idx, graph.output_bytes
    for v in graph.topo_order:
        if proj.role[v]:
            sliced[v] = proj.role[v] == 1
            continue
        ins = pred[ptr[v]:ptr[v + 1]]
        ins = ins[sliced[ins]]
        if ins.size:
            local[v] = local[ins[int(np.argmax(nbytes[ins]))]]
            sliced[v] = True
        else:
            local[v] = spread[v]
    return local


def _refuse_undivided(proj: Projections, t: int, method: str, what: str) -> None:
    bad = proj.undivided(t)
    if bad is not None:
        key, blocks, module = bad
        raise MethodError(f"{method}: {key}={blocks} does not divide over {t} {what} ({module})")


def _over_budget(graph: DataflowGraph, cluster, devices: np.ndarray, caps: np.ndarray) -> str | None:
    """Why a placement's weights and KV cache are over a device's budget, or None where they fit."""
    held = memory.resident_bytes(graph, devices, int(cluster.num_devices))
    over = np.flatnonzero(held > caps)
    if not over.size:
        return None
    from doppler.report import format_bytes

    k = int(over[0])
    return (f"device {k} ({cluster.devices[k].name}) would hold {format_bytes(float(held[k]))} of weights and KV "
            f"cache, over its budget of {format_bytes(float(caps[k]))}")  # fmt: skip


@register("tensor_parallel", description="Megatron-LM's tensor parallelism over every device: column-parallel "
          "query/key/value and gate/up, row-parallel output and down projections, the vocabulary head by block",
          memory_aware=True, memory_retries=False)  # fmt: skip
def tensor_parallel(graph: DataflowGraph, cluster, *, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """One tensor-parallel group of all ``D`` devices (the module docstring); MethodError where the graph has
    no layer structure, its blocks do not divide over ``D``, or a device's weights are over its budget."""
    d = int(cluster.num_devices)
    proj = projections(graph, structure_of(graph, "tensor_parallel"), "tensor_parallel")
    _refuse_undivided(proj, d, "tensor_parallel", "devices")
    devices = tp_local(graph, proj, d)
    reason = _over_budget(graph, cluster, devices, device_caps(cluster, memory_budget_bytes))
    if reason is not None:
        raise MethodError(f"tensor_parallel: {reason} (more devices; --ignore-memory places it anyway)")
    return Assignment(devices=devices, info={"tp": d, "stages": 1})


@dataclass(frozen=True)
class TpPipelineOptions:
    """The options of ``tp_pipeline``."""

    tp: int | None = option(None, "devices per tensor-parallel group, a divisor of the device count (default: each "
                            "that fits is tried, the fastest kept)", flag="--tp")  # fmt: skip


@register("tp_pipeline", options=TpPipelineOptions, description="tensor-parallel groups of tp devices, one per "
          "pipeline stage of contiguous layers (tp x stages = devices; default tp: the fastest that fits)",
          memory_aware=True, memory_retries=False)  # fmt: skip
def tp_pipeline(graph: DataflowGraph, cluster, options: TpPipelineOptions, *,
                memory_budget_bytes: np.ndarray | None = None) -> Assignment:  # fmt: skip
    """``D / tp`` pipeline stages of ``tp`` devices each (the module docstring); MethodError where ``tp`` does
    not divide the devices, the graph has no layer structure, its blocks do not divide over ``tp``, or no split
    into stages fits the memory budget."""
    d, tp = int(cluster.num_devices), options.tp
    proj = projections(graph, structure_of(graph, "tp_pipeline"), "tp_pipeline")
    if tp is not None:
        if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1 or d % tp:
            raise MethodError(f"tp_pipeline: tp={tp!r} must be a whole number that divides the {d} devices")
        _refuse_undivided(proj, int(tp), "tp_pipeline", "devices of a stage (tp)")
        sizes = [int(tp)]
    else:
        sizes = [t for t in range(1, d + 1) if d % t == 0 and proj.undivided(t) is None]
    names, unit = layer_units(graph)
    reads, nbytes = unit_weights(graph, unit, len(names))
    weights = range_weights(reads, nbytes)
    caps = device_caps(cluster, memory_budget_bytes)
    compute = np.asarray(cluster.compute_time_s(graph), np.float64)
    placed: list[tuple[int, int, np.ndarray]] = []
    refused: dict[int, str] = {}  # group size -> why not
    for t in sizes:
        stages = min(d // t, len(names))
        first = np.arange(stages) * t  # each stage's first device
        per_unit = np.zeros((len(names), stages))
        np.add.at(per_unit, unit, compute[:, first] / t)
        stage_caps = np.array([t * caps[s * t:(s + 1) * t].min() for s in range(stages)])  # weights split t ways
        split = contiguous_stages(per_unit, weights, stage_caps)
        if split is None:
            refused[t] = (f"no split of {len(names)} units into {stages} contiguous stage{'s' * (stages > 1)} keeps "
                          "every stage's weights within its devices' budgets")  # fmt: skip
            continue
        devices = split[0][unit] * t + tp_local(graph, proj, t)
        over = _over_budget(graph, cluster, devices, caps)
        if over is not None:
            refused[t] = over
            continue
        placed.append((t, stages, devices))
    return _fastest(graph, cluster, placed, refused, memory_budget_bytes)


def _fastest(graph: DataflowGraph, cluster, placed: list[tuple[int, int, np.ndarray]], refused: dict[int, str],
             budget: np.ndarray | None) -> Assignment:  # fmt: skip
    """The candidate ``(t, stages, devices)`` with the smallest simulated makespan (ties: the larger ``t``) whose
    peak memory, live activations included, is within ``budget`` (one alone and no budget: taken unsimulated).
    MethodError listing why each group size was refused where none is left."""
    runs: dict[int, object] = {}
    if len(placed) > 1 or budget is not None:
        from doppler.sim import simulate

        for t, _, devices in list(placed):
            runs[t] = result = simulate(graph, cluster, devices, trace=budget is not None)
            if budget is not None:
                chk = memory.against(cluster, result.resident_bytes, result.peak_memory_bytes, budget)
                if not chk.feasible:
                    from doppler.report import memory_overruns

                    refused[t] = "; ".join(memory_overruns(chk))
                    placed = [p for p in placed if p[0] != t]
    if not placed:
        why = "; ".join(f"tp={t}: {refused[t]}" for t in sorted(refused))
        raise MethodError(f"tp_pipeline: no tensor-parallel group size fits: {why} (--ignore-memory places it "
                          "anyway)")  # fmt: skip
    placed.sort(key=lambda p: (runs[p[0]].makespan_s if runs else 0.0, -p[0]))
    t, stages, devices = placed[0]
    tried = {k: float(r.makespan_s) for k, r in runs.items()}
    a = Assignment(devices=devices, estimated_makespan_s=tried.get(t),
                   info={"tp": t, "stages": stages, "makespan_s_by_tp": tried})  # fmt: skip
    if t in runs and budget is not None:
        a.simulation = (graph, cluster, runs[t])  # (the registry's memory check reuses it)
    return a
