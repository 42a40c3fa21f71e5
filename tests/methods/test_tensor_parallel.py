"""tensor_parallel and tp_pipeline: Megatron-LM's split, placed tile by tile, within the memory budget."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from doppler.hardware import presets
from doppler import workloads
from doppler.hardware.cluster import Cluster, Device, homogeneous
from doppler.methods import MethodError, assign
from doppler.sim import simulate

TINY4 = {"size": "tiny", "n_kv_heads": 4, "head_blocks": 4, "hidden_blocks": 4, "vocab_blocks": 4}


def _ops(g, pattern: str) -> np.ndarray:
    return np.array([v for v in range(g.num_ops) if re.fullmatch(pattern, g.names[v])], np.int64)


def _weight_block(g, v: int, axis: int) -> int:
    """The block index of op ``v``'s weight tile along the weight's ``axis``."""
    ref = next(r for r in g.specs[v]["inputs"] if "input" in r and r["input"] not in g.meta["user_inputs"])
    lo, hi = ref["slice"][axis]
    return lo // (hi - lo)


@pytest.mark.parametrize("params, d", [(TINY4, 4), ({**TINY4, "head_blocks": 4, "hidden_blocks": 8, "vocab_blocks": 8,
                                                      "dim_blocks": 2, "seq_blocks": 2}, 2),
                                       ({**TINY4, "attention": "unfused"}, 4)])  # fmt: skip
def test_every_projection_lands_as_megatron_splits_it(params, d):
    g = workloads.build("llama_model", **params)
    a = assign(g, presets.cluster(f"unit:{d}"), "tensor_parallel")
    dev = a.devices
    assert dev.shape == (g.num_ops,) and set(dev.tolist()) == set(range(d))
    hb, fb, vb = params["head_blocks"], params["hidden_blocks"], params["vocab_blocks"]
    for i in range(2):
        for proj, axis, blocks in (("q_proj", 1, hb), ("k_proj", 1, hb), ("v_proj", 1, hb), ("o_proj", 0, hb),
                                   ("gate_proj", 1, fb), ("up_proj", 1, fb), ("down_proj", 0, fb)):  # fmt: skip
            ops = _ops(g, rf"layers\.{i}\.{proj}\[.*\](k\d+)?")
            assert ops.size
            want = [_weight_block(g, v, axis) // (blocks // d) for v in ops]  # contiguous runs of blocks
            assert dev[ops].tolist() == want, proj
        # column-parallel sums go with their partial products; what lies between follows its head or hidden slice
        attention = ((("scores", "q_rope"), ("pv", "attn_softmax")) if params.get("attention") == "unfused"
                     else (("attn", "q_rope"),))  # fmt: skip
        for name, source in (("q_proj", "q_proj"), ("q_rope", "q_proj"), *attention, ("silu_mul", "gate_proj")):
            ops = _ops(g, rf"layers\.{i}\.{name}\[.*\]" + ("agg" if name == source else "(agg)?"))
            assert ops.size, name
            for v in ops:  # (an aggregation reads the partial products of its own logical op)
                ins = [u for u in g.predecessors(v) if g.names[u].startswith(f"layers.{i}.{source}")
                       or g.names[u].startswith(f"layers.{i}.{name}[")]  # fmt: skip
                assert ins and {int(dev[u]) for u in ins} == {int(dev[v])}, g.names[v]
    head = _ops(g, r"lm_head\[.*\](k\d+)?")
    assert dev[head].tolist() == [_weight_block(g, v, 1) // (vb // d) for v in head]
    # the residual stream is spread by block: residual adds, their row-parallel sums and norms, round robin
    from doppler.methods.simple import flat_block_index

    flat = flat_block_index(g)
    for pattern in (r"layers\.\d\.(attn|mlp)_residual\[.*\]", r"layers\.\d\.(o|down)_proj\[.*\]agg",
                    r"layers\.\d\.(attn|mlp)_norm\.scale\[.*\]", r"embed_tokens\[.*\]"):  # fmt: skip
        ops = _ops(g, pattern)
        assert ops.size and np.array_equal(dev[ops], flat[ops] % d), pattern


def test_a_decode_step_reads_each_head_blocks_cache_where_the_head_is():
    g = workloads.build("llama_model", **{**TINY4, "phase": "decode", "context": 8, "context_blocks": 2})
    dev = assign(g, presets.cluster("unit:2"), "tensor_parallel").devices
    readers = 0
    for v, spec in enumerate(g.specs):
        for ref in spec["inputs"]:
            if ref.get("input", "").endswith("_cache"):
                assert dev[v] == ref["block"][2] // 2  # head block j of 4 on device j // 2
                readers += 1
    assert readers == 2 * 2 * 2 * 4  # layers x (k, v) x context blocks x head blocks


@pytest.mark.parametrize("size, cluster", [("tiny", "unit:4"), ("small", "h100x8:4")])
def test_tensor_parallel_beats_the_fill_on_equal_devices(size, cluster):
    g = workloads.build("llama_model", **{**TINY4, "size": size})
    c = presets.cluster(cluster)
    tp = simulate(g, c, assign(g, c, "tensor_parallel")).makespan_s
    fill = simulate(g, c, assign(g, c, "sequential_fill")).makespan_s
    assert tp < fill


def test_an_imported_llama_is_split_like_a_built_one():
    pytest.importorskip("transformers")
    from doppler.importer import import_model

    examples = Path(__file__).resolve().parents[2] / "examples"
    sys.path.insert(0, str(examples))
    g = import_model(f"{examples / 'hf_models.py'}:gqa_llama", blocks={128: 2, 32: 2, 344: 2, 512: 2})
    c = presets.cluster("unit:2")
    dev = assign(g, c, "tensor_parallel").devices
    for v, spec in enumerate(g.specs):
        for ref in spec["inputs"]:
            name = ref.get("input", "")
            if re.search(r"(q|k|v|gate|up)_proj\.weight$|^lm_head\.weight$", name):  # torch's (out, in): rows
                lo, hi = ref["slice"][0]
                assert dev[v] == lo // (hi - lo), (g.names[v], name)
            elif re.search(r"(o|down)_proj\.weight$", name):  # the input columns
                lo, hi = ref["slice"][1]
                assert dev[v] == lo // (hi - lo), (g.names[v], name)
    assert simulate(g, c, dev).makespan_s < simulate(g, c, assign(g, c, "sequential_fill")).makespan_s


def _one_line(e: pytest.ExceptionInfo) -> str:
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("method", ["tensor_parallel", "tp_pipeline"])
def test_graphs_without_layers_or_with_undivided_blocks_are_refused(method):
    c = presets.cluster("unit:4")
    for g in (workloads.build("random", size="tiny"), workloads.build("chainmm", size="tiny"),
              workloads.build("llama_layer", size="tiny")):  # fmt: skip
        with pytest.raises(MethodError, match="has no layer structure") as e:
            assign(g, c, method)
        _one_line(e)
    g = workloads.build("llama_model", size="tiny", head_blocks=2)
    if method == "tensor_parallel":
        with pytest.raises(MethodError, match=r"head_blocks=2 does not divide over 4 devices \(model.layers.0"):
            assign(g, c, method)
    else:  # tp_pipeline: a group of 2 (or 1) does divide them
        assert assign(g, c, method).info["tp"] in (1, 2)
        with pytest.raises(MethodError, match=r"tp_pipeline: head_blocks=2 does not divide over 4 devices of a stage"):
            assign(g, c, method, tp=4)
    g = workloads.build("llama_model", **{**TINY4, "hidden_blocks": 2})
    with pytest.raises(MethodError, match="hidden_blocks=2 does not divide over 4"):
        assign(g, c, method, **({"tp": 4} if method == "tp_pipeline" else {}))
    g = workloads.build("llama_model", **{**TINY4, "vocab_blocks": 1})
    with pytest.raises(MethodError, match="vocab_blocks=1 does not divide over 4"):
        assign(g, c, method, **({"tp": 4} if method == "tp_pipeline" else {}))


def test_a_placement_over_the_memory_budget_is_refused_naming_the_device():
    g = workloads.build("llama_model", **TINY4)
    from doppler.memory import weight_bytes

    need = weight_bytes(g)
    devices = [Device(f"gpu{i}", flops_per_s=1e12, memory_bytes=need / (20 if i == 0 else 1)) for i in range(4)]
    tight = Cluster("tight", devices, np.full((4, 4), 1e11), np.zeros((4, 4)))  # gpu0 holds a twentieth
    with pytest.raises(MethodError, match=r"tensor_parallel: device 0 \(gpu0\) would hold .* of weights and KV "
                                          r"cache, over its budget of") as e:  # fmt: skip
        assign(g, tight, "tensor_parallel")
    _one_line(e)
    with pytest.raises(MethodError, match=r"tp_pipeline: no tensor-parallel group size fits: tp=1: .*; tp=2: .*gpu0"
                                          r".*; tp=4: .*") as e:  # fmt: skip
        assign(g, tight, "tp_pipeline")
    _one_line(e)
    roomy = homogeneous("roomy", 4, flops_per_s=1e12, bandwidth_Bps=1e11, memory_bytes=need / 0.9 * 0.6)
    a = assign(g, roomy, "tensor_parallel")  # no device holds more than about a quarter of the weights
    assert a.info["memory_feasible"]


def test_tp_pipeline_makes_stages_of_tensor_parallel_groups():
    g = workloads.build("llama_model", **{**TINY4, "layers": 4, "head_blocks": 2, "hidden_blocks": 2,
                                           "vocab_blocks": 2})  # fmt: skip
    c = presets.cluster("unit:4")
    a = assign(g, c, "tp_pipeline", tp=2)
    assert a.info["tp"] == 2 and a.info["stages"] == 2
    from doppler.methods.layered import layer_units

    names, unit = layer_units(g)
    for k, name in enumerate(names):
        used = set(a.devices[unit == k].tolist())
        assert used in ({0, 1}, {2, 3}) or (len(used) == 1 and not name.startswith("model.layers")), name
    first = {int(d) // 2 for d in a.devices[unit == names.index("model.layers.0")]}
    last = {int(d) // 2 for d in a.devices[unit == names.index("model.layers.3")]}
    assert first == {0} and last == {1}  # contiguous stages, in order
    for tp, bad in ((3, "tp=3 must be a whole number that divides the 4 devices"), (0, "tp=0"), (True, "tp=True")):
        with pytest.raises(MethodError, match=bad):
            assign(g, c, "tp_pipeline", tp=tp)
    best = assign(g, c, "tp_pipeline")  # every group size that divides: the fastest kept
    tried = best.info["makespan_s_by_tp"]
    assert set(tried) == {1, 2} and best.info["tp"] == min(tried, key=tried.get)
    assert best.estimated_makespan_s == pytest.approx(simulate(g, c, best).makespan_s)
    one = assign(g, c, "tp_pipeline", tp=1)  # one device per stage: the layers in contiguous stages
    assert all(len(set(one.devices[unit == k].tolist())) == 1 for k in range(len(names)))


@pytest.mark.parametrize("method", ["tensor_parallel", "tp_pipeline"])
def test_deterministic_and_not_below_the_lower_bound(method):
    from doppler.sim import lower_bound

    g = workloads.build("llama_model", **{**TINY4, "phase": "decode", "context": 4})
    for c in (presets.cluster("unit:4"), presets.cluster("p100x4")):
        a = assign(g, c, method, seed=1)
        assert np.array_equal(a.devices, assign(g, c, method, seed=2).devices)
        assert simulate(g, c, a).makespan_s >= lower_bound(g, c) * (1 - 1e-9)


def test_a_malformed_structure_or_weight_tile_is_refused_in_one_line():
    c = presets.cluster("unit:4")
    g = workloads.build("llama_model", **TINY4)
    g.meta["structure"] = {**g.meta["structure"], "layers": "all"}
    with pytest.raises(MethodError, match=r"tensor_parallel: llama_model: meta.structure.layers: must be a list") as e:
        assign(g, c, "tensor_parallel", ignore_memory=True)
    _one_line(e)
    g = workloads.build("llama_model", **TINY4)
    v = int(_ops(g, r"layers\.0\.q_proj\[.*\]k0")[0])
    ref = next(r for r in g.specs[v]["inputs"] if r.get("input") == "layers.0.w_q")
    ref["slice"][1] = [0, 3]  # 3 of 4 heads: not one of equal blocks
    with pytest.raises(MethodError, match=r"op \d+ \('layers.0.q_proj\[.*\]k0'\) reads a tile of 'layers.0.w_q' that "
                                          "is not one of equal blocks") as e:  # fmt: skip
        assign(g, c, "tensor_parallel", ignore_memory=True)
    _one_line(e)


def test_llama2_7b_decode_on_two_a100s_is_faster_than_on_one_and_never_beats_reading_half_its_weights():
    """benchmarks/serving.py's cells: one decode step of LLaMA-2-7B (context 138, batch 1), one tile per rank,
    placed by tensor_parallel. Two A100s split the weights and cache: never faster than each reading its half
    at the datasheet's bandwidth, and faster than one A100."""
    from doppler import memory

    def step_s(tp: int) -> tuple[float, float]:
        g = workloads.build("llama_model", phase="decode", context=138, head_blocks=tp, hidden_blocks=tp,
                            vocab_blocks=tp, dim_blocks=1)  # fmt: skip
        c = presets.cluster(f"a100x8:{tp}")
        return simulate(g, c, assign(g, c, "tensor_parallel").devices).makespan_s, memory.weight_bytes(g)

    one, weights = step_s(1)
    two, _ = step_s(2)
    assert weights / (2 * 2.039e12) <= two < one
