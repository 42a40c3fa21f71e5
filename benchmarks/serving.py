"""Serving latency of LLaMA-2-7B, the numbers an LLM engineer quotes: time to first token and time per output
token, against each cell's roofline and against published measurements.

    python benchmarks/serving.py [--full] [--budget-s 10] [--presets a100x8,h100x8] [--tps 1,2,4,8]
                                 [--batches 1,2,4,8] [--input-tokens 128] [--output-tokens 20] [--out serving.json]

For every preset (``a100x8``, ``h100x8``), tensor-parallel size TP (the cluster ``PRESET:TP``) and batch B:

* **TTFT**: the simulated makespan of a ``llama_model`` prefill of ``--input-tokens`` tokens per sequence
  (float16, fused attention);
* **TPOT**: the simulated makespan of one decode step at the middle of the generation, context
  ``input + output // 2`` (138 for 128 + 20);
* **end to end**: ``TTFT + (output - 1) x TPOT``: the prefill yields the first output token, each decode step
  one more.

Each graph is tiled so that every TP rank gets one tile of each logical op (``head_blocks = hidden_blocks =
vocab_blocks = TP``, ``dim_blocks = 1``) and placed with ``tensor_parallel`` (Megatron-LM's split). With
``--full``, also with ``tp_pipeline`` (where TP > 1), ``anneal --budget-s`` and ``doppler --budget-s`` (search
from the shipped policy), each row with its time to place. Default mode (``tensor_parallel`` only): about
3 minutes on 2 cores; ``--full``: about 2 x budget per graph and placement more (about 25 min at the default
10 s on the full grid).

Each cell is compared with its roofline (datasheet peaks, no achieved fraction): a prefill
``max(FLOPs / (TP x dense float16 peak), bytes / (TP x memory bandwidth))``, the bytes the weights; a decode
step ``(weights + KV cache) / (TP x memory bandwidth)``. The end-to-end latency is compared with NVIDIA NeMo
Framework's "Llama-2 Results, Inference Performance" table (Llama-2-7B, 128 input and 20 output tokens, batch
1-8, TP 1/2/4/8, average latency on A100 80GB SXM4 and H100 80GB HBM3, TensorRT-LLM); batch 1's TPOT on the
A100 with gpt-fast's tensor-parallel table (PyTorch's gpt-fast README: Llama-2-7B, batch 1, tokens/s on
A100-80GB power-limited to 330 W, prompts of 5 tokens). docs/realism.md has the tables and what they show.
No constant is fitted to these measurements.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from doppler import cluster as resolve_cluster
from doppler import memory, workloads
from doppler.util.io import write_json
from doppler.methods import MethodError, assign, score
from doppler.sim import lower_bound

#: NVIDIA NeMo Framework, "Llama-2 Results, Inference Performance": Llama-2-7B, input 128 tokens, output 20
#: tokens, average latency in ms, (preset, TP, batch) -> ms
NEMO_LATENCY_MS: dict[tuple[str, int, int], float] = {
    (preset, tp, batch): ms
    for tp, rows in {1: ((234.0, 153.8), (249.6, 160.8), (272.6, 174.8), (329.5, 199.2)),
                     2: ((171.7, 128.6), (180.3, 132.0), (202.9, 137.9), (237.6, 156.2)),
                     4: ((143.7, 107.4), (149.9, 114.0), (165.2, 120.4), (196.4, 134.6)),
                     8: ((136.5, 97.6), (143.3, 109.1), (158.6, 116.2), (181.9, 129.1))}.items()  # fmt: skip
    for batch, pair in zip((1, 2, 4, 8), rows)
    for preset, ms in zip(("a100x8", "h100x8"), pair)
}
#: PyTorch gpt-fast README, "Tensor Parallelism": Llama-2-7B, batch 1, tokens/s on A100-80GB (330 W), per GPUs
GPT_FAST_TOKENS_PER_S: dict[int, float] = {1: 104.9, 2: 168.84, 4: 254.02, 8: 328.43}


def graphs(tp: int, batch: int, input_tokens: int, context: int) -> dict[str, Any]:
    """The prefill and the mid-generation decode step of LLaMA-2-7B, one tile per TP rank of each logical op."""
    tiles = {"head_blocks": tp, "hidden_blocks": tp, "vocab_blocks": tp, "dim_blocks": 1, "batch": batch}
    return {"prefill": workloads.build("llama_model", seq_len=input_tokens, **tiles),
            "decode": workloads.build("llama_model", phase="decode", context=context, **tiles)}  # fmt: skip


def roofline_s(g: Any, c: Any, phase: str) -> float:
    """The cell's datasheet bound over the cluster's devices (see the module docstring)."""
    dev = c.devices[0]
    n = c.num_devices
    weights = memory.weight_bytes(g)  # (a decode step's KV cache is a resident input too)
    memory_s = weights / (n * dev.memory_bandwidth_Bps)
    if phase == "decode":
        return memory_s
    return max(float(g.flops.sum()) / (n * dev.peak_flops_by_dtype["float16"]), memory_s)


def place(g: Any, c: Any, method: str, budget_s: float | None) -> tuple[float | None, float, str]:
    """(simulated makespan or None, seconds to place, note)."""
    t0 = time.perf_counter()
    try:
        a = assign(g, c, method, budget_s=budget_s)
    except MethodError as e:
        return None, time.perf_counter() - t0, str(e)
    place_s = time.perf_counter() - t0
    r = score(g, c, a, float(lower_bound(g, c)))
    return (r.makespan_s if r.feasible else None), place_s, "" if r.feasible else "does not fit"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true", help="also tp_pipeline, anneal and doppler (search)")
    ap.add_argument("--budget-s", type=float, default=10.0, help="anneal's and doppler's budget per graph")
    ap.add_argument("--presets", default="a100x8,h100x8")
    ap.add_argument("--tps", default="1,2,4,8")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--input-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=20)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    presets = args.presets.split(",")
    tps = [int(t) for t in args.tps.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    context = args.input_tokens + args.output_tokens // 2
    steps = args.output_tokens - 1
    methods = [("tensor_parallel", None)]
    if args.full:
        methods += [("tp_pipeline", None), ("anneal", args.budget_s), ("doppler", args.budget_s)]
    rows: list[dict[str, Any]] = []
    print(f"LLaMA-2-7B float16: TTFT = prefill of {args.input_tokens} tokens, TPOT = decode at context {context}, "
          f"end to end = TTFT + {steps} x TPOT\n")  # fmt: skip
    print("| preset | TP | batch | method | TTFT (ms) | / roofline | TPOT (ms) | / roofline | end to end (ms) | "
          "its roofline (ms) | NeMo (ms) | error | place (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for tp in tps:
        for batch in batches:
            gs = graphs(tp, batch, args.input_tokens, context)
            for preset in presets:
                c = resolve_cluster(f"{preset}:{tp}")
                for method, budget in methods:
                    if method == "tp_pipeline" and tp == 1:
                        continue
                    row: dict[str, Any] = {"preset": preset, "tp": tp, "batch": batch, "method": method,
                                           "place_s": 0.0, "note": ""}  # fmt: skip
                    for phase, g in gs.items():
                        makespan, place_s, note = place(g, c, method, budget)
                        row[f"{phase}_s"] = makespan
                        row[f"{phase}_roofline_s"] = roofline_s(g, c, phase)
                        row["place_s"] += place_s
                        row["note"] = row["note"] or note
                    ok = row["prefill_s"] is not None and row["decode_s"] is not None
                    row["end_to_end_s"] = row["prefill_s"] + steps * row["decode_s"] if ok else None
                    row["end_to_end_roofline_s"] = row["prefill_roofline_s"] + steps * row["decode_roofline_s"]
                    nemo = NEMO_LATENCY_MS.get((preset, tp, batch))
                    row["nemo_ms"] = nemo
                    row["error"] = row["end_to_end_s"] * 1e3 / nemo - 1 if ok and nemo else None
                    rows.append(row)
                    print(_line(row), flush=True)
            if args.out:
                write_json(args.out, {"input_tokens": args.input_tokens, "output_tokens": args.output_tokens,
                                      "context": context, "full": args.full, "rows": rows})  # fmt: skip
    _summary(rows, presets)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f}"


def _line(r: dict[str, Any]) -> str:
    def ratio(phase: str) -> str:
        return "-" if r[f"{phase}_s"] is None else f"{r[f'{phase}_s'] / r[f'{phase}_roofline_s']:.2f}"

    err = "-" if r["error"] is None else f"{r['error']:+.0%}"
    nemo = "-" if r["nemo_ms"] is None else f"{r['nemo_ms']:.1f}"
    return (f"| {r['preset']} | {r['tp']} | {r['batch']} | {r['method']} | {_ms(r['prefill_s'])} | {ratio('prefill')} | "
            f"{_ms(r['decode_s'])} | {ratio('decode')} | {_ms(r['end_to_end_s'])} | {_ms(r['end_to_end_roofline_s'])} | "
            f"{nemo} | {err} | "
            f"{r['place_s']:.1f} |" + (f" {r['note']}" if r["note"] else ""))  # fmt: skip


def _summary(rows: list[dict[str, Any]], presets: list[str]) -> None:
    for method in dict.fromkeys(r["method"] for r in rows):
        errs = [abs(r["error"]) for r in rows if r["method"] == method and r["error"] is not None]
        if errs:
            print(f"\n{method}: median |error| against NeMo {statistics.median(errs):.0%} over {len(errs)} cells "
                  f"(max {max(errs):.0%})")  # fmt: skip
        for preset in presets:
            for batch in sorted({r["batch"] for r in rows}):
                cells = sorted((r["tp"], r["end_to_end_s"]) for r in rows if r["method"] == method and
                               r["preset"] == preset and r["batch"] == batch and r["end_to_end_s"] is not None)  # fmt: skip
                lat = [x for _, x in cells]
                falls = all(b < a for a, b in zip(lat, lat[1:]))
                gains = [a / b for a, b in zip(lat, lat[1:])]
                print(f"  {preset} batch {batch}: end to end by TP {[t for t, _ in cells]}: "
                      f"{[round(x * 1e3, 1) for x in lat]} ms, falls with TP: {falls}, speed-up per TP step: "
                      f"{[round(x, 2) for x in gains]}")  # fmt: skip
    tpot = {r["tp"]: r["decode_s"] for r in rows if r["method"] == "tensor_parallel" and r["preset"] == "a100x8"
            and r["batch"] == 1 and r["decode_s"] is not None}  # fmt: skip
    if tpot:
        print("\ngpt-fast (A100-80GB at 330 W, batch 1): TPOT measured vs simulated")
        for tp, s in sorted(tpot.items()):
            measured = 1.0 / GPT_FAST_TOKENS_PER_S[tp] if tp in GPT_FAST_TOKENS_PER_S else None
            if measured is not None:
                print(f"  TP {tp}: {measured * 1e3:.2f} ms measured, {s * 1e3:.2f} ms simulated, "
                      f"error {s / measured - 1:+.0%}")  # fmt: skip


if __name__ == "__main__":
    main()
