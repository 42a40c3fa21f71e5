"""The compiled rollout (sample / greedy / teacher), its candidate sets, and the batched
re-scoring of recorded actions against slow per-step references built from the modules."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from doppler import cluster, workloads
from doppler.ir.graph import from_edges
from doppler.hardware.presets import unit
from doppler.listsched import DEVICE_FEATURES, NUM_DEVICE_FEATURES, TIE_RTOL, PlacementState
from doppler.policy.features import chain_members, graph_features
from doppler.policy.networks import LEAK, DopplerPolicy
from doppler.policy.decode import RolloutError
from doppler.policy.rollout import candidate_steps, evaluate_actions, rollout

CFG = {"hidden": 16, "steps": 2, "mlp_hidden": 12, "basis": 3}


def make(num_ops=40, seed=1, preset="p100x4", policy_seed=0, identity=False):
    """A graph, its features and a fresh policy; ``identity``: with a random learned state per device."""
    g = workloads.build("random", num_ops=num_ops, seed=seed)
    gf = graph_features(g, cluster(preset))
    torch.manual_seed(policy_seed)
    policy = DopplerPolicy(**CFG, device_identity=gf.num_devices if identity else 0)
    if identity:
        with torch.no_grad():
            policy.plc.device_init.normal_(0.0, 0.5)
    return g, gf, policy


@pytest.fixture(scope="module")
def setup():
    g, gf, policy = make()
    with torch.no_grad():
        enc = policy.encode(gf)
    return g, gf, policy, enc


def preds_of(g):
    out = [[] for _ in range(g.num_ops)]
    for s, d in zip(g.src.tolist(), g.dst.tolist()):
        out[d].append(s)
    return out


def check_structure(g, ro):
    B, n = ro.order.shape
    preds = preds_of(g)
    for b in range(B):
        assert sorted(ro.order[b].tolist()) == list(range(n)), "order is not a permutation"
        step_of = np.empty(n, dtype=np.int64)
        step_of[ro.order[b]] = np.arange(n)
        for v in range(n):
            assert all(step_of[p] < step_of[v] for p in preds[v]), f"op {v} placed before a pred"
            want_enter = 0 if not preds[v] else 1 + max(step_of[p] for p in preds[v])
            assert ro.enter_step[b, v] == want_enter, f"enter_step of op {v}"
        np.testing.assert_array_equal(ro.assignment[b, ro.order[b]], ro.step_device[b])
    assert ro.assignment.min() >= 0 and ro.assignment.max() < ro.device_features.shape[2]


# ============================================================================ rollout structure
def test_greedy_is_deterministic_and_valid(setup):
    g, gf, _, enc = setup
    a = rollout(gf, enc, batch=2, mode="greedy")
    b = rollout(gf, enc, batch=1, mode="greedy")
    check_structure(g, a)
    for field in ("order", "step_device", "assignment", "enter_step", "device_features", "est_tied"):
        x, y = getattr(a, field), getattr(b, field)
        np.testing.assert_array_equal(x[0], x[1], err_msg=field)
        np.testing.assert_array_equal(x[0], y[0], err_msg=field)
    assert a.batch == 2
    assert a.order.dtype == np.int64 and a.device_features.dtype == np.float32 and a.est_tied.dtype == np.bool_
    assert a.device_features.shape == (2, g.num_ops, gf.num_devices, NUM_DEVICE_FEATURES)


def test_sample_is_reproducible_from_the_generator(setup):
    g, gf, _, enc = setup
    a = rollout(gf, enc, batch=6, mode="sample", eps=0.1, rng=np.random.default_rng(5))
    b = rollout(gf, enc, batch=6, mode="sample", eps=0.1, rng=np.random.default_rng(5))
    c = rollout(gf, enc, batch=6, mode="sample", eps=0.1, rng=np.random.default_rng(6))
    check_structure(g, a)
    check_structure(g, c)
    for field in ("order", "step_device", "assignment", "enter_step", "device_features", "est_tied"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    assert not np.array_equal(a.order, c.order)
    # a random policy samples different episodes within one batch
    assert len({tuple(r) for r in a.assignment.tolist()}) > 1


def test_unknown_mode_and_teacher_without_actions(setup):
    _, gf, _, enc = setup
    with pytest.raises(ValueError, match="mode"):
        rollout(gf, enc, batch=1, mode="beam")
    with pytest.raises(ValueError, match="teacher"):
        rollout(gf, enc, batch=1, mode="teacher")


# ============================================================================ teacher replay
def test_teacher_replays_a_sampled_rollout_exactly(setup):
    g, gf, _, enc = setup
    ro = rollout(gf, enc, batch=4, mode="sample", eps=0.3, rng=np.random.default_rng(11))
    rt = rollout(gf, enc, batch=4, mode="teacher", order=ro.order, devices_by_step=ro.step_device)
    for field in ("order", "step_device", "assignment", "enter_step", "device_features", "est_tied"):
        np.testing.assert_array_equal(getattr(rt, field), getattr(ro, field), err_msg=field)
    # a single trajectory broadcasts over the batch
    r1 = rollout(gf, enc, batch=3, mode="teacher", order=ro.order[2], devices_by_step=ro.step_device[2])
    for b in range(3):
        np.testing.assert_array_equal(r1.assignment[b], ro.assignment[2])
        np.testing.assert_array_equal(r1.device_features[b], ro.device_features[2])


def test_teacher_replays_a_hand_trajectory():
    # diamond on unit:2 (see test_critical_path): order 0,1,2,3 on devices 0,0,1,0
    g = from_edges([2, 3, 1, 2], [(0, 1), (0, 2), (1, 3), (2, 3)], output_bytes=[1, 2, 1, 0])
    gf = graph_features(g, unit(2))
    torch.manual_seed(0)
    with torch.no_grad():
        enc = DopplerPolicy(**CFG).encode(gf)
    ro = rollout(gf, enc, batch=1, mode="teacher", order=np.array([0, 1, 2, 3]), devices_by_step=np.array([0, 0, 1, 0]))
    assert ro.assignment[0].tolist() == [0, 0, 1, 0]
    assert ro.enter_step[0].tolist() == [0, 1, 1, 3]
    # est / time scale 10: step 1 EST [2, 3], step 2 [5, 3], step 3 [5, 7]
    est = DEVICE_FEATURES.index("est")
    np.testing.assert_allclose(ro.device_features[0, :, :, est], np.array([[0, 0], [2, 3], [5, 3], [5, 7]]) / 10, rtol=1e-6)
    assert ro.est_tied[0].tolist() == [[True, True], [True, False], [False, True], [True, False]]


def test_device_features_are_normalised_placement_state_features(setup):
    g, gf, _, enc = setup
    ro = rollout(gf, enc, batch=2, mode="sample", rng=np.random.default_rng(3))
    for b in range(2):
        ps = PlacementState(g, gf.costs, batch=1)
        for h in range(g.num_ops):
            v, d = ro.order[b, h : h + 1], ro.step_device[b, h : h + 1]
            raw = ps.features(v)[0]
            want = raw.copy()
            want[:, :-1] /= gf.time_scale_s
            np.testing.assert_allclose(ro.device_features[b, h], want, rtol=2e-6, atol=1e-7)
            est_s = raw[:, DEVICE_FEATURES.index("est")]
            best = est_s.min()
            np.testing.assert_array_equal(ro.est_tied[b, h], est_s - best <= TIE_RTOL * abs(best))
            est = ps.est(v)
            ps.place(v, d, est[:, d[0]])


def test_invalid_replays_raise(setup):
    g, gf, _, enc = setup
    ro = rollout(gf, enc, batch=1, mode="greedy")
    order, devs = ro.order[0].copy(), ro.step_device[0].copy()
    preds = preds_of(g)
    # move the first op with a predecessor to the front
    k = next(h for h in range(g.num_ops) if preds[order[h]])
    bad = np.concatenate([[order[k]], np.delete(order, k)])
    with pytest.raises(RolloutError):
        rollout(gf, enc, batch=1, mode="teacher", order=bad, devices_by_step=devs)
    dup = order.copy()
    dup[-1] = dup[0]
    with pytest.raises(RolloutError):
        rollout(gf, enc, batch=1, mode="teacher", order=dup, devices_by_step=devs)
    out_of_range = order.copy()
    out_of_range[0] = g.num_ops
    with pytest.raises(RolloutError):
        rollout(gf, enc, batch=1, mode="teacher", order=out_of_range, devices_by_step=devs)
    for d in (-1, gf.num_devices):
        bad_dev = devs.copy()
        bad_dev[3] = d
        with pytest.raises(RolloutError, match="step 3"):
            rollout(gf, enc, batch=1, mode="teacher", order=order, devices_by_step=bad_dev)
    assert issubclass(RolloutError, ValueError)


# ============================================================================ candidate sets
def brute_candidates(g, order_row, h):
    preds = preds_of(g)
    done = set(order_row[:h].tolist())
    return {v for v in range(g.num_ops) if v not in done and all(p in done for p in preds[v])}


def test_candidate_steps_match_brute_force():
    g, gf, policy = make(num_ops=25, seed=2, preset="unit:3")
    with torch.no_grad():
        enc = policy.encode(gf)
    ro = rollout(gf, enc, batch=3, mode="sample", eps=0.5, rng=np.random.default_rng(0))
    cs = candidate_steps(ro)
    n = g.num_ops
    assert cs.num_segments == 3 * n
    pairs = list(zip(cs.seg.tolist(), cs.op.tolist()))
    assert len(pairs) == len(set(pairs)), "duplicate (step, candidate) pairs"
    got = [set() for _ in range(3 * n)]
    for s, v in pairs:
        got[s].add(v)
    sizes = []
    for b in range(3):
        for h in range(n):
            want = brute_candidates(g, ro.order[b], h)
            assert got[b * n + h] == want, (b, h)
            assert ro.order[b, h] in want
            sizes.append(len(want))
    assert max(sizes) > 1  # some steps have a real choice


# ============================================================================ re-scoring
def reference_scores(g, gf, policy, ro):
    """Per-step log-likelihoods and entropies, computed straight from the modules."""
    n = g.num_ops
    op_x = torch.from_numpy(gf.op_x)
    H = policy.encoder(op_x, torch.from_numpy(gf.edge_index), torch.from_numpy(gf.edge_attr))
    down = torch.stack([sum(H[m] for m in _members(chain_members(gf.next_down), v)) for v in range(n)]) / gf.path_scale
    up = torch.stack([sum(H[m] for m in _members(chain_members(gf.next_up), v)) for v in range(n)]) / gf.path_scale
    sel = policy.sel.mlp(torch.cat([policy.sel.op_lin(op_x), H, down, up], dim=1)).squeeze(1)
    plc = policy.plc
    B = ro.order.shape[0]
    nd = gf.num_devices
    out = {k: [[None] * n for _ in range(B)] for k in ("lp_sel", "lp_plc", "ent_sel", "ent_plc", "plc_logp")}
    for b in range(B):
        for h in range(n):
            v, d = int(ro.order[b, h]), int(ro.step_device[b, h])
            cands = sorted(brute_candidates(g, ro.order[b], h))
            ls = torch.log_softmax(sel[cands], dim=0)
            out["lp_sel"][b][h] = ls[cands.index(v)]
            out["ent_sel"][b][h] = -(ls.exp() * ls).sum()
            f = torch.from_numpy(ro.device_features[b, h])
            placed = torch.zeros(nd, H.shape[1])
            for hh in range(h):
                placed[int(ro.step_device[b, hh])] = placed[int(ro.step_device[b, hh])] + H[int(ro.order[b, hh])]
            pre = plc.w_dev(plc.dev_lin(f)) + plc.w_op(plc.op_lin(op_x[v])) + plc.w_emb(H[v]) + plc.w_placed(placed) / n
            affinity = (plc.aff_k(placed) / n) @ plc.aff_q(H[v])  # bilinear: (Q H[v]) . K sum_{u on d} H[u] / n
            if plc.device_init is not None:  # each device's learned state, in the units of the placed sums
                m = pre.shape[1]
                pre = pre + plc.device_init[:, :m]
                affinity = affinity + plc.device_init[:, m:] @ plc.aff_q(H[v])
            logits = plc.out(torch.nn.functional.leaky_relu(pre, LEAK)).squeeze(-1) + affinity
            lp = torch.log_softmax(logits, dim=0)
            out["lp_plc"][b][h] = lp[d]
            out["ent_plc"][b][h] = -(lp.exp() * lp).sum()
            out["plc_logp"][b][h] = lp
    res = {k: torch.stack([torch.stack(row) for row in v]) for k, v in out.items()}
    res["sel_score"] = sel
    return res


def _members(pairs, v):
    rows, cols = pairs
    return [int(c) for r, c in zip(rows.tolist(), cols.tolist()) if r == v]


@pytest.mark.parametrize("preset,mode,chunked,identity", [("p100x4", "sample", False, False),
                                                          ("unit:3", "greedy", False, False),
                                                          ("p100x4", "sample", True, False),
                                                          ("v100x8", "greedy", True, True),
                                                          ("unit:3", "sample", False, True)])  # fmt: skip
def test_evaluate_actions_matches_per_step_reference(preset, mode, chunked, identity, monkeypatch):
    """The batched re-scoring equals a per-step one built from the modules, and the compiled greedy
    decode takes the arg max of it (with device identity too: the kernel and torch start every
    device from its learned state)."""
    g, gf, policy = make(num_ops=14, seed=3, preset=preset, policy_seed=4, identity=identity)
    enc = policy.encode(gf)
    if chunked:  # PLC re-scoring in chunks of 3 steps, carrying the per-device sums across chunks
        import doppler.policy.rollout as rollout_module

        monkeypatch.setattr(rollout_module, "PLC_CHUNK_BYTES", 3 * 2 * gf.num_devices * enc.plc_placed.shape[1] * 4)
    ro = rollout(gf, enc, batch=2, mode=mode, eps=0.2, rng=np.random.default_rng(9))
    sc = evaluate_actions(enc, ro)
    ref = reference_scores(g, gf, policy, ro)
    n = g.num_ops
    torch.testing.assert_close(enc.sel_score, ref["sel_score"], rtol=1e-5, atol=1e-5)
    for name, key in (("logp_sel", "lp_sel"), ("logp_plc", "lp_plc"), ("entropy_sel", "ent_sel"),
                      ("entropy_plc", "ent_plc"), ("plc_logp", "plc_logp")):  # fmt: skip
        got = getattr(sc, name)
        assert got.shape == ref[key].shape, name
        torch.testing.assert_close(got, ref[key], rtol=1e-4, atol=1e-5, msg=name)
    if mode == "greedy":
        taken = sc.plc_logp.gather(2, torch.from_numpy(ro.step_device).unsqueeze(2)).squeeze(2)
        assert bool((taken >= sc.plc_logp.max(dim=2).values - 1e-5).all())
    # cand_logp: log SEL(candidate) for every pair, normalised per step
    per_step = torch.zeros(2 * n).index_add_(0, torch.from_numpy(sc.cands.seg), sc.cand_logp.exp())
    torch.testing.assert_close(per_step, torch.ones(2 * n), rtol=1e-5, atol=1e-5)
    # a forced step (one candidate) has log-likelihood 0 and no entropy
    single = [(b, h) for b in range(2) for h in range(n) if len(brute_candidates(g, ro.order[b], h)) == 1]
    assert single
    for b, h in single:
        assert abs(float(sc.logp_sel[b, h].detach())) < 1e-6 and abs(float(sc.entropy_sel[b, h].detach())) < 1e-6
    # and the gradients agree with the reference's
    params = [p for p in policy.parameters()]
    g_eval = torch.autograd.grad((sc.logp_sel + sc.logp_plc).sum() + 0.1 * (sc.entropy_sel + sc.entropy_plc).sum(),
                                 params, allow_unused=True)  # fmt: skip
    g_ref = torch.autograd.grad((ref["lp_sel"] + ref["lp_plc"]).sum() + 0.1 * (ref["ent_sel"] + ref["ent_plc"]).sum(),
                                params, allow_unused=True)  # fmt: skip
    nonzero = 0
    for (name, _), a, r in zip(policy.named_parameters(), g_eval, g_ref):
        if r is None:
            assert a is None or float(a.abs().max()) == 0.0, name
            continue
        assert a is not None, name
        torch.testing.assert_close(a, r, rtol=2e-3, atol=2e-5, msg=name)
        nonzero += int(float(r.abs().max()) > 0)
    assert nonzero > 10


def test_greedy_picks_the_arg_max(setup):
    g, gf, _, enc = setup
    ro = rollout(gf, enc, batch=1, mode="greedy")
    sc = evaluate_actions(enc, ro)
    sel = enc.sel_score.detach().double().numpy()
    for h in range(g.num_ops):
        cands = sorted(brute_candidates(g, ro.order[0], h))
        scores = sel[cands]
        assert ro.order[0, h] == cands[int(np.argmax(scores))], h  # argmax returns the first (lowest id) of ties
        lp = sc.plc_logp[0, h].detach().numpy()
        assert lp[ro.step_device[0, h]] >= lp.max() - 1e-5, h


def test_greedy_ties_go_to_the_lowest_id(setup):
    g, gf, _, enc = setup
    flat = dataclasses.replace(
        enc,
        sel_score=torch.zeros_like(enc.sel_score),
        plc_w_out=torch.zeros_like(enc.plc_w_out),
        plc_b_out=torch.zeros_like(enc.plc_b_out),
        plc_query=torch.zeros_like(enc.plc_query),
    )
    ro = rollout(gf, flat, batch=1, mode="greedy")
    for h in range(g.num_ops):
        assert ro.order[0, h] == min(brute_candidates(g, ro.order[0], h)), h
    np.testing.assert_array_equal(ro.step_device[0], 0)


def test_sample_frequencies_follow_the_softmax():
    g = from_edges([1, 1, 1], [])
    gf = graph_features(g, unit(2))
    torch.manual_seed(0)
    with torch.no_grad():
        enc = DopplerPolicy(**CFG).encode(gf)
    scores = torch.tensor([0.0, 1.0, 2.0])
    enc = dataclasses.replace(enc, sel_score=scores)
    N = 4000
    ro = rollout(gf, enc, batch=N, mode="sample", eps=0.0, rng=np.random.default_rng(0))
    freq = np.bincount(ro.order[:, 0], minlength=3) / N
    np.testing.assert_allclose(freq, torch.softmax(scores, 0).numpy(), atol=0.03)
    # eps = 1: uniform whatever the scores
    enc = dataclasses.replace(enc, sel_score=torch.tensor([0.0, 0.0, 30.0]))
    ro = rollout(gf, enc, batch=N, mode="sample", eps=1.0, rng=np.random.default_rng(1))
    np.testing.assert_allclose(np.bincount(ro.order[:, 0], minlength=3) / N, [1 / 3] * 3, atol=0.03)
    np.testing.assert_allclose(np.bincount(ro.step_device[:, 0], minlength=2) / N, [0.5, 0.5], atol=0.03)
    # eps = 0 and a dominant score: always that op first
    ro = rollout(gf, enc, batch=200, mode="sample", eps=0.0, rng=np.random.default_rng(2))
    assert (ro.order[:, 0] == 2).all()


@pytest.mark.parametrize(
    "graph,devices",
    [(from_edges([1], []), 1), (from_edges([1], []), 3), (from_edges([0, 0], [(0, 1)]), 3)],
    ids=["one-op-one-device", "one-op", "zero-cost"],
)
def test_degenerate_graphs_roll_out_and_score_finitely(graph, devices):
    gf = graph_features(graph, unit(devices))
    torch.manual_seed(0)
    enc = DopplerPolicy(**CFG).encode(gf)
    ro = rollout(gf, enc, batch=3, mode="sample", eps=0.1, rng=np.random.default_rng(0))
    check_structure(graph, ro)
    assert np.isfinite(ro.device_features).all()
    sc = evaluate_actions(enc, ro)
    for name in ("logp_sel", "logp_plc", "entropy_sel", "entropy_plc"):
        assert torch.isfinite(getattr(sc, name)).all(), name
    # one candidate per step here, so SEL is certain; PLC entropy is at most log(D)
    torch.testing.assert_close(sc.logp_sel, torch.zeros_like(sc.logp_sel))
    assert float(sc.entropy_plc.detach().max()) <= np.log(devices) + 1e-5


def test_sample_mode_without_a_generator(setup):
    g, gf, _, enc = setup
    with pytest.raises(ValueError, match="rng"):
        rollout(gf, enc, batch=2)  # the default mode is "sample", which needs a generator


# ============================================================================ list-schedule models
@pytest.mark.parametrize("preset", ["p100x4", "v100x8", "mixed"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rule_decodes_are_critical_path_and_heft(preset, seed):
    """Both heads on their rules: the ``critical_path`` list schedule is CRITICAL PATH, the ``heft``
    one (insertion into idle gaps, earliest finish) is HEFT, wherever b-levels do not tie."""
    from doppler import assign
    from doppler.policy.decode import rule_decode

    g = workloads.build("random", num_ops=80, seed=seed)
    from doppler.workloads.corpus import mixed3_cluster

    c = mixed3_cluster() if preset == "mixed" else cluster(preset)
    gf = graph_features(g, c)
    assert len(np.unique(gf.b_level_key)) == g.num_ops, "b-levels tie: HEFT breaks ties differently"
    np.testing.assert_array_equal(rule_decode(gf).assignment[0], assign(g, c, "critical_path").devices)
    heft_ro = rule_decode(gf, "heft")
    np.testing.assert_array_equal(heft_ro.assignment[0], assign(g, c, "heft").devices)
    # what PLC is taught in each state: the devices tied for the earliest finish, the rule's choice among them
    assert heft_ro.est_tied[0, np.arange(g.num_ops), heft_ro.step_device[0]].all()


def test_heft_list_schedule_fills_idle_gaps():
    """Op 1 waits on device 1 for op 0's data from device 0, so device 1 idles first. The short,
    independent op 2 fits into that gap: the ``heft`` model starts it at 0 on device 1, the appending
    ``critical_path`` model only after op 1."""
    from doppler.policy.decode import DecodePlan, _no_heads, _run_loop

    g = from_edges([1e9, 1e9, 1e6], [(0, 1)], output_bytes=[1e9, 1.0, 1.0])
    gf = graph_features(g, unit(2))
    est = DEVICE_FEATURES.index("est")
    plan = DecodePlan.replaying(np.array([[0, 1, 2]]), np.array([[0, 1, 1]]))
    append = _run_loop(gf, _no_heads(3, gf.num_devices), plan, False, False, "critical_path")
    heft = _run_loop(gf, _no_heads(3, gf.num_devices), plan, False, False, "heft")
    assert append.device_features[0, 2, 1, est] > 0.0
    assert heft.device_features[0, 2, 1, est] == 0.0
    # everything else about op 2's view is the same in both models
    assert heft.device_features[0, 2, 0, est] == append.device_features[0, 2, 0, est]


def test_policy_list_schedule_is_saved_and_checked():
    p = DopplerPolicy(**CFG, list_schedule="heft")
    assert p.config["list_schedule"] == "heft"
    g, gf, _ = make(num_ops=20)
    with torch.no_grad():
        enc = p.encode(gf)
    assert enc.list_schedule == "heft"
    ro = rollout(gf, enc, batch=2, mode="sample", rng=np.random.default_rng(0))
    check_structure(g, ro)
    with pytest.raises(ValueError, match="list_schedule"):
        DopplerPolicy(**CFG, list_schedule="fifo")
    from doppler.policy.architectures import policy_from_config

    old = {k: v for k, v in DopplerPolicy(**CFG).config.items() if k != "list_schedule"}  # a checkpoint from before
    assert policy_from_config(old).list_schedule == "critical_path"


# ============================================================================ ties-only device choice
@pytest.mark.parametrize("list_schedule", ["critical_path", "heft"])
@pytest.mark.parametrize("preset", ["p100x4", "v100x8"])
def test_ties_only_decodes_choose_among_the_rules_tied_devices(list_schedule, preset):
    """``plc_ties_only``: every learned device choice, greedy or sampled (with exploration), is one the
    list schedule's rule ties for first; without it the same heads leave that set somewhere."""
    g, gf, _ = make(num_ops=60, seed=4, preset=preset)
    torch.manual_seed(1)
    p = DopplerPolicy(**CFG, list_schedule=list_schedule)
    with torch.no_grad():
        enc = p.encode(gf)
    n = g.num_ops
    free = rollout(gf, enc, batch=8, mode="sample", rng=np.random.default_rng(0), eps=0.3)
    assert not free.plc_ties_only
    assert not free.est_tied[np.arange(8)[:, None], np.arange(n), free.step_device].all()
    for mode, kw in (("greedy", {}), ("sample", {"rng": np.random.default_rng(0), "eps": 0.3})):
        ro = rollout(gf, enc, batch=8 if mode == "sample" else 1, mode=mode, plc_ties_only=True, **kw)
        check_structure(g, ro)
        assert ro.plc_ties_only
        assert ro.est_tied[np.arange(ro.batch)[:, None], np.arange(n), ro.step_device].all()
    # a replay records what each step saw, whatever the flag: it scores given devices
    replayed = rollout(gf, enc, batch=8, mode="teacher", order=free.order, devices_by_step=free.step_device,
                       plc_ties_only=True)  # fmt: skip
    assert not replayed.plc_ties_only
    np.testing.assert_array_equal(replayed.assignment, free.assignment)


def test_ties_only_rescoring_is_the_distribution_the_decode_drew_from():
    """The re-scoring of a ties-only rollout renormalises PLC over the tied devices: zero probability
    elsewhere, finite log-likelihoods, entropies and gradients; the free scores are unchanged."""
    g, gf, policy = make(num_ops=40, seed=5, preset="v100x8")
    enc = policy.encode(gf)
    ro = rollout(gf, enc, batch=4, mode="sample", rng=np.random.default_rng(2), plc_ties_only=True)
    sc = evaluate_actions(enc, ro)
    probs = torch.exp(sc.plc_logp).detach().numpy()
    assert (probs[~ro.est_tied] == 0.0).all()
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    free = evaluate_actions(enc, dataclasses.replace(ro, plc_ties_only=False))
    want = torch.log_softmax(free.plc_logp.masked_fill(~torch.from_numpy(ro.est_tied), -torch.inf), -1)
    np.testing.assert_allclose(sc.logp_plc.detach().numpy(),
                               want.gather(2, torch.from_numpy(ro.step_device).unsqueeze(-1)).squeeze(-1).detach().numpy(),
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert torch.isfinite(sc.logp_plc).all() and torch.isfinite(sc.entropy_plc).all()
    assert (sc.entropy_plc <= free.entropy_plc + 1e-5).all()
    (sc.logp_plc.sum() + sc.entropy_plc.sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in policy.parameters() if t.grad is not None)


def test_ties_only_is_refused_by_the_learned_baselines():
    from doppler.policy.architectures import policy_from_config
    from doppler.policy.decode import make_plan
    from doppler.policy.rollout import run_plan

    g, gf, _ = make(num_ops=12)
    single = policy_from_config({**CFG, "architecture": "single_policy"})
    with torch.no_grad():
        enc = single.encode(gf)
    with pytest.raises(ValueError, match="plc_ties_only"):
        run_plan(gf, enc, make_plan(g.num_ops, batch=1, mode="greedy", plc_ties_only=True))
