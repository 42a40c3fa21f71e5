"""Which slices of the graph's inputs each op reads: the distinct slices (weights and activation inputs),
their bytes, and per op the slices it reads, found once per graph from the ops' specs. The memory model
(:mod:`doppler.memory`), the roofline's bytes moved (:mod:`doppler.hardware.traffic`), the list schedulers'
ledger and the file formats read it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from doppler.ir.graph import DataflowGraph, GraphError, once_per_graph
from doppler.ir.kernels import DTYPE_BYTES


@dataclass(frozen=True)
class InputSlices:
    """The distinct slices of graph inputs that the ops read: ``nbytes[s]`` and ``weight[s]`` (False: a
    slice of an activation input) per slice ``s``, its input's name, and per op ``v`` the slices it reads,
    ``slice_idx[op_ptr[v]:op_ptr[v + 1]]`` (CSR)."""

    names: list[str]
    nbytes: np.ndarray  # float64[S]
    weight: np.ndarray  # bool[S]
    op_ptr: np.ndarray  # int64[n + 1]
    slice_idx: np.ndarray  # int64[nnz]

    @property
    def num_slices(self) -> int:
        return int(self.nbytes.shape[0])

    def op_slices(self) -> tuple[np.ndarray, np.ndarray]:
        """(op, slice) of every read, as two aligned arrays."""
        ops = np.repeat(np.arange(self.op_ptr.shape[0] - 1, dtype=np.int64), np.diff(self.op_ptr))
        return ops, self.slice_idx


def input_slices(graph: DataflowGraph) -> InputSlices:
    """The graph-input slices its op specs read (:class:`InputSlices`), found once per graph. A graph
    without specs reads none."""
    return _input_slices_once(graph)


def _find_input_slices(graph: DataflowGraph) -> InputSlices:
    meta = graph.meta if isinstance(graph.meta, dict) else {}
    shapes = meta.get("inputs") if isinstance(meta.get("inputs"), dict) else {}
    users = meta.get("user_inputs") or ()
    if not isinstance(users, (list, tuple)) or not all(isinstance(u, str) for u in users):
        raise GraphError(f"graph {graph.name!r}: meta.user_inputs must be a list of input names, got {users!r:.60}")
    itemsize = DTYPE_BYTES.get(str(meta.get("dtype", "float32")), 4)  # (the graph's dtype; float32 if none)
    index: dict[tuple, int] = {}
    names: list[str] = []
    nbytes: list[float] = []
    ptr = np.zeros(graph.num_ops + 1, dtype=np.int64)
    idx: list[int] = []
    for v, spec in enumerate(graph.specs or ()):
        refs = spec.get("inputs", ()) if isinstance(spec, dict) else ()
        first = len(idx)
        for ref in refs if isinstance(refs, (list, tuple)) else ():
            name = ref.get("input") if isinstance(ref, dict) else None
            if name is None:
                continue
            key = _plain_slice_key(name, ref.get("slice"))  # (a well-formed slice, without the checks' calls)
            if key is None:
                key, extent = _slice_of(graph, v, ref, shapes)
            else:
                extent = [hi - lo for lo, hi in key[1]]
            s = index.get(key)
            if s is None and key[1] and name in shapes:
                _check_inside(graph, v, key, shapes[name])
            if s is None:
                s = index[key] = len(names)
                names.append(str(name))
                nbytes.append(math.prod(float(e) for e in extent) * itemsize)
            if s not in idx[first:]:  # (an op reads a few slices: a scan beats a set)
                idx.append(s)
        ptr[v + 1] = len(idx)
    users = set(users)
    return InputSlices(names, np.asarray(nbytes, dtype=np.float64), np.array([n not in users for n in names], bool),
                       ptr, np.asarray(idx, dtype=np.int64))  # fmt: skip


def _check_inside(graph: DataflowGraph, v: int, key: tuple, shape: object) -> None:
    """GraphError naming op ``v`` unless the slice ``key`` (input, bounds) lies inside the input's declared
    ``shape`` (``meta.inputs``): as many dimensions, each bound at most its size."""
    name, bounds = key
    if not isinstance(shape, (list, tuple)) or len(shape) != len(bounds) or any(
            not isinstance(d, int) or hi > d for (_, hi), d in zip(bounds, shape)):  # fmt: skip
        raise GraphError(f"op {graph.op_label(v)}: its slice {[list(b) for b in bounds]!s:.80} of input {name!r:.60} "
                         f"does not lie inside the input's shape {shape!s:.60} (meta.inputs)")  # fmt: skip


_input_slices_once = once_per_graph(_find_input_slices)


def _plain_slice_key(name: object, bounds: object) -> tuple | None:
    """The key :func:`_slice_of` gives a reference to input ``name`` with slice ``bounds``, where ``name`` is a
    string and ``bounds`` a list of ``[lo, hi]`` pairs of plain ints, else None (then :func:`_slice_of` decides)."""
    if type(name) is not str or type(bounds) is not list:
        return None
    try:
        key = tuple([(lo, hi) for lo, hi in bounds])
    except (TypeError, ValueError):
        return None
    for lo, hi in key:
        if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi:
            return None
    return name, key


def _slice_of(graph: DataflowGraph, v: int, ref: dict, shapes: dict) -> tuple[tuple, list]:
    """The key ``(input, bounds)`` and the extent of the input slice an operand reference reads: its
    ``slice`` (``[[lo, hi], ...]``), else the whole input (its ``meta.inputs`` shape, else the ref's
    ``shape``). GraphError naming the op where the reference is malformed."""
    name = ref["input"]
    if not isinstance(name, str):
        raise GraphError(f"op {graph.op_label(v)}: an operand's input {name!r:.60} is not an input name (a string)")

    def whole_numbers(x: object) -> bool:
        return isinstance(x, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                    for i in x)  # fmt: skip

    bounds = ref.get("slice")
    if bounds is not None:
        if not (isinstance(bounds, (list, tuple)) and all(whole_numbers(b) and len(b) == 2 and b[0] <= b[1]
                                                          for b in bounds)):  # fmt: skip
            raise GraphError(f"op {graph.op_label(v)}: input {name!r}: slice {bounds!r:.60} is not a list of "
                             "[lo, hi] pairs (0 <= lo <= hi)")  # fmt: skip
        return (name, tuple((int(lo), int(hi)) for lo, hi in bounds)), [hi - lo for lo, hi in bounds]
    shape = shapes.get(name, ref.get("shape"))
    if not whole_numbers(shape):
        raise GraphError(f"op {graph.op_label(v)}: input {name!r:.60} has no slice and no known shape")
    return (name, ()), list(shape)
