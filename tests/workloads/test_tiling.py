"""The tiling machinery: TileBuilder's checks (the workloads built with it: test_workloads.py)."""

from __future__ import annotations

import pytest

from doppler.workloads.tiling import TileBuilder, WorkloadError


def test_tile_builder_checks_shapes_and_letters():
    b = TileBuilder("custom")
    with pytest.raises(WorkloadError, match=r"custom: tensor 'A' axis 1: 3 blocks do not divide size 8"):
        b.input("A", (4, 8), (2, 3))
    A = b.input("A", (4, 8), (2, 2))
    B = b.input("B", (8, 6), (4, 1))
    with pytest.raises(WorkloadError, match=r"mm: letter 'k' is size 8 in 2 blocks in 'A' but size 8 in 4 blocks in 'B'"):
        b.contract("ik,kj->ij", A, B, name="mm")
    C = b.input("C", (8, 6), (2, 3))
    out = b.contract("ik,kj->ij", A, C, name="mm2")
    assert out.grid == (2, 3) and out.shape == (4, 6)
    assert len(b.flops) == 2 * 3 * 2 + 2 * 3  # partials + aggregations
    with pytest.raises(WorkloadError, match="two logical ops are named 'mm2'"):
        b.contract("ik,kj->ij", A, C, name="mm2")
    with pytest.raises(WorkloadError, match="must lie inside one block"):
        b.select(out, [(1, 3), None], name="bad_select")


def test_fold_sums_or_maxes_tensors_block_by_block():
    import numpy as np

    from doppler.ir.kernels import evaluate_numpy

    b = TileBuilder("custom", "float64")
    x, y = b.input("x", (4, 6), (2, 3)), b.input("y", (4, 6), (2, 3))
    with pytest.raises(WorkloadError, match="fold needs two or more tensors of one shape and grid"):
        b.fold("sum", x, b.input("z", (4, 6), (1, 3)), name="bad")
    with pytest.raises(WorkloadError, match="fold how='min' must be 'sum' or 'max'"):
        b.fold("min", x, y, name="bad_how")
    s, m = b.fold("sum", x, y, name="s"), b.fold("max", x, y, name="m")
    b.output("s", s)
    b.output("m", m)
    g = b.finish("custom", {})
    assert g.num_ops == 12 and g.flops.sum() == g.meta["untiled_flops"] == 2 * 24
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((4, 6)), "y": rng.standard_normal((4, 6))}
    vals = evaluate_numpy(g, inputs)
    from doppler.workloads.references import assemble_outputs

    out = assemble_outputs(g, vals)
    np.testing.assert_allclose(out["s"], inputs["x"] + inputs["y"])
    np.testing.assert_allclose(out["m"], np.maximum(inputs["x"], inputs["y"]))


def _modules_graph(modules: list[tuple[str, str]]):
    """A graph of one op per (module, kind) group, in order, each reading the one before."""
    from doppler.ir.graph import DataflowGraph, Group, TileLayout

    groups = [Group(name=f"g{i}", kind=kind, grid=(1,), module=m) for i, (m, kind) in enumerate(modules)]
    n = len(groups)
    return DataflowGraph.from_arrays([1.0] * n, [1.0] * n, list(range(n - 1)), list(range(1, n)), name="mods",
                                     tiles=TileLayout(list(range(n)), [[0] + [-1] * 3] * n, groups))  # fmt: skip


def test_a_structure_is_derived_from_module_paths_by_position_and_projection_names():
    from doppler.workloads.tiling import derive_structure, layer_key

    assert layer_key("model.layers.3.mlp.down_proj") == "model.layers.3" and layer_key("lm_head") == "lm_head"
    mods = [("transformer.wte", "select"), ("blocks.0.attn.q_proj", "matmul"), ("blocks.0.attn.o_proj", "matmul"),
            ("blocks.0.mlp.up_proj", "matmul"), ("blocks.0.mlp.down_proj", "matmul"), ("blocks.0", "add"),
            ("blocks.1.attn.q_proj", "matmul"), ("blocks.1.ff.w1", "matmul"), ("blocks.1", "add"),
            ("ln_f", "norm"), ("out", "matmul"), ("out", "add"), ("", "elementwise")]  # fmt: skip
    s = derive_structure(_modules_graph(mods).groups)
    assert s.embedding == (0,) and s.layers == ((1, 2, 3, 4, 5), (6, 7, 8)) and s.final_norm == (9,)
    assert s.lm_head == (10, 11)  # the unit of the last matrix product after the layers, whatever its name
    assert s.column_parallel == {"head": (1, 6), "hidden": (3,), "vocab": (10,)}
    assert s.row_parallel == {"head": (2,), "hidden": (4,)}  # ff.w1: no known name, not split
    assert derive_structure(_modules_graph([("encoder", "matmul"), ("head", "matmul")]).groups) is None


def test_a_recorded_structure_is_read_back_and_a_malformed_one_refused():
    from doppler.ir.graph import GraphError
    from doppler.workloads.tiling import model_structure
    from doppler.workloads import build

    g = build("llama_model", size="tiny")
    s = model_structure(g)
    assert s.to_json() == g.meta["structure"]
    doc = g.meta.pop("structure")
    assert model_structure(g) == s  # a graph saved before structures were recorded: derived from its modules
    for bad, key in ((["x"], "meta.structure: must be an object"),
                     ({**doc, "layers": [[0, 9999]]}, r"meta.structure.layers\[0\]: must be a list of group ids"),
                     ({**doc, "row_parallel": {"heads": [1]}}, "meta.structure.row_parallel: must map head"),
                     ({**doc, "embedding": "0"}, "meta.structure.embedding")):  # fmt: skip
        g.meta["structure"] = bad
        with pytest.raises(GraphError, match=key):
            model_structure(g)
    assert model_structure(build("chainmm", size="tiny")) is None


def test_fused_attention_reads_the_key_blocks_at_or_before_its_query_block_and_refuses_mismatched_operands():
    b = TileBuilder("t")
    q = b.input("q", (1, 8, 2, 2, 4), (1, 4, 2, 1, 1))
    k, v = b.input("k", (1, 8, 2, 4), (1, 4, 2, 1)), b.input("v", (1, 8, 2, 4), (1, 4, 2, 1))
    out = b.attention(q, [(k, v)], name="attn", scale=0.5, causal=True)
    assert out.shape == q.shape and out.grid == q.grid and len(b.specs) == 4 * 2
    for spec in b.specs:
        params, refs = spec["params"], spec["inputs"]
        first = refs[0]["block"][1]  # the query block
        assert params["q_offset"] == 2 * first and params["kv_tiles"] == first + 1
        assert [r["block"][1] for r in refs[1:]] == list(range(first + 1)) * 2  # keys then values, in order
    assert sum(b.flops) == pytest.approx(b.untiled_flops)
    with pytest.raises(WorkloadError, match=r"t: bad: key 'k2' and value 'v' must be"):
        b.attention(q, [(b.input("k2", (1, 8, 1, 4), (1, 4, 1, 1)), v)], name="bad", scale=1.0, causal=False)
    with pytest.raises(WorkloadError, match=r"t: bad2: a causal attention's keys must be the queries' positions"):
        kc = b.input("kc", (1, 4, 2, 4), (1, 2, 2, 1))
        b.attention(q, [(kc, b.input("vc", (1, 4, 2, 4), (1, 2, 2, 1)))], name="bad2", scale=1.0, causal=True)
