"""The kernel whitelist: numpy semantics, FLOP convention, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from doppler.ir.kernels import MAP_ARITY, MAP_FLOPS, MAP_FNS, NUMPY_KERNELS, evaluate_numpy, flops_of, run_op_numpy
from doppler.ir.graph import from_edges

rng = np.random.default_rng(0)


def _ref(shape, name="x", op=None):
    return {"op": op, "shape": list(shape)} if op is not None else {"input": name, "shape": list(shape)}


def test_tables_are_consistent():
    assert set(MAP_FNS) - {"fused"} == set(MAP_ARITY) == set(MAP_FLOPS)  # fused: any arity, its steps' FLOPs
    assert {"einsum", "reduce_sum", "reduce_max", "sum_n", "max_n", "map", "fill", "select", "assemble",
            "embedding"} <= set(NUMPY_KERNELS)  # fmt: skip
    assert all(callable(f) for f in NUMPY_KERNELS.values())


def test_einsum_matches_numpy_and_flops():
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    spec = {"kernel": "einsum", "eq": "ik,kj->ij", "inputs": [_ref((3, 4)), _ref((4, 5))], "shape": [3, 5]}
    np.testing.assert_allclose(run_op_numpy(spec, [a, b]), a @ b)
    assert flops_of(spec) == 2 * 3 * 4 * 5 - 3 * 5
    # projection to heads and out-projection contracting two letters
    x, w = rng.standard_normal((2, 6)), rng.standard_normal((6, 3, 4))
    spec = {"kernel": "einsum", "eq": "sk,khd->shd", "inputs": [_ref((2, 6)), _ref((6, 3, 4))], "shape": [2, 3, 4]}
    np.testing.assert_allclose(run_op_numpy(spec, [x, w]), (x @ w.reshape(6, 12)).reshape(2, 3, 4))
    o = rng.standard_normal((2, 3, 4))
    wo = rng.standard_normal((3, 4, 5))
    spec = {"kernel": "einsum", "eq": "qhd,hdo->qo", "inputs": [_ref((2, 3, 4)), _ref((3, 4, 5))], "shape": [2, 5]}
    np.testing.assert_allclose(run_op_numpy(spec, [o, wo]), o.reshape(2, 12) @ wo.reshape(12, 5))
    assert flops_of(spec) == 2 * 2 * 3 * 4 * 5 - 2 * 5


def test_outputs_are_row_major_whatever_layout_the_kernel_returns():
    # "bsk,khd->bshd" as numpy computes it comes back in a transposed layout; a consumer ran many
    # times slower on that than on a row-major copy, so every output is made row-major
    x, w = rng.standard_normal((1, 64, 8)), rng.standard_normal((8, 2, 16))
    spec = {"kernel": "einsum", "eq": "bsk,khd->bshd", "inputs": [_ref((1, 64, 8)), _ref((8, 2, 16))], "shape": [1, 64, 2, 16]}
    out = run_op_numpy(spec, [x, w])
    assert out.flags.c_contiguous
    np.testing.assert_allclose(out, np.einsum("bsk,khd->bshd", x, w))
    sel = {"kernel": "select", "inputs": [_ref((4, 6))], "shape": [4, 2], "params": {"slice": [[0, 4], [2, 4]]}}
    assert run_op_numpy(sel, [rng.standard_normal((4, 6))]).flags.c_contiguous


def test_einsum_flops_are_conserved_by_tiling():
    m, k, n = 6, 8, 4
    full = {"kernel": "einsum", "eq": "ik,kj->ij", "inputs": [_ref((m, k)), _ref((k, n))], "shape": [m, n]}
    for gm, gk, gn in itertools.product([1, 2, 3], [1, 2, 4], [1, 2]):
        if m % gm or k % gk or n % gn:
            continue
        bm, bk, bn = m // gm, k // gk, n // gn
        part = {"kernel": "einsum", "eq": "ik,kj->ij", "inputs": [_ref((bm, bk)), _ref((bk, bn))], "shape": [bm, bn]}
        agg = {"kernel": "sum_n", "inputs": [_ref((bm, bn), op=0)] * gk, "shape": [bm, bn]}
        total = gm * gn * (gk * flops_of(part) + (flops_of(agg) if gk > 1 else 0))
        assert total == flops_of(full)


@pytest.mark.parametrize("how", ["sum", "max"])
def test_reductions_with_permuted_output(how):
    x = rng.standard_normal((2, 3, 4))
    spec = {"kernel": f"reduce_{how}", "eq": "ijk->ki", "inputs": [_ref((2, 3, 4))], "shape": [4, 2]}
    want = getattr(x, how)(axis=1).T
    np.testing.assert_allclose(run_op_numpy(spec, [x]), want)
    assert flops_of(spec) == 24 - 8


def test_sum_n_max_n():
    parts = [rng.standard_normal((3, 2)) for _ in range(4)]
    s = {"kernel": "sum_n", "inputs": [_ref((3, 2), op=i) for i in range(4)], "shape": [3, 2]}
    m = {"kernel": "max_n", "inputs": [_ref((3, 2), op=i) for i in range(4)], "shape": [3, 2]}
    np.testing.assert_allclose(run_op_numpy(s, parts), sum(parts))
    np.testing.assert_allclose(run_op_numpy(m, parts), np.maximum.reduce(parts))
    assert flops_of(s) == flops_of(m) == 3 * 6
    before = parts[0].copy()
    run_op_numpy(s, parts)
    np.testing.assert_array_equal(parts[0], before)  # aggregation does not clobber operands


def test_map_broadcasting_by_letters():
    a, r, c = rng.standard_normal((3, 4)), rng.standard_normal(3), rng.standard_normal(4)
    sub_rows = {"kernel": "map", "fn": "sub", "eq": "ij,i->ij", "inputs": [_ref((3, 4)), _ref((3,))], "shape": [3, 4]}
    np.testing.assert_allclose(run_op_numpy(sub_rows, [a, r]), a - r[:, None])
    add_cols = {"kernel": "map", "fn": "add", "eq": "ij,j->ij", "inputs": [_ref((3, 4)), _ref((4,))], "shape": [3, 4]}
    np.testing.assert_allclose(run_op_numpy(add_cols, [a, c]), a + c[None, :])
    # operand letters in another order than the output's
    t = rng.standard_normal((4, 3))
    mul = {"kernel": "map", "fn": "mul", "eq": "ij,ji->ij", "inputs": [_ref((3, 4)), _ref((4, 3))], "shape": [3, 4]}
    np.testing.assert_allclose(run_op_numpy(mul, [a, t]), a * t.T)
    assert flops_of(mul) == 12 * MAP_FLOPS["mul"]


def test_map_functions():
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))

    def run(fn, ops, eq, params=None):
        spec = {"kernel": "map", "fn": fn, "eq": eq, "inputs": [_ref(o.shape) for o in ops], "shape": [3, 4]}
        if params:
            spec["params"] = params
        return run_op_numpy(spec, ops)

    np.testing.assert_allclose(run("relu", [a], "ij->ij"), np.where(a > 0, a, 0))
    np.testing.assert_allclose(run("silu_mul", [a, b], "ij,ij->ij"), a / (1 + np.exp(-a)) * b)
    m = a.max(axis=1)
    np.testing.assert_allclose(run("exp_sub", [a, m], "ij,i->ij", {"scale": 0.5}), np.exp(0.5 * (a - m[:, None])))
    np.testing.assert_allclose(run("scale", [a], "ij->ij", {"c": 3.0}), 3 * a)
    ss, w = (a * a).sum(axis=1), rng.standard_normal(4)
    want = a / np.sqrt((a * a).mean(axis=1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(run("rms_scale", [a, ss, w], "ij,i,j->ij", {"n": 4, "eps": 1e-5}), want)


def test_rotary_matches_rotate_half():
    x = rng.standard_normal((5, 2, 6))  # (seq, heads, head_dim)
    ang = rng.standard_normal((5, 3))
    cos, sin = np.cos(np.tile(ang, 2)), np.sin(np.tile(ang, 2))
    spec = {"kernel": "map", "fn": "rotary", "eq": "shd,sd,sd->shd",
            "inputs": [_ref(x.shape), _ref(cos.shape), _ref(sin.shape)], "shape": [5, 2, 6]}  # fmt: skip
    got = run_op_numpy(spec, [x, cos, sin])
    # rotate pairs (i, i + 3) by the angle: a complex multiplication
    z = (x[..., :3] + 1j * x[..., 3:]) * np.exp(1j * ang)[:, None, :]
    np.testing.assert_allclose(got, np.concatenate([z.real, z.imag], axis=-1), atol=1e-12)


def test_causal_mask_map_and_fill_use_global_offsets():
    x = rng.standard_normal((2, 3, 4))  # (h, q-tile, k-tile) at rows 3..5, cols 2..5
    spec = {"kernel": "map", "fn": "causal_mask", "eq": "hqk->hqk", "inputs": [_ref(x.shape)], "shape": [2, 3, 4],
            "params": {"row_axis": 1, "col_axis": 2, "row_offset": 3, "col_offset": 2}}  # fmt: skip
    got = run_op_numpy(spec, [x])
    rows, cols = np.arange(3, 6)[:, None], np.arange(2, 6)[None, :]
    np.testing.assert_array_equal(got, np.where((cols > rows)[None], -np.inf, x))
    fill = {"kernel": "fill", "fn": "causal_mask", "inputs": [], "shape": [3, 4],
            "params": {"row_offset": 3, "col_offset": 2}}  # fmt: skip
    np.testing.assert_array_equal(run_op_numpy(fill, [], dtype=np.float64), np.where(cols > rows, -np.inf, 0.0))
    assert flops_of(fill) == 12


def test_select():
    x = rng.standard_normal((4, 6))
    spec = {"kernel": "select", "inputs": [_ref(x.shape)], "shape": [1, 6], "params": {"slice": [[3, 4], [0, 6]]}}
    np.testing.assert_array_equal(run_op_numpy(spec, [x]), x[3:4])
    assert flops_of(spec) == 0


@pytest.mark.parametrize(
    "spec, match",
    [
        ({"kernel": "os.system", "inputs": [], "shape": []}, "unknown kernel 'os.system'"),
        ({"kernel": "map", "fn": "eval", "eq": "i->i", "inputs": [], "shape": [2]}, "unknown map fn 'eval'"),
        ({"kernel": "fill", "fn": "__import__", "inputs": [], "shape": [2]}, "unknown fill fn"),
    ],
)
def test_unknown_names_are_errors_naming_the_op(spec, match):
    with pytest.raises(ValueError, match=match) as e:
        run_op_numpy(spec, [], label="7 ('bad')")
    assert "op 7" in str(e.value)
    with pytest.raises(ValueError, match="op 7"):
        flops_of(spec, label=7)


def test_shape_mismatch_is_an_error():
    spec = {"kernel": "einsum", "eq": "ik,kj->ij", "inputs": [_ref((2, 3)), _ref((3, 2))], "shape": [3, 3]}
    with pytest.raises(ValueError, match="shape"):
        run_op_numpy(spec, [np.ones((2, 3)), np.ones((3, 2))])


def _two_op_graph(specs):
    return from_edges([1.0, 1.0], [(0, 1)], specs=specs, names=["mm", "relu"])


def test_evaluate_numpy_slices_inputs_and_follows_edges():
    A = rng.standard_normal((4, 4))
    specs = [
        {"kernel": "einsum", "eq": "ik,kj->ij", "shape": [2, 4],
         "inputs": [{"input": "A", "slice": [[2, 4], [0, 4]], "shape": [2, 4]},
                    {"input": "A", "slice": [[0, 4], [0, 4]], "shape": [4, 4]}]},
        {"kernel": "map", "fn": "relu", "eq": "ij->ij", "inputs": [{"op": 0, "shape": [2, 4]}], "shape": [2, 4]},
    ]  # fmt: skip
    vals = evaluate_numpy(_two_op_graph(specs), {"A": A})
    np.testing.assert_allclose(vals[1], np.maximum(A[2:] @ A, 0))
    with pytest.raises(ValueError, match="input tensor 'A' was not provided"):
        evaluate_numpy(_two_op_graph(specs), {})
    with pytest.raises(ValueError, match="no op specs"):
        evaluate_numpy(from_edges([1.0], []), {})


def _imported(name: str):
    """A graph imported from examples/ (fused maps, xforms, assemble and embedding ops)."""
    from pathlib import Path

    from doppler.importer import import_model

    examples = Path(__file__).resolve().parents[2] / "examples"
    if name == "import:gpt2":
        pytest.importorskip("transformers")
        return import_model(f"{examples / 'hf_models.py'}:gpt2", blocks={128: 2, 384: 3, 512: 2}, dtype="float64")
    return import_model(f"{examples / 'models.py'}:llama_block", blocks={256: 2, 64: 2}, dtype="float64")


@pytest.mark.parametrize("name", ["chainmm", "ffnn", "llama_block", "llama_layer", "llama_model", "llama_model:decode",
                                  "calibration", "import:llama_block", "import:gpt2"])  # fmt: skip
def test_torch_kernels_equal_numpy_on_every_op(name):
    """The CUDA engine's kernels are the same code on torch tensors: every op of every workload agrees."""
    torch = pytest.importorskip("torch")
    from doppler import workloads
    from doppler.workloads import references
    from doppler.engine.calibrate import calibration_graph
    from doppler.ir.kernels import TorchOps, evaluate_numpy, run_op_torch

    if name.startswith("import:"):
        g = _imported(name)
    else:
        phase = {"phase": "decode", "context": 6, "context_blocks": 2} if name.endswith(":decode") else {"seq_blocks": 2}
        g = (calibration_graph((8, 16)) if name == "calibration"
             else workloads.build("llama_model", size="tiny", **phase) if name.startswith("llama_model")
             else workloads.build(name, size="tiny"))  # fmt: skip
    x = references.make_inputs(g, seed=0, dtype=np.float64)
    values = evaluate_numpy(g, x)
    ops = TorchOps("cpu")
    kinds = set()
    for v in range(g.num_ops):
        spec = g.specs[v]
        operands = []
        for ref in spec.get("inputs", []):
            if "op" in ref:
                operands.append(torch.from_numpy(values[ref["op"]]))
            else:
                arr = x[ref["input"]]
                if "slice" in ref:
                    arr = arr[tuple(slice(lo, hi) for lo, hi in ref["slice"])]
                operands.append(torch.from_numpy(np.ascontiguousarray(arr)))
        got = run_op_torch(spec, operands, label=v, dtype=np.float64, ops=ops)
        assert torch.is_tensor(got) and got.dtype == torch.float64
        np.testing.assert_allclose(got.numpy(), values[v], rtol=1e-12, atol=1e-12, err_msg=f"op {v} {spec['kernel']}")
        kinds.add(spec["kernel"] + ":" + str(spec.get("fn", "")))
    if name == "calibration":
        assert {"einsum:", "map:relu", "map:rotary", "fill:causal_mask", "select:", "reduce_sum:"} <= kinds
    if name == "import:gpt2":
        assert {"embedding:", "map:fused", "einsum:", "sum_n:"} <= kinds


def test_torch_kernel_errors_name_the_op():
    pytest.importorskip("torch")
    from doppler.ir.kernels import run_op_torch

    with pytest.raises(ValueError, match=r"op 3: unknown map fn 'nope'"):
        run_op_torch({"kernel": "map", "fn": "nope", "eq": "i->i", "inputs": []}, [], label=3)


def test_operand_xform_steps_are_applied_in_order():
    x = rng.standard_normal((4, 6))
    ref = {"op": 0, "shape": [4, 6], "xform": [["perm", [1, 0]], ["view", [2, 3, 4]], ["slice", [[0, 2], [1, 3], [0, 4]]]]}
    spec = {"kernel": "map", "fn": "neg", "eq": "abc->abc", "inputs": [ref], "shape": [2, 2, 4]}
    np.testing.assert_array_equal(run_op_numpy(spec, [x]), -x.T.reshape(2, 3, 4)[:, 1:3])
    assert flops_of(spec) == 16
    bad = {**spec, "inputs": [{**ref, "xform": [["roll", [1]]]}]}
    with pytest.raises(ValueError, match="unknown xform step 'roll'"):
        run_op_numpy(bad, [x])


def test_assemble_places_pieces_and_embedding_picks_rows():
    a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 2))
    spec = {"kernel": "assemble", "inputs": [_ref((2, 3), op=0), _ref((2, 2), op=1)], "shape": [2, 5],
            "params": {"at": [[[0, 2], [0, 3]], [[0, 2], [3, 5]]]}}  # fmt: skip
    np.testing.assert_array_equal(run_op_numpy(spec, [a, b]), np.concatenate([a, b], axis=1))
    assert flops_of(spec) == 0
    table, idx = rng.standard_normal((10, 4)), np.array([[3.0, 0.0, 9.0]])
    spec = {"kernel": "embedding", "inputs": [_ref((10, 4)), _ref((1, 3), "i")], "shape": [1, 3, 4]}
    np.testing.assert_array_equal(run_op_numpy(spec, [table, idx]), table[[[3, 0, 9]]])


def test_fused_map_runs_its_steps_and_counts_their_flops():
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    steps = [["mul", [0, 0], {}], ["add_scalar", [2], {"c": 1.0}], ["rsqrt", [3], {}], ["mul", [4, 1], {}]]
    spec = {"kernel": "map", "fn": "fused", "eq": "ij,j->ij", "inputs": [_ref((3, 4)), _ref((4,), "w")],
            "shape": [3, 4], "params": {"steps": steps}}  # fmt: skip
    np.testing.assert_allclose(run_op_numpy(spec, [x, w]), 1 / np.sqrt(x * x + 1) * w)
    assert flops_of(spec) == 12 * (1 + 1 + 2 + 1)
    for bad, match in (([["fused", [0], {}]], "unknown map fn"), ([["mul", [0, 5], {}]], "arguments"), ([], "at least one")):
        with pytest.raises(ValueError, match=match):
            run_op_numpy({**spec, "params": {"steps": bad}}, [x, w])


def _attention_reference(q, k, v, causal, q_offset):
    s = np.einsum("bqjrd,bkjd->bjrqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        rows = q_offset + np.arange(q.shape[1])[:, None]
        s = np.where(np.arange(k.shape[1])[None, :] <= rows, s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bjrqk,bkjd->bqjrd", e / e.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("causal, q_offset, tiles", [(False, 0, 1), (False, 0, 3), (True, 0, 1), (True, 4, 3)])
def test_fused_attention_is_softmax_attention_and_counts_the_pairs_it_attends(causal, q_offset, tiles):
    """The ``attention`` kernel: key/value tiles joined in order, causal from the query's absolute position;
    FLOPs ``(4 d + 4)`` per (query head, attended pair) plus a division per output element."""
    b, n_q, j, r, d, n_k = 2, 4, 2, 3, 8, 4 + q_offset
    q = rng.standard_normal((b, n_q, j, r, d))
    k, v = rng.standard_normal((b, n_k, j, d)), rng.standard_normal((b, n_k, j, d))
    cut = np.linspace(0, n_k, tiles + 1).astype(int)
    ks = [k[:, lo:hi] for lo, hi in zip(cut, cut[1:])]
    vs = [v[:, lo:hi] for lo, hi in zip(cut, cut[1:])]
    spec = {"kernel": "attention", "inputs": [_ref(a.shape) for a in [q, *ks, *vs]], "shape": list(q.shape),
            "params": {"kv_tiles": tiles, "causal": causal, "q_offset": q_offset, "scale": 1 / np.sqrt(d)}}
    got = run_op_numpy(spec, [q, *ks, *vs])
    np.testing.assert_allclose(got, _attention_reference(q, k, v, causal, q_offset), rtol=1e-12, atol=1e-12)
    pairs = sum(q_offset + t + 1 for t in range(n_q)) if causal else n_q * n_k
    assert flops_of(spec) == b * j * r * (pairs * (4 * d + 4) + n_q * d)
    with pytest.raises(ValueError, match=r"op 5: attention with kv_tiles=2 takes 5 operands"):
        run_op_numpy({**spec, "params": {**spec["params"], "kv_tiles": 2}}, [q, k, v], label=5)


@pytest.mark.parametrize("fn, params, want", [
    ("where", {}, lambda c, x, y: np.where(c != 0, x, y)),
    ("where_scalar", {"c": "-inf"}, lambda c, x: np.where(c != 0, x, -np.inf)),
    ("rwhere_scalar", {"c": -3.0}, lambda c, x: np.where(c != 0, -3.0, x)),
    ("maximum", {}, np.maximum),
    ("minimum", {}, np.minimum),
    ("max_scalar", {"c": 0.2}, lambda x: np.maximum(x, 0.2)),
    ("min_scalar", {"c": 0.2}, lambda x: np.minimum(x, 0.2)),
    ("gt_scalar", {"c": 0.1}, lambda x: (x > 0.1).astype(x.dtype)),
    ("lt_scalar", {"c": 0.1}, lambda x: (x < 0.1).astype(x.dtype)),
    ("softplus", {"beta": 2.0, "threshold": 1.0}, lambda x: np.where(2 * x > 1, x, np.log1p(np.exp(2 * x)) / 2)),
    ("expm1", {}, np.expm1),
])  # fmt: skip
def test_selection_and_activation_maps_in_numpy_and_torch(fn: str, params: dict, want) -> None:
    """The map functions imported models' masking, clamping and activations use: numpy's and torch's kernels
    agree with the formula, in the operands' element type."""
    n = MAP_ARITY[fn]
    ops = [rng.standard_normal((3, 4)).astype(np.float32) for _ in range(n)]
    if fn.startswith(("where", "rwhere")):
        ops[0] = (ops[0] > 0).astype(np.float32)  # a condition: 1 and 0
    spec = {"kernel": "map", "fn": fn, "eq": ",".join(["ij"] * n) + "->ij", "inputs": [_ref((3, 4))] * n,
            "shape": [3, 4], "params": params}  # fmt: skip
    got = run_op_numpy(spec, ops)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want(*ops), rtol=1e-6)
    torch = pytest.importorskip("torch")
    from doppler.ir.kernels import run_op_torch

    got_t = run_op_torch(spec, [torch.from_numpy(o) for o in ops])
    assert got_t.dtype == torch.float32
    np.testing.assert_allclose(got_t.numpy(), want(*ops), rtol=1e-6)
