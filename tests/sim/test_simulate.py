"""The WC/BSP simulator: hand-computed examples, properties on random DAGs and clusters,
numba vs pure-Python vs SimPy agreement, and input errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doppler.ir.analysis import critical_path_length
from doppler.ir.assignment import Assignment, AssignmentError
from doppler.ir.graph import DataflowGraph, OpKind, from_edges
from doppler.hardware.cluster import Cluster, Device, homogeneous
from doppler.hardware.presets import unit
from doppler.sim import (
    SimContext,
    SimulationError,
    context,
    lower_bound,
    simulate,
    simulate_many,
    work_bound,
)
from doppler.sim.loops import ARRAYS, sim_many, sim_rows
from tests.reference.python_sim import simulate_many_python, simulate_python

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REL = 1e-9


# --------------------------------------------------------------------------- strategies
@st.composite
def cases(draw, max_ops: int = 14, max_devices: int = 4, max_streams: int = 2, copies: bool = True):
    """(graph, cluster, assignment) with small power-of-two costs, so ties are frequent and exact.
    ``copies``: some devices may make their inbound copies themselves (``copies_inbound``)."""
    n = draw(st.integers(1, max_ops))
    edges = []
    for v in range(1, n):
        for u in draw(st.lists(st.integers(0, v - 1), max_size=3, unique=True)):
            edges.append((u, v))
    flops = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, 4.0]), min_size=n, max_size=n))
    nbytes = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 4.0]), min_size=n, max_size=n))
    kinds = draw(st.lists(st.sampled_from([int(OpKind.MATMUL), int(OpKind.ADD)]), min_size=n, max_size=n))
    g = from_edges(flops, edges, nbytes, kind=kinds)
    D = draw(st.integers(1, max_devices))
    devices = []
    for i in range(D):
        by_kind = {"add": draw(st.sampled_from([0.5, 1.0, 4.0]))} if draw(st.booleans()) else {}
        devices.append(
            Device(
                f"d{i}",
                flops_per_s=draw(st.sampled_from([0.5, 1.0, 2.0])),
                flops_per_s_by_kind=by_kind,
                streams=draw(st.integers(1, max_streams)),
                copies_inbound=copies and draw(st.booleans()),
            )
        )
    bw = np.array(draw(st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=D * D, max_size=D * D))).reshape(D, D)
    lat = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=D * D, max_size=D * D))).reshape(D, D)
    c = Cluster("rand", devices, bw, lat)
    a = np.array(draw(st.lists(st.integers(0, D - 1), min_size=n, max_size=n)), dtype=np.int64)
    return g, c, a


OPTIONS = st.sampled_from(
    [
        dict(mode="wc"),
        dict(mode="wc", link_contention=True),
        dict(mode="bsp"),
        dict(mode="bsp", link_contention=True),
    ]
)
WC_OPTIONS = st.sampled_from([dict(), dict(link_contention=True)])


@st.composite
def priorities(draw, n: int):
    """None (the op-id default) or one priority per op from a small set, so ties are frequent."""
    if draw(st.booleans()):
        return None
    return np.array(draw(st.lists(st.sampled_from([-1.5, 0.0, 1.0, 2.0, 7.0]), min_size=n, max_size=n)))


# --------------------------------------------------------------------------- trace checks
def _arrivals(g: DataflowGraph, tr) -> dict[tuple[int, int], float]:
    return tr.arrival_s(g)


def check_trace(
    g: DataflowGraph, c: Cluster, a: np.ndarray, res, *, mode: str, contention: bool, priority: np.ndarray | None = None
) -> None:
    """Every §5 rule that can be read off a noise-free trace (``priority``: priority dispatch)."""
    tr = res.trace
    n, D = g.num_ops, c.num_devices
    comp = c.compute_time_s(g)
    dev, ready, start, end = tr.op_device, tr.op_ready, tr.op_start, tr.op_end
    assert np.array_equal(dev, a)
    assert res.makespan_s == end.max()
    # op durations
    np.testing.assert_allclose(end - start, comp[np.arange(n), a], rtol=1e-12, atol=1e-12)
    assert np.all(start >= ready)
    # exactly one transfer per (producer, remote consumer device)
    want = {(int(u), int(a[w])) for u, w in zip(g.src, g.dst) if a[u] != a[w]}
    got = list(zip(tr.tr_src_op.tolist(), tr.tr_dst_device.tolist()))
    assert len(got) == len(set(got)) and set(got) == want
    tt = c.transfer_time_s(g.output_bytes)
    for k, (u, b) in enumerate(got):
        assert tr.tr_src_device[k] == a[u]
        assert tr.tr_bytes[k] == g.output_bytes[u]
        assert tr.tr_start[k] >= end[u]
        if not contention and not c.devices[b].copies_inbound:
            assert tr.tr_start[k] == end[u]
        assert tr.tr_end[k] - tr.tr_start[k] == pytest.approx(tt[u, a[u], b], rel=1e-12, abs=1e-12)
    # dependencies: every input has arrived before the op is ready
    arr = _arrivals(g, tr)
    for v in range(n):
        preds = g.predecessors(v)
        last = max((arr[(int(u), int(a[v]))] for u in preds), default=0.0)
        assert ready[v] >= last
        if mode == "wc":
            assert ready[v] == last
    # never more than `streams` ops (and inbound copies it makes) at once on a device (half-open intervals)
    for d in range(D):
        _, s_d, e_d = device_items(c, tr, d)
        busy = e_d > s_d
        ev = sorted([(x, 0) for x in e_d[busy]] + [(x, 1) for x in s_d[busy]])
        live = 0
        for _, kind in ev:
            live += 1 if kind else -1
            assert live <= c.devices[d].streams
    # with contention, a link carries one transfer at a time
    if contention:
        links: dict[tuple[int, int], list[tuple[float, float]]] = {}
        for k in range(tr.num_transfers):
            if tr.tr_end[k] > tr.tr_start[k] and not c.devices[int(tr.tr_dst_device[k])].copies_inbound:
                links.setdefault((int(tr.tr_src_device[k]), int(tr.tr_dst_device[k])), []).append((tr.tr_start[k], tr.tr_end[k]))
        for iv in links.values():
            iv.sort()
            for (_, e0), (s1, _) in zip(iv, iv[1:]):
                assert s1 >= e0
    if mode == "wc":
        check_work_conserving(c, tr, priority)
    else:
        check_bsp_barriers(g, tr)


def device_items(c: Cluster, tr, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ready, start, end) of what device ``d`` runs: its ops, then the inbound copies it makes
    (a copy is ready when its producer finishes)."""
    ops = tr.op_device == d
    if not c.devices[d].copies_inbound:
        return tr.op_ready[ops], tr.op_start[ops], tr.op_end[ops]
    ks = tr.tr_dst_device == d
    req = tr.op_end[tr.tr_src_op[ks]]
    return (np.concatenate([tr.op_ready[ops], req]), np.concatenate([tr.op_start[ops], tr.tr_start[ks]]),
            np.concatenate([tr.op_end[ops], tr.tr_end[ks]]))  # fmt: skip


def check_work_conserving(c: Cluster, tr, priority: np.ndarray | None = None) -> None:
    """No device has a free stream while one of its ops (or inbound copies it makes) is ready;
    FIFO by ready time, or with ``priority`` an op never starts while an op of a smaller
    (priority, id) has been waiting."""
    dev, ready, start = tr.op_device, tr.op_ready, tr.op_start
    for d in range(c.num_devices):
        r_d, s_d, e_d = device_items(c, tr, d)
        k = c.devices[d].streams
        same = np.flatnonzero(e_d > s_d)
        for v in np.flatnonzero(s_d > r_d):
            cuts = sorted({r_d[v], s_d[v], *[x for w in same for x in (s_d[w], e_d[w]) if r_d[v] < x < s_d[v]]})
            for lo, hi in zip(cuts, cuts[1:]):
                mid = 0.5 * (lo + hi)
                busy = int(np.sum((s_d[same] <= mid) & (mid < e_d[same])))
                assert busy >= k, f"device {d} idle during [{lo}, {hi}) while item {v} was ready"
        if priority is None:
            for x in range(len(r_d)):
                assert np.all(s_d[r_d > r_d[x]] >= s_d[x]), "FIFO by ready time violated"
    if priority is None:
        return
    for d in range(c.num_devices):
        ops = np.flatnonzero(dev == d)
        for x in ops:
            # ops already waiting (ready strictly before x started) and still waiting after
            waiting = ops[(ready[ops] < start[x]) & (start[ops] > start[x])]
            for y in waiting:
                assert (priority[x], x) < (priority[y], y), f"op {x} started while op {y} of higher priority waited"


def check_bsp_barriers(g: DataflowGraph, tr) -> None:
    """Nothing of level k+1 starts before every op and transfer of level k has finished."""
    lvl = g.level
    prev_barrier = 0.0
    for k in range(g.depth):
        ops = np.flatnonzero(lvl == k)
        if k > 0:
            prev = np.flatnonzero(lvl == k - 1)
            trs = np.flatnonzero(lvl[tr.tr_src_op] == k - 1)
            barrier = max(tr.op_end[prev].max(), tr.tr_end[trs].max() if trs.size else -np.inf)
            assert barrier >= prev_barrier
            assert np.all(tr.op_ready[ops] == barrier)
            assert np.all(tr.op_start[ops] >= barrier)
            prev_barrier = barrier
        else:
            assert np.all(tr.op_ready[ops] == 0.0)


# --------------------------------------------------------------------------- hand examples
def _copying(c: Cluster) -> Cluster:
    """``c`` with every device making its own inbound copies."""
    from dataclasses import replace

    return Cluster(c.name, [replace(d, copies_inbound=True) for d in c.devices], c.bandwidth_Bps, c.latency_s)


def test_a_device_that_copies_queues_the_copy_with_its_ops() -> None:
    # op 0 (d0, 1 s) sends 2 bytes to op 2 on d1; op 1 (d1, 3 s) keeps d1 busy until 3
    g = from_edges([1, 3, 1], [(0, 2)], [2, 0, 0])
    for sim in (simulate, simulate_python):
        free = sim(g, unit(2), [0, 1, 1], trace=True).trace
        assert (free.tr_start[0], free.tr_end[0], free.op_start[2]) == (1.0, 3.0, 3.0)  # the link overlaps op 1
        own = sim(g, _copying(unit(2)), [0, 1, 1], trace=True).trace
        assert (own.tr_start[0], own.tr_end[0], own.op_start[2]) == (3.0, 5.0, 5.0)  # d1 copies after op 1
        assert own.makespan_s == 6.0 and own.op_ready[2] == 5.0
        # d1 was busy all along: op 1, the copy it made, op 2
        np.testing.assert_allclose(own.utilisation(_copying(unit(2))), [1 / 6, 1.0])
        np.testing.assert_allclose(free.utilisation(unit(2)), [1 / 4, 1.0])


def test_a_copy_requested_with_a_ready_op_runs_after_it() -> None:
    # at t=1 op 0 (d0) finishes, op 1 (d1, ready at 1 after op 3) and the copy of op 0 into d1 are both
    # ready: the op goes first (ties: ops, then copies by producer)
    g = from_edges([1, 1, 1, 1], [(3, 1), (0, 2)], [1, 0, 0, 0])
    t = simulate(g, _copying(unit(2)), [0, 1, 1, 1], trace=True).trace
    assert t.op_start[1] == 1.0 and t.tr_start[0] == 2.0 and t.op_start[2] == 3.0


def test_priority_dispatch_refuses_devices_that_copy() -> None:
    g = from_edges([1, 1], [(0, 1)], [1, 1])
    with pytest.raises(SimulationError, match="copies_inbound: gpu0, gpu1"):
        simulate(g, _copying(unit(2)), [0, 1], dispatch="priority")


def test_completions_and_arrivals_before_dispatch() -> None:
    """At t=2 op 0 finishes on d0 (readying op 4) and op 1's output arrives (readying op 3).
    Both are ready at 2, so the lower id (3) runs first; dispatching right after op 0's
    completion would wrongly pick op 4."""
    g = from_edges([2, 1, 1, 1, 1], [(1, 2), (1, 3), (0, 4)], [0, 1, 0, 0, 0])
    c = unit(2)
    r = simulate(g, c, [0, 1, 1, 0, 0], trace=True)
    t = r.trace
    np.testing.assert_array_equal(t.op_start, [0, 0, 1, 2, 3])
    np.testing.assert_array_equal(t.op_ready, [0, 0, 1, 2, 2])
    np.testing.assert_array_equal(t.op_end, [2, 1, 2, 3, 4])
    assert r.makespan_s == 4.0
    assert t.num_transfers == 1 and (t.tr_start[0], t.tr_end[0]) == (1.0, 2.0)


def test_fifo_by_ready_time_beats_op_id() -> None:
    """d0 is busy until 4; op 2 is ready at 3 and op 1 at 3.5, so op 2 runs first."""
    g = from_edges([4, 1, 1, 3, 0.5], [(3, 2), (4, 1)], [0, 0, 0, 0, 0])
    c = unit(2)
    r = simulate(g, c, [0, 0, 0, 1, 1], trace=True)
    t = r.trace
    np.testing.assert_array_equal(t.op_ready, [0, 3.5, 3, 0, 0])
    np.testing.assert_array_equal(t.op_start, [0, 5, 4, 0, 3])
    assert r.makespan_s == 6.0
    # ties at time 0 on d1: op 3 before op 4 (op id)
    assert t.op_start[3] < t.op_start[4]


def test_one_transfer_per_destination_device() -> None:
    g = from_edges([1, 1, 1, 1], [(0, 1), (0, 2), (0, 3)], [5, 0, 0, 0])
    r = simulate(g, unit(2), [0, 1, 1, 0], trace=True)
    assert r.trace.num_transfers == 1
    assert r.makespan_s == 1 + 5 + 1 + 1  # op0, transfer, then ops 1 and 2 back to back on d1


def test_link_contention_serialises_fifo_with_producer_tiebreak() -> None:
    # ops 0 and 1 finish at 1 on d0; both send 2 bytes to d1 -> the link serves op 0 first
    g = from_edges([1, 1, 1, 1], [(0, 2), (1, 3)], [2, 2, 0, 0])
    c = homogeneous("u", 2, flops_per_s=1.0, bandwidth_Bps=1.0, streams=2)
    free = simulate(g, c, [0, 0, 1, 1], trace=True)
    busy = simulate(g, c, [0, 0, 1, 1], trace=True, link_contention=True)
    assert free.makespan_s == 1 + 2 + 1
    np.testing.assert_array_equal(busy.trace.tr_start, [1, 3])
    np.testing.assert_array_equal(busy.trace.op_start[2:], [3, 5])
    assert busy.makespan_s == 6.0


def test_streams_run_ops_concurrently() -> None:
    g = from_edges([2, 2, 2, 2], [], [0, 0, 0, 0])
    assert simulate(g, unit(1), [0, 0, 0, 0]).makespan_s == 8.0
    c2 = unit(1).with_streams(2)
    assert simulate(g, c2, [0, 0, 0, 0]).makespan_s == 4.0


def test_bsp_barrier_waits_for_transfers_of_the_level() -> None:
    # level 0: op 0 (d0, 1s) sends 3 bytes to op 3 (level 2, d1); level 1: op 2 on d1 needs op 1
    g = from_edges([1, 1, 1, 1], [(0, 3), (1, 2), (2, 3)], [3, 0, 0, 0])
    c = unit(2)
    wc = simulate(g, c, [0, 1, 1, 1], trace=True)
    bsp = simulate(g, c, [0, 1, 1, 1], trace=True, mode="bsp")
    assert wc.trace.op_start[2] == 1.0
    assert bsp.trace.op_start[2] == 4.0  # level 1 waits for op 0's transfer (1 + 3)
    assert bsp.makespan_s == 6.0 and wc.makespan_s == 5.0


def test_zero_cost_graph() -> None:
    g = from_edges([0, 0, 0], [(0, 1), (1, 2)], [0, 0, 0])
    for mode in ("wc", "bsp"):
        r = simulate(g, unit(2), [0, 1, 0], mode=mode, trace=True)
        assert r.makespan_s == 0.0
        assert np.all(r.trace.op_end == 0.0)


# --------------------------------------------------------------------------- properties
@SETTINGS
@given(cases(), OPTIONS)
def test_trace_rules_and_lower_bound(case, opts) -> None:
    g, c, a = case
    res = simulate(g, c, a, trace=True, **opts)
    check_trace(g, c, a, res, mode=opts["mode"], contention=opts.get("link_contention", False))
    assert res.makespan_s >= lower_bound(g, c) * (1 - REL)


@SETTINGS
@given(cases(), OPTIONS, st.sampled_from([0.0, 0.3]))
def test_numba_and_python_fallback_agree(case, opts, sigma) -> None:
    g, c, a = case
    fast = simulate(g, c, a, trace=True, noise_sigma=sigma, seed=5, **opts)
    slow = simulate_python(g, c, a, trace=True, noise_sigma=sigma, seed=5, **opts)
    assert fast.makespan_s == slow.makespan_s
    for field in ("op_ready", "op_start", "op_end", "tr_src_op", "tr_dst_device", "tr_start", "tr_end"):
        np.testing.assert_array_equal(getattr(fast.trace, field), getattr(slow.trace, field), err_msg=field)


@SETTINGS
@given(cases(max_streams=1), st.sampled_from(["wc", "bsp"]), st.data())
def test_everything_on_one_device_is_total_compute(case, mode, data) -> None:
    g, c, _ = case
    d = data.draw(st.integers(0, c.num_devices - 1))
    a = np.full(g.num_ops, d)
    total = float(c.compute_time_s(g)[:, d].sum())
    assert simulate(g, c, a, mode=mode).makespan_s == pytest.approx(total, rel=REL, abs=1e-12)


@SETTINGS
@given(cases(max_devices=1))
def test_one_device_per_op_with_free_links_is_critical_path(case) -> None:
    g, _, _ = case
    n = g.num_ops
    g0 = DataflowGraph.from_arrays(g.flops, np.zeros(n), g.src, g.dst, kind=g.kind)  # nothing to send
    c = homogeneous("many", n, flops_per_s=2.0, bandwidth_Bps=1.0, latency_s=0.0)
    r = simulate(g0, c, np.arange(n))
    cp = critical_path_length(g0, compute_s=c.compute_time_s(g0)[:, 0])
    assert r.makespan_s == pytest.approx(cp, rel=REL, abs=1e-12)
    assert lower_bound(g0, c) == pytest.approx(cp, rel=REL, abs=1e-12)  # total work / n <= longest op


@SETTINGS
@given(cases(), OPTIONS, st.integers(1, 5), st.data())
def test_simulate_many_equals_loop(case, opts, batch, data) -> None:
    g, c, _ = case
    A = np.array(
        [data.draw(st.lists(st.integers(0, c.num_devices - 1), min_size=g.num_ops, max_size=g.num_ops)) for _ in range(batch)]
    )
    sigma = data.draw(st.sampled_from([0.0, 0.2]))
    many = simulate_many(g, c, A, noise_sigma=sigma, seed=3, **opts)
    loop = np.array([simulate(g, c, a, noise_sigma=sigma, seed=3, **opts).makespan_s for a in A])
    np.testing.assert_array_equal(many, loop)
    np.testing.assert_array_equal(simulate_many_python(g, c, A, noise_sigma=sigma, seed=3, **opts), loop)


@SETTINGS
@given(cases(), st.integers(1, 9), st.integers(1, 5), st.data())
def test_rows_split_over_threads_give_the_serial_numbers(case, batch, threads, data) -> None:
    """The annealer's multi-core batches split rows over threads (thread t: rows t, t + k, ...; any
    k, even more than the rows); every split gives exactly the serial kernel's makespans."""
    g, c, _ = case
    ctx = SimContext(g, c)
    A = np.array(
        [data.draw(st.lists(st.integers(0, c.num_devices - 1), min_size=g.num_ops, max_size=g.num_ops)) for _ in range(batch)],
        dtype=np.int64,
    )
    args = (ctx.arrays, A, *ctx.noise(0.0, 0), False, False, None)
    split = np.full(batch, np.nan)
    for t in range(threads):
        sim_rows(*args, t, threads, split, False, np.inf)
    np.testing.assert_array_equal(split, sim_many(*args))
    np.testing.assert_array_equal(sim_many(*args), ctx.simulate_many(A))


@SETTINGS
@given(cases(), st.integers(1, 9), st.integers(1, 3), st.booleans(), st.booleans(), st.data())
def test_pruned_rows_keep_the_best_row_exact(case, batch, threads, bsp, contention, data) -> None:
    """With the annealer's pruning, each thread's rows keep their least makespan and the first row
    that reaches it exactly when it is at most the cap; a row comes back as inf only when it is worse
    than the cap or than a row before it in the same thread, and every other row is its exact
    makespan. Noise, BSP and link contention too."""
    g, c, _ = case
    ctx = SimContext(g, c)
    A = np.array(
        [data.draw(st.lists(st.integers(0, c.num_devices - 1), min_size=g.num_ops, max_size=g.num_ops)) for _ in range(batch)],
        dtype=np.int64,
    )
    if data.draw(st.booleans()) and batch > 1:
        A[1] = A[0]  # a tie: the first of the two must stay
    op_f, edge_f = ctx.noise(data.draw(st.sampled_from([0.0, 0.3])), 1)
    copies_in = ctx.copies_in & (not bsp)  # BSP has no devices that copy
    arrays = tuple(copies_in if name == "copies_in" else x for name, x in zip(ARRAYS, ctx.arrays))
    args = (arrays, A, op_f, edge_f, bsp, contention and not bsp, None)
    full = sim_many(*args)
    cap = data.draw(st.sampled_from([np.inf, float(np.median(full)), float(full.min()) * 0.9]))
    pruned = np.full(batch, np.nan)
    for t in range(threads):
        sim_rows(*args, t, threads, pruned, True, cap)
        rows = np.arange(t, batch, threads)
        if rows.size == 0:
            continue
        if full[rows].min() <= cap:
            assert pruned[rows].min() == full[rows].min()
            assert rows[np.argmin(pruned[rows])] == rows[np.argmin(full[rows])]
        for i, b in enumerate(rows):
            if np.isinf(pruned[b]):
                assert full[b] > min(cap, full[rows[:i]].min(initial=np.inf))
            else:
                assert pruned[b] == full[b]


def test_pruning_cuts_a_row_whose_critical_path_exceeds_the_cap() -> None:
    """A chain a -> b across two devices: the assignment's critical path (1 + 2 bytes/1 B/s + 1 = 4 s)
    exceeds a cap of 3.5 s, which cuts it; a cap of 4 s does not, and the row gives 4 s."""
    g = from_edges([1, 1], [(0, 1)], [2, 0])
    ctx = SimContext(g, unit(2))
    A = np.array([[0, 1], [0, 0]], dtype=np.int64)
    args = (ctx.arrays, A, *ctx.noise(0.0, 0), False, False, None)
    out = np.full(2, np.nan)
    sim_rows(*args, 0, 2, out, True, 3.5)
    sim_rows(*args, 1, 2, out, True, 3.5)
    assert out[0] == np.inf and out[1] == 2.0
    sim_rows(*args, 0, 1, out, True, 4.0)
    np.testing.assert_array_equal(out, [4.0, 2.0])  # row 1 is better than row 0: not cut


@SETTINGS
@given(cases(), OPTIONS, st.data())
def test_noise_is_seeded(case, opts, data) -> None:
    g, c, a = case
    r1 = simulate(g, c, a, noise_sigma=0.5, seed=1, trace=True, **opts)
    r2 = simulate(g, c, a, noise_sigma=0.5, seed=1, trace=True, **opts)
    assert r1.makespan_s == r2.makespan_s
    np.testing.assert_array_equal(r1.trace.op_end, r2.trace.op_end)
    if c.compute_time_s(g)[np.arange(g.num_ops), a].max() > 0:
        r3 = simulate(g, c, a, noise_sigma=0.5, seed=2, trace=True, **opts)
        assert not np.array_equal(r1.trace.op_end, r3.trace.op_end)


def test_noise_changes_makespan_and_is_mean_preserving() -> None:
    g = from_edges([1.0] * 200, [], [0.0] * 200)
    c = unit(1)
    a = np.zeros(200, np.int64)
    base = simulate(g, c, a).makespan_s
    ms = [simulate(g, c, a, noise_sigma=0.3, seed=s).makespan_s for s in range(20)]
    assert len(set(ms)) == 20
    assert np.mean(ms) == pytest.approx(base, rel=0.05)


@settings(max_examples=15, deadline=None)
@given(cases(max_ops=10), OPTIONS, st.sampled_from([0.0, 0.25]))
def test_simpy_reference_agrees(case, opts, sigma) -> None:
    pytest.importorskip("simpy")
    from tests.reference.simpy_reference import simulate_simpy

    g, c, a = case
    ours = simulate(g, c, a, trace=True, noise_sigma=sigma, seed=9, **opts)
    ref = simulate_simpy(g, c, a, noise_sigma=sigma, seed=9, **opts)
    assert ours.makespan_s == ref.makespan_s
    np.testing.assert_array_equal(ours.trace.op_start, ref.start_t)


@SETTINGS
@given(cases(), st.sampled_from(["wc", "bsp"]))
def test_critical_path_is_a_chain_to_the_makespan(case, mode) -> None:
    g, c, a = case
    r = simulate(g, c, a, trace=True, mode=mode)
    t = r.trace
    path = t.critical_path(g)
    assert path and t.op_end[path[-1]] == r.makespan_s
    for u, v in zip(path, path[1:]):
        is_pred = u in set(g.predecessors(v).tolist())
        same_dev = t.op_device[u] == t.op_device[v] and t.op_end[u] == t.op_start[v]
        barrier = mode == "bsp" and g.level[u] == g.level[v] - 1
        copy = any(
            t.tr_src_op[k] == u and t.tr_dst_device[k] == t.op_device[v] and t.tr_end[k] == t.op_start[v]
            for k in range(t.num_transfers)
        )  # v waited for its device while it made an inbound copy of u's output
        assert is_pred or same_dev or barrier or copy
    if mode == "wc":
        assert t.op_start[path[0]] == 0.0


# --------------------------------------------------------------------------- priority dispatch
TRACE_FIELDS = ("op_ready", "op_start", "op_end", "tr_src_op", "tr_dst_device", "tr_start", "tr_end")


def test_priority_default_runs_ready_ops_in_op_id_order() -> None:
    """The FIFO example above: d0 is busy until 4, op 2 is ready at 3 and op 1 at 3.5.
    FIFO runs op 2 first; priority dispatch (default: op id) runs op 1 first."""
    g = from_edges([4, 1, 1, 3, 0.5], [(3, 2), (4, 1)], [0, 0, 0, 0, 0])
    c = unit(2)
    fifo = simulate(g, c, [0, 0, 0, 1, 1], trace=True).trace
    for sim in (simulate, simulate_python):
        r = sim(g, c, [0, 0, 0, 1, 1], trace=True, dispatch="priority")
        t = r.trace
        np.testing.assert_array_equal(t.op_ready, [0, 3.5, 3, 0, 0])  # when the inputs arrived, as in FIFO
        np.testing.assert_array_equal(fifo.op_start, [0, 5, 4, 0, 3])
        np.testing.assert_array_equal(t.op_start, [0, 4, 5, 0, 3])
        np.testing.assert_array_equal(t.op_end, [4, 5, 6, 3, 3.5])
        assert r.makespan_s == 6.0


def test_priority_runs_the_critical_op_first() -> None:
    """Ops 0, 1, 2 (1 s each) are ready on d0 at 0; op 2 feeds op 3 (3 s) on d1.
    FIFO (ties by id) runs op 2 last: makespan 3 + 3 = 6. Priority [2, 1, 0, 0] runs it
    first: op 3 runs 1..4 while d0 finishes ops 1 and 0, makespan 4."""
    g = from_edges([1, 1, 1, 3], [(2, 3)], [0, 0, 0, 0])
    c = unit(2)
    a = [0, 0, 0, 1]
    fifo = simulate(g, c, a, trace=True)
    np.testing.assert_array_equal(fifo.trace.op_start, [0, 1, 2, 3])
    assert fifo.makespan_s == 6.0
    for sim in (simulate, simulate_python):
        r = sim(g, c, a, trace=True, dispatch="priority", priority=[2, 1, 0, 0])
        np.testing.assert_array_equal(r.trace.op_start, [2, 1, 0, 1])
        np.testing.assert_array_equal(r.trace.op_ready, [0, 0, 0, 1])
        assert r.makespan_s == 4.0
        # equal priorities: ties by op id, i.e. the default order
        tie = sim(g, c, a, trace=True, dispatch="priority", priority=np.zeros(4))
        np.testing.assert_array_equal(tie.trace.op_start, [0, 1, 2, 3])
    # a float array, an int array and a list are the same priority
    for p in ([2, 1, 0, 0], np.array([2.0, 1, 0, 0]), np.array([2, 1, 0, 0], np.int32)):
        assert simulate(g, c, a, dispatch="priority", priority=p).makespan_s == 4.0


@pytest.mark.parametrize("contention", [False, True])
def test_priority_orders_ops_readied_by_remote_arrivals(contention: bool) -> None:
    """d0 runs op 0 until 4. Ops 3 and 4 run on d1 (0..1, 1..2) and send 1 byte each to d0,
    so op 1 is ready at 2 and op 2 at 3 (arrival events, also with link contention).
    FIFO runs op 1 at 4; priority [0, 5, 1, 0, 0] runs op 2 at 4 and op 1 at 5."""
    g = from_edges([4, 1, 1, 1, 1], [(3, 1), (4, 2)], [0, 0, 0, 1, 1])
    c = unit(2)
    a = [0, 0, 0, 1, 1]
    fifo = simulate(g, c, a, trace=True, link_contention=contention)
    np.testing.assert_array_equal(fifo.trace.op_start, [0, 4, 5, 0, 1])
    for sim in (simulate, simulate_python):
        r = sim(g, c, a, trace=True, link_contention=contention, dispatch="priority", priority=[0, 5, 1, 0, 0])
        np.testing.assert_array_equal(r.trace.op_ready, [0, 2, 3, 0, 0])
        np.testing.assert_array_equal(r.trace.op_start, [0, 5, 4, 0, 1])
        np.testing.assert_array_equal(r.trace.tr_end, [2, 3])
        assert r.makespan_s == 6.0


def test_priority_with_streams_fills_every_stream_in_priority_order() -> None:
    # four independent 1 s ops on one device with 2 streams: priority [3, 0, 2, 1] runs 1 and 3, then 2 and 0
    g = from_edges([1, 1, 1, 1], [], [0, 0, 0, 0])
    c = unit(1).with_streams(2)
    for sim in (simulate, simulate_python):
        r = sim(g, c, [0, 0, 0, 0], trace=True, dispatch="priority", priority=[3, 0, 2, 1])
        np.testing.assert_array_equal(r.trace.op_start, [1, 0, 1, 0])
        assert r.makespan_s == 2.0


@SETTINGS
@given(cases(copies=False), WC_OPTIONS, st.sampled_from([0.0, 0.3]), st.data())
def test_priority_numba_and_python_agree(case, opts, sigma, data) -> None:
    g, c, a = case
    prio = data.draw(priorities(g.num_ops))
    kw = dict(trace=True, noise_sigma=sigma, seed=5, dispatch="priority", priority=prio, **opts)
    fast = simulate(g, c, a, **kw)
    slow = simulate_python(g, c, a, **kw)
    assert fast.makespan_s == slow.makespan_s
    for field in TRACE_FIELDS:
        np.testing.assert_array_equal(getattr(fast.trace, field), getattr(slow.trace, field), err_msg=field)


@SETTINGS
@given(cases(copies=False), WC_OPTIONS, st.data())
def test_priority_trace_rules(case, opts, data) -> None:
    g, c, a = case
    prio = data.draw(priorities(g.num_ops))
    res = simulate(g, c, a, trace=True, dispatch="priority", priority=prio, **opts)
    key = np.arange(g.num_ops, dtype=float) if prio is None else prio
    check_trace(g, c, a, res, mode="wc", contention=opts.get("link_contention", False), priority=key)
    assert res.makespan_s >= lower_bound(g, c) * (1 - REL)


@SETTINGS
@given(cases(copies=False), WC_OPTIONS, st.sampled_from([0.0, 0.3]))
def test_priority_by_fifo_ready_times_reproduces_fifo(case, opts, sigma) -> None:
    """With priority = the ready times of the FIFO run (ties by op id in both), every
    dispatch sees the same ready ops with the same order, so the runs are identical."""
    g, c, a = case
    fifo = simulate(g, c, a, trace=True, noise_sigma=sigma, seed=2, **opts)
    for sim in (simulate, simulate_python):
        prio = sim(
            g, c, a, trace=True, noise_sigma=sigma, seed=2, dispatch="priority", priority=fifo.trace.op_ready, **opts
        )
        assert prio.makespan_s == fifo.makespan_s
        for field in TRACE_FIELDS:
            np.testing.assert_array_equal(getattr(prio.trace, field), getattr(fifo.trace, field), err_msg=field)


@SETTINGS
@given(cases(copies=False), WC_OPTIONS, st.integers(1, 5), st.data())
def test_priority_simulate_many_equals_loop(case, opts, batch, data) -> None:
    g, c, _ = case
    A = np.array(
        [data.draw(st.lists(st.integers(0, c.num_devices - 1), min_size=g.num_ops, max_size=g.num_ops)) for _ in range(batch)]
    )
    prio = data.draw(priorities(g.num_ops))
    sigma = data.draw(st.sampled_from([0.0, 0.2]))
    kw = dict(noise_sigma=sigma, seed=3, dispatch="priority", priority=prio, **opts)
    many = simulate_many(g, c, A, **kw)
    loop = np.array([simulate(g, c, a, **kw).makespan_s for a in A])
    np.testing.assert_array_equal(many, loop)
    np.testing.assert_array_equal(simulate_many_python(g, c, A, **kw), loop)


def test_fifo_dispatch_is_the_default() -> None:
    g = from_edges([4, 1, 1, 3, 0.5], [(3, 2), (4, 1)], [0, 0, 0, 0, 0])
    c = unit(2)
    a = [0, 0, 0, 1, 1]
    default = simulate(g, c, a, trace=True)
    explicit = simulate(g, c, a, trace=True, dispatch="fifo")
    for field in TRACE_FIELDS:
        np.testing.assert_array_equal(getattr(default.trace, field), getattr(explicit.trace, field), err_msg=field)
    np.testing.assert_array_equal(simulate_many(g, c, [a], dispatch="fifo"), [default.makespan_s])


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(dispatch="lifo"), r"unknown dispatch 'lifo' \(use one of: fifo, priority\)"),
        (dict(dispatch=None), "unknown dispatch None"),
        (dict(priority=[0, 1, 2]), r'priority is only used with dispatch="priority"'),
        (dict(dispatch="priority", mode="bsp"), r'dispatch="priority" needs mode="wc"'),
        (dict(dispatch="priority", priority=[0, 1]), r"one number per op \(3\), got shape \(2,\)"),
        (dict(dispatch="priority", priority=np.zeros((3, 1))), r"one number per op \(3\), got shape \(3, 1\)"),
        (dict(dispatch="priority", priority=5), r"one number per op \(3\), got shape \(\)"),
        (dict(dispatch="priority", priority=[0, float("nan"), 1]), r"priority of op 1 is NaN"),
        (dict(dispatch="priority", priority=["a", "b", "c"]), "priority must hold numbers"),
        (dict(dispatch="priority", priority=[0, None, 1]), "priority must hold numbers"),
        (dict(dispatch="priority", priority=[True, False, True]), "priority must hold numbers"),
        (dict(dispatch="priority", priority=[[0], [1, 2], 3]), "priority must be a 1-D sequence of numbers"),
    ],
)
def test_dispatch_errors(kw: dict, msg: str) -> None:
    g = from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1])
    c = unit(2)
    ctx = SimContext(g, c)
    for call in (
        lambda: simulate(g, c, [0, 1, 0], **kw),
        lambda: simulate_python(g, c, [0, 1, 0], **kw),
        lambda: simulate_many(g, c, [[0, 1, 0]], **kw),
        lambda: ctx.simulate([0, 1, 0], **kw),
        lambda: ctx.simulate_many([[0, 1, 0]], **kw),
    ):
        with pytest.raises(SimulationError, match=msg):
            call()


def test_infinite_priorities_are_allowed() -> None:
    g = from_edges([1, 1, 1], [], [0, 0, 0])
    r = simulate(g, unit(1), [0, 0, 0], trace=True, dispatch="priority", priority=[np.inf, -np.inf, 0.0])
    np.testing.assert_array_equal(r.trace.op_start, [2, 0, 1])


# --------------------------------------------------------------------------- lower bounds
def test_work_bound_uniform_rates_is_total_over_speed() -> None:
    g = from_edges([3.0, 5.0, 8.0], [], [0, 0, 0])
    c = Cluster("h", [Device("a", flops_per_s=1.0), Device("b", flops_per_s=3.0, streams=2)], np.ones((2, 2)), np.zeros((2, 2)))
    assert work_bound(g, c) == pytest.approx(16.0 / 7.0)


def test_work_bound_per_kind_is_valid_where_the_naive_one_is_not() -> None:
    # device a is fast at matmul, device b at add: the optimum is 1 s; the naive
    # sum(flops / sum of rates for its kind) would claim 200/101 = 1.98 s
    g = from_edges([100.0, 100.0], [], [0, 0], kind=[OpKind.MATMUL, OpKind.ADD])
    c = Cluster(
        "split",
        [Device("a", flops_per_s=100.0, flops_per_s_by_kind={"add": 1.0}), Device("b", flops_per_s=1.0, flops_per_s_by_kind={"add": 100.0})],
        np.ones((2, 2)),
        np.zeros((2, 2)),
    )
    best = simulate(g, c, [0, 1]).makespan_s
    assert best == pytest.approx(1.0)
    lb = lower_bound(g, c)
    assert lb <= best * (1 + REL)
    assert lb == pytest.approx(1.0, rel=1e-6)


def test_work_bound_solves_the_lp_when_devices_differ_by_kind() -> None:
    # a is 10x faster at matmul, as fast at add: the column-sum beta gives 0.2385, the LP's beta 0.55
    g = from_edges([1.0, 1.0], [], [0, 0], kind=[OpKind.MATMUL, OpKind.ADD])
    c = Cluster("lp", [Device("a", flops_per_s=10.0, flops_per_s_by_kind={"add": 1.0}), Device("b", flops_per_s=1.0)],
                np.ones((2, 2)), np.zeros((2, 2)))  # fmt: skip
    assert work_bound(g, c) == pytest.approx(0.55, rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_work_bound_with_one_speed_factor_per_device_equals_the_lp_optimum(seed: int) -> None:
    # per-kind rates r_k times a per-device factor s_d: the closed form (no solver) is the LP's optimum
    from doppler.sim.bounds import _dual_lp_beta

    rng = np.random.default_rng(seed)
    kinds = [OpKind.MATMUL, OpKind.ADD, OpKind.MATMUL, OpKind.ADD]
    g = from_edges(list(rng.uniform(1.0, 100.0, 4)), [], [0, 0, 0, 0], kind=kinds)
    speed = rng.uniform(0.5, 4.0, 3)
    c = Cluster("r1", [Device(f"d{i}", flops_per_s=10.0 * s, flops_per_s_by_kind={"add": 2.0 * s}) for i, s in enumerate(speed)],
                np.ones((3, 3)), np.zeros((3, 3)))  # fmt: skip
    W = np.bincount(g.kind.astype(np.int64), weights=g.flops)
    present = np.flatnonzero(W > 0)
    cap = c.throughput_matrix()[present] * c.streams[None, :]
    beta = _dual_lp_beta(W[present], 1.0 / cap)
    lp = float((W[present] * (beta[None, :] / cap).min(axis=1)).sum())
    assert work_bound(g, c) == pytest.approx(lp, rel=1e-7)
    assert work_bound(g, c) == pytest.approx(float((W[present] / cap.sum(axis=1)).sum()), rel=1e-12)


def test_lower_bound_is_max_of_critical_path_and_work() -> None:
    chain = from_edges([1.0] * 5, [(i, i + 1) for i in range(4)], [0] * 5)
    assert lower_bound(chain, unit(4)) == 5.0  # the chain
    wide = from_edges([1.0] * 8, [], [0] * 8)
    assert lower_bound(wide, unit(4)) == 2.0  # the work


# --------------------------------------------------------------------------- API and errors
def test_accepts_assignment_objects_lists_and_arrays() -> None:
    g = from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1])
    c = unit(2)
    r1 = simulate(g, c, [0, 1, 0]).makespan_s
    # op 0 on d0 runs [0, 1]; op 2 (3 s) follows it on d0, [1, 4]; op 1 (2 s) waits for 1 byte at 1 B/s
    # on d1, runs [2, 4]
    assert r1 == 4.0
    assert simulate(g, c, Assignment(np.array([0, 1, 0]))).makespan_s == r1
    assert simulate(g, c, np.array([0, 1, 0], dtype=np.int32)).makespan_s == r1
    assert simulate(g, c, np.array([0.0, 1.0, 0.0])).makespan_s == r1
    assert context(g, c).makespan(np.array([0, 1, 0])) == r1


def test_a_context_is_explicit_and_reflects_the_cluster_it_was_given() -> None:
    g = from_edges([1, 2], [(0, 1)], [1, 1])
    c1 = unit(2)
    assert context(g, c1) is not context(g, c1)  # a new one: callers hold the context they reuse
    assert context(g, c1.scaled_links(2.0)).bw[0, 1] == 0.5
    assert context(g, "unit:3").num_devices == 3  # a preset name, as on the command line
    assert "_doppler_sim_contexts" not in g.__dict__  # nothing is stored on the graph
    with pytest.raises(SimulationError, match="expected a DataflowGraph"):
        context("g.json", c1)


def test_the_public_functions_build_one_context_per_graph_and_cluster(monkeypatch) -> None:
    """simulate, simulate_many and lower_bound find the pair's context in a small per-thread cache:
    each (graph, cluster) pair is built once, the results are a held context's, and the cache keeps
    at most its SIZE most recent pairs."""
    import threading

    from doppler.sim import simulator

    built = []

    def counted(self, g, c) -> None:
        built.append((g.name, c.name))
        SimContext.__init__(self, g, c)

    monkeypatch.setattr(simulator._WeakContext, "__init__", counted)
    graphs = [from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1], name=f"g{i}") for i in range(3)]
    clusters = [unit(2), unit(2).scaled_links(2.0)]
    a = [0, 1, 0]
    for _ in range(3):
        for g in graphs[:2]:
            for c in clusters:
                held = context(g, c)
                assert simulate(g, c, a).makespan_s == held.simulate(a).makespan_s
                traced_end = simulate(g, c, a, trace=True).trace.op_end
                assert traced_end.tolist() == held.simulate(a, trace=True).trace.op_end.tolist()
                assert simulate_many(g, c, [a, [1, 1, 1]]).tolist() == held.simulate_many([a, [1, 1, 1]]).tolist()
                assert lower_bound(g, c) == held.lower_bound()
    assert len(built) == 4 == simulator._Cache.SIZE  # four pairs, each built once
    simulate(graphs[2], clusters[0], a)  # a fifth pair pushes out the least recent one
    simulate(graphs[0], clusters[0], a)
    assert built[4:] == [("g2", clusters[0].name), ("g0", clusters[0].name)]
    other = threading.Thread(target=simulate, args=(graphs[2], clusters[0], a))  # another thread: its own cache
    other.start()
    other.join()
    assert len(built) == 7


def test_the_public_functions_keep_no_graph_or_cluster_alive() -> None:
    import gc
    import weakref

    g, c = from_edges([1, 2], [(0, 1)], [1, 1]), unit(2)
    assert simulate(g, c, [0, 1]).makespan_s == 4.0 and lower_bound(g, c) == 3.0
    refs = weakref.ref(g), weakref.ref(c)
    del g, c
    gc.collect()
    assert refs[0]() is None and refs[1]() is None


@pytest.mark.parametrize("sim", [simulate, simulate_python])
def test_assignment_errors(sim) -> None:
    g = from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1], names=["a", "b", "c"])
    c = unit(2)
    with pytest.raises(AssignmentError, match="2 entries but graph"):
        sim(g, c, [0, 1])
    with pytest.raises(AssignmentError, match=r"op 2 \('c'\) is assigned to device 5.*devices 0..1"):
        sim(g, c, [0, 1, 5])
    with pytest.raises(AssignmentError, match="device -1"):
        sim(g, c, np.array([0, -1, 0], dtype=np.int64))
    with pytest.raises(AssignmentError, match="non-integer"):
        sim(g, c, [0, 0.5, 1])


def test_option_errors() -> None:
    g = from_edges([1, 2], [(0, 1)], [1, 1])
    c = unit(2)
    for bad in (float("nan"), -0.1, float("inf"), "x"):
        with pytest.raises(SimulationError, match="noise_sigma"):
            simulate(g, c, [0, 1], noise_sigma=bad)
    with pytest.raises(SimulationError, match="mode"):
        simulate(g, c, [0, 1], mode="async")
    with pytest.raises(SimulationError, match="seed"):
        simulate(g, c, [0, 1], seed=-1)
    with pytest.raises(SimulationError, match="noise_sigma"):
        simulate_many(g, c, [[0, 1]], noise_sigma=float("nan"))
    assert issubclass(SimulationError, ValueError)


def test_simulate_many_errors() -> None:
    g = from_edges([1, 2], [(0, 1)], [1, 1])
    c = unit(2)
    with pytest.raises(AssignmentError, match="2-D"):
        simulate_many(g, c, [0, 1])
    with pytest.raises(AssignmentError, match="3 entries"):
        simulate_many(g, c, [[0, 1, 0]])
    with pytest.raises(AssignmentError, match="assignment 1: op 1 is assigned to device 2"):
        simulate_many(g, c, [[0, 1], [0, 2]])
    assert simulate_many(g, c, np.zeros((0, 2), np.int64)).shape == (0,)


def test_trace_json_round_trip(tmp_path: Path) -> None:
    import json

    g = from_edges([1, 2, 3], [(0, 1), (0, 2)], [1, 1, 1])
    c = unit(2)
    r = simulate(g, c, [0, 1, 0], trace=True)
    p = tmp_path / "t.json"
    r.trace.save(p)
    obj = json.loads(p.read_text())
    assert obj["makespan_s"] == r.makespan_s
    assert obj["ops"]["start_s"] == r.trace.op_start.tolist()
    assert obj["transfers"]["dst_device"] == [1]
    np.testing.assert_allclose(r.trace.utilisation(c), [1.0, 0.5])


def test_large_graph_runs() -> None:
    rng = np.random.default_rng(0)
    n = 5000
    dst = np.arange(1, n)
    src = (rng.random(n - 1) * dst).astype(np.int64)
    g = DataflowGraph.from_arrays(rng.uniform(1, 2, n), rng.uniform(0, 1, n), src, dst)
    c = homogeneous("x", 16, flops_per_s=1.0, bandwidth_Bps=2.0, latency_s=0.1)
    a = rng.integers(0, 16, n)
    r = simulate(g, c, a, trace=True, link_contention=True)
    assert r.makespan_s >= lower_bound(g, c)
    assert r.makespan_s == simulate_python(g, c, a, link_contention=True).makespan_s


@pytest.mark.parametrize("sigma", [3.0 + 1e-9, 5.0, 1e308])
def test_noise_above_the_bound_is_an_error_that_says_why(sigma) -> None:
    from doppler.ir.graph import from_edges
    from doppler.hardware.presets import cluster
    from doppler.sim import MAX_NOISE_SIGMA, SimulationError, simulate

    g = from_edges([1.0, 1.0], [(0, 1)], [1.0, 1.0])
    with pytest.raises(SimulationError, match=rf"<= {MAX_NOISE_SIGMA:g}.*overflow"):
        simulate(g, cluster("unit:2"), [0, 1], noise_sigma=sigma)
    assert simulate(g, cluster("unit:2"), [0, 1], noise_sigma=MAX_NOISE_SIGMA).makespan_s > 0


def test_a_traced_result_carries_the_peak_memory_per_device() -> None:
    from doppler import workloads
    from doppler.hardware.presets import cluster

    g = workloads.build("ffnn", size="tiny")
    cl = cluster("p100x4")
    r = simulate(g, cl, np.arange(g.num_ops) % 4, trace=True)
    assert r.peak_memory_bytes.tolist() == r.trace.peak_memory_bytes(g, 4).tolist()
    assert simulate(g, cl, np.arange(g.num_ops) % 4).peak_memory_bytes is None
