"""What each op moves and in which number format: the graph's side of the roofline cost model
(:meth:`doppler.hardware.cluster.Cluster.compute_time_s`), found once per graph.

* ``bytes_moved[v]``: the bytes of every operand slice op ``v`` reads plus its output bytes. An operand
  produced by another op is the bytes its in-edge carries (the producer's ``output_bytes``; an output an
  op reads twice is one edge, read once); an operand that is a slice of a graph input (a weight, a mask,
  token ids) is that slice's bytes, as :func:`doppler.ir.slices.input_slices` finds them (weights included).
* ``input_bytes[v]``: the part of ``bytes_moved[v]`` that is slices of graph inputs: the bytes a run reads
  from what was resident before it started (weights, tables), not from what an op of the run just wrote.
* ``dtype[v]``: the number format op ``v`` computes in: its spec's ``dtype``, else the graph's
  ``meta["dtype"]``, else ``float32``; ``dtype_names[dtype[v]]`` is its name.
* ``float32_matmul``: ``"tf32"`` where the graph's ``meta["float32_matmul"]`` says its float32 matrix ops
  run on TF32 tensor cores (``torch.backends.cuda.matmul.allow_tf32``), else ``"float32"`` (the default,
  as PyTorch's).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from doppler.ir.graph import DataflowGraph, GraphError, once_per_graph
from doppler.ir.slices import input_slices

__all__ = ["FLOAT32_MATMUL", "OpTraffic", "carry_traffic", "op_traffic"]

#: the values ``meta["float32_matmul"]`` may take (default ``float32``)
FLOAT32_MATMUL = ("float32", "tf32")


@dataclass(frozen=True)
class OpTraffic:
    """Per op: ``bytes_moved`` and ``input_bytes`` (float64[n]) and ``dtype`` (int64[n], an index into
    ``dtype_names``); the graph's ``float32_matmul`` mode. The arrays are read-only."""

    bytes_moved: np.ndarray
    input_bytes: np.ndarray
    dtype: np.ndarray
    dtype_names: tuple[str, ...]
    float32_matmul: str = "float32"


def op_traffic(graph: DataflowGraph) -> OpTraffic:
    """The graph's :class:`OpTraffic`, found once per graph; :class:`GraphError` naming the op or key
    where a spec's ``dtype`` is not a string or ``meta["float32_matmul"]`` is not one of
    :data:`FLOAT32_MATMUL`."""
    return _traffic_once(graph)


def carry_traffic(part: DataflowGraph, whole: DataflowGraph, ops: np.ndarray) -> None:
    """Give ``part``, the graph of ``whole``'s ``ops`` alone (its op ``i`` is ``ops[i]``), the traffic those ops
    have in ``whole``: the bytes each moves there (its operands from outside ``ops`` and its weights included,
    which ``part`` lacks) and its number format, so that each costs on any cluster what it costs in ``whole``.
    Call it before anything reads ``part``'s traffic."""
    t = op_traffic(whole)
    ops = np.asarray(ops, np.int64)
    if ops.shape != (part.num_ops,):
        raise ValueError(f"carry_traffic: {ops.size} ops for a part of {part.num_ops}")
    moved, inputs, dtype = t.bytes_moved[ops].copy(), t.input_bytes[ops].copy(), t.dtype[ops].copy()
    for arr in (moved, inputs, dtype):
        arr.flags.writeable = False
    _carried[part] = OpTraffic(moved, inputs, dtype, t.dtype_names, t.float32_matmul)


def _find_traffic(graph: DataflowGraph) -> OpTraffic:
    carried = _carried.get(graph)
    if carried is not None:
        return carried
    meta = graph.meta if isinstance(graph.meta, dict) else {}
    default = meta.get("dtype", "float32")
    if not isinstance(default, str):
        raise GraphError(f"graph {graph.name!r}: meta.dtype must be a string such as \"float16\", got {default!r:.40}")
    mode = meta.get("float32_matmul", "float32")
    if mode not in FLOAT32_MATMUL:
        raise GraphError(f"graph {graph.name!r}: meta.float32_matmul must be one of {', '.join(FLOAT32_MATMUL)}, "
                         f"got {mode!r:.40}")  # fmt: skip
    n = graph.num_ops
    names = [default] * n if graph.specs is None else [
        spec.get("dtype", default) if isinstance(spec, dict) else default for spec in graph.specs]  # fmt: skip
    uniq = sorted(set(names), key=str)
    bad = next((x for x in uniq if not isinstance(x, str)), None)
    if bad is not None:
        v = names.index(bad)
        raise GraphError(f"op {graph.op_label(v)}: its spec's dtype must be a string such as \"float16\", "
                         f"got {bad!r:.40}")  # fmt: skip
    codes = {name: i for i, name in enumerate(uniq)}
    dtype = np.fromiter((codes[x] for x in names), dtype=np.int64, count=n)
    moved = np.bincount(graph.dst, weights=graph.output_bytes[graph.src], minlength=n).astype(np.float64)
    slices = input_slices(graph)
    ops, s = slices.op_slices()
    inputs = np.bincount(ops, weights=slices.nbytes[s], minlength=n).astype(np.float64) if s.size else np.zeros(n)
    moved += inputs
    moved += graph.output_bytes
    for arr in (moved, inputs, dtype):
        arr.flags.writeable = False
    return OpTraffic(moved, inputs, dtype, tuple(uniq), mode)


_traffic_once = once_per_graph(_find_traffic)
#: the traffic :func:`carry_traffic` gave a part of a graph, while the part lives
_carried: "weakref.WeakKeyDictionary[DataflowGraph, OpTraffic]" = weakref.WeakKeyDictionary()
