"""Static policy features (hand-computed) and the list-schedule device features
(against a slow, obviously-correct pure-Python reference)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from doppler import cluster, workloads
from doppler.hardware.costs import CostModel
from doppler.ir.graph import from_edges
from doppler.hardware.presets import unit
from doppler.listsched import DEVICE_FEATURES, NUM_DEVICE_FEATURES, PlacementState
from doppler.policy.features import NUM_EDGE_FEATURES, NUM_OP_FEATURES, OP_FEATURES, chain_members, graph_features

HAS_INPUT = DEVICE_FEATURES.index("has_input")


def diamond():
    # 0 -> {1, 2} -> 3; on unit:2 compute = flops and the (mean) edge time = producer's bytes
    return from_edges([2, 3, 1, 2], [(0, 1), (0, 2), (1, 3), (2, 3)], output_bytes=[1, 2, 1, 0])


def pairs_to_sets(pairs, n):
    rows, cols = pairs
    out = [set() for _ in range(n)]
    for r, c in zip(np.asarray(rows).tolist(), np.asarray(cols).tolist()):
        assert c not in out[r], f"duplicate member {c} of op {r}"
        out[r].add(c)
    return out


# ============================================================================ static features
def test_op_features_by_hand_on_diamond():
    # edge times: (0,1)=1 (0,2)=1 (1,3)=2 (2,3)=1
    # b-level: b3 = 2, b1 = 3 + 2 + 2 = 7, b2 = 1 + 1 + 2 = 4, b0 = 2 + max(1 + 7, 1 + 4) = 10 -> time scale 10
    # t-level: t0 = 0, t1 = 0 + 2 + 1 = 3, t2 = 3, t3 = max(3 + 3 + 2, 3 + 1 + 1) = 8
    # input comm: [0, 1, 1, 3]; output comm: [2, 2, 1, 0]
    g = diamond()
    gf = graph_features(g, unit(2))
    assert OP_FEATURES[:5] == ("compute", "b_level", "t_level", "input_comm", "output_comm")
    assert gf.op_x.shape == (4, NUM_OP_FEATURES) and gf.op_x.dtype == np.float32
    assert gf.time_scale_s == pytest.approx(10.0)
    np.testing.assert_allclose(gf.b_level_s, [10, 7, 4, 2])
    expected = np.array(
        [
            [2 / 3, 1.0, 0.0, 0.0, 1.0],
            [3 / 3, 0.7, 0.3, 1 / 3, 1.0],
            [1 / 3, 0.4, 0.3, 1 / 3, 0.5],
            [2 / 3, 0.2, 0.8, 1.0, 0.0],
        ]
    )
    np.testing.assert_allclose(gf.op_x[:, :5], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(gf.op_x[:, 5:9], 0.0)  # untiled ops: no block coordinates
    ids = gf.op_x[:, 9:]  # the op-id features: distinct for every op, in [0, 1)
    assert len({tuple(r) for r in ids.tolist()}) == 4 and ids.min() >= 0 and ids.max() < 1
    assert gf.num_ops == 4 and gf.num_devices == 2
    assert gf.path_scale == 3.0  # depth in ops


def test_edge_index_forward_then_reversed_with_direction_bit():
    g = diamond()
    gf = graph_features(g, unit(2))
    m = g.num_edges
    assert m == 4
    assert gf.edge_index.shape == (2, 2 * m) and gf.edge_index.dtype == np.int64
    assert gf.edge_attr.shape == (2 * m, NUM_EDGE_FEATURES) and gf.edge_attr.dtype == np.float32
    fwd = list(zip(gf.edge_index[0, :m].tolist(), gf.edge_index[1, :m].tolist()))
    rev = list(zip(gf.edge_index[0, m:].tolist(), gf.edge_index[1, m:].tolist()))
    assert sorted(fwd) == [(0, 1), (0, 2), (1, 3), (2, 3)]
    assert rev == [(d, s) for s, d in fwd]
    np.testing.assert_array_equal(gf.edge_attr[:m, 1], 0.0)
    np.testing.assert_array_equal(gf.edge_attr[m:, 1], 1.0)
    # the edge time over the largest edge time (2, on edge 1 -> 3), the same both ways
    want = {(0, 1): 0.5, (0, 2): 0.5, (1, 3): 1.0, (2, 3): 0.5}
    np.testing.assert_allclose(gf.edge_attr[:m, 0], [want[e] for e in fwd])
    np.testing.assert_allclose(gf.edge_attr[m:, 0], gf.edge_attr[:m, 0])


def test_longest_path_members_on_diamond():
    gf = graph_features(diamond(), unit(2))
    # down: longest path to an exit (0 -> 1 -> 3: 2 + 1 + 3 + 2 + 2 = 10 beats 0 -> 2 -> 3: 7)
    assert pairs_to_sets(chain_members(gf.next_down), 4) == [{0, 1, 3}, {1, 3}, {2, 3}, {3}]
    # up: longest path from an entry (3 is reached at t = 8 through 1, at 5 through 2)
    assert pairs_to_sets(chain_members(gf.next_up), 4) == [{0}, {0, 1}, {0, 2}, {0, 1, 3}]


def test_longest_path_members_on_a_chain_with_a_shortcut():
    # 0 -> 1 -> 2 -> 4 (long chain) and 0 -> 3 -> 4 (short branch), plus 5 -> 4 (another entry);
    # no bytes, so only compute counts: path lengths 1+5+5+1 = 12 vs 1+1+1 = 3 vs 1+1 = 2.
    g = from_edges([1, 5, 5, 1, 1, 1], [(0, 1), (1, 2), (2, 4), (0, 3), (3, 4), (5, 4)])
    gf = graph_features(g, unit(2))
    assert pairs_to_sets(chain_members(gf.next_down), 6) == [{0, 1, 2, 4}, {1, 2, 4}, {2, 4}, {3, 4}, {4}, {5, 4}]
    assert pairs_to_sets(chain_members(gf.next_up), 6) == [{0}, {0, 1}, {0, 1, 2}, {0, 3}, {0, 1, 2, 4}, {5}]
    assert gf.path_scale == 4.0


def test_longest_path_ties_go_to_the_lowest_op_id():
    # a symmetric diamond: both branches tie, the lower id (1) wins in both directions
    g = from_edges([1, 2, 2, 1], [(0, 1), (0, 2), (1, 3), (2, 3)], output_bytes=[1, 1, 1, 0])
    gf = graph_features(g, unit(2))
    assert pairs_to_sets(chain_members(gf.next_down), 4)[0] == {0, 1, 3}
    assert pairs_to_sets(chain_members(gf.next_up), 4)[3] == {0, 1, 3}


def _reference_paths(graph, comp, edge_comm):
    """Brute-force longest-path members: DP with explicit successors/predecessors, ties -> lowest id."""
    n = graph.num_ops
    succ = [[] for _ in range(n)]
    pred = [[] for _ in range(n)]
    for e, (s, d) in enumerate(zip(graph.src.tolist(), graph.dst.tolist())):
        succ[s].append((d, edge_comm[e]))
        pred[d].append((s, edge_comm[e]))
    down_len, down_next = {}, {}

    def down(v):
        if v not in down_len:
            best, nxt = 0.0, -1
            for w, c in sorted(succ[v]):
                val = c + down(w)
                if val > best + 1e-12 * max(1.0, best):
                    best, nxt = val, w
            down_len[v], down_next[v] = comp[v] + best, nxt
        return down_len[v]

    up_len, up_next = {}, {}

    def up(v):  # longest path ending at v, including v's compute
        if v not in up_len:
            best, nxt = 0.0, -1
            for u, c in sorted(pred[v]):
                val = up(u) + c
                if val > best + 1e-12 * max(1.0, best):
                    best, nxt = val, u
            up_len[v], up_next[v] = best + comp[v], nxt
        return up_len[v]

    def chain(v, nxt):
        out = set()
        while v >= 0:
            out.add(v)
            v = nxt[v]
        return out

    for v in graph.topo_order[::-1].tolist():
        down(int(v))
    for v in graph.topo_order.tolist():
        up(int(v))
    return [chain(v, down_next) for v in range(n)], [chain(v, up_next) for v in range(n)], down_len


@pytest.mark.parametrize("seed", [1, 2])
def test_longest_path_members_match_brute_force_on_random_graphs(seed):
    g = workloads.build("random", num_ops=40, seed=seed)
    cl = cluster("p100x4")
    gf = graph_features(g, cl)
    cm = CostModel.build(g, cl)
    comp, comm = cm.mean_compute_s(), cm.mean_edge_comm_s()
    down, up, down_len = _reference_paths(g, comp, comm)
    assert pairs_to_sets(chain_members(gf.next_down), g.num_ops) == down
    assert pairs_to_sets(chain_members(gf.next_up), g.num_ops) == up
    np.testing.assert_allclose(gf.b_level_s, [down_len[v] for v in range(g.num_ops)], rtol=1e-9)
    assert gf.time_scale_s == pytest.approx(max(down_len.values()), rel=1e-12)
    assert gf.path_scale == float(g.depth)
    assert gf.op_x.min() >= 0.0 and gf.op_x.max() <= 1.0 + 1e-6
    # compute, b-level and the comm sums are scaled by their largest value; t-level by the b-level's
    np.testing.assert_allclose(gf.op_x[:, [0, 1, 3, 4]].max(axis=0), 1.0, rtol=1e-6)
    # t-level + b-level is the longest path through the op: at most the critical path, equal on it
    through = gf.op_x[:, 1] + gf.op_x[:, 2]
    assert through.max() == pytest.approx(1.0, rel=1e-6) and (through <= 1 + 1e-6).all()
    assert all(through[m] == pytest.approx(1.0, rel=1e-5) for m in down[int(np.argmax(gf.op_x[:, 1]))])
    # every op's down path is a chain ending at an exit, the up path one starting at an entry
    outdeg = np.bincount(g.src, minlength=g.num_ops)
    indeg = np.bincount(g.dst, minlength=g.num_ops)
    for v in range(g.num_ops):
        assert any(outdeg[m] == 0 for m in down[v]) and v in down[v]
        assert any(indeg[m] == 0 for m in up[v]) and v in up[v]


def test_single_device_has_no_communication_features():
    g = diamond()
    gf = graph_features(g, unit(1))
    np.testing.assert_array_equal(gf.op_x[:, 3:5], 0.0)
    np.testing.assert_array_equal(gf.edge_attr[:, 0], 0.0)
    np.testing.assert_allclose(gf.op_x[:, 0], [2 / 3, 1, 1 / 3, 2 / 3], rtol=1e-6)
    assert np.isfinite(gf.op_x).all()


# ============================================================================ dynamic device features
class RefState:
    """A list-schedule state written straight from the listsched module docstring."""

    def __init__(self, graph, cm: CostModel, cl):
        self.n, self.nd = graph.num_ops, cm.num_devices
        self.comp, self.lat, self.inv = cm.compute_s, cm.latency_s, cm.inv_bw
        self.preds = [[] for _ in range(self.n)]
        for s, d in zip(graph.src.tolist(), graph.dst.tolist()):
            self.preds[d].append(s)
        self.bytes = graph.output_bytes.astype(float)
        # mean transfer time of the producer's output over distinct device pairs
        off = ~np.eye(self.nd, dtype=bool)
        self.mean_xfer = (np.zeros(self.n) if self.nd == 1 else cl.latency_s[off].mean()
                          + self.bytes * (1.0 / cl.bandwidth_Bps[off]).mean())  # fmt: skip
        self.dev = [-1] * self.n
        self.start = [0.0] * self.n
        self.finish = [0.0] * self.n
        self.free = [0.0] * self.nd

    def xfer(self, p, d):
        dp = self.dev[p]
        if dp == d:
            return 0.0
        return self.lat[dp, d] + self.bytes[p] * self.inv[dp, d]

    def est(self, v, d):
        t = self.free[d]
        for p in self.preds[v]:
            t = max(t, self.finish[p] + self.xfer(p, d))
        return t

    def features(self, v):
        """``[D, F]`` in the order of :data:`DEVICE_FEATURES` (every name needs a definition here)."""
        ests = [self.est(v, d) for d in range(self.nd)]
        assigned = [sum(self.comp[u, d] for u in range(self.n) if self.dev[u] == d) for d in range(self.nd)]
        rows = []
        for d in range(self.nd):
            on_d = [p for p in self.preds[v] if self.dev[p] == d]
            ref = {
                "assigned_compute": assigned[d],
                "input_compute": sum(self.comp[p, d] for p in on_d),
                "input_first_start": min((self.start[p] for p in on_d), default=0.0),
                "input_last_finish": max((self.finish[p] for p in on_d), default=0.0),
                "est": ests[d],
                "est_gap": ests[d] - min(ests),
                "input_comm": sum(self.mean_xfer[p] for p in on_d),
                "assigned_gap": assigned[d] - min(assigned),
                "compute": self.comp[v, d],
                "eft_gap": ests[d] + self.comp[v, d] - min(e + self.comp[v, k] for k, e in enumerate(ests)),
                "has_input": 1.0 if on_d else 0.0,
            }
            unknown = [f for f in DEVICE_FEATURES if f not in ref]
            assert not unknown, f"device features without a reference definition: {unknown}"
            rows.append([ref[f] for f in DEVICE_FEATURES])
        return np.array(rows)

    def place(self, v, d):
        s = self.est(v, d)
        self.dev[v] = d
        self.start[v] = s
        self.finish[v] = s + self.comp[v, d]
        self.free[d] = self.finish[v]


def _random_topo_walk(graph, rng):
    """A uniformly random ready op at every step: a random topological order."""
    n = graph.num_ops
    indeg = np.bincount(graph.dst, minlength=n).tolist()
    succ = [[] for _ in range(n)]
    for s, d in zip(graph.src.tolist(), graph.dst.tolist()):
        succ[s].append(d)
    ready = [v for v in range(n) if indeg[v] == 0]
    while ready:
        v = ready.pop(int(rng.integers(len(ready))))
        yield v
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)


def _check_against_reference(graph, cl, seed):
    cm = CostModel.build(graph, cl)
    ps = PlacementState(graph, cm, batch=1)
    ref = RefState(graph, cm, cl)
    rng = np.random.default_rng(seed)
    scale = float(cm.compute_s.sum())
    steps = 0
    seen_input_flag = False
    for v in _random_topo_walk(graph, rng):
        ops = np.array([v])
        got = ps.features(ops)
        assert got.shape == (1, cl.num_devices, NUM_DEVICE_FEATURES)
        want = ref.features(v)
        np.testing.assert_allclose(got[0], want, rtol=1e-12, atol=1e-12 * scale, err_msg=f"op {v} step {steps}")
        seen_input_flag |= bool(want[:, HAS_INPUT].any())
        est = ps.est(ops)
        np.testing.assert_allclose(est[0], want[:, 4], rtol=1e-12, atol=1e-12 * scale)
        d = int(rng.integers(cl.num_devices))
        ps.place(ops, np.array([d]), est[:, d])
        ref.place(v, d)
        steps += 1
    assert steps == graph.num_ops
    assert seen_input_flag
    np.testing.assert_array_equal(ps.dev[0], ref.dev)
    np.testing.assert_allclose(ps.start_s[0], ref.start, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(ps.finish_s[0], ref.finish, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(ps.free_s[0], ref.free, rtol=1e-12, atol=1e-12 * scale)
    per_dev = [sum(cm.compute_s[u, k] for u in range(graph.num_ops) if ref.dev[u] == k) for k in range(cl.num_devices)]
    np.testing.assert_allclose(ps.assigned_compute_s[0], per_dev, rtol=1e-12)



def test_device_feature_names():
    assert NUM_DEVICE_FEATURES == len(DEVICE_FEATURES) == len(set(DEVICE_FEATURES))
    # the first six are the list-schedule quantities the PLC teacher (est_gap) relies on
    assert DEVICE_FEATURES[:6] == ("assigned_compute", "input_compute", "input_first_start", "input_last_finish",
                                   "est", "est_gap")  # fmt: skip
    # normalise_device_features leaves the last column unscaled: it must be the 0/1 flag
    assert DEVICE_FEATURES[-1] == "has_input"


@pytest.mark.parametrize("preset,seed", [("p100x4", 0), ("unit:3", 1), ("cpu4:2", 2)])
def test_device_features_match_reference_on_named_clusters(preset, seed):
    g = workloads.build("random", num_ops=30 + 10 * seed, seed=seed + 5)
    _check_against_reference(g, cluster(preset), seed)


@settings(max_examples=6, deadline=None)
@given(
    num_ops=st.integers(20, 60),
    graph_seed=st.integers(0, 10_000),
    preset=st.sampled_from(["p100x4", "unit", "cpu4"]),
    num_devices=st.integers(2, 5),
    walk_seed=st.integers(0, 2**31),
)
def test_device_features_match_reference_random(num_ops, graph_seed, preset, num_devices, walk_seed):
    g = workloads.build("random", num_ops=num_ops, seed=graph_seed)
    _check_against_reference(g, cluster(f"{preset}:{num_devices}"), walk_seed)


def test_batched_states_are_independent():
    g = workloads.build("random", num_ops=25, seed=3)
    cl = cluster("unit:3")
    cm = CostModel.build(g, cl)
    ps = PlacementState(g, cm, batch=2)
    refs = [RefState(g, cm, cl), RefState(g, cm, cl)]
    rng = np.random.default_rng(7)
    walks = [list(_random_topo_walk(g, rng)) for _ in range(2)]
    assert walks[0] != walks[1]
    for h in range(g.num_ops):
        ops = np.array([walks[0][h], walks[1][h]])
        feats = ps.features(ops)
        for b in range(2):
            np.testing.assert_allclose(feats[b], refs[b].features(ops[b]), rtol=1e-12, atol=1e-9)
        devs = rng.integers(3, size=2)
        est = ps.est(ops)
        ps.place(ops, devs, est[np.arange(2), devs])
        for b in range(2):
            refs[b].place(int(ops[b]), int(devs[b]))
    for b in range(2):
        np.testing.assert_array_equal(ps.dev[b], refs[b].dev)


def test_block_features_are_tile_coordinates_over_the_grid():
    from doppler import workloads

    g = workloads.build("chainmm")
    gf = graph_features(g, unit(4))
    blk = gf.op_x[:, 5:9]
    for v in range(g.num_ops):
        grp = g.group[v]
        if grp < 0:
            assert not blk[v].any()
            continue
        grid = g.groups[grp].grid
        for k in range(min(len(grid), 4)):
            want = g.block[v, k] / grid[k] if g.block[v, k] >= 0 and grid[k] > 1 else 0.0
            assert blk[v, k] == pytest.approx(want)
    assert blk.max() > 0  # chainmm is tiled
