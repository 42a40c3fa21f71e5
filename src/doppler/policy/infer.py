"""The shipped policy without torch: its weights as numpy arrays and DOPPLER's encoder in numpy.

Importing torch takes many times what the greedy decode of a graph of a few hundred ops
takes. ``doppler assign --method doppler`` with the shipped policy and no
guided search needs no gradients, so it runs the encoder of
:class:`~doppler.policy.networks.DopplerPolicy` here, in numpy (float32, as torch), and decodes
with the same compiled loop as training (:func:`doppler.policy.decode.run_heads`).

The weights live in ``weights.npz`` beside the shipped ``checkpoint.pt`` (:func:`export_weights`;
``python -m doppler.policy.infer`` rewrites it after a new policy is shipped). The file records
the SHA-256 of the checkpoint it was made from, and :func:`load_shipped` returns ``None`` (so the
caller loads the checkpoint with torch) when it is missing or was made from another checkpoint.
A test checks that both paths compute the same heads.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from doppler.util.jit import jit
from doppler.util.io import atomic_write_bytes, file_sha256, loads_json
from doppler.policy import LEAK, LEARNED_HEADS
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, PRETRAINED_DIR, checkpoint_method
from doppler.policy.decode import DecodePlan, Rollout, run_heads
from doppler.policy.features import GraphFeatures, op_feature_columns

INFERENCE_WEIGHTS = PRETRAINED_DIR / "weights.npz"
_META_KEYS = ("policy_config", "graphs", "cluster", "checkpoint_sha256")


def _linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    """``x @ weight.T + bias`` of layer ``name``. For a matrix ``x`` the weight is read transposed from ``w``
    (``name.weight_t``, contiguous: twice as fast as a transposed view, the same numbers); a vector keeps
    the view (its product with the copy rounds differently)."""
    y = x @ (w[f"{name}.weight_t"] if x.ndim == 2 else w[f"{name}.weight"].T)
    bias = w.get(f"{name}.bias")
    if bias is not None:
        y += bias
    return y


def _leaky_(x: np.ndarray) -> np.ndarray:
    """LeakyReLU of ``x``, in place (the encoder's arrays are large: no temporaries); returns ``x``."""
    np.multiply(x, np.float32(LEAK), out=x, where=x < 0)
    return x


def _sigmoid_(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))``, in place; returns ``x``."""
    np.negative(x, out=x)
    np.exp(x, out=x)
    x += 1.0
    return np.divide(1.0, x, out=x)


class NumpyPolicy:
    """DOPPLER's dual policy (``architecture`` doppler) for decoding only: ``heads(gf)`` gives what
    :func:`doppler.policy.rollout.numpy_heads` gives for the torch policy's ``encode(gf)``."""

    def __init__(self, meta: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
        config = meta["policy_config"]
        if config.get("architecture", "doppler") != "doppler":
            raise ValueError(f"only DOPPLER's dual policy runs without torch, not {config['architecture']!r}")
        self.meta, self.w = meta, dict(weights)
        self.w.update({f"{k}_t": np.ascontiguousarray(v.T) for k, v in weights.items() if v.ndim == 2})
        self.config = config
        self.method = checkpoint_method(config)
        self.learned = config.get("learned", "both")
        self.list_schedule = config.get("list_schedule", "critical_path")
        self.op_columns = op_feature_columns(config.get("op_features", "full"))
        if self.learned not in LEARNED_HEADS:
            raise ValueError(f"unknown learned heads {self.learned!r}")

    @classmethod
    def from_npz(cls, path: str | Path) -> "NumpyPolicy":
        with np.load(path, allow_pickle=False) as z:
            meta = {k: str(z[k]) for k in _META_KEYS}
            weights = {k: z[k] for k in z.files if k not in _META_KEYS}
        meta["policy_config"] = loads_json(meta["policy_config"])
        meta["graphs"] = loads_json(meta["graphs"])
        return cls(meta, weights)

    def _conv(self, x: np.ndarray, edges: "_Edges", coeff: np.ndarray) -> np.ndarray:
        """:class:`~doppler.policy.networks.EdgeConditionedConv` (mean aggregation)."""
        n, hidden = x.shape
        xw = (x @ self.w["encoder.conv.basis.weight_t"]).reshape(n, -1, hidden)
        out = np.zeros((n, hidden), dtype=np.float32)
        message_sums(xw, coeff, edges.src, edges.ptr, out)
        out /= edges.degree[:, None]
        out += _linear(x, self.w, "encoder.conv.root")
        return out

    def _gru(self, m: np.ndarray, h: np.ndarray) -> np.ndarray:
        """``torch.nn.GRUCell``, with as few temporaries of the encoder's size as the same float32 operations
        allow."""
        hidden = h.shape[1]
        w = self.w
        i = m @ w["encoder.gru.weight_ih_t"]  # [r | z | n] of the input, then of the state
        i += w["encoder.gru.bias_ih"]
        hh = h @ w["encoder.gru.weight_hh_t"]
        hh += w["encoder.gru.bias_hh"]
        rz = _sigmoid_(np.add(i[:, :2 * hidden], hh[:, :2 * hidden]))
        r, z = rz[:, :hidden], rz[:, hidden:]
        cand = np.multiply(r, hh[:, 2 * hidden:])
        cand += i[:, 2 * hidden:]
        np.tanh(cand, out=cand)
        out = 1.0 - z
        out *= cand
        np.multiply(z, h, out=cand)
        out += cand
        return out

    def heads(self, gf: GraphFeatures) -> tuple:
        """The head inputs of one encoder pass (``(sel_score, plc_op, plc_placed, plc_query, plc_dev,
        w_out, b_out, plc_init)``, float64, as :func:`~doppler.policy.rollout.numpy_heads`)."""
        w = self.w
        op_x = np.ascontiguousarray(gf.op_x[:, self.op_columns], dtype=np.float32)
        edges = _Edges.of(gf)
        edge_hidden = _leaky_(_linear(gf.edge_attr[edges.perm], w, "encoder.conv.edge_mlp.0"))
        coeff = np.concatenate([_linear(edge_hidden, w, "encoder.conv.edge_mlp.2"),
                                np.ones((edges.src.shape[0], 1), np.float32)], axis=1)  # fmt: skip
        h = _leaky_(_linear(op_x, w, "encoder.embed"))
        for _ in range(int(self.config.get("steps", 6))):
            h = self._gru(_leaky_(self._conv(h, edges, coeff)), h)
        emb = h
        down = _chain_sum(emb, gf.down_jumps, gf.path_scale)
        up = _chain_sum(emb, gf.up_jumps, gf.path_scale)
        sel_in = np.concatenate([_linear(op_x, w, "sel.op_lin"), emb, down, up], axis=1)
        sel = _linear(_leaky_(_linear(sel_in, w, "sel.mlp.0")), w, "sel.mlp.2")[:, 0]
        plc_op = (_linear(_linear(op_x, w, "plc.op_lin"), w, "plc.w_op") + _linear(emb, w, "plc.w_emb")
                  + _linear(w["plc.dev_lin.bias"], w, "plc.w_dev"))  # fmt: skip
        placed = np.concatenate([_linear(emb, w, "plc.w_placed"), _linear(emb, w, "plc.aff_k")], axis=1) / emb.shape[0]
        query = _linear(emb, w, "plc.aff_q")
        dev = (w["plc.w_dev.weight"] @ w["plc.dev_lin.weight"]).T

        def f64(a: np.ndarray) -> np.ndarray:
            return np.ascontiguousarray(a, dtype=np.float64)

        # each device's starting sums: zero, or its learned identity (run_heads refuses another device count)
        init = w.get("plc.device_init", np.zeros((gf.num_devices, placed.shape[1])))
        return (f64(sel), f64(plc_op), f64(placed), f64(query), f64(dev), f64(w["plc.out.weight"][0]),
                float(w["plc.out.bias"][0]), f64(init))  # fmt: skip

    def decode(self, gf: GraphFeatures, plan: DecodePlan, heads: tuple | None = None) -> Rollout:
        """Decode ``plan`` (:func:`~doppler.policy.decode.make_plan`); ``heads``: this graph's, if already computed."""
        return run_heads(gf, heads if heads is not None else self.heads(gf), plan, self.learned, self.list_schedule)


@dataclass(frozen=True)
class _Edges:
    """The message edges sorted by destination (CSR), for a sum per receiving op."""

    perm: np.ndarray  # int64[2E]: message edge order, by destination
    src: np.ndarray  # int64[2E]: their sources, in that order
    ptr: np.ndarray  # int64[n + 1]: op v receives the messages perm[ptr[v]:ptr[v + 1]]
    degree: np.ndarray  # float32[n]: messages per op (at least 1: the mean's divisor)

    @classmethod
    def of(cls, gf: GraphFeatures) -> "_Edges":
        src, dst = gf.edge_index[0], gf.edge_index[1]
        perm = np.argsort(dst, kind="stable")
        count = np.bincount(dst, minlength=gf.num_ops)
        ptr = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
        return cls(perm, np.ascontiguousarray(src[perm], dtype=np.int64), ptr, np.maximum(count, 1).astype(np.float32))


def _message_sums_numpy(xw: np.ndarray, coeff: np.ndarray, src: np.ndarray, ptr: np.ndarray, out: np.ndarray) -> None:
    """:func:`message_sums` in numpy (``doppler.util.jit.as_python``): the ops are grouped by how many messages
    they receive, so that each group is one gather and one sum (``np.add.reduceat`` over the segments is
    slower: it loops per segment)."""
    msg = np.einsum("ekh,ek->eh", xw[src], coeff)
    count = np.diff(ptr)
    degrees = np.flatnonzero(np.bincount(count))  # (np.unique would import numpy.ma: 15 ms)
    for k in degrees[degrees > 0]:
        ops = np.flatnonzero(count == k)
        out[ops] = msg[ptr[ops][:, None] + np.arange(k)].sum(axis=1)


@jit(cache=True, python=_message_sums_numpy)
def message_sums(xw, coeff, src, ptr, out):  # pragma: no cover - compiled
    """Per receiving op ``v``, the sum over its messages ``e`` in ``ptr[v]:ptr[v + 1]`` of
    ``sum_k coeff[e, k] * xw[src[e], k]``, into ``out[v]`` (float32; ops that receive none are left as they
    are). The same float32 operations, in the same order, as the numpy twin: the same numbers, without
    the twin's ``2E x K x hidden`` gather."""
    n, nk, hidden = xw.shape
    msg = np.empty(hidden, np.float32)
    for v in range(n):
        for e in range(ptr[v], ptr[v + 1]):
            s = src[e]
            msg[:] = np.float32(0.0)
            for k in range(nk):
                c = coeff[e, k]
                for h in range(hidden):
                    msg[h] += xw[s, k, h] * c
            if e == ptr[v]:
                out[v, :] = msg
            else:
                for h in range(hidden):
                    out[v, h] += msg[h]


def _chain_sum(emb: np.ndarray, jumps: list, scale: float) -> np.ndarray:
    """:func:`doppler.policy.networks._chain_sum` in numpy."""
    out = emb
    for table in jumps:
        out = out + np.where((table >= 0)[:, None], out[np.maximum(table, 0)], np.float32(0.0))
    return out / np.float32(scale)


def export_weights(checkpoint: str | Path = PRETRAINED_CHECKPOINT, out: str | Path = INFERENCE_WEIGHTS) -> Path:
    """Write ``out`` (``.npz``): the weights of ``checkpoint`` as float32 arrays, its metadata, and its
    SHA-256 (needs torch; written atomically)."""
    from doppler.policy.architectures import read_checkpoint

    checkpoint, out = Path(checkpoint), Path(out)
    ck = read_checkpoint(checkpoint)
    if ck["policy_config"].get("device_identity"):  # heads() would apply its states on every cluster
        raise ValueError(f"{checkpoint}: a policy with device identity serves its training cluster only; the "
                         "torch-free decoder is for a policy that serves any cluster")  # fmt: skip
    arrays = {k: v.detach().cpu().float().numpy() for k, v in ck["state_dict"].items()}
    arrays.update(policy_config=np.array(json.dumps(ck["policy_config"])), graphs=np.array(json.dumps(ck["graphs"])),
                  cluster=np.array(ck.get("cluster") or ""), checkpoint_sha256=np.array(file_sha256(checkpoint)))  # fmt: skip
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(out, buf.getvalue())
    return out


def load_shipped() -> NumpyPolicy | None:
    """The shipped policy without torch, or ``None`` if ``weights.npz`` is missing, unreadable or
    made from another checkpoint than the shipped one (then load that checkpoint with torch).
    Loaded once per process and version of the two files."""
    try:
        weights, checkpoint = INFERENCE_WEIGHTS.stat(), PRETRAINED_CHECKPOINT.stat()
    except OSError:
        return None
    return _load_matching(str(INFERENCE_WEIGHTS), str(PRETRAINED_CHECKPOINT),
                          (weights.st_mtime_ns, weights.st_size, checkpoint.st_mtime_ns, checkpoint.st_size))  # fmt: skip


@functools.lru_cache(maxsize=4)
def _load_matching(weights: str, checkpoint: str, version: tuple) -> NumpyPolicy | None:
    try:
        policy = NumpyPolicy.from_npz(weights)
    except (OSError, KeyError, ValueError):
        return None
    return policy if policy.meta["checkpoint_sha256"] == file_sha256(checkpoint) else None


if __name__ == "__main__":  # python -m doppler.policy.infer [CHECKPOINT [OUT]]
    import sys

    print(export_weights(*sys.argv[1:3]))
