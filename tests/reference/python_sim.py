"""The pure-Python reference simulator: the same semantics as ``doppler.sim``'s compiled
event loop, written straightforwardly (heapq, lists, dicts). The tests require bit-identical
makespans and traces from both; it is test-only code, not part of the product.
"""

from __future__ import annotations

import heapq
from typing import Any, Sequence

import numpy as np

from doppler.ir.assignment import as_devices, check_assignment
from doppler.sim import SimContext, SimResult, check_options, context


def simulate_python(graph, cluster, assignment: Any, *, mode: str = "wc", trace: bool = False,
                    noise_sigma: float = 0.0, seed: int = 0, link_contention: bool = False,
                    dispatch: str = "fifo", priority: Sequence[float] | None = None) -> SimResult:  # fmt: skip
    """``doppler.sim.simulate`` with the same options and checks, run by the reference loop."""
    ctx = context(graph, cluster)
    mode, sigma, seed = check_options(mode, noise_sigma, seed)
    key = ctx._dispatch_key(dispatch, priority, mode)
    dev = np.ascontiguousarray(check_assignment(graph, as_devices(assignment), ctx.num_devices), dtype=np.int64)
    op_f, edge_f = ctx.noise(sigma, seed)
    mk, *arrays = _event_loop(ctx, dev, op_f, edge_f, mode == "bsp", bool(link_contention), key)
    if not trace:
        return SimResult(float(mk), None, mode)
    return ctx.result(dev, mode, float(mk), *arrays)


def simulate_many_python(graph, cluster, assignments: Any, **options: Any) -> np.ndarray:
    """Row by row :func:`simulate_python` (the same options as ``doppler.sim.simulate_many``)."""
    return np.array([simulate_python(graph, cluster, row, **options).makespan_s for row in np.asarray(assignments)])


def _event_loop(
    ctx: SimContext,
    dev: np.ndarray,
    op_f: np.ndarray,
    edge_f: np.ndarray,
    bsp: bool,
    contention: bool,
    key: np.ndarray | None = None,
):
    """An independent, straightforward implementation of the same semantics (heapq + dicts).

    ``key`` (priority dispatch): each device's ready queue is ordered by
    ``(key[v], v)`` instead of ``(ready time, v)``. A transfer ``k`` into a device
    with ``copies_inbound`` waits in that device's queue as ``(request time, n + k)``.

    Returns the same tuple of trace arrays as the kernel path. Bit-identical to
    it because every duration is computed with the same floating-point
    expression and every start time is the current event time.
    """
    n, D = ctx.num_ops, ctx.num_devices
    succ_ptr, succ_idx = ctx.succ_ptr.tolist(), ctx.succ_idx.tolist()
    dev_l = [int(x) for x in dev]
    comp = ctx.comp
    streams = ctx.streams.tolist()
    level = ctx.level.tolist()
    copies_in = ctx.copies_in.tolist()
    prio_key = None if key is None else [float(x) for x in key]

    # transfers in creation order, with the noise slot of their first consumer
    transfers: list[tuple[int, int, int]] = []  # (producer, dst device, succ slot)
    tr_of: dict[int, list[int]] = {}
    for u in range(n):
        seen: set[int] = set()
        for sl in range(succ_ptr[u], succ_ptr[u + 1]):
            b = dev_l[succ_idx[sl]]
            if b != dev_l[u] and b not in seen:
                seen.add(b)
                tr_of.setdefault(u, []).append(len(transfers))
                transfers.append((u, b, sl))
    ntr = len(transfers)

    def tr_dur(k: int) -> float:
        u, b, sl = transfers[k]
        a = dev_l[u]
        return (float(ctx.lat[a, b]) + float(ctx.out_bytes[u]) / float(ctx.bw[a, b])) * float(edge_f[sl])

    op_ready = [0.0] * n
    op_start = [0.0] * n
    op_end = [0.0] * n
    tr_start = [0.0] * ntr
    tr_end = [0.0] * ntr
    pending = [int(x) for x in ctx.indeg]
    ready_q: list[list[tuple[float, int]]] = [[] for _ in range(D)]
    running = [0] * D
    link_q: dict[tuple[int, int], list[tuple[float, int, int]]] = {}
    link_busy: set[tuple[int, int]] = set()
    events: list[tuple[float, int, int]] = []  # (time, kind 0=op end / 1=arrival, id)
    left_in_level: list[int] = []
    level_ops: list[list[int]] = []
    cur = 0
    if bsp:
        nlev = max(level) + 1
        level_ops = [[] for _ in range(nlev)]
        for v in range(n):
            level_ops[level[v]].append(v)
        left_in_level = [len(ops) for ops in level_ops]
        for u, _, _ in transfers:
            left_in_level[level[u]] += 1

    def make_ready(v: int, t: float) -> None:
        op_ready[v] = t
        heapq.heappush(ready_q[dev_l[v]], (t if prio_key is None else prio_key[v], v))

    if bsp:
        for v in level_ops[0]:
            make_ready(v, 0.0)
    else:
        for v in range(n):
            if pending[v] == 0:
                make_ready(v, 0.0)

    def arrive(u: int, b: int, t: float) -> None:
        for sl in range(succ_ptr[u], succ_ptr[u + 1]):
            w = succ_idx[sl]
            if dev_l[w] == b:
                pending[w] -= 1
                if pending[w] == 0:
                    make_ready(w, t)

    def done(u: int, t: float) -> None:
        nonlocal cur
        if not bsp:
            return
        left_in_level[level[u]] -= 1
        if left_in_level[cur] == 0 and cur + 1 < len(level_ops):
            cur += 1
            for v in level_ops[cur]:
                make_ready(v, t)

    t = 0.0
    makespan = 0.0
    while True:
        for d in range(D):
            while running[d] < streams[d] and ready_q[d]:
                _, v = heapq.heappop(ready_q[d])
                running[d] += 1
                if v >= n:  # a copy made by its destination d
                    k = v - n
                    tr_start[k] = t
                    tr_end[k] = t + tr_dur(k)
                    heapq.heappush(events, (tr_end[k], 1, k))
                    continue
                op_start[v] = t
                op_end[v] = t + float(comp[v, d]) * float(op_f[v])
                heapq.heappush(events, (op_end[v], 0, v))
        for link, q in link_q.items():
            if link not in link_busy and q:
                _, _, k = heapq.heappop(q)
                link_busy.add(link)
                tr_start[k] = t
                tr_end[k] = t + tr_dur(k)
                heapq.heappush(events, (tr_end[k], 1, k))
        if not events:
            break
        t = events[0][0]
        while events and events[0][0] == t:
            _, kind, x = heapq.heappop(events)
            if kind == 0:
                u = x
                running[dev_l[u]] -= 1
                makespan = max(makespan, t)
                if not bsp:
                    arrive(u, dev_l[u], t)
                for k in tr_of.get(u, ()):
                    b = transfers[k][1]
                    if copies_in[b]:
                        heapq.heappush(ready_q[b], (t, n + k))
                    elif contention:
                        heapq.heappush(link_q.setdefault((dev_l[u], b), []), (t, u, k))
                    else:
                        tr_start[k] = t
                        tr_end[k] = t + tr_dur(k)
                        heapq.heappush(events, (tr_end[k], 1, k))
                done(u, t)
            else:
                k = x
                u, b, _ = transfers[k]
                if copies_in[b]:
                    running[b] -= 1
                else:
                    link_busy.discard((dev_l[u], b))
                if not bsp:
                    arrive(u, b, t)
                done(u, t)
    return (
        makespan,
        np.array(op_ready),
        np.array(op_start),
        np.array(op_end),
        np.array([tr[0] for tr in transfers], dtype=np.int64),
        np.array([tr[1] for tr in transfers], dtype=np.int64),
        np.array(tr_start, dtype=np.float64),
        np.array(tr_end, dtype=np.float64),
    )


