"""Lower a ``torch.export`` program to a tile-level dataflow graph (``doppler graph import``).

Every ATen op of the exported program is lowered onto the same :class:`~doppler.workloads.tiling.TileBuilder` the
built-in workloads use (the :class:`~doppler.importer.layout.Builder`), so each tensor op becomes a group
of tile ops with real shapes, FLOPs, bytes and a kernel spec the engine runs. :class:`_Lowering` holds
one handler per ATen op: an op with no handler fails the whole import, before anything is built, with one
message that lists every such op and how often it occurs.

* **Inputs.** Parameters, the user's inputs and constants become graph inputs (pre-loaded on
  every device, as in the built-in workloads). Buffers are *known values*: everything computed
  from buffers and shapes alone (rotary tables, causal masks, position ids) is evaluated at
  import time, and what the model reads of it becomes a recorded constant input.
* **The meta device.** A model built there has no values: no weight is read, what is computed from
  its buffers is evaluated on the meta device (shapes only) and read as an input of known shape with
  no value, what is computed from shapes alone (a causal mask) is still evaluated, and the graph is
  *cost-only* (``meta["cost_only"]``): the same ops, costs and modules, nothing to execute.
* **Weights by name.** ``meta["weights"]`` maps every parameter input to its ``state_dict`` key, shape,
  element type, the keys tied to it and the key a Hugging Face checkpoint saves it under where that
  differs; the op specs' operand references say which slice of it each tile reads (``{"input",
  "slice"}``, in the parameter's own layout, with a transpose as an ``xform`` step), so ``doppler execute
  --weights`` loads each tile from a checkpoint. A model built under
  :func:`~doppler.importer.sources.parameters_on_meta` has no weights but real buffers: what it computes
  from them is recorded.
* **Modules.** Every op records the module it runs in (``nn_module_stack``), named as
  ``named_modules()`` names it (:func:`module_path`).
* **Tiling and layout** are :mod:`doppler.importer.layout`'s (zero-FLOP ops become layout steps on
  their consumers' operands), **elementwise chains and grouped-query attention**
  :mod:`doppler.importer.fusion`'s (one fused op per chain; a key/value tile read once per group).

:func:`import_model` is the whole command: a source (:mod:`doppler.importer.sources`) exported, a tiling
chosen, the program lowered, the weights' saved keys recorded.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from doppler.ir.graph import NO_VALUES, NO_WEIGHTS, DataflowGraph, OpKind
from doppler.importer.errors import GraphImportError, one_line
from doppler.importer.fusion import Bcast, Expr, Fusion, Repeat, is_square
from doppler.importer.layout import LETTERS, Builder, auto_blocks, permute, retile, slice_axis, unify, view
from doppler.importer.sources import (WRAPPED, checkpoint_keys, export_model, load_factory, load_pt2,
                                      parameter_dtype)
from doppler.workloads.tiling import Tensor, WorkloadError, tiled_softmax

__all__ = ["MAX_FOLDED_ELEMENTS", "MAX_RECORDED_ELEMENTS", "import_model",
           "lower_program", "mean_std", "model_inputs", "module_path"]

#: the largest constant (in elements) recorded inside a graph file
MAX_RECORDED_ELEMENTS = 1 << 20
#: the elements of a weight whose mean and spread are taken in float64 at a time (a larger weight is taken a chunk at
#: a time, never copied whole in float64: a ``.pt2`` may hold 1 GiB of weights)
STATS_CHUNK = 1 << 22
#: the largest tensor (in elements) evaluated at import time (a causal mask of 16k x 16k positions)
MAX_FOLDED_ELEMENTS = 1 << 28


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
_UNARY = {"aten.expm1.default": "expm1", "aten.neg.default": "neg", "aten.silu.default": "silu",
          "aten.relu.default": "relu",
          "aten.tanh.default": "tanh", "aten.exp.default": "exp", "aten.rsqrt.default": "rsqrt",
          "aten.sqrt.default": "sqrt", "aten.sigmoid.default": "sigmoid"}  # fmt: skip
_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul", "aten.div.Tensor": "div",
           "aten.add.Scalar": "add", "aten.sub.Scalar": "sub", "aten.mul.Scalar": "mul", "aten.div.Scalar": "div",
           "aten.rsub.Scalar": "rsub"}  # fmt: skip

#: ops that choose by value what is computed next (top-k routing, sorting tokens by expert, writing at computed
#: positions): a graph of them depends on the data, not only on the shapes
_ROUTING = {"aten.topk.default", "aten.sort.default", "aten.argsort.default", "aten.histc.default",
            "aten.nonzero.default", "aten.index_put_.default", "aten.index_put.default", "aten.masked_scatter.default",
            "aten.bincount.default", "aten.where.default"}  # fmt: skip
#: in-place elementwise ops (``x += y``) -> the op each is the in-place form of
_INPLACE = {".".join([t.split(".")[0], t.split(".")[1] + "_", *t.split(".")[2:]]): t for t in (*_UNARY, *_BINARY)
            if t != "aten.rsub.Scalar"}  # fmt: skip
#: ops whose result is a view of their first argument (it shares its storage)
_VIEWS = {
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.flatten.using_ints",
    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.numpy_T.default", "aten.slice.Tensor",
    "aten.select.int", "aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
    "aten.expand.default", "aten.alias.default", "aten.detach.default", "aten.as_strided.default",
    "aten.unfold.default", "aten.diagonal.default", "<built-in function getitem>",
}  # fmt: skip

#: what a lowering handler raises on arguments of shapes or values it was not written for
_MALFORMED = (ArithmeticError, ValueError, TypeError, IndexError, KeyError, AttributeError, RuntimeError)


def _target(node: Any) -> str:
    return str(node.target)


def _masks_only(mask: Any) -> bool:
    """Is ``mask`` a known additive attention mask of 0 and -inf only (a scale applied to the scores plus it
    changes nothing)? A mask of other values (ALiBi's biases) or computed at run time is not; one with no
    values (on the meta device) is taken to be, for the cost is the same."""
    import torch

    if not isinstance(mask, torch.Tensor):
        return False
    return bool(mask.is_meta or ((mask == 0) | (mask == float("-inf"))).all())


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


class _Lowering(Fusion):
    """State of one lowering: the builder, values per FX node, and the buffers' known values."""

    def __init__(self, ep: Any, blocks: Mapping[int, int], dtype: str, name: str) -> None:
        self.ep = ep
        self.blocks = dict(blocks)
        self.b = Builder("import", dtype)  # meta["workload"]: not a built-in workload's name
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
            "aten.baddbmm.default": self._addmm, "aten.index.Tensor": self._index,
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
            "aten.expand.default": self._expand, "aten.broadcast_to.default": self._expand,
            "aten.square.default": self._square, "aten.unbind.int": self._unbind,
            "aten.softplus.default": self._softplus, "<built-in function getitem>": self._getitem,
        }  # fmt: skip
        self.handlers |= {**{f"aten.where.{t}": self._where for t in ("self", "ScalarOther", "ScalarSelf", "Scalar")},
                          **{f"aten.masked_fill.{t}": self._masked_fill for t in ("Scalar", "Tensor")},
                          **{f"aten.{op}.Scalar": self._compare for op in ("gt", "lt")},
                          **dict.fromkeys(("aten.maximum.default", "aten.max.other", "aten.minimum.default",
                                           "aten.min.other"), self._extremum),
                          **dict.fromkeys(("aten.clamp.default", "aten.clamp_min.default",
                                           "aten.clamp_max.default"), self._clamp)}  # fmt: skip
        self.handlers |= {**dict.fromkeys(_UNARY, self._unary), **dict.fromkeys(_BINARY, self._binary),
                          **dict.fromkeys(_IDENTITY, self._identity),
                          **dict.fromkeys(_INPLACE, self._inplace)}  # fmt: skip

    # ------------------------------------------------------------------ values
    def grid(self, shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.blocks.get(int(s), 1) for s in shape)

    def input_tensor(self, name: str, value: Any, init: dict[str, Any]) -> Tensor:
        shape = tuple(int(s) for s in value.shape) or (1,)
        return self.b.input(self.b.fresh(name), shape, self.grid(shape), init)

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
            routed = sorted(t for t in missing if t in _ROUTING)
            why = (f"; {', '.join(routed)}: the model picks what to compute from the values at run time (a mixture of "
                   "experts routes each token to its top-k experts), which a static dataflow graph cannot express"
                   if routed else "")  # fmt: skip
            raise GraphImportError(f"unsupported ops, nothing imported: {listed}{why}")
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
                                               f"({one_line(e)})") from None  # fmt: skip
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
            raise GraphImportError(f"op {node.name} ({_target(node)}): cannot evaluate a constant ({one_line(e)})") from None

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
            if isinstance(v, Expr):
                v = self._emit(v)
            if not isinstance(v, Tensor):
                continue
            name = specs[k].arg.name if k < len(specs) else f"out{k}"
            if any("op" not in r or "xform" in r for r in v.tiles.values()):
                v = self.b.assemble(self.b.fresh(f"{name}.copy"), v.shape, v.grid, [(v, [0] * len(v.shape))])
                if any("op" not in r or "xform" in r for r in v.tiles.values()):  # whole tiles: force a copy
                    v = self._copy(v, f"{name}.copy")
            self.b.output(name, v)

    # ------------------------------------------------------------------ ops
    def _identity(self, node: Any, args: list, kwargs: dict) -> Any:
        return args[0]

    def _getitem(self, node: Any, args: list, kwargs: dict) -> Any:
        return args[0][args[1]]

    def _einsum_op(self, eq: str, ts: list[Tensor], node: Any, kind: OpKind = OpKind.MATMUL) -> Tensor:
        ins = eq.split("->")[0].split(",")
        ts = unify(self.b, list(zip(ts, ins)), self.b.fresh(node.name))
        return self.b.contract(eq, *ts, name=self.b.fresh(node.name), kind=kind)

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

    def _addmm(self, node: Any, args: list, kwargs: dict) -> Any:
        """``addmm`` and ``baddbmm``: ``beta * input + alpha * (a @ b)`` (BLOOM adds its ALiBi biases so)."""
        beta, alpha = float(kwargs.get("beta", 1)), float(kwargs.get("alpha", 1))
        y = self._mm(node, [args[1], args[2]], {})
        if alpha != 1:
            y = self._ew("scale", [y], node, {"c": alpha})
        if beta == 0:  # torch ignores the input then (even its NaNs)
            return y
        bias = args[0] if beta == 1 else self._ew("scale", [args[0]], node, {"c": beta})
        return self._ew("add", [y, bias], node)

    def _einsum(self, node: Any, args: list, kwargs: dict) -> Tensor:
        eq = str(args[0]).replace(" ", "")
        if "..." in eq or "->" not in eq:
            raise GraphImportError(f"einsum {eq!r}: write it with explicit output subscripts and no '...'")
        return self._einsum_op(eq, [self.tensor(t, node.name) for t in args[1]], node)

    # ------------------------------------------------------------------ elementwise (fused)
    def _unary(self, node: Any, args: list, kwargs: dict) -> "Expr":
        return self._ew(_UNARY[_INPLACE.get(_target(node), _target(node))], [args[0]], node)

    def _inplace(self, node: Any, args: list, kwargs: dict) -> Tensor:
        """``x += y`` (and the other in-place elementwise ops) on a tensor the model computed: the op's result,
        which every later reader of ``x`` reads too. The in-place op on a view (it would write into the tensor
        viewed), on a tensor some view was taken of, or on an input or parameter is refused."""
        base = node.args[0]
        shared = [u for u in getattr(base, "users", ()) if u is not node and _target(u) in _VIEWS]
        computed = getattr(base, "op", "") == "call_function"
        if not computed or _target(base) in _VIEWS or shared:
            what = ("an input or parameter" if not computed else "a view of another tensor"
                    if _target(base) in _VIEWS else "a tensor that is also viewed")  # fmt: skip
            raise GraphImportError(f"an in-place op on {what} (it would change what the other names read)")
        t = _INPLACE[_target(node)]
        out = self.tensor((self._binary if t in _BINARY else self._unary)(node, args, kwargs), node.name)
        self.env[base] = out
        return out

    def _gelu(self, node: Any, args: list, kwargs: dict) -> "Expr":
        fn = "gelu_tanh" if kwargs.get("approximate", args[1] if len(args) > 1 else "none") == "tanh" else "gelu"
        return self._ew(fn, [args[0]], node)

    def _pow(self, node: Any, args: list, kwargs: dict) -> "Expr":
        return self._ew("pow", [args[0]], node, {"c": float(args[1])})

    def _square(self, node: Any, args: list, kwargs: dict) -> "Expr":
        return self._ew("pow", [args[0]], node, {"c": 2.0})

    def _number(self, v: Any) -> float | str | None:
        """:meth:`_scalar_of` as a map parameter: a non-finite number as ``"inf"``, ``"-inf"`` or ``"nan"`` (a
        graph file holds no such JSON number)."""
        x = self._scalar_of(v)
        return x if x is None or math.isfinite(x) else str(x)

    def _where(self, node: Any, args: list, kwargs: dict) -> "Expr":
        """``torch.where(cond, a, b)``: the condition as 1 and 0 (a known mask is recorded so); a number for
        ``a`` or ``b`` is a parameter (eager attention's ``where(causal, scores, min)``)."""
        cond, a, b = args[0], args[1], args[2]
        na, nb = self._number(a), self._number(b)
        if na is not None and nb is not None:
            raise GraphImportError("torch.where between two numbers reached the graph")
        if nb is not None:
            return self._ew("where_scalar", [cond, a], node, {"c": nb})
        if na is not None:
            return self._ew("rwhere_scalar", [cond, b], node, {"c": na})
        return self._ew("where", [cond, a, b], node)

    def _masked_fill(self, node: Any, args: list, kwargs: dict) -> "Expr":
        """``x.masked_fill(mask, value)``: ``value`` where ``mask``, else ``x``."""
        value = self._number(args[2])
        if value is None:
            raise GraphImportError("masked_fill with a value that is not one known number")
        return self._ew("rwhere_scalar", [args[1], args[0]], node, {"c": value})

    def _extremum(self, node: Any, args: list, kwargs: dict) -> "Expr":
        """``torch.maximum``/``minimum`` (``max``/``min`` of two tensors), with a number as a parameter."""
        high = _target(node).split(".")[1] in ("maximum", "max")
        a, c = args[0], args[1]
        na, nc = self._number(a), self._number(c)
        if na is not None and nc is not None:
            raise GraphImportError("the maximum or minimum of two numbers reached the graph")
        if na is not None or nc is not None:
            return self._ew("max_scalar" if high else "min_scalar", [c if na is not None else a], node,
                            {"c": na if na is not None else nc})  # fmt: skip
        return self._ew("maximum" if high else "minimum", [a, c], node)

    def _clamp(self, node: Any, args: list, kwargs: dict) -> Any:
        """``clamp``/``clamp_min``/``clamp_max`` by numbers (OLMo clips its query, key and value so)."""
        kind = _target(node).split(".")[1]
        low = args[1] if len(args) > 1 and kind != "clamp_max" else kwargs.get("min")
        high = (args[2] if len(args) > 2 else kwargs.get("max")) if kind == "clamp" else (
            args[1] if kind == "clamp_max" else None)  # fmt: skip
        y = args[0]
        for bound, fn in ((low, "max_scalar"), (high, "min_scalar")):
            if bound is not None:
                c = self._number(bound)
                if c is None:
                    raise GraphImportError(f"{kind} by a bound that is not one known number")
                y = self._ew(fn, [y], node, {"c": c})
        return y

    def _compare(self, node: Any, args: list, kwargs: dict) -> "Expr":
        """``x > c``, ``x < c``: 1 and 0 (for a ``where``)."""
        c = self._number(args[1])
        if c is None:
            raise GraphImportError("a comparison with something other than a number")
        return self._ew("gt_scalar" if _target(node) == "aten.gt.Scalar" else "lt_scalar", [args[0]], node, {"c": c})

    def _softplus(self, node: Any, args: list, kwargs: dict) -> "Expr":
        beta = float(args[1] if len(args) > 1 else kwargs.get("beta", 1.0))
        threshold = float(args[2] if len(args) > 2 else kwargs.get("threshold", 20.0))
        return self._ew("softplus", [args[0]], node, {"beta": beta, "threshold": threshold})

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

    def _binary(self, node: Any, args: list, kwargs: dict) -> "Expr":
        fn = _BINARY[_INPLACE.get(_target(node), _target(node))]
        a, c = args[0], args[1]
        alpha = float(kwargs.get("alpha", args[2] if len(args) > 2 else 1))
        if fn == "rsub":
            fn, a, c = "sub", c, a
        sa, sc = self._scalar_of(a), self._scalar_of(c)
        if sa is not None and sc is not None:
            raise GraphImportError("an op on two scalars reached the graph")
        if sc is not None:
            how = {"add": ("add_scalar", alpha * sc), "sub": ("add_scalar", -alpha * sc), "mul": ("scale", sc),
                   "div": ("scale", 1.0 / sc if sc else math.copysign(math.inf, sc))}[fn]  # fmt: skip
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
        name = self.b.fresh(node.name)
        if how == "sum" and is_square(x):  # sum of squares: one contraction of x with itself (as RMSNorm)
            leaf = self.tensor(x.leaves[0][0], node.name)
            y = self.b.contract(f"{t},{t}->{kept}", leaf, leaf, name=name, kind=OpKind.NORM)
        else:
            y = self.b.reduce(f"{t}->{kept}", self.tensor(x, node.name), how=how, name=name, kind=OpKind.REDUCE)
        if _target(node) == "aten.mean.dim":
            y = self._ew("scale", [y], node, {"c": 1.0 / math.prod(x.shape[d] for d in dims)})
        if keepdim:
            return self._unsqueezed(y, sorted(dims), node)
        return y

    def _softmax_op(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        t = LETTERS[: len(x.shape)]
        axis = t[int(args[1]) % len(t)]
        return tiled_softmax(self.b, x, t, axis, scale=1.0, name=self.b.fresh(node.name))

    def _layer_norm(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        shape = list(args[1])
        w, bias = (args[2] if len(args) > 2 else None), (args[3] if len(args) > 3 else None)
        eps = float(args[4] if len(args) > 4 else kwargs.get("eps", 1e-5))
        if len(shape) != 1:
            raise GraphImportError(f"layer_norm over {len(shape)} axes (only the last axis is supported)")
        t = LETTERS[: len(x.shape)]
        rows, n, name = t[:-1], shape[0], self.b.fresh(node.name)
        s = self.b.reduce(f"{t}->{rows}", x, name=f"{name}.sum", kind=OpKind.NORM)
        mu = self.b.map("scale", f"{rows}->{rows}", s, name=f"{name}.mean", kind=OpKind.NORM, params={"c": 1.0 / n})
        xc = self.b.map("sub", f"{t},{rows}->{t}", x, mu, name=f"{name}.center", kind=OpKind.NORM)
        ss = self.b.contract(f"{t},{t}->{rows}", xc, xc, name=f"{name}.sumsq", kind=OpKind.NORM)
        import torch

        w_t = self.tensor(w if w is not None else torch.ones(n), node.name + ".weight")
        sname = self.b.fresh(node.name + ".scale")
        ts = unify(self.b, [(xc, t), (ss, rows), (w_t, t[-1])], sname)
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
        name = self.b.fresh(node.name)
        grouped = G != H
        if grouped:
            q = view(self.b, q, [B, G, H // G, S, E], self.b.fresh(node.name + ".groups"))
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
            if scale != 1 and not _masks_only(mask):  # softmax(scale * qk + mask): the mask is not scaled
                scores, scale = self._ew("scale", [scores], node, {"c": scale}), 1.0
            scores = self._emit(self._ew("add", [scores, self._grouped_mask(mask, H, G, node) if grouped else mask],
                                         node))  # fmt: skip
        probs = tiled_softmax(self.b, scores, st, "k", scale=scale, name=f"{name}.softmax")
        out = self._einsum_op(f"{st},{vt}->{ot}", [probs, v], node)
        return view(self.b, out, [B, H, S, v.shape[3]], self.b.fresh(node.name + ".heads")) if grouped else out

    def _kv_groups(self, k: Any, v: Any, heads: int, gqa: bool, node: Any) -> tuple[Tensor, Tensor]:
        """Attention's keys and values with one head per group: the sources of ``repeat_kv``'s repeats, or
        the tensors themselves (as many heads as the queries, one that broadcasts over them, or fewer with
        ``enable_gqa``)."""
        if isinstance(k, Repeat) and isinstance(v, Repeat) and k.axis == v.axis == 1 and k.rep == v.rep:
            return k.src, v.src
        k, v = self.tensor(k, node.name), self.tensor(v, node.name)
        groups = k.shape[1]  # one key/value head broadcasts over every query head (multi-query attention)
        if v.shape[1] != groups or heads % groups or (groups not in (1, heads) and not gqa):
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
        return view(self.b, self.tensor(mask, node.name + ".mask"), five, self.b.fresh(node.name + ".mask"))

    def _embedding(self, node: Any, args: list, kwargs: dict) -> Tensor:
        table, idx = self.tensor(args[0], node.name), args[1]
        if isinstance(idx, Tensor):
            if idx.name in self.b.input_init and self.b.input_init[idx.name].get("init") == "index":
                self.b.input_init[idx.name]["high"] = max(int(self.b.input_init[idx.name]["high"]), table.shape[0])
        else:
            idx = self.tensor(idx, node.name + ".index")
        table = retile(self.b, table, (1, table.grid[1]), self.b.fresh(node.name + ".rows"))
        shape = (*idx.shape, table.shape[1])
        grid = (*idx.grid, table.grid[1])
        r = len(idx.shape)
        return self.b.blockwise(self.b.fresh(node.name), OpKind.SELECT, "embedding", shape, grid,
                                lambda blk: [dict(table.tiles[(0, blk[r])]), dict(idx.tiles[blk[:r]])])  # fmt: skip

    # ------------------------------------------------------------------ layout ops
    def _reshape(self, node: Any, args: list, kwargs: dict) -> Any:
        shape = [int(s) for s in node.meta["val"].shape]
        if isinstance(args[0], Bcast):
            repeated = self._repeat_of(args[0], shape, node)
            if repeated is not None:
                return repeated
        x = self.tensor(args[0], node.name)
        return view(self.b, x, shape, self.b.fresh(node.name))

    def _unsqueeze(self, node: Any, args: list, kwargs: dict) -> Any:
        if isinstance(args[0], Expr) and args[0].uses == 1:
            return self._unsqueezed(args[0], [int(args[1]) % (len(args[0].shape) + 1)], node)
        return self._reshape(node, args, kwargs)

    def _expand(self, node: Any, args: list, kwargs: dict) -> Any:
        """A broadcast, not copied (:class:`Bcast`)."""
        x = args[0].src if isinstance(args[0], Bcast) else args[0]
        if isinstance(x, Repeat) or (isinstance(x, Expr) and x.uses != 1):
            x = self.tensor(x, node.name)
        shape = tuple(int(s) for s in node.meta["val"].shape)
        if tuple(x.shape) == shape:
            return x
        if len(shape) > len(x.shape):
            x = self._unsqueezed(x, list(range(len(shape) - len(x.shape))), node)
        if any(s not in (1, t) for s, t in zip(x.shape, shape)):
            raise GraphImportError(f"expand from {list(x.shape)} to {list(shape)}")
        return Bcast(x, shape)

    def _repeat_of(self, x: Bcast, shape: Sequence[int], node: Any) -> Repeat | None:
        """``x`` reshaped to ``shape`` as a :class:`Repeat`, if that reshape merges its one broadcast axis
        into the axis before it (``repeat_kv``: (b, g, 1, s, e) -> (b, g, r, s, e) -> (b, g * r, s, e))."""
        axes = [a for a, (s, t) in enumerate(zip(x.src.shape, x.shape)) if s == 1 and t > 1]
        if len(axes) != 1 or axes[0] == 0:
            return None
        a = axes[0]
        if list(shape) != [*x.shape[: a - 1], x.shape[a - 1] * x.shape[a], *x.shape[a + 1 :]]:
            return None
        src = self.tensor(x.src, node.name)
        src = view(self.b, src, [s for i, s in enumerate(src.shape) if i != a], self.b.fresh(node.name + ".groups"))
        return Repeat(src, a - 1, x.shape[a])

    def _permute(self, node: Any, args: list, kwargs: dict) -> Tensor:
        return permute(self.tensor(args[0], node.name), list(args[1]))

    def _transpose(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        perm = list(range(len(x.shape)))
        a, c = int(args[1]) % len(perm), int(args[2]) % len(perm)
        perm[a], perm[c] = perm[c], perm[a]
        return permute(x, perm)

    def _t(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        return permute(x, list(range(len(x.shape)))[::-1])

    def _slice(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        dim = int(args[1] if len(args) > 1 else 0) % len(x.shape)
        start = args[2] if len(args) > 2 and args[2] is not None else 0
        end = args[3] if len(args) > 3 and args[3] is not None else x.shape[dim]
        step = int(args[4] if len(args) > 4 else 1)
        n = x.shape[dim]
        start, end = (int(start) + n if int(start) < 0 else int(start)), (int(end) + n if int(end) < 0 else int(end))
        start, end = max(0, min(start, n)), max(0, min(end, n))
        if step != 1:
            return self._strided(x, dim, start, end, step, node)
        y = slice_axis(self.b, x, dim, start, end, self.b.fresh(node.name))
        self.slices[id(y)] = (y, x, dim, start, end)
        return y

    def _strided(self, x: Tensor, dim: int, start: int, end: int, step: int, node: Any) -> Tensor:
        """``x[start:end:step]`` on axis ``dim`` as layout steps (no op): the span of ``count`` whole steps
        from ``base = start - start % step`` viewed as (count, step), and column ``start % step`` of it taken
        (GPT-J's interleaved rotary embedding reads ``x[..., ::2]`` and ``x[..., 1::2]``). A span that runs
        past the axis (its last step short) is refused."""
        count = len(range(start, end, step))
        if step < 1 or count == 0:
            raise GraphImportError(f"a slice {start}:{end}:{step} of an axis of {x.shape[dim]}")
        col = start % step
        base = start - col
        if base + count * step > x.shape[dim]:
            raise GraphImportError(f"a slice {start}:{end}:{step} of an axis of {x.shape[dim]} whose last step runs "
                                   f"past its end")  # fmt: skip
        name = self.b.fresh(node.name)
        span = slice_axis(self.b, x, dim, base, base + count * step, f"{name}.span")
        rows = view(self.b, span, [*x.shape[:dim], count, step, *x.shape[dim + 1 :]], f"{name}.rows")
        taken = slice_axis(self.b, rows, dim + 1, col, col + 1, f"{name}.col")
        return view(self.b, taken, [*x.shape[:dim], count, *x.shape[dim + 1 :]], f"{name}.strided")

    def _select(self, node: Any, args: list, kwargs: dict) -> Tensor:
        x = self.tensor(args[0], node.name)
        dim = int(args[1]) % len(x.shape)
        i = int(args[2]) % x.shape[dim]
        y = slice_axis(self.b, x, dim, i, i + 1, self.b.fresh(node.name))
        return view(self.b, y, [s for a, s in enumerate(y.shape) if a != dim] or [1], self.b.fresh(node.name + ".sq"))

    def _unbind(self, node: Any, args: list, kwargs: dict) -> list[Tensor]:
        """``q, k, v = x.unbind(dim)``: a select per index, each a layout step."""
        x = self.tensor(args[0], node.name)
        dim = int(args[1] if len(args) > 1 else kwargs.get("dim", 0)) % len(x.shape)
        return [self._select(node, [x, dim, i], {}) for i in range(x.shape[dim])]

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
        return [slice_axis(self.b, x, dim, lo - s, lo, self.b.fresh(f"{node.name}.{k}"))
                for k, (s, lo) in enumerate(zip(sizes, ends))]  # fmt: skip

    def _index(self, node: Any, args: list, kwargs: dict) -> Tensor:
        """``x[..., idx, ...]`` with one index tensor known at import (a list of positions, as Falcon's
        multi-query attention picks its key and value heads with ``[-2]`` and ``[-1]``): each run of
        consecutive positions is a slice, several runs are put together (``cat``). An index computed at run
        time (a data-dependent gather: the experts a token is routed to), a boolean mask, more than one index
        tensor or one of rank other than 1 is refused."""
        import torch

        x, indices = self.tensor(args[0], node.name), list(args[1])
        given = [(a, i) for a, i in enumerate(indices) if i is not None]
        if len(given) != 1:
            raise GraphImportError(f"indexing with {len(given)} index tensors (one is supported)")
        dim, idx = given[0]
        if not isinstance(idx, torch.Tensor):
            raise GraphImportError("an index computed at run time (a data-dependent gather)")
        if idx.is_meta or idx.dtype == torch.bool or idx.ndim != 1 or idx.numel() == 0:
            raise GraphImportError("an index that is not a known list of positions (a mask, a tensor of rank "
                                   f"{idx.ndim} or no values)")  # fmt: skip
        n = x.shape[dim]
        pos = [int(i) + n if int(i) < 0 else int(i) for i in idx.tolist()]
        if not all(0 <= p < n for p in pos):
            raise GraphImportError(f"an index out of range for an axis of {n}")
        runs: list[list[int]] = []
        for p in pos:
            if runs and p == runs[-1][1]:
                runs[-1][1] += 1
            else:
                runs.append([p, p + 1])
        name = self.b.fresh(node.name)
        parts = [slice_axis(self.b, x, dim, lo, hi, f"{name}.{k}") for k, (lo, hi) in enumerate(runs)]
        if len(parts) == 1:
            return parts[0]
        return self._cat(node, [parts, dim], {})

    def _rotate_half_of(self, parts: list, dim: int) -> Tensor | None:
        """``x`` if ``parts`` is ``[-x[..., h:], x[..., :h]]`` along the last axis (rotary's rotate_half)."""
        if len(parts) != 2 or not isinstance(parts[0], Expr) or not isinstance(parts[1], Tensor):
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
        parts = [view(self.b, t, [*t.shape[:dim], 1, *t.shape[dim:]], self.b.fresh(f"{node.name}.{k}.unsqueeze"))
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
        return self.b.assemble(self.b.fresh(node.name), shape, grid, sources)


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
