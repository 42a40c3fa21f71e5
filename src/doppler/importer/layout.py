"""The layout of imported tensors: how each is cut into tiles, and how a zero-FLOP op reads them.

* **Tiling.** ``blocks`` maps a dimension *size* to a block count (:func:`parse_blocks` reads ``--blocks``;
  :func:`auto_blocks` picks one for a number of devices): every axis of that size on an input is split
  into that many blocks, and grids propagate through the ops. Where two operands disagree, the finer
  grid wins when it divides (free), otherwise a tile is put together by an ``assemble`` op (:func:`unify`).
* **Layout steps.** Views, reshapes, permutes, transposes, slices and squeezes emit no op: they become
  layout steps (``xform``: :func:`step`) on the operand references of their consumers (:func:`view`,
  :func:`permute`, :func:`slice_axis`). A step is ``["view", block shape]``, ``["perm", axes]`` or
  ``["slice", [[lo, hi], ...]]`` on one tile.
* **Assembling.** ``cat`` and re-tiling (:func:`retile`) emit ``assemble`` ops, and only where a tile is
  not a slice of one existing tile (:meth:`Builder.assemble`).

Einsum subscripts name axes by :data:`LETTERS`, the first axis ``a``.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any, Sequence

from doppler.ir.graph import OpKind
from doppler.importer.errors import GraphImportError
from doppler.workloads.tiling import Tensor, TileBuilder

#: the einsum subscripts of a tensor's axes, in order
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def parse_blocks(items: Sequence[str]) -> dict[int, int]:
    """``["4096=4", "11008=4"]`` -> ``{4096: 4, 11008: 4}`` (dimension size -> block count)."""
    out: dict[int, int] = {}
    for item in items:
        m = re.fullmatch(r"\s*(\d+)\s*=\s*(\d+)\s*", item)
        if not m or int(m[1]) < 1 or int(m[2]) < 1:
            raise GraphImportError(f"--blocks {item!r}: expected SIZE=K with positive integers, e.g. 4096=4")
        size, k = int(m[1]), int(m[2])
        if size % k:
            raise GraphImportError(f"--blocks {item}: {k} blocks do not divide a dimension of size {size}")
        out[size] = k
    return out


def auto_blocks(ep: Any, devices: int) -> dict[int, int]:
    """A tiling for ``devices`` devices: every dimension of a matrix parameter that splits into
    ``devices`` blocks of at least 16 is split so (activations' batch and sequence axes are not)."""
    out: dict[int, int] = {}
    params = [s.target for s in ep.graph_signature.input_specs if s.kind.name == "PARAMETER"]
    for value in (ep.state_dict[p] for p in params):
        if getattr(value, "ndim", 0) == 2:
            for s in value.shape:
                if devices > 1 and s % devices == 0 and s // devices >= 16:
                    out[int(s)] = devices
    return out


class Builder(TileBuilder):
    """A :class:`TileBuilder` with the tile op imports need beyond einsum, map, fill and blockwise."""

    def fresh(self, base: str) -> str:
        """``base``, or ``base_2``, ``base_3``, ... : the first that names no op and no input yet."""
        name, k = base, 1
        while name in self._logical_names or name in self.inputs:
            k += 1
            name = f"{base}_{k}"
        return name

    def assemble(self, name: str, shape: Sequence[int], grid: Sequence[int],
                 sources: Sequence[tuple[Tensor, Sequence[int]]], kind: OpKind = OpKind.FORMATION) -> Tensor:  # fmt: skip
        """A tensor of ``shape``/``grid`` made of ``sources`` placed at offsets. A block that is a
        slice of one source tile is that tile with a slice step (no op); others are ``assemble`` ops."""
        out = Tensor(name, tuple(int(s) for s in shape), tuple(int(g) for g in grid))
        bs = out.block_shape
        pieces: dict[tuple[int, ...], list[tuple[dict, list[list[int]]]]] = {}
        for blk in out.blocks():
            lo = [b * s for b, s in zip(blk, bs)]
            hi = [l + s for l, s in zip(lo, bs)]
            got = []
            for src, off in sources:
                sbs = src.block_shape
                ranges = []
                for ax in range(len(shape)):
                    a, b = max(lo[ax], off[ax]), min(hi[ax], off[ax] + src.shape[ax])
                    if a >= b:
                        break
                    ranges.append(range((a - off[ax]) // sbs[ax], (b - 1 - off[ax]) // sbs[ax] + 1))
                else:
                    for sblk in itertools.product(*ranges):
                        t_lo = [off[ax] + sb * sbs[ax] for ax, sb in enumerate(sblk)]
                        a = [max(lo[ax], t_lo[ax]) for ax in range(len(shape))]
                        b = [min(hi[ax], t_lo[ax] + sbs[ax]) for ax in range(len(shape))]
                        rel = [[a[ax] - t_lo[ax], b[ax] - t_lo[ax]] for ax in range(len(shape))]
                        at = [[a[ax] - lo[ax], b[ax] - lo[ax]] for ax in range(len(shape))]
                        got.append((step(src.tiles[sblk], "slice", rel, sbs), at))
            pieces[blk] = got
        if all(len(p) == 1 and [h - l for l, h in p[0][1]] == list(bs) for p in pieces.values()):
            out.tiles = {blk: p[0][0] for blk, p in pieces.items()}  # every block is one (sliced) tile
            return out
        return self.blockwise(name, kind, "assemble", shape, grid, lambda blk: [r for r, _ in pieces[blk]],
                              lambda blk: {"at": [a for _, a in pieces[blk]]})  # fmt: skip


def step(ref: dict, how: str, arg: Any, shape: Sequence[int]) -> dict:
    """``ref`` with one more layout step (a whole-tile slice is no step)."""
    if how == "slice" and all(lo == 0 and hi == s for (lo, hi), s in zip(arg, shape)):
        return ref
    out = dict(ref)
    out["xform"] = [*ref.get("xform", []), [how, [list(a) if isinstance(a, (list, tuple)) else int(a) for a in arg]]]
    return out


def retile(b: Builder, t: Tensor, grid: Sequence[int], name: str) -> Tensor:
    grid = tuple(int(g) for g in grid)
    if grid == t.grid:
        return t
    return b.assemble(name, t.shape, grid, [(t, [0] * len(t.shape))])


def permute(t: Tensor, perm: Sequence[int]) -> Tensor:
    perm = [int(p) % max(len(t.shape), 1) for p in perm]
    if perm == list(range(len(perm))):
        return t
    out = Tensor(t.name, tuple(t.shape[p] for p in perm), tuple(t.grid[p] for p in perm))
    for blk, ref in t.tiles.items():
        out.tiles[tuple(blk[p] for p in perm)] = step(ref, "perm", perm, t.block_shape)
    return out


def reshape_groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Axes of ``old`` and ``new`` grouped so that each group has the same number of elements."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj, po, pn = [], [], 1, 1
        while True:
            if po <= pn and i < len(old) and (po < pn or not gi or old[i] == 1):
                po *= old[i]
                gi.append(i)
                i += 1
            elif j < len(new) and (pn < po or not gj or new[j] == 1):
                pn *= new[j]
                gj.append(j)
                j += 1
            else:
                break
            if po == pn and (i == len(old) or old[i] != 1) and (j == len(new) or new[j] != 1):
                break
        groups.append((gi, gj))
    return groups


def view(b: Builder, t: Tensor, shape: Sequence[int], name: str) -> Tensor:
    """``t`` reshaped (row-major) to ``shape``; the tiles get a view step. A group of merged or
    split axes keeps the grid of its leading axis; a tiled inner axis is re-tiled first."""
    shape = tuple(int(s) for s in shape)
    if shape == t.shape:
        return t
    if math.prod(shape) != math.prod(t.shape):
        raise GraphImportError(f"{name}: cannot view {list(t.shape)} as {list(shape)}")
    leads = [(gi, next((a for a in gi if t.shape[a] > 1), None), next((a for a in gj if shape[a] > 1), None))
             for gi, gj in reshape_groups(t.shape, shape)]  # fmt: skip
    want = list(t.grid)
    new_grid = [1] * len(shape)
    for gi, lead_o, lead_n in leads:
        for a in gi:
            if a != lead_o:
                want[a] = 1
        if lead_o is not None:
            g = math.gcd(want[lead_o], shape[lead_n]) if lead_n is not None else 1
            want[lead_o] = g
            if lead_n is not None:
                new_grid[lead_n] = g
    t = retile(b, t, want, f"{name}.retile")
    out = Tensor(t.name, shape, tuple(new_grid))
    nbs = out.block_shape
    for blk, ref in t.tiles.items():
        nblk = [0] * len(shape)
        for _, lead_o, lead_n in leads:
            if lead_o is not None and lead_n is not None:
                nblk[lead_n] = blk[lead_o]
        out.tiles[tuple(nblk)] = step(ref, "view", nbs, t.block_shape)
    return out


def slice_axis(b: Builder, t: Tensor, dim: int, start: int, end: int, name: str) -> Tensor:
    """``t`` restricted to ``start:end`` on axis ``dim`` (no op unless a block must be re-tiled)."""
    n = t.shape[dim]
    start, end = max(0, min(start, n)), max(0, min(end, n))
    if start == 0 and end == n:
        return t
    bs = t.block_shape[dim]
    if start // bs != (end - 1) // bs and (start % bs or end % bs):
        grid = list(t.grid)
        grid[dim] = 1
        t, bs = retile(b, t, grid, f"{name}.retile"), n
    shape = list(t.shape)
    shape[dim] = end - start
    grid = list(t.grid)
    aligned = start % bs == 0 and end % bs == 0
    grid[dim] = (end - start) // bs if aligned else 1
    out = Tensor(t.name, tuple(shape), tuple(grid))
    first = start // bs
    for blk, ref in t.tiles.items():
        k = blk[dim] - first
        if not 0 <= k < grid[dim]:
            continue
        nblk = list(blk)
        nblk[dim] = k
        if aligned:
            out.tiles[tuple(nblk)] = ref
        else:
            rel = [[0, s] for s in t.block_shape]
            rel[dim] = [start - blk[dim] * bs, end - blk[dim] * bs]
            out.tiles[tuple(nblk)] = step(ref, "slice", rel, t.block_shape)
    return out


def unify(b: Builder, operands: list[tuple[Tensor, str]], name: str, whole: str = "") -> list[Tensor]:
    """Operands (with einsum subscripts) re-tiled so that each letter has one grid: the finest
    grid that every operand's grid of it divides and that divides the letter's size (letters in
    ``whole``: one block)."""
    target: dict[str, int] = {}
    size: dict[str, int] = {}
    for t, term in operands:
        for c, s, g in zip(term, t.shape, t.grid):
            size[c] = s
            target[c] = math.lcm(target.get(c, 1), g)
    for c in target:
        if size[c] % target[c] or c in whole:
            target[c] = 1
    # a finer grid is free only where it refines: otherwise the assemble op is emitted
    return [retile(b, t, [target[c] for c in term], f"{name}.in{k}") for k, (t, term) in enumerate(operands)]


