"""What the policy sees: static per-op and per-edge features of a graph on a cluster,
the longest-path membership used by the SEL head, and the normalisation of the
dynamic per-device features (computed by :mod:`doppler.listsched`).

Everything is normalised per graph so one policy can serve graphs of different
sizes, cost scales and clusters:

* times are divided by ``time_scale_s``, the graph's critical-path length with
  mean compute and mean communication costs (its largest b-level);
* per-op compute and communication sums are also divided by their largest value.

Static op features (:data:`OP_FEATURES`), in ``[0, 1]``: mean compute / max,
b-level / time scale, t-level / time scale, summed input communication / max,
summed output communication / max (the paper's five); then the tile's block
coordinates over its group's grid (0 for untiled ops: what the enumerative
optimizer exploits) and two fixed values of the op id that break the symmetry
between identical tiles, so a policy can learn one order and one placement for
them (and reproduce its best assignment greedily). Edge features: mean communication of the
edge / max, and a direction bit (0 = along the dataflow, 1 = the added reverse
edge), so messages flow both ways through the DAG.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from doppler.util.jit import jit
from doppler.hardware.costs import CostModel, priority_key
from doppler.ir.graph import DataflowGraph
from doppler.listsched import pred_comm_s
from doppler.ir import analysis

OP_FEATURES = (
    "compute", "b_level", "t_level", "input_comm", "output_comm",
    "block0", "block1", "block2", "block3", "op_id_a", "op_id_b",
)  # fmt: skip
NUM_OP_FEATURES = len(OP_FEATURES)
#: the op features a transferable (pretrained) policy sees: the paper's five, size- and position-free;
#: the block coordinates and op-id values identify positions within one graph (memorisation aids)
STRUCTURAL_OP_FEATURES = OP_FEATURES[:5]
OP_FEATURE_SETS = {"full": OP_FEATURES, "structural": STRUCTURAL_OP_FEATURES}
NUM_EDGE_FEATURES = 2


def op_feature_columns(op_features: str) -> list[int]:
    """The columns of ``GraphFeatures.op_x`` (all of :data:`OP_FEATURES`) that a policy with this
    feature set reads."""
    if op_features not in OP_FEATURE_SETS:
        raise ValueError(f"op_features must be one of {', '.join(OP_FEATURE_SETS)}, got {op_features!r}")
    return [OP_FEATURES.index(f) for f in OP_FEATURE_SETS[op_features]]


def _safe_div(x: np.ndarray, scale: float) -> np.ndarray:
    return x / scale if scale > 0 else np.zeros_like(x)


def _by_max(x: np.ndarray) -> np.ndarray:
    return _safe_div(x, float(x.max(initial=0.0)))


def _argmax_per_group(group: np.ndarray, value: np.ndarray, member: np.ndarray, size: int) -> np.ndarray:
    """For each group id in ``0..size-1`` the ``member`` with the largest ``value``
    (ties: lowest member id), -1 for empty groups."""
    out = np.full(size, -1, dtype=np.int64)
    if group.size == 0:
        return out
    order = np.lexsort((member, -value, group))
    g = group[order]
    first = np.ones(g.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    out[g[first]] = member[order][first]
    return out


def chain_members(nxt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) pairs: ``col`` lies on the chain ``row -> nxt[row] -> ...`` (row included).
    O(ops x depth): for tests and inspection; the policy sums along chains with :func:`jump_tables`."""
    n = nxt.shape[0]
    rows, cols = [], []
    cur = np.arange(n)
    alive = np.arange(n)
    while alive.size:
        rows.append(alive)
        cols.append(cur)
        cur = nxt[cur]
        keep = cur >= 0
        alive, cur = alive[keep], cur[keep]
    return np.concatenate(rows), np.concatenate(cols)


def block_features(graph: DataflowGraph) -> np.ndarray:
    """``[n, 4]``: each tile's block coordinates divided by its group's grid (0 where untiled)."""
    n = graph.num_ops
    out = np.zeros((n, 4))
    if not graph.groups:
        return out
    grids = np.ones((len(graph.groups), 4))
    for i, grp in enumerate(graph.groups):
        k = min(len(grp.grid), 4)
        grids[i, :k] = grp.grid[:k]
    blk = graph.block[:, :4].astype(np.float64)
    tiled = graph.group >= 0
    grid = np.where(tiled[:, None], grids[np.maximum(graph.group, 0)], 1.0)
    ok = tiled[:, None] & (blk >= 0) & (grid > 1)
    out[ok] = (blk / grid)[ok]
    return out


def op_id_features(n: int) -> np.ndarray:
    """``[n, 2]``: fixed low-discrepancy values of each op's id, so ops that the graph's
    structure cannot tell apart (the tiles of one symmetric operation) still get distinct
    embeddings (random node identifiers break a GNN's symmetries, Sato et al. 2021)."""
    ids = np.arange(n, dtype=np.float64)
    return np.stack([np.modf(ids * 0.6180339887498949)[0], np.modf(ids * 0.4142135623730951)[0]], axis=1)


def jump_tables(nxt: np.ndarray) -> list[np.ndarray]:
    """Pointer-jumping tables of the chains ``v -> nxt[v] -> ...``: table ``k`` maps each op to
    the op ``2**k`` steps ahead (-1 past the end). Summing ``x[v] += x[table_k[v]]`` for k = 0,
    1, ... sums ``x`` along every chain in O(ops x log depth), not O(ops x depth)."""
    tables = []
    p = nxt.astype(np.int64)
    while (p >= 0).any():
        tables.append(p)
        p = np.where(p >= 0, p[np.maximum(p, 0)], -1)
    return tables


@dataclass
class GraphFeatures:
    """The static inputs of the policy for one (graph, cluster) pair."""

    op_x: np.ndarray  # float32[n, NUM_OP_FEATURES]
    edge_index: np.ndarray  # int64[2, 2E]: forward edges then reversed ones
    edge_attr: np.ndarray  # float32[2E, NUM_EDGE_FEATURES]
    next_down: np.ndarray  # int64[n]: the next op on each op's longest path to an exit (-1 at exits)
    next_up: np.ndarray  # int64[n]: the previous op on each op's longest path from an entry (-1 at entries)
    down_jumps: list[np.ndarray]  # jump_tables(next_down)
    up_jumps: list[np.ndarray]  # jump_tables(next_up)
    path_scale: float  # paths are summed then divided by this (the graph's depth in ops)
    b_level_s: np.ndarray  # float64[n], mean costs (the SEL teacher's priority)
    b_level_key: np.ndarray  # int64[n]: priority_key(b_level_s), the order SEL's teacher and rule follow
    time_scale_s: float
    costs: CostModel
    graph: DataflowGraph
    loop_arrays: tuple  # (pred_ptr, pred_idx, pred_bytes, pred_comm_s, succ_ptr, succ_idx, in_degree)

    @property
    def num_ops(self) -> int:
        return int(self.op_x.shape[0])

    @property
    def num_devices(self) -> int:
        return self.costs.num_devices


def graph_features(graph: DataflowGraph, cluster=None, *, costs: CostModel | None = None) -> GraphFeatures:
    """Static features of ``graph`` on ``cluster`` (or on explicit ``costs``). O(V + E) vectorised."""
    cm = costs if costs is not None else CostModel.build(graph, cluster)
    n = graph.num_ops
    comp = cm.mean_compute_s()
    edge_comm = cm.mean_edge_comm_s()
    b_level = analysis.b_level(graph, comp, edge_comm)
    t_level = analysis.t_level(graph, comp, edge_comm)
    time_scale = float(b_level.max()) if n else 0.0
    in_comm = np.bincount(graph.dst, weights=edge_comm, minlength=n)
    out_comm = np.bincount(graph.src, weights=edge_comm, minlength=n)
    paper_five = [_by_max(comp), _safe_div(b_level, time_scale), _safe_div(t_level, time_scale), _by_max(in_comm),
                  _by_max(out_comm)]  # fmt: skip
    op_x = np.concatenate([np.stack(paper_five, axis=1), block_features(graph), op_id_features(n)], axis=1)
    op_x = op_x.astype(np.float32)
    e_norm = _by_max(edge_comm).astype(np.float32)
    m = graph.num_edges
    edge_index = np.concatenate([np.stack([graph.src, graph.dst]), np.stack([graph.dst, graph.src])], axis=1)
    edge_attr = np.zeros((2 * m, NUM_EDGE_FEATURES), dtype=np.float32)
    edge_attr[:m, 0] = edge_attr[m:, 0] = e_norm
    edge_attr[m:, 1] = 1.0

    # Longest-path successors/predecessors (the chains b-level and t-level follow).
    down_val = edge_comm + b_level[graph.dst]
    nxt_down = _argmax_per_group(graph.src, down_val, graph.dst, n)
    up_val = t_level[graph.src] + comp[graph.src] + edge_comm
    nxt_up = _argmax_per_group(graph.dst, up_val, graph.src, n)
    return GraphFeatures(
        op_x=op_x,
        edge_index=edge_index.astype(np.int64),
        edge_attr=edge_attr,
        next_down=nxt_down,
        next_up=nxt_up,
        down_jumps=jump_tables(nxt_down),
        up_jumps=jump_tables(nxt_up),
        path_scale=float(max(graph.depth, 1)),
        b_level_s=b_level,
        b_level_key=np.ascontiguousarray(priority_key(b_level), dtype=np.int64),
        time_scale_s=time_scale,
        costs=cm,
        graph=graph,
        loop_arrays=(
            np.ascontiguousarray(graph.pred_ptr, dtype=np.int64),
            np.ascontiguousarray(graph.pred_idx, dtype=np.int64),
            np.ascontiguousarray(cm.pred_bytes(graph), dtype=np.float64),
            pred_comm_s(graph, cm),
            np.ascontiguousarray(graph.succ_ptr, dtype=np.int64),
            np.ascontiguousarray(graph.succ_idx, dtype=np.int64),
            np.ascontiguousarray(np.diff(graph.pred_ptr), dtype=np.int64),
        ),
    )


def _normalise_device_features_numpy(raw, inv_time_scale, out):
    """:func:`normalise_device_features` in numpy (``doppler.util.jit.as_python``)."""
    out[:, :-1] = raw[:, :-1] * inv_time_scale
    out[:, -1] = raw[:, -1]


@jit(cache=True, python=_normalise_device_features_numpy)
def normalise_device_features(raw, inv_time_scale, out):  # pragma: no cover - compiled
    """Raw device features ``raw[D, F]`` (seconds; the last one a 0/1 flag) into policy inputs ``out[D, F]``."""
    nd, nf = raw.shape
    for d in range(nd):
        for f in range(nf - 1):
            out[d, f] = raw[d, f] * inv_time_scale
        out[d, nf - 1] = raw[d, nf - 1]
