"""The dataflow-graph IR: ops, edges, costs, validation and level computations.

A :class:`DataflowGraph` is a DAG whose vertices are tile-level kernel calls
(*ops*) and whose edges say that one op's output is an input of another. It is
stored as a struct of numpy arrays so that a 100k-op graph builds, validates and
loads in about a second:

* per op: ``kind`` (an :class:`OpKind` code), ``flops``, ``output_bytes``,
  ``group`` (id of the logical tensor op this op is a tile of, ``-1`` if none)
  and ``block`` (its block index inside that group, padded with ``-1``);
* per edge, in insertion order: ``src`` and ``dst``;
* derived CSR views: successors (``succ_ptr``/``succ_idx``) and predecessors
  (``pred_ptr``/``pred_idx``), with ``succ_eid``/``pred_eid`` mapping each CSR
  slot back to its edge id so per-edge arrays can be read in CSR order.

Optional, per op: a ``name`` and an execution ``spec`` (a plain dict naming a
kernel from a fixed whitelist, the operand sources, shapes and dtype) that the
real engine and the numpy reference evaluator need. Specs are data only: no
code is ever looked up from them except by name in a fixed kernel table.

Duplicate edges are **merged** (the first occurrence is kept, a warning says how
many were dropped): under the execution semantics an output is sent once per
destination device, so a repeated edge carries no extra meaning, and operand
order lives in the op's spec, not in the edge list. Self-loops, cycles, edges
to unknown ops, an empty graph and negative/NaN/inf costs are errors
(:class:`GraphError`) whose message names the ops involved.
"""

from __future__ import annotations

import hashlib
import math
import warnings
import weakref
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Iterable, Sequence, TypeVar

import numpy as np

from doppler.util.jit import jit

MAX_BLOCK_DIMS = 4


#: the largest total FLOPs (or output bytes) of a graph: sums, longest paths and times on slow
#: devices must not overflow float64 (whose maximum is about 1.8e308)
MAX_TOTAL_COST = 1e250
#: the most elements one tensor shape in a graph file may describe (an input in ``meta.inputs``, an output
#: in ``meta.outputs``, an op's or operand's ``shape`` in its spec): 2**40, about 1.1e12, past any tensor of
#: a model a cluster of :data:`~doppler.hardware.cluster.MAX_DEVICES` devices holds (a cost-only import of a 70B
#: model declares 1e9). doppler allocates a declared shape only to execute a graph, which checks first that
#: the memory is there (:func:`doppler.workloads.references.make_inputs`)
MAX_TENSOR_ELEMENTS = 1 << 40


def shape_elements(shape: Sequence[int], limit: int = MAX_TENSOR_ELEMENTS) -> int | None:
    """The element count of ``shape`` (whole numbers >= 0), or None if it is past ``limit``: the product stops
    growing there, so that a shape of thousands of huge dimensions costs no huge product."""
    if 0 in shape:
        return 0
    numel = 1
    for d in shape:
        numel *= d
        if numel > limit:
            return None
    return numel


#: ``meta["cost_only"]`` of a graph imported on the meta device whose model has no values
NO_VALUES = "built on the meta device: no weights or constants"
#: ``meta["cost_only"]`` of a graph imported on the meta device whose model has no weights but whose constants are recorded: ``doppler execute
#: --weights`` runs it
NO_WEIGHTS = "built on the meta device: no weights (execute --weights loads them from a checkpoint)"


class GraphError(ValueError):
    """A graph (or graph file) is malformed; the message says what and where."""


class OpKind(IntEnum):
    """What an op computes. The first block is ours; the second mirrors the optypes
    of the DOPPLER text format so imported graphs keep their labels exactly."""

    INPUT = 0
    MATMUL = 1  # one block product (a partial product of a tiled contraction)
    ADD = 2  # aggregation: sums (or maxes) the partial results of a tiled op
    ELEMENTWISE = 3
    SOFTMAX = 4
    NORM = 5
    ROTARY = 6
    MASK_FILL = 7
    SELECT = 8
    REDUCE = 9
    FORMATION = 10
    COMPLEXER = 11
    SQUEEZER = 12
    FILL = 13
    EINSUMMABLE = 14
    UNKNOWN = 15

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> "OpKind":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            known = ", ".join(k.label for k in cls)
            raise GraphError(f"unknown op kind {text!r} (known: {known})") from None


@dataclass(frozen=True)
class Group:
    """A logical tensor op that was split into tile ops (e.g. one large matmul).

    ``module`` is the dotted path of the model module the op belongs to (``"layers.3.self_attn"``,
    ``"model.layers.3.mlp.down_proj"`` for an imported model, from ``torch.export``'s ``nn_module_stack``),
    or ``""`` where none is known. Layer-granular methods (:mod:`doppler.methods.layered`) group ops by it.
    """

    name: str
    kind: str  # e.g. "matmul", "elementwise", "softmax"
    grid: tuple[int, ...]  # number of blocks per output dimension
    module: str = ""

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "kind": self.kind, "grid": list(self.grid)}
        if self.module:
            doc["module"] = self.module
        return doc

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Group":
        """A group from its JSON object; TypeError, KeyError or ValueError naming what is wrong."""
        if not isinstance(obj, dict):
            raise TypeError(f"a group must be an object, not {type(obj).__name__}")
        module = obj.get("module", "")
        if not isinstance(module, str):
            raise TypeError(f"module must be a string, not {type(module).__name__}")
        return cls(name=str(obj["name"]), kind=str(obj["kind"]), grid=tuple(int(g) for g in obj["grid"]),
                   module=module)  # fmt: skip


@dataclass(frozen=True)
class TileLayout:
    """How a graph's ops tile logical ops, as :meth:`DataflowGraph.from_arrays` takes it: the group of each op
    (``group[op]``, an index into ``groups``; -1: none), its block coordinates in the group's grid
    (``block[op]``, an (n, <= 4) array padded with -1), and the :class:`Group` list. None: no group, no block."""

    group: Sequence[int] | np.ndarray | None = None
    block: np.ndarray | Sequence[Sequence[int]] | None = None
    groups: list[Group] | None = None


def _csr(keys: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR rows of ``values`` grouped by ``keys`` (stable), plus the edge id per slot."""
    order = np.argsort(keys, kind="stable")
    counts = np.bincount(keys, minlength=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, values[order].astype(np.int64, copy=False), order.astype(np.int64, copy=False)


def expand_ranges(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Slot indices of CSR rows ``rows`` concatenated (vectorised ``np.r_[ptr[r]:ptr[r+1] ...]``)."""
    starts = ptr[rows]
    lengths = ptr[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return offsets + np.arange(total, dtype=np.int64)


#: a graph of at least DEEP_MIN_OPS ops and more than DEEP_LEVELS topological levels runs its level passes
#: (levels, b-level, t-level, the critical path) as compiled loops over its ops: the vectorised passes take
#: one numpy step, one Python iteration, per level (a 1M-op chain: 52 s for `graph info`)
DEEP_MIN_OPS = 50_000
DEEP_LEVELS = 2_000


@jit(cache=True)
def _kahn_levels(succ_ptr, succ_idx, indeg):  # pragma: no cover - compiled
    """Each op's topological level (longest path from an entry, in edges); -1 for ops on or after a cycle."""
    n = indeg.shape[0]
    level = np.zeros(n, np.int64)
    remaining = indeg.copy()
    queue = np.empty(n, np.int64)
    head = 0
    tail = 0
    for v in range(n):
        if remaining[v] == 0:
            queue[tail] = v
            tail += 1
    while head < tail:
        v = queue[head]
        head += 1
        for s in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ_idx[s]
            if level[v] + 1 > level[w]:
                level[w] = level[v] + 1
            remaining[w] -= 1
            if remaining[w] == 0:
                queue[tail] = w
                tail += 1
    for v in range(n):
        if remaining[v] > 0:
            level[v] = -1
    return level


def _column(values: Any, label: str, dtype: Any, *, ndim: int = 1, bounds: tuple[int, int] | None = None) -> np.ndarray:
    """``values`` as a ``dtype`` array of ``ndim`` dimensions, or a :class:`GraphError` naming ``label``: numbers
    only, and in an integer column whole numbers within ``bounds`` (checked before the cast, which would
    truncate 0.5 to 0 or wrap 257 to 1)."""
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as e:
        raise GraphError(f"{label}: not an array of numbers ({str(e).splitlines()[0][:80]})") from None
    if arr.ndim != ndim:
        raise GraphError(f"{label} must be a {ndim}-D array, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(dtype)
    if arr.dtype.kind not in "iuf":
        raise GraphError(f"{label} must hold numbers, got {arr.dtype.name} values such as {arr.flat[0]!r:.40}")
    if np.issubdtype(dtype, np.integer):
        if arr.dtype.kind == "f":
            flat = arr.ravel()
            bad = np.flatnonzero(~np.isfinite(flat) | (flat != np.floor(flat)))
            if bad.size:
                raise GraphError(f"{label} must hold whole numbers, got {flat[bad[0]].item()!r}")
        lo, hi = bounds if bounds is not None else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        small, big = arr.min(), arr.max()
        if small < lo or big > hi:
            raise GraphError(f"{label} holds {(small if small < lo else big).item()!r}, outside {lo}..{hi}")
    return arr.astype(dtype)


@dataclass(eq=False)
class DataflowGraph:
    """A validated DAG of ops. Build with :meth:`from_arrays` (or a workload builder).

    Treat it as immutable: its arrays are checked once, when it is built, and its CSR views, levels and
    fingerprint derive from them; to change a cost or an edge, build a new graph from modified arrays."""

    kind: np.ndarray  # int8[n] OpKind codes
    flops: np.ndarray  # float64[n]
    output_bytes: np.ndarray  # float64[n]
    src: np.ndarray  # int64[E]
    dst: np.ndarray  # int64[E]
    group: np.ndarray  # int32[n], -1 = not part of a tiled logical op
    block: np.ndarray  # int32[n, MAX_BLOCK_DIMS], -1 padded
    names: list[str] | None = None
    specs: list[dict[str, Any] | None] | None = None
    groups: list[Group] = field(default_factory=list)
    name: str = "graph"
    meta: dict[str, Any] = field(default_factory=dict)

    # derived (filled by __post_init__)
    succ_ptr: np.ndarray = field(init=False, repr=False)
    succ_idx: np.ndarray = field(init=False, repr=False)
    succ_eid: np.ndarray = field(init=False, repr=False)
    pred_ptr: np.ndarray = field(init=False, repr=False)
    pred_idx: np.ndarray = field(init=False, repr=False)
    pred_eid: np.ndarray = field(init=False, repr=False)
    topo_order: np.ndarray = field(init=False, repr=False)
    level: np.ndarray = field(init=False, repr=False)

    # ------------------------------------------------------------------ build
    @classmethod
    def from_arrays(
        cls,
        flops: Sequence[float] | np.ndarray,
        output_bytes: Sequence[float] | np.ndarray,
        src: Sequence[int] | np.ndarray,
        dst: Sequence[int] | np.ndarray,
        *,
        kind: Sequence[int] | np.ndarray | None = None,
        tiles: TileLayout | None = None,
        names: list[str] | None = None,
        specs: list[dict[str, Any] | None] | None = None,
        name: str = "graph",
        meta: dict[str, Any] | None = None,
    ) -> "DataflowGraph":
        """Build and validate a graph from per-op and per-edge arrays (``tiles``: the ops' groups and blocks)."""
        group, block, groups = (None, None, None) if tiles is None else (tiles.group, tiles.block, tiles.groups)
        flops_a = _column(flops, "flops", np.float64)
        n = flops_a.shape[0]
        kind_a = (np.full(n, OpKind.UNKNOWN, np.int8) if kind is None else
                  _column(kind, "kind", np.int8, bounds=(0, 127)))  # (unknown codes are named below)  # fmt: skip
        group_a = np.full(n, -1, np.int32) if group is None else _column(group, "group", np.int32,
                                                                          bounds=(-1, 2**31 - 1))  # fmt: skip
        if block is None:
            block_a = np.full((n, MAX_BLOCK_DIMS), -1, np.int32)
        else:
            block_a = _column(block, "block", np.int32, ndim=2)
            if block_a.shape[1] > MAX_BLOCK_DIMS:
                raise GraphError(f"block must be an (n, <= {MAX_BLOCK_DIMS}) array, got shape {block_a.shape}")
            if block_a.shape[1] < MAX_BLOCK_DIMS:
                pad = np.full((block_a.shape[0], MAX_BLOCK_DIMS - block_a.shape[1]), -1, np.int32)
                block_a = np.concatenate([block_a, pad], axis=1)
        return cls(
            kind=kind_a,
            flops=flops_a,
            output_bytes=_column(output_bytes, "output_bytes", np.float64),
            src=_column(src, "src", np.int64),
            dst=_column(dst, "dst", np.int64),
            group=group_a,
            block=block_a,
            names=names,
            specs=specs,
            groups=list(groups or []),
            name=name,
            meta=dict(meta or {}),
        )

    def __post_init__(self) -> None:
        self._validate_arrays()
        self._merge_duplicate_edges()
        n = self.num_ops
        self.succ_ptr, self.succ_idx, self.succ_eid = _csr(self.src, self.dst, n)
        self.pred_ptr, self.pred_idx, self.pred_eid = _csr(self.dst, self.src, n)
        self.topo_order, self.level = self._levels()

    def _validate_arrays(self) -> None:
        n = self.flops.shape[0]
        if n == 0:
            raise GraphError("the graph is empty: it has no ops")
        for label, arr in (("kind", self.kind), ("output_bytes", self.output_bytes), ("group", self.group)):
            if arr.shape != (n,):
                raise GraphError(f"{label} has {arr.shape[0] if arr.ndim else 0} entries but the graph has {n} ops")
        if self.block.shape != (n, MAX_BLOCK_DIMS):
            raise GraphError(f"block has shape {self.block.shape}, expected ({n}, {MAX_BLOCK_DIMS})")
        for label, arr in (("flops", self.flops), ("output_bytes", self.output_bytes)):
            bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
            if bad.size:
                i = int(bad[0])
                raise GraphError(
                    f"op {self.op_label(i)} has invalid {label} {float(arr[i])!r} (costs must be finite and >= 0)"
                    + (f"; {bad.size - 1} more ops are invalid too" if bad.size > 1 else "")
                )
            with np.errstate(over="ignore"):
                total = float(arr.sum())
            if not math.isfinite(total) or total > MAX_TOTAL_COST:
                i = int(np.argmax(arr))
                raise GraphError(
                    f"op {self.op_label(i)} has {label} {float(arr[i]):g}: the graph's total {label} overflows "
                    f"(every sum of costs must stay below {MAX_TOTAL_COST:g})"
                )
        known_kinds = np.array([k.value for k in OpKind])
        bad_kind = np.flatnonzero(~np.isin(self.kind, known_kinds))
        if bad_kind.size:
            i = int(bad_kind[0])
            raise GraphError(f"op {self.op_label(i)} has unknown kind code {int(self.kind[i])}")
        if self.src.shape != self.dst.shape:
            raise GraphError(f"edge lists differ in length: {self.src.shape[0]} sources, {self.dst.shape[0]} destinations")
        bad_edge = np.flatnonzero((self.src < 0) | (self.src >= n) | (self.dst < 0) | (self.dst >= n))
        if bad_edge.size:
            e = int(bad_edge[0])
            raise GraphError(
                f"edge {e} ({int(self.src[e])} -> {int(self.dst[e])}) refers to an unknown op (ops are 0..{n - 1})"
            )
        loops = np.flatnonzero(self.src == self.dst)
        if loops.size:
            e = int(loops[0])
            raise GraphError(f"edge {e} is a self-loop on op {self.op_label(int(self.src[e]))}")
        if self.names is not None and len(self.names) != n:
            raise GraphError(f"names has {len(self.names)} entries but the graph has {n} ops")
        if self.names is not None and not all(isinstance(s, str) for s in self.names):
            i = next(i for i, s in enumerate(self.names) if not isinstance(s, str))
            raise GraphError(f"names must be strings: op {i}'s is {self.names[i]!r}")
        if self.specs is not None and len(self.specs) != n:
            raise GraphError(f"specs has {len(self.specs)} entries but the graph has {n} ops")
        if self.group.size and (self.group.max() >= len(self.groups) or self.group.min() < -1):
            bad = np.flatnonzero((self.group >= len(self.groups)) | (self.group < -1))
            raise GraphError(
                f"op {self.op_label(int(bad[0]))} refers to group {int(self.group[bad[0]])}, "
                f"but the graph defines {len(self.groups)} groups"
            )

    def _merge_duplicate_edges(self) -> None:
        n = self.flops.shape[0]
        key = self.src * n + self.dst
        _, first = np.unique(key, return_index=True)
        if first.size != key.size:
            keep = np.sort(first)
            dropped = key.size - keep.size
            warnings.warn(f"graph {self.name!r}: merged {dropped} duplicate edge(s)", stacklevel=4)
            self.src, self.dst = self.src[keep], self.dst[keep]

    def _levels(self) -> tuple[np.ndarray, np.ndarray]:
        """Kahn's algorithm, one vectorised step per topological level (a deep graph: :data:`DEEP_LEVELS`)."""
        n = self.num_ops
        indeg = np.bincount(self.dst, minlength=n).astype(np.int64)
        level = np.full(n, -1, dtype=np.int64)
        frontier = np.flatnonzero(indeg == 0)
        parts: list[np.ndarray] = []
        depth = 0
        if n >= DEEP_MIN_OPS and n // max(frontier.size, 1) > DEEP_LEVELS:  # (too few entries: possibly deep)
            level = _kahn_levels(self.succ_ptr, self.succ_idx, indeg)  # (it counts down a copy)
            if (level >= 0).all():
                return np.argsort(level, kind="stable"), level  # ids ascending within a level, as below
            frontier = np.empty(0, np.int64)
        while frontier.size:
            level[frontier] = depth
            parts.append(frontier)
            targets = self.succ_idx[expand_ranges(self.succ_ptr, frontier)]
            if targets.size == 0:
                break
            uniq, cnt = np.unique(targets, return_counts=True)
            indeg[uniq] -= cnt
            frontier = uniq[indeg[uniq] == 0]
            depth += 1
        order = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if order.size != n:
            cycle = self._find_cycle(level < 0)
            shown = " -> ".join(self.op_label(v) for v in cycle[:8])
            more = f" -> ... ({len(cycle)} ops)" if len(cycle) > 8 else f" -> {self.op_label(cycle[0])}"
            raise GraphError(f"the graph has a cycle: {shown}{more}")
        return order, level

    def _find_cycle(self, remaining: np.ndarray) -> list[int]:
        """Ops on one cycle among ``remaining`` (every such op has a remaining predecessor),
        in edge order, starting at the lowest op id."""
        v = int(np.flatnonzero(remaining)[0])
        seen: dict[int, int] = {}
        path: list[int] = []
        while v not in seen:
            seen[v] = len(path)
            path.append(v)
            preds = self.pred_idx[self.pred_ptr[v] : self.pred_ptr[v + 1]]
            v = int(preds[remaining[preds]][0])
        cycle = path[seen[v] :][::-1]
        start = cycle.index(min(cycle))
        return cycle[start:] + cycle[:start]

    # ------------------------------------------------------------ accessors
    @property
    def num_ops(self) -> int:
        return int(self.flops.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.src.shape[0])

    @property
    def depth(self) -> int:
        """Number of topological levels (the longest path counted in ops)."""
        return int(self.level.max()) + 1

    def op_name(self, i: int) -> str:
        return self.names[i] if self.names is not None else f"op{i}"

    def op_modules(self) -> tuple[list[str], np.ndarray]:
        """The module paths ops record (through their groups), in order of first appearance by op id, and
        each op's index into them (int64[n]; -1 where the op records none). Cached."""
        cached = self.__dict__.get("_op_modules")
        if cached is None:
            labels: dict[str, int] = {}
            per_group = [labels.setdefault(g.module, len(labels)) if g.module else -1 for g in self.groups]
            index = np.asarray(per_group + [-1], np.int64)[self.group]  # group -1 reads the trailing -1
            used, first = np.unique(index[index >= 0], return_index=True)
            order = used[np.argsort(first, kind="stable")]
            remap = np.full(len(labels) + 1, -1, np.int64)
            remap[order] = np.arange(order.size)
            names = list(labels)
            cached = ([names[k] for k in order], remap[index])
            self.__dict__["_op_modules"] = cached
        return cached

    def op_label(self, i: int) -> str:
        """``id`` plus the name when there is one, for error messages."""
        if self.names is not None and i < len(self.names) and self.names[i] != f"op{i}":
            return f"{i} ({self.names[i]!r})"
        return str(i)

    def successors(self, i: int) -> np.ndarray:
        return self.succ_idx[self.succ_ptr[i] : self.succ_ptr[i + 1]]

    def predecessors(self, i: int) -> np.ndarray:
        return self.pred_idx[self.pred_ptr[i] : self.pred_ptr[i + 1]]

    def in_degree(self) -> np.ndarray:
        return np.diff(self.pred_ptr)

    def out_degree(self) -> np.ndarray:
        return np.diff(self.succ_ptr)

    def kind_labels(self) -> list[str]:
        return [OpKind(int(k)).label for k in self.kind]

    @property
    def deep(self) -> bool:
        """Whether the level passes (:mod:`doppler.ir.analysis`) run as compiled loops over the ops (:data:`DEEP_LEVELS`)."""
        return self.num_ops >= DEEP_MIN_OPS and self.depth > DEEP_LEVELS

    # ----------------------------------------------------------- identity
    def fingerprint(self) -> str:
        """Stable content hash of structure and costs (names, kinds, specs and metadata excluded),
        so a graph keeps it through JSON -> DOPPLER text -> JSON, whose optypes are coarser than our kinds."""
        return self._hash(b"doppler-graph-v2", with_kind=False)

    def legacy_fingerprint(self) -> str:
        """The fingerprint files written before v2 carry (it also hashed the op kinds)."""
        return self._hash(b"doppler-graph-v1", with_kind=True)

    def matches_fingerprint(self, fp: str) -> bool:
        """True if ``fp`` is this graph's fingerprint, current or legacy."""
        return fp == self.fingerprint() or fp == self.legacy_fingerprint()

    def _hash(self, tag: bytes, with_kind: bool) -> str:
        h = hashlib.sha256()
        h.update(tag)
        h.update(np.int64(self.num_ops).tobytes())
        order = np.lexsort((self.dst, self.src))
        arrays = [self.src[order].astype("<i8"), self.dst[order].astype("<i8")]
        if with_kind:
            arrays.append(self.kind.astype("<i1"))
        arrays += [self.flops.astype("<f8"), self.output_bytes.astype("<f8")]
        for arr in arrays:
            h.update(np.ascontiguousarray(arr).tobytes())
        return h.hexdigest()[:16]

    def equals(self, other: "DataflowGraph") -> bool:
        """Exact equality of every stored field (edge order included)."""
        arrays = ("src", "dst", "kind", "flops", "output_bytes", "group", "block")
        return (
            self.num_ops == other.num_ops
            and all(np.array_equal(getattr(self, a), getattr(other, a)) for a in arrays)
            and (self.names or [self.op_name(i) for i in range(self.num_ops)])
            == (other.names or [other.op_name(i) for i in range(other.num_ops)])
            and self.specs == other.specs
            and self.groups == other.groups
            and self.name == other.name
            and self.meta == other.meta
        )

    def __repr__(self) -> str:
        return f"DataflowGraph(name={self.name!r}, ops={self.num_ops}, edges={self.num_edges}, depth={self.depth})"


_T = TypeVar("_T")


def once_per_graph(find: Callable[["DataflowGraph"], _T]) -> Callable[["DataflowGraph"], _T]:
    """``find(graph)``, computed once per live graph and kept while the graph lives (graphs are immutable
    and compared by identity); for facts derived from a whole graph that several consumers read."""
    found: "weakref.WeakKeyDictionary[DataflowGraph, _T]" = weakref.WeakKeyDictionary()

    def get(graph: "DataflowGraph") -> _T:
        value = found.get(graph)
        if value is None:
            value = found[graph] = find(graph)
        return value

    return get


def from_edges(
    flops: Iterable[float],
    edges: Iterable[tuple[int, int]],
    output_bytes: Iterable[float] | None = None,
    **kwargs: Any,
) -> DataflowGraph:
    """Convenience constructor from an edge list (mostly for tests and small examples)."""
    flops_l = list(flops)
    edge_l = list(edges)
    src = [e[0] for e in edge_l]
    dst = [e[1] for e in edge_l]
    ob = list(output_bytes) if output_bytes is not None else [0.0] * len(flops_l)
    return DataflowGraph.from_arrays(flops_l, ob, src, dst, **kwargs)
