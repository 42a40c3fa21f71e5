"""Graph file formats: native JSON (versioned, exact round trip) and the DOPPLER text format.

Native JSON (``.json``), version 1, column-oriented so that 100k-op graphs load fast::

    {"format": "doppler-graph", "version": 1, "name": "...", "meta": {...},
     "ops": {"kind": ["matmul", ...], "flops": [...], "output_bytes": [...],
             "name": [...], "group": [...], "block": [[...], ...], "spec": [...]},
     "edges": {"src": [...], "dst": [...]},
     "groups": [{"name": "...", "kind": "...", "grid": [...]}, ...]}

``ops.name``, ``ops.group``, ``ops.block``, ``ops.spec`` and ``groups`` are optional.
Floats are written with ``repr`` precision, so a save/load round trip is exact.

DOPPLER text format (``.txt``), as used by the paper's public code (docs/design.md, Command-line and file contracts):
line 1 the total node count T including input nodes; line 2 the input node ids;
line 3 edge sources; line 4 edge destinations; then one ``compute,comm[,optype]``
line per op. ``compute`` becomes the op's ``flops`` and ``comm`` its
``output_bytes``, so on the ``unit`` cluster an op takes ``compute`` and a
transfer ``comm`` time units. The header (T and the input ids) is kept in
``graph.meta["text_format"]`` so a text file round-trips unchanged.
"""

from __future__ import annotations

import math
import re
import reprlib
from pathlib import Path
from typing import Any

import numpy as np

from doppler.ir.graph import (MAX_BLOCK_DIMS, MAX_TENSOR_ELEMENTS, DataflowGraph, GraphError, Group, OpKind, TileLayout, shape_elements)
from doppler.util.io import atomic_write_text, parse_json, read_text, write_json
from doppler.ir.slices import input_slices

JSON_FORMAT = "doppler-graph"
JSON_VERSION = 1
TEXT_OPTYPES = ("input", "formation", "complexer", "squeezer", "fill", "select", "einsummable", "unknown")

_KIND_TO_OPTYPE = {
    OpKind.INPUT: "input",
    OpKind.FORMATION: "formation",
    OpKind.COMPLEXER: "complexer",
    OpKind.SQUEEZER: "squeezer",
    OpKind.FILL: "fill",
    OpKind.MASK_FILL: "fill",
    OpKind.SELECT: "select",
    OpKind.UNKNOWN: "unknown",
}  # every other kind is a tensor contraction or map: "einsummable"

_TOP_KEYS = {"format", "version", "name", "meta", "ops", "edges", "groups"}
_OP_KEYS = {"kind", "flops", "output_bytes", "name", "group", "block", "spec"}


def load_graph(path: str | Path) -> DataflowGraph:
    """Read a graph file, choosing the format by extension (``.json`` or ``.txt``)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".txt"):
        raise GraphError(f"{p}: unknown graph file extension {p.suffix!r} (use .json or .txt)")
    text = read_text(p, "graph file", GraphError)
    if suffix == ".json":
        return graph_from_json_text(text, source=str(p))
    return graph_from_text(text, source=str(p), name=p.stem)


def save_graph(graph: DataflowGraph, path: str | Path, *, round_costs: bool = False) -> None:
    """Write a graph file atomically, choosing the format by extension. The text format
    needs integer costs: ``round_costs`` rounds them, otherwise a non-integer cost is an error."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".json":
        write_json(p, graph_to_json(graph), compact=True)
    elif suffix == ".txt":
        try:
            text = graph_to_text(graph, round_costs=round_costs)
        except GraphError as e:
            raise GraphError(f"{p}: {e}") from None
        atomic_write_text(p, text)
    elif p.is_dir():
        raise GraphError(f"{p}: is a directory (give a graph file name ending in .json or .txt)")
    else:
        raise GraphError(f"{p}: unknown graph file extension {p.suffix!r} (use .json or .txt)")


# --------------------------------------------------------------------- JSON
def graph_to_json(graph: DataflowGraph) -> dict[str, Any]:
    """The native JSON document of a graph."""
    ops: dict[str, Any] = {
        "kind": graph.kind_labels(),
        "flops": graph.flops.tolist(),
        "output_bytes": graph.output_bytes.tolist(),
    }
    if graph.names is not None:
        ops["name"] = list(graph.names)
    if np.any(graph.group >= 0):
        ops["group"] = graph.group.tolist()
    if np.any(graph.block >= 0):
        used = int(np.max(np.flatnonzero(np.any(graph.block >= 0, axis=0)))) + 1
        ops["block"] = graph.block[:, :used].tolist()
    if graph.specs is not None:
        ops["spec"] = list(graph.specs)
    doc: dict[str, Any] = {
        "format": JSON_FORMAT,
        "version": JSON_VERSION,
        "name": graph.name,
        "meta": graph.meta,
        "ops": ops,
        "edges": {"src": graph.src.tolist(), "dst": graph.dst.tolist()},
    }
    if graph.groups:
        doc["groups"] = [g.to_json() for g in graph.groups]
    return doc


def graph_from_json_text(text: str, source: str = "<json>") -> DataflowGraph:
    """A graph from JSON text; the graph-input slices its ops read are checked here (:mod:`doppler.memory`
    counts them), so that a malformed one is an error naming ``source`` and the op."""
    graph = graph_from_json(parse_json(text, source, GraphError), source=source)
    try:
        input_slices(graph)
    except GraphError as e:
        raise GraphError(f"{source}: {e}") from None
    return graph


def _checked_in_bulk(values: list, dtype: Any) -> np.ndarray | None:
    """The column if it plainly passes :func:`_number_column`'s checks (Python ints, and floats where
    the column holds floats, all in range), else ``None``: then the per-entry checks find what is wrong."""
    types = set(map(type, values))
    try:
        if dtype is np.int64 and types <= {int}:
            arr = np.asarray(values, dtype=np.int64)
            return arr if not arr.size or -(2**62) < int(arr.min()) and int(arr.max()) < 2**62 else None
        if dtype is np.float64 and types <= {int, float}:
            arr = np.asarray(values, dtype=np.float64)
            # (an int above 1e300 may round down to 1e300: from 1e300 on, the per-entry check decides exactly)
            return arr if int not in types or not arr.size or float(np.abs(arr).max()) < 1e300 else None
    except OverflowError:
        pass
    return None


def _number_column(values: Any, key: str, n: int | None, source: str, dtype: Any, per: str = "op") -> np.ndarray:
    if not isinstance(values, list):
        raise GraphError(f"{source}: {key} must be a list, got {type(values).__name__}")
    if n is not None and len(values) != n:
        raise GraphError(f"{source}: {key} has {len(values)} entries, expected {n} (one per {per})")
    arr = _checked_in_bulk(values, dtype)
    if arr is not None:
        return arr
    for i, v in enumerate(values):  # something is wrong (or unusual): find it and name it
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise GraphError(f"{source}: {key}[{i}] is {v!r}, not a number")
        if dtype is np.int64 and not (isinstance(v, int) or (math.isfinite(v) and v == int(v))):
            raise GraphError(f"{source}: {key}[{i}] is {v!r}, not an integer")
        if dtype is np.int64 and not -(2**62) < v < 2**62:
            raise GraphError(f"{source}: {key}[{i}] is {v!r}, out of range")
        if dtype is np.float64 and isinstance(v, int) and abs(v) > 1e300:
            raise GraphError(f"{source}: {key}[{i}] is out of range")
    return np.asarray(values, dtype=dtype)


def graph_from_json(doc: Any, source: str = "<json>") -> DataflowGraph:
    """Build a graph from a native JSON document, naming the key that is wrong."""
    if not isinstance(doc, dict):
        raise GraphError(f"{source}: a graph file must hold a JSON object, got {type(doc).__name__}")
    if doc.get("format") != JSON_FORMAT:
        raise GraphError(f"{source}: not a doppler graph (expected \"format\": \"{JSON_FORMAT}\")")
    if doc.get("version") != JSON_VERSION:
        raise GraphError(f"{source}: unsupported graph format version {doc.get('version')!r} (this doppler reads {JSON_VERSION})")
    unknown = set(doc) - _TOP_KEYS
    if unknown:
        raise GraphError(f"{source}: unknown key(s) {sorted(unknown)} (known: {sorted(_TOP_KEYS)})")
    ops, edges = doc.get("ops"), doc.get("edges")
    if not isinstance(ops, dict):
        raise GraphError(f"{source}: missing or invalid \"ops\" object")
    if not isinstance(edges, dict):
        raise GraphError(f"{source}: missing or invalid \"edges\" object")
    unknown = set(ops) - _OP_KEYS
    if unknown:
        raise GraphError(f"{source}: unknown key(s) in ops: {sorted(unknown)} (known: {sorted(_OP_KEYS)})")
    for key in ("kind", "flops", "output_bytes"):
        if key not in ops:
            raise GraphError(f"{source}: missing ops.{key}")
    flops = _number_column(ops["flops"], "ops.flops", None, source, np.float64)
    n = flops.shape[0]
    output_bytes = _number_column(ops["output_bytes"], "ops.output_bytes", n, source, np.float64)
    kinds = ops["kind"]
    if not isinstance(kinds, list) or len(kinds) != n:
        raise GraphError(f"{source}: ops.kind must be a list of {n} op kind names")
    label_to_code = {k.label: k.value for k in OpKind}
    kind_codes = np.empty(n, dtype=np.int8)
    for i, label in enumerate(kinds):
        code = label_to_code.get(label) if isinstance(label, str) else None
        if code is None:
            raise GraphError(f"{source}: ops.kind[{i}] is {label!r}; known kinds: {', '.join(label_to_code)}")
        kind_codes[i] = code
    src = _number_column(edges.get("src"), "edges.src", None, source, np.int64)
    dst = _number_column(edges.get("dst"), "edges.dst", src.shape[0], source, np.int64, per="edge, as edges.src")
    names = ops.get("name")
    if names is not None and (not isinstance(names, list) or len(names) != n or not all(isinstance(s, str) for s in names)):
        raise GraphError(f"{source}: ops.name must be a list of {n} strings")
    group = _number_column(ops["group"], "ops.group", n, source, np.int64) if "group" in ops else None
    block = None
    if "block" in ops:
        rows = ops["block"]
        if not isinstance(rows, list) or len(rows) != n:
            raise GraphError(f"{source}: ops.block must be a list of {n} block indices")
        widths = {len(r) if isinstance(r, list) else -1 for r in rows}
        if len(widths) != 1 or -1 in widths or max(widths) > MAX_BLOCK_DIMS:
            raise GraphError(f"{source}: ops.block rows must be lists of equal length <= {MAX_BLOCK_DIMS}")
        block = _number_column([v for r in rows for v in r], "ops.block", None, source, np.int64).reshape(n, -1)
    specs = ops.get("spec")
    if specs is not None and (not isinstance(specs, list) or len(specs) != n):
        raise GraphError(f"{source}: ops.spec must be a list of {n} objects (or null)")
    try:
        groups = [Group.from_json(g) for g in doc.get("groups", [])]
    except (KeyError, TypeError, ValueError) as e:
        raise GraphError(f"{source}: invalid groups entry ({e})") from None
    meta = doc.get("meta", {})
    if not isinstance(meta, dict):
        raise GraphError(f"{source}: meta must be an object")
    _check_shapes(meta, specs, names, source)
    _check_output_tiles(meta, n, source)
    try:
        return DataflowGraph.from_arrays(
            flops, output_bytes, src, dst,
            kind=kind_codes, tiles=TileLayout(group, block, groups), names=names, specs=specs,
            name=str(doc.get("name", "graph")), meta=meta,
        )
    except GraphError as e:
        raise GraphError(f"{source}: {e}") from None


def _check_shapes(meta: dict[str, Any], specs: list | None, names: list[str] | None, source: str) -> None:
    """GraphError naming ``source`` and the tensor unless every shape the file declares, the ones that executing
    the graph allocates (``meta.inputs``, ``meta.outputs[NAME].shape``, each spec's ``shape`` and its operands'),
    where present (a key given as null is refused, not read as absent), is a list of whole numbers >= 0 describing at most :data:`~doppler.ir.graph.MAX_TENSOR_ELEMENTS` elements.
    Checked as the file is read, before anything is built from it."""
    inputs = meta.get("inputs")
    if isinstance(inputs, dict):
        for name, shape in inputs.items():
            _check_shape(shape, f"{source}: meta.inputs[{name!r:.60}]")
    outputs = meta.get("outputs")
    if isinstance(outputs, dict):
        for name, info in outputs.items():
            if isinstance(info, dict) and "shape" in info:
                _check_shape(info["shape"], f"{source}: meta.outputs[{name!r:.60}].shape")
    for i, spec in enumerate(specs or ()):
        if not isinstance(spec, dict):
            continue
        if "shape" in spec:
            _check_shape(spec["shape"], f"{source}: op {_op_name(i, names)}: its spec's shape")
        refs = spec.get("inputs")
        for k, ref in enumerate(refs if isinstance(refs, list) else ()):
            if isinstance(ref, dict) and "shape" in ref:
                _check_shape(ref["shape"], f"{source}: op {_op_name(i, names)}: operand {k}'s shape")


def _check_output_tiles(meta: dict[str, Any], n: int, source: str) -> None:
    """GraphError naming ``source`` and the output unless each of ``meta.outputs`` that declares a shape lists its
    tiles as ``[op, slice]`` pairs: an op of the graph's ``n``, and one ``[lo, hi]`` per dimension of the shape with
    ``0 <= lo <= hi <=`` its size (what executing the graph stitches its outputs from)."""
    outputs = meta.get("outputs")
    for name, info in (outputs.items() if isinstance(outputs, dict) else ()):
        if not isinstance(info, dict) or "shape" not in info:
            continue
        where, shape = f"{source}: meta.outputs[{name!r:.60}]", info["shape"]
        tiles = info.get("tiles")
        if not isinstance(tiles, list) or not tiles:
            raise GraphError(f"{where}.tiles must be a non-empty list of [op, slice] pairs")
        for k, tile in enumerate(tiles):
            ok = isinstance(tile, list) and len(tile) == 2 and type(tile[0]) is int and 0 <= tile[0] < n
            sl = tile[1] if ok else None
            ok = ok and isinstance(sl, list) and len(sl) == len(shape) and all(
                isinstance(b, list) and len(b) == 2 and all(type(x) is int for x in b) and 0 <= b[0] <= b[1] <= dim
                for b, dim in zip(sl, shape))  # fmt: skip
            if not ok:
                raise GraphError(f"{where}.tiles[{k}] is {reprlib.repr(tile)}: not [op < {n}, one [lo, hi] within "
                                 f"each of the shape {reprlib.repr(shape)}'s dimensions]")  # fmt: skip


def _check_shape(shape: Any, where: str) -> None:
    if type(shape) is list and len(shape) <= 8 and all(type(d) is int and 0 <= d <= MAX_TENSOR_ELEMENTS for d in shape):
        if math.prod(shape) <= MAX_TENSOR_ELEMENTS:  # (the common case, decided fast)
            return
    elif not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise GraphError(f"{where} is {reprlib.repr(shape)}, not a list of whole numbers >= 0")
    if shape_elements(shape) is None:
        raise GraphError(f"{where} {reprlib.repr(shape)} describes more than {MAX_TENSOR_ELEMENTS:,} elements, the most "
                         "a graph's tensor may have")  # fmt: skip


def _op_name(i: int, names: list[str] | None) -> str:
    return f"{i} ({names[i][:60]!r})" if names else str(i)


# --------------------------------------------------------------------- text
_SEP = re.compile(r"[,\s]+")


def _shown(token: str, limit: int = 40) -> str:
    """A token of the input for an error message: quoted, and cut short if long."""
    return repr(token) if len(token) <= limit else repr(token[:limit]) + f"... ({len(token)} characters)"


def _int_list(line: str, lineno: int, what: str, source: str) -> list[int]:
    out = []
    for tok in _SEP.split(line.strip()):
        if not tok:
            continue
        if not re.fullmatch(r"-?\d{1,18}", tok):  # (an id or a count: within int64, and no 5,000-digit parse)
            raise GraphError(f"{source}:{lineno}: {what}: {_shown(tok)} is not an integer of at most 18 digits")
        out.append(int(tok))
    return out


def graph_from_text(text: str, source: str = "<text>", name: str = "graph") -> DataflowGraph:
    """Parse the DOPPLER text format; errors name the file and line."""
    lines = text.splitlines()
    while len(lines) > 4 and not lines[-1].strip():
        lines.pop()
    if len(lines) < 4:
        raise GraphError(f"{source}: a DOPPLER text graph needs at least 4 header lines, found {len(lines)}")
    header = _int_list(lines[0], 1, "total node count", source)
    if len(header) != 1 or header[0] <= 0:
        raise GraphError(f"{source}:1: expected one positive integer (total node count), got {lines[0].strip()!r}")
    total = header[0]
    input_ids = _int_list(lines[1], 2, "input node ids", source)
    bad_id = next((i for i in input_ids if not 0 <= i < total), None)
    if bad_id is not None:
        raise GraphError(f"{source}:2: input node id {bad_id} is not a node (ids are 0..{total - 1})")
    if len(set(input_ids)) != len(input_ids):
        raise GraphError(f"{source}:2: an input node id is listed twice")
    n = total - len(input_ids)
    if n <= 0:
        raise GraphError(f"{source}:2: {len(input_ids)} input nodes leave no ops out of {total} nodes")
    src = _int_list(lines[2], 3, "edge sources", source)
    dst = _int_list(lines[3], 4, "edge destinations", source)
    if len(src) != len(dst):
        raise GraphError(f"{source}:4: {len(dst)} edge destinations but line 3 has {len(src)} edge sources")
    for lineno, ends in ((3, src), (4, dst)):
        for i, v in enumerate(ends):
            if not 0 <= v < n:
                raise GraphError(f"{source}:{lineno}: edge {i} refers to node {v}, but ops are 0..{n - 1}")
    op_lines = lines[4:]
    if len(op_lines) != n:
        raise GraphError(
            f"{source}: expected {n} op lines after line 4 ({total} nodes minus {len(input_ids)} inputs), found {len(op_lines)}"
        )
    flops = np.empty(n)
    comm = np.empty(n)
    kinds = np.empty(n, dtype=np.int8)
    with_optype = None
    for i, line in enumerate(op_lines):
        lineno = i + 5
        fields = [f.strip() for f in line.split(",")]
        if len(fields) not in (2, 3):
            raise GraphError(f"{source}:{lineno}: op {i}: expected 'compute,comm[,optype]', got {_shown(line.strip())}")
        for j, label in ((0, "compute"), (1, "comm")):
            if not re.fullmatch(r"\d{1,300}", fields[j]):  # (past 300 digits a cost is no finite float)
                raise GraphError(f"{source}:{lineno}: op {i}: {label} {_shown(fields[j])} is not a non-negative "
                                 "integer of at most 300 digits")  # fmt: skip
        flops[i] = int(fields[0])
        comm[i] = int(fields[1])
        has_type = len(fields) == 3
        if with_optype is None:
            with_optype = has_type
        elif with_optype != has_type:
            raise GraphError(f"{source}:{lineno}: op {i}: some op lines have an optype and some do not")
        if has_type:
            if fields[2] not in TEXT_OPTYPES:
                raise GraphError(f"{source}:{lineno}: op {i}: unknown optype {fields[2]!r} (known: {', '.join(TEXT_OPTYPES)})")
            kinds[i] = OpKind.parse(fields[2]).value
        else:
            kinds[i] = OpKind.UNKNOWN
    meta = {"text_format": {"total_nodes": total, "input_ids": input_ids, "optypes": bool(with_optype)}}
    try:
        return DataflowGraph.from_arrays(flops, comm, src, dst, kind=kinds, name=name, meta=meta)
    except GraphError as e:
        raise GraphError(f"{source}: {e}") from None


def _int_text(values: np.ndarray, what: str, graph: DataflowGraph, round_costs: bool) -> list[str]:
    if round_costs:
        values = np.round(values)
    bad = np.flatnonzero(values != np.round(values))
    if bad.size:
        i = int(bad[0])
        raise GraphError(
            f"op {graph.op_label(i)} has non-integer {what} {float(values[i]):.17g}; the DOPPLER text format needs "
            f"integers (use --round to round every cost; {bad.size} ops are affected)"
        )
    return [str(int(v)) for v in values]


def graph_to_text(graph: DataflowGraph, *, round_costs: bool = False) -> str:
    """The DOPPLER text form of a graph (canonical separators: ``,``)."""
    header = graph.meta.get("text_format", {})
    input_ids = [int(v) for v in header.get("input_ids", [])]
    total = graph.num_ops + len(input_ids)
    with_optype = bool(header.get("optypes", True))
    compute = _int_text(graph.flops, "flops", graph, round_costs)
    comm = _int_text(graph.output_bytes, "output_bytes", graph, round_costs)
    lines = [
        str(total),
        ",".join(map(str, input_ids)),
        ",".join(map(str, graph.src.tolist())),
        ",".join(map(str, graph.dst.tolist())),
    ]
    for i in range(graph.num_ops):
        row = f"{compute[i]},{comm[i]}"
        if with_optype:
            row += "," + _KIND_TO_OPTYPE.get(OpKind(int(graph.kind[i])), "einsummable")
        lines.append(row)
    return "\n".join(lines) + "\n"
