"""Simulated annealing: never worse than its start, reproducible, honours its limits."""

from __future__ import annotations

import time

import numpy as np
import pytest

from doppler import workloads
from doppler.methods import MethodError, assign
from doppler.methods import anneal as A
from doppler.hardware.presets import cluster
from doppler.sim import simulate


@pytest.fixture(scope="module")
def setup():
    return workloads.build("llama_block", size="tiny"), cluster("p100x4").scaled_links(10)


def test_never_worse_than_its_start(setup):
    g, c = setup
    start = min(simulate(g, c, assign(g, c, m)).makespan_s for m in ("critical_path", "heft", "heft_lookahead"))
    for seed in range(3):
        a = assign(g, c, "anneal", seed=seed, max_evals=200)
        assert a.info["start_makespan_s"] == pytest.approx(start)
        assert a.estimated_makespan_s <= start
        assert simulate(g, c, a).makespan_s == pytest.approx(a.estimated_makespan_s)
        assert a.info["evals"] == 200


def test_heft_lookahead_joins_the_start_set_where_it_is_cheap(monkeypatch):
    from doppler.methods import anneal as A

    g, c = workloads.build("llama_layer"), cluster("v100x8")  # 240 ops: the rollout beats every cheap method
    rollout = assign(g, c, "heft_lookahead")
    cheap = min(simulate(g, c, assign(g, c, m)).makespan_s for m in A.WARM_START_METHODS)
    assert rollout.estimated_makespan_s < cheap
    a = assign(g, c, "anneal", max_evals=0)
    assert a.info["start_method"] == "heft_lookahead"
    assert a.estimated_makespan_s == pytest.approx(rollout.estimated_makespan_s, rel=1e-12)
    monkeypatch.setattr(A, "ROLLOUT_START_MAX_WORK", float(g.num_ops) ** 2 * 7 - 1)  # just too large for it
    a = assign(g, c, "anneal", max_evals=0)
    assert a.info["start_method"] in A.WARM_START_METHODS
    assert a.estimated_makespan_s == pytest.approx(cheap)


def test_improves_with_some_search(setup):
    g, c = setup
    a = assign(g, c, "anneal", seed=0, max_evals=3000)
    assert a.estimated_makespan_s < a.info["start_makespan_s"]


def test_deterministic_for_seed_and_eval_count(setup):
    g, c = setup
    a1 = assign(g, c, "anneal", seed=5, max_evals=400)
    a2 = assign(g, c, "anneal", seed=5, max_evals=400)
    assert np.array_equal(a1.devices, a2.devices)
    assert a1.estimated_makespan_s == a2.estimated_makespan_s
    # a generous time budget does not change a run bounded by its evaluation count
    a3 = assign(g, c, "anneal", seed=5, max_evals=400, budget_s=6e5)
    assert np.array_equal(a1.devices, a3.devices)


def test_explicit_start_and_custom_cycle(setup):
    g, c = setup
    start = np.zeros(g.num_ops, dtype=np.int64)
    a = assign(g, c, "anneal", max_evals=300, start=start, cycle_evals=100)
    assert a.info["start_method"] == "start"
    assert a.info["restarts"] >= 2
    assert a.estimated_makespan_s <= simulate(g, c, start).makespan_s


def test_budget_is_respected():
    g = workloads.build("ffnn", size="tiny")
    c = cluster("p100x4")
    assign(g, c, "anneal", max_evals=10)  # warm up compiled code
    t0 = time.perf_counter()
    a = assign(g, c, "anneal", budget_s=0.3)
    assert time.perf_counter() - t0 < 2.0
    assert a.info["evals"] > 2


def test_single_device_is_trivial():
    g = workloads.build("chainmm", size="tiny")
    a = assign(g, cluster("p100x4:1"), "anneal", max_evals=50)
    assert a.devices.tolist() == [0] * g.num_ops


def test_bad_options(setup):
    g, c = setup
    with pytest.raises(MethodError):
        assign(g, c, "anneal", max_evals=-1)
    with pytest.raises(MethodError):
        assign(g, c, "anneal", max_evals=10, batch_size=0)
    for share in (-0.1, 1.5, float("nan")):
        with pytest.raises(MethodError, match="critical_share"):
            assign(g, c, "anneal", max_evals=10, critical_share=share)
    for threads in (0, -2, True, 1.5, "2"):
        with pytest.raises(MethodError, match="threads"):
            assign(g, c, "anneal", max_evals=10, threads=threads)
    for temp in (0.0, -0.02, float("inf"), float("nan"), "0.02"):  # a negative one would accept every move
        with pytest.raises(MethodError, match="t_start"):
            assign(g, c, "anneal", max_evals=10, t_start=temp)
        with pytest.raises(MethodError, match="t_end"):
            assign(g, c, "anneal", max_evals=10, t_end=temp)


def test_stops_once_the_lower_bound_is_reached():
    from doppler.ir.graph import from_edges
    from doppler.sim import lower_bound

    # two independent chains of equal work on two devices: one chain per device is optimal
    g = from_edges([3, 3, 3, 3], [(0, 1), (2, 3)], [100, 100, 100, 100])
    c = cluster("unit:2")
    a = assign(g, c, "anneal", max_evals=50_000, start=np.array([0, 1, 1, 0]))
    assert a.estimated_makespan_s == pytest.approx(lower_bound(g, c)) == 6.0
    assert a.info["reached_lower_bound"]
    assert a.info["evals"] < 50_000  # it stopped early instead of searching on


def test_keeps_searching_while_above_the_lower_bound(setup):
    g, c = setup
    a = assign(g, c, "anneal", max_evals=256, batch_size=32)
    assert not a.info["reached_lower_bound"]  # slow links: far above the compute-only bound
    assert a.info["evals"] == 256


def test_anneal_starts_from_the_best_cheap_method_including_metis_and_round_robin_block() -> None:
    from doppler import assign, cluster, simulate, workloads

    g = workloads.build("ffnn", size="tiny")
    cl = cluster("p100x4")
    a = assign(g, cl, "anneal", max_evals=0)  # no search: the start itself
    starts = [simulate(g, cl, assign(g, cl, m)).makespan_s
              for m in ("critical_path", "heft", "enumerative", "round_robin_block", "metis")]  # fmt: skip
    assert simulate(g, cl, a).makespan_s == pytest.approx(min(starts))


def test_python_api_accepts_a_preset_name_like_the_cli() -> None:
    from doppler import assign, simulate, workloads
    from doppler.hardware.cluster import ClusterError

    g = workloads.build("ffnn", size="tiny")
    a = assign(g, "p100x4", "heft")
    assert simulate(g, "p100x4", a).makespan_s > 0
    with pytest.raises(ClusterError, match="unknown cluster 'nosuch'"):
        assign(g, "nosuch", "heft")


def test_progress_reports_are_progress_events_by_evaluations_or_time():
    from doppler.util.progress import ProgressEvent

    g, c = workloads.build("random", num_ops=60, seed=1), cluster("p100x4")  # far from its lower bound
    seen: list[ProgressEvent] = []
    assign(g, c, "anneal", max_evals=400, batch_size=8, on_progress=seen.append)
    assert seen and all(isinstance(e, ProgressEvent) and e.task == "anneal" and e.unit == "evals" for e in seen)
    assert all(e.total == 400 and 0 < e.done <= 400 and e.stats["best_makespan_s"] > 0 for e in seen)
    seen.clear()
    assign(g, c, "anneal", budget_s=0.3, on_progress=seen.append)
    assert seen and all(e.unit == "s" and e.total == 0.3 for e in seen)
    best = [e.stats["best_makespan_s"] for e in seen]
    assert best == sorted(best, reverse=True)  # the best so far never gets worse


@pytest.mark.parametrize("critical_share", [0.0, 0.5, 1.0])
def test_how_the_compiled_loop_is_cut_into_calls_changes_nothing(monkeypatch, critical_share):
    """The clock only decides how many batches one compiled call runs: one per call, or thousands,
    give the same search for a seed and an evaluation count (the critical chain carries over)."""
    from doppler.methods import anneal

    g, c = workloads.build("random", num_ops=80, seed=1), cluster("p100x4").scaled_links(10)  # it moves often
    runs = []
    for chunk_s in (1e-12, 10.0):  # one batch per call / calls growing 4x each time
        monkeypatch.setattr(anneal, "CHUNK_S", chunk_s)
        runs.append(assign(g, c, "anneal", seed=3, max_evals=1500, cycle_evals=400, critical_share=critical_share))
    a, b = runs
    np.testing.assert_array_equal(a.devices, b.devices)
    assert a.estimated_makespan_s == b.estimated_makespan_s
    keys = ("evals", "accepted", "improvements", "restarts")
    assert [a.info[k] for k in keys] == [b.info[k] for k in keys]
    assert a.info["evals"] == 1500 and a.info["restarts"] >= 3


@pytest.mark.parametrize("pool", [1, 4])
def test_threads_change_the_speed_not_the_search(setup, pool):
    """Scoring each batch on several cores gives the same makespans, so the same search: same best
    assignment, same counts, for a seed and an evaluation count (more threads than cores or than the
    batch are capped, not refused)."""
    from doppler.methods.threads import search_threads

    g, c = setup
    runs = [assign(g, c, "anneal", seed=4, max_evals=1200, cycle_evals=400, threads=t, pool=pool) for t in (1, 2, 3, 64)]
    keys = ("evals", "accepted", "improvements", "restarts")
    for r in runs[1:]:
        np.testing.assert_array_equal(r.devices, runs[0].devices)
        assert r.estimated_makespan_s == runs[0].estimated_makespan_s
        assert [r.info[k] for k in keys] == [runs[0].info[k] for k in keys]
    assert runs[0].info["threads"] == 1 and 1 <= runs[3].info["threads"] <= 8  # at most the batch of 8
    assert search_threads(None, batch_size=3) <= 3 and search_threads(5, batch_size=1) == 1


@pytest.mark.parametrize("pool", [1, 4])
@pytest.mark.parametrize("graph, preset", [("llama_block", "p100x4"), ("ffnn", "v100x8"), ("chainmm", "v100x8")])
def test_pruning_changes_the_speed_not_the_search(graph, preset, pool):
    """Proposals cut short once they are sure to lose (to an earlier proposal, or to the Metropolis
    rule's draw) leave the search as it was: same best assignment, same counts, on 1 and 2 cores."""
    from doppler.methods.anneal import AnnealOptions, anneal_search

    g, c = workloads.build(graph, size="tiny"), cluster(preset)
    keys = ("evals", "accepted", "improvements", "restarts")
    for seed, threads in ((0, 1), (1, 2)):
        a, b = (anneal_search(g, c, AnnealOptions(max_evals=3000, cycle_evals=1000, threads=threads, prune=p, pool=pool),
                              seed=seed) for p in (False, True))  # fmt: skip
        np.testing.assert_array_equal(a.devices, b.devices)
        assert a.estimated_makespan_s == b.estimated_makespan_s
        assert [a.info[k] for k in keys] == [b.info[k] for k in keys]
        assert a.info["accepted"] > 0


@pytest.mark.parametrize("name", ["llama_block", "random"])  # moves over tile groups / over neighbourhoods
def test_every_move_changes_the_assignment_and_stays_in_range(name):
    from doppler.methods.anneal import _Moves

    g = workloads.build(name, size="tiny") if name == "llama_block" else workloads.build(name, num_ops=40, seed=1)
    rng = np.random.default_rng(0)
    for nd in (2, 3, 8):
        moves = _Moves(g, nd, rng)
        a = rng.integers(0, nd, g.num_ops)
        for _ in range(300):
            b = a.copy()
            moves.apply(b)
            assert (b != a).any() and b.min() >= 0 and b.max() < nd
            a = b


@pytest.mark.parametrize("name,preset", [("random", "p100x4"), ("llama_block", "v100x8"), ("ffnn", "h100x8")])
def test_the_critical_chain_is_a_chain_of_what_held_each_op_back(name, preset):
    """Walked back from the op that ends last: each step is the op that freed the device (when the op
    waited for it) or the producer of the input that arrived last (checked with
    :meth:`Trace.arrival_s`), so the chain ends at the makespan and starts at time 0."""
    from doppler.methods._anneal_loops import critical_chain, critical_move
    from doppler.sim import SimContext

    g = workloads.build(name, size="tiny") if name != "random" else workloads.build(name, num_ops=60, seed=2)
    c = cluster(preset)
    rng = np.random.default_rng(1)
    for _ in range(5):
        dev = rng.integers(0, c.num_devices, g.num_ops)
        res = SimContext(g, c).simulate(dev, trace=True)
        tr = res.trace
        out = np.empty(g.num_ops, np.int64)
        m = critical_chain(dev, tr.op_ready, tr.op_start, tr.op_end, g.pred_ptr.astype(np.int64),
                           g.pred_idx.astype(np.int64), tr.tr_src_op, tr.tr_dst_device, tr.tr_end,
                           len(tr.tr_src_op), c.num_devices, out)  # fmt: skip
        chain = out[:m]
        arrival = tr.arrival_s(g)  # (op, device) -> when its output is there
        assert tr.op_end[chain[0]] == res.makespan_s and tr.op_start[chain[-1]] == 0.0
        for _ in range(20):  # a critical move always changes the assignment, and stays in range
            moved = dev.copy()
            critical_move(moved, out, m, rng, c.num_devices, *(x.astype(np.int64) for x in (g.succ_ptr, g.succ_idx,
                          g.pred_ptr, g.pred_idx)), np.empty(0, np.int64))  # fmt: skip
            assert (moved != dev).any() and 0 <= moved.min() and moved.max() < c.num_devices
        assert len(set(chain.tolist())) == m
        for v, w in zip(chain[:-1], chain[1:]):  # w held v back
            if tr.op_start[v] > tr.op_ready[v]:
                assert dev[w] == dev[v] and tr.op_end[w] == tr.op_start[v]
            else:
                assert w in g.pred_idx[g.pred_ptr[v]:g.pred_ptr[v + 1]] and tr.op_end[w] <= tr.op_start[v]
                assert arrival[(int(w), int(dev[v]))] == tr.op_ready[v]  # w's data came last


def _graph_args(g):
    return tuple(np.ascontiguousarray(x, dtype=np.int64) for x in (g.succ_ptr, g.succ_idx, g.pred_ptr, g.pred_idx))


def _time_added_by_numpy(ctx, cur, new):
    """:func:`time_added`, written out over every edge (the test's reference); with the makespan of ``cur``."""
    g, comp, n = ctx.graph, ctx.comp, len(cur)
    cur_ms = float(ctx.simulate_many(cur[None])[0])
    moved = np.flatnonzero(new != cur)
    src, dst = np.repeat(np.arange(n), np.diff(g.succ_ptr)), np.asarray(g.succ_idx)

    def edge_s(a):
        t = ctx.lat[a[src], a[dst]] + ctx.out_bytes[src] / ctx.bw[a[src], a[dst]]
        return np.where(a[src] == a[dst], 0.0, t)

    dedge = edge_s(new) - edge_s(cur)  # 0 on edges that touch no moved op
    dcomp = comp[moved, new[moved]] - comp[moved, cur[moved]]
    return dcomp.sum() / cur_ms + dedge.sum() / cur_ms, cur_ms


@pytest.mark.parametrize("name,preset", [("random", "p100x4"), ("llama_block", "v100x8"), ("ffnn", "h100x8")])
def test_time_added_matches_a_reference_over_every_edge(name, preset):
    """The time a move adds, computed from its logged writes over the moved ops' edges only, equals the
    same sum over the whole graph, for every kind of move (tile groups, swaps, chains, critical-chain
    steps), also when the log writes an op more than once."""
    from doppler.methods import _anneal_loops as K
    from doppler.methods.anneal import _Moves
    from doppler.sim import SimContext

    g = workloads.build(name, size="tiny") if name != "random" else workloads.build(name, num_ops=60, seed=2)
    c = cluster(preset)
    ctx, n, nd = SimContext(g, c), g.num_ops, c.num_devices
    rng = np.random.default_rng(3)
    moves = _Moves(g, nd, rng)
    log, stamp, old = np.zeros(2 * n + 1, np.int64), np.zeros(n, np.int64), np.empty(n, np.int64)
    tag = 1
    ga = _graph_args(g)
    args = (ctx.comp, ctx.out_bytes, ctx.lat, ctx.bw, ga[2], ga[3], ga[0], ga[1])
    for trial in range(200):
        cur = rng.integers(0, nd, n).astype(np.int64)
        crit = rng.choice(n, size=8, replace=False).astype(np.int64)
        new, log[0] = cur.copy(), 0
        if trial % 4 == 0:
            K.critical_move(new, crit, len(crit), rng, nd, *ga, log)
        else:
            K.apply_move(new, rng, *moves.args(), log)
        want, cur_ms = _time_added_by_numpy(ctx, cur, new)
        got = K.time_added(new, log, stamp, tag, old, *args, cur_ms)
        tag += 2
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        if log[0] >= 1:  # the same move, its first op written twice more (to another device, then back)
            v, d0 = log[1], log[2]
            k = log[0]
            log[1 + 2 * k: 5 + 2 * k] = [v, new[v], v, (new[v] + 1) % nd]
            log[0] = k + 2
            got = K.time_added(new, log, stamp, tag, old, *args, cur_ms)
            tag += 2
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)  # the device before the move: d0
            assert old[v] == d0 == cur[v]
        undone = new.copy()  # the log undoes the move, last write first
        for k in range(log[0] - 1, -1, -1):
            undone[log[1 + 2 * k]] = log[2 + 2 * k]
        np.testing.assert_array_equal(undone, cur)


def test_a_scored_proposal_is_the_move_of_its_pool_that_adds_the_least_time():
    """``scored_proposal`` draws ``pool`` moves as the annealer draws one, keeps the one that adds the
    least time, and leaves the current assignment as it was: replayed from a copy of its random
    stream, the same moves, and the proposal is their best by that score."""
    import copy

    from doppler.methods import _anneal_loops as K
    from doppler.methods.anneal import _NO_TIES, _Moves
    from doppler.sim import SimContext

    g, c = workloads.build("llama_block", size="tiny"), cluster("v100x8")
    ctx, n, nd = SimContext(g, c), g.num_ops, c.num_devices
    rng = np.random.default_rng(5)
    moves = _Moves(g, nd, rng)
    ga = _graph_args(g)
    crit = np.arange(0, n, 7, dtype=np.int64)
    costs = (ctx.comp, ctx.out_bytes, ctx.lat, ctx.bw)
    scratch = lambda: (np.zeros(2 * n + 1, np.int64), np.zeros(2 * n + 1, np.int64), np.zeros(n, np.int64),
                       np.empty(n, np.int64))  # noqa: E731  # fmt: skip
    distinct = 0
    for trial in range(30):
        cur = rng.integers(0, nd, n).astype(np.int64)
        cur_ms = float(ctx.simulate_many(cur[None])[0])
        replay = copy.deepcopy(rng)
        row, before = np.empty(n, np.int64), cur.copy()
        log, best_log, stamp, old = scratch()
        K.scored_proposal(cur, row, 6, rng, *moves.args(), crit, len(crit), 0.25, log, best_log, stamp, 1, old,
                          *costs, cur_ms, _NO_TIES)  # fmt: skip
        np.testing.assert_array_equal(cur, before)
        log, _, stamp, old = scratch()
        scored = []
        for k in range(6):
            new, log[0] = cur.copy(), 0
            if replay.random() < 0.25:
                K.critical_move(new, crit, len(crit), replay, nd, *ga, log)
            else:
                K.apply_move(new, replay, *moves.args(), log)
            added = K.time_added(new, log, stamp, 1 + 2 * k, old, *costs, ga[2], ga[3], ga[0], ga[1], cur_ms)
            scored.append((added, new))
        best = min(scored, key=lambda t: t[0])  # the first of equal scores
        distinct += len({t[0] for t in scored}) > 1
        np.testing.assert_array_equal(row, best[1])
        assert replay.random() == rng.random()  # the two streams drew the same numbers
    assert distinct >= 20  # pools the score told apart


@pytest.mark.parametrize("pool", [2, 4])
def test_a_scored_pool_keeps_the_search_reproducible(setup, pool):
    """With each proposal the best-scored of a pool, a run is still fixed by its seed and evaluation
    count: the same on 1 and 2 cores, with and without pruning, cut into calls either way."""
    from doppler.methods import anneal
    from doppler.methods.anneal import AnnealOptions, anneal_search

    _, c = setup
    # a graph where the search moves often, and every seed of 0-9 improves on its start in 1,500
    # evaluations with pools of 2 and 4
    g = workloads.build("random", num_ops=80, seed=1)
    keys = ("evals", "accepted", "improvements", "restarts")
    runs = [anneal_search(g, c, AnnealOptions(max_evals=1500, cycle_evals=500, pool=pool, threads=t, prune=p), seed=2)
            for t, p in ((1, True), (2, True), (2, False))]  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(anneal, "CHUNK_S", 1e-12)  # one batch per compiled call
        runs.append(anneal_search(g, c, AnnealOptions(max_evals=1500, cycle_evals=500, pool=pool), seed=2))
    for r in runs[1:]:
        np.testing.assert_array_equal(r.devices, runs[0].devices)
        assert r.estimated_makespan_s == runs[0].estimated_makespan_s
        assert [r.info[k] for k in keys] == [runs[0].info[k] for k in keys]
    assert runs[0].estimated_makespan_s < runs[0].info["start_makespan_s"] and runs[0].info["pool"] == pool
    assert simulate(g, c, runs[0]).makespan_s == pytest.approx(runs[0].estimated_makespan_s)


def test_pool_must_be_a_whole_number_of_moves(setup):
    g, c = setup
    for pool in (0, -1, True, 2.5, "4"):
        with pytest.raises(MethodError, match="pool"):
            assign(g, c, "anneal", max_evals=10, pool=pool)


@pytest.mark.parametrize("kw, match", [
    (dict(max_evals="x"), "max_evals must be an integer >= 0"),
    (dict(max_evals=1.5), "max_evals must be an integer >= 0"),
])  # fmt: skip
def test_bad_search_options_are_one_method_error(kw, match):
    with pytest.raises(MethodError, match=match):
        assign(workloads.build("ffnn", size="tiny"), cluster("p100x4"), "anneal", **kw)



@pytest.mark.parametrize("size, preset, blocks", [("tiny", "h100x8:4", 4), ("small", "a100x8:2", 4),
                                                  ("small", "h100x8", 8)])  # fmt: skip
def test_on_a_layered_model_the_start_is_never_worse_than_the_experts(size, preset, blocks, monkeypatch):
    """The start set holds tensor_parallel and tp_pipeline where the graph has a layer structure: with no
    search (max_evals 0) anneal returns its start, at most either's makespan. On 8 devices, 8 blocks, no cheap
    method is as fast as tensor_parallel: without the repeat start, the start is the expert's."""
    from doppler.methods import anneal as A

    g = workloads.build("llama_model", size=size, n_kv_heads=blocks, head_blocks=blocks, hidden_blocks=blocks,
                        vocab_blocks=blocks)  # fmt: skip
    c = cluster(preset)
    expert = {m: simulate(g, c, assign(g, c, m)).makespan_s for m in ("tensor_parallel", "tp_pipeline")}
    a = assign(g, c, "anneal", max_evals=0)
    ms = simulate(g, c, a).makespan_s
    assert ms == pytest.approx(a.estimated_makespan_s)
    assert ms <= min(expert.values()) * (1 + 1e-12)
    if blocks == 8:
        monkeypatch.setattr(A, "_repeat_start", lambda *args: None)
        cheap = min(simulate(g, c, assign(g, c, m)).makespan_s for m in A.WARM_START_METHODS)
        assert min(expert.values()) < cheap
        assert assign(g, c, "anneal", max_evals=0).info["start_method"] in expert


def test_without_a_layer_structure_the_experts_are_left_out_of_the_start():
    g, c = workloads.build("random", size="tiny"), cluster("h100x8:4")
    with pytest.raises(MethodError, match="no layer structure"):
        assign(g, c, "tensor_parallel")
    a = assign(g, c, "anneal", max_evals=0)
    assert a.info["start_method"] not in ("tensor_parallel", "tp_pipeline")


def test_a_tied_move_moves_every_copy_of_what_it_moves():
    """``tie_move`` extends a move to the tie classes of the ops it wrote: a tied assignment stays tied, every
    op the move wrote and every copy of it ends where the move put the first of its class, the log undoes it
    all, and ops of no class are left as the move left them."""
    from doppler.methods import _anneal_loops as K
    from doppler.methods.anneal import _Moves, _tied_start
    from doppler.methods.layered import repeated_units
    from doppler.sim import SimContext

    g = workloads.build("llama_model", size="tiny", layers=5, n_kv_heads=4, head_blocks=4, hidden_blocks=4,
                        vocab_blocks=4)  # fmt: skip
    c = cluster("h100x8:4")
    ctx = SimContext(g, c)
    base = assign(g, c, "tensor_parallel").devices.astype(np.int64)
    (tie_of, tie_ptr, tie_ops), first, ms = _tied_start(ctx, [(base, 1.0)])
    assert first is base and ms == 1.0  # the expert's placement is tied already
    repeats = repeated_units(g)
    assert sorted(tie_ops.tolist()) == sorted(np.concatenate(repeats).tolist()) and (tie_of >= 0).sum() == tie_ops.size
    rng = np.random.default_rng(7)
    moves = _Moves(g, c.num_devices, rng)
    log = np.zeros(2 * 2 * g.num_ops + 1, np.int64)
    cur = base.copy()
    for _ in range(300):
        new, log[0] = cur.copy(), 0
        K.apply_move(new, rng, *moves.args(), log)
        moved = new.copy()
        written = log[0]
        K.tie_move(new, log, tie_of, tie_ptr, tie_ops)
        assert all(np.array_equal(new[ops], new[repeats[0]]) for ops in repeats)
        untied = tie_of < 0
        assert np.array_equal(new[untied], moved[untied])
        firsts = {}
        for k in range(written):
            v = int(log[1 + 2 * k])
            if tie_of[v] >= 0:
                firsts.setdefault(int(tie_of[v]), v)
        for cls, v in firsts.items():
            assert np.all(new[tie_ops[tie_ptr[cls]:tie_ptr[cls + 1]]] == moved[v])
        undone = new.copy()
        for k in range(log[0] - 1, -1, -1):
            undone[log[1 + 2 * k]] = log[2 + 2 * k]
        np.testing.assert_array_equal(undone, cur)
        cur = new


def test_the_tied_search_is_reproducible_and_never_worse_than_its_start():
    """On a model that repeats its layer, the tied search runs between the start and the search on the whole
    graph (its evaluations within ``max_evals``), and a run is still fixed by its seed and evaluation count."""
    g = workloads.build("llama_model", size="tiny", layers=4)
    c = cluster("h100x8:4")
    runs = [assign(g, c, "anneal", seed=3, max_evals=300, threads=t) for t in (1, 2)]
    assert 0 < runs[0].info["tied_evals"] <= A.TIED_BUDGET_SHARE * 300 and runs[0].info["evals"] == 300
    np.testing.assert_array_equal(runs[0].devices, runs[1].devices)
    assert runs[0].info == {**runs[1].info, "threads": runs[0].info["threads"],
                            "search_time_s": runs[0].info["search_time_s"]}  # fmt: skip
    assert runs[0].estimated_makespan_s <= runs[0].info["start_makespan_s"]
    assert simulate(g, c, runs[0]).makespan_s == pytest.approx(runs[0].estimated_makespan_s)
    assert assign(g, c, "anneal", max_evals=0).info["tied_evals"] == 0
    assert assign(workloads.build("llama_layer", size="tiny"), c, "anneal", max_evals=50).info["tied_evals"] == 0
