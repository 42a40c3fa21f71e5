"""`doppler graph import`: imported models compute what the module computes, with the FLOPs it has."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from doppler import workloads
from doppler.engine import RunOptions, build_program, run
from doppler.ir.graph import DataflowGraph, OpKind
from doppler.importer import (
    GraphImportError,
    export_model,
    import_model,
    lower_program,
    model_inputs,
    parameter_dtype,
)
from doppler.ir.kernels import evaluate_numpy
from doppler.workloads.references import assemble_outputs

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import hf_models  # noqa: E402
import models  # noqa: E402


class _Logits(nn.Module):
    """A Hugging Face causal LM as a module that maps token ids to logits."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).logits


def _hf(name: str):
    pytest.importorskip("transformers")
    model, example = getattr(hf_models, name)()
    return _Logits(model), example


def _case(name: str):
    return _hf(name) if name in ("llama", "gpt2") else getattr(models, name)()


def _imported(name: str, blocks: dict[int, int], dtype: str = "float64"):
    module, example = _case(name)
    ep, example = export_model(module, example)
    return module, example, lower_program(ep, blocks=blocks, dtype=dtype, name=name)


def _forward(module: nn.Module, example, dtype) -> np.ndarray:
    module = module.to(dtype)
    with torch.no_grad():
        return module(*[x.to(dtype) if x.dtype.is_floating_point else x for x in example]).numpy()


TILINGS = {  # a tiling per model that splits weights, heads and (where it divides) the sequence
    "mlp": {256: 2, 1024: 4, 64: 2},
    "llama_block": {256: 4, 688: 2, 64: 2},
    "llama": {128: 2, 344: 2, 512: 2},
    "gpt2": {128: 2, 384: 3, 512: 2},
}


@pytest.mark.parametrize("name", ["mlp", "llama_block", "llama", "gpt2"])
@pytest.mark.parametrize("tiled", [False, True])
def test_imported_graph_equals_the_module_float64(name: str, tiled: bool) -> None:
    module, example, g = _imported(name, TILINGS[name] if tiled else {})
    ref = _forward(module, example, torch.float64)
    got = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, module, example)))
    (out,) = got.values()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-7 * np.abs(ref).max())
    if tiled:
        assert g.num_ops > len(set(g.group.tolist())) / 2  # really tiled: groups hold several ops


@pytest.mark.parametrize("name", ["mlp", "llama_block", "gpt2"])
def test_imported_graph_runs_on_the_local_engine_under_three_assignments(name: str) -> None:
    """float32 on the engine, float64 reference: the engine's kernels, transfers and xforms are right."""
    module, example, g = _imported(name, TILINGS[name], dtype="float32")
    ref = _forward(module, example, torch.float64)
    prog = build_program(g, inputs=model_inputs(g, module, example), dtype=np.float32)
    rng = np.random.default_rng(0)
    for dev in (np.zeros(g.num_ops, np.int64), np.arange(g.num_ops) % 3, rng.integers(0, 3, g.num_ops)):
        res = run(g, dev, num_devices=3, program=prog, options=RunOptions(timeout_s=120))
        (out,) = res.outputs.values()
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["mlp", "llama_block", "llama", "gpt2"])
def test_matmul_flops_equal_flop_counter(name: str) -> None:
    """The bar: matrix-product FLOPs within 1% of FlopCounterMode (sdpa counted through its math path,
    since the CPU flash kernel is not counted by FlopCounterMode)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    module, example, g = _imported(name, TILINGS[name])
    with FlopCounterMode(display=False) as fc, sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        module(*example)
    ours = float(g.flops[g.kind == int(OpKind.MATMUL)].sum())
    assert ours == pytest.approx(fc.get_total_flops(), rel=0.01)


def test_against_our_llama_block_builder() -> None:
    """The bar: same shapes and tiling as `llama_block`, op count and FLOPs within 5%, and exactly
    the same matrix products (RMSNorm's and rotary's several torch ops are fused into one op each,
    as our builder writes them)."""
    p = dict(seq_len=64, dim=256, n_heads=4, head_dim=64, hidden=688)
    module, example = models.llama_block(dim=256, n_heads=4, hidden=688, seq_len=64)
    ep, _ = export_model(module, example)
    g = lower_program(ep, blocks={256: 4, 688: 4})
    ref = workloads.build("llama_block", **p, dim_blocks=4, head_blocks=4, hidden_blocks=4)
    assert g.flops.sum() == pytest.approx(ref.flops.sum(), rel=5e-3)  # elementwise FLOP conventions differ
    assert g.num_ops == pytest.approx(ref.num_ops, rel=0.05)
    mm = int(OpKind.MATMUL)
    assert (g.kind == mm).sum() == (ref.kind == mm).sum()
    assert g.flops[g.kind == mm].sum() == pytest.approx(ref.flops[ref.kind == mm].sum(), rel=1e-9)


def test_views_fold_into_consumers_and_elementwise_chains_fuse() -> None:
    """Transposes, reshapes, the rotary slices and cat emit no ops; RMSNorm is a sum of squares and
    one fused op; rotary (x * cos + rotate_half(x) * sin) is one fused op."""
    _, _, g = _imported("llama_block", {})
    names = [g.groups[k].name for k in g.group]
    assert not any(n.startswith(("view", "transpose", "reshape", "slice", "cat", "neg")) for n in names)
    assert any("xform" in ref for spec in g.specs for ref in spec["inputs"])
    fused = [spec["params"]["steps"] for spec in g.specs if spec.get("fn") == "fused"]
    assert sum(any(st[0] == "rotate_half" for st in steps) for steps in fused) == 2  # q and k
    assert sum(any(st[0] == "rsqrt" for st in steps) for steps in fused) == 2  # the two RMSNorms
    assert (g.kind == int(OpKind.NORM)).sum() == 4  # per norm: sum of squares + the fused scale


def test_a_tiled_rotary_axis_is_untiled_for_rotate_half() -> None:
    """head_dim 64 tiled in 2 (64=2) must not rotate within half-tiles."""
    module, example, g = _imported("llama_block", {64: 2, 256: 4})
    ref = _forward(module, example, torch.float64)
    (out,) = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, module, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-9)


class _Sorts(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=-1).values + torch.cumsum(x, -1) + torch.cumsum(x, 0)


def test_unsupported_ops_are_all_listed(tmp_path: Path) -> None:
    ep, _ = export_model(_Sorts(), (torch.randn(4, 8),))
    with pytest.raises(GraphImportError, match=r"unsupported ops, nothing imported: aten\.cumsum\.default \(2x\), "
                                               r"aten\.sort\.default \(1x\)"):  # fmt: skip
        lower_program(ep)


# ============================================================================ whole models (#53)
GQA_TILING = {128: 2, 32: 2, 344: 2, 512: 2}  # dim, key/value width (2 heads x 16) and sequence, hidden, vocab


def _gqa(meta: bool = False):
    """A 2-layer LlamaForCausalLM with 8 query heads over 2 key/value heads and its default use_cache."""
    pytest.importorskip("transformers")
    return hf_models.gqa_llama(meta=meta)


def _mistral():
    """A 2-layer MistralForCausalLM (4 query heads over 2 key/value heads, a sliding window longer than the
    sequence), as built from its config: use_cache left at its default."""
    pytest.importorskip("transformers")
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=64, sliding_window=32)  # fmt: skip
    return MistralForCausalLM(cfg).eval(), (torch.randint(0, 96, (1, 16)),)


def _logits_f64(model: nn.Module, example) -> np.ndarray:
    with torch.no_grad():
        return model.double()(*example, use_cache=False).logits.numpy()


@pytest.mark.parametrize("case", ["llama", "mistral"])
@pytest.mark.parametrize("tiled", [False, True])
def test_grouped_query_attention_equals_the_module(case: str, tiled: bool) -> None:
    """A stock *ForCausalLM with fewer key/value heads than query heads and its cache on imports as it
    is; keys and values are read per group (repeat_kv's copies are never made)."""
    model, example = _gqa() if case == "llama" else _mistral()
    ep, example = export_model(model, example)
    blocks = (GQA_TILING if case == "llama" else {64: 2, 32: 2, 96: 2, 16: 2}) if tiled else {}
    g = lower_program(ep, blocks=blocks, dtype="float64")
    ref = _logits_f64(model, example)
    (out,) = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, model, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())  # rotary tables in float32
    assert not any(grp.name.endswith(".expand") for grp in g.groups)
    assert sum(grp.kind == "mask_fill" for grp in g.groups) == 2  # the folded mask is causal: one per layer


class _EnableGqa(nn.Module):
    """Attention over 2 key/value heads for 4 query heads through SDPA's own enable_gqa, causal and masked."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.kv = nn.Linear(32, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).view(1, 8, 4, 8).transpose(1, 2)
        k = self.kv(x).view(1, 8, 2, 8).transpose(1, 2)
        upper = torch.ones(8, 8, dtype=torch.bool).triu()
        a = nn.functional.scaled_dot_product_attention(q, k, 2 * k, is_causal=True, enable_gqa=True)
        return a + nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=upper, enable_gqa=True)


@pytest.mark.parametrize("blocks", [{}, {32: 2, 16: 2}])
def test_sdpa_enable_gqa_equals_the_module(blocks: dict[int, int]) -> None:
    module, example = _EnableGqa().eval(), (torch.randn(1, 8, 32),)
    ep, example = export_model(module, example)
    g = lower_program(ep, blocks=blocks, dtype="float64")
    ref = _forward(module, example, torch.float64)
    (out,) = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, module, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)


class _StackAndT(nn.Module):
    """torch.stack (at a middle and the last axis) and Tensor.T, as GPT-J's and Falcon's forwards use them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.stack([self.a(x), self.b(x)], dim=1)  # (4, 2, 16)
        z = torch.stack([x, 2 * x], dim=-1).sum(-1)  # (4, 16)
        return y.sum(1) @ z.T


@pytest.mark.parametrize("blocks", [{}, {16: 2, 4: 2}])
def test_stack_and_numpy_t_equal_the_module(blocks: dict[int, int]) -> None:
    module, example = _StackAndT().eval(), (torch.randn(4, 16),)
    ep, example = export_model(module, example)
    g = lower_program(ep, blocks=blocks, dtype="float64")
    ref = _forward(module, example, torch.float64)
    (out,) = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, module, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)


def test_repeat_kv_read_by_matrix_products_is_copied() -> None:
    """Eager attention multiplies repeat_kv's output with matmul: the repeat is then copied, and correct."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, attn_implementation="eager")  # fmt: skip
    model, example = LlamaForCausalLM(cfg).eval(), (torch.randint(0, 64, (1, 8)),)
    ep, example = export_model(model, example)
    g = lower_program(ep, blocks={32: 2, 16: 2}, dtype="float64")
    ref = _logits_f64(model, example)
    (out,) = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, model, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


def test_imported_ops_record_their_modules() -> None:
    """Every op records the module it runs in, named as named_modules() names it."""
    g = import_model(f"{EXAMPLES / 'hf_models.py'}:gqa_llama", blocks=GQA_TILING)
    labels, index = g.op_modules()
    module = [labels[k] if k >= 0 else "" for k in index]
    reads_q = [v for v, spec in enumerate(g.specs)
               if any(r.get("input") == "model.layers.1.self_attn.q_proj.weight" for r in spec["inputs"])]  # fmt: skip
    assert len(reads_q) == 2 * 2 * 2  # output blocks (2 of the 128 columns) x contraction blocks, tokens in 2
    q_proj = [v for v in range(g.num_ops) if module[v] == "model.layers.1.self_attn.q_proj"]
    assert set(reads_q) <= set(q_proj) and {g.kind[v] for v in q_proj} == {int(OpKind.MATMUL), int(OpKind.ADD)}
    assert {m.split(".")[2] for m in module if m.startswith("model.layers.")} == {"0", "1"}
    assert {"model.embed_tokens", "model.layers.0.self_attn", "model.layers.1.mlp.down_proj", "model.norm",
            "lm_head"} <= set(module)  # fmt: skip
    assert g.meta["dtype"] == "float32" and "model.layers.0.self_attn.k_proj.weight" in g.meta["inputs"]


def test_an_imported_llama_records_its_layer_structure() -> None:
    """An imported Hugging Face LLaMA has the layer structure a built llama_model has (graph.meta["structure"])."""
    g = import_model(f"{EXAMPLES / 'hf_models.py'}:gqa_llama", blocks=GQA_TILING)
    s = g.meta["structure"]
    mods = lambda ks: {g.groups[k].module for k in ks}  # noqa: E731
    assert len(s["layers"]) == 2 and mods(s["embedding"]) == {"model.embed_tokens"}
    assert mods(s["final_norm"]) == {"model.norm"} and mods(s["lm_head"]) == {"lm_head"}
    assert {m.rsplit(".", 1)[1] for m in mods(s["column_parallel"]["head"])} == {"q_proj", "k_proj", "v_proj"}
    assert {m.rsplit(".", 1)[1] for m in mods(s["row_parallel"]["hidden"])} == {"down_proj"}
    assert all(g.groups[k].kind == "matmul" for ks in s["column_parallel"].values() for k in ks)


@pytest.mark.parametrize("path, want", [
    ("model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.q_proj"),
    ("L['self'].model.layers[3].self_attn", "model.layers.3.self_attn"),
    ("getattr(L['self'].model.layers, '3').mlp", "model.layers.3.mlp"),
    ("L__self__.lm_head", "lm_head"),
    ("_doppler_wrapped.model.norm", "model.norm"),
    ("_doppler_wrapped", ""),
    ("", ""),
])  # fmt: skip
def test_module_paths_are_normalized(path: str, want: str) -> None:
    from types import SimpleNamespace

    from doppler.importer import module_path

    node = SimpleNamespace(meta={"nn_module_stack": {"k0": ("", "Root"), "k1": (path, "torch.nn.Module")}})
    assert module_path(node) == want
    assert module_path(SimpleNamespace(meta={})) == ""


def test_a_model_on_the_meta_device_imports_cost_only() -> None:
    """The same ops, FLOPs, bytes, modules and inputs as with real weights, and no value recorded: rotary
    tables are inputs of known shape; the causal mask, computed from shapes alone, is still recognised."""
    from doppler.workloads.references import make_inputs
    from doppler.workloads.tiling import WorkloadError

    model, example = _gqa(meta=True)
    assert all(p.is_meta for p in model.parameters())
    meta = lower_program(export_model(model, example)[0], blocks=GQA_TILING)
    real = lower_program(export_model(*_gqa())[0], blocks=GQA_TILING)
    assert "meta device" in meta.meta["cost_only"] and "cost_only" not in real.meta
    assert meta.num_ops == real.num_ops and meta.num_edges == real.num_edges
    assert meta.flops.sum() == real.flops.sum() and np.array_equal(meta.output_bytes, real.output_bytes)
    assert np.array_equal(meta.kind, real.kind) and meta.op_modules()[0] == real.op_modules()[0]
    assert meta.meta["inputs"] == real.meta["inputs"]
    consts = [k for k in meta.meta["inputs"] if k.startswith("const.")]
    assert len(consts) == 4 and all(meta.meta["input_init"][k] == {"init": "meta"} for k in consts)
    assert not any("data" in how or "std" in how for how in meta.meta["input_init"].values())
    with pytest.raises(WorkloadError, match="built on the meta device"):
        make_inputs(meta)


def test_real_size_factories_allocate_no_weight() -> None:
    pytest.importorskip("transformers")
    for name, kv_heads in (("llama2_7b", 32), ("mistral_7b", 8), ("llama3_8b", 8)):
        model, (ids,) = getattr(hf_models, name)(seq_len=64, layers=1)
        assert all(p.is_meta and p.dtype == torch.float16 for p in model.parameters()) and ids.is_meta
        assert model.config.num_key_value_heads == kv_heads and model.config.hidden_size == 4096
    model, example = hf_models.llama3_8b(seq_len=256, layers=2)
    ep, _ = export_model(model, example)
    g = lower_program(ep, dtype=parameter_dtype(ep))
    assert g.meta["cost_only"] and g.meta["dtype"] == "float16" and g.meta["inputs"]["input_ids"] == [1, 256]
    assert g.meta["inputs"]["lm_head.weight"] == [128256, 4096]
    assert {m.split(".")[2] for m in g.op_modules()[0] if m.startswith("model.layers.")} == {"0", "1"}


def test_a_cost_only_graph_is_placed_but_not_executed(tmp_path: Path) -> None:
    """simulate, assign, compare, train and graph info work on it; execute and validate refuse it in one
    line naming the file (exit 2)."""
    from typer.testing import CliRunner

    from doppler.cli import app
    from doppler.ir.formats import save_graph

    g, a = tmp_path / "meta.json", tmp_path / "a.json"
    model, example = _gqa(meta=True)
    save_graph(lower_program(export_model(model, example)[0], blocks=GQA_TILING), g)
    runner = CliRunner()

    def run(*args: object):
        return runner.invoke(app, [str(x) for x in args])

    # (train: every stage, distillation with two updates instead of the default's up to 1,000)
    for args in (("graph", "info", g), ("assign", g, "-c", "p100x4:2", "-m", "heft", "-o", a),
                 ("simulate", g, "-a", a, "-c", "p100x4:2"),
                 ("compare", g, "-c", "p100x4:2", "--methods", "critical_path,round_robin"),
                 ("train", g, "-c", "p100x4:2", "--episodes", "16", "--il-episodes", "8", "--batch", "8",
                  "--set", "distill_updates=2", "--threads", "1", "-o", tmp_path / "run")):  # fmt: skip
        res = run(*args)
        assert res.exit_code == 0, (args, res.output)
    assert "cost-only" in run("graph", "info", g).output and '"cost_only": true' in run("graph", "info", g, "--json").output
    for args in (("execute", g, "-a", a, "-c", "p100x4:2"), ("validate", g, "-c", "p100x4:2")):
        res = run(*args)
        assert res.exit_code == 2, res.output
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and f"{g}: built on the meta device (cost-only)" in lines[0], res.output


def test_hugging_face_rmsnorm_is_two_ops_despite_its_dtype_asserts() -> None:
    """torch.export's dtype asserts read the normalised tensor: they must not stop the fusion of the
    weight multiply into the norm (two ops per RMSNorm, as `llama_block` builds it)."""
    model, example = _gqa()
    g = lower_program(export_model(model, example)[0])
    weight = [v for v, spec in enumerate(g.specs)
              if any(r.get("input") == "model.layers.0.input_layernorm.weight" for r in spec["inputs"])]  # fmt: skip
    assert len(weight) == 1 and g.kind[weight[0]] == int(OpKind.NORM)
    assert (g.kind == int(OpKind.NORM)).sum() == 2 * (2 * 2 + 1)  # two norms per layer and the final one


def _family(name: str, device: str):
    """A 2-layer model of another family, built from its config on ``device``, and 16 token ids."""
    transformers = pytest.importorskip("transformers")
    small = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
    cfg, cls = {
        "qwen2": (transformers.Qwen2Config(**small, num_key_value_heads=2), transformers.Qwen2ForCausalLM),
        "gemma": (transformers.GemmaConfig(**small, num_key_value_heads=1, head_dim=16), transformers.GemmaForCausalLM),
        "phi3": (transformers.Phi3Config(**small, num_key_value_heads=2, pad_token_id=0), transformers.Phi3ForCausalLM),
    }[name]  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg).eval()
    ids = torch.randint(0, 128, (1, 16)) if device == "cpu" else torch.empty(1, 16, dtype=torch.long, device="meta")
    return model, (ids,)


@pytest.mark.parametrize("name", ["qwen2", "gemma", "phi3"])
def test_other_families_import_with_real_weights_and_on_the_meta_device(name: str) -> None:
    """Families the factories do not cover (GQA, multi-query attention, a scaled embedding, a fused
    gate/up projection split with chunk): the module's numbers with weights, the same costs without."""
    model, example = _family(name, "cpu")
    ep, example = export_model(model, example)
    real = lower_program(ep, dtype="float64")
    ref = _logits_f64(model, example)
    (out,) = assemble_outputs(real, evaluate_numpy(real, model_inputs(real, model, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())
    meta = lower_program(export_model(*_family(name, "meta"))[0], dtype="float64")
    assert meta.meta["cost_only"] and (meta.num_ops, meta.flops.sum()) == (real.num_ops, real.flops.sum())


def test_a_large_weights_mean_and_std_are_taken_a_chunk_at_a_time(monkeypatch) -> None:
    """A weight's recorded mean and std: of the whole tensor in float64 when small (as before), else a chunk at a
    time in two passes; a .pt2 at its 1 GiB bound once peaked at 2.4 GB making a float64 copy of each weight."""
    from doppler.importer import lowering

    torch.manual_seed(0)
    w = torch.randn(1000, 37) * 3 + 0.5
    whole = (float(w.double().mean()), float(w.double().std()))
    assert lowering.mean_std(w) == whole  # (small: exactly as one float64 copy makes them)
    monkeypatch.setattr(lowering, "STATS_CHUNK", 999)  # (not a divisor: the last chunk is short)
    calls: list[int] = []
    double = torch.Tensor.double
    monkeypatch.setattr(torch.Tensor, "double", lambda t: calls.append(t.numel()) or double(t))
    mean, std = lowering.mean_std(w.t())  # (a view: its elements in any order have the same statistics)
    assert mean == pytest.approx(whole[0], rel=1e-12) and std == pytest.approx(whole[1], rel=1e-12)
    assert calls and max(calls) <= 999  # (never the whole tensor in float64)
    assert lowering.mean_std(torch.ones(1)) == (1.0, 0.0)


# ============================================================================ the ops of stock causal LMs (#61)
def _equals_module_f64(module: nn.Module, example: tuple, blocks: dict[int, int]) -> DataflowGraph:
    ep, example = export_model(module.eval(), example)
    g = lower_program(ep, blocks=blocks, dtype="float64")
    ref = _forward(module, example, torch.float64)
    (out,) = assemble_outputs(g, evaluate_numpy(g, model_inputs(g, module, example))).values()
    np.testing.assert_allclose(out, ref, rtol=1e-9, atol=1e-12)
    return g


class _Interleaved(nn.Module):
    """GPT-J's and Cohere's interleaved rotary embedding: x[..., ::2] and x[..., 1::2] stacked and flattened;
    a strided slice that starts inside the axis."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.p(x)
        turned = torch.stack((-y[..., 1::2], y[..., ::2]), dim=-1).flatten(-2)
        return 2 * y + turned + y[:, 3:14:3].sum(-1, keepdim=True)


@pytest.mark.parametrize("blocks", [{}, {16: 2, 4: 2}])
def test_strided_slices_are_layout_steps(blocks: dict[int, int]) -> None:
    g = _equals_module_f64(_Interleaved(), (torch.randn(4, 16),), blocks)
    copies = [grp.name for grp in g.groups if grp.kind == "formation"]  # the stack; the strided slices read in place
    assert copies == (["stack", "slice_3.span.retile"] if blocks else ["stack"])  # (3:15 spans two tiles of 8)


class _Overhang(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (2 * x)[:, 0:16:5]


def test_a_strided_slice_whose_last_step_overhangs_is_refused() -> None:
    ep, _ = export_model(_Overhang(), (torch.randn(4, 16),))
    with pytest.raises(GraphImportError, match=r"slice_\w* \(aten\.slice\.Tensor\): a slice 0:16:5 of an axis of 16"):
        lower_program(ep)


class _PickHeads(nn.Module):
    """Falcon's multi-query attention: query heads sliced and the key and value heads picked by lists of
    positions, one key/value head broadcast over the query heads in sdpa, and ``y += x`` in place."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.o = nn.Linear(32, 48), nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.qkv(x).view(1, 8, 6, 8)
        q, k, v = h[:, :, :-2].transpose(1, 2), h[:, :, [-2]].transpose(1, 2), h[:, :, [-1]].transpose(1, 2)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = self.o(a.transpose(1, 2).reshape(1, 8, 32))
        y += x
        picked = self.qkv(x)[..., [0, 1, 5, 6, 7]]  # two runs of positions: cut and put together
        return y * picked.sum(-1, keepdim=True)


@pytest.mark.parametrize("blocks", [{}, {32: 2, 48: 2}])
def test_list_indices_multi_query_sdpa_and_in_place_adds_equal_the_module(blocks: dict[int, int]) -> None:
    _equals_module_f64(_PickHeads(), (torch.randn(1, 8, 32),), blocks)


class _Alibi(nn.Module):
    """BLOOM's ALiBi scores: ``baddbmm`` of a known bias with ``beta`` and ``alpha``; ``addmm`` scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 8, 8))
        self.register_buffer("bias", torch.randn(2, 4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.baddbmm(self.bias, x, self.w, beta=0.5, alpha=0.25)
        return s + torch.addmm(self.bias[0, 0], x[0], self.w[0], alpha=2.0)


def test_baddbmm_and_addmm_with_beta_and_alpha_equal_the_module() -> None:
    _equals_module_f64(_Alibi(), (torch.randn(2, 4, 8),), {8: 2})


class _ViewWritten(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.p(x)
        y[:, :4].add_(1.0)  # writes into y through a view
        return y


class _Routed(nn.Module):
    """A mixture of experts' routing: the top-2 experts of each token, chosen by value."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.topk(self.gate(x), 2, dim=-1).values.sum(-1)


class _Gather(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
        return self.p(x)[:, pick]


@pytest.mark.parametrize("module, example, message", [
    (_ViewWritten(), (torch.randn(2, 8),), r"add_\S* \(aten\.add_\.\w+\): an in-place op on a view of another tensor"),
    (_Routed(), (torch.randn(2, 8),), r"aten\.topk\.default \(1x\); aten\.topk\.default: the model picks what to "
                                      r"compute from the values at run time"),
    (_Gather(), (torch.randn(2, 8), torch.tensor([0, 3])), r"an index computed at run time"),
])  # fmt: skip
def test_what_cannot_be_lowered_statically_is_refused_in_one_line(module, example, message: str) -> None:
    ep, _ = export_model(module, example)
    with pytest.raises(GraphImportError, match=message) as e:
        lower_program(ep)
    assert "\n" not in str(e.value)


class _BiasedScores(nn.Module):
    """Attention with an additive mask of biases, not only 0 and -inf (ALiBi's, as Falcon gives it to sdpa):
    the default scale multiplies the scores, not the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.register_buffer("bias", torch.randn(1, 4, 8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias)


class _SquareAndBroadcast(nn.Module):
    """relu(x) squared (Nemotron's and Persimmon's MLP), broadcast_to (Falcon's grouped heads), and a scalar
    0 added (CTRL's)."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.square(torch.relu(self.p(x))) + 0.0
        return (y.unsqueeze(1).broadcast_to(4, 2, 16) * x.unsqueeze(1)).sum(1)


@pytest.mark.parametrize("module, example", [(_BiasedScores(), (torch.randn(1, 8, 32),)),
                                             (_SquareAndBroadcast(), (torch.randn(4, 16),))])  # fmt: skip
def test_biased_attention_masks_squares_and_broadcast_to_equal_the_module(module: nn.Module, example: tuple) -> None:
    _equals_module_f64(module, example, {})
    _equals_module_f64(module, example, {16: 2, 32: 2, 8: 2})


class _Selections(nn.Module):
    """Eager attentions' masking and clamping: where(known mask, scores, min) (GPT-Neo), masked_fill(mask, -inf)
    (MPT), max(scores, min) (XGLM), clamp (OLMo's clip), a computed condition, softplus and expm1."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.p(x)  # (8, 8) scores
        causal = torch.ones(8, 8, dtype=torch.bool).tril()
        a = torch.where(causal, s, torch.finfo(s.dtype).min).softmax(-1)
        b = s.masked_fill(~causal, float("-inf")).softmax(-1)
        c = torch.max(s, torch.tensor(-0.5)) + s.clamp(-0.2, 0.3) + s.clamp_min(0.1)
        d = torch.where(s > 0, nn.functional.softplus(s, beta=2.0), torch.expm1(s)) + torch.minimum(s, 2 * s)
        return a + b + c + d


@pytest.mark.parametrize("blocks", [{}, {8: 2}])
def test_where_masked_fill_extrema_clamps_and_softplus_equal_the_module(blocks: dict[int, int], tmp_path) -> None:
    from doppler.ir.formats import load_graph, save_graph

    g = _equals_module_f64(_Selections(), (torch.randn(8, 8),), blocks)
    save_graph(g, tmp_path / "g.json")  # -inf is a parameter a graph file holds
    assert load_graph(tmp_path / "g.json").num_ops == g.num_ops
