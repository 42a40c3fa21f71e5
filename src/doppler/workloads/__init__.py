"""Tile-decomposed dataflow graphs of real tensor programs, and random DAGs.

The tiled workloads are built with :class:`~doppler.workloads.tiling.TileBuilder` (:mod:`doppler.workloads.tiling` says which ops a
contraction and an elementwise step become). Costs come from the real shapes:
``flops`` per op (the convention of :mod:`doppler.ir.kernels`) and
``output_bytes`` = elements of the op's output block x dtype bytes.

Input tensors (weights, activations, rotary tables) are **not** ops: as in the
DOPPLER paper they are pre-loaded on every device, and op specs reference their
tiles directly.

Workloads (``build(name, **params)``): ``chainmm`` (A.B + C.(D.E)), ``ffnn``
(softmax(relu(X.W1 + b1).W2 + b2)), ``llama_block`` (one LLaMA decoder block),
``llama_layer`` (the block plus mask construction, final norm, last-token
selection and the vocabulary head; both take ``batch`` sequences of ``seq_len``
tokens (in ``batch_blocks`` blocks), each with its own causal attention),
``llama_model`` (a whole causal LM: embedding, ``layers`` decoder layers with
grouped-query attention, final norm and head; a prefill, or with ``phase=decode`` one new token per
sequence over a KV cache; every op records its module, and the graph its layer structure) and
``random`` (layered random DAGs, no specs).
Every workload takes ``size=tiny|small|paper`` (default ``paper``); explicit keys
override the preset. ``graph.meta`` records the workload, resolved parameters,
input shapes, output tiles and the FLOPs of the untiled computation, so
:func:`~doppler.workloads.references.make_inputs`, :func:`doppler.ir.kernels.evaluate_numpy`,
:func:`~doppler.workloads.references.assemble_outputs` and :func:`reference` can check a graph end to end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.ir.kernels import DTYPE_BYTES
from doppler.workloads import builders
from doppler.workloads.references import ref_chainmm, ref_ffnn, ref_llama_block, ref_llama_layer, ref_llama_model
from doppler.workloads.tiling import TileBuilder, WorkloadError

__all__ = [
    "SIZES",
    "WORKLOADS",
    "WorkloadError",
    "build",
    "count_ops",
    "describe",
    "list_workloads",
    "param_spec",
    "parse_set",
    "reference",
]

SIZES = ("tiny", "small", "paper")


# ================================================================ workloads
# ================================================================= registry
@dataclass(frozen=True)
class _Workload:
    name: str
    description: str
    defaults: dict[str, Any]
    presets: dict[str, dict[str, Any]]
    ops: Callable[[TileBuilder, dict[str, Any]], None] | None  # declares a tiled workload's ops (None: random)
    reference: Callable[[dict[str, Any], Mapping[str, np.ndarray]], dict[str, np.ndarray]] | None
    divides: tuple[tuple[str, str], ...]  # (blocks key, dimension key)


_LLAMA_DEFAULTS: dict[str, Any] = {
    "batch": 1, "seq_len": 512, "dim": 4096, "n_heads": 32, "head_dim": 128, "hidden": 11008,
    "batch_blocks": 1, "seq_blocks": 1, "dim_blocks": 4, "head_blocks": 4, "hidden_blocks": 4,
    "eps": 1e-6, "rope_theta": 10000.0, "dtype": "float32",
}  # fmt: skip
_LLAMA_TINY = {"seq_len": 8, "dim": 32, "n_heads": 4, "head_dim": 8, "hidden": 64}
_LLAMA_SMALL = {"seq_len": 512, "dim": 1024, "n_heads": 8, "head_dim": 128, "hidden": 2752}
_LLAMA_DIVIDES = (
    ("batch_blocks", "batch"), ("seq_blocks", "seq_len"), ("dim_blocks", "dim"),
    ("head_blocks", "n_heads"), ("hidden_blocks", "hidden"),
)  # fmt: skip

WORKLOADS: dict[str, _Workload] = {
    "chainmm": _Workload(
        "chainmm",
        "A.B + C.(D.E) with n x n matrices",
        {"n": 8192, "row_blocks": 4, "col_blocks": 2, "inner_blocks": 2, "dtype": "float32"},
        {"tiny": {"n": 16}, "small": {"n": 1024}, "paper": {}},
        builders.chainmm,
        ref_chainmm,
        (("row_blocks", "n"), ("col_blocks", "n"), ("inner_blocks", "n")),
    ),
    "ffnn": _Workload(
        "ffnn",
        "softmax(relu(X.W1 + b1).W2 + b2), softmax over the output features",
        {"batch": 8192, "d_in": 4096, "d_hidden": 8192, "d_out": 4096,
         "batch_blocks": 4, "in_blocks": 2, "hidden_blocks": 4, "out_blocks": 2, "dtype": "float32"},  # fmt: skip
        {
            "tiny": {"batch": 16, "d_in": 16, "d_hidden": 16, "d_out": 8},
            "small": {"batch": 1024, "d_in": 1024, "d_hidden": 2048, "d_out": 1024},
            "paper": {},
        },
        builders.ffnn,
        ref_ffnn,
        (("batch_blocks", "batch"), ("in_blocks", "d_in"), ("hidden_blocks", "d_hidden"), ("out_blocks", "d_out")),
    ),
    "llama_block": _Workload(
        "llama_block",
        "one LLaMA decoder block (RMSNorm, rotary causal attention, SwiGLU MLP) on a batch of sequences",
        dict(_LLAMA_DEFAULTS),
        {"tiny": dict(_LLAMA_TINY), "small": dict(_LLAMA_SMALL), "paper": {}},
        builders.llama_block,
        ref_llama_block,
        _LLAMA_DIVIDES,
    ),
    "llama_layer": _Workload(
        "llama_layer",
        "a LLaMA block plus causal-mask construction, final RMSNorm, last-token selection (per sequence) "
        "and vocabulary head",
        {**_LLAMA_DEFAULTS, "vocab": 32000, "vocab_blocks": 4},
        {"tiny": {**_LLAMA_TINY, "vocab": 64}, "small": {**_LLAMA_SMALL, "vocab": 8000}, "paper": {}},
        builders.llama_layer,
        ref_llama_layer,
        _LLAMA_DIVIDES + (("vocab_blocks", "vocab"),),
    ),
    "llama_model": _Workload(
        "llama_model",
        "a whole LLaMA-style causal LM (embedding, `layers` decoder layers with grouped-query attention "
        "when n_kv_heads < n_heads, final RMSNorm, vocabulary head on the last token): a prefill of `batch` x "
        "`seq_len` tokens, or with phase=decode one new token per sequence over a KV cache of `context` positions; "
        "LLaMA-2-7B by default",
        {"layers": 32, **_LLAMA_DEFAULTS, "seq_len": 2048, "n_kv_heads": 32, "vocab": 32000, "vocab_blocks": 4,
         "eps": 1e-5, "dtype": "float16", "phase": "prefill", "context": 0, "context_blocks": 1,
         "attention": "fused"},  # fmt: skip
        {"tiny": {**_LLAMA_TINY, "layers": 2, "n_kv_heads": 2, "head_blocks": 2, "vocab": 64},
         "small": {**_LLAMA_SMALL, "layers": 4, "n_kv_heads": 8, "vocab": 8000}, "paper": {}},  # fmt: skip
        builders.llama_model,
        ref_llama_model,
        _LLAMA_DIVIDES[:3] + (("head_blocks", "n_kv_heads"), ("hidden_blocks", "hidden"), ("vocab_blocks", "vocab")),
    ),
    "random": _Workload(
        "random",
        "layered random DAG with lognormal costs (no op specs)",
        {"num_ops": 200, "width": 8, "max_fan_in": 3, "window": 2, "flops_median": 1e10, "flops_sigma": 1.0,
         "bytes_median": 1.6e7, "bytes_sigma": 1.0, "seed": 0},  # fmt: skip
        {
            "tiny": {"num_ops": 24, "width": 4, "flops_median": 1e5, "bytes_median": 1e3},
            "small": {"num_ops": 200, "flops_median": 1e7, "bytes_median": 1e5},
            "paper": {},
        },
        None,
        None,
        (),
    ),
}

_POSITIVE_INT_EXCEPT = {"seed", "context"}  # ints that may be 0 (a seed: any integer >= 0; no KV cache)
#: the largest graphs a workload may build (checked before anything is allocated: a tiled workload's ops are
#: counted first, docs/cli.md)
MAX_OPS = 2_000_000
#: the most decoder layers ``llama_model`` builds (the largest published LLMs have under 200)
MAX_LAYERS = 1000
#: the longest KV cache ``llama_model --set phase=decode`` attends to (``context``, in positions)
MAX_CONTEXT = 1_000_000
#: the phases ``llama_model`` builds
PHASES = ("prefill", "decode")
#: ``llama_model``'s attention: one fused op per block (FlashAttention's kernel), or the score tensor
#: materialised and masked, softmax in passes over it, then the weighted values
ATTENTIONS = ("fused", "unfused")
#: the most edges a ``random`` graph may ask for (``num_ops x max_fan_in``)
MAX_EDGES = 20_000_000
_NONNEG_FLOAT = {"flops_sigma", "bytes_sigma"}


def list_workloads() -> list[str]:
    return list(WORKLOADS)


def _get(name: str) -> _Workload:
    w = WORKLOADS.get(name) if isinstance(name, str) else None
    if w is None:
        raise WorkloadError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})")
    return w


def describe(name: str) -> dict[str, Any]:
    """A workload's description, its parameters' defaults and what each size preset overrides."""
    w = _get(name)
    return {"name": w.name, "description": w.description, "defaults": dict(w.defaults),
            "presets": {size: dict(w.presets.get(size, {})) for size in SIZES}}


def param_spec(name: str) -> dict[str, Any]:
    """Accepted keys of a workload with their defaults (the ``paper`` size), ``size`` first."""
    return {"size": "paper", **_get(name).defaults}


def _coerce(workload: str, key: str, value: Any, default: Any) -> Any:
    bad = f"{workload}: {key}={value!r} must be "
    if isinstance(default, str):
        if not isinstance(value, str):
            raise WorkloadError(bad + "a string")
        return value
    if isinstance(default, int):
        if isinstance(value, (bool, np.bool_)):
            raise WorkloadError(bad + "an integer")
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
            return int(value)
        raise WorkloadError(bad + "an integer")
    if isinstance(default, float):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise WorkloadError(bad + "a number")
        if not math.isfinite(float(value)):
            raise WorkloadError(bad + "finite")
        return float(value)
    return value


def _resolve(name: str, params: Mapping[str, Any]) -> tuple[_Workload, dict[str, Any], int]:
    """The workload, its parameters (defaults, preset, then ``params``, each checked) and its op count."""
    w = _get(name)
    size = params.get("size", "paper")
    if size not in SIZES:
        raise WorkloadError(f"{name}: size={size!r} must be one of {', '.join(SIZES)}")
    unknown = [k for k in params if k != "size" and k not in w.defaults]
    if unknown:
        raise WorkloadError(
            f"{name}: unknown parameter {unknown[0]!r} (accepted: size, {', '.join(w.defaults)})"
        )
    p: dict[str, Any] = {"size": size, **w.defaults, **w.presets[size]}
    for k, v in params.items():
        if k != "size":
            p[k] = _coerce(name, k, v, w.defaults[k])
    for k, v in p.items():
        d = w.defaults.get(k)
        if isinstance(d, int) and not isinstance(d, bool) and k not in _POSITIVE_INT_EXCEPT and v < 1:
            raise WorkloadError(f"{name}: {k}={v} must be a positive integer")
        if k in _POSITIVE_INT_EXCEPT and v < 0:
            raise WorkloadError(f"{name}: {k}={v} must be an integer >= 0")
        if isinstance(d, float) and (v < 0 if k in _NONNEG_FLOAT else v <= 0):
            raise WorkloadError(f"{name}: {k}={v} must be {'>= 0' if k in _NONNEG_FLOAT else '> 0'}")
    if "dtype" in p and p["dtype"] not in DTYPE_BYTES:
        raise WorkloadError(f"{name}: dtype={p['dtype']!r} must be one of {', '.join(DTYPE_BYTES)}")
    if p.get("num_ops", 0) > MAX_OPS:
        raise WorkloadError(f"{name}: num_ops={p['num_ops']} is over the maximum of {MAX_OPS}")
    if "max_fan_in" in p and p["num_ops"] * p["max_fan_in"] > MAX_EDGES:
        raise WorkloadError(f"{name}: num_ops x max_fan_in = {p['num_ops'] * p['max_fan_in']} is over the maximum of "
                            f"{MAX_EDGES} edges")  # fmt: skip
    if "phase" in p:
        _check_phase(name, p, params)
    if "attention" in p and p["attention"] not in ATTENTIONS:
        raise WorkloadError(f"{name}: attention={p['attention']!r} must be one of {', '.join(ATTENTIONS)}")
    for bk, dk in w.divides:
        if p[dk] % p[bk]:
            raise WorkloadError(f"{name}: {bk}={p[bk]} does not divide {dk}={p[dk]}")
    if "n_kv_heads" in p and p["n_heads"] % p["n_kv_heads"]:
        raise WorkloadError(f"{name}: n_kv_heads={p['n_kv_heads']} does not divide n_heads={p['n_heads']}")
    if p.get("layers", 0) > MAX_LAYERS:
        raise WorkloadError(f"{name}: layers={p['layers']} is over the maximum of {MAX_LAYERS}")
    if "head_dim" in p and p["head_dim"] % 2:
        raise WorkloadError(f"{name}: head_dim={p['head_dim']} must be even (rotary embedding)")
    if w.ops is None:
        return w, p, p["num_ops"]
    counter = TileBuilder(name, p["dtype"], count_only=True)  # its tile ops, counted without making any
    w.ops(counter, p)
    if counter.counted > MAX_OPS:
        raise WorkloadError(f"{name}: these block counts make {counter.counted:,} tile ops, over the maximum of "
                            f"{MAX_OPS:,} (use fewer blocks)")  # fmt: skip
    return w, p, counter.counted


def _check_phase(name: str, p: dict[str, Any], given: Mapping[str, Any]) -> None:
    """``llama_model``'s phase keys: ``phase`` is prefill or decode; a decode step has ``context`` in
    1..:data:`MAX_CONTEXT` and one new token per sequence (``seq_len`` 1: set here, refused if given otherwise);
    ``context`` and ``context_blocks`` belong to decode (a prefill attends to its own tokens): refused with
    prefill rather than ignored, so a graph never records a cache it does not have."""
    phase, n = p["phase"], p["context"]
    if phase not in PHASES:
        raise WorkloadError(f"{name}: phase={phase!r} must be one of {', '.join(PHASES)}")
    if phase == "prefill":
        for key, default in (("context", 0), ("context_blocks", 1)):
            if p[key] != default:
                raise WorkloadError(f"{name}: {key}={p[key]} applies to phase=decode only (a prefill attends to its "
                                    "own seq_len tokens)")  # fmt: skip
        return
    if not 1 <= n <= MAX_CONTEXT:
        raise WorkloadError(f"{name}: context={n} must be 1 to {MAX_CONTEXT:,} with phase=decode (the KV cache's "
                            "length in positions)")  # fmt: skip
    for key in ("seq_len", "seq_blocks"):
        if key in given and p[key] != 1:
            raise WorkloadError(f"{name}: {key}={p[key]} with phase=decode: a decode step has one new token per "
                                "sequence (seq_len=1); the cache's length is context, split by context_blocks")  # fmt: skip
    p["seq_len"] = 1
    if n % p["context_blocks"]:
        raise WorkloadError(f"{name}: context_blocks={p['context_blocks']} does not divide context={n}")


def count_ops(name: str, **params: Any) -> int:
    """How many ops :func:`build` makes with these parameters, counted without making any (in milliseconds);
    raises what :func:`build` raises for parameters it refuses, the maximum size among them."""
    return _resolve(name, params)[2]


def build(name: str, **params: Any) -> DataflowGraph:
    """Build workload ``name`` (see :func:`list_workloads`, :func:`param_spec`)."""
    w, p, _ = _resolve(name, params)
    if w.ops is None:
        return builders.random_dag(p)
    b = TileBuilder(name, p["dtype"])
    w.ops(b, p)
    g = b.finish(name, p)
    if "phase" in p:  # a serving step: what it computes, for the methods and reports that read it
        g.meta.update(phase=p["phase"], batch=p["batch"], context=p["context"])
    return g


def parse_set(items: Sequence[str], workload: str | None = None) -> dict[str, Any]:
    """Parse ``["key=value", ...]`` (the CLI's ``--set``). With ``workload``, keys are
    checked and values converted by the type of the key's default; without it,
    values become int, else float, else str."""
    spec = param_spec(workload) if workload is not None else None
    out: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str) or "=" not in item:
            raise WorkloadError(f"--set {item!r}: expected key=value")
        key, _, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not key:
            raise WorkloadError(f"--set {item!r}: empty key")
        if key in out:
            raise WorkloadError(f"--set {item!r}: {key} is set twice")
        if spec is None:
            out[key] = _guess(text)
            continue
        if key not in spec:
            raise WorkloadError(f"{workload}: unknown parameter {key!r} (accepted: {', '.join(spec)})")
        default = spec[key]
        try:
            if isinstance(default, int):
                try:
                    out[key] = int(text)
                except ValueError:
                    f = float(text)
                    if not f.is_integer():
                        raise
                    out[key] = int(f)
            elif isinstance(default, float):
                out[key] = float(text)
            else:
                out[key] = text
        except ValueError:
            kind = type(default).__name__
            raise WorkloadError(f"{workload}: {key}={text!r} is not a valid {kind}") from None
    return out


def _guess(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


# ============================================================ end-to-end check
def reference(graph: DataflowGraph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Untiled plain-numpy outputs of the workload ``graph`` was built from."""
    name = graph.meta.get("workload")
    w = _get(name)
    if w.reference is None:
        raise WorkloadError(f"{name}: has no reference computation (random graphs carry no semantics)")
    return w.reference(graph.meta["params"], inputs)
