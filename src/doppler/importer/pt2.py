"""Read a ``torch.export`` ``.pt2`` archive without running anything that is in it.

``torch.export.load`` is not safe on a file from a stranger: it unpickles (sample inputs fall back
to a full unpickle when the weights-only one fails; pickled weights, torchbind and opaque constants
are plain pickles), evaluates shape expressions with sympy (``eval``), imports modules named in
tree specs, and resolves a node's target by attribute path from ``torch`` (``torch.os.system`` is
one). This reader never calls it. It reads only:

* ``archive_format``, ``byteorder`` and ``models/model.json`` (the program), parsed as JSON;
* tensor payloads stored as raw bytes (``data/weights/``, ``data/constants/``), each shaped by its
  recorded ``tensor_meta`` after checking that the view lies inside the bytes.

From these it builds a :class:`Program`: a ``torch.fx`` graph whose call targets are only ATen
operators, looked up by name on ``torch.ops.aten`` (``torch.ops.aten.NAME.OVERLOAD``), and the pure
functions of :data:`OPERATOR_FUNCTIONS`; the graph signature; and the tensors. A symbolic size is
read as its recorded example value (the expression text is never parsed). Anything else is refused
with one :class:`Pt2Error` line: a pickled payload, a custom or opaque object, a higher-order op (its
subgraph), an operator outside ATen, an archive from before torch 2.7 (it stores pickles). Sample
inputs, extra files and compiled AOTInductor code are never used: of each, the first bytes are read to
find a pickle (which is refused if torch's weights-only loader refuses it, see :func:`_check_pickles`).

The archive is bounded before any member is read (:func:`doppler.importer.files.open_zip`: member count,
declared sizes, their sum, compression ratios), every member is read a chunk at a time, never past its
declared size, and a JSON member is read only up to :data:`MAX_JSON_BYTES`.
"""

from __future__ import annotations

import operator
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from doppler.ir.graph import MAX_TENSOR_ELEMENTS, shape_elements
from doppler.importer.files import (MAX_PICKLE_BYTES, MAX_ZIP_MEMBER_BYTES, ArchiveError, load_failure, load_plain,
                                    open_zip, read_member)  # fmt: skip
from doppler.util.io import loads_json

__all__ = ["OPERATOR_FUNCTIONS", "Program", "Pt2Error", "read_pt2"]

#: functions of Python's ``operator`` module a program may call (``_operator.NAME``): all pure
OPERATOR_FUNCTIONS = {name: getattr(operator, name) for name in (
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "pos", "abs",
    "eq", "ne", "lt", "le", "gt", "ge", "and_", "or_", "not_")}  # fmt: skip
#: the largest JSON member read (the program ``models/NAME.json``, a weights table; a 0.1B-parameter model's
#: program takes a few MB): its objects take some 10 times its bytes
MAX_JSON_BYTES = 32 << 20
#: the most tensor elements a recorded size may describe (a shape, not an allocation): a graph file's bound
#: (:data:`doppler.ir.graph.MAX_TENSOR_ELEMENTS`), so that an imported graph reads back
MAX_ELEMENTS = MAX_TENSOR_ELEMENTS

_ATEN = re.compile(r"torch\.ops\.aten\.([A-Za-z_][A-Za-z0-9_]{0,99})\.([A-Za-z_][A-Za-z0-9_]{0,99})")
_PAYLOAD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")


class Pt2Error(ValueError):
    """A ``.pt2`` archive that cannot be read safely or is malformed; the message is one line (text quoted
    from the file has its line breaks and runs of spaces folded)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


@dataclass(frozen=True)
class Kind:
    """An input or output kind, named as ``torch.export``'s enums are (``USER_INPUT``, ``PARAMETER``, ...)."""

    name: str


@dataclass(frozen=True)
class Arg:
    name: str | None


@dataclass(frozen=True)
class Spec:
    """One input or output of the program: its graph node's name, its kind, and the state it names."""

    kind: Kind
    arg: Arg
    target: str | None = None


@dataclass(frozen=True)
class Signature:
    input_specs: list[Spec]
    output_specs: list[Spec]


@dataclass
class GraphHolder:
    """What the lowering reads of a graph module: its ``torch.fx`` graph (no code is generated)."""

    graph: Any


@dataclass
class Program:
    """The parts of an ``ExportedProgram`` the importer reads, from :func:`read_pt2`."""

    graph_module: GraphHolder
    graph_signature: Signature
    state_dict: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)


# ============================================================================ the archive
class _Archive:
    """The members of one ``.pt2`` zip archive under its root folder, read on demand and bounded."""

    def __init__(self, zf: zipfile.ZipFile) -> None:
        self.zf = zf  # (bounded by doppler.importer.files.open_zip)
        names = zf.namelist()
        roots = sorted({n.split("/", 1)[0] for n in names if n.endswith("/archive_format") and n.count("/") == 1})
        if not roots:
            if "version" in names or any(n.endswith("serialized_exported_program.json") for n in names):
                raise Pt2Error("an archive in the layout of torch before 2.7, which stores its weights as pickles: "
                               "re-save the program with torch.export.save on torch 2.7 or newer")  # fmt: skip
            raise Pt2Error("not a torch.export archive (no archive_format member)")
        if len(roots) > 1:
            raise Pt2Error(f"holds {len(roots)} archives ({', '.join(roots[:3])}); expected one")
        self.root = roots[0] + "/"
        self.names = {n[len(self.root):]: n for n in names if n.startswith(self.root)}

    def has(self, member: str) -> bool:
        return member in self.names

    def read(self, member: str, limit: int = MAX_ZIP_MEMBER_BYTES) -> bytearray:
        """The bytes of ``member`` (:func:`doppler.importer.files.read_member`: at most its declared size, refused
        past ``limit``)."""
        if member not in self.names:
            raise Pt2Error(f"member {member} is missing")
        try:
            return read_member(self.zf, self.zf.getinfo(self.names[member]), limit)
        except ArchiveError as e:
            raise Pt2Error(str(e)) from None

    def head(self, member: str, size: int) -> bytes:
        """The first ``size`` bytes of ``member`` (fewer if it is shorter), all that is decompressed of it."""
        try:
            with self.zf.open(self.names[member]) as f:
                return f.read(size)
        except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError, ValueError, zlib.error) as e:
            raise Pt2Error(f"member {member} is damaged ({_short(e)})") from None

    def json(self, member: str) -> Any:
        data = self.read(member, MAX_JSON_BYTES)
        try:
            return loads_json(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise Pt2Error(f"member {member} is not valid JSON ({_short(e)})") from None


def _short(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]


# ============================================================================ values
class _Reader:
    """Turns the JSON program and raw payloads into a :class:`Program`."""

    def __init__(self, archive: _Archive) -> None:
        import torch
        from torch._export.serde.serialize import (_SERIALIZE_TO_TORCH_DTYPE, _SERIALIZE_TO_TORCH_LAYOUT,
                                                   _SERIALIZE_TO_TORCH_MEMORY_FORMAT)  # fmt: skip

        self.torch = torch
        self.archive = archive
        self.dtypes = {int(k): v for k, v in _SERIALIZE_TO_TORCH_DTYPE.items()}
        self.layouts = {int(k): v for k, v in _SERIALIZE_TO_TORCH_LAYOUT.items()}
        self.memory_formats = {int(k): v for k, v in _SERIALIZE_TO_TORCH_MEMORY_FORMAT.items()}
        self.little = True
        self.nodes: dict[str, Any] = {}  # serialized name -> fx node
        self.metas: dict[str, Any] = {}  # serialized name -> meta value (tensor on the meta device, int, ...)
        self.where = "the program"

    # -------------------------------------------------------------- scalars
    def int_value(self, s: Any, what: str) -> int:
        """A size, stride or offset: ``{"as_int": n}``, or a symbol's recorded example value (``hint``)."""
        if isinstance(s, dict) and type(s.get("as_int")) is int:
            return s["as_int"]
        if isinstance(s, dict) and isinstance(s.get("as_expr"), dict):
            hint = s["as_expr"].get("hint")
            if isinstance(hint, dict) and type(hint.get("as_int")) is int:
                return hint["as_int"]
            raise Pt2Error(f"{self.where}: a symbolic {what} with no example value (export with static shapes)")
        raise Pt2Error(f"{self.where}: malformed {what} {str(s)[:80]}")

    def tensor_meta(self, tm: Any) -> tuple[Any, list[int], list[int], int]:
        if not isinstance(tm, dict):
            raise Pt2Error(f"{self.where}: malformed tensor description")
        layout = tm.get("layout", 7)
        if self.layouts.get(layout) is not self.torch.strided:
            raise Pt2Error(f"{self.where}: only strided (dense) tensors are read, not layout {layout!r}")
        sizes = [self.int_value(s, "size") for s in _list(tm.get("sizes"), self.where, "sizes")]
        strides = [self.int_value(s, "stride") for s in _list(tm.get("strides", []), self.where, "strides")]
        offset = self.int_value(tm.get("storage_offset", {"as_int": 0}), "storage offset")
        if len(strides) != len(sizes):
            strides = _contiguous(sizes)
        if min(sizes + strides + [offset], default=0) < 0:
            raise Pt2Error(f"{self.where}: a negative size, stride or offset")
        if shape_elements(sizes, MAX_ELEMENTS) is None:
            raise Pt2Error(f"{self.where}: a tensor of more than {MAX_ELEMENTS:,} elements, the most a graph's tensor "
                           "may have")  # fmt: skip
        return _lookup(self.dtypes, tm.get("dtype"), self.where, "dtype"), sizes, strides, offset

    # -------------------------------------------------------------- payloads
    def payloads(self, folder: str, config_member: str, kind: str) -> dict[str, Any]:
        """The tensors of ``data/weights`` or ``data/constants``, by fully qualified name."""
        if not self.archive.has(config_member):
            return {}
        config = self.archive.json(config_member)
        entries = config.get("config") if isinstance(config, dict) else None
        if not isinstance(entries, dict):
            raise Pt2Error(f"member {config_member}: no 'config' table")
        flat: dict[str, Any] = {}
        out: dict[str, Any] = {}
        for fqn, meta in entries.items():
            self.where = f"{kind} {fqn}"
            if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
                raise Pt2Error(f"{self.where}: malformed entry")
            path = meta["path_name"]
            if meta.get("use_pickle") or not path.startswith(("weight_", "tensor_")):
                raise Pt2Error(f"{self.where} is stored as a pickled object; doppler never unpickles a file "
                               "(a plain tensor saved by torch.export.save is stored as raw bytes)")  # fmt: skip
            if not _PAYLOAD_NAME.fullmatch(path):
                raise Pt2Error(f"{self.where}: malformed payload name {path[:80]!r}")
            dtype, sizes, strides, offset = self.tensor_meta(meta.get("tensor_meta"))
            if path not in flat:
                flat[path] = self._flat(f"{folder}/{path}", dtype)
            out[fqn] = self._view(flat[path], dtype, sizes, strides, offset)
        return out

    def _flat(self, member: str, dtype: Any) -> Any:
        data = self.archive.read(member)  # (a fresh buffer: the tensor takes it over without a copy)
        size = self.torch.empty((), dtype=dtype).element_size()
        if len(data) % size:
            raise Pt2Error(f"{self.where}: {len(data)} bytes are not whole {dtype} elements")
        flat = self.torch.frombuffer(data, dtype=dtype) if data else self.torch.empty(0, dtype=dtype)
        if not self.little and size > 1:
            flat = self.torch.frombuffer(bytearray(flat.numpy().byteswap().tobytes()), dtype=dtype)
        return flat

    def _view(self, flat: Any, dtype: Any, sizes: list[int], strides: list[int], offset: int) -> Any:
        if flat.dtype != dtype:
            raise Pt2Error(f"{self.where}: its payload is shared with a tensor of another dtype")
        if 0 in sizes:
            return self.torch.zeros(sizes, dtype=dtype)
        last = offset + sum((s - 1) * st for s, st in zip(sizes, strides))
        if last >= flat.numel():
            if flat.numel() == 0:  # torch.export.save writes no bytes for a tensor of zeros... only of size 0
                raise Pt2Error(f"{self.where}: its payload is empty")
            raise Pt2Error(f"{self.where}: its shape reaches element {last}, past the {flat.numel()} stored")
        numel = shape_elements(sizes, MAX_ELEMENTS)
        if numel is not None and numel > flat.numel():  # (a zero stride: what reads every element would allocate)
            raise Pt2Error(f"{self.where}: its shape {sizes} holds {numel:,} elements, more than the {flat.numel():,} "
                           "stored (a view that repeats its elements)")  # fmt: skip
        return self.torch.as_strided(flat, sizes, strides, offset)

    # -------------------------------------------------------------- the graph
    def target(self, name: Any) -> Any:
        if not isinstance(name, str):
            raise Pt2Error(f"{self.where}: malformed target {str(name)[:80]!r}")
        m = _ATEN.fullmatch(name)
        if m:
            # attribute lookups only; anything that is not an operator overload (a dunder's class or
            # method) is refused below
            packet = getattr(self.torch.ops.aten, m[1], None)
            op = getattr(packet, m[2], None) if isinstance(packet, self.torch._ops.OpOverloadPacket) else None
            if isinstance(op, self.torch._ops.OpOverload):
                return op
            raise Pt2Error(f"{self.where}: {name} is not an ATen operator of this torch")
        if name.startswith("_operator.") and name[len("_operator."):] in OPERATOR_FUNCTIONS:
            return OPERATOR_FUNCTIONS[name[len("_operator."):]]
        if name.startswith("torch.ops.higher_order."):
            raise Pt2Error(f"{self.where}: higher-order op {name[:120]} (a subgraph) is not supported")
        raise Pt2Error(f"{self.where}: target {name[:120]!r} is not an ATen operator; doppler calls nothing else")

    def argument(self, a: Any) -> Any:
        if not isinstance(a, dict) or len(a) != 1:
            raise Pt2Error(f"{self.where}: malformed argument {str(a)[:80]}")
        (kind, v), = a.items()
        if kind == "as_none":
            return None
        if kind == "as_tensor":
            return self.node_ref(v)
        if kind in ("as_tensors", "as_optional_tensors"):
            return [self.argument(x) if kind == "as_optional_tensors" else self.node_ref(x)
                    for x in _list(v, self.where, kind)]  # fmt: skip
        if kind in ("as_int", "as_float", "as_bool", "as_string"):
            want = {"as_int": (int,), "as_float": (float, int), "as_bool": (bool,), "as_string": (str,)}[kind]
            if type(v) not in want:
                raise Pt2Error(f"{self.where}: {kind} holds {type(v).__name__}")
            return float(v) if kind == "as_float" else v
        if kind in ("as_ints", "as_floats", "as_bools", "as_strings"):
            return [self.argument({kind[:-1]: x}) for x in _list(v, self.where, kind)]
        if kind in ("as_sym_int", "as_sym_float", "as_sym_bool"):
            return self.sym(v)
        if kind in ("as_sym_ints", "as_sym_floats", "as_sym_bools"):
            return [self.sym(x) for x in _list(v, self.where, kind)]
        if kind == "as_scalar_type":
            return _lookup(self.dtypes, v, self.where, "dtype")
        if kind == "as_layout":
            return _lookup(self.layouts, v, self.where, "layout")
        if kind == "as_memory_format":
            return _lookup(self.memory_formats, v, self.where, "memory format")
        if kind == "as_device":
            return self.device(v)
        if kind == "as_complex" and isinstance(v, dict):
            return complex(float(v["real"]), float(v["imag"]))
        raise Pt2Error(f"{self.where}: argument kind {kind[:40]} is not supported (only tensors, numbers, "
                       "strings, dtypes and devices)")  # fmt: skip

    def sym(self, v: Any) -> Any:
        if isinstance(v, dict) and len(v) == 1:
            (kind, x), = v.items()
            if kind in ("as_int", "as_float", "as_bool") and type(x) in (int, float, bool):
                return x
            if kind == "as_name":
                return self.node_ref({"name": x})
        raise Pt2Error(f"{self.where}: malformed symbolic argument {str(v)[:80]}")

    def device(self, v: Any) -> Any:
        if not isinstance(v, dict) or v.get("type") not in ("cpu", "cuda", "meta", "mps", "xpu", "hpu"):
            raise Pt2Error(f"{self.where}: unknown device {str(v)[:80]}")
        index = v.get("index")
        if index is not None and (type(index) is not int or not 0 <= index < 1 << 16):
            raise Pt2Error(f"{self.where}: bad device index {index!r}")
        return self.torch.device(v["type"], index)

    def node_ref(self, v: Any) -> Any:
        name = v.get("name") if isinstance(v, dict) else None
        if not isinstance(name, str) or name not in self.nodes:
            raise Pt2Error(f"{self.where}: reads {str(name)[:80]!r}, which no earlier node defines")
        return self.nodes[name]

    def define(self, name: Any, node: Any) -> None:
        if not isinstance(name, str) or not name:
            raise Pt2Error(f"{self.where}: malformed value name {str(name)[:80]!r}")
        if name in self.nodes:
            raise Pt2Error(f"{self.where}: value {name[:80]!r} is defined twice")
        self.nodes[name] = node
        node.meta["val"] = self.metas.get(name)

    def value_metas(self, g: dict) -> None:
        for name, tm in _dict(g.get("tensor_values", {}), "tensor_values").items():
            self.where = f"value {name[:80]}"
            dtype, sizes, strides, _ = self.tensor_meta(tm)
            self.metas[name] = self.torch.empty_strided(sizes, strides, dtype=dtype, device="meta")
        for table in ("sym_int_values", "sym_float_values", "sym_bool_values"):
            for name, v in _dict(g.get(table, {}), table).items():
                self.where = f"value {name[:80]}"
                self.metas[name] = self.int_value(v, "symbolic value") if table == "sym_int_values" else None

    def call_args(self, target: Any, inputs: list) -> tuple[tuple, dict]:
        given: dict[str, tuple[Any, int | None]] = {}
        for inp in inputs:
            if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
                raise Pt2Error(f"{self.where}: malformed input {str(inp)[:80]}")
            given[inp["name"]] = (self.argument(inp.get("arg")), inp.get("kind"))
        if not isinstance(target, self.torch._ops.OpOverload):
            return tuple(v for v, _ in given.values()), {}
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        schema = target._schema.arguments
        unknown = set(given) - {a.name for a in schema}
        if unknown:
            raise Pt2Error(f"{self.where}: {target} has no argument {sorted(unknown)[0][:40]!r}")
        for a in schema:
            if a.name in given:
                value, kind = given[a.name]
                if a.kwarg_only or kind == 2:
                    kwargs[a.name] = value
                else:
                    args.append(value)
            elif not a.has_default_value() and not a.kwarg_only:
                raise Pt2Error(f"{self.where}: {target} is missing its argument {a.name!r}")
        return tuple(args), kwargs

    def outputs(self, node: Any, outs: list, graph: Any) -> None:
        """Name the node after its one output, or give each output a ``getitem`` node (as torch does)."""
        one = outs[0] if len(outs) == 1 and isinstance(outs[0], dict) else {}
        if "as_tensor" in one:
            self.define(_name_of(one["as_tensor"], self.where), node)
            return
        if any(k in one for k in ("as_sym_int", "as_sym_float", "as_sym_bool")):
            (v,) = one.values()
            self.define(v.get("as_name") if isinstance(v, dict) else None, node)
            return
        if not outs or "as_none" in one:
            node.meta["val"] = None
            return
        items = one["as_tensors"] if "as_tensors" in one else outs
        node.meta["val"] = tuple(self.getitems(node, _list(items, self.where, "outputs"), graph))

    def getitems(self, node: Any, items: list, graph: Any) -> list:
        metas = []
        for i, item in enumerate(items):
            part = graph.create_node("call_function", operator.getitem, (node, i))
            if isinstance(item, dict) and "name" in item and len(item) == 1:  # a bare tensor argument
                item = {"as_tensor": item}
            if not isinstance(item, dict) or len(item) != 1:
                raise Pt2Error(f"{self.where}: malformed output {str(item)[:80]}")
            (kind, v), = item.items()
            if kind == "as_tensor":
                self.define(_name_of(v, self.where), part)
            elif kind in ("as_sym_int", "as_sym_float", "as_sym_bool") and isinstance(v, dict):
                self.define(v.get("as_name"), part)
            elif kind == "as_tensors":
                part.meta["val"] = self.getitems(part, _list(v, self.where, kind), graph)
            elif kind == "as_none":
                part.meta["val"] = None
            else:
                raise Pt2Error(f"{self.where}: output kind {kind[:40]} is not supported")
            metas.append(part.meta["val"])
        return metas

    def nn_module_stack(self, text: Any) -> dict[str, tuple[str, str]] | None:
        """``key,path,type`` items joined by ``;``, as strings (nothing is imported)."""
        if not isinstance(text, str) or not text:
            return None
        out = {}
        for item in text.split(";"):
            parts = _split_top(item)
            if len(parts) == 3:
                out[parts[0]] = (parts[1], parts[2])
        return out

    def graph(self, g: Any, signature: Any) -> tuple[Any, Signature]:
        import torch.fx as fx

        g = _dict(g, "graph")
        self.value_metas(g)
        graph = fx.Graph()
        input_specs = [self.input_spec(s) for s in _list(_dict(signature, "signature").get("input_specs"), "signature", "input_specs")]
        inputs = _list(g.get("inputs"), "graph", "inputs")
        if len(inputs) != len(input_specs):
            raise Pt2Error(f"the graph has {len(inputs)} inputs, its signature {len(input_specs)}")
        specs = []
        for inp, (kind, name, target) in zip(inputs, input_specs):
            self.where = f"input {str(name)[:80]}"
            if not isinstance(inp, dict) or len(inp) != 1:
                raise Pt2Error(f"{self.where}: malformed input")
            (_, v), = inp.items()
            vname = _name_of(v, self.where) if isinstance(v, dict) and "name" in v else name
            node = graph.placeholder(_fx_name(vname))
            self.define(vname, node)
            specs.append(Spec(Kind(kind), Arg(node.name), target))
        for n in _list(g.get("nodes"), "graph", "nodes"):
            n = _dict(n, "node")
            self.where = f"node {str(n.get('name') or n.get('target'))[:80]}"
            target = self.target(n.get("target"))
            args, kwargs = self.call_args(target, _list(n.get("inputs", []), self.where, "inputs"))
            node = graph.create_node("call_function", target, args, kwargs,
                                     name=_fx_name(n["name"]) if isinstance(n.get("name"), str) and n["name"] else None)  # fmt: skip
            meta = n.get("metadata") or {}
            stack = self.nn_module_stack(meta.get("nn_module_stack") if isinstance(meta, dict) else None)
            if stack is not None:
                node.meta["nn_module_stack"] = stack
            self.outputs(node, _list(n.get("outputs", []), self.where, "outputs"), graph)
        self.where = "the graph's outputs"
        outs = tuple(self.graph_output(o) for o in _list(g.get("outputs"), "graph", "outputs"))
        graph.output(outs[0] if g.get("is_single_tensor_return") and len(outs) == 1 else outs)
        output_specs = [self.output_spec(s) for s in _list(signature.get("output_specs"), "signature", "output_specs")]
        return graph, Signature(specs, output_specs)

    def graph_output(self, o: Any) -> Any:
        kinds = ("as_tensor", "as_sym_int", "as_sym_float", "as_sym_bool", "as_int", "as_float", "as_bool", "as_none")
        if isinstance(o, dict) and len(o) == 1 and next(iter(o)) in kinds:
            return self.argument(o)
        raise Pt2Error(f"{self.where}: malformed output {str(o)[:80]}")

    def input_spec(self, s: Any) -> tuple[str, str | None, str | None]:
        """``(kind, value name, state name)`` of one input of the signature."""
        if not isinstance(s, dict) or len(s) != 1:
            raise Pt2Error(f"the signature: malformed input {str(s)[:80]}")
        (kind, v), = s.items()
        v = _dict(v, f"input {kind}")
        state_key = {"parameter": "parameter_name", "buffer": "buffer_name", "tensor_constant": "tensor_constant_name"}
        if kind in state_key:
            target = v.get(state_key[kind])
            if not isinstance(target, str):
                raise Pt2Error(f"the signature: {kind} input without a name")
            return {"parameter": "PARAMETER", "buffer": "BUFFER"}.get(kind, "CONSTANT_TENSOR"), _name_of(v.get("arg"), kind), target
        if kind == "user_input":
            arg = _dict(v.get("arg"), "user input")
            if "as_tensor" not in arg:
                raise Pt2Error(f"the signature: a user input of kind {next(iter(arg), '?')[:40]}; only tensor inputs "
                               "are supported")  # fmt: skip
            return "USER_INPUT", _name_of(arg["as_tensor"], "user input"), None
        raise Pt2Error(f"the signature: an input of kind {kind[:40]} (custom objects, tokens and constants are not "
                       "supported)")  # fmt: skip

    def output_spec(self, s: Any) -> Spec:
        if not isinstance(s, dict) or len(s) != 1:
            raise Pt2Error(f"the signature: malformed output {str(s)[:80]}")
        (kind, v), = s.items()
        arg = v.get("arg") if isinstance(v, dict) else None
        name = None
        if isinstance(arg, dict):
            inner = arg.get("as_tensor", arg)
            name = inner.get("name") if isinstance(inner, dict) else None
        return Spec(Kind(str(kind).upper()[:40]), Arg(_fx_name(name) if isinstance(name, str) and name else None))


def _split_top(text: str) -> list[str]:
    """``text`` split at commas outside brackets (torch's nn_module_stack items)."""
    out, start, depth = [], 0, 0
    for i, c in enumerate(text):
        if c in "[(":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def _fx_name(name: str) -> str:
    """A serialized value name as an FX node name candidate (FX makes it a unique identifier)."""
    return re.sub(r"[^A-Za-z0-9_]", "_", name[:200]) or "v"


def _name_of(v: Any, where: str) -> str:
    name = v.get("name") if isinstance(v, dict) else None
    if not isinstance(name, str) or not name:
        raise Pt2Error(f"{where}: malformed value {str(v)[:80]}")
    return name


def _list(v: Any, where: str, what: str) -> list:
    if not isinstance(v, list):
        raise Pt2Error(f"{where}: {what} is not a list")
    return v


def _dict(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise Pt2Error(f"malformed {what}")
    return v


def _lookup(table: dict, code: Any, where: str, what: str) -> Any:
    if type(code) is not int or code not in table:
        raise Pt2Error(f"{where}: unknown {what} code {code!r}")
    return table[code]


def _contiguous(sizes: list[int]) -> list[int]:
    strides, step = [], 1
    for s in reversed(sizes):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


# ============================================================================ entry point
def read_pt2(path: str | Path, model: str = "model") -> Program:
    """The program ``model`` of the ``.pt2`` archive at ``path``, read without unpickling or evaluating
    anything from it (see the module docstring); a :class:`Pt2Error` with one line if it cannot be."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            if f.read(4) != b"PK\x03\x04":
                raise Pt2Error("not a zip archive (torch.export.save writes one)")
            f.seek(0)
            with open_zip(f) as zf:
                return _read(_Archive(zf), model)
    except ArchiveError as e:
        raise Pt2Error(str(e)) from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as e:
        raise Pt2Error(f"a damaged zip archive ({_short(e)})") from None


def _check_pickles(archive: _Archive) -> None:
    """Refuse an archive any member of which is a pickle that torch's weights-only loader refuses (one that
    names ``os.system``, say). doppler reads no pickle from an archive; such a member is never needed, but
    it is a file made to run code under ``torch.export.load``, and the user should know. Tensor payloads
    (read as raw bytes) are not pickles and are not checked.

    Of every other member only the first 4 bytes are read, unless they begin a pickle: a raw pickle (a
    protocol 2 to 5 header) is then read up to :data:`~doppler.importer.files.MAX_PICKLE_BYTES`, a zip archive
    (a ``torch.save`` file) up to its declared size; either is loaded onto torch's meta device, so that no
    tensor in it is read or allocated (a nested archive is bounded like the outer one)."""
    for member in sorted(archive.names):
        if member.startswith(("data/weights/weight_", "data/constants/tensor_")) or member.endswith("/"):
            continue
        head = archive.head(member, 4)
        if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
            size = archive.zf.getinfo(archive.names[member]).file_size
            if size > MAX_PICKLE_BYTES:
                raise Pt2Error(f"member {member} is a pickle of {size:,} bytes, more than the {MAX_PICKLE_BYTES:,} doppler "
                               "checks; doppler never unpickles a file, and cannot tell whether this one runs code "
                               "under torch.export.load")  # fmt: skip
            data = archive.read(member, MAX_PICKLE_BYTES)
        elif head == b"PK\x03\x04":
            data = archive.read(member)
            if not _holds_pickle(data, member):
                continue
        else:
            continue
        try:
            load_plain(data, meta=True)
        except Exception as e:  # noqa: BLE001 - any refusal of the weights-only loader
            raise Pt2Error(f"member {member} is a pickle that needs more than torch's weights-only loader "
                           f"({load_failure(e)}); doppler never runs a full unpickle") from None  # fmt: skip


def _holds_pickle(data: bytearray, member: str) -> bool:
    """Whether the zip archive ``data`` (``member``) holds a ``data.pkl`` (a ``torch.save`` file), by its table of
    members, which is bounded first (a :class:`Pt2Error` past a bound)."""
    import io

    try:
        with open_zip(io.BytesIO(data)) as z:
            return any(n.endswith("data.pkl") for n in z.namelist())
    except ArchiveError as e:
        raise Pt2Error(f"member {member} is a zip archive: {e}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError):
        return False


def _read(archive: _Archive, model: str) -> Program:
    fmt = archive.read("archive_format", MAX_JSON_BYTES).decode("utf-8", "replace").strip()
    if fmt != "pt2":
        raise Pt2Error(f"archive_format is {fmt[:20]!r}, not 'pt2'")
    byteorder = bytes(archive.read("byteorder", MAX_JSON_BYTES)).strip() if archive.has("byteorder") else b"little"
    if byteorder not in (b"little", b"big"):
        raise Pt2Error("byteorder is neither 'little' nor 'big'")
    _check_pickles(archive)
    program_member = f"models/{model}.json"
    if not archive.has(program_member):
        found = sorted(m[len("models/"):-len(".json")] for m in archive.names if m.startswith("models/") and m.endswith(".json"))
        raise Pt2Error(f"no program {model!r} in the archive" + (f" (it holds {', '.join(found[:5])})" if found else ""))
    reader = _Reader(archive)
    reader.little = byteorder == b"little"
    doc = _dict(archive.json(program_member), program_member)
    gm = _dict(doc.get("graph_module"), "graph_module")
    try:
        state = reader.payloads("data/weights", f"data/weights/{model}_weights_config.json", "weight")
        constants = reader.payloads("data/constants", f"data/constants/{model}_constants_config.json", "constant")
        graph, signature = reader.graph(gm.get("graph"), gm.get("signature"))
    except Pt2Error:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, RuntimeError, OverflowError,
            RecursionError, MemoryError) as e:  # fmt: skip
        raise Pt2Error(f"{reader.where}: malformed ({type(e).__name__}: {_short(e)})") from None
    return Program(GraphHolder(graph), signature, state, constants)
