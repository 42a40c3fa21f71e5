"""Import a PyTorch model as a tile-level dataflow graph (``doppler graph import``).

The model is exported with :func:`torch.export.export` (non-strict), and every ATen op of the
exported program is lowered onto the same :class:`~doppler.tiling.TileBuilder` the built-in
workloads use, so each tensor op becomes a group of tile ops with real shapes, FLOPs, bytes
and a kernel spec the engine runs.

* **Inputs.** Parameters, the user's inputs and constants become graph inputs (pre-loaded on
  every device, as in the built-in workloads). Buffers are *known values*: everything computed
  from buffers and shapes alone (rotary tables, causal masks, position ids) is evaluated at
  import time, and what the model reads of it becomes a recorded constant input.
* **The meta device.** A model built there has no values: no weight is read, what is computed from
  its buffers is evaluated on the meta device (shapes only) and read as an input of known shape with
  no value, what is computed from shapes alone (a causal mask) is still evaluated, and the graph is
  *cost-only* (``meta["cost_only"]``): the same ops, costs and modules, nothing to execute.
* **Weights by name.** ``meta["weights"]`` maps every parameter input to its ``state_dict`` key, shape,
  element type, the keys tied to it and the key a Hugging Face checkpoint saves it under where that differs; the op specs' operand references say which slice of it each tile
  reads (``{"input", "slice"}``, in the parameter's own layout, with a transpose as an ``xform`` step), so
  ``doppler execute --weights`` loads each tile from a checkpoint. A model built under
  :func:`parameters_on_meta` has no weights but real buffers: what it computes from them is recorded.
* **Modules.** Every op records the module it runs in (``nn_module_stack``), named as
  ``named_modules()`` names it. A Hugging Face forward (one that takes ``use_cache``) is exported
  without its cache, returning its logits only.
* **Grouped-query attention** (``repeat_kv``, or SDPA's ``enable_gqa``) reads each key/value tile
  once per group of query heads: the repeat is never copied for attention.
* **Tiling.** ``blocks`` maps a dimension *size* to a block count: every axis of that size on
  an input is split into that many blocks, and grids propagate through the ops. Where two
  operands disagree, the finer grid wins when it divides (free), otherwise a tile is put
  together by an ``assemble`` op.
* **Zero-FLOP ops** (views, reshapes, permutes, transposes, slices, squeezes) emit no op: they
  become layout steps (``xform``) on the operand references of their consumers. ``cat`` and
  re-tiling emit ``assemble`` ops, and only where a tile is not a slice of one existing tile.

Nothing from a data file is executed: a factory is imported only when named by the caller, and
a ``.pt2`` file is read by :mod:`doppler.pt2_archive` (JSON and raw tensor bytes; no unpickling, no
``torch.export.load``). An op with no lowering fails the
whole import with one message that lists every such op and how often it occurs.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import itertools
import logging
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from doppler.graph import DataflowGraph, OpKind
from doppler.tiling import Tensor, TileBuilder, WorkloadError, tiled_softmax

__all__ = ["GraphImportError", "WRAPPED", "auto_blocks", "export_model", "import_model", "load_factory", "load_pt2",
           "checkpoint_keys", "lower_program", "model_inputs", "module_path", "parameter_dtype", "parameters_on_meta",
           "parse_blocks", "parse_input_shapes", "without_cache"]

LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: the largest constant (in elements) recorded inside a graph file
MAX_RECORDED_ELEMENTS = 1 << 20
#: the elements of a weight whose mean and spread are taken in float64 at a time (a larger weight is taken a chunk at
#: a time, never copied whole in float64: a ``.pt2`` may hold 1 GiB of weights)
STATS_CHUNK = 1 << 22
#: the largest tensor (in elements) evaluated at import time (a causal mask of 16k x 16k positions)
MAX_FOLDED_ELEMENTS = 1 << 28
#: ``meta["cost_only"]`` of a graph whose model has no values
NO_VALUES = "built on the meta device: no weights or constants"
#: ``meta["cost_only"]`` of a graph whose model has no weights but whose constants are recorded: ``doppler execute
#: --weights`` runs it
NO_WEIGHTS = "built on the meta device: no weights (execute --weights loads them from a checkpoint)"


class GraphImportError(ValueError):
    """A model that cannot be imported; the message says what and where (exit code 2)."""


#: the optional dependencies a model may need, and the extra of ``pip install 'doppler[EXTRA]'`` that installs each
OPTIONAL_EXTRAS = {"transformers": "hf"}


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def _missing_extra(source: str, e: BaseException) -> GraphImportError | None:
    """The one-line error of a factory that needs an optional dependency not installed (``e``), naming the
    extra that installs it; None for any other error."""
    top = (getattr(e, "name", None) or "").split(".")[0] if isinstance(e, ModuleNotFoundError) else ""
    if top not in OPTIONAL_EXTRAS:
        return None
    return GraphImportError(f"{source}: the model needs {top}, which is not installed: pip install "
                            f"'doppler[{OPTIONAL_EXTRAS[top]}]'")  # fmt: skip


# ============================================================================ sources
def load_factory(source: str) -> tuple[Any, tuple]:
    """Call the factory ``package.module:function`` or ``path/to/file.py:function``.

    Returns ``(module, example_inputs)``. Only the module named here is imported."""
    mod_name, sep, fn_name = source.rpartition(":")
    if not sep or not mod_name or not fn_name.isidentifier():
        raise GraphImportError(f"{source}: expected 'package.module:function', 'file.py:function' or a .pt2 file")
    if mod_name.endswith(".py") and not Path(mod_name).is_file():
        raise GraphImportError(f"{source}: no such file {Path(mod_name)}")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            spec = importlib.util.spec_from_file_location(f"_doppler_factory_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[spec.name] = module  # type: ignore[union-attr]
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(mod_name)
    except SystemExit as e:  # the module calls sys.exit (a script's main, say) when imported
        raise GraphImportError(f"{source}: importing {mod_name} called sys.exit({e.code!r})") from None
    except Exception as e:  # the factory's module itself is broken, or needs an optional dependency
        raise _missing_extra(source, e) or GraphImportError(f"{source}: cannot import {mod_name} ({_one_line(e)})") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise GraphImportError(f"{source}: {mod_name} has no function {fn_name!r}")
    try:
        out = fn()
    except SystemExit as e:
        raise GraphImportError(f"{source}: the factory called sys.exit({e.code!r})") from None
    except Exception as e:
        raise _missing_extra(source, e) or GraphImportError(f"{source}: the factory raised {_one_line(e)}") from None
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], (tuple, list))):
        got = type(out).__name__ if not isinstance(out, tuple) else f"a tuple of {len(out)}" + (
            f" whose second item has type {type(out[1]).__name__}" if len(out) == 2 else "")  # fmt: skip
        raise GraphImportError(f"{source}: the factory must return (module, example_inputs), a tuple of a module and "
                               f"a tuple of inputs; got {got}")  # fmt: skip
    return out[0], tuple(out[1])


def _reshaped_inputs(module: Any, example: tuple, shapes: Mapping[str, Sequence[int]]) -> tuple:
    """``example`` with the inputs named in ``shapes`` (forward's argument names) redrawn at new shapes, on
    the device of the input they replace (an input on the meta device stays there: it has no values)."""
    import torch

    if not shapes:
        return example
    names = [p for p in inspect.signature(module.forward).parameters][: len(example)]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise GraphImportError(f"--input-shape {unknown[0]}: the module's inputs are {', '.join(names)}")
    out = list(example)
    for i, name in enumerate(names):
        if name in shapes:
            old, shape = example[i], tuple(shapes[name])
            if old.is_meta:
                out[i] = torch.empty(shape, dtype=old.dtype, device="meta")
            elif old.dtype.is_floating_point:
                out[i] = torch.randn(*shape, dtype=old.dtype)
            else:
                out[i] = torch.randint(0, int(old.max()) + 1, shape, dtype=old.dtype)
    return tuple(out)


#: the attribute under which :func:`export_model` wraps a forward that returns a cache; stripped from the
#: parameter names and module paths of the graph, which are those of the user's module
WRAPPED = "_doppler_wrapped"


def without_cache(module: Any) -> Any:
    """``module`` itself, or, when its forward takes ``use_cache`` (a Hugging Face model), a wrapper whose
    forward has the same signature, calls it with ``use_cache=False`` and returns only its logits (or, for a
    model without logits, its first output): the key/value cache is not part of the computation to place."""
    import torch

    sig = inspect.signature(module.forward)
    if "use_cache" not in sig.parameters:
        return module

    class LogitsOnly(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            setattr(self, WRAPPED, inner)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            out = getattr(self, WRAPPED)(*args, **{**kwargs, "use_cache": False})
            logits = getattr(out, "logits", None)
            if logits is not None:
                return logits
            return out[0] if isinstance(out, (tuple, list)) or hasattr(out, "to_tuple") else out

    LogitsOnly.forward.__signature__ = sig.replace(  # type: ignore[attr-defined]
        parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD), *sig.parameters.values()])
    return LogitsOnly(module)


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build modules inside this block with every parameter on the meta device and every buffer where it
    would be without it (accelerate's ``init_empty_weights(include_buffers=False)``).

    No weight is allocated or initialised, while what a model computes from its buffers at import (a rotary
    embedding's tables) keeps its values. A graph imported from such a model is cost-only (no weights)
    but records those constants, so ``doppler execute --weights`` can run it with a checkpoint's weights."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        register(module, name, param)
        p = module._parameters.get(name)
        if p is not None and not p.is_meta:
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def export_model(module: Any, example: tuple, input_shapes: Mapping[str, Sequence[int]] | None = None):
    """``torch.export`` of ``module`` at ``example`` (non-strict; dropout and friends in eval mode).

    A forward that takes ``use_cache`` (a Hugging Face model) is exported with ``use_cache=False`` and
    returning only its logits (:func:`without_cache`). Returns ``(exported program, example)``."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise GraphImportError(f"the factory returned a {type(module).__name__}, not a torch.nn.Module")
    module.eval()
    example = _reshaped_inputs(module, example, input_shapes or {})
    logging.disable(logging.CRITICAL)  # torch logs a failed trace's whole traceback; we report one line
    try:
        with torch.no_grad():
            return torch.export.export(without_cache(module), example, strict=False), example
    except Exception as e:
        raise GraphImportError(f"torch.export failed: {_one_line(e)}") from None
    finally:
        logging.disable(logging.NOTSET)


def load_pt2(path: Path):
    """The program of a ``.pt2`` file, read by :func:`doppler.pt2_archive.read_pt2`: its JSON program and raw
    tensor bytes only; ``torch.export.load`` (which unpickles and evaluates what the file says) is never called."""
    from doppler.pt2_archive import Pt2Error, read_pt2

    if not path.is_file():
        raise GraphImportError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    try:
        return read_pt2(path)
    except Pt2Error as e:
        raise GraphImportError(f"{path}: {e}") from None
    except OSError as e:
        raise GraphImportError(f"{path}: cannot read ({e.strerror or e})") from None


def parse_input_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``["x=2x64x256"]`` -> ``{"x": [2, 64, 256]}``."""
    out: dict[str, list[int]] = {}
    for item in items:
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+(?:\s*[x,]\s*\d+)*)\s*", item)
        if not m:
            raise GraphImportError(f"--input-shape {item!r}: expected NAME=DIMS, e.g. x=2x64x256")
        dims = [int(d) for d in re.split(r"\s*[x,]\s*", m[2])]
        if min(dims) < 1:
            raise GraphImportError(f"--input-shape {item!r}: dimensions must be >= 1")
        out[m[1]] = dims
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


def mean_std(value: Any) -> tuple[float, float]:
    """The mean and the sample standard deviation (0 for one element) of a tensor's elements, in float64: of the
    whole tensor at once up to :data:`STATS_CHUNK` elements, else a chunk at a time in two passes, so that no
    float64 copy of a large weight is made."""
    v = value.detach().reshape(-1)
    n = v.numel()
    if n <= STATS_CHUNK:
        d = v.double()
        return float(d.mean()), float(d.std()) if n > 1 else 0.0
    chunks = [(i, min(i + STATS_CHUNK, n)) for i in range(0, n, STATS_CHUNK)]
    mean = sum(float(v[a:b].double().sum()) for a, b in chunks) / n
    squares = 0.0
    for a, b in chunks:
        d = v[a:b].double().sub_(mean)
        squares += float(d.dot(d))
    return mean, math.sqrt(squares / (n - 1))


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


# ============================================================================ the builder
class _Builder(TileBuilder):
    """A :class:`TileBuilder` with the tile op imports need beyond einsum, map, fill and blockwise."""

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
                        got.append((_step(src.tiles[sblk], "slice", rel, sbs), at))
            pieces[blk] = got
        if all(len(p) == 1 and [h - l for l, h in p[0][1]] == list(bs) for p in pieces.values()):
            out.tiles = {blk: p[0][0] for blk, p in pieces.items()}  # every block is one (sliced) tile
            return out
        return self.blockwise(name, kind, "assemble", shape, grid, lambda blk: [r for r, _ in pieces[blk]],
                              lambda blk: {"at": [a for _, a in pieces[blk]]})  # fmt: skip


def _step(ref: dict, how: str, arg: Any, shape: Sequence[int]) -> dict:
    """``ref`` with one more layout step (a whole-tile slice is no step)."""
    if how == "slice" and all(lo == 0 and hi == s for (lo, hi), s in zip(arg, shape)):
        return ref
    out = dict(ref)
    out["xform"] = [*ref.get("xform", []), [how, [list(a) if isinstance(a, (list, tuple)) else int(a) for a in arg]]]
    return out


# ============================================================================ layout helpers
def _retile(b: _Builder, t: Tensor, grid: Sequence[int], name: str) -> Tensor:
    grid = tuple(int(g) for g in grid)
    if grid == t.grid:
        return t
    return b.assemble(name, t.shape, grid, [(t, [0] * len(t.shape))])


def _permute(t: Tensor, perm: Sequence[int]) -> Tensor:
    perm = [int(p) % max(len(t.shape), 1) for p in perm]
    if perm == list(range(len(perm))):
        return t
    out = Tensor(t.name, tuple(t.shape[p] for p in perm), tuple(t.grid[p] for p in perm))
    for blk, ref in t.tiles.items():
        out.tiles[tuple(blk[p] for p in perm)] = _step(ref, "perm", perm, t.block_shape)
    return out


def _reshape_groups(old: Sequence[int], new: Sequence[int]) -> list[tuple[list[int], list[int]]]:
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


def _view(b: _Builder, t: Tensor, shape: Sequence[int], name: str) -> Tensor:
    """``t`` reshaped (row-major) to ``shape``; the tiles get a view step. A group of merged or
    split axes keeps the grid of its leading axis; a tiled inner axis is re-tiled first."""
    shape = tuple(int(s) for s in shape)
    if shape == t.shape:
        return t
    if math.prod(shape) != math.prod(t.shape):
        raise GraphImportError(f"{name}: cannot view {list(t.shape)} as {list(shape)}")
    leads = [(gi, next((a for a in gi if t.shape[a] > 1), None), next((a for a in gj if shape[a] > 1), None))
             for gi, gj in _reshape_groups(t.shape, shape)]  # fmt: skip
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
    t = _retile(b, t, want, f"{name}.retile")
    out = Tensor(t.name, shape, tuple(new_grid))
    nbs = out.block_shape
    for blk, ref in t.tiles.items():
        nblk = [0] * len(shape)
        for _, lead_o, lead_n in leads:
            if lead_o is not None and lead_n is not None:
                nblk[lead_n] = blk[lead_o]
        out.tiles[tuple(nblk)] = _step(ref, "view", nbs, t.block_shape)
    return out


def _slice(b: _Builder, t: Tensor, dim: int, start: int, end: int, name: str) -> Tensor:
    """``t`` restricted to ``start:end`` on axis ``dim`` (no op unless a block must be re-tiled)."""
    n = t.shape[dim]
    start, end = max(0, min(start, n)), max(0, min(end, n))
    if start == 0 and end == n:
        return t
    bs = t.block_shape[dim]
    if start // bs != (end - 1) // bs and (start % bs or end % bs):
        grid = list(t.grid)
        grid[dim] = 1
        t, bs = _retile(b, t, grid, f"{name}.retile"), n
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
            out.tiles[tuple(nblk)] = _step(ref, "slice", rel, t.block_shape)
    return out


def _unify(b: _Builder, operands: list[tuple[Tensor, str]], name: str, whole: str = "") -> list[Tensor]:
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
    return [_retile(b, t, [target[c] for c in term], f"{name}.in{k}") for k, (t, term) in enumerate(operands)]


# ============================================================================ the lowering
def _is_square(x: Any) -> bool:
    """Is ``x`` a pending ``t ** 2`` read by one op only?"""
    return (isinstance(x, _Expr) and x.uses == 1 and x.tensor is None and len(x.steps) == 1
            and x.steps[0][0] == "pow" and float(x.steps[0][2].get("c", 0)) == 2.0
            and len(x.leaves) == 1 and x.leaves[0][1] == LETTERS[: len(x.shape)])  # fmt: skip


def module_path(node: Any) -> str:
    """The dotted path of the module an FX node belongs to, named as ``named_modules()`` names it
    (``"model.layers.3.self_attn.q_proj"``): the innermost entry of ``node.meta["nn_module_stack"]``, with
    torch.export's name of the root (``L['self']``, ``L__self__``), :data:`WRAPPED` and indexing brackets
    removed. ``""`` (the root) for a node outside every submodule."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    last = list(stack.values())[-1]
    path = str(last[0] if isinstance(last, (tuple, list)) else last)
    while (m := re.fullmatch(r"getattr\((.*), '([^']*)'\)(.*)", path)) is not None:  # getattr(L['self'].layers, '0')
        path = f"{m[1]}.{m[2]}{m[3]}"
    path = re.sub(r"\[(\d+)\]|\['([^']*)'\]", lambda m: "." + (m[1] or m[2]), path)  # layers[0], _modules['x']
    path = re.sub(r"^(L\.self|L__self__|self)(\.|_(?=[A-Za-z0-9])|$)", "", path)
    path = path.replace("._modules.", ".").strip(".")
    return "" if path == WRAPPED else path.removeprefix(WRAPPED + ".")


class _Bcast:
    """``src`` (a tensor or pending expression whose broadcast axes have size 1) expanded to ``shape``,
    not yet copied: an elementwise op reads ``src`` with broadcasting, ``repeat_kv``'s reshape makes a
    :class:`_Repeat` of it, other consumers get a copy (an ``assemble`` op per block)."""

    def __init__(self, src: Any, shape: tuple[int, ...]) -> None:
        self.src, self.shape = src, shape
        self.copied: Tensor | None = None  # its copy, once a consumer needed one


class _Repeat:
    """``src`` with axis ``axis`` repeated: ``out[..., i, ...] = src[..., i // rep, ...]`` (grouped-query
    attention's keys and values after ``repeat_kv``), not yet copied: attention reads ``src`` by groups."""

    def __init__(self, src: Tensor, axis: int, rep: int) -> None:
        self.src, self.axis, self.rep = src, axis, rep
        self.shape = tuple(s * rep if a == axis else s for a, s in enumerate(src.shape))
        self.copied: Tensor | None = None  # its copy, once a consumer needed one


class _Expr:
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


_IDENTITY = {
    "aten.clone.default", "aten.contiguous.default", "aten.alias.default", "aten.detach.default",
    "aten.dropout.default", "aten.lift_fresh_copy.default", "aten.to.dtype", "aten.to.dtype_layout",
    "aten.to.device", "aten._to_copy.default", "aten.type_as.default", "aten.feature_dropout.default",
}  # fmt: skip
_SKIP = {"aten._assert_tensor_metadata.default", "aten._assert_async.msg", "aten.sym_constrain_range_for_size.default"}
_VALUE_FREE = {  # ops that read only the shape and dtype of their tensor arguments
    "aten.new_ones.default", "aten.new_zeros.default", "aten.new_full.default", "aten.new_empty.default",
    "aten.zeros_like.default", "aten.ones_like.default", "aten.full_like.default", "aten.empty_like.default",
    "aten.sym_size.int",
}  # fmt: skip
_UNARY = {"aten.neg.default": "neg", "aten.silu.default": "silu", "aten.relu.default": "relu",
          "aten.tanh.default": "tanh", "aten.exp.default": "exp", "aten.rsqrt.default": "rsqrt",
          "aten.sqrt.default": "sqrt", "aten.sigmoid.default": "sigmoid"}  # fmt: skip
_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul", "aten.div.Tensor": "div",
           "aten.add.Scalar": "add", "aten.sub.Scalar": "sub", "aten.mul.Scalar": "mul", "aten.div.Scalar": "div",
           "aten.rsub.Scalar": "rsub"}  # fmt: skip


#: what a lowering handler raises on arguments of shapes or values it was not written for
_MALFORMED = (ArithmeticError, ValueError, TypeError, IndexError, KeyError, AttributeError, RuntimeError)


def _target(node: Any) -> str:
    return str(node.target)


def _cost_only(state: Mapping[str, Any]) -> str:
    """Why a program's graph can record no values: its parameters, buffers or constants are on the meta
    device (``""`` when they are not)."""
    import torch

    meta = any(isinstance(v, torch.Tensor) and v.is_meta for v in state.values())
    return NO_VALUES if meta else ""


def _on_one_device(tree: Any) -> Any:
    """The arguments of a folded op, on one device: the meta device if any tensor among them is there (its
    values do not exist), else the CPU, with a ``device="meta"`` argument (an ``arange`` of a model built
    on the meta device) moved to the CPU, so that what can be computed from shapes alone is."""
    import torch
    from torch.utils import _pytree

    leaves = _pytree.tree_leaves(tree)
    if any(isinstance(x, torch.Tensor) and x.is_meta for x in leaves):
        return _pytree.tree_map(lambda x: x.to("meta") if isinstance(x, torch.Tensor) else x, tree)
    cpu = torch.device("cpu")
    return _pytree.tree_map(lambda x: cpu if isinstance(x, torch.device) and x.type == "meta" else x, tree)


class _Lowering:
    """State of one lowering: the builder, values per FX node, and the buffers' known values."""

    def __init__(self, ep: Any, blocks: Mapping[int, int], dtype: str, name: str) -> None:
        self.ep = ep
        self.blocks = dict(blocks)
        self.b = _Builder("import", dtype)  # meta["workload"]: not a built-in workload's name
        self.name = name
        self.env: dict[Any, Any] = {}
        self.const_inputs: dict[int, Tensor] = {}  # id(torch constant) -> its graph input
        self.uses: dict[Any, int] = {}  # FX node -> how many ops read its value
        self.slices: dict[int, tuple] = {}  # id(sliced tensor) -> (it, source, axis, start, end): rotate_half
        self.user_inputs: list[str] = []  # graph input names of the forward's tensor arguments, in order
        self.cost_only = ""  # why the graph records no values ("" when it does): see _cost_only
        self.constants_missing = False  # a constant has no recorded value (not only the weights)
        self.weights: dict[str, dict[str, Any]] = {}  # graph input -> its state_dict key, shape, dtype, ties
        self.params: dict[str, tuple[Any, list[str]]] = {}  # state_dict key -> (its tensor, the keys tied to it)
        self.handlers: dict[str, Callable] = {
            "aten.linear.default": self._linear, "aten.mm.default": self._mm, "aten.bmm.default": self._mm,
            "aten.matmul.default": self._mm, "aten.addmm.default": self._addmm, "aten.einsum.default": self._einsum,
            "aten.scaled_dot_product_attention.default": self._sdpa, "aten.embedding.default": self._embedding,
            "aten.layer_norm.default": self._layer_norm, "aten.softmax.int": self._softmax_op,
            "aten._softmax.default": self._softmax_op, "aten.mean.dim": self._reduce, "aten.sum.dim_IntList": self._reduce,
            "aten.amax.default": self._reduce, "aten.pow.Tensor_Scalar": self._pow, "aten.gelu.default": self._gelu,
            "aten.view.default": self._reshape, "aten.reshape.default": self._reshape,
            "aten._unsafe_view.default": self._reshape, "aten.flatten.using_ints": self._reshape,
            "aten.unsqueeze.default": self._unsqueeze, "aten.squeeze.dim": self._reshape,
            "aten.squeeze.dims": self._reshape, "aten.permute.default": self._permute,
            "aten.transpose.int": self._transpose, "aten.t.default": self._t, "aten.slice.Tensor": self._slice,
            "aten.select.int": self._select, "aten.split.Tensor": self._split,
            "aten.split_with_sizes.default": self._split, "aten.chunk.default": self._split,
            "aten.cat.default": self._cat, "aten.stack.default": self._stack, "aten.numpy_T.default": self._t,
            "aten.expand.default": self._expand, "<built-in function getitem>": self._getitem,
        }  # fmt: skip
        self.handlers |= {**dict.fromkeys(_UNARY, self._unary), **dict.fromkeys(_BINARY, self._binary),
                          **dict.fromkeys(_IDENTITY, self._identity)}  # fmt: skip

    # ------------------------------------------------------------------ values
    def grid(self, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.blocks.get(int(s), 1) for s in shape)

    def _fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.b._logical_names or name in self.b.inputs:
            k += 1
            name = f"{base}_{k}"
        return name

    def input_tensor(self, name: str, value: Any, init: dict[str, Any]) -> Tensor:
        shape = tuple(int(s) for s in value.shape) or (1,)
        return self.b.input(self._fresh(name), shape, self.grid(shape), init)

    def materialize(self, value: Any, hint: str) -> Tensor:
        """A known torch tensor as a recorded constant input (once per tensor). In a cost-only lowering,
        or for a tensor on the meta device, an input of its shape with no value (``init: "meta"``)."""
        key = id(value)
        if value.is_meta:
            self.cost_only = NO_VALUES
            self.constants_missing = True
        if key not in self.const_inputs and (value.is_meta or (self.cost_only and value.numel() > MAX_RECORDED_ELEMENTS)):
            self.constants_missing = True  # (a constant too large to record in a graph that is not executed anyway)
            self.const_inputs[key] = self.input_tensor(f"const.{hint}", value, {"init": "meta"})
        if key not in self.const_inputs:
            if value.numel() > MAX_RECORDED_ELEMENTS:
                raise GraphImportError(f"{hint}: a constant of {value.numel()} elements is too large to record")
            data = value.detach().to("cpu").double().reshape(tuple(value.shape) or (1,)).numpy()
            self.const_inputs[key] = self.input_tensor(f"const.{hint}", value, {"init": "value", "data": data.tolist()})
        return self.const_inputs[key]

    def tensor(self, v: Any, hint: str) -> Tensor:
        import torch

        if isinstance(v, Tensor):
            return v
        if isinstance(v, _Expr):
            return self._emit(v)
        if isinstance(v, (_Bcast, _Repeat)):
            if v.copied is None:
                v.copied = self._copy_broadcast(v, hint) if isinstance(v, _Bcast) else self._copy_repeat(v, hint)
            return v.copied
        if isinstance(v, torch.Tensor):
            return self.materialize(v, hint)
        raise GraphImportError(f"{hint}: expected a tensor, got {type(v).__name__}")

    # ------------------------------------------------------------------ driver
    def run(self) -> DataflowGraph:
        ep, gm = self.ep, self.ep.graph_module
        kinds = {s.arg.name: s for s in ep.graph_signature.input_specs}
        state = {**ep.state_dict, **getattr(ep, "constants", {})}
        nodes = list(gm.graph.nodes)
        self.cost_only = _cost_only(state)
        dynamic = self._dynamic_nodes(nodes, kinds)
        for n in reversed(nodes):  # consumers of a node's value, seen through identity ops; asserts read none
            self.uses[n] = sum(self.uses.get(u, 1) if _target(u) in _IDENTITY else 0 if _target(u) in _SKIP else 1
                               for u in n.users)  # fmt: skip
        missing = Counter(_target(n) for n in nodes
                          if n.op == "call_function" and n in dynamic and _target(n) not in self.handlers
                          and _target(n) not in _SKIP)  # fmt: skip
        if missing:
            listed = ", ".join(f"{t} ({c}x)" for t, c in sorted(missing.items(), key=lambda kv: (-kv[1], kv[0])))
            raise GraphImportError(f"unsupported ops, nothing imported: {listed}")
        for node in nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, kinds[node.name], state)
            elif node.op == "call_function":
                if _target(node) in _SKIP:
                    self.env[node] = None
                elif node not in dynamic:
                    self.env[node] = self._fold(node)
                else:
                    try:
                        with self.b.scope(module_path(node)):
                            self.env[node] = self.handlers[_target(node)](node, *self._args(node))
                    except (GraphImportError, WorkloadError) as e:
                        raise GraphImportError(f"op {node.name} ({_target(node)}): {e}") from None
                    except _MALFORMED as e:  # arguments no export of a real module gives (a .pt2 file's own)
                        raise GraphImportError(f"op {node.name} ({_target(node)}): cannot lower its arguments "
                                               f"({_one_line(e)})") from None  # fmt: skip
            elif node.op == "output":
                self._outputs(node)
        if not self.b.flops:
            raise GraphImportError("the model computes nothing from its inputs and parameters")
        graph = self.b.finish(self.name, {"source": self.name})
        graph.meta["user_inputs"] = list(self.user_inputs)
        graph.meta["weights"] = self.weights
        if self.cost_only:
            graph.meta["cost_only"] = NO_VALUES if self.constants_missing else NO_WEIGHTS
        return graph

    def _dynamic_nodes(self, nodes: list, kinds: Mapping[str, Any]) -> set:
        """Nodes whose values depend on the user's inputs or the parameters (the rest are folded)."""
        dyn: set = set()
        for n in nodes:
            if n.op == "placeholder":
                if kinds[n.name].kind.name in ("USER_INPUT", "PARAMETER"):
                    dyn.add(n)
            elif n.op == "call_function" and _target(n) not in _VALUE_FREE:
                if any(a in dyn for a in n.all_input_nodes):
                    dyn.add(n)
        return dyn

    def _args(self, node: Any) -> tuple[list, dict]:
        import torch.fx as fx

        args = [fx.node.map_arg(a, self.env.__getitem__) for a in node.args]
        kwargs = {k: fx.node.map_arg(v, self.env.__getitem__) for k, v in node.kwargs.items()}
        return args, kwargs

    def _fold(self, node: Any) -> Any:
        """Evaluate a node whose inputs are all known (buffers, constants, shapes) with torch."""
        import torch
        import torch.fx as fx

        def look(a: Any) -> Any:
            if not isinstance(a, fx.Node):
                return a
            v = self.env[a]
            if isinstance(v, Tensor):  # a value-free op reads only the shape and dtype
                meta = a.meta.get("val")
                return torch.zeros(tuple(meta.shape), dtype=meta.dtype)
            return v

        for v in (node, *node.all_input_nodes):
            meta = v.meta.get("val")
            if isinstance(meta, torch.Tensor) and meta.numel() > MAX_FOLDED_ELEMENTS:
                raise GraphImportError(f"op {node.name} ({_target(node)}): a constant of {meta.numel()} elements is too "
                                       f"large to compute at import (at most {MAX_FOLDED_ELEMENTS})")  # fmt: skip
        args = fx.node.map_aggregate(node.args, look)
        kwargs = fx.node.map_aggregate(dict(node.kwargs), look)
        args, kwargs = _on_one_device((args, kwargs))
        try:
            with torch.no_grad():
                return node.target(*args, **kwargs)
        except Exception as e:
            raise GraphImportError(f"op {node.name} ({_target(node)}): cannot evaluate a constant ({_one_line(e)})") from None

    def _placeholder(self, node: Any, spec: Any, state: Mapping[str, Any]) -> Any:
        kind = spec.kind.name
        meta = node.meta.get("val")
        if kind == "USER_INPUT":
            if meta is None or not hasattr(meta, "shape"):
                raise GraphImportError(f"input {node.name}: only tensor inputs are supported")
            init = {"init": "normal", "std": 1.0} if meta.dtype.is_floating_point else {"init": "index", "high": 1}
            t = self.input_tensor(node.name, meta, init)
            self.user_inputs.append(t.name)
            return t
        value = state.get(spec.target)
        if value is None:
            raise GraphImportError(f"{spec.target}: the exported program holds no value for it")
        if kind == "PARAMETER":
            name = spec.target.removeprefix(WRAPPED + ".")
            if value.is_meta:
                t = self.input_tensor(name, value, {"init": "meta"})
            else:
                mean, std = mean_std(value)
                t = self.input_tensor(name, value, {"init": "normal", "mean": mean, "std": std})
            self._bind_weight(t.name, name, value)
            return t
        return value.detach()  # buffers and lifted constants: known values

    def _bind_weight(self, input_name: str, key: str, value: Any) -> None:
        """Record graph input ``input_name`` as the parameter ``key`` of the module's ``state_dict``: its shape
        and element type there, and the keys of the parameters it is tied to (one tensor under several names,
        as a language model head tied to its embedding, which a checkpoint stores under one of them)."""
        tied = [k for k, (v, _) in self.params.items() if v is value]
        for k in tied:
            self.params[k][1].append(key)
        self.params[key] = (value, tied)
        self.weights[input_name] = {"key": key, "shape": [int(s) for s in value.shape],
                                    "dtype": str(value.dtype).removeprefix("torch."), "tied": tied}  # fmt: skip

    def _outputs(self, node: Any) -> None:
        outs = self._args(node)[0][0]
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        specs = self.ep.graph_signature.output_specs
        for k, v in enumerate(outs):
            if isinstance(v, _Expr):
                v = self._emit(v)
            if not isinstance(v, Tensor):
                continue
            name = specs[k].arg.name if k < len(specs) else f"out{k}"
            if any("op" not in r or "xform" in r for r in v.tiles.values()):
                v = self.b.assemble(self._fresh(f"{name}.copy"), v.shape, v.grid, [(v, [0] * len(v.shape))])
                if any("op" not in r or "xform" in r for r in v.tiles.values()):  # whole tiles: force a copy
                    v = self._copy(v, f"{name}.copy")
            self.b.output(name, v)

    def _copy_broadcast(self, x: _Bcast, hint: str) -> Tensor:
        """``x`` copied: the source tile at every offset of the broadcast axes, one ``assemble`` op per
        block (the broadcast axes are one block)."""
        src = self.tensor(x.src, hint)
        axes = [a for a, (s, t) in enumerate(zip(src.shape, x.shape)) if s != t]
        grid = [1 if a in axes else g for a, g in enumerate(src.grid)]
        offsets = itertools.product(*(range(x.shape[a]) if a in axes else [0] for a in range(len(x.shape))))
        return self.b.assemble(self._fresh(hint + ".expand"), x.shape, grid, [(src, list(o)) for o in offsets])

    def _copy_repeat(self, x: _Repeat, hint: str) -> Tensor:
        """``x`` copied, for a consumer other than attention (see :meth:`_copy_broadcast`)."""
        a, shape = x.axis, list(x.src.shape)
        split = _view(self.b, x.src, [*shape[: a + 1], 1, *shape[a + 1 :]], self._fresh(hint + ".split"))
        full = self._copy_broadcast(_Bcast(split, (*shape[: a + 1], x.rep, *shape[a + 1 :])), hint)
        return _view(self.b, full, x.shape, self._fresh(hint + ".repeat"))

    def _copy(self, t: Tensor, name: str) -> Tensor:
        name = self._fresh(name)
        return self.b.blockwise(name, OpKind.FORMATION, "assemble", t.shape, t.grid, lambda blk: [dict(t.tiles[blk])],
                                lambda blk: {"at": [[[0, s] for s in t.block_shape]]})  # fmt: skip

    # ------------------------------------------------------------------ ops
    def _identity(self, node: Any, args: list, kwargs: dict) -> Any:
        return args[0]

    def _getitem(self, node: Any, args: list, kwargs: dict) -> Any:
        return args[0][args[1]]

    def _einsum_op(self, eq: str, ts: list[Tensor], node: Any, kind: OpKind = OpKind.MATMUL) -> Tensor:
        ins = eq.split("->")[0].split(",")
        ts = _unify(self.b, list(zip(ts, ins)), self._fresh(node.name))
        return self.b.contract(eq, *ts, name=self._fresh(node.name), kind=kind)

    def _linear(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x, w = self.tensor(args[0], node.name), self.tensor(args[1], node.name)
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        lead = LETTERS[: len(x.shape) - 1]
        y = self._einsum_op(f"{lead}z,yz->{lead}y", [x, w], node)
        if bias is not None:
            return self._ew("add", [y, bias], node)
        return y

    def _mm(self, node: Any, args: list, kwargs: dict) -> Tensor:
        a, c = self.tensor(args[0], node.name), self.tensor(args[1], node.name)
        if len(a.shape) < 2 or len(c.shape) < 2:
            raise GraphImportError(f"matrix products of vectors are not supported (shapes {a.shape}, {c.shape})")
        batch = LETTERS[: max(len(a.shape), len(c.shape)) - 2]
        ta = batch[len(batch) - (len(a.shape) - 2):] + "yz"
        tc = batch[len(batch) - (len(c.shape) - 2):] + "zx"
        if a.shape[-3::-1][: len(c.shape) - 2] != c.shape[-3::-1][: len(a.shape) - 2]:  # batch axes, aligned right
            raise GraphImportError("broadcast batch dimensions in a matrix product are not supported")
        return self._einsum_op(f"{ta},{tc}->{batch}yx", [a, c], node)

    def _addmm(self, node: Any, args: list, kwargs: dict) -> Tensor:
        beta, alpha = float(kwargs.get("beta", 1)), float(kwargs.get("alpha", 1))
        if beta != 1 or alpha != 1:
            raise GraphImportError(f"addmm with beta={beta:g}, alpha={alpha:g} is not supported")
        y = self._mm(node, [args[1], args[2]], {})
        return self._ew("add", [y, args[0]], node)

    def _einsum(self, node: Any, args: list, kwargs: dict) -> Tensor:
        eq = str(args[0]).replace(" ", "")
        if "..." in eq or "->" not in eq:
            raise GraphImportError(f"einsum {eq!r}: write it with explicit output subscripts and no '...'")
        return self._einsum_op(eq, [self.tensor(t, node.name) for t in args[1]], node)

    # ------------------------------------------------------------------ elementwise (fused)
    def _ew(self, fn: str, operands: list, node: Any, params: dict | None = None) -> "_Expr":
        """``fn`` over ``operands`` (tensors or pending expressions) with numpy broadcasting, as a
        pending expression: a chain of elementwise ops becomes one fused op when it is consumed."""
        import torch

        out_shape = tuple(np.broadcast_shapes(*(tuple(o.shape) for o in operands)))
        sources = [o.src if isinstance(o, _Bcast) else o for o in operands]
        if tuple(np.broadcast_shapes(*(tuple(o.shape) for o in sources))) == out_shape:
            operands = sources  # numpy broadcasting reads each not-yet-copied broadcast's source
        operands = [self.tensor(o, node.name) if isinstance(o, (torch.Tensor, _Bcast, _Repeat)) else o
                    for o in operands]  # fmt: skip
        r = len(out_shape)
        e = _Expr(out_shape, self.uses.get(node, 1), node.name)
        e.module = self.b.module
        args = []
        for o in operands:
            if isinstance(o, _Expr) and (o.uses > 1 or sum(p is o for p in operands) > 1 or o.tensor is not None):
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
        return _view(self.b, t, [t.shape[i] for i in keep], self._fresh(node.name + ".bcast"))

    def _emit(self, e: "_Expr") -> Tensor:
        """The tile ops of a pending expression (once; later consumers share them)."""
        if e.tensor is not None:
            return e.tensor
        out = LETTERS[: len(e.shape)]
        absent = [a for a, c in enumerate(out) if c not in "".join(term for _, term in e.leaves)]
        if any(e.shape[a] != 1 for a in absent):  # an output axis no operand has
            raise GraphImportError(f"{e.name}: elementwise op with an axis no operand has")
        if absent:  # size-1 axes inserted after the expression (an unsqueeze): emit without them, then view
            kept = [c for a, c in enumerate(out) if a not in absent]
            inner = _Expr(tuple(s for a, s in enumerate(e.shape) if a not in absent), e.uses, e.name)
            inner.leaves = [(t, "".join(LETTERS[kept.index(c)] for c in term)) for t, term in e.leaves]
            inner.steps, inner.module = e.steps, e.module
            e.tensor = _view(self.b, self._emit(inner), e.shape, self._fresh(e.name + ".view"))
            return e.tensor
        name = self._fresh(e.name)
        steps = [(f, [a if kind == "leaf" else len(e.leaves) + a for kind, a in sa], p) for f, sa, p in e.steps]
        fns = {f for f, _, _ in steps}
        whole = out[-1] if "rotate_half" in fns else ""  # rotate_half swaps the halves of the last axis
        eq = ",".join(term for _, term in e.leaves) + "->" + out
        kind = (OpKind.ROTARY if "rotate_half" in fns else OpKind.NORM if fns & {"rsqrt", "rms_scale"}
                else OpKind.ELEMENTWISE)  # fmt: skip
        with self.b.scope(e.module):
            ts = _unify(self.b, [(t, term) for t, term in e.leaves], name, whole)
            if len(steps) == 1 and steps[0][1] == list(range(len(e.leaves))):
                e.tensor = self.b.map(steps[0][0], eq, *ts, name=name, kind=kind, params=steps[0][2] or None)
            else:
                e.tensor = self.b.map("fused", eq, *ts, name=name, kind=kind,
                                      params={"steps": [[f, a, p] for f, a, p in steps]})  # fmt: skip
        return e.tensor

    def _unary(self, node: Any, args: list, kwargs: dict) -> "_Expr":
        return self._ew(_UNARY[_target(node)], [args[0]], node)

    def _gelu(self, node: Any, args: list, kwargs: dict) -> "_Expr":
        fn = "gelu_tanh" if kwargs.get("approximate", args[1] if len(args) > 1 else "none") == "tanh" else "gelu"
        return self._ew(fn, [args[0]], node)

    def _pow(self, node: Any, args: list, kwargs: dict) -> "_Expr":
        return self._ew("pow", [args[0]], node, {"c": float(args[1])})

    def _scalar_of(self, v: Any) -> float | None:
        """``v`` as a number, if it is one or a one-element constant. A one-element constant with no value
        (on the meta device: Gemma's embedding normalizer) reads as 1, so that the op and its cost are those
        of the real model; a cost-only graph is never executed."""
        import torch

        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_meta:
            self.cost_only, self.constants_missing = NO_VALUES, True
            return 1.0
        if isinstance(v, torch.Tensor) and v.numel() == 1:
            return float(v.reshape(()))
        return None

    def _binary(self, node: Any, args: list, kwargs: dict) -> "_Expr":
        fn = _BINARY[_target(node)]
        a, c = args[0], args[1]
        alpha = float(kwargs.get("alpha", args[2] if len(args) > 2 else 1))
        if fn == "rsub":
            fn, a, c = "sub", c, a
        sa, sc = self._scalar_of(a), self._scalar_of(c)
        if sa is not None and sc is not None:
            raise GraphImportError("an op on two scalars reached the graph")
        if sc is not None:
            how = {"add": ("add_scalar", alpha * sc), "sub": ("add_scalar", -alpha * sc),
                   "mul": ("scale", sc), "div": ("scale", 1.0 / sc)}[fn]  # fmt: skip
            return self._ew(how[0], [a], node, {"c": how[1]})
        if alpha != 1:
            c = self._ew("scale", [c], node, {"c": alpha})
        if sa is not None:
            how = {"add": ("add_scalar", sa), "sub": ("rsub_scalar", sa), "mul": ("scale", sa),
                   "div": ("rdiv_scalar", sa)}[fn]  # fmt: skip
            return self._ew(how[0], [c], node, {"c": how[1]})
        return self._ew(fn, [a, c], node)

    def _reduce(self, node: Any, args: list, kwargs: dict) -> Any:
        x = args[0]
        r = len(x.shape)
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        dims = list(range(r)) if dims is None else [int(d) % r for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
        keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
        t = LETTERS[:r]
        kept = "".join(c for i, c in enumerate(t) if i not in dims)
        if not kept:
            raise GraphImportError("a reduction to a scalar is not supported")
        how = "max" if _target(node) == "aten.amax.default" else "sum"
        name = self._fresh(node.name)
        if how == "sum" and _is_square(x):  # sum of squares: one contraction of x with itself (as RMSNorm)
            leaf = self.tensor(x.leaves[0][0], node.name)
            y = self.b.contract(f"{t},{t}->{kept}", leaf, leaf, name=name, kind=OpKind.NORM)
        else:
            y = self.b.reduce(f"{t}->{kept}", self.tensor(x, node.name), how=how, name=name, kind=OpKind.REDUCE)
        if _target(node) == "aten.mean.dim":
            y = self._ew("scale", [y], node, {"c": 1.0 / math.prod(x.shape[d] for d in dims)})
        if keepdim:
            return self._unsqueezed(y, sorted(dims), node)
        return y

    def _unsqueezed(self, y: Any, inserted: list[int], node: Any) -> Any:
        """``y`` with size-1 axes inserted at positions ``inserted`` of the result (a pending
        expression stays pending)."""
        r = len(y.shape) + len(inserted)
        pos = [i for i in range(r) if i not in inserted]  # new position of each old axis
        shape = [1] * r
        for old, new in enumerate(pos):
            shape[new] = y.shape[old]
        if isinstance(y, Tensor):
            return _view(self.b, y, shape, self._fresh(node.name + ".keepdim"))
        e = _Expr(tuple(shape), y.uses, y.name)
        e.module = y.module
        e.leaves = [(t, "".join(LETTERS[pos[LETTERS.index(c)]] for c in term)) for t, term in y.leaves]
        e.steps = list(y.steps)
        return e

    def _softmax_op(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        t = LETTERS[: len(x.shape)]
        axis = t[int(args[1]) % len(t)]
        return tiled_softmax(self.b, x, t, axis, scale=1.0, name=self._fresh(node.name))

    def _layer_norm(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        shape = list(args[1])
        w, bias = (args[2] if len(args) > 2 else None), (args[3] if len(args) > 3 else None)
        eps = float(args[4] if len(args) > 4 else kwargs.get("eps", 1e-5))
        if len(shape) != 1:
            raise GraphImportError(f"layer_norm over {len(shape)} axes (only the last axis is supported)")
        t = LETTERS[: len(x.shape)]
        rows, n, name = t[:-1], shape[0], self._fresh(node.name)
        s = self.b.reduce(f"{t}->{rows}", x, name=f"{name}.sum", kind=OpKind.NORM)
        mu = self.b.map("scale", f"{rows}->{rows}", s, name=f"{name}.mean", kind=OpKind.NORM, params={"c": 1.0 / n})
        xc = self.b.map("sub", f"{t},{rows}->{t}", x, mu, name=f"{name}.center", kind=OpKind.NORM)
        ss = self.b.contract(f"{t},{t}->{rows}", xc, xc, name=f"{name}.sumsq", kind=OpKind.NORM)
        import torch

        w_t = self.tensor(w if w is not None else torch.ones(n), node.name + ".weight")
        sname = self._fresh(node.name + ".scale")
        ts = _unify(self.b, [(xc, t), (ss, rows), (w_t, t[-1])], sname)
        y = self.b.map("rms_scale", f"{t},{rows},{t[-1]}->{t}", *ts, name=sname, kind=OpKind.NORM,
                       params={"n": n, "eps": eps})  # fmt: skip
        if bias is not None:
            return self._ew("add", [y, bias], node)
        return y

    def _sdpa(self, node: Any, args: list, kwargs: dict) -> Tensor:
        """Attention as two contractions, a softmax and a mask. Grouped-query attention (keys and values of
        G heads for H = G x R query heads, from ``repeat_kv`` or ``enable_gqa``) reads each key/value tile
        once per group: the queries are viewed as (groups, R) and nothing is copied."""
        import torch

        q = self.tensor(args[0], node.name)
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        if (args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)) not in (0, 0.0):
            raise GraphImportError("scaled_dot_product_attention with dropout_p > 0 (export the model in eval mode)")
        causal = bool(args[5] if len(args) > 5 else kwargs.get("is_causal", False))
        scale = kwargs.get("scale", args[6] if len(args) > 6 else None)
        gqa = bool(kwargs.get("enable_gqa", args[7] if len(args) > 7 else False))
        if not (len(q.shape) == len(args[1].shape) == len(args[2].shape) == 4):
            raise GraphImportError("scaled_dot_product_attention on tensors of rank other than 4")
        k, v = self._kv_groups(args[1], args[2], q.shape[1], gqa, node)
        (B, H, S, E), G, L = q.shape, k.shape[1], k.shape[2]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(E)
        name = self._fresh(node.name)
        grouped = G != H
        if grouped:
            q = _view(self.b, q, [B, G, H // G, S, E], self._fresh(node.name + ".groups"))
        qt, kt, st, vt, ot = (("bgrqe", "bgke", "bgrqk", "bgkf", "bgrqf") if grouped else
                              ("bhqe", "bhke", "bhqk", "bhkf", "bhqf"))  # fmt: skip
        if isinstance(mask, torch.Tensor) and mask.dtype == torch.bool:
            causal_mask = torch.ones(S, L, dtype=torch.bool).tril()
            if not mask.is_meta and bool((mask == causal_mask).all()):
                causal, mask = True, None
            else:
                mask = torch.zeros(mask.shape, device=mask.device).masked_fill(~mask, float("-inf"))
        scores = self._einsum_op(f"{qt},{kt}->{st}", [q, k], node)
        if causal:
            scores = self.b.map("causal_mask", f"{st}->{st}", scores, name=f"{name}.mask", kind=OpKind.MASK_FILL,
                                params={"row_axis": st.index("q"), "col_axis": st.index("k"), "col_offset": 0},
                                tile_params=lambda off: {"row_offset": off["q"] + (L - S), "col_offset": off["k"]})  # fmt: skip
        if mask is not None:
            scores = self._emit(self._ew("add", [scores, self._grouped_mask(mask, H, G, node) if grouped else mask],
                                         node))  # fmt: skip
        probs = tiled_softmax(self.b, scores, st, "k", scale=scale, name=f"{name}.softmax")
        out = self._einsum_op(f"{st},{vt}->{ot}", [probs, v], node)
        return _view(self.b, out, [B, H, S, v.shape[3]], self._fresh(node.name + ".heads")) if grouped else out

    def _kv_groups(self, k: Any, v: Any, heads: int, gqa: bool, node: Any) -> tuple[Tensor, Tensor]:
        """Attention's keys and values with one head per group: the sources of ``repeat_kv``'s repeats, or
        the tensors themselves (as many heads as the queries, or fewer with ``enable_gqa``)."""
        if isinstance(k, _Repeat) and isinstance(v, _Repeat) and k.axis == v.axis == 1 and k.rep == v.rep:
            return k.src, v.src
        k, v = self.tensor(k, node.name), self.tensor(v, node.name)
        groups = k.shape[1]
        if v.shape[1] != groups or heads % groups or (groups != heads and not gqa):
            raise GraphImportError(f"attention of {heads} query heads over {groups} key and {v.shape[1]} value heads"
                                   + ("" if gqa else " without enable_gqa"))  # fmt: skip
        return k, v

    def _grouped_mask(self, mask: Any, heads: int, groups: int, node: Any) -> Any:
        """An additive attention mask (rank <= 4, heads on axis 1 of rank 4) viewed as (batch, groups,
        heads per group, queries, keys)."""
        import torch

        shape = (1,) * (4 - len(mask.shape)) + tuple(int(s) for s in mask.shape)
        b, h, sq, sk = shape
        five = [b, groups, heads // groups, sq, sk] if h == heads and h > 1 else [b, 1, 1, sq, sk]
        if isinstance(mask, torch.Tensor):
            return mask.reshape(five)
        return _view(self.b, self.tensor(mask, node.name + ".mask"), five, self._fresh(node.name + ".mask"))

    def _embedding(self, node: Any, args: list, kwargs: dict) -> Tensor:
        table, idx = self.tensor(args[0], node.name), args[1]
        if isinstance(idx, Tensor):
            if idx.name in self.b.input_init and self.b.input_init[idx.name].get("init") == "index":
                self.b.input_init[idx.name]["high"] = max(int(self.b.input_init[idx.name]["high"]), table.shape[0])
        else:
            idx = self.tensor(idx, node.name + ".index")
        table = _retile(self.b, table, (1, table.grid[1]), self._fresh(node.name + ".rows"))
        shape = (*idx.shape, table.shape[1])
        grid = (*idx.grid, table.grid[1])
        r = len(idx.shape)
        return self.b.blockwise(self._fresh(node.name), OpKind.SELECT, "embedding", shape, grid,
                                lambda blk: [dict(table.tiles[(0, blk[r])]), dict(idx.tiles[blk[:r]])])  # fmt: skip

    # ------------------------------------------------------------------ layout ops
    def _reshape(self, node: Any, args: list, kwargs: dict) -> Any:
        shape = [int(s) for s in node.meta["val"].shape]
        if isinstance(args[0], _Bcast):
            repeated = self._repeat_of(args[0], shape, node)
            if repeated is not None:
                return repeated
        x = self.tensor(args[0], node.name)
        return _view(self.b, x, shape, self._fresh(node.name))

    def _unsqueeze(self, node: Any, args: list, kwargs: dict) -> Any:
        if isinstance(args[0], _Expr) and args[0].uses == 1:
            return self._unsqueezed(args[0], [int(args[1]) % (len(args[0].shape) + 1)], node)
        return self._reshape(node, args, kwargs)

    def _expand(self, node: Any, args: list, kwargs: dict) -> Any:
        """A broadcast, not copied (:class:`_Bcast`)."""
        x = args[0].src if isinstance(args[0], _Bcast) else args[0]
        if isinstance(x, _Repeat) or (isinstance(x, _Expr) and x.uses != 1):
            x = self.tensor(x, node.name)
        shape = tuple(int(s) for s in node.meta["val"].shape)
        if tuple(x.shape) == shape:
            return x
        if len(shape) > len(x.shape):
            x = self._unsqueezed(x, list(range(len(shape) - len(x.shape))), node)
        if any(s not in (1, t) for s, t in zip(x.shape, shape)):
            raise GraphImportError(f"expand from {list(x.shape)} to {list(shape)}")
        return _Bcast(x, shape)

    def _repeat_of(self, x: _Bcast, shape: Sequence[int], node: Any) -> _Repeat | None:
        """``x`` reshaped to ``shape`` as a :class:`_Repeat`, if that reshape merges its one broadcast axis
        into the axis before it (``repeat_kv``: (b, g, 1, s, e) -> (b, g, r, s, e) -> (b, g * r, s, e))."""
        axes = [a for a, (s, t) in enumerate(zip(x.src.shape, x.shape)) if s == 1 and t > 1]
        if len(axes) != 1 or axes[0] == 0:
            return None
        a = axes[0]
        if list(shape) != [*x.shape[: a - 1], x.shape[a - 1] * x.shape[a], *x.shape[a + 1 :]]:
            return None
        src = self.tensor(x.src, node.name)
        src = _view(self.b, src, [s for i, s in enumerate(src.shape) if i != a], self._fresh(node.name + ".groups"))
        return _Repeat(src, a - 1, x.shape[a])

    def _permute(self, node: Any, args: list, kwargs: dict) -> Tensor:
        return _permute(self.tensor(args[0], node.name), list(args[1]))

    def _transpose(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        perm = list(range(len(x.shape)))
        a, c = int(args[1]) % len(perm), int(args[2]) % len(perm)
        perm[a], perm[c] = perm[c], perm[a]
        return _permute(x, perm)

    def _t(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        return _permute(x, list(range(len(x.shape)))[::-1])

    def _slice(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        dim = int(args[1] if len(args) > 1 else 0) % len(x.shape)
        start = args[2] if len(args) > 2 and args[2] is not None else 0
        end = args[3] if len(args) > 3 and args[3] is not None else x.shape[dim]
        step = args[4] if len(args) > 4 else 1
        if step != 1:
            raise GraphImportError(f"slices with a step ({step}) are not supported")
        n = x.shape[dim]
        start, end = (int(start) + n if int(start) < 0 else int(start)), (int(end) + n if int(end) < 0 else int(end))
        y = _slice(self.b, x, dim, start, min(end, n), self._fresh(node.name))
        self.slices[id(y)] = (y, x, dim, start, min(end, n))
        return y

    def _select(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        dim = int(args[1]) % len(x.shape)
        i = int(args[2]) % x.shape[dim]
        y = _slice(self.b, x, dim, i, i + 1, self._fresh(node.name))
        return _view(self.b, y, [s for a, s in enumerate(y.shape) if a != dim] or [1], self._fresh(node.name + ".sq"))

    def _split(self, node: Any, args: list, kwargs: dict) -> list[Tensor]:
        x = self.tensor(args[0], node.name)
        dim = int(args[2] if len(args) > 2 else kwargs.get("dim", 0)) % len(x.shape)
        n = x.shape[dim]
        if _target(node) in ("aten.split.Tensor", "aten.chunk.default"):
            size = int(args[1]) if _target(node) == "aten.split.Tensor" else -(-n // int(args[1]))
            sizes = [min(size, n - lo) for lo in range(0, n, size)]
        else:
            sizes = [int(s) for s in args[1]]
        ends = itertools.accumulate(sizes)
        return [_slice(self.b, x, dim, lo - s, lo, self._fresh(f"{node.name}.{k}"))
                for k, (s, lo) in enumerate(zip(sizes, ends))]  # fmt: skip

    def _rotate_half_of(self, parts: list, dim: int) -> Tensor | None:
        """``x`` if ``parts`` is ``[-x[..., h:], x[..., :h]]`` along the last axis (rotary's rotate_half)."""
        if len(parts) != 2 or not isinstance(parts[0], _Expr) or not isinstance(parts[1], Tensor):
            return None
        a, b = parts
        if a.uses != 1 or a.tensor is not None or len(a.steps) != 1 or a.steps[0][0] != "neg" or len(a.leaves) != 1:
            return None
        sa, sb = self.slices.get(id(a.leaves[0][0])), self.slices.get(id(b))
        if sa is None or sb is None or sa[0] is not a.leaves[0][0] or sb[0] is not b or sa[1] is not sb[1]:
            return None
        x, last = sa[1], len(sa[1].shape) - 1
        h = x.shape[last] // 2
        if dim != last or x.shape[last] % 2 or sa[2:] != (last, h, 2 * h) or sb[2:] != (last, 0, h):
            return None
        return x

    def _stack(self, node: Any, args: list, kwargs: dict) -> Any:
        """``torch.stack``: each tensor with a size-1 axis at ``dim``, concatenated along it."""
        ts = [self.tensor(t, f"{node.name}.{k}") for k, t in enumerate(args[0])]
        dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0)) % (len(ts[0].shape) + 1)
        parts = [_view(self.b, t, [*t.shape[:dim], 1, *t.shape[dim:]], self._fresh(f"{node.name}.{k}.unsqueeze"))
                 for k, t in enumerate(ts)]  # fmt: skip
        return self._cat(node, [parts, dim], {})

    def _cat(self, node: Any, args: list, kwargs: dict) -> Any:
        rank = len(args[0][0].shape)
        dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0)) % rank
        x = self._rotate_half_of(list(args[0]), dim)
        if x is not None:
            return self._ew("rotate_half", [x], node)
        ts = [self.tensor(t, f"{node.name}.{k}") for k, t in enumerate(args[0])]
        ts = [t for t in ts if math.prod(t.shape) > 0]
        shape = list(ts[0].shape)
        shape[dim] = sum(t.shape[dim] for t in ts)
        grid = [math.gcd(*(t.grid[a] for t in ts)) if a != dim else 1 for a in range(len(shape))]
        starts = itertools.accumulate((t.shape[dim] for t in ts), initial=0)
        sources = [(t, [lo if a == dim else 0 for a in range(len(shape))]) for t, lo in zip(ts, starts)]
        return self.b.assemble(self._fresh(node.name), shape, grid, sources)


def model_inputs(graph: DataflowGraph, module: Any, example: Sequence[Any]) -> dict[str, np.ndarray]:
    """The real input arrays of an imported graph: the module's parameters, the example inputs
    and the recorded constants (float64; for checking the graph against the module)."""
    named = {k: v for k, v in module.named_parameters(remove_duplicate=False)}
    out: dict[str, np.ndarray] = {}
    for name, how in graph.meta["input_init"].items():
        if how.get("init") == "value":
            out[name] = np.asarray(how["data"], dtype=np.float64)
        elif name in named:
            out[name] = named[name].detach().double().numpy()
    for name, x in zip(graph.meta.get("user_inputs", []), example):
        out[name] = x.detach().double().numpy()
    missing = sorted(set(graph.meta["inputs"]) - set(out))
    if missing:
        raise GraphImportError(f"the module has no value for graph input(s) {', '.join(missing)}")
    return out


def lower_program(ep: Any, *, blocks: Mapping[int, int] | None = None, dtype: str = "float32",
                  name: str = "imported") -> DataflowGraph:  # fmt: skip
    """Lower an exported program into a tile-level :class:`DataflowGraph` (see the module docstring)."""
    return _Lowering(ep, blocks or {}, dtype, name).run()


def parameter_dtype(ep: Any) -> str:
    """The element type most of an exported program's parameter elements have (``"float16"`` for a model
    cast with ``.half()``), if it is one a graph counts bytes in; else ``"float32"``."""
    count: Counter = Counter()
    for spec in ep.graph_signature.input_specs:
        value = ep.state_dict.get(spec.target) if spec.kind.name == "PARAMETER" else None
        if value is not None:
            count[str(value.dtype).removeprefix("torch.")] += value.numel()
    dtype = count.most_common(1)[0][0] if count else "float32"
    return dtype if dtype in ("float16", "bfloat16", "float32", "float64") else "float32"


def checkpoint_keys(module: Any) -> dict[str, str]:
    """``state_dict`` key -> the key a Hugging Face ``save_pretrained`` checkpoint stores it under, where the two
    differ: transformers renames some parameters on saving (GPT-NeoX's ``lm_head.weight`` is
    ``embed_out.weight`` on disk). Only renames are listed: a parameter that saving splits or merges with others
    has no key of its own there. Empty for a module that is not a ``transformers`` model."""
    if not hasattr(module, "save_pretrained") or "transformers" not in sys.modules:
        return {}
    try:
        from transformers.core_model_loading import revert_weight_conversion

        state = dict(module.state_dict())
        saved = revert_weight_conversion(module, dict(state))
    except Exception:  # an older transformers, or a conversion that needs real values: no renames known
        return {}
    key_of = {id(t): k for k, t in saved.items()}
    return {k: key_of[id(t)] for k, t in state.items() if key_of.get(id(t), k) != k}


def import_model(source: str, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 blocks: Mapping[int, int] | None = None, dtype: str | None = None,
                 devices: int | None = None) -> DataflowGraph:  # fmt: skip
    """``doppler graph import``: a factory (``module:function``) or a ``.pt2`` file -> a graph whose bytes
    are counted in ``dtype`` (default: the parameters' own, :func:`parameter_dtype`)."""
    renames: dict[str, str] = {}
    if source.endswith(".pt2"):
        if input_shapes:
            raise GraphImportError(f"{source}: --input-shape applies to factories; a .pt2 program has fixed shapes")
        ep = load_pt2(Path(source))
    else:
        module, example = load_factory(source)
        ep, _ = export_model(module, example, input_shapes)
        renames = checkpoint_keys(module)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(source).stem if source.endswith(".pt2") else source.rpartition(":")[2])
    if not blocks and devices:
        blocks = auto_blocks(ep, devices)
    graph = lower_program(ep, blocks=blocks, dtype=dtype or parameter_dtype(ep), name=name)
    for how in graph.meta["weights"].values():
        if how["key"] in renames:
            how["saved_as"] = [renames[how["key"]]]
    graph.meta["params"] = {"source": source, "blocks": {str(k): v for k, v in sorted((blocks or {}).items())}}
    if devices is not None:
        graph.meta["devices"] = int(devices)
    return graph
