"""ENUMERATIVE: a structure-aware placement heuristic in the spirit of the paper's
ENUMERATIVE OPTIMIZER.

Workload builders split each large tensor op into tile ops that share a
``graph.group`` id, with the tile's block index in ``graph.block``. This method
places one **logical op (group) at a time**, enumerating a small family of
structured placements of its tiles and keeping the one with the best estimate.

Cost estimate. Every device has an accumulated cost ``load[d]`` in seconds. An op
``v`` placed on ``d`` adds its compute time on ``d`` plus, for each input produced
on another device ``d'``, the transfer time ``latency + bytes / bandwidth`` of the
link ``d' -> d`` (an output sent to several ops on one device is counted once).
Measuring transfers in seconds is the same as charging ``bytes x (FLOP/s /
bandwidth)`` FLOP-equivalents, the flops-per-byte factor of the cluster. Inputs
not yet placed cost nothing.

Units are processed in topological order (a group's position is the earliest
topological position of its tiles; ops without a group are units of their own).

For a group with ``m`` tiles the candidate plans are, for every

* device range: a power-of-two size ``s`` (1, 2, 4, ... up to ``D``, plus ``D``
  itself) starting at an offset aligned to ``s`` (``0, s, 2s, ...``);
* split key: the row-major linear block index, or one block dimension that
  varies inside the group (e.g. split a matmul's partial products by output row
  ``i``, by output column ``j`` or by contraction index ``k``); tile ``t`` goes to
  device ``offset + key[t] mod s``;
* aggregation location: (a) by the split rule, (b) every tile that consumes
  another tile of the same group (the adds that aggregate partial products) goes
  to the device holding most of its input bytes, or (c) every tile goes to the
  device holding most of its input bytes (the split rule only breaks ties and
  places tiles whose inputs are not placed yet).

The plan minimising the maximum accumulated device cost after placement wins
(ties: smaller total cost, then enumeration order), and its loads are kept. Ops
without a group fall back to per-op greedy: each goes to the device minimising
the maximum accumulated cost including its input transfers (ties: smaller added
cost, then lowest device id). The method is deterministic; it has no makespan
estimate (``info["max_device_cost_s"]`` holds the final maximum load).

With a memory budget (``memory_budget_bytes``, given by :func:`~doppler.methods.assign`), a plan is
kept only if every device it uses has room for the weight slices it adds and for the group's
outputs there (:mod:`doppler.listsched.ledger`), and an op without a group goes only to a device
with room for it; where no plan or device has room, the method fails naming the op.
"""

from __future__ import annotations

import numpy as np

from doppler.ir.assignment import Assignment
from doppler.listsched.ledger import MemoryLedger
from doppler.methods.placement import no_room
from doppler.methods.registry import PythonRun, register
from doppler.hardware.costs import CostModel
from doppler.ir.graph import DataflowGraph, _csr, expand_ranges


def _range_plans(nd: int) -> list[tuple[int, int]]:
    sizes = [1 << k for k in range(int(nd).bit_length())]  # the powers of two up to nd
    if sizes[-1] != nd:
        sizes.append(nd)
    return [(s, o) for s in sizes for o in range(0, nd - s + 1, s)]


def _split_keys(blocks: np.ndarray) -> list[np.ndarray]:
    """Linear block index plus each varying block dimension (index order if no block info)."""
    b = np.where(blocks < 0, 0, blocks).astype(np.int64)
    varying = [k for k in range(b.shape[1]) if np.unique(b[:, k]).size > 1]
    if not varying:
        return [np.arange(b.shape[0], dtype=np.int64)]
    lin = np.zeros(b.shape[0], dtype=np.int64)
    for k in varying:
        lin = lin * (int(b[:, k].max()) + 1) + b[:, k]
    keys = [lin]
    if len(varying) > 1:
        keys += [b[:, k] for k in varying]
    return keys


class _Placer:
    def __init__(self, graph: DataflowGraph, cm: CostModel, ledger: MemoryLedger | None = None):
        self.g = graph
        self.cm = cm
        self.nd = cm.num_devices
        self.dev = np.full(graph.num_ops, -1, dtype=np.int64)
        self.load = np.zeros(self.nd)
        self.pb = cm.pred_bytes(graph)
        self.in_deg = np.diff(graph.pred_ptr)
        self.ledger = ledger
        self.placed = 0

    def _fits(self, ops: np.ndarray, plans: np.ndarray) -> np.ndarray:
        """bool[P]: whether putting ``ops`` on ``plans[k]`` keeps every device within the ledger's caps (weight
        slices it adds, each once, and the ops' outputs). Each device's bytes are summed in the order of a
        loop over the ops and their slices: outputs first, then each slice where it is first added."""
        led = self.ledger
        npl, m = plans.shape
        add = np.zeros((npl, self.nd))
        rows = np.repeat(np.arange(npl), m)
        np.add.at(add, (rows, plans.reshape(-1)), np.tile(led.out_bytes[ops], npl))
        counts = led.slice_ptr[ops + 1] - led.slice_ptr[ops]
        if counts.sum():
            reads = expand_ranges(led.slice_ptr, ops)
            s = led.slice_idx[reads]  # [R]: the slices the ops read, op by op
            d = plans[:, np.repeat(np.arange(m), counts)]  # [P, R]: the device of each read
            k = np.broadcast_to(np.arange(npl)[:, None], d.shape)
            new = ~led.held[s[None, :], d]
            key = (k[new] * led.held.shape[0] + np.broadcast_to(s, d.shape)[new]) * self.nd + d[new]
            first = np.sort(np.unique(key, return_index=True)[1])  # each (plan, slice, device) once, in loop order
            np.add.at(add, (k[new][first], d[new][first]), led.slice_bytes[np.broadcast_to(s, d.shape)[new][first]])
        return np.all(led.used[None, :] + add <= led.cap[None, :], axis=1)

    def _hold(self, ops: np.ndarray) -> None:
        if self.ledger is not None:
            for v in ops.tolist():
                self.ledger.hold(v, int(self.dev[v]))
        self.placed += len(ops)

    # ---------------------------------------------------------- single op
    def place_op(self, v: int) -> None:
        g, cm = self.g, self.cm
        lo, hi = g.pred_ptr[v], g.pred_ptr[v + 1]
        cost = cm.compute_s[v].copy()
        if hi > lo:
            p = g.pred_idx[lo:hi]
            sd = self.dev[p]
            ok = sd >= 0
            if ok.any():
                sd = sd[ok]
                t = cm.latency_s[sd] + self.pb[lo:hi][ok, None] * cm.inv_bw[sd]  # [k, D], 0 where same device
                cost += t.sum(axis=0)
        score = np.maximum(self.load.max(), self.load + cost)
        if self.ledger is not None:
            room = self.ledger.room(v)
            if not room.any():
                raise no_room(g, self.ledger.used, self.ledger.cap, v, self.placed, "enumerative")
            score = np.where(room, score, np.inf)
        d = int(np.lexsort((np.arange(self.nd), cost, score))[0])
        self.dev[v] = d
        self.load[d] += cost[d]
        self._hold(np.array([v]))

    # -------------------------------------------------------------- groups
    def _local_fill(self, plans: np.ndarray, which: np.ndarray, ctx: dict) -> np.ndarray:
        """Each of ``plans[R, m]`` (the group's tiles' devices) with its tiles ``which`` re-placed, level by
        level, on the device holding most of their input bytes (ties: the plan's device if it is among
        the best, else the lowest best device); tiles whose inputs are not placed keep their device."""
        plans = plans.copy()
        npl, m = plans.shape
        levels = ctx["levels"]
        for lv in np.unique(levels[which]):
            at_level = which & (levels == lv)
            sel = np.flatnonzero(at_level)
            e_mask = at_level[ctx["e_vi"]]  # the edges into them
            if not e_mask.any():
                continue
            vi = ctx["e_vi"][e_mask]
            e_int = ctx["e_int"][e_mask]
            src = np.where(e_int >= 0, plans[:, np.maximum(e_int, 0)], self.dev[ctx["e_p"][e_mask]])  # [R, E]
            okm = src >= 0
            if not okm.any():
                continue
            r, e = np.nonzero(okm)
            acc = np.zeros((npl, m, self.nd))  # input bytes per (plan, tile, device), summed in edge order
            np.add.at(acc, (r, vi[e], src[r, e]), ctx["e_bytes"][e_mask][e] + 1e-300)
            a = acc[:, sel]
            best = a.max(axis=2, keepdims=True)
            tied = a >= best
            rule = plans[:, sel]
            keep = np.take_along_axis(tied, rule[:, :, None], axis=2)[:, :, 0]
            moved = np.where(keep, rule, np.argmax(tied, axis=2))
            plans[:, sel] = np.where(best[:, :, 0] > 0, moved, rule)
        return plans

    def place_group(self, ops: np.ndarray) -> None:
        g, cm, nd = self.g, self.cm, self.nd
        m = ops.shape[0]
        local = np.full(g.num_ops, -1, dtype=np.int64)
        local[ops] = np.arange(m)
        # every edge into an op of the unit
        counts = g.pred_ptr[ops + 1] - g.pred_ptr[ops]
        slots = expand_ranges(g.pred_ptr, ops)
        e_vi = np.repeat(np.arange(m), counts)
        e_p = g.pred_idx[slots]
        e_int = local[e_p]
        e_bytes = self.pb[slots]
        ctx = {"e_vi": e_vi, "e_p": e_p, "e_int": e_int, "e_bytes": e_bytes, "levels": g.level[ops]}
        consumes_own = np.zeros(m, dtype=bool)
        consumes_own[e_vi[e_int >= 0]] = True

        keys = _split_keys(g.block[ops])
        rules = np.stack([o + key % s for s, o in _range_plans(nd) for key in keys])
        own = self._local_fill(rules, consumes_own, ctx) if consumes_own.any() else rules
        every = self._local_fill(rules, np.ones(m, dtype=bool), ctx)
        plans = {p.tobytes(): p for trio in zip(rules, own, every) for p in trio}  # distinct plans, first-seen order
        P = np.stack(list(plans.values()))  # [P, m]
        npl = P.shape[0]
        comp = cm.compute_s[ops[None, :], P]  # [P, m]
        tot = np.zeros((npl, nd))
        np.add.at(tot, (np.repeat(np.arange(npl), m), P.reshape(-1)), comp.reshape(-1))
        # transfers into the unit (deduplicated per (plan, producer, destination device))
        if e_vi.size:
            dst = P[:, e_vi]  # [P, E]
            src = np.where(e_int[None, :] >= 0, P[:, np.maximum(e_int, 0)], self.dev[e_p][None, :])
            mask = (src >= 0) & (src != dst)
            if mask.any():
                pi, ei = np.nonzero(mask)
                s_d, d_d = src[pi, ei], dst[pi, ei]
                key = (pi * g.num_ops + e_p[ei]) * nd + d_d
                _, first = np.unique(key, return_index=True)
                pi, ei, s_d, d_d = pi[first], ei[first], s_d[first], d_d[first]
                t = cm.latency_s[s_d, d_d] + e_bytes[ei] * cm.inv_bw[s_d, d_d]
                np.add.at(tot, (pi, d_d), t)
        new = self.load[None, :] + tot
        score = new.max(axis=1)
        total = new.sum(axis=1)
        if self.ledger is not None:
            ok = self._fits(ops, P)
            if not ok.any():
                raise no_room(g, self.ledger.used, self.ledger.cap, int(ops[0]), self.placed, "enumerative")
            score = np.where(ok, score, np.inf)
        best = int(np.lexsort((np.arange(npl), total, score))[0])
        self.dev[ops] = P[best]
        self.load = new[best]
        self._hold(ops)


def enumerative_assign(graph: DataflowGraph, cluster,
                       memory_budget_bytes: np.ndarray | None = None) -> tuple[np.ndarray, float]:  # fmt: skip
    """(device per op, final maximum accumulated device cost in seconds); within ``memory_budget_bytes[D]``
    where given (module docstring)."""
    cm = CostModel.build(graph, cluster)
    ledger = None if memory_budget_bytes is None else MemoryLedger.build(graph, cm.num_devices, memory_budget_bytes)
    placer = _Placer(graph, cm, ledger)
    n = graph.num_ops
    pos = np.empty(n, dtype=np.int64)
    pos[graph.topo_order] = np.arange(n)
    grp = graph.group.astype(np.int64)
    # unit id: group id for grouped ops, (num_groups + op id) for the rest
    unit = np.where(grp >= 0, grp, len(graph.groups) + np.arange(n))
    uniq, inv = np.unique(unit, return_inverse=True)
    first_pos = np.full(uniq.size, n, dtype=np.int64)
    np.minimum.at(first_pos, inv, pos)
    ptr, members, _ = _csr(inv, np.arange(n), uniq.size)
    for u in np.argsort(first_pos, kind="stable"):
        ops = members[ptr[u] : ptr[u + 1]]
        if ops.size == 1 and grp[ops[0]] < 0:
            placer.place_op(int(ops[0]))
        else:
            placer.place_group(ops[np.argsort(pos[ops], kind="stable")])
    return placer.dev, float(placer.load.max())


@register("enumerative", description="structure-aware: enumerate tile placements per logical op, min max device cost",
          python=PythonRun(), memory_aware=True)
def enumerative(graph: DataflowGraph, cluster, *, memory_budget_bytes: np.ndarray | None = None) -> Assignment:
    """Structure-aware enumerative heuristic (deterministic; see the module docstring)."""
    dev, max_cost = enumerative_assign(graph, cluster, memory_budget_bytes)
    return Assignment(devices=dev, info={"max_device_cost_s": max_cost})
