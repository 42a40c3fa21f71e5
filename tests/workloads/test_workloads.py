"""Workload builders: tile graphs compute the right thing, costs are conserved, params are checked."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doppler.ir.kernels import MAP_FLOPS, evaluate_numpy
from doppler.ir.graph import OpKind
from doppler.workloads import WORKLOADS, WorkloadError, build, list_workloads, param_spec, parse_set, reference
from doppler.workloads.references import assemble_outputs, make_inputs
from doppler.ir.analysis import summary

TILE_WORKLOADS = ["chainmm", "ffnn", "llama_block", "llama_layer"]

# (workload, overrides) at size=tiny: the default blocking and a different one each
TINY_CASES = [
    ("chainmm", {}),
    ("chainmm", {"row_blocks": 2, "col_blocks": 4, "inner_blocks": 4}),
    ("ffnn", {}),
    ("ffnn", {"batch_blocks": 2, "in_blocks": 4, "hidden_blocks": 2, "out_blocks": 4}),
    ("llama_block", {}),
    ("llama_block", {"seq_blocks": 2, "dim_blocks": 2, "head_blocks": 2, "hidden_blocks": 2}),
    ("llama_layer", {}),
    ("llama_layer", {"seq_blocks": 4, "dim_blocks": 1, "head_blocks": 1, "hidden_blocks": 2, "vocab_blocks": 2}),
    ("llama_model", {}),
    ("llama_model", {"n_kv_heads": 1, "head_blocks": 1, "seq_blocks": 2, "layers": 3}),
    ("llama_model", {"n_kv_heads": 4, "head_blocks": 4, "dim_blocks": 2, "batch": 2, "batch_blocks": 2}),
]


def _check_end_to_end(g, seed=0):
    assert g.flops.sum() == pytest.approx(g.meta["untiled_flops"], rel=1e-12)
    x = make_inputs(g, seed)
    got = assemble_outputs(g, evaluate_numpy(g, x))
    want = reference(g, x)
    assert set(got) == set(want) and want
    for k in want:
        assert got[k].shape == want[k].shape
        assert np.isfinite(want[k]).all()
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-8 * max(1.0, np.abs(want[k]).max()))


@pytest.mark.parametrize("name, overrides", TINY_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(TINY_CASES)])
def test_tiny_graph_matches_untiled_reference(name, overrides):
    _check_end_to_end(build(name, size="tiny", **overrides))


def test_reference_comparison_can_fail():
    g = build("ffnn", size="tiny")
    x = make_inputs(g, 0)
    vals = evaluate_numpy(g, x)
    agg = next(i for i in range(g.num_ops) if g.names[i].startswith("softmax.sum") and g.names[i].endswith("agg"))
    vals = list(vals)
    vals[agg] = vals[agg] * 1.01  # a wrong aggregation must not go unnoticed...
    div = [i for i in range(g.num_ops) if g.names[i].startswith("softmax.div")]
    from doppler.ir.kernels import run_op_numpy

    for i in div:  # ...once it propagates to the outputs
        ops = [vals[r["op"]] if "op" in r else None for r in g.specs[i]["inputs"]]
        vals[i] = run_op_numpy(g.specs[i], ops)
    got = assemble_outputs(g, vals)["Y"]
    assert not np.allclose(got, reference(g, x)["Y"], rtol=1e-4)


def test_untiled_flops_closed_forms():
    n = 64
    g = build("chainmm", n=n, size="tiny", row_blocks=4, col_blocks=2, inner_blocks=8)
    assert g.meta["untiled_flops"] == 3 * (2 * n**3 - n**2) + n**2
    assert g.flops.sum() == g.meta["untiled_flops"]
    B, I, H, O = 16, 32, 24, 8
    g = build("ffnn", size="tiny", batch=B, d_in=I, d_hidden=H, d_out=O, hidden_blocks=2)
    want = (2 * B * I * H - B * H) + 2 * B * H + (2 * B * H * O - B * O) + B * O
    want += (B * O - B) + MAP_FLOPS["exp_sub"] * B * O + (B * O - B) + B * O
    assert g.meta["untiled_flops"] == want
    assert g.flops.sum() == want


EXPECTED_COUNTS = {"chainmm": (60, 80), "ffnn": (160, 185), "llama_block": (180, 215), "llama_layer": (220, 250)}


@pytest.mark.parametrize("name", TILE_WORKLOADS)
def test_default_paper_graphs(name):
    g = build(name)
    lo, hi = EXPECTED_COUNTS[name]
    assert lo <= g.num_ops <= hi
    assert g.meta["workload"] == name and g.meta["params"]["size"] == "paper"
    assert g.flops.sum() == pytest.approx(g.meta["untiled_flops"], rel=1e-12)
    # every op carries a spec, name, group and a block index inside its group's grid
    assert len(set(g.names)) == g.num_ops
    assert all(s is not None for s in g.specs)
    for i in range(g.num_ops):
        grp = g.groups[g.group[i]]
        blk = g.block[i][: len(grp.grid)]
        assert (blk >= 0).all() and (blk < np.array(grp.grid)).all()
        assert (g.block[i][len(grp.grid) :] == -1).all()
    # specs and metadata are plain JSON data
    assert json.loads(json.dumps(g.specs)) == g.specs
    assert json.loads(json.dumps(g.meta)) == g.meta
    # input tensors are not ops: entry ops read only graph inputs (or nothing, for fills)
    for i in np.flatnonzero(g.in_degree() == 0):
        assert all("input" in r for r in g.specs[i]["inputs"])
    # every op's output feeds something or is a graph output
    outs = {t[0] for o in g.meta["outputs"].values() for t in o["tiles"]}
    assert set(np.flatnonzero(g.out_degree() == 0)) == outs


def test_chainmm_default_structure_and_costs():
    g = build("chainmm")
    n = 8192
    counts = summary(g)["ops_by_kind"]
    assert counts == {"matmul": 40, "add": 20, "elementwise": 8}  # 8+16+16 partials, 4+8+8 aggs, final sum
    i = g.names.index("AB[0,0]k0")
    m, k, c = n // 4, n // 2, n // 2
    assert g.flops[i] == 2 * m * k * c - m * c
    assert g.output_bytes[i] == m * c * 4
    assert g.kind[g.names.index("AB[0,0]agg")] == OpKind.ADD
    assert g.groups[g.group[i]].grid == (4, 2, 2)


def test_llama_sizes_and_kinds():
    g = build("llama_block")
    p = g.meta["params"]
    assert (p["dim"], p["n_heads"], p["head_dim"], p["hidden"]) == (4096, 32, 128, 11008)
    assert g.meta["inputs"]["w_q"] == [4096, 32, 128]
    kinds = set(g.kind_labels())
    assert {"matmul", "add", "softmax", "norm", "rotary", "mask_fill", "elementwise"} <= kinds
    layer = build("llama_layer")
    assert {"select", "mask_fill"} <= set(layer.kind_labels())
    assert layer.meta["outputs"]["logits"]["shape"] == [1, 32000]
    assert any(s["kernel"] == "fill" for s in layer.specs)


# ---------------------------------------------------------------- LLaMA batch
LLAMA_BATCH_CASES = [
    ("llama_block", {"batch": 2, "batch_blocks": 2}),
    ("llama_block", {"batch": 3, "batch_blocks": 1}),
    ("llama_block", {"batch": 2, "batch_blocks": 2, "seq_blocks": 2, "dim_blocks": 2, "head_blocks": 2}),
    ("llama_layer", {"batch": 2, "batch_blocks": 2}),
    ("llama_layer", {"batch": 3, "batch_blocks": 1}),
    ("llama_layer", {"batch": 4, "batch_blocks": 2, "seq_blocks": 4, "vocab_blocks": 2, "hidden_blocks": 2}),
]


@pytest.mark.parametrize(
    "name, overrides", LLAMA_BATCH_CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(LLAMA_BATCH_CASES)]
)
def test_llama_batch_matches_reference(name, overrides):
    g = build(name, size="tiny", **overrides)
    p = g.meta["params"]
    B = overrides["batch"]
    assert p["batch"] == B and g.meta["inputs"]["x"] == [B, p["seq_len"], p["dim"]]
    out = "out" if name == "llama_block" else "logits"
    want_shape = [B, p["seq_len"], p["dim"]] if name == "llama_block" else [B, p["vocab"]]
    assert g.meta["outputs"][out]["shape"] == want_shape
    assert g.flops.sum() == pytest.approx(g.meta["untiled_flops"], rel=1e-12)
    _check_end_to_end(g)
    # every op's block index lies inside its group's grid
    for i in range(g.num_ops):
        grid = g.groups[g.group[i]].grid
        blk = g.block[i][: len(grid)]
        assert (blk >= 0).all() and (blk < np.array(grid)).all()


@pytest.mark.parametrize("name", ["llama_block", "llama_layer"])
def test_llama_batch_defaults_keep_op_counts(name):
    spec = param_spec(name)
    assert spec["batch"] == 1 and spec["batch_blocks"] == 1
    want = {"llama_block": 206, "llama_layer": 240}[name]
    g = build(name)
    assert g.num_ops == want and g.meta["inputs"]["x"] == [1, 512, 4096]
    # batch in one block: same tiles, each just bigger; batch in two blocks: every tile
    # doubles except the causal mask, which is shared by all sequences
    tiny = build(name, size="tiny")
    assert build(name, size="tiny", batch=3).num_ops == tiny.num_ops == want
    n_fill = sum(s["kernel"] == "fill" for s in tiny.specs)
    assert n_fill == (name == "llama_layer")
    assert build(name, size="tiny", batch=2, batch_blocks=2).num_ops == 2 * want - n_fill


@pytest.mark.parametrize("name", ["llama_block", "llama_layer"])
@pytest.mark.parametrize("batch_blocks", [1, 2])
def test_llama_sequences_do_not_attend_to_each_other(name, batch_blocks):
    g = build(name, size="tiny", batch=2, batch_blocks=batch_blocks)
    out = "out" if name == "llama_block" else "logits"
    x = make_inputs(g, 0)
    base = assemble_outputs(g, evaluate_numpy(g, x))[out]
    x2 = dict(x)
    x2["x"] = x["x"].copy()
    x2["x"][1] += 3.0 * np.random.default_rng(1).standard_normal(x["x"][1].shape)
    moved = assemble_outputs(g, evaluate_numpy(g, x2))[out]
    np.testing.assert_array_equal(moved[0], base[0])  # sequence 0 is untouched...
    assert not np.allclose(moved[1], base[1])  # ...while sequence 1 changed
    np.testing.assert_allclose(moved, reference(g, x2)[out], rtol=1e-4, atol=1e-8 * np.abs(moved).max())


def test_llama_batch_attention_is_causal_per_sequence():
    g = build("llama_block", size="tiny", batch=2, seq_blocks=2)
    s = g.meta["params"]["seq_len"]
    x = make_inputs(g, 0)
    base = assemble_outputs(g, evaluate_numpy(g, x))["out"]
    x2 = dict(x)
    x2["x"] = x["x"].copy()
    x2["x"][:, -1] += 1.0  # the last token of each sequence
    moved = assemble_outputs(g, evaluate_numpy(g, x2))["out"]
    np.testing.assert_array_equal(moved[:, : s - 1], base[:, : s - 1])
    assert not np.allclose(moved[:, -1], base[:, -1])


@pytest.mark.parametrize("name", list_workloads())
def test_builds_are_deterministic(name):
    a, b = build(name), build(name)
    assert a.fingerprint() == b.fingerprint()
    assert a.equals(b)


def test_random_graphs():
    a, b = build("random", seed=3), build("random", seed=3)
    assert a.equals(b)
    c = build("random", seed=4)
    assert c.fingerprint() != a.fingerprint()
    assert a.specs is None and a.num_ops == 200
    g = build("random", num_ops=500, max_fan_in=2, window=1, width=10)
    indeg = g.in_degree()
    assert indeg.max() <= 2
    assert (g.level[indeg == 0] == 0).all()
    with pytest.raises(WorkloadError, match="random"):
        reference(g, {})


def test_random_builds_100k_ops():
    # its speed is benchmarks/graph_scale.py's (a timed assertion here would fail on a loaded machine)
    g = build("random", num_ops=100_000, width=64, seed=1)
    assert g.num_ops == 100_000 and g.num_edges > 100_000
    assert (g.level[g.dst] > g.level[g.src]).all()  # levels increase along every edge: acyclic


@pytest.mark.parametrize(
    "name, params, message",
    [
        ("llama_block", {"head_blocks": 5}, "llama_block: head_blocks=5 does not divide n_heads=32"),
        ("chainmm", {"size": "tiny", "row_blocks": 3}, "chainmm: row_blocks=3 does not divide n=16"),
        ("ffnn", {"out_blocks": 0}, "ffnn: out_blocks=0 must be a positive integer"),
        ("chainmm", {"blocks": 2}, "chainmm: unknown parameter 'blocks'"),
        ("chainmm", {"size": "huge"}, "chainmm: size='huge' must be one of tiny, small, paper"),
        ("chainmm", {"n": "big"}, "chainmm: n='big' must be an integer"),
        ("chainmm", {"n": 2.5}, "chainmm: n=2.5 must be an integer"),
        ("ffnn", {"dtype": "int8"}, "ffnn: dtype='int8' must be one of"),
        ("llama_layer", {"vocab_blocks": 7}, "llama_layer: vocab_blocks=7 does not divide vocab=32000"),
        ("llama_block", {"size": "tiny", "batch": 3, "batch_blocks": 2},
         "llama_block: batch_blocks=2 does not divide batch=3"),
        ("llama_layer", {"batch": 4, "batch_blocks": 3}, "llama_layer: batch_blocks=3 does not divide batch=4"),
        ("llama_block", {"batch": 0}, "llama_block: batch=0 must be a positive integer"),
        ("llama_block", {"eps": -1.0}, "llama_block: eps=-1.0 must be > 0"),
        ("llama_block", {"size": "tiny", "head_dim": 7}, "head_dim=7 must be even"),
        ("random", {"width": 0}, "random: width=0 must be a positive integer"),
        ("random", {"seed": -1}, "random: seed=-1 must be an integer >= 0"),
        ("llama_model", {"layers": 0}, "llama_model: layers=0 must be a positive integer"),
        ("llama_model", {"layers": 10_000}, "llama_model: layers=10000 is over the maximum of 1000"),
        ("llama_model", {"n_kv_heads": 12}, "llama_model: n_kv_heads=12 does not divide n_heads=32"),
        ("llama_model", {"n_kv_heads": 8, "head_blocks": 16},
         "llama_model: head_blocks=16 does not divide n_kv_heads=8"),
        ("transformer", {}, "unknown workload 'transformer' (known: chainmm, ffnn, llama_block, llama_layer, llama_model, random)"),
    ],
)
def test_bad_params(name, params, message):
    with pytest.raises(WorkloadError) as e:
        build(name, **params)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_param_spec_and_parse_set():
    spec = param_spec("llama_layer")
    assert spec["size"] == "paper" and spec["vocab"] == 32000 and spec["eps"] == 1e-6
    assert set(WORKLOADS) == set(list_workloads())
    got = parse_set(["n=1024", "dtype=float64", "size=small", "row_blocks=4.0"], "chainmm")
    assert got == {"n": 1024, "dtype": "float64", "size": "small", "row_blocks": 4}
    assert type(got["n"]) is int
    assert parse_set(["eps=1e-5"], "llama_block") == {"eps": 1e-5}
    assert parse_set(["a=3", "b=0.5", "c=x"]) == {"a": 3, "b": 0.5, "c": "x"}
    with pytest.raises(WorkloadError, match="chainmm: n='1.5' is not a valid int"):
        parse_set(["n=1.5"], "chainmm")
    with pytest.raises(WorkloadError, match="unknown parameter 'nn'"):
        parse_set(["nn=3"], "chainmm")
    with pytest.raises(WorkloadError, match="seed is set twice"):
        parse_set(["seed=1", "seed=2"], "random")
    with pytest.raises(WorkloadError, match="expected key=value"):
        parse_set(["n"], "chainmm")
    with pytest.raises(WorkloadError, match="not a valid float"):
        parse_set(["eps=small"], "llama_block")
    # explicit keys override the size preset
    g = build("chainmm", **parse_set(["size=tiny", "n=32"], "chainmm"))
    assert g.meta["params"]["n"] == 32 and g.meta["inputs"]["A"] == [32, 32]


def _divisors(n, cap=8):
    return [d for d in range(1, cap + 1) if n % d == 0]


_hyp = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_hyp
@given(
    rb=st.sampled_from(_divisors(16)),
    cb=st.sampled_from(_divisors(16)),
    ib=st.sampled_from(_divisors(16)),
    seed=st.integers(0, 3),
)
def test_chainmm_any_blocking(rb, cb, ib, seed):
    _check_end_to_end(build("chainmm", size="tiny", row_blocks=rb, col_blocks=cb, inner_blocks=ib), seed)


@_hyp
@given(
    bb=st.sampled_from(_divisors(12)),
    ib=st.sampled_from(_divisors(8)),
    hb=st.sampled_from(_divisors(24)),
    ob=st.sampled_from(_divisors(6)),
)
def test_ffnn_any_blocking(bb, ib, hb, ob):
    g = build("ffnn", size="tiny", batch=12, d_in=8, d_hidden=24, d_out=6,
              batch_blocks=bb, in_blocks=ib, hidden_blocks=hb, out_blocks=ob)  # fmt: skip
    n_aggs = int((g.kind == OpKind.ADD).sum())
    # fc1 aggs + fc2 aggs + softmax max/sum aggs, only where a contraction is split
    assert n_aggs == bb * hb * (ib > 1) + bb * ob * (hb > 1) + 2 * bb * (ob > 1)
    _check_end_to_end(g)


def test_sizes_above_the_maximum_are_rejected_before_allocating() -> None:
    import pytest

    from doppler.workloads import MAX_OPS, WorkloadError, build

    with pytest.raises(WorkloadError, match=rf"num_ops=10000000000 is over the maximum of {MAX_OPS}"):
        build("random", num_ops=10_000_000_000)
    with pytest.raises(WorkloadError, match=rf"make 15,267,360 tile ops, over the maximum of {MAX_OPS:,}"):
        build("llama_block", dim=4096, dim_blocks=4096, head_blocks=32, hidden_blocks=32, seq_blocks=16)


def test_tile_ops_are_counted_exactly_before_a_graph_is_built() -> None:
    """The refusal above counts each workload's tile ops without making any: the count is the built graph's
    op count, including attention's, which grows with the square of seq_blocks (so no product of block
    counts bounds it: seq_blocks=300 of a tiny llama_block once built 2.6 M ops for minutes and 5.6 GB,
    found by tests/fuzz/test_workload_params.py)."""
    import time

    import pytest

    from doppler.workloads import WorkloadError, build, count_ops

    cases = [("chainmm", {"size": "tiny", "row_blocks": 4, "col_blocks": 2, "inner_blocks": 8}),
             ("ffnn", {"size": "tiny", "batch_blocks": 2, "in_blocks": 4, "hidden_blocks": 2, "out_blocks": 8}),
             ("llama_block", {"size": "tiny", "batch": 2, "batch_blocks": 2, "seq_blocks": 4, "dim_blocks": 2}),
             ("llama_layer", {"size": "tiny", "seq_blocks": 8, "head_blocks": 2, "hidden_blocks": 8})]  # fmt: skip
    for name, params in cases + [("random", {"size": "tiny"})]:
        assert count_ops(name, **params) == build(name, **params).num_ops, name
    t0 = time.perf_counter()
    with pytest.raises(WorkloadError, match="make 2,577,000 tile ops"):
        build("llama_block", size="tiny", seq_len=300, seq_blocks=300)
    assert time.perf_counter() - t0 < 2.0  # (milliseconds: the count makes no op)


def test_sizes_whose_flops_overflow_a_float_are_refused() -> None:
    """A dimension of 10**120 once ended in Python's OverflowError (exit 1, 'internal error'); now its tensors,
    past the elements a graph file may declare, are refused as the ops are counted, before any is made."""
    import pytest

    from doppler.workloads import WorkloadError, build

    for n in (10**120, 10**90):
        with pytest.raises(WorkloadError, match=r"chainmm: input 'A' of shape \[10+, 10+\] has more than "
                                                r"1,099,511,627,776 elements"):  # fmt: skip
            build("chainmm", size="tiny", n=n)


@pytest.mark.parametrize(("name", "params", "what"), [
    ("ffnn", {"batch": 10**13}, "input 'X'"),
    ("llama_block", {"batch": 10**6, "seq_len": 10**6}, "input 'x'"),
    ("llama_block", {"seq_len": 2 * 10**6}, "a tile of 'scores'"),
])  # fmt: skip
def test_a_workload_declaring_a_tensor_no_graph_file_may_hold_is_refused_before_it_is_built(name, params, what) -> None:
    """``graph build`` once wrote these graphs, which every reader then refused (MAX_TENSOR_ELEMENTS)."""
    from doppler.workloads import WorkloadError, count_ops

    with pytest.raises(WorkloadError, match=rf"{name}: {re.escape(what)} of shape .* has more than 1,099,511,627,776"):
        count_ops(name, size="tiny", **params)


def test_llama_model_is_llama_2_7b_by_default_and_every_op_records_its_module():
    g = build("llama_model")
    p = g.meta["params"]
    assert (p["layers"], p["dim"], p["n_heads"], p["n_kv_heads"], p["hidden"], p["vocab"]) == (32, 4096, 32, 32, 11008,
                                                                                                 32000)
    assert p["dtype"] == "float16"
    weights = sum(np.prod(s) for k, s in g.meta["inputs"].items() if k not in g.meta["user_inputs"]
                  and not k.startswith("rope"))
    assert weights == 6_738_415_616  # LLaMA-2-7B's parameter count
    modules, index = g.op_modules()
    assert (index >= 0).all()
    assert modules[0] == "model.embed_tokens" and modules[-2:] == ["model.norm", "lm_head"]
    layer_of = {m.split(".")[2] for m in modules if m.startswith("model.layers.")}
    assert layer_of == {str(i) for i in range(32)}
    q = [i for i in range(g.num_ops) if g.names[i].startswith("layers.7.q_proj")]
    assert {modules[index[i]] for i in q} == {"model.layers.7.self_attn.q_proj"}


def test_grouped_query_attention_shrinks_only_the_key_value_weights():
    mha, gqa = build("llama_model", layers=1), build("llama_model", layers=1, n_kv_heads=8)
    for key in ("layers.0.w_k", "layers.0.w_v"):
        assert mha.meta["inputs"][key] == [4096, 32, 128] and gqa.meta["inputs"][key] == [4096, 8, 128]
    assert mha.meta["inputs"]["layers.0.w_q"] == [4096, 32, 1, 128] and gqa.meta["inputs"]["layers.0.w_q"] == [4096, 8,
                                                                                                                4, 128]
    assert gqa.flops.sum() < mha.flops.sum()


# ------------------------------------------------------------- llama_model: batches, decode, every blocking
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), phase=st.sampled_from(["prefill", "decode"]), kv=st.sampled_from([1, 2, 4]),
       batch=st.sampled_from([1, 2, 3]), seed=st.integers(0, 3), attention=st.sampled_from(["fused", "unfused"]))  # fmt: skip
def test_llama_model_any_blocking_any_phase(data, phase, kv, batch, seed, attention):
    """Every block count from 1 to each dimension's size, at small sizes: the graph builds with the op count
    counted beforehand, its FLOPs are the untiled computation's, and it computes the reference."""
    from doppler.workloads import count_ops

    dims = {"dim": 16, "n_heads": 4, "head_dim": 4, "hidden": 24, "vocab": 12, "n_kv_heads": kv, "layers": 1}
    p = {"size": "tiny", "batch": batch, **dims, "phase": phase, "attention": attention,
         "batch_blocks": data.draw(st.sampled_from(_divisors(batch))),
         "dim_blocks": data.draw(st.sampled_from(_divisors(16, 16))),
         "head_blocks": data.draw(st.sampled_from(_divisors(kv))),
         "hidden_blocks": data.draw(st.sampled_from(_divisors(24, 24))),
         "vocab_blocks": data.draw(st.sampled_from(_divisors(12, 12)))}  # fmt: skip
    if phase == "decode":
        p["context"] = data.draw(st.integers(1, 6))
        p["context_blocks"] = data.draw(st.sampled_from(_divisors(p["context"])))
    else:
        p["seq_len"] = 4
        p["seq_blocks"] = data.draw(st.sampled_from(_divisors(4)))
    g = build("llama_model", **p)
    assert g.num_ops == count_ops("llama_model", **p)
    assert (g.meta["phase"], g.meta["batch"], g.meta["context"]) == (phase, batch, p.get("context", 0))
    _check_end_to_end(g, seed)


def _same_weights(decode, prefill, x_prefill, seed=0):
    """Inputs of ``decode`` holding ``prefill``'s weights, each sequence's last token, and the keys and values
    the prefill computed for every position before it as the KV cache."""
    from doppler.workloads.references import llama_model_forward

    x = make_inputs(decode, seed)
    for name in decode.meta["inputs"]:
        if name in x_prefill and not name.startswith("rope") and name != "tokens":
            x[name] = x_prefill[name]
    x["tokens"] = x_prefill["tokens"][:, -1:]
    _, caches = llama_model_forward(prefill.meta["params"], x_prefill)
    n = decode.meta["context"]
    for i, (k, v) in enumerate(caches):
        x[f"layers.{i}.k_cache"], x[f"layers.{i}.v_cache"] = k[:, :n], v[:, :n]
    return x


@pytest.mark.parametrize("attention", ["fused", "unfused"])
@pytest.mark.parametrize("overrides", [{}, {"batch": 2, "batch_blocks": 2, "context_blocks": 7, "head_blocks": 2,
                                            "dim_blocks": 4, "hidden_blocks": 2, "vocab_blocks": 2}])  # fmt: skip
def test_a_decode_step_over_the_cache_of_a_prefill_gives_the_prefills_last_logits(overrides, attention):
    """The KV cache's correctness check: decode at context N, its cache the keys and values a prefill of the
    N + 1 tokens computed for the first N, gives that prefill's logits (the reference and the tiled graph)."""
    n, batch = 7, overrides.get("batch", 1)
    prefill = build("llama_model", size="tiny", seq_len=n + 1, batch=batch, attention=attention)
    decode = build("llama_model", size="tiny", phase="decode", context=n, attention=attention, **overrides)
    assert decode.meta["params"]["seq_len"] == 1 and decode.meta["inputs"]["tokens"] == [batch, 1]
    x_prefill = make_inputs(prefill, 1)
    want = reference(prefill, x_prefill)["logits"]
    x = _same_weights(decode, prefill, x_prefill)
    np.testing.assert_allclose(x["rope_cos"][0], x_prefill["rope_cos"][n])  # the new token rotates at position N
    np.testing.assert_allclose(reference(decode, x)["logits"], want, rtol=1e-9, atol=1e-12)
    got = assemble_outputs(decode, evaluate_numpy(decode, x))["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    x["layers.1.k_cache"] = x["layers.1.k_cache"][:, ::-1].copy()  # a cache in the wrong order is noticed
    assert not np.allclose(reference(decode, x)["logits"], want, rtol=1e-6)


def test_the_kv_cache_is_resident_like_a_weight():
    """The cache is a graph input that is not a forward argument: every slice is held where it is read, as a
    weight's (doppler.memory); only the token ids are activation inputs."""
    from doppler import memory

    p = {"size": "tiny", "layers": 2, "phase": "decode", "context": 6, "context_blocks": 3, "batch": 2}
    g = build("llama_model", **p)
    assert g.meta["user_inputs"] == ["tokens"]
    caches = [k for k in g.meta["inputs"] if k.endswith(("k_cache", "v_cache"))]
    assert len(caches) == 4 and all(g.meta["inputs"][k] == [2, 6, 2, 8] for k in caches)
    slices = memory.input_slices(g)
    is_cache = np.array([name in caches for name in slices.names])
    assert slices.weight[is_cache].all() and is_cache.sum() == 4 * 3 * 2  # context x head blocks per tensor
    item = 2 if g.meta["dtype"] == "float16" else 4
    cache_bytes = 4 * 2 * 6 * 2 * 8 * item
    weights = sum(int(np.prod(s)) for k, s in g.meta["inputs"].items() if k not in caches and k != "tokens") * item
    assert memory.weight_bytes(g, slices) == pytest.approx(weights + cache_bytes)
    held = memory.resident_bytes(g, np.zeros(g.num_ops, np.int64), 1)
    assert held[0] == pytest.approx(weights + cache_bytes)


def test_a_decode_step_reads_every_weight_and_the_cache_once_per_token():
    """LLaMA-2-7B at its real size: a decode step has the prefill's weights plus 2 x layers x context x dim of
    cache, and about 2 FLOPs per weight per token."""
    from doppler import memory

    g = build("llama_model", phase="decode", context=2048, batch=4)
    assert (g.meta["phase"], g.meta["batch"], g.meta["context"]) == ("decode", 4, 2048)
    cache = 2 * 32 * 4 * 2048 * 4096 * 2
    assert memory.weight_bytes(g) == pytest.approx(6_738_415_616 * 2 + cache + 2 * 128 * 2)  # + the rotary row
    assert 2 * 4 * 6.4e9 < g.flops.sum() < 2 * 4 * 7.2e9


@pytest.mark.parametrize("params, match", [
    ({"phase": "decode", "context": 0}, "context=0 must be 1 to 1,000,000 with phase=decode"),
    ({"phase": "decode"}, "context=0 must be 1 to 1,000,000 with phase=decode"),
    ({"phase": "decode", "context": 1_000_001}, "context=1000001 must be 1 to 1,000,000"),
    ({"phase": "decode", "context": -3}, "context=-3 must be an integer >= 0"),
    ({"phase": "train"}, "phase='train' must be one of prefill, decode"),
    ({"context": 512}, "context=512 applies to phase=decode only"),
    ({"context_blocks": 2}, "context_blocks=2 applies to phase=decode only"),
    ({"phase": "decode", "context": 8, "seq_len": 16}, "seq_len=16 with phase=decode: a decode step has one new token"),
    ({"phase": "decode", "context": 8, "seq_blocks": 2}, "seq_blocks=2 with phase=decode"),
    ({"phase": "decode", "context": 8, "context_blocks": 3}, "context_blocks=3 does not divide context=8"),
    ({"attention": "flash"}, "attention='flash' must be one of fused, unfused"),
])  # fmt: skip
def test_bad_phase_keys_are_refused_naming_the_key(params, match):
    with pytest.raises(WorkloadError, match=match):
        build("llama_model", size="tiny", **params)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("blocks", [1, 2, 4])
def test_fused_attention_is_one_op_per_block_and_computes_the_reference(phase, blocks):
    """``attention=fused`` (the default): one ``attention`` op per (batch, query, kv-head) block and no score
    tensor; a causal query block reads the key blocks at or before it only; the tiled graph computes the
    reference, and its FLOPs are the unfused graph's less the masked half of the scores."""
    kv = {"context": 8, "context_blocks": blocks} if phase == "decode" else {"seq_len": 8, "seq_blocks": blocks}
    p = {"size": "tiny", "layers": 1, "phase": phase, "batch": 2, "batch_blocks": 2, "head_blocks": 2, **kv}
    g, unfused = build("llama_model", **p), build("llama_model", attention="unfused", **p)
    attn = [v for v in range(g.num_ops) if g.specs[v]["kernel"] == "attention"]
    q_blocks = blocks if phase == "prefill" else 1
    assert len(attn) == 2 * q_blocks * 2 and {int(g.kind[v]) for v in attn} == {int(OpKind.MATMUL)}
    assert not np.isin(g.kind, [int(OpKind.SOFTMAX), int(OpKind.MASK_FILL)]).any()
    reads = sorted(g.specs[v]["params"]["kv_tiles"] for v in attn)
    want = [i + 1 for i in range(blocks)] if phase == "prefill" else [blocks + 1]
    assert reads == sorted(want * (len(attn) // len(want)))
    assert g.flops.sum() == pytest.approx(g.meta["untiled_flops"])
    if phase == "prefill":
        assert g.flops.sum() < unfused.flops.sum()
    _check_end_to_end(g, 0)


def test_decode_takes_seq_len_1_and_rebuilds_from_its_params():
    g = build("llama_model", size="tiny", phase="decode", context=5, seq_len=1)
    again = build("llama_model", **{k: v for k, v in g.meta["params"].items()})
    assert again.fingerprint() == g.fingerprint()


def test_llama_model_records_its_layer_structure():
    g = build("llama_model", size="tiny", layers=3)
    s = g.meta["structure"]
    assert len(s["layers"]) == 3
    for i, groups in enumerate(s["layers"]):
        assert {g.groups[k].module.split(".")[2] for k in groups} == {str(i)}
    module = lambda ks: {g.groups[k].module for k in ks}  # noqa: E731
    assert module(s["embedding"]) == {"model.embed_tokens"} and module(s["final_norm"]) == {"model.norm"}
    assert module(s["lm_head"]) == {"lm_head"}
    assert {g.groups[k].name.split(".", 2)[2] for k in s["column_parallel"]["head"]} == {"q_proj", "k_proj", "v_proj"}
    assert {g.groups[k].name.split(".", 2)[2] for k in s["column_parallel"]["hidden"]} == {"gate_proj", "up_proj"}
    assert {g.groups[k].name.split(".", 2)[2] for k in s["row_parallel"]["head"]} == {"o_proj"}
    assert {g.groups[k].name.split(".", 2)[2] for k in s["row_parallel"]["hidden"]} == {"down_proj"}
    assert [g.groups[k].name for k in s["column_parallel"]["vocab"]] == ["lm_head"]
    every = s["embedding"] + sum(s["layers"], []) + s["final_norm"] + s["lm_head"]
    assert sorted(every) == list(range(len(g.groups)))  # each group in one place
    assert "structure" not in build("llama_layer", size="tiny").meta  # ops without modules: no layers
