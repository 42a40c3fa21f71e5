"""The ops of each workload family, declared on a :class:`~doppler.workloads.tiling.TileBuilder` from resolved
parameters (:func:`doppler.workloads.build` resolves them): ``chainmm``, ``ffnn``, the LLaMA family
(``llama_block``, ``llama_layer``, ``llama_model`` with its prefill, decode over a KV cache and fused or unfused
attention) and ``random_dag``, which makes a graph directly (no tiles, no specs)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from doppler.ir.graph import DataflowGraph, OpKind
from doppler.workloads.tiling import Tensor, TileBuilder, WorkloadError, tiled_rmsnorm, tiled_softmax


def _normal(std: float) -> dict[str, Any]:
    return {"init": "normal", "std": float(std)}


def chainmm(b: TileBuilder, p: dict[str, Any]) -> None:
    n, rb, cb, ib = p["n"], p["row_blocks"], p["col_blocks"], p["inner_blocks"]
    A = b.input("A", (n, n), (rb, ib))
    B = b.input("B", (n, n), (ib, cb))
    C = b.input("C", (n, n), (rb, ib))
    D = b.input("D", (n, n), (ib, ib))
    E = b.input("E", (n, n), (ib, cb))
    de = b.contract("ik,kj->ij", D, E, name="DE")
    cde = b.contract("ik,kj->ij", C, de, name="C_DE")
    ab = b.contract("ik,kj->ij", A, B, name="AB")
    y = b.map("add", "ij,ij->ij", ab, cde, name="Y")
    b.output("Y", y)


def ffnn(b: TileBuilder, p: dict[str, Any]) -> None:
    bs, di, dh, do = p["batch"], p["d_in"], p["d_hidden"], p["d_out"]
    bb, ib, hb, ob = p["batch_blocks"], p["in_blocks"], p["hidden_blocks"], p["out_blocks"]
    X = b.input("X", (bs, di), (bb, ib), user=True)
    W1 = b.input("W1", (di, dh), (ib, hb), _normal(1 / math.sqrt(di)))
    b1 = b.input("b1", (dh,), (hb,), _normal(0.1))
    W2 = b.input("W2", (dh, do), (hb, ob), _normal(1 / math.sqrt(dh)))
    b2 = b.input("b2", (do,), (ob,), _normal(0.1))
    h = b.contract("bi,ih->bh", X, W1, name="fc1")
    h = b.map("add", "bh,h->bh", h, b1, name="bias1")
    h = b.map("relu", "bh->bh", h, name="relu")
    y = b.contract("bh,ho->bo", h, W2, name="fc2")
    y = b.map("add", "bo,o->bo", y, b2, name="bias2")
    y = tiled_softmax(b, y, "bo", "o", scale=1.0, name="softmax")
    b.output("Y", y)


def _llama_inputs(b: TileBuilder, p: dict[str, Any]) -> dict[str, Tensor]:
    B, s, D, H, hd, F = p["batch"], p["seq_len"], p["dim"], p["n_heads"], p["head_dim"], p["hidden"]
    bb, sb, db, hb, fb = p["batch_blocks"], p["seq_blocks"], p["dim_blocks"], p["head_blocks"], p["hidden_blocks"]
    norm_w = {"init": "norm_weight"}
    return {
        "x": b.input("x", (B, s, D), (bb, sb, db), user=True),
        "w_attn_norm": b.input("w_attn_norm", (D,), (db,), norm_w),
        "w_q": b.input("w_q", (D, H, hd), (db, hb, 1), _normal(1 / math.sqrt(D))),
        "w_k": b.input("w_k", (D, H, hd), (db, hb, 1), _normal(1 / math.sqrt(D))),
        "w_v": b.input("w_v", (D, H, hd), (db, hb, 1), _normal(1 / math.sqrt(D))),
        "w_o": b.input("w_o", (H, hd, D), (hb, 1, db), _normal(1 / math.sqrt(H * hd))),
        "w_mlp_norm": b.input("w_mlp_norm", (D,), (db,), norm_w),
        "w_gate": b.input("w_gate", (D, F), (db, fb), _normal(1 / math.sqrt(D))),
        "w_up": b.input("w_up", (D, F), (db, fb), _normal(1 / math.sqrt(D))),
        "w_down": b.input("w_down", (F, D), (fb, db), _normal(1 / math.sqrt(F))),
        "rope_cos": b.input("rope_cos", (s, hd), (sb, 1), {"init": "rope_cos", "theta": float(p["rope_theta"])}),
        "rope_sin": b.input("rope_sin", (s, hd), (sb, 1), {"init": "rope_sin", "theta": float(p["rope_theta"])}),
    }


def _llama_block_ops(b: TileBuilder, p: dict[str, Any], t: dict[str, Tensor], *, mask_fill: bool) -> Tensor:
    """One decoder block on the (batch, seq, dim) activations ``t['x']``.

    Letter ``b`` is the batch: every sequence attends only to itself (causally), so
    the attention scores are per sequence (``bhqk``) and the causal mask is
    broadcast over the batch; the rotary tables (seq, head_dim) are shared too.
    """
    s, hd = p["seq_len"], p["head_dim"]
    sb = p["seq_blocks"]
    x = t["x"]
    xn = tiled_rmsnorm(b, x, t["w_attn_norm"], eps=p["eps"], name="attn_norm")
    q = b.contract("bsk,khd->bshd", xn, t["w_q"], name="q_proj")
    k = b.contract("bsk,khd->bshd", xn, t["w_k"], name="k_proj")
    v = b.contract("bsk,khd->bshd", xn, t["w_v"], name="v_proj")
    rope = (t["rope_cos"], t["rope_sin"])
    q = b.map("rotary", "bshd,sd,sd->bshd", q, *rope, name="q_rope", kind=OpKind.ROTARY)
    k = b.map("rotary", "bshd,sd,sd->bshd", k, *rope, name="k_rope", kind=OpKind.ROTARY)
    scores = b.contract("bqhd,bkhd->bhqk", q, k, name="scores")
    if mask_fill:
        mask = b.fill("causal_mask", "qk", (s, s), (sb, sb), name="causal_mask",
                      tile_params=lambda off: {"row_offset": off["q"], "col_offset": off["k"]})  # fmt: skip
        scores = b.map("add", "bhqk,qk->bhqk", scores, mask, name="mask_add", kind=OpKind.MASK_FILL)
    else:
        scores = b.map("causal_mask", "bhqk->bhqk", scores, name="mask", kind=OpKind.MASK_FILL,
                       params={"row_axis": 2, "col_axis": 3},
                       tile_params=lambda off: {"row_offset": off["q"], "col_offset": off["k"]})  # fmt: skip
    probs = tiled_softmax(b, scores, "bhqk", "k", scale=1.0 / math.sqrt(hd), name="attn_softmax")
    attn = b.contract("bhqk,bkhd->bqhd", probs, v, name="pv")
    o = b.contract("bqhd,hdo->bqo", attn, t["w_o"], name="o_proj")
    h1 = b.map("add", "bsd,bsd->bsd", x, o, name="attn_residual")
    hn = tiled_rmsnorm(b, h1, t["w_mlp_norm"], eps=p["eps"], name="mlp_norm")
    g = b.contract("bsd,df->bsf", hn, t["w_gate"], name="gate_proj")
    u = b.contract("bsd,df->bsf", hn, t["w_up"], name="up_proj")
    a = b.map("silu_mul", "bsf,bsf->bsf", g, u, name="silu_mul")
    dn = b.contract("bsf,fd->bsd", a, t["w_down"], name="down_proj")
    return b.map("add", "bsd,bsd->bsd", h1, dn, name="mlp_residual")


def llama_block(b: TileBuilder, p: dict[str, Any]) -> None:
    t = _llama_inputs(b, p)
    out = _llama_block_ops(b, p, t, mask_fill=False)
    b.output("out", out)


def llama_layer(b: TileBuilder, p: dict[str, Any]) -> None:
    t = _llama_inputs(b, p)
    D, V = p["dim"], p["vocab"]
    w_norm = b.input("w_final_norm", (D,), (p["dim_blocks"],), {"init": "norm_weight"})
    w_head = b.input("w_head", (D, V), (p["dim_blocks"], p["vocab_blocks"]), _normal(1 / math.sqrt(D)))
    h = _llama_block_ops(b, p, t, mask_fill=True)
    # the last token of every sequence: (batch, 1, dim); lm_head contracts the unit seq axis away
    last = b.select(h, [None, (p["seq_len"] - 1, p["seq_len"]), None], name="last_token")
    hn = tiled_rmsnorm(b, last, w_norm, eps=p["eps"], name="final_norm")
    logits = b.contract("bsd,dv->bv", hn, w_head, name="lm_head")
    b.output("logits", logits)


def _decoder_layer(b: TileBuilder, p: dict[str, Any], x: Tensor, rope: tuple[Tensor, Tensor], i: int) -> Tensor:
    """Decoder layer ``i`` of :func:`llama_model` on the (batch, seq, dim) hidden states ``x``, with grouped-query
    attention: letter ``j`` is a key/value head, ``r`` one of the ``n_heads / n_kv_heads`` query heads sharing it
    (query head ``j * R + r``, as Hugging Face's ``repeat_kv`` orders them)."""
    D, J, hd, F = p["dim"], p["n_kv_heads"], p["head_dim"], p["hidden"]
    R = p["n_heads"] // J
    db, hb, fb = p["dim_blocks"], p["head_blocks"], p["hidden_blocks"]
    path, name = f"model.layers.{i}", f"layers.{i}"
    norm_w = {"init": "norm_weight"}

    def w(key: str, shape: tuple[int, ...], grid: tuple[int, ...], fan_in: int) -> Tensor:
        return b.input(f"{name}.{key}", shape, grid, _normal(1 / math.sqrt(fan_in)))

    with b.scope(f"{path}.input_layernorm"):
        xn = tiled_rmsnorm(b, x, b.input(f"{name}.w_attn_norm", (D,), (db,), norm_w), eps=p["eps"],
                           name=f"{name}.attn_norm")  # fmt: skip
    attn = f"{path}.self_attn"
    with b.scope(f"{attn}.q_proj"):
        q = b.contract("bsk,kjrd->bsjrd", xn, w("w_q", (D, J, R, hd), (db, hb, 1, 1), D), name=f"{name}.q_proj")
    with b.scope(f"{attn}.k_proj"):
        k = b.contract("bsk,kjd->bsjd", xn, w("w_k", (D, J, hd), (db, hb, 1), D), name=f"{name}.k_proj")
    with b.scope(f"{attn}.v_proj"):
        v = b.contract("bsk,kjd->bsjd", xn, w("w_v", (D, J, hd), (db, hb, 1), D), name=f"{name}.v_proj")
    with b.scope(attn):
        q = b.map("rotary", "bsjrd,sd,sd->bsjrd", q, *rope, name=f"{name}.q_rope", kind=OpKind.ROTARY)
        k = b.map("rotary", "bsjd,sd,sd->bsjd", k, *rope, name=f"{name}.k_rope", kind=OpKind.ROTARY)
        if p["attention"] == "fused":
            heads = _fused_attention(b, p, q, k, v, name)
        elif p["phase"] == "decode":
            heads = _cached_attention(b, p, q, k, v, name)
        else:
            scores = b.contract("bqjrd,bkjd->bjrqk", q, k, name=f"{name}.scores")
            scores = b.map("causal_mask", "bjrqk->bjrqk", scores, name=f"{name}.mask", kind=OpKind.MASK_FILL,
                           params={"row_axis": 3, "col_axis": 4},
                           tile_params=lambda off: {"row_offset": off["q"], "col_offset": off["k"]})  # fmt: skip
            probs = tiled_softmax(b, scores, "bjrqk", "k", scale=1.0 / math.sqrt(hd), name=f"{name}.attn_softmax")
            heads = b.contract("bjrqk,bkjd->bqjrd", probs, v, name=f"{name}.pv")
    with b.scope(f"{attn}.o_proj"):
        o = b.contract("bqjrd,jrdo->bqo", heads, w("w_o", (J, R, hd, D), (hb, 1, 1, db), J * R * hd),
                       name=f"{name}.o_proj")  # fmt: skip
    with b.scope(path):
        h = b.map("add", "bsd,bsd->bsd", x, o, name=f"{name}.attn_residual")
    with b.scope(f"{path}.post_attention_layernorm"):
        hn = tiled_rmsnorm(b, h, b.input(f"{name}.w_mlp_norm", (D,), (db,), norm_w), eps=p["eps"],
                           name=f"{name}.mlp_norm")  # fmt: skip
    mlp = f"{path}.mlp"
    with b.scope(f"{mlp}.gate_proj"):
        g = b.contract("bsd,df->bsf", hn, w("w_gate", (D, F), (db, fb), D), name=f"{name}.gate_proj")
    with b.scope(f"{mlp}.up_proj"):
        u = b.contract("bsd,df->bsf", hn, w("w_up", (D, F), (db, fb), D), name=f"{name}.up_proj")
    with b.scope(mlp):
        a = b.map("silu_mul", "bsf,bsf->bsf", g, u, name=f"{name}.silu_mul")
    with b.scope(f"{mlp}.down_proj"):
        dn = b.contract("bsf,fd->bsd", a, w("w_down", (F, D), (fb, db), F), name=f"{name}.down_proj")
    with b.scope(path):
        return b.map("add", "bsd,bsd->bsd", h, dn, name=f"{name}.mlp_residual")


def _kv_cache(b: TileBuilder, p: dict[str, Any], name: str) -> tuple[Tensor, Tensor]:
    """Layer ``name``'s key/value cache of ``context`` positions (graph inputs ``{name}.k_cache`` and
    ``{name}.v_cache``, (batch, context, n_kv_heads, head_dim), split like the key/value projections and in
    ``context_blocks`` along the positions)."""
    B, N, J, hd = p["batch"], p["context"], p["n_kv_heads"], p["head_dim"]
    grid = (p["batch_blocks"], p["context_blocks"], p["head_blocks"], 1)
    return (b.input(f"{name}.k_cache", (B, N, J, hd), grid, _normal(1.0)),
            b.input(f"{name}.v_cache", (B, N, J, hd), grid, _normal(1.0)))  # fmt: skip


def _fused_attention(b: TileBuilder, p: dict[str, Any], q: Tensor, k: Tensor, v: Tensor, name: str) -> Tensor:
    """Layer ``name``'s attention as one fused op per (batch block, query block, kv-head block)
    (:meth:`~doppler.workloads.tiling.TileBuilder.attention`, FlashAttention's kernel): a prefill is causal over its own
    keys; a decode step's one new query attends, unmasked, to the cache (:func:`_kv_cache`, every block of it,
    as a split-K decode kernel reads them) and to its own key and value."""
    kv = [(k, v)] if p["phase"] == "prefill" else [_kv_cache(b, p, name), (k, v)]
    return b.attention(q, kv, name=f"{name}.attn", scale=1.0 / math.sqrt(p["head_dim"]), causal=p["phase"] == "prefill")


def _cached_attention(b: TileBuilder, p: dict[str, Any], q: Tensor, k: Tensor, v: Tensor, name: str) -> Tensor:
    """Unfused decode attention of layer ``name`` (``attention=unfused``): the one new query per sequence (``q``,
    rotated at position ``context``) attends to the layer's key/value cache (:func:`_kv_cache`) and to its own
    key/value ``k``, ``v``. The cache is not copied: the
    softmax over both parts is taken in two pieces and combined, as a split-K decode kernel does:
    ``m = max(max_k s_cache, s_new)``, ``e = exp((s - m) / sqrt(hd))``, and the heads are
    ``(e_cache . v_cache + e_new . v_new) / (sum e_cache + sum e_new)``. No mask: every cached position
    precedes the new token."""
    k_cache, v_cache = _kv_cache(b, p, name)
    scale = 1.0 / math.sqrt(p["head_dim"])
    s_old = b.contract("bqjrd,bkjd->bjrqk", q, k_cache, name=f"{name}.scores_cache")
    s_new = b.contract("bqjrd,bkjd->bjrqk", q, k, name=f"{name}.scores_new")
    m_old = b.reduce("bjrqk->bjrq", s_old, how="max", name=f"{name}.attn_max_cache", kind=OpKind.SOFTMAX)
    m_new = b.reduce("bjrqk->bjrq", s_new, how="max", name=f"{name}.attn_max_new", kind=OpKind.SOFTMAX)
    m = b.fold("max", m_old, m_new, name=f"{name}.attn_max", kind=OpKind.SOFTMAX)
    e_old = b.map("exp_sub", "bjrqk,bjrq->bjrqk", s_old, m, name=f"{name}.attn_exp_cache", kind=OpKind.SOFTMAX,
                  params={"scale": scale})  # fmt: skip
    e_new = b.map("exp_sub", "bjrqk,bjrq->bjrqk", s_new, m, name=f"{name}.attn_exp_new", kind=OpKind.SOFTMAX,
                  params={"scale": scale})  # fmt: skip
    z_old = b.reduce("bjrqk->bjrq", e_old, how="sum", name=f"{name}.attn_sum_cache", kind=OpKind.SOFTMAX)
    z_new = b.reduce("bjrqk->bjrq", e_new, how="sum", name=f"{name}.attn_sum_new", kind=OpKind.SOFTMAX)
    z = b.fold("sum", z_old, z_new, name=f"{name}.attn_sum", kind=OpKind.SOFTMAX)
    o_old = b.contract("bjrqk,bkjd->bqjrd", e_old, v_cache, name=f"{name}.pv_cache")
    o_new = b.contract("bjrqk,bkjd->bqjrd", e_new, v, name=f"{name}.pv_new")
    o = b.fold("sum", o_old, o_new, name=f"{name}.pv")
    return b.map("div", "bqjrd,bjrq->bqjrd", o, z, name=f"{name}.attn_div", kind=OpKind.SOFTMAX)


def llama_model(b: TileBuilder, p: dict[str, Any]) -> None:
    """A whole LLaMA-style causal LM: token embedding, ``layers`` decoder layers, the final RMSNorm and the
    vocabulary head on each sequence's last token (the logits generation samples from). Every logical op records
    its module as Hugging Face's ``LlamaForCausalLM`` names it (``model.layers.3.self_attn.q_proj``).

    ``attention=fused`` (the default): each layer's attention is one fused op per (batch, query, kv-head) block
    (:func:`_fused_attention`), as serving stacks run FlashAttention; ``attention=unfused``: the score tensor is
    materialised, masked and softmaxed in passes, then multiplied by the values (``llama_block`` and
    ``llama_layer``, the paper's workloads, are always unfused).

    ``phase=prefill``: ``batch`` sequences of ``seq_len`` tokens, causal attention within each. ``phase=decode``:
    one new token per sequence (``seq_len`` is 1) at position ``context``, attending to a key/value cache of
    ``context`` positions per layer (:func:`_cached_attention`); the cache is a graph input that is not a forward
    argument, so it is resident wherever it is read, as weights are (:mod:`doppler.memory`)."""
    B, s, D, V, hd = p["batch"], p["seq_len"], p["dim"], p["vocab"], p["head_dim"]
    bb, sb, db = p["batch_blocks"], p["seq_blocks"], p["dim_blocks"]
    tokens = b.input("tokens", (B, s), (bb, sb), {"init": "index", "high": V}, user=True)
    at = {"theta": float(p["rope_theta"]), "position": int(p["context"])}  # the new token's position (decode)
    rope = (b.input("rope_cos", (s, hd), (sb, 1), {"init": "rope_cos", **at}),
            b.input("rope_sin", (s, hd), (sb, 1), {"init": "rope_sin", **at}))  # fmt: skip
    with b.scope("model.embed_tokens"):
        table = b.input("embed_tokens", (V, D), (1, db), _normal(1.0))
        x = b.blockwise("embed_tokens", OpKind.SELECT, "embedding", (B, s, D), (bb, sb, db),
                        lambda blk: [dict(table.tiles[(0, blk[2])]), dict(tokens.tiles[blk[:2]])])  # fmt: skip
    for i in range(p["layers"]):
        x = _decoder_layer(b, p, x, rope, i)
    with b.scope("model.norm"):
        last = b.select(x, [None, (s - 1, s), None], name="last_token") if s > 1 else x
        hn = tiled_rmsnorm(b, last, b.input("w_final_norm", (D,), (db,), {"init": "norm_weight"}), eps=p["eps"],
                           name="final_norm")  # fmt: skip
    with b.scope("lm_head"):
        w_head = b.input("w_head", (D, V), (db, p["vocab_blocks"]), _normal(1 / math.sqrt(D)))
        b.output("logits", b.contract("bsd,dv->bv", hn, w_head, name="lm_head"))


def random_dag(p: dict[str, Any]) -> DataflowGraph:
    """Layered random DAG: ops are split into ~num_ops/width layers of random widths;
    every op past the first layer reads one op of the previous layer and up to
    ``max_fan_in - 1`` more from the ``window`` layers before it. Costs are lognormal."""
    n, width, fan, window = p["num_ops"], p["width"], p["max_fan_in"], p["window"]
    rng = np.random.default_rng(p["seed"])
    n_layers = max(1, min(n, math.ceil(n / width)))
    cuts = np.sort(rng.choice(np.arange(1, n), size=n_layers - 1, replace=False)) if n_layers > 1 else np.empty(0, int)
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    sizes = np.diff(np.concatenate([starts, [n]]))
    layer = np.repeat(np.arange(n_layers), sizes)
    ops = np.flatnonzero(layer > 0)
    lay = layer[ops]
    k = rng.integers(1, fan + 1, size=ops.size)
    lo0, hi0 = starts[lay - 1], starts[lay]
    src0 = lo0 + (rng.random(ops.size) * (hi0 - lo0)).astype(np.int64)
    rep = np.repeat(np.arange(ops.size), k - 1)
    lo = starts[np.maximum(lay[rep] - window, 0)]
    hi = starts[lay[rep]]
    srcx = lo + (rng.random(rep.size) * (hi - lo)).astype(np.int64)
    src = np.concatenate([src0, srcx])
    dst = np.concatenate([ops, ops[rep]])
    key = np.unique(src * n + dst)
    src, dst = key // n, key % n
    with np.errstate(over="ignore"):
        flops = p["flops_median"] * np.exp(p["flops_sigma"] * rng.standard_normal(n))
        nbytes = np.round(p["bytes_median"] * np.exp(p["bytes_sigma"] * rng.standard_normal(n)))
        overflows = {key: not np.isfinite(arr.sum()) for key, arr in (("flops", flops), ("bytes", nbytes))}
    for key, bad in overflows.items():
        if bad:
            raise WorkloadError(f"random: {key}_median={p[key + '_median']:g} with {key}_sigma={p[key + '_sigma']:g} "
                                f"gives costs that overflow; use a smaller median or sigma")  # fmt: skip
    meta = {
        "workload": "random",
        "params": dict(p),
        "inputs": {},
        "outputs": {},
        "untiled_flops": float(flops.sum()),
        "layers": int(n_layers),
    }
    return DataflowGraph.from_arrays(
        flops, nbytes, src, dst, kind=np.full(n, OpKind.UNKNOWN, np.int8), name="random", meta=meta
    )
