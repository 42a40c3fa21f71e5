"""`doppler graph import` against its bars: import time, FLOPs, numerics, our own builder, compare.

    python benchmarks/graph_import.py [--anneal-s 5]

Per model (the example MLP and LLaMA block, and 2-layer Hugging Face LlamaForCausalLM and
GPT2LMHeadModel built from configs):
* import time: the factory call, torch.export and the lowering, in one fresh measurement each;
* matrix-product FLOPs of the graph (op kind ``matmul``) / FlopCounterMode's count of the same
  forward (sdpa through its math backend, which FlopCounterMode counts; its CPU flash kernel is
  not counted);
* the largest error of the graph's numpy evaluation against the module's forward, relative to the
  output's largest magnitude, in float64 and float32, untiled and tiled;
* the time of `doppler compare` with every non-learned method on p100x4.
Then the LLaMA block at the shapes and tiling of `doppler graph build llama_block`: op counts and
FLOPs side by side.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from doppler import workloads
from doppler.methods import compare, list_methods
from doppler.ir.graph import OpKind
from doppler.importer import export_model, load_factory, lower_program, model_inputs
from doppler.hardware.presets import cluster
from doppler.ir.kernels import evaluate_numpy
from doppler.workloads.references import assemble_outputs

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MODELS = {
    "mlp": ("models.py:mlp", {256: 2, 1024: 4, 64: 2}),
    "llama_block": ("models.py:llama_block", {256: 4, 688: 2, 64: 2}),
    "LlamaForCausalLM 2 layers": ("hf_models.py:llama", {128: 2, 344: 2, 512: 2}),
    "GPT2LMHeadModel 2 layers": ("hf_models.py:gpt2", {128: 2, 384: 3, 512: 2}),
}


def _error(module, example, graph, dtype) -> float:
    module = module.to(torch.float64)
    with torch.no_grad():
        out = module(*[x.double() if x.dtype.is_floating_point else x for x in example])
    ref = (out.logits if hasattr(out, "logits") else out).numpy()
    x = {k: v.astype(dtype) for k, v in model_inputs(graph, module, example).items()}
    (got,) = assemble_outputs(graph, evaluate_numpy(graph, x)).values()
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anneal-s", type=float, default=5.0, help="anneal's budget inside compare")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    # (tensor_parallel and tp_pipeline need a transformer whose blocks divide over the devices: not every model here)
    methods = [m for m in list_methods() if m not in ("doppler", "tensor_parallel", "tp_pipeline")]
    print("| model | import (s) | ops untiled / tiled | matmul FLOPs / FlopCounterMode | max error f64 | max error f32 "
          "| compare, all methods (s) |")
    print("|---|---|---|---|---|---|---|")
    for label, (source, blocks) in MODELS.items():
        t0 = time.perf_counter()
        module, example = load_factory(f"{EXAMPLES / source}")
        ep, example = export_model(module, example)
        g_untiled = lower_program(ep, name=label)
        import_s = time.perf_counter() - t0
        g = lower_program(ep, blocks=blocks, name=label)
        with FlopCounterMode(display=False) as fc, sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
            module(*example)
        mm = float(g.flops[g.kind == int(OpKind.MATMUL)].sum()) / fc.get_total_flops()
        e64 = max(_error(module, example, gg, np.float64) for gg in (g_untiled, g))
        e32 = max(_error(module, example, gg, np.float32) for gg in (g_untiled, g))
        t1 = time.perf_counter()
        compare(g, cluster("p100x4"), methods, budget_s=args.anneal_s)
        cmp_s = time.perf_counter() - t1
        print(f"| {label} | {import_s:.2f} | {g_untiled.num_ops} / {g.num_ops} | {mm:.4f} | {e64:.1e} | {e32:.1e} "
              f"| {cmp_s:.1f} |", flush=True)

    sys.path.insert(0, str(EXAMPLES))
    import models

    p = dict(seq_len=512, dim=4096, n_heads=32, head_dim=128, hidden=11008)
    module, example = models.llama_block(dim=4096, n_heads=32, hidden=11008, seq_len=512)
    ep, _ = export_model(module, example)
    print("\nLLaMA block at `doppler graph build llama_block` shapes (dim 4096, 32 heads, hidden 11008, seq 512)")
    print("| tiling | imported ops | builder ops | imported / builder FLOPs | op kinds (imported; builder) |")
    print("|---|---|---|---|---|")
    for k in (1, 4):
        g = lower_program(ep, blocks={4096: k, 11008: k} if k > 1 else {})
        ref = workloads.build("llama_block", **p, dim_blocks=k, head_blocks=k, hidden_blocks=k)
        kinds = [", ".join(f"{OpKind(a).label} {c}" for a, c in sorted(Counter(gg.kind.tolist()).items()))
                 for gg in (g, ref)]  # fmt: skip
        print(f"| {k} blocks | {g.num_ops} | {ref.num_ops} | {g.flops.sum() / ref.flops.sum():.5f} "
              f"| {kinds[0]}; {kinds[1]} |")


if __name__ == "__main__":
    main()
