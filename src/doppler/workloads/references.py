"""Plain-numpy references of the built-in workloads, and the input/output helpers of an end-to-end
check: :func:`make_inputs` (random full inputs from a graph's metadata), :func:`assemble_outputs`
(output tiles stitched into full arrays). ``doppler.workloads.reference`` picks a graph's
reference from its metadata.
"""

from __future__ import annotations

import math
import os
import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from doppler.ir.graph import DataflowGraph
from doppler.workloads.tiling import WorkloadError

__all__ = ["assemble_outputs", "llama_model_forward", "make_inputs", "require_values"]


def _np_softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    z = z - z.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def ref_chainmm(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"Y": x["A"] @ x["B"] + x["C"] @ (x["D"] @ x["E"])}


def ref_ffnn(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    h = np.maximum(x["X"] @ x["W1"] + x["b1"], 0.0)
    return {"Y": _np_softmax(h @ x["W2"] + x["b2"], axis=1)}


def _rope_tables(s: int, hd: int, theta: float, position: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of the rotary angles of positions ``position .. position + s - 1``, (s, hd) each."""
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(position, position + s, dtype=np.float64)[:, None] * inv[None, :]
    emb = np.concatenate([ang, ang], axis=1)
    return np.cos(emb), np.sin(emb)


def _np_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _np_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # x: (..., seq, hd); cos/sin: (seq, hd); HF "rotate_half" convention
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def ref_llama_hidden(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> np.ndarray:
    B, s, D, H, hd = p["batch"], p["seq_len"], p["dim"], p["n_heads"], p["head_dim"]
    h0 = x["x"]  # (B, s, D)

    def heads(w: np.ndarray) -> np.ndarray:  # (B, s, D) @ (D, H, hd) -> (B, H, s, hd)
        return (xn @ w.reshape(D, H * hd)).reshape(B, s, H, hd).transpose(0, 2, 1, 3)

    xn = _np_rmsnorm(h0, x["w_attn_norm"], p["eps"])
    q = _np_rope(heads(x["w_q"]), x["rope_cos"], x["rope_sin"])
    k = _np_rope(heads(x["w_k"]), x["rope_cos"], x["rope_sin"])
    v = heads(x["w_v"])
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)  # (B, H, s, s): no attention across sequences
    future = np.triu(np.ones((s, s), dtype=bool), k=1)
    att = np.where(future, -np.inf, att)
    o = _np_softmax(att, axis=-1) @ v  # (B, H, s, hd)
    o = o.transpose(0, 2, 1, 3).reshape(B, s, H * hd) @ x["w_o"].reshape(H * hd, D)
    h1 = h0 + o
    hn = _np_rmsnorm(h1, x["w_mlp_norm"], p["eps"])
    g = hn @ x["w_gate"]
    mlp = (g / (1.0 + np.exp(-g)) * (hn @ x["w_up"])) @ x["w_down"]
    return h1 + mlp


def ref_llama_block(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"out": ref_llama_hidden(p, x)}


def ref_llama_layer(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    h = _np_rmsnorm(ref_llama_hidden(p, x), x["w_final_norm"], p["eps"])
    return {"logits": h[:, -1, :] @ x["w_head"]}  # last token of every sequence: (B, vocab)


def ref_llama_model(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """:func:`doppler.workloads` ``llama_model``: query head ``j * R + r`` reads key/value head ``j``; a decode step
    attends to its layer's cache (``layers.{i}.k_cache``, ``v_cache``) and its own key and value."""
    return {"logits": llama_model_forward(p, x)[0]}


def llama_model_forward(p: dict[str, Any], x: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[tuple[np.ndarray, ...]]]:
    """``llama_model``'s logits (batch, vocab) and, per layer, the keys (rotated) and values of every position
    it attended to, (batch, positions, n_kv_heads, head_dim) each: what a KV cache holds after this step. With
    ``phase=decode`` the positions are the cache's then the new token's."""
    cos, sin, hd = x["rope_cos"], x["rope_sin"], p["head_dim"]
    decode = p.get("phase", "prefill") == "decode"
    h = x["embed_tokens"][x["tokens"].astype(np.int64)]  # (B, s, D)
    future = np.triu(np.ones((p["seq_len"],) * 2, dtype=bool), k=1)
    caches = []
    for i in range(p["layers"]):
        w = {key[len(f"layers.{i}."):]: v for key, v in x.items() if key.startswith(f"layers.{i}.")}
        xn = _np_rmsnorm(h, w["w_attn_norm"], p["eps"])
        q = _np_rope(np.einsum("bsk,kjrd->bjrsd", xn, w["w_q"]), cos, sin)
        k = _np_rope(np.einsum("bsk,kjd->bjsd", xn, w["w_k"]), cos, sin)
        v = np.einsum("bsk,kjd->bjsd", xn, w["w_v"])
        if decode:  # (the cache is (B, N, J, hd); every cached position precedes the new token: no mask)
            k = np.concatenate([w["k_cache"].transpose(0, 2, 1, 3), k], axis=2)
            v = np.concatenate([w["v_cache"].transpose(0, 2, 1, 3), v], axis=2)
        caches.append((k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)))
        att = np.einsum("bjrqd,bjkd->bjrqk", q, k) / math.sqrt(hd)
        if not decode:
            att = np.where(future, -np.inf, att)
        o = np.einsum("bjrqk,bjkd->bqjrd", _np_softmax(att, axis=-1), v)
        h = h + np.einsum("bqjrd,jrdo->bqo", o, w["w_o"])
        hn = _np_rmsnorm(h, w["w_mlp_norm"], p["eps"])
        g = hn @ w["w_gate"]
        h = h + (g / (1.0 + np.exp(-g)) * (hn @ w["w_up"])) @ w["w_down"]
    return _np_rmsnorm(h[:, -1, :], x["w_final_norm"], p["eps"]) @ x["w_head"], caches


def require_values(graph: DataflowGraph, source: str) -> None:
    """Refuse a cost-only graph (``meta["cost_only"]``: a model imported from the meta device) where values
    are needed: it has the costs, shapes and modules of its ops but no weights or constants to compute with.
    Raises :class:`WorkloadError` naming ``source`` (the graph file, or the graph)."""
    reason = graph.meta.get("cost_only")
    if reason:
        from doppler.ir.graph import NO_WEIGHTS

        weights_only = reason == NO_WEIGHTS  # its constants are recorded: a checkpoint runs it
        raise WorkloadError(f"{source}: built on the meta device (cost-only), it has no weights"
                            f"{'' if weights_only else ' or constants'} to execute; simulate, assign, compare and "
                            f"train work on it{', and execute --weights loads its weights' if weights_only else ''}")  # fmt: skip


#: the most bytes making a graph's full inputs may take (:func:`make_inputs`: the inputs at their dtype, and a
#: chunk drawn in float64): the built-in layer-sized workloads at their default sizes take at most 2.7 GB
#: (``chainmm`` and ``llama_layer`` with ``execute --check``, in float64); a whole ``llama_model`` is for simulation
MAX_INPUT_BYTES = 4 << 30
#: the elements of an input drawn at a time (in float64, then written into the input at its dtype): the draw
#: takes this many float64 numbers twice (the draw and its scaled copy), not the whole input's
DRAW_CHUNK = 1 << 22
#: the share of the memory available when a graph's inputs are made that they may take: the run's tiles and
#: outputs need the rest
INPUT_MEMORY_SHARE = 0.5


def available_memory_bytes() -> float:
    """The bytes this process may still allocate: the machine's available memory (``MemAvailable`` of
    ``/proc/meminfo``, else its physical memory), less where an address-space limit (``ulimit -v``) is lower."""
    import resource

    avail = float("inf")
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = float(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if math.isinf(avail):
        try:
            avail = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as f:
                used = float(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            used = 0.0
        avail = min(avail, soft - used)
    return avail


def _check_input_memory(graph: DataflowGraph, dtype: Any, shapes: dict[str, Any]) -> None:
    """WorkloadError unless making the inputs ``shapes`` at ``dtype`` (drawn :data:`DRAW_CHUNK` elements at a
    time in float64) takes at most :data:`MAX_INPUT_BYTES` and :data:`INPUT_MEMORY_SHARE` of the memory available
    now, and its largest op output fits the rest: before anything is allocated for them."""
    itemsize = np.dtype(dtype).itemsize
    elements = [math.prod(int(d) for d in shape) for shape in shapes.values()]
    need = sum(elements) * itemsize + min(max(elements, default=0), DRAW_CHUNK) * 16  # (the inputs, a chunk drawn)
    largest = max((math.prod(int(d) for d in spec["shape"]) for spec in graph.specs or ()
                   if isinstance(spec, dict) and isinstance(spec.get("shape"), list)), default=0) * itemsize  # fmt: skip
    avail = available_memory_bytes()
    as_dtype = f"as {np.dtype(dtype).name}"
    if need > MAX_INPUT_BYTES:
        raise WorkloadError(f"graph {graph.name!r}: making its inputs takes {need:,} bytes {as_dtype}, more than the "
                            f"{MAX_INPUT_BYTES:,} doppler makes")  # fmt: skip
    if need > INPUT_MEMORY_SHARE * avail:
        raise WorkloadError(f"graph {graph.name!r}: making its inputs takes {need:,} bytes {as_dtype}, more than "
                            f"{INPUT_MEMORY_SHARE:.0%} of the {avail:,.0f} bytes of memory available")  # fmt: skip
    if need + largest > avail:
        raise WorkloadError(f"graph {graph.name!r}: its inputs and its largest op output take {need + largest:,} bytes "
                            f"{as_dtype}, more than the {avail:,.0f} bytes of memory available")  # fmt: skip


def make_inputs(graph: DataflowGraph, seed: int = 0, dtype: Any = np.float64,
                names: Sequence[str] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Random full input arrays for a workload graph (rotary tables are the real ones); a cost-only graph
    is refused (:func:`require_values`). ``names``: only these inputs (each must have a value to draw: the
    weights of a cost-only graph come from a checkpoint instead). Inputs that would take more than
    :data:`MAX_INPUT_BYTES` to make, or more than the machine can hold (:data:`INPUT_MEMORY_SHARE` of the
    memory available, and room left for the largest op output), are refused before anything is allocated."""
    meta = graph.meta
    if names is None:
        require_values(graph, f"graph {graph.name!r}")
    if "inputs" not in meta:
        raise WorkloadError(f"graph {graph.name!r} has no workload metadata (meta['inputs'])")
    init = meta.get("input_init", {})
    out: dict[str, np.ndarray] = {}
    wanted = meta["inputs"] if names is None else {n: meta["inputs"][n] for n in names if n in meta["inputs"]}
    _check_input_memory(graph, dtype, wanted)
    for name, shape in wanted.items():
        shape = tuple(int(s) for s in shape)
        how = init.get(name, {"init": "normal", "std": 1.0})
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(name.encode())])
        kind = how.get("init", "normal")
        if kind == "normal":
            mean, std = float(how.get("mean", 0.0)), float(how.get("std", 1.0))
            arr = _drawn(shape, dtype, lambda k: mean + rng.standard_normal(k) * std)
        elif kind == "norm_weight":
            arr = _drawn(shape, dtype, lambda k: 1.0 + 0.1 * rng.standard_normal(k))
        elif kind == "index":  # token ids: integers in [0, high), stored as floats like every tile
            high = int(how["high"])
            arr = _drawn(shape, dtype, lambda k: rng.integers(0, high, size=k))
        elif kind in ("rope_cos", "rope_sin"):
            at = how.get("position", 0)
            if isinstance(at, bool) or not isinstance(at, int) or at < 0:
                raise WorkloadError(f"input {name!r}: position {at!r:.40} must be an integer >= 0")
            cos, sin = _rope_tables(shape[0], shape[1], float(how.get("theta", 10000.0)), at)
            arr = cos if kind == "rope_cos" else sin
        elif kind == "value":  # a constant recorded in the graph (e.g. folded from an imported model)
            arr = np.asarray(how["data"], dtype=np.float64)
            if arr.shape != shape:
                raise WorkloadError(f"input {name!r}: recorded value has shape {list(arr.shape)}, expected {list(shape)}")
        elif kind == "meta":
            raise WorkloadError(f"graph {graph.name!r}: input {name!r} has no value (built on the meta device)")
        else:
            raise WorkloadError(f"input {name!r}: unknown init {kind!r}")
        out[name] = np.asarray(arr, dtype=dtype)  # (a drawn input is of dtype already: no copy)
    return out


def _drawn(shape: tuple[int, ...], dtype: Any, draw: Any) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` filled in order by ``draw(k)`` (k numbers, in float64 or int64) for
    :data:`DRAW_CHUNK` elements at a time: the same numbers one draw of the whole shape gives (numpy's generators
    draw element by element), holding one chunk in float64 instead of the whole input."""
    arr = np.empty(shape, dtype=dtype)
    flat = arr.reshape(-1)
    for start in range(0, flat.size, DRAW_CHUNK):
        stop = min(start + DRAW_CHUNK, flat.size)
        flat[start:stop] = draw(stop - start)
    return arr


def assemble_outputs(graph: DataflowGraph, values: Sequence[np.ndarray | None]) -> dict[str, np.ndarray]:
    """Stitch the output tiles (from :func:`evaluate_numpy` or an engine) into full arrays."""
    result: dict[str, np.ndarray] = {}
    for name, info in graph.meta.get("outputs", {}).items():
        tiles = info["tiles"]
        first = values[tiles[0][0]]
        if first is None:
            raise WorkloadError(f"output {name!r}: op {tiles[0][0]} has no value")
        full = np.empty(tuple(info["shape"]), dtype=np.asarray(first).dtype)
        for op, sl in tiles:
            v = values[op]
            if v is None:
                raise WorkloadError(f"output {name!r}: op {op} has no value")
            full[tuple(slice(lo, hi) for lo, hi in sl)] = v
        result[name] = full
    return result
