"""Elementwise fusion: values an op has computed but not yet emitted as tile ops.

A chain of elementwise ops (``x * rsqrt(mean(x ** 2) + eps) * w``) is held as one pending
:class:`Expr` (leaves, and steps over them) and becomes one fused ``map`` op when it is consumed
(:meth:`Fusion._emit`); a ``t ** 2`` summed is one contraction of ``t`` with itself
(:func:`is_square`). An ``expand`` is a :class:`Bcast`, read with broadcasting by elementwise ops and
copied only for another consumer. Grouped-query attention's ``repeat_kv`` is a :class:`Repeat`:
attention reads each key/value tile once per group of query heads, never a copy.

:class:`Fusion` holds the tile builder of one lowering (``b``) and how many ops read each FX node's
value (``uses``): an expression read by more than one op is emitted once and shared. It turns a pending
value into tiles (:meth:`Fusion.tensor`); what a known torch tensor becomes is the lowering's
(:meth:`Fusion.materialize`).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from doppler.ir.graph import OpKind
from doppler.importer.errors import GraphImportError
from doppler.importer.layout import LETTERS, Builder, unify, view
from doppler.workloads.tiling import Tensor


class Bcast:
    """``src`` (a tensor or pending expression whose broadcast axes have size 1) expanded to ``shape``,
    not yet copied: an elementwise op reads ``src`` with broadcasting, ``repeat_kv``'s reshape makes a
    :class:`Repeat` of it, other consumers get a copy (an ``assemble`` op per block)."""

    def __init__(self, src: Any, shape: tuple[int, ...]) -> None:
        self.src, self.shape = src, shape
        self.copied: Tensor | None = None  # its copy, once a consumer needed one


class Repeat:
    """``src`` with axis ``axis`` repeated: ``out[..., i, ...] = src[..., i // rep, ...]`` (grouped-query
    attention's keys and values after ``repeat_kv``), not yet copied: attention reads ``src`` by groups."""

    def __init__(self, src: Tensor, axis: int, rep: int) -> None:
        self.src, self.axis, self.rep = src, axis, rep
        self.shape = tuple(s * rep if a == axis else s for a, s in enumerate(src.shape))
        self.copied: Tensor | None = None  # its copy, once a consumer needed one


class Expr:
    """A pending elementwise expression: ``leaves`` (tensor, subscripts over the output letters)
    and ``steps`` (map fn, arguments ``("leaf", i)`` or ``("step", k)``, params)."""

    def __init__(self, shape: tuple[int, ...], uses: int, name: str) -> None:
        self.shape, self.uses, self.name = shape, uses, name
        self.leaves: list[tuple[Tensor, str]] = []
        self.steps: list[tuple[str, list, dict]] = []
        self.tensor: Tensor | None = None  # its tile ops, once emitted
        self.module = ""  # the module of the op that made it (its fused op's module)

    def leaf(self, t: Tensor, term: str) -> tuple[str, int]:
        for i, (u, tt) in enumerate(self.leaves):
            if u is t and tt == term:
                return ("leaf", i)
        self.leaves.append((t, term))
        return ("leaf", len(self.leaves) - 1)


def is_square(x: Any) -> bool:
    """Is ``x`` a pending ``t ** 2`` read by one op only?"""
    return (isinstance(x, Expr) and x.uses == 1 and x.tensor is None and len(x.steps) == 1
            and x.steps[0][0] == "pow" and float(x.steps[0][2].get("c", 0)) == 2.0
            and len(x.leaves) == 1 and x.leaves[0][1] == LETTERS[: len(x.shape)])  # fmt: skip


class Fusion:
    """Pending values of one lowering and their tile ops (a base of the lowering)."""

    b: Builder  # the tile builder the graph is built with
    uses: dict[Any, int]  # FX node -> how many ops read its value

    def materialize(self, value: Any, hint: str) -> Tensor:
        """A known torch tensor as a graph input (the lowering's)."""
        raise NotImplementedError

    def tensor(self, v: Any, hint: str) -> Tensor:
        """``v`` as tiles: a pending expression emitted, a broadcast or repeat copied (once each), a known
        torch tensor materialized."""
        import torch

        if isinstance(v, Tensor):
            return v
        if isinstance(v, Expr):
            return self._emit(v)
        if isinstance(v, (Bcast, Repeat)):
            if v.copied is None:
                v.copied = self._copy_broadcast(v, hint) if isinstance(v, Bcast) else self._copy_repeat(v, hint)
            return v.copied
        if isinstance(v, torch.Tensor):
            return self.materialize(v, hint)
        raise GraphImportError(f"{hint}: expected a tensor, got {type(v).__name__}")

    def _copy_broadcast(self, x: Bcast, hint: str) -> Tensor:
        """``x`` copied: the source tile at every offset of the broadcast axes, one ``assemble`` op per
        block (the broadcast axes are one block)."""
        src = self.tensor(x.src, hint)
        axes = [a for a, (s, t) in enumerate(zip(src.shape, x.shape)) if s != t]
        grid = [1 if a in axes else g for a, g in enumerate(src.grid)]
        offsets = itertools.product(*(range(x.shape[a]) if a in axes else [0] for a in range(len(x.shape))))
        return self.b.assemble(self.b.fresh(hint + ".expand"), x.shape, grid, [(src, list(o)) for o in offsets])

    def _copy_repeat(self, x: Repeat, hint: str) -> Tensor:
        """``x`` copied, for a consumer other than attention (see :meth:`_copy_broadcast`)."""
        a, shape = x.axis, list(x.src.shape)
        split = view(self.b, x.src, [*shape[: a + 1], 1, *shape[a + 1 :]], self.b.fresh(hint + ".split"))
        full = self._copy_broadcast(Bcast(split, (*shape[: a + 1], x.rep, *shape[a + 1 :])), hint)
        return view(self.b, full, x.shape, self.b.fresh(hint + ".repeat"))

    def _copy(self, t: Tensor, name: str) -> Tensor:
        name = self.b.fresh(name)
        return self.b.blockwise(name, OpKind.FORMATION, "assemble", t.shape, t.grid, lambda blk: [dict(t.tiles[blk])],
                                lambda blk: {"at": [[[0, s] for s in t.block_shape]]})  # fmt: skip

    def _ew(self, fn: str, operands: list, node: Any, params: dict | None = None) -> "Expr":
        """``fn`` over ``operands`` (tensors or pending expressions) with numpy broadcasting, as a
        pending expression: a chain of elementwise ops becomes one fused op when it is consumed."""
        import torch

        out_shape = tuple(np.broadcast_shapes(*(tuple(o.shape) for o in operands)))
        sources = [o.src if isinstance(o, Bcast) else o for o in operands]
        if tuple(np.broadcast_shapes(*(tuple(o.shape) for o in sources))) == out_shape:
            operands = sources  # numpy broadcasting reads each not-yet-copied broadcast's source
        operands = [self.tensor(o, node.name) if isinstance(o, (torch.Tensor, Bcast, Repeat)) else o
                    for o in operands]  # fmt: skip
        r = len(out_shape)
        e = Expr(out_shape, self.uses.get(node, 1), node.name)
        e.module = self.b.module
        args = []
        for o in operands:
            if isinstance(o, Expr) and (o.uses > 1 or sum(p is o for p in operands) > 1 or o.tensor is not None):
                o = self.tensor(o, node.name)
            k = len(o.shape)
            keep = [i for i in range(k) if not (o.shape[i] == 1 and out_shape[r - k + i] != 1)]
            letter = {i: LETTERS[r - k + i] for i in keep}
            if isinstance(o, Tensor):
                args.append(e.leaf(self._squeezed(o, keep, node), "".join(letter[i] for i in keep)))
                continue
            remap = []  # inline the operand expression: its leaves re-lettered into this one
            for t, term in o.leaves:
                axes = [LETTERS.index(c) for c in term]
                kept = [j for j, a in enumerate(axes) if a in letter]
                remap.append(e.leaf(self._squeezed(t, kept, node), "".join(letter[axes[j]] for j in kept)))
            base = len(e.steps)
            for sfn, sargs, sparams in o.steps:
                e.steps.append((sfn, [remap[a] if kind == "leaf" else base + a for kind, a in sargs], sparams))
            args.append(len(e.steps) - 1)
        e.steps.append((fn, args, dict(params or {})))
        e.steps = [(f, [("step", a) if isinstance(a, int) else a for a in sa], p) for f, sa, p in e.steps]
        return e

    def _squeezed(self, t: Tensor, keep: list[int], node: Any) -> Tensor:
        if len(keep) == len(t.shape):
            return t
        if not keep:
            raise GraphImportError("a one-element computed tensor broadcast in an elementwise op")
        return view(self.b, t, [t.shape[i] for i in keep], self.b.fresh(node.name + ".bcast"))

    def _emit(self, e: "Expr") -> Tensor:
        """The tile ops of a pending expression (once; later consumers share them)."""
        if e.tensor is not None:
            return e.tensor
        out = LETTERS[: len(e.shape)]
        absent = [a for a, c in enumerate(out) if c not in "".join(term for _, term in e.leaves)]
        if any(e.shape[a] != 1 for a in absent):  # an output axis no operand has
            raise GraphImportError(f"{e.name}: elementwise op with an axis no operand has")
        if absent:  # size-1 axes inserted after the expression (an unsqueeze): emit without them, then view
            kept = [c for a, c in enumerate(out) if a not in absent]
            inner = Expr(tuple(s for a, s in enumerate(e.shape) if a not in absent), e.uses, e.name)
            inner.leaves = [(t, "".join(LETTERS[kept.index(c)] for c in term)) for t, term in e.leaves]
            inner.steps, inner.module = e.steps, e.module
            e.tensor = view(self.b, self._emit(inner), e.shape, self.b.fresh(e.name + ".view"))
            return e.tensor
        name = self.b.fresh(e.name)
        steps = [(f, [a if kind == "leaf" else len(e.leaves) + a for kind, a in sa], p) for f, sa, p in e.steps]
        fns = {f for f, _, _ in steps}
        whole = out[-1] if "rotate_half" in fns else ""  # rotate_half swaps the halves of the last axis
        eq = ",".join(term for _, term in e.leaves) + "->" + out
        kind = (OpKind.ROTARY if "rotate_half" in fns else OpKind.NORM if fns & {"rsqrt", "rms_scale"}
                else OpKind.ELEMENTWISE)  # fmt: skip
        with self.b.scope(e.module):
            ts = unify(self.b, [(t, term) for t, term in e.leaves], name, whole)
            if len(steps) == 1 and steps[0][1] == list(range(len(e.leaves))):
                e.tensor = self.b.map(steps[0][0], eq, *ts, name=name, kind=kind, params=steps[0][2] or None)
            else:
                e.tensor = self.b.map("fused", eq, *ts, name=name, kind=kind,
                                      params={"steps": [[f, a, p] for f, a, p in steps]})  # fmt: skip
        return e.tensor

    def _unsqueezed(self, y: Any, inserted: list[int], node: Any) -> Any:
        """``y`` with size-1 axes inserted at positions ``inserted`` of the result (a pending
        expression stays pending)."""
        r = len(y.shape) + len(inserted)
        pos = [i for i in range(r) if i not in inserted]  # new position of each old axis
        shape = [1] * r
        for old, new in enumerate(pos):
            shape[new] = y.shape[old]
        if isinstance(y, Tensor):
            return view(self.b, y, shape, self.b.fresh(node.name + ".keepdim"))
        e = Expr(tuple(shape), y.uses, y.name)
        e.module = y.module
        e.leaves = [(t, "".join(LETTERS[pos[LETTERS.index(c)]] for c in term)) for t, term in y.leaves]
        e.steps = list(y.steps)
        return e
