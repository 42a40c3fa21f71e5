"""The tiling machinery: :class:`TileBuilder` turns einsum-style logical ops on block-split tensors
into the tile-level ops of a :class:`~doppler.ir.graph.DataflowGraph`.

A builder splits every tensor into a grid of blocks and emits the ops a sharded-tensor engine
would run: one op per block product of a contraction (a *partial product*,
:attr:`~doppler.ir.graph.OpKind.MATMUL`), one n-ary aggregation per output block that sums the
partial products over the contracted-dimension blocks (:attr:`~doppler.ir.graph.OpKind.ADD`, only
when there is more than one contraction block), and one op per output block of every
elementwise step. The built-in workloads (:mod:`doppler.workloads`) and imported PyTorch models
(:mod:`doppler.importer`) are both written with it.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from doppler.ir.graph import (MAX_BLOCK_DIMS, MAX_TENSOR_ELEMENTS, DataflowGraph, GraphError, Group, OpKind, TileLayout, shape_elements)
from doppler.ir.kernels import DTYPE_BYTES, flops_of, parse_eq

__all__ = ["COLUMN_PARALLEL", "ROW_PARALLEL", "ModelStructure", "Tensor", "TileBuilder", "WorkloadError", "derive_structure",
           "fmt_block", "layer_key", "model_structure", "tiled_rmsnorm", "tiled_softmax"]


class WorkloadError(ValueError):
    """Bad workload name or parameters; the message says what and where."""


@dataclass
class Tensor:
    """A logical tensor split into a grid of equal blocks; ``tiles`` maps each block
    index to the operand reference (a spec ``inputs`` entry) that holds it."""

    name: str
    shape: tuple[int, ...]
    grid: tuple[int, ...]
    tiles: dict[tuple[int, ...], dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def block_shape(self) -> tuple[int, ...]:
        return tuple(s // g for s, g in zip(self.shape, self.grid))

    def tile_slice(self, block: Sequence[int]) -> list[list[int]]:
        return [[int(b * s), int((b + 1) * s)] for b, s in zip(block, self.block_shape)]

    def blocks(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(g) for g in self.grid)))


def fmt_block(idx: Sequence[int]) -> str:
    return "[" + ",".join(str(int(i)) for i in idx) + "]"


class TileBuilder:
    """Builds a tile-level :class:`DataflowGraph` from einsum-style logical ops.

    Every logical op becomes one :class:`~doppler.ir.graph.Group` (two for a tiled
    contraction or reduction: the partial ops and their aggregation) and records
    its own FLOPs, computed at full-tensor level, in ``untiled_flops``.

    A group's grid has one axis per output letter (then one per contracted letter).
    When that is more than :data:`~doppler.ir.graph.MAX_BLOCK_DIMS` axes, single-block
    axes are dropped, leftmost first, until it fits (they carry no information);
    if it still does not fit, the grid is flattened to one row-major axis.
    """

    def __init__(self, workload: str, dtype: str = "float32", *, count_only: bool = False) -> None:
        """``count_only``: make no op, only count them (:attr:`counted`): how many tile ops a workload would
        have, known before any is made (each logical op's tiles are the product of its grid)."""
        if dtype not in DTYPE_BYTES:
            raise WorkloadError(f"{workload}: dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
        self.workload = workload
        self.dtype = dtype
        self.count_only = count_only
        self.counted = 0  #: tile ops declared so far (made, unless ``count_only``)
        self.itemsize = DTYPE_BYTES[dtype]
        self.flops: list[float] = []
        self.out_bytes: list[float] = []
        self.kinds: list[int] = []
        self.group_of: list[int] = []
        self.blocks: list[tuple[int, ...]] = []
        self.names: list[str] = []
        self.specs: list[dict[str, Any]] = []
        self.src: list[int] = []
        self.dst: list[int] = []
        self.groups: list[Group] = []
        self.untiled_flops = 0.0
        self.inputs: dict[str, list[int]] = {}
        self.user_inputs: list[str] = []
        self.input_init: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self._logical_names: set[str] = set()
        #: the module path the logical ops declared now belong to (:attr:`~doppler.ir.graph.Group.module`)
        self.module = ""
        # per group: (kept axes of the full grid, kept grid, flattened?)
        self._block_map: list[tuple[tuple[int, ...], tuple[int, ...], bool]] = []

    @contextlib.contextmanager
    def scope(self, module: str) -> Iterator[None]:
        """Record ``module`` as the module of every logical op declared inside the block."""
        outer, self.module = self.module, module
        try:
            yield
        finally:
            self.module = outer

    # ------------------------------------------------------------- helpers
    def _err(self, msg: str) -> WorkloadError:
        return WorkloadError(f"{self.workload}: {msg}")

    def _count(self, n: int) -> bool:
        """Count ``n`` more tile ops; True if only counting (the caller then makes none)."""
        self.counted += n
        return self.count_only

    def _flops(self, spec: dict[str, Any], name: str) -> float:
        """:func:`~doppler.ir.kernels.flops_of`, its refusal (a malformed spec, or sizes whose FLOPs overflow a
        float) a WorkloadError naming the logical op."""
        try:
            return flops_of(spec)
        except ValueError as e:
            raise self._err(f"{name}: {e}") from None

    def _check_elements(self, what: str, shape: Sequence[int]) -> None:
        """Refuse a shape the graph file would declare (an input's or output's, an op's tile) past
        :data:`~doppler.ir.graph.MAX_TENSOR_ELEMENTS`, which every reader of the file refuses: checked while ops are
        counted, before any is made."""
        if shape_elements([int(s) for s in shape]) is None:
            raise self._err(f"{what} of shape {list(shape)} has more than {MAX_TENSOR_ELEMENTS:,} elements, the most a "
                            "graph's tensor may have")  # fmt: skip

    def _check_grid(self, name: str, shape: Sequence[int], grid: Sequence[int]) -> None:
        if len(shape) != len(grid):
            raise self._err(f"tensor {name!r} has rank {len(shape)} but a grid of rank {len(grid)}")
        for ax, (s, g) in enumerate(zip(shape, grid)):
            if int(g) < 1 or int(s) < 1 or int(s) % int(g):
                raise self._err(f"tensor {name!r} axis {ax}: {g} blocks do not divide size {s}")

    def _claim(self, name: str) -> None:
        if name in self._logical_names:
            raise self._err(f"two logical ops are named {name!r}")
        self._logical_names.add(name)

    def _add_op(self, name: str, kind: OpKind, spec: dict[str, Any], group: int, block: Sequence[int]) -> int:
        i = len(self.flops)
        spec["dtype"] = self.dtype
        self.flops.append(self._flops(spec, name))
        self.out_bytes.append(float(math.prod(spec["shape"]) * self.itemsize))
        self.kinds.append(int(kind))
        self.group_of.append(group)
        grid = self.groups[group].grid
        keep, kept, flat = self._block_map[group]
        block = tuple(int(block[a]) for a in keep)  # the group grid was reduced the same way
        if flat:
            block = (int(np.ravel_multi_index(block, kept)),)
        assert len(block) == len(grid)
        self.blocks.append(block)
        self.names.append(name)
        self.specs.append(spec)
        seen: set[int] = set()
        for ref in spec["inputs"]:
            j = ref.get("op")
            if j is not None and j not in seen:
                seen.add(j)
                self.src.append(int(j))
                self.dst.append(i)
        return i

    def _new_group(self, name: str, kind: OpKind, grid: Sequence[int]) -> int:
        full = tuple(int(g) for g in grid)
        keep = list(range(len(full)))
        for ax in range(len(full)):  # drop single-block axes, leftmost first, only while too many
            if len(keep) <= MAX_BLOCK_DIMS:
                break
            if full[ax] == 1:
                keep.remove(ax)
        kept = tuple(full[a] for a in keep)
        flat = len(kept) > MAX_BLOCK_DIMS
        self.groups.append(Group(name=name, kind=kind.label, grid=(int(math.prod(kept)),) if flat else kept,
                                 module=self.module))  # fmt: skip
        self._block_map.append((tuple(keep), kept, flat))
        return len(self.groups) - 1

    def _tensor_from_ops(self, name: str, shape: Sequence[int], grid: Sequence[int], ids: dict) -> Tensor:
        t = Tensor(name, tuple(int(s) for s in shape), tuple(int(g) for g in grid))
        bs = t.block_shape
        for blk, i in ids.items():
            t.tiles[blk] = {"op": int(i), "shape": list(bs)}
        return t

    def _per_block(self, name: str, kind: OpKind, shape: Sequence[int], grid: Sequence[int],
                   spec_of: Callable[[tuple[int, ...]], dict[str, Any]]) -> Tensor:  # fmt: skip
        """One op (and group) of ``kind`` per block of the output grid, its spec ``spec_of(block)``; when
        counting, only their number."""
        self._check_elements(f"a tile of {name!r}", [int(s) // int(g) for s, g in zip(shape, grid)])
        if self._count(math.prod(grid)):
            return Tensor(name, tuple(shape), tuple(grid))
        g = self._new_group(name, kind, grid)
        ids = {}
        for blk in itertools.product(*(range(n) for n in grid)):
            ids[blk] = self._add_op(f"{name}{fmt_block(blk)}", kind, spec_of(blk), g, blk)
        return self._tensor_from_ops(name, shape, grid, ids)

    def _letters(self, name: str, ins: Sequence[str], ts: Sequence[Tensor]) -> dict[str, tuple[int, int, str]]:
        """letter -> (size, blocks, tensor name), checked consistent across operands."""
        info: dict[str, tuple[int, int, str]] = {}
        for term, t in zip(ins, ts):
            if len(term) != len(t.shape):
                raise self._err(f"{name}: operand {t.name!r} has rank {len(t.shape)} but subscripts {term!r}")
            for c, s, g in zip(term, t.shape, t.grid):
                if c in info and info[c][:2] != (s, g):
                    s0, g0, n0 = info[c]
                    raise self._err(
                        f"{name}: letter {c!r} is size {s0} in {g0} blocks in {n0!r} "
                        f"but size {s} in {g} blocks in {t.name!r}"
                    )
                info.setdefault(c, (s, g, t.name))
        return info

    def _parse(self, name: str, eq: str, n: int) -> tuple[list[str], str]:
        try:
            return parse_eq(eq, n)
        except ValueError as e:
            raise self._err(f"{name}: {e}") from None

    # ----------------------------------------------------------- tensors
    def input(self, name: str, shape: Sequence[int], grid: Sequence[int], init: dict[str, Any] | None = None,
              user: bool = False) -> Tensor:  # fmt: skip
        """Declare a graph input (not an op): its tiles are slices of the full array. ``user``: an argument of
        the forward (activations such as ``x``: ``meta["user_inputs"]``); otherwise a weight or a constant,
        resident wherever it is read (:mod:`doppler.memory`)."""
        shape, grid = tuple(int(s) for s in shape), tuple(int(g) for g in grid)
        self._check_grid(name, shape, grid)
        self._check_elements(f"input {name!r}", shape)
        if name in self.inputs:
            raise self._err(f"input {name!r} declared twice")
        t = Tensor(name, shape, grid)
        for blk in t.blocks() if not self.count_only else ():
            t.tiles[blk] = {"input": name, "block": list(blk), "slice": t.tile_slice(blk), "shape": list(t.block_shape)}
        self.inputs[name] = list(shape)
        self.input_init[name] = dict(init or {"init": "normal", "std": 1.0})
        if user:
            self.user_inputs.append(name)
        return t

    def output(self, name: str, t: Tensor) -> None:
        self._check_elements(f"output {name!r}", t.shape)
        if self.count_only:
            return
        tiles = []
        for blk in t.blocks():
            ref = t.tiles[blk]
            if "op" not in ref:
                raise self._err(f"output {name!r} is an input tensor, not computed by any op")
            tiles.append([int(ref["op"]), t.tile_slice(blk)])
        self.outputs[name] = {"shape": list(t.shape), "tiles": tiles}

    # ------------------------------------------------------- logical ops
    def _tiled_reduction(
        self,
        eq: str,
        ts: Sequence[Tensor],
        *,
        name: str,
        kind: OpKind,
        kernel: str,
        agg_kernel: str,
    ) -> Tensor:
        self._claim(name)
        ins, out = self._parse(name, eq, len(ts))
        info = self._letters(name, ins, ts)
        red = [c for c in info if c not in out]  # contracted letters, first-appearance order
        out_shape = [info[c][0] for c in out]
        out_grid = [info[c][1] for c in out]
        red_grid = [info[c][1] for c in red]
        bshape = [s // g for s, g in zip(out_shape, out_grid)]
        self._check_elements(f"a tile of {name!r}", bshape)
        self.untiled_flops += self._flops(
            {"kernel": kernel, "eq": eq, "inputs": [{"shape": list(t.shape)} for t in ts], "shape": out_shape}, name
        )
        n_out, n_red = math.prod(out_grid), math.prod(red_grid)
        if self._count(n_out * n_red + (n_out if n_red > 1 else 0)):
            return Tensor(name, tuple(out_shape), tuple(out_grid))
        combos = list(itertools.product(*(range(g) for g in red_grid)))
        gp = self._new_group(name, kind, out_grid + red_grid)
        ga = self._new_group(f"{name}.agg", OpKind.ADD, out_grid) if len(combos) > 1 else -1
        result: dict[tuple[int, ...], int] = {}
        for oblk in itertools.product(*(range(g) for g in out_grid)):
            at = dict(zip(out, oblk))
            partials = []
            for ci, rblk in enumerate(combos):
                at.update(zip(red, rblk))
                refs = [ts[k].tiles[tuple(at[c] for c in term)] for k, term in enumerate(ins)]
                spec = {"kernel": kernel, "eq": eq, "inputs": [dict(r) for r in refs], "shape": list(bshape)}
                label = f"{name}{fmt_block(oblk)}" + (f"k{ci}" if len(combos) > 1 else "")
                partials.append(self._add_op(label, kind, spec, gp, oblk + rblk))
            if len(partials) == 1:
                result[oblk] = partials[0]
            else:
                spec = {
                    "kernel": agg_kernel,
                    "inputs": [{"op": p, "shape": list(bshape)} for p in partials],
                    "shape": list(bshape),
                }
                result[oblk] = self._add_op(f"{name}{fmt_block(oblk)}agg", OpKind.ADD, spec, ga, oblk)
        return self._tensor_from_ops(name, out_shape, out_grid, result)

    def contract(self, eq: str, *ts: Tensor, name: str, kind: OpKind = OpKind.MATMUL) -> Tensor:
        """Tiled einsum: one partial product per (output block, contraction-block combo),
        plus a ``sum_n`` aggregation per output block when there are several combos."""
        return self._tiled_reduction(eq, ts, name=name, kind=kind, kernel="einsum", agg_kernel="sum_n")

    def reduce(self, eq: str, x: Tensor, *, how: str = "sum", name: str, kind: OpKind = OpKind.REDUCE) -> Tensor:
        """Tiled reduction (``eq`` like ``"hqk->hq"``): per-block partials + aggregation."""
        if how not in ("sum", "max"):
            raise self._err(f"{name}: reduction how={how!r} must be 'sum' or 'max'")
        return self._tiled_reduction(
            eq, [x], name=name, kind=kind, kernel=f"reduce_{how}", agg_kernel=f"{how}_n"
        )

    def fold(self, how: str, *ts: Tensor, name: str, kind: OpKind = OpKind.ADD) -> Tensor:
        """Elementwise sum or max (``how``) of tensors of one shape and grid: one n-ary ``sum_n`` / ``max_n`` op
        per block (the op a tiled reduction's aggregation is), e.g. to combine two parts of a softmax."""
        if how not in ("sum", "max"):
            raise self._err(f"{name}: fold how={how!r} must be 'sum' or 'max'")
        self._claim(name)
        if len(ts) < 2 or any((t.shape, t.grid) != (ts[0].shape, ts[0].grid) for t in ts):
            raise self._err(f"{name}: fold needs two or more tensors of one shape and grid")
        kernel = f"{how}_n"
        full = {"kernel": kernel, "inputs": [{"shape": list(t.shape)} for t in ts], "shape": list(ts[0].shape)}
        self.untiled_flops += self._flops(full, name)
        bshape = list(ts[0].block_shape)
        return self._per_block(name, kind, ts[0].shape, ts[0].grid, lambda blk: {
            "kernel": kernel, "inputs": [dict(t.tiles[blk]) for t in ts], "shape": bshape})  # fmt: skip

    def map(
        self,
        fn: str,
        eq: str,
        *ts: Tensor,
        name: str,
        kind: OpKind = OpKind.ELEMENTWISE,
        params: Mapping[str, Any] | None = None,
        tile_params: Callable[[dict[str, int]], Mapping[str, Any]] | None = None,
    ) -> Tensor:
        """Elementwise ``fn`` with broadcasting by letters (``"ij,i->ij"``): one op per
        output block. ``tile_params(offsets)`` adds per-tile params from the global
        start offset of each output letter."""
        self._claim(name)
        ins, out = self._parse(name, eq, len(ts))
        info = self._letters(name, ins, ts)
        if set(info) != set(out):
            raise self._err(f"{name}: map {eq!r} must keep every letter (no reduction in a map)")
        out_shape = [info[c][0] for c in out]
        out_grid = [info[c][1] for c in out]
        bshape = [s // g for s, g in zip(out_shape, out_grid)]
        base = dict(params or {})
        logical = {"kernel": "map", "fn": fn, "eq": eq, "inputs": [{"shape": list(t.shape)} for t in ts],
                   "shape": out_shape, "params": base}  # fmt: skip
        self.untiled_flops += self._flops(logical, name)

        def spec_of(oblk: tuple[int, ...]) -> dict[str, Any]:
            at = dict(zip(out, oblk))
            refs = [dict(ts[k].tiles[tuple(at[c] for c in term)]) for k, term in enumerate(ins)]
            p = dict(base)
            if tile_params is not None:
                p.update(tile_params({c: int(b * s) for c, b, s in zip(out, oblk, bshape)}))
            spec = {"kernel": "map", "fn": fn, "eq": eq, "inputs": refs, "shape": list(bshape)}
            if p:
                spec["params"] = p
            return spec

        return self._per_block(name, kind, out_shape, out_grid, spec_of)

    def fill(
        self,
        fn: str,
        letters: str,
        shape: Sequence[int],
        grid: Sequence[int],
        *,
        name: str,
        kind: OpKind = OpKind.MASK_FILL,
        params: Mapping[str, Any] | None = None,
        tile_params: Callable[[dict[str, int]], Mapping[str, Any]] | None = None,
    ) -> Tensor:
        """A constant tensor built by ops with no inputs (e.g. a causal mask), one per block."""
        self._claim(name)
        shape, grid = [int(s) for s in shape], [int(g) for g in grid]
        self._check_grid(name, shape, grid)
        if len(letters) != len(shape):
            raise self._err(f"{name}: letters {letters!r} do not match rank {len(shape)}")
        bshape = [s // g for s, g in zip(shape, grid)]
        base = dict(params or {})
        self.untiled_flops += self._flops({"kernel": "fill", "fn": fn, "inputs": [], "shape": shape}, name)

        def spec_of(oblk: tuple[int, ...]) -> dict[str, Any]:
            p = dict(base)
            if tile_params is not None:
                p.update(tile_params({c: int(b * s) for c, b, s in zip(letters, oblk, bshape)}))
            return {"kernel": "fill", "fn": fn, "inputs": [], "shape": list(bshape), "params": p}

        return self._per_block(name, kind, shape, grid, spec_of)

    def select(
        self, x: Tensor, ranges: Sequence[tuple[int, int] | None], *, name: str, kind: OpKind = OpKind.SELECT
    ) -> Tensor:
        """Slice ``x``: per axis ``None`` keeps it whole (and its blocks), ``(lo, hi)``
        selects a range that must lie inside one block (that axis ends up unsplit)."""
        self._claim(name)
        if len(ranges) != len(x.shape):
            raise self._err(f"{name}: {len(ranges)} ranges for a rank-{len(x.shape)} tensor {x.name!r}")
        bs = x.block_shape
        out_shape, out_grid, fixed = [], [], []
        for ax, r in enumerate(ranges):
            if r is None:
                out_shape.append(x.shape[ax])
                out_grid.append(x.grid[ax])
                fixed.append(None)
                continue
            lo, hi = int(r[0]), int(r[1])
            b = lo // bs[ax] if 0 <= lo < x.shape[ax] else -1
            if b < 0 or not lo < hi <= (b + 1) * bs[ax]:
                raise self._err(f"{name}: range {lo}:{hi} on axis {ax} of {x.name!r} must lie inside one block")
            out_shape.append(hi - lo)
            out_grid.append(1)
            fixed.append((b, lo - b * bs[ax], hi - b * bs[ax]))
        bshape = [s // g for s, g in zip(out_shape, out_grid)]

        def spec_of(oblk: tuple[int, ...]) -> dict[str, Any]:
            iblk = tuple(o if f is None else f[0] for o, f in zip(oblk, fixed))
            sl = [[0, bs[ax]] if f is None else [f[1], f[2]] for ax, f in enumerate(fixed)]
            return {"kernel": "select", "inputs": [dict(x.tiles[iblk])], "shape": list(bshape), "params": {"slice": sl}}

        return self._per_block(name, kind, out_shape, out_grid, spec_of)

    def attention(self, q: Tensor, kv: Sequence[tuple[Tensor, Tensor]], *, name: str, scale: float, causal: bool,
                  kind: OpKind = OpKind.MATMUL) -> Tensor:  # fmt: skip
        """Fused grouped-query attention (the ``attention`` kernel of :mod:`doppler.ir.kernels`): one op per block of
        ``q`` (batch, queries, kv_heads, heads_per_kv, head_dim), split along batch, queries and kv heads only,
        reading its query tile and the key/value tiles of its batch and kv-head block from every ``(k, v)`` pair
        of ``kv`` (each (batch, positions, kv_heads, head_dim), their positions joined in order). ``causal``
        (one pair whose positions are the queries'): a query block reads the key blocks at or before it only,
        as causal FlashAttention skips the blocks above the diagonal. Its kind is a matrix kind: the kernel
        runs its two products on tensor cores and keeps no score tensor."""
        self._claim(name)
        if len(q.shape) != 5 or q.grid[3:] != (1, 1):
            raise self._err(f"{name}: the query {q.name!r} must be (batch, seq, kv_heads, heads_per_kv, head_dim) "
                            "split along batch, seq and kv_heads only")  # fmt: skip
        b, n_q, j, r, d = q.shape
        if not kv or (causal and len(kv) != 1):
            raise self._err(f"{name}: attention needs one (key, value) pair, or several without causal masking")
        for k, v in kv:
            if (k.shape != v.shape or k.grid != v.grid or len(k.shape) != 4 or (k.shape[0], k.shape[2], k.shape[3])
                    != (b, j, d) or (k.grid[0], k.grid[2], k.grid[3]) != (q.grid[0], q.grid[2], 1)):  # fmt: skip
                raise self._err(f"{name}: key {k.name!r} and value {v.name!r} must be (batch, positions, kv_heads, "
                                f"head_dim) split like the query {q.name!r} along batch and kv_heads")  # fmt: skip
        if causal and kv[0][0].shape[1] != n_q or causal and kv[0][0].grid[1] != q.grid[1]:
            raise self._err(f"{name}: a causal attention's keys must be the queries' positions, split alike")
        params = {"kv_tiles": len(kv), "causal": bool(causal), "q_offset": 0, "scale": float(scale)}
        self.untiled_flops += self._flops({"kernel": "attention", "inputs": [{"shape": list(t.shape)} for t in
                                           [q] + [k for k, _ in kv] + [v for _, v in kv]], "shape": list(q.shape),
                                           "params": params}, name)  # fmt: skip
        bs_q = q.block_shape[1]

        def spec_of(blk: tuple[int, ...]) -> dict[str, Any]:
            ib, iq, ih = blk[0], blk[1], blk[2]
            read = [(k, v, kb) for k, v in kv for kb in range(k.grid[1]) if not causal or kb <= iq]
            ks = [dict(k.tiles[(ib, kb, ih, 0)]) for k, _, kb in read]
            vs = [dict(v.tiles[(ib, kb, ih, 0)]) for _, v, kb in read]
            return {"kernel": "attention", "inputs": [dict(q.tiles[blk])] + ks + vs, "shape": list(q.block_shape),
                    "params": {**params, "kv_tiles": len(ks), "q_offset": iq * bs_q if causal else 0}}  # fmt: skip

        return self._per_block(name, kind, q.shape, q.grid, spec_of)

    # ------------------------------------------------------------ finish
    def blockwise(self, name: str, kind: OpKind, kernel: str, shape: Sequence[int], grid: Sequence[int],
                  refs_of: Callable[[tuple[int, ...]], list[dict]], params: Callable | None = None) -> Tensor:  # fmt: skip
        """One op per output block, reading the operand tiles ``refs_of(block)`` (an ``embedding`` lookup, say:
        zero FLOPs, :mod:`doppler.ir.kernels`)."""
        self._claim(name)
        bshape = Tensor(name, tuple(shape), tuple(grid)).block_shape

        def spec_of(blk: tuple[int, ...]) -> dict[str, Any]:
            spec = {"kernel": kernel, "inputs": refs_of(blk), "shape": list(bshape)}
            if params is not None:
                spec["params"] = params(blk)
            return spec

        return self._per_block(name, kind, shape, grid, spec_of)

    def finish(self, name: str, params: Mapping[str, Any]) -> DataflowGraph:
        if self.count_only:
            raise RuntimeError("a counting TileBuilder makes no graph")
        block = np.full((len(self.blocks), MAX_BLOCK_DIMS), -1, np.int32)
        for i, b in enumerate(self.blocks):
            block[i, : len(b)] = b
        meta = {
            "workload": self.workload,
            "params": dict(params),
            "dtype": self.dtype,
            "inputs": dict(self.inputs),
            "user_inputs": list(self.user_inputs),
            "input_init": dict(self.input_init),
            "outputs": dict(self.outputs),
            "untiled_flops": float(self.untiled_flops),
        }
        structure = derive_structure(self.groups)
        if structure is not None:
            meta["structure"] = structure.to_json()
        return DataflowGraph.from_arrays(
            self.flops,
            self.out_bytes,
            np.asarray(self.src, np.int64),
            np.asarray(self.dst, np.int64),
            kind=self.kinds,
            tiles=TileLayout(self.group_of, block, self.groups),
            names=list(self.names),
            specs=self.specs,
            name=name,
            meta=meta,
        )


# ========================================================== model structure
_LAYER = re.compile(r"^(.*?\.\d+)(?:\.|$)")  # a module path up to its first numeric component

#: a decoder layer's projections by the leaf of their module path (the names of Hugging Face's LLaMA, Mistral and
#: Qwen models, which ``llama_model`` uses too): column-parallel in Megatron-LM's split (each device computes
#: whole output columns) and row-parallel (each a partial sum over its input rows), by the dimension they split
COLUMN_PARALLEL = {"q_proj": "head", "k_proj": "head", "v_proj": "head", "gate_proj": "hidden", "up_proj": "hidden"}
ROW_PARALLEL = {"o_proj": "head", "down_proj": "hidden"}
_SPLITS = ("head", "hidden", "vocab")


def layer_key(module: str) -> str:
    """The unit a module path belongs to: the path up to its first numeric component (``model.layers.3`` for
    ``model.layers.3.mlp.down_proj``), else the path itself (``lm_head``)."""
    m = _LAYER.match(module)
    return m[1] if m else module


@dataclass(frozen=True)
class ModelStructure:
    """Which logical ops (group ids, :attr:`~doppler.ir.graph.DataflowGraph.groups`) make up a transformer: the
    embedding, each decoder layer in running order, the final norm and the vocabulary head; and, among them, the
    partial products of the projections that Megatron-LM splits: ``column_parallel[split]`` (query/key/value
    and gate/up by ``head`` / ``hidden`` block, the vocabulary head by ``vocab`` block) and
    ``row_parallel[split]`` (output and down projections). ``graph.meta["structure"]`` holds it as JSON."""

    embedding: tuple[int, ...]
    layers: tuple[tuple[int, ...], ...]
    final_norm: tuple[int, ...]
    lm_head: tuple[int, ...]
    column_parallel: dict[str, tuple[int, ...]]
    row_parallel: dict[str, tuple[int, ...]]

    def to_json(self) -> dict[str, Any]:
        return {"embedding": list(self.embedding), "layers": [list(g) for g in self.layers],
                "final_norm": list(self.final_norm), "lm_head": list(self.lm_head),
                "column_parallel": {k: list(v) for k, v in self.column_parallel.items()},
                "row_parallel": {k: list(v) for k, v in self.row_parallel.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, doc: Any, num_groups: int) -> "ModelStructure":
        """The structure a graph file records; GraphError naming the key where it is malformed."""

        def ids(value: Any, key: str) -> tuple[int, ...]:
            if not isinstance(value, list) or not all(type(i) is int and 0 <= i < num_groups for i in value):
                raise GraphError(f"meta.structure.{key}: must be a list of group ids (0 to {num_groups - 1})")
            return tuple(value)

        def splits(value: Any, key: str) -> dict[str, tuple[int, ...]]:
            if not isinstance(value, dict) or not set(value) <= set(_SPLITS):
                raise GraphError(f"meta.structure.{key}: must map {', '.join(_SPLITS)} to lists of group ids")
            return {k: ids(v, f"{key}.{k}") for k, v in value.items()}

        if not isinstance(doc, dict):
            raise GraphError("meta.structure: must be an object")
        layers = doc.get("layers")
        if not isinstance(layers, list):
            raise GraphError("meta.structure.layers: must be a list of lists of group ids")
        return cls(ids(doc.get("embedding", []), "embedding"), tuple(ids(g, f"layers[{i}]") for i, g in enumerate(layers)),
                   ids(doc.get("final_norm", []), "final_norm"), ids(doc.get("lm_head", []), "lm_head"),
                   splits(doc.get("column_parallel", {}), "column_parallel"),
                   splits(doc.get("row_parallel", {}), "row_parallel"))  # fmt: skip


def derive_structure(groups: Sequence[Group]) -> ModelStructure | None:
    """The :class:`ModelStructure` of logical ops that record their modules: decoder layers are the units
    ``prefix.<number>`` (:func:`layer_key`) of the prefix that numbers the most, in order of their first group;
    groups before the first layer are the embedding; after the last, the unit of the last matrix product is the
    vocabulary head (column-parallel by ``vocab``) and the rest the final norm. A layer's projections are the
    matrix products named in :data:`COLUMN_PARALLEL` and :data:`ROW_PARALLEL`. None without decoder layers."""
    keys = [layer_key(g.module) if g.module else "" for g in groups]
    numbered: dict[str, list[str]] = {}
    for k in dict.fromkeys(keys):
        m = re.fullmatch(r"(.*)\.\d+", k)
        if m:
            numbered.setdefault(m[1], []).append(k)
    if not numbered:
        return None
    layer_keys = max(numbered.values(), key=len)
    number = {k: i for i, k in enumerate(layer_keys)}
    in_layer = [i for i, k in enumerate(keys) if k in number]
    first, last = in_layer[0], in_layer[-1]
    layers: list[list[int]] = [[] for _ in layer_keys]
    for i in in_layer:
        layers[number[keys[i]]].append(i)
    matmul = OpKind.MATMUL.label
    tail = [i for i in range(last + 1, len(groups)) if keys[i]]
    last_matmul = max((i for i in tail if groups[i].kind == matmul), default=None)
    head_key = keys[last_matmul] if last_matmul is not None else None
    column: dict[str, list[int]] = {}
    row: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        leaf = g.module.rsplit(".", 1)[-1]
        if g.kind != matmul:
            continue
        if keys[i] == head_key:
            column.setdefault("vocab", []).append(i)
        elif keys[i] in number and leaf in COLUMN_PARALLEL:
            column.setdefault(COLUMN_PARALLEL[leaf], []).append(i)
        elif keys[i] in number and leaf in ROW_PARALLEL:
            row.setdefault(ROW_PARALLEL[leaf], []).append(i)
    return ModelStructure(
        embedding=tuple(i for i in range(first) if keys[i] and keys[i] not in number),
        layers=tuple(tuple(g) for g in layers),
        final_norm=tuple(i for i in tail if keys[i] != head_key),
        lm_head=tuple(i for i in tail if keys[i] == head_key),
        column_parallel={k: tuple(v) for k, v in column.items()},
        row_parallel={k: tuple(v) for k, v in row.items()},
    )


def model_structure(graph: DataflowGraph) -> ModelStructure | None:
    """The graph's :class:`ModelStructure`: the one its metadata records (``meta["structure"]``, checked:
    GraphError naming the key), else the one its groups' modules give (:func:`derive_structure`; a graph saved
    before structures were recorded), else None (a graph of no transformer: ``random``, ``chainmm``)."""
    doc = graph.meta.get("structure") if isinstance(graph.meta, dict) else None
    if doc is not None:
        return ModelStructure.from_json(doc, len(graph.groups))
    return derive_structure(graph.groups)


# ============================================================ shared pieces
def tiled_softmax(b: TileBuilder, x: Tensor, letters: str, axis: str, *, scale: float, name: str) -> Tensor:
    """softmax(scale * x) along letter ``axis``: max, exp(scale*(x-max)), sum, div; each tiled."""
    red = letters.replace(axis, "")
    m = b.reduce(f"{letters}->{red}", x, how="max", name=f"{name}.max", kind=OpKind.SOFTMAX)
    e = b.map("exp_sub", f"{letters},{red}->{letters}", x, m, name=f"{name}.exp", kind=OpKind.SOFTMAX,
              params={"scale": float(scale)})  # fmt: skip
    z = b.reduce(f"{letters}->{red}", e, how="sum", name=f"{name}.sum", kind=OpKind.SOFTMAX)
    return b.map("div", f"{letters},{red}->{letters}", e, z, name=f"{name}.div", kind=OpKind.SOFTMAX)


def tiled_rmsnorm(b: TileBuilder, x: Tensor, w: Tensor, *, eps: float, name: str, rows: str = "bs") -> Tensor:
    """x / sqrt(mean(x^2) + eps) * w over the last axis of a (``rows``..., features) tensor."""
    xd = f"{rows}d"
    ss = b.contract(f"{xd},{xd}->{rows}", x, x, name=f"{name}.sumsq", kind=OpKind.NORM)
    return b.map("rms_scale", f"{xd},{rows},d->{xd}", x, ss, w, name=f"{name}.scale", kind=OpKind.NORM,
                 params={"n": int(x.shape[-1]), "eps": float(eps)})  # fmt: skip
