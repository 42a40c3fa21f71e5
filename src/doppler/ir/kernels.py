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
                  letters (``"ij,i->ij"``) and scalar ``params``; ``fn="fused"`` runs a chain
                  ``params["steps"]`` of such functions (``[fn, [arg, ...], params]``, where arg
                  ``i < n`` is operand ``i`` and ``n + k`` the result of step ``k``) in one op
* ``fill``        a tile with no operands, ``fn`` from :data:`FILL_FNS` (e.g. a causal mask)
* ``select``      a slice (``params["slice"]``, relative to the operand) of one operand
* ``assemble``    a tile put together from pieces of other tiles (``params["at"]``: where each
                  operand goes in the output; the rest is zero): re-tiling and concatenation
* ``embedding``   rows of a table operand picked by an index operand (float-coded integers)
* ``attention``   fused (FlashAttention-style) grouped-query attention in one op, no score tensor kept:
                  operands ``[q, k_1..k_n, v_1..v_n]`` (``params["kv_tiles"]`` = n), ``q`` of shape
                  (batch, queries, kv_heads, heads_per_kv, head_dim), each ``k_i``/``v_i`` (batch, keys_i,
                  kv_heads, head_dim), the key tiles joined along their positions in order (position 0
                  first); output ``softmax(scale * q.k^T) . v`` shaped like ``q``. ``params["causal"]``:
                  query ``t`` (absolute position ``params["q_offset"] + t``) attends to keys ``0..q_offset+t``
                  only; otherwise to every key

An operand reference may carry ``"xform"``, a list of zero-FLOP layout steps applied to the
tile before the kernel reads it: ``["perm", axes]``, ``["view", shape]`` (row-major reshape)
and ``["slice", [[lo, hi], ...]]``. Imported models (:mod:`doppler.importer`) fold
transposes, reshapes and slices into their consumers this way instead of emitting copy ops.

Every kernel is written once against a small array namespace (:class:`NumpyOps`,
:class:`TorchOps`), so the CPU engine runs them with numpy and the CUDA engine
with torch on the GPU (:func:`run_op_torch`), with the same arithmetic.

Nothing named in a spec is ever imported or evaluated: kernels and functions are
looked up by name in the plain dicts below, and an unknown name is a
:class:`ValueError` naming the op.

FLOP convention (exact, so that tiling conserves the total): ``einsum`` costs
``terms * (n_inputs - 1)`` multiplies plus ``terms - out_size`` adds, where
``terms`` is the product of the sizes of all letters; reductions cost
``terms - out_size``; ``sum_n``/``max_n`` cost ``(n - 1) * out_size``; ``map`` and
``fill`` cost ``out_size`` times a per-function constant (:data:`MAP_FLOPS`,
:data:`FILL_FLOPS`); ``select``, ``assemble`` and ``embedding`` cost 0; ``attention`` costs, per query head
and per (query, key) pair it attends (a causal kernel skips the masked pairs, as FlashAttention skips masked
blocks), ``4 * head_dim + 4`` (the score's ``2 * head_dim - 1``; its scale, max, subtraction, exponential and
sum; ``2 * head_dim`` for the weighted value), plus one division per output element.
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
    "NumpyOps",
    "TorchOps",
    "apply_xform",
    "evaluate_numpy",
    "flops_of",
    "operand_shape",
    "parse_eq",
    "run_op",
    "run_op_numpy",
    "run_op_torch",
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


# ------------------------------------------------------------ array namespaces
class NumpyOps:
    """The array operations kernels use, on numpy arrays (host memory)."""

    asarray = staticmethod(np.asarray)
    transpose = staticmethod(np.transpose)

    @staticmethod
    def concat(xs: Sequence[Any], axis: int) -> Any:
        return np.concatenate(xs, axis=axis)

    @staticmethod
    def einsum(eq: str, *ops: Any) -> Any:
        return np.einsum(eq, *ops, optimize=len(ops) > 1)

    @staticmethod
    def reduce(x: Any, how: str) -> Any:
        return np.sum(x, axis=-1) if how == "sum" else np.max(x, axis=-1)

    @staticmethod
    def fold_into(out: Any, x: Any, how: str) -> None:
        (np.add if how == "sum" else np.maximum)(out, x, out=out)

    @staticmethod
    def copy(x: Any) -> Any:
        return np.array(x, copy=True)

    contiguous = staticmethod(np.ascontiguousarray)

    @staticmethod
    def broadcast_to(x: Any, shape: tuple[int, ...]) -> Any:
        return np.ascontiguousarray(np.broadcast_to(x, shape))

    exp = staticmethod(np.exp)
    sqrt = staticmethod(np.sqrt)

    @staticmethod
    def relu(x: Any) -> Any:
        return np.maximum(x, 0)

    @staticmethod
    def where_neg_inf(keep: Any, x: Any, dtype: Any) -> Any:
        """``x`` where ``keep``, else -inf, in ``dtype``."""
        return np.where(keep, x, -np.inf).astype(dtype, copy=False)

    @staticmethod
    def index(n: int, offset: int) -> Any:
        return np.arange(n) + int(offset)

    zeros = staticmethod(np.zeros)

    @staticmethod
    def take_rows(table: Any, idx: Any) -> Any:
        return table[np.asarray(idx).astype(np.int64)]

    tanh = staticmethod(np.tanh)
    expm1 = staticmethod(np.expm1)
    log1p = staticmethod(np.log1p)
    where = staticmethod(np.where)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)

    @staticmethod
    def erf(x: Any) -> Any:
        from scipy.special import erf

        return erf(x)


class TorchOps:
    """The same operations on torch tensors of one device (``"cpu"``, ``"cuda:0"``)."""

    def __init__(self, device: Any = "cpu") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        for fn in ("einsum", "exp", "sqrt", "tanh", "erf", "expm1", "log1p", "where", "maximum",
                   "minimum"):  # torch's own, called as they are
            setattr(self, fn, getattr(torch, fn))

    def dtype(self, dtype: Any) -> Any:
        name = getattr(dtype, "name", None) or str(dtype)
        return getattr(self.torch, name.removeprefix("torch."))

    def asarray(self, x: Any) -> Any:
        return x

    def transpose(self, x: Any, perm: Sequence[int]) -> Any:
        return x.permute(*perm)

    def concat(self, xs: Sequence[Any], axis: int) -> Any:
        return self.torch.cat(list(xs), dim=axis)

    def reduce(self, x: Any, how: str) -> Any:
        return x.sum(dim=-1) if how == "sum" else x.amax(dim=-1)

    def fold_into(self, out: Any, x: Any, how: str) -> None:
        if how == "sum":
            out.add_(x)
        else:
            self.torch.maximum(out, x, out=out)

    def copy(self, x: Any) -> Any:
        return x.clone()

    def contiguous(self, x: Any) -> Any:
        return x.contiguous()

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.broadcast_to(shape).contiguous()

    def relu(self, x: Any) -> Any:
        return self.torch.clamp_min(x, 0)

    def where_neg_inf(self, keep: Any, x: Any, dtype: Any) -> Any:
        x = x if self.torch.is_tensor(x) else self.torch.tensor(x, dtype=self.dtype(dtype), device=self.device)
        return self.torch.where(keep, x, float("-inf")).to(self.dtype(dtype))

    def index(self, n: int, offset: int) -> Any:
        return self.torch.arange(int(offset), int(offset) + n, device=self.device)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.zeros(shape, dtype=self.dtype(dtype), device=self.device)

    def take_rows(self, table: Any, idx: Any) -> Any:
        return table[idx.long()]


NUMPY = NumpyOps()


# ------------------------------------------------------------ map functions
def _rotate_half(x: Any, xp: Any) -> Any:
    half = x.shape[-1] // 2
    return xp.concat([-x[..., half:], x[..., :half]], -1)


def _axis_index(shape: Sequence[int], axis: int, offset: int, xp: Any) -> Any:
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return xp.index(shape[axis], offset).reshape(view)


def _causal_keep(shape: Sequence[int], p: Mapping[str, Any], xp: Any) -> Any:
    rows = _axis_index(shape, int(p.get("row_axis", 0)), p.get("row_offset", 0), xp)
    cols = _axis_index(shape, int(p.get("col_axis", 1)), p.get("col_offset", 0), xp)
    return cols <= rows


def _map_causal_mask(a: list[Any], p: Mapping[str, Any], xp: Any) -> Any:
    x = a[0]
    return xp.where_neg_inf(_causal_keep(x.shape, p, xp), x, x.dtype)


def _map_rms_scale(a: list[Any], p: Mapping[str, Any], xp: Any) -> Any:
    x, sumsq, w = a
    return x * (1.0 / xp.sqrt(sumsq / float(p["n"]) + float(p.get("eps", 1e-6)))) * w


def _map_rotary(a: list[Any], p: Mapping[str, Any], xp: Any) -> Any:
    x, cos, sin = a
    if x.shape[-1] % 2:
        raise ValueError(f"rotary needs an even last axis, got {x.shape[-1]}")
    return x * cos + _rotate_half(x, xp) * sin


def _map_gelu_tanh(a: list[Any], p: Mapping[str, Any], xp: Any) -> Any:
    return 0.5 * a[0] * (1.0 + xp.tanh(0.7978845608028654 * (a[0] + 0.044715 * a[0] ** 3)))


def _choose(cond: Any, a: Any, b: Any, xp: Any) -> Any:
    """``a`` where ``cond`` (a 0/1 tensor: the graph holds one element type) is not 0, else ``b``; a number
    ``b`` or ``a`` is taken as it is."""
    return xp.where(cond != 0, a, b)


def _indicator(cond: Any, like: Any, xp: Any) -> Any:
    """1 where ``cond``, else 0, in the element type of ``like``."""
    return xp.where(cond, 1.0, xp.zeros(tuple(like.shape), like.dtype))


def _softplus(a: list[Any], p: Mapping[str, Any], xp: Any) -> Any:
    """torch's ``softplus``: ``log1p(exp(beta x)) / beta``, and ``x`` itself where ``beta x`` passes ``threshold``."""
    beta, threshold = float(p.get("beta", 1.0)), float(p.get("threshold", 20.0))
    bx = a[0] * beta
    return xp.where(bx > threshold, a[0], xp.log1p(xp.exp(_choose(bx > threshold, threshold, bx, xp))) / beta)


def _number(p: Mapping[str, Any]) -> float:
    """``p["c"]``: a number, or ``"inf"``, ``"-inf"`` (a graph file holds no non-finite JSON number)."""
    return float(p["c"])


#: name -> (function(aligned operands, params, array namespace) -> array, operands, FLOPs per output element)
_MAP_TABLE: dict[str, tuple[Callable[[list[Any], Mapping[str, Any], Any], Any], int, float]] = {
    "add": (lambda a, p, xp: a[0] + a[1], 2, 1),
    "sub": (lambda a, p, xp: a[0] - a[1], 2, 1),
    "mul": (lambda a, p, xp: a[0] * a[1], 2, 1),
    "div": (lambda a, p, xp: a[0] / a[1], 2, 1),
    "relu": (lambda a, p, xp: xp.relu(a[0]), 1, 1),
    "scale": (lambda a, p, xp: a[0] * float(p["c"]), 1, 1),
    "silu_mul": (lambda a, p, xp: a[0] / (1.0 + xp.exp(-a[0])) * a[1], 2, 5),  # neg, exp, add, div, mul
    "exp_sub": (lambda a, p, xp: xp.exp(float(p.get("scale", 1.0)) * (a[0] - a[1])), 2, 3),  # sub, mul by scale, exp
    "rms_scale": (_map_rms_scale, 3, 6),  # div by n, add eps, sqrt, reciprocal, two muls
    "rotary": (_map_rotary, 3, 4),  # two muls, one add, one negation
    "causal_mask": (_map_causal_mask, 1, 1),
    "neg": (lambda a, p, xp: -a[0], 1, 1),
    "add_scalar": (lambda a, p, xp: a[0] + float(p["c"]), 1, 1),
    "rsub_scalar": (lambda a, p, xp: float(p["c"]) - a[0], 1, 1),
    "rdiv_scalar": (lambda a, p, xp: float(p["c"]) / a[0], 1, 1),
    "pow": (lambda a, p, xp: a[0] ** float(p["c"]), 1, 1),
    "rsqrt": (lambda a, p, xp: 1.0 / xp.sqrt(a[0]), 1, 2),
    "sqrt": (lambda a, p, xp: xp.sqrt(a[0]), 1, 1),
    "exp": (lambda a, p, xp: xp.exp(a[0]), 1, 1),
    "tanh": (lambda a, p, xp: xp.tanh(a[0]), 1, 1),
    "silu": (lambda a, p, xp: a[0] / (1.0 + xp.exp(-a[0])), 1, 4),  # neg, exp, add, div
    "sigmoid": (lambda a, p, xp: 1.0 / (1.0 + xp.exp(-a[0])), 1, 4),
    "gelu": (lambda a, p, xp: 0.5 * a[0] * (1.0 + xp.erf(a[0] * 0.7071067811865476)), 1, 5),  # mul, erf, add, two muls
    "gelu_tanh": (_map_gelu_tanh, 1, 9),  # cube, mul, add, mul, tanh, add, two muls
    "rotate_half": (lambda a, p, xp: _rotate_half(a[0], xp), 1, 1),  # the negation
    "where": (lambda a, p, xp: _choose(a[0], a[1], a[2], xp), 3, 1),  # (condition, then, else)
    "where_scalar": (lambda a, p, xp: _choose(a[0], a[1], _number(p), xp), 2, 1),  # else the number c
    "rwhere_scalar": (lambda a, p, xp: _choose(a[0], _number(p), a[1], xp), 2, 1),  # the number c, else the operand
    "maximum": (lambda a, p, xp: xp.maximum(a[0], a[1]), 2, 1),
    "minimum": (lambda a, p, xp: xp.minimum(a[0], a[1]), 2, 1),
    "max_scalar": (lambda a, p, xp: _choose(a[0] < _number(p), _number(p), a[0], xp), 1, 1),
    "min_scalar": (lambda a, p, xp: _choose(a[0] > _number(p), _number(p), a[0], xp), 1, 1),
    "gt_scalar": (lambda a, p, xp: _indicator(a[0] > _number(p), a[0], xp), 1, 1),  # 1 or 0
    "lt_scalar": (lambda a, p, xp: _indicator(a[0] < _number(p), a[0], xp), 1, 1),
    "softplus": (_softplus, 1, 4),  # mul, exp, log1p, div
    "expm1": (lambda a, p, xp: xp.expm1(a[0]), 1, 1),
}
#: name -> function(aligned operands, params, array namespace) -> array (``fused`` is added below)
MAP_FNS: dict[str, Callable[[list[Any], Mapping[str, Any], Any], Any]] = {k: v[0] for k, v in _MAP_TABLE.items()}
#: number of operands of each map function
MAP_ARITY: dict[str, int] = {k: v[1] for k, v in _MAP_TABLE.items()}
#: FLOPs per output element of each map function
MAP_FLOPS: dict[str, float] = {k: v[2] for k, v in _MAP_TABLE.items()}

#: name -> function(shape, params, dtype, array namespace) -> array
FILL_FNS: dict[str, Callable[[tuple[int, ...], Mapping[str, Any], Any, Any], Any]] = {
    "causal_mask": lambda shape, p, dt, xp: xp.where_neg_inf(_causal_keep(shape, p, xp), 0.0, dt),
    "zeros": lambda shape, p, dt, xp: xp.zeros(shape, dt),
}
FILL_FLOPS: dict[str, float] = {"causal_mask": 1, "zeros": 0}


def _align(term: str, out: str, x: Any, xp: Any) -> Any:
    """View ``x`` (subscripts ``term``) broadcastable against the output ``out``."""
    perm = sorted(range(len(term)), key=lambda i: out.index(term[i]))
    x = xp.transpose(x, perm)
    it = iter(x.shape)
    return x.reshape([next(it) if c in term else 1 for c in out])


# ----------------------------------------------------------------- kernels
XFORM_STEPS = ("perm", "view", "slice")


def apply_xform(x: Any, xform: Sequence[Any] | None, xp: Any) -> Any:
    """``x`` after an operand's layout steps (see the module docstring); views where possible."""
    for step in xform or ():
        how, arg = step
        if how == "perm":
            x = xp.transpose(x, [int(a) for a in arg])
        elif how == "view":
            x = x.reshape(tuple(int(s) for s in arg))
        elif how == "slice":
            if len(arg) != x.ndim:
                raise ValueError(f"xform slice {arg} does not match operand rank {x.ndim}")
            x = x[tuple(slice(int(lo), int(hi)) for lo, hi in arg)]
        else:
            raise ValueError(f"unknown xform step {how!r} (known: {', '.join(XFORM_STEPS)})")
    return x


def operand_shape(ref: Mapping[str, Any]) -> list[int]:
    """The shape a kernel sees for operand ``ref``: its ``shape`` after its ``xform`` steps."""
    shape = [int(s) for s in ref["shape"]]
    for how, arg in ref.get("xform") or ():
        if how == "perm":
            shape = [shape[int(a)] for a in arg]
        elif how == "view":
            if math.prod(int(s) for s in arg) != math.prod(shape):
                raise ValueError(f"xform view {list(arg)} does not fit shape {shape}")
            shape = [int(s) for s in arg]
        elif how == "slice":
            shape = [int(hi) - int(lo) for lo, hi in arg]
        else:
            raise ValueError(f"unknown xform step {how!r} (known: {', '.join(XFORM_STEPS)})")
    return shape


def _operands(spec: Mapping[str, Any], arrays: Sequence[Any], n: int | None, xp: Any) -> list[Any]:
    if n is not None and len(arrays) != n:
        raise ValueError(f"kernel {spec.get('kernel')!r} takes {n} operand(s), got {len(arrays)}")
    refs = spec.get("inputs") or [{}] * len(arrays)
    return [apply_xform(xp.asarray(a), ref.get("xform"), xp) for a, ref in zip(arrays, refs)]


def _k_einsum(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    ins, out = parse_eq(spec["eq"], len(arrays))
    return xp.einsum(spec["eq"], *_operands(spec, arrays, len(ins), xp))


def _reduce(spec: Mapping[str, Any], arrays: Sequence[Any], how: str, xp: Any) -> Any:
    (term,), out = parse_eq(spec["eq"], 1)
    (x,) = _operands(spec, arrays, 1, xp)
    if not set(out) <= set(term):
        raise ValueError(f"reduction {spec['eq']!r} produces letters it does not read")
    kept = [term.index(c) for c in out]
    red = [i for i, c in enumerate(term) if c not in out]
    x = xp.transpose(x, kept + red)
    x = x.reshape(tuple(x.shape[: len(kept)]) + (-1,))
    return xp.reduce(x, how)


def _fold(name: str, spec: Mapping[str, Any], arrays: Sequence[Any], how: str, xp: Any) -> Any:
    """Elementwise sum or max over all operands (the n-ary aggregation of partial results)."""
    ops = _operands(spec, arrays, None, xp)
    if not ops:
        raise ValueError(f"{name} needs at least one operand")
    out = xp.copy(ops[0])
    for a in ops[1:]:
        xp.fold_into(out, a, how)
    return out


def _fused_steps(p: Mapping[str, Any], n: int) -> list[tuple[str, list[int], Mapping[str, Any]]]:
    """The checked steps of a fused map over ``n`` operands."""
    steps = []
    for k, (fn, args, params) in enumerate(p["steps"]):
        if fn not in MAP_FNS or fn == "fused":
            raise ValueError(f"fused step {k}: unknown map fn {fn!r}")
        args = [int(a) for a in args]
        if len(args) != MAP_ARITY[fn] or not all(0 <= a < n + k for a in args):
            raise ValueError(f"fused step {k}: {fn!r} with arguments {args} (n={n})")
        steps.append((fn, args, params or {}))
    if not steps:
        raise ValueError("a fused map needs at least one step")
    return steps


def _map_fused(a: list[Any], p: Mapping[str, Any], xp: Any) -> Any:
    vals = list(a)
    for fn, args, params in _fused_steps(p, len(a)):
        vals.append(MAP_FNS[fn]([vals[i] for i in args], params, xp))
    return vals[-1]


MAP_FNS["fused"] = _map_fused


def _k_map(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    fn = spec.get("fn")
    if fn not in MAP_FNS:
        raise ValueError(f"unknown map fn {fn!r} (known: {', '.join(sorted(MAP_FNS))})")
    ins, out = parse_eq(spec["eq"], None if fn == "fused" else MAP_ARITY[fn])
    ops = _operands(spec, arrays, len(ins), xp)
    for term in ins:
        if not set(term) <= set(out):
            raise ValueError(f"map {spec['eq']!r}: an operand has letters missing from the output")
    aligned = [_align(t, out, a, xp) for t, a in zip(ins, ops)]
    res = MAP_FNS[fn](aligned, spec.get("params") or {}, xp)
    shape = tuple(int(s) for s in spec["shape"]) if "shape" in spec else np.broadcast_shapes(*(tuple(a.shape) for a in aligned))
    if tuple(res.shape) != shape:
        res = xp.broadcast_to(res, shape)
    return res


def _k_fill(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    fn = spec.get("fn")
    if fn not in FILL_FNS:
        raise ValueError(f"unknown fill fn {fn!r} (known: {', '.join(sorted(FILL_FNS))})")
    _operands(spec, arrays, 0, xp)
    shape = tuple(int(s) for s in spec["shape"])
    return FILL_FNS[fn](shape, spec.get("params") or {}, np.dtype(dtype if dtype is not None else spec.get("dtype", "float32")), xp)


def _k_select(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    (x,) = _operands(spec, arrays, 1, xp)
    sl = spec["params"]["slice"]
    if len(sl) != x.ndim:
        raise ValueError(f"select slice {sl} does not match operand rank {x.ndim}")
    return xp.contiguous(x[tuple(slice(int(lo), int(hi)) for lo, hi in sl)])


def _k_assemble(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    ops = _operands(spec, arrays, None, xp)
    at = spec["params"]["at"]
    if len(at) != len(ops):
        raise ValueError(f"assemble has {len(ops)} operands but {len(at)} placements")
    out = xp.zeros(tuple(int(s) for s in spec["shape"]), ops[0].dtype if ops else np.dtype(dtype or "float32"))
    for x, sl in zip(ops, at):
        out[tuple(slice(int(lo), int(hi)) for lo, hi in sl)] = x
    return out


def _attention_pairs(n_q: int, n_k: int, p: Mapping[str, Any]) -> int:
    """The (query, key) pairs a fused attention attends: all ``n_q * n_k``, or causally the keys at or before
    each query's absolute position ``q_offset + t`` (keys start at position 0)."""
    if not p.get("causal"):
        return n_q * n_k
    off = int(p.get("q_offset", 0))
    if off < 0:
        raise ValueError(f"attention q_offset={off} must be >= 0")
    full = max(0, min(n_q, n_k - off))  # queries whose causal window fits in the keys: 1 + off + t keys
    return full * (off + 1) + full * (full - 1) // 2 + (n_q - full) * n_k


def _attention_split(spec: Mapping[str, Any], n: int) -> int:
    tiles = int((spec.get("params") or {})["kv_tiles"])
    if tiles < 1 or n != 1 + 2 * tiles:
        raise ValueError(f"attention with kv_tiles={tiles} takes {1 + 2 * tiles} operands, got {n}")
    return tiles


def _k_attention(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    ops = _operands(spec, arrays, None, xp)
    tiles = _attention_split(spec, len(ops))
    p = spec.get("params") or {}
    q = ops[0]
    k = ops[1] if tiles == 1 else xp.concat(ops[1 : 1 + tiles], 1)
    v = ops[1 + tiles] if tiles == 1 else xp.concat(ops[1 + tiles :], 1)
    if q.ndim != 5 or k.ndim != 4 or tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"attention needs q (b, s, j, r, d) and k, v (b, n, j, d), got {list(q.shape)}, "
                         f"{list(k.shape)}, {list(v.shape)}")  # fmt: skip
    s = xp.einsum("bqjrd,bkjd->bjrqk", q, k) * float(p.get("scale", 1.0))
    if p.get("causal"):
        s = _map_causal_mask([s], {"row_axis": 3, "col_axis": 4, "row_offset": int(p.get("q_offset", 0))}, xp)
    e = xp.exp(s - _align("bjrq", "bjrqk", xp.reduce(s, "max"), xp))
    z = xp.reduce(e, "sum")
    return xp.einsum("bjrqk,bkjd->bqjrd", e, v) / _align("bjrq", "bqjrd", z, xp)


def _k_embedding(spec: Mapping[str, Any], arrays: Sequence[Any], dtype: Any, xp: Any) -> Any:
    table, idx = _operands(spec, arrays, 2, xp)
    return xp.take_rows(table, idx)


#: kernel name -> function(spec, operand arrays, dtype for constant tiles, array namespace) -> array
NUMPY_KERNELS: dict[str, Callable[[Mapping[str, Any], Sequence[Any], Any, Any], Any]] = {
    "einsum": _k_einsum,
    "reduce_sum": lambda spec, arrays, dtype, xp: _reduce(spec, arrays, "sum", xp),
    "reduce_max": lambda spec, arrays, dtype, xp: _reduce(spec, arrays, "max", xp),
    "sum_n": lambda spec, arrays, dtype, xp: _fold("sum_n", spec, arrays, "sum", xp),
    "max_n": lambda spec, arrays, dtype, xp: _fold("max_n", spec, arrays, "max", xp),
    "map": _k_map,
    "fill": _k_fill,
    "select": _k_select,
    "assemble": _k_assemble,
    "embedding": _k_embedding,
    "attention": _k_attention,
}


def _where(label: Any) -> str:
    return f"op {label}: " if label is not None else ""


def run_op(
    spec: Mapping[str, Any], operand_arrays: Sequence[Any], *, label: Any = None, dtype: Any = None, xp: Any = NUMPY
) -> Any:
    """Run one op spec on its operands (in spec ``inputs`` order) with the array namespace ``xp``.

    ``dtype`` is the dtype of constant tiles (``fill``); default: the spec's. The output is
    always contiguous in row-major order: einsum may return a transposed layout, on which a
    consumer can run many times slower than on the same values in row-major order, so an op's
    time would depend on whether its operands came straight from the producer or through a
    transfer's row-major copy, which no cost model can see.
    """
    kernel = spec.get("kernel") if isinstance(spec, Mapping) else None
    fn = NUMPY_KERNELS.get(kernel) if isinstance(kernel, str) else None
    if fn is None:
        raise ValueError(f"{_where(label)}unknown kernel {kernel!r} (known: {', '.join(sorted(NUMPY_KERNELS))})")
    try:
        out = xp.contiguous(fn(spec, operand_arrays, dtype, xp))
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{_where(label)}malformed {kernel!r} spec: {e!r}") from None
    except ValueError as e:
        raise ValueError(f"{_where(label)}{e}") from None
    want = spec.get("shape")
    if want is not None and tuple(out.shape) != tuple(int(s) for s in want):
        raise ValueError(f"{_where(label)}kernel {kernel!r} produced shape {list(out.shape)}, spec says {list(want)}")
    return out


def run_op_numpy(
    spec: Mapping[str, Any], operand_arrays: Sequence[np.ndarray], *, label: Any = None, dtype: Any = None
) -> np.ndarray:
    """Run one op spec on numpy arrays (see :func:`run_op`)."""
    return run_op(spec, operand_arrays, label=label, dtype=dtype, xp=NUMPY)


def run_op_torch(spec: Mapping[str, Any], operand_tensors: Sequence[Any], *, label: Any = None, dtype: Any = None,
                 ops: TorchOps | None = None) -> Any:  # fmt: skip
    """Run one op spec on torch tensors of one device (``ops`` names it; default: the CPU)."""
    return run_op(spec, operand_tensors, label=label, dtype=dtype, xp=ops if ops is not None else TorchOps())


# ------------------------------------------------------------------- flops
def _size(shape: Sequence[int]) -> int:
    return int(math.prod(int(s) for s in shape))


def flops_of(spec: Mapping[str, Any], *, label: Any = None) -> float:
    """FLOPs of one op spec under the module's convention (needs operand ``shape``s)."""
    kernel = spec.get("kernel")
    try:
        shapes = [operand_shape(ref) for ref in spec.get("inputs", [])]
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
        if kernel == "map" and spec.get("fn") == "fused":
            steps = _fused_steps(spec.get("params") or {}, len(shapes))
            return float(out_size * sum(MAP_FLOPS[fn] for fn, _, _ in steps))
        if kernel in ("map", "fill"):
            per = MAP_FLOPS if kernel == "map" else FILL_FLOPS
            if spec.get("fn") not in per:
                raise ValueError(f"unknown {kernel} fn {spec.get('fn')!r} (known: {', '.join(sorted(per))})")
            return float(out_size * per[spec["fn"]])
        if kernel in ("select", "assemble", "embedding"):
            return 0.0
        if kernel == "attention":
            tiles = _attention_split(spec, len(shapes))
            b, n_q, j, r, d = shapes[0]
            n_k = sum(sh[1] for sh in shapes[1 : 1 + tiles])
            pairs = _attention_pairs(n_q, n_k, spec.get("params") or {})
            return float(b * j * r * (pairs * (4 * d + 4) + n_q * d))
    except (KeyError, TypeError) as e:
        raise ValueError(f"{_where(label)}malformed {kernel!r} spec: missing {e}") from None
    except OverflowError:  # (Python's integers do not overflow; their conversion to a float does)
        raise ValueError(f"{_where(label)}{kernel!r} op: its FLOPs are too large for a float (over 1.8e308)") from None
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
