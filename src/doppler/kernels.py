"""The fixed kernel whitelist that op specs name, with numpy implementations.

An op spec is plain data (JSON-serialisable), for example::

    {"kernel": "einsum", "eq": "ik,kj->ij",
     "inputs": [{"op": 12, "shape": [64, 64]},
                {"input": "B", "block": [1, 0], "slice": [[64, 128], [0, 64]], "shape": [64, 64]}],
     "shape": [64, 64], "dtype": "float32"}

``inputs`` lists the kernel's operands in order: ``{"op": id}`` is the output of
another op, ``{"input": name, "slice": [[lo, hi], ...]}`` is a tile of a graph
input tensor (inputs are not ops; they are pre-loaded on every device). Every
operand carries its ``shape`` so that FLOPs can be computed from the spec alone.

Kernels (``spec["kernel"]``):

* ``einsum``      product of the operands summed over the letters absent from the output (``eq``)
* ``reduce_sum`` / ``reduce_max``  one operand, ``eq`` like ``"hqk->hq"``
* ``sum_n`` / ``max_n``            n-ary elementwise aggregation of same-shaped partial results
* ``map``         elementwise ``fn`` (from :data:`MAP_FNS`) with broadcasting given by ``eq``
                  letters (``"ij,i->ij"``) and scalar ``params``
* ``fill``        a tile with no operands, ``fn`` from :data:`FILL_FNS` (e.g. a causal mask)
* ``select``      a slice (``params["slice"]``, relative to the operand) of one operand

Nothing named in a spec is ever imported or evaluated: kernels and functions are
looked up by name in the plain dicts below, and an unknown name is a
:class:`ValueError` naming the op.

FLOP convention (exact, so that tiling conserves the total): ``einsum`` costs
``terms * (n_inputs - 1)`` multiplies plus ``terms - out_size`` adds, where
``terms`` is the product of the sizes of all letters; reductions cost
``terms - out_size``; ``sum_n``/``max_n`` cost ``(n - 1) * out_size``; ``map`` and
``fill`` cost ``out_size`` times a per-function constant (:data:`MAP_FLOPS`,
:data:`FILL_FLOPS`); ``select`` costs 0.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

__all__ = [
    "DTYPE_BYTES",
    "FILL_FLOPS",
    "FILL_FNS",
    "MAP_ARITY",
    "MAP_FLOPS",
    "MAP_FNS",
    "NUMPY_KERNELS",
    "evaluate_numpy",
    "flops_of",
    "parse_eq",
    "run_op_numpy",
]

DTYPE_BYTES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}


# ---------------------------------------------------------------- equations
def parse_eq(eq: str, n_inputs: int | None = None) -> tuple[list[str], str]:
    """Split ``"ik,kj->ij"`` into (``["ik", "kj"]``, ``"ij"``) with basic checks."""
    if not isinstance(eq, str) or "->" not in eq:
        raise ValueError(f"equation {eq!r} must look like 'ik,kj->ij'")
    lhs, out = eq.replace(" ", "").split("->", 1)
    ins = lhs.split(",") if lhs else []
    for term in ins + [out]:
        if not all(c.isalpha() for c in term):
            raise ValueError(f"equation {eq!r}: only letters are allowed in subscripts")
        if len(set(term)) != len(term):
            raise ValueError(f"equation {eq!r}: a letter repeats inside {term!r}")
    used = set("".join(ins))
    if ins and not set(out) <= used:
        raise ValueError(f"equation {eq!r}: output letters {sorted(set(out) - used)} appear in no operand")
    if n_inputs is not None and len(ins) != n_inputs:
        raise ValueError(f"equation {eq!r} has {len(ins)} operands, expected {n_inputs}")
    return ins, out


def _letter_sizes(ins: Sequence[str], shapes: Sequence[Sequence[int]], eq: str) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for term, shape in zip(ins, shapes):
        if len(term) != len(shape):
            raise ValueError(f"equation {eq!r}: operand {term!r} has shape {list(shape)} (rank mismatch)")
        for c, s in zip(term, shape):
            if sizes.setdefault(c, int(s)) != int(s):
                raise ValueError(f"equation {eq!r}: letter {c!r} has sizes {sizes[c]} and {int(s)}")
    return sizes


# ------------------------------------------------------------ map functions
def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _axis_index(shape: Sequence[int], axis: int, offset: int) -> np.ndarray:
    idx = np.arange(shape[axis]) + int(offset)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return idx.reshape(view)


def _causal_keep(shape: Sequence[int], p: Mapping[str, Any]) -> np.ndarray:
    rows = _axis_index(shape, int(p.get("row_axis", 0)), p.get("row_offset", 0))
    cols = _axis_index(shape, int(p.get("col_axis", 1)), p.get("col_offset", 0))
    return cols <= rows


def _map_causal_mask(a: list[np.ndarray], p: Mapping[str, Any]) -> np.ndarray:
    x = a[0]
    return np.where(_causal_keep(x.shape, p), x, -np.inf).astype(x.dtype, copy=False)


def _map_rms_scale(a: list[np.ndarray], p: Mapping[str, Any]) -> np.ndarray:
    x, sumsq, w = a
    return x * (1.0 / np.sqrt(sumsq / float(p["n"]) + float(p.get("eps", 1e-6)))) * w


def _map_rotary(a: list[np.ndarray], p: Mapping[str, Any]) -> np.ndarray:
    x, cos, sin = a
    if x.shape[-1] % 2:
        raise ValueError(f"rotary needs an even last axis, got {x.shape[-1]}")
    return x * cos + _rotate_half(x) * sin


#: name -> function(aligned operands, params) -> array
MAP_FNS: dict[str, Callable[[list[np.ndarray], Mapping[str, Any]], np.ndarray]] = {
    "add": lambda a, p: a[0] + a[1],
    "sub": lambda a, p: a[0] - a[1],
    "mul": lambda a, p: a[0] * a[1],
    "div": lambda a, p: a[0] / a[1],
    "relu": lambda a, p: np.maximum(a[0], 0),
    "scale": lambda a, p: a[0] * float(p["c"]),
    "silu_mul": lambda a, p: a[0] / (1.0 + np.exp(-a[0])) * a[1],
    "exp_sub": lambda a, p: np.exp(float(p.get("scale", 1.0)) * (a[0] - a[1])),
    "rms_scale": _map_rms_scale,
    "rotary": _map_rotary,
    "causal_mask": _map_causal_mask,
}
#: number of operands of each map function
MAP_ARITY: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "div": 2, "relu": 1, "scale": 1, "silu_mul": 2,
    "exp_sub": 2, "rms_scale": 3, "rotary": 3, "causal_mask": 1,
}  # fmt: skip
#: FLOPs per output element of each map function
MAP_FLOPS: dict[str, float] = {
    "add": 1, "sub": 1, "mul": 1, "div": 1, "relu": 1, "scale": 1,
    "silu_mul": 5,  # neg, exp, add, div, mul
    "exp_sub": 3,  # sub, mul by scale, exp
    "rms_scale": 6,  # div by n, add eps, sqrt, reciprocal, two muls
    "rotary": 4,  # two muls, one add, one negation
    "causal_mask": 1,
}  # fmt: skip

#: name -> function(shape, params, dtype) -> array
FILL_FNS: dict[str, Callable[[tuple[int, ...], Mapping[str, Any], Any], np.ndarray]] = {
    "causal_mask": lambda shape, p, dt: np.where(_causal_keep(shape, p), 0.0, -np.inf).astype(dt),
    "zeros": lambda shape, p, dt: np.zeros(shape, dtype=dt),
}
FILL_FLOPS: dict[str, float] = {"causal_mask": 1, "zeros": 0}


def _align(term: str, out: str, x: np.ndarray) -> np.ndarray:
    """View ``x`` (subscripts ``term``) broadcastable against the output ``out``."""
    perm = sorted(range(len(term)), key=lambda i: out.index(term[i]))
    x = np.transpose(x, perm)
    it = iter(x.shape)
    return x.reshape([next(it) if c in term else 1 for c in out])


# ----------------------------------------------------------------- kernels
def _operands(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], n: int | None) -> list[np.ndarray]:
    if n is not None and len(arrays) != n:
        raise ValueError(f"kernel {spec.get('kernel')!r} takes {n} operand(s), got {len(arrays)}")
    return [np.asarray(a) for a in arrays]


def _k_einsum(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    ins, out = parse_eq(spec["eq"], len(arrays))
    ops = _operands(spec, arrays, len(ins))
    return np.einsum(spec["eq"], *ops, optimize=len(ops) > 1)


def _reduce(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], how: Callable) -> np.ndarray:
    (term,), out = parse_eq(spec["eq"], 1)
    (x,) = _operands(spec, arrays, 1)
    if not set(out) <= set(term):
        raise ValueError(f"reduction {spec['eq']!r} produces letters it does not read")
    kept = [term.index(c) for c in out]
    red = [i for i, c in enumerate(term) if c not in out]
    x = np.transpose(x, kept + red)
    x = x.reshape(x.shape[: len(kept)] + (-1,))
    return how(x, axis=-1)


def _k_reduce_sum(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    return _reduce(spec, arrays, np.sum)


def _k_reduce_max(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    return _reduce(spec, arrays, np.max)


def _fold(name: str, spec: Mapping[str, Any], arrays: Sequence[np.ndarray], ufunc: np.ufunc) -> np.ndarray:
    """Elementwise ``ufunc`` over all operands (the n-ary aggregation of partial results)."""
    ops = _operands(spec, arrays, None)
    if not ops:
        raise ValueError(f"{name} needs at least one operand")
    out = np.array(ops[0], copy=True)
    for a in ops[1:]:
        ufunc(out, a, out=out)
    return out


def _k_sum_n(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    return _fold("sum_n", spec, arrays, np.add)


def _k_max_n(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    return _fold("max_n", spec, arrays, np.maximum)


def _k_map(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    fn = spec.get("fn")
    if fn not in MAP_FNS:
        raise ValueError(f"unknown map fn {fn!r} (known: {', '.join(sorted(MAP_FNS))})")
    ins, out = parse_eq(spec["eq"], MAP_ARITY[fn])
    ops = _operands(spec, arrays, len(ins))
    for term in ins:
        if not set(term) <= set(out):
            raise ValueError(f"map {spec['eq']!r}: an operand has letters missing from the output")
    aligned = [_align(t, out, a) for t, a in zip(ins, ops)]
    res = MAP_FNS[fn](aligned, spec.get("params") or {})
    shape = tuple(int(s) for s in spec["shape"]) if "shape" in spec else np.broadcast_shapes(*(a.shape for a in aligned))
    if res.shape != shape:
        res = np.ascontiguousarray(np.broadcast_to(res, shape))
    return res


def _k_fill(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    fn = spec.get("fn")
    if fn not in FILL_FNS:
        raise ValueError(f"unknown fill fn {fn!r} (known: {', '.join(sorted(FILL_FNS))})")
    _operands(spec, arrays, 0)
    shape = tuple(int(s) for s in spec["shape"])
    return FILL_FNS[fn](shape, spec.get("params") or {}, dtype if dtype is not None else spec.get("dtype", "float32"))


def _k_select(spec: Mapping[str, Any], arrays: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    (x,) = _operands(spec, arrays, 1)
    sl = spec["params"]["slice"]
    if len(sl) != x.ndim:
        raise ValueError(f"select slice {sl} does not match operand rank {x.ndim}")
    return np.ascontiguousarray(x[tuple(slice(int(lo), int(hi)) for lo, hi in sl)])


#: kernel name -> function(spec, operand arrays, dtype for constant tiles) -> array
NUMPY_KERNELS: dict[str, Callable[[Mapping[str, Any], Sequence[np.ndarray], Any], np.ndarray]] = {
    "einsum": _k_einsum,
    "reduce_sum": _k_reduce_sum,
    "reduce_max": _k_reduce_max,
    "sum_n": _k_sum_n,
    "max_n": _k_max_n,
    "map": _k_map,
    "fill": _k_fill,
    "select": _k_select,
}


def _where(label: Any) -> str:
    return f"op {label}: " if label is not None else ""


def run_op_numpy(
    spec: Mapping[str, Any], operand_arrays: Sequence[np.ndarray], *, label: Any = None, dtype: Any = None
) -> np.ndarray:
    """Run one op spec on its operand arrays (in spec ``inputs`` order) with numpy.

    ``dtype`` is the dtype of constant tiles (``fill``); default: the spec's.
    """
    kernel = spec.get("kernel") if isinstance(spec, Mapping) else None
    fn = NUMPY_KERNELS.get(kernel) if isinstance(kernel, str) else None
    if fn is None:
        raise ValueError(f"{_where(label)}unknown kernel {kernel!r} (known: {', '.join(sorted(NUMPY_KERNELS))})")
    try:
        out = fn(spec, operand_arrays, dtype)
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{_where(label)}malformed {kernel!r} spec: {e!r}") from None
    except ValueError as e:
        raise ValueError(f"{_where(label)}{e}") from None
    want = spec.get("shape")
    if want is not None and tuple(out.shape) != tuple(int(s) for s in want):
        raise ValueError(f"{_where(label)}kernel {kernel!r} produced shape {list(out.shape)}, spec says {list(want)}")
    return out


# ------------------------------------------------------------------- flops
def _size(shape: Sequence[int]) -> int:
    return int(math.prod(int(s) for s in shape))


def flops_of(spec: Mapping[str, Any], *, label: Any = None) -> float:
    """FLOPs of one op spec under the module's convention (needs operand ``shape``s)."""
    kernel = spec.get("kernel")
    try:
        shapes = [ref["shape"] for ref in spec.get("inputs", [])]
        out_size = _size(spec["shape"])
        if kernel == "einsum":
            ins, out = parse_eq(spec["eq"], len(shapes))
            sizes = _letter_sizes(ins, shapes, spec["eq"])
            terms = _size(list(sizes.values()))
            return float(terms * (len(ins) - 1) + (terms - out_size))
        if kernel in ("reduce_sum", "reduce_max"):
            parse_eq(spec["eq"], 1)
            return float(_size(shapes[0]) - out_size)
        if kernel in ("sum_n", "max_n"):
            return float((len(shapes) - 1) * out_size)
        if kernel == "map":
            if spec.get("fn") not in MAP_FLOPS:
                raise ValueError(f"unknown map fn {spec.get('fn')!r} (known: {', '.join(sorted(MAP_FLOPS))})")
            return float(out_size * MAP_FLOPS[spec["fn"]])
        if kernel == "fill":
            if spec.get("fn") not in FILL_FLOPS:
                raise ValueError(f"unknown fill fn {spec.get('fn')!r} (known: {', '.join(sorted(FILL_FLOPS))})")
            return float(out_size * FILL_FLOPS[spec["fn"]])
        if kernel == "select":
            return 0.0
    except (KeyError, TypeError) as e:
        raise ValueError(f"{_where(label)}malformed {kernel!r} spec: missing {e}") from None
    except ValueError as e:
        raise ValueError(f"{_where(label)}{e}") from None
    raise ValueError(f"{_where(label)}unknown kernel {kernel!r} (known: {', '.join(sorted(NUMPY_KERNELS))})")


# ---------------------------------------------------------------- evaluator
def evaluate_numpy(graph: Any, inputs: Mapping[str, np.ndarray], *, dtype: Any = None) -> list[np.ndarray | None]:
    """Evaluate every op of ``graph`` (in ``graph.topo_order``) from its spec.

    ``inputs`` maps each input tensor name to its full array; input tiles are
    sliced from it. Returns one array per op (``None`` for none: every op needs a
    spec). Constant tiles use ``dtype`` (default: the inputs' common dtype).
    """
    if graph.specs is None:
        raise ValueError(f"graph {graph.name!r} has no op specs, so it cannot be evaluated")
    arrays = {k: np.asarray(v) for k, v in inputs.items()}
    if dtype is None and arrays:
        dtype = np.result_type(*arrays.values())
    values: list[np.ndarray | None] = [None] * graph.num_ops
    for i in graph.topo_order:
        i = int(i)
        spec = graph.specs[i]
        label = graph.op_label(i)
        if spec is None:
            raise ValueError(f"op {label} has no spec, so it cannot be evaluated")
        ops: list[np.ndarray] = []
        for ref in spec.get("inputs", []):
            if "op" in ref:
                j = int(ref["op"])
                v = values[j] if 0 <= j < graph.num_ops else None
                if v is None:
                    raise ValueError(f"op {label}: operand op {j} is not a computed predecessor")
            elif "input" in ref:
                name = ref["input"]
                if name not in arrays:
                    raise ValueError(f"op {label}: input tensor {name!r} was not provided")
                v = arrays[name]
                if "slice" in ref:
                    sl = ref["slice"]
                    if len(sl) != v.ndim:
                        raise ValueError(f"op {label}: slice {sl} does not fit input {name!r} of shape {list(v.shape)}")
                    v = v[tuple(slice(int(lo), int(hi)) for lo, hi in sl)]
            else:
                raise ValueError(f"op {label}: operand {ref!r} names neither an op nor an input")
            if "shape" in ref and tuple(v.shape) != tuple(int(s) for s in ref["shape"]):
                raise ValueError(f"op {label}: operand has shape {list(v.shape)}, spec says {list(ref['shape'])}")
            ops.append(v)
        values[i] = run_op_numpy(spec, ops, label=label, dtype=dtype)
    return values
