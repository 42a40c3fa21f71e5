"""The shipped policy without torch: its weights as numpy arrays and DOPPLER's encoder in numpy.

Importing torch takes many times what the greedy decode of a graph of a few hundred ops
takes. ``doppler assign --method doppler`` with the shipped policy and no
guided search needs no gradients, so it runs the encoder of
:class:`~doppler.policy.networks.DopplerPolicy` here, in numpy (float32, as torch), and decodes
with the same compiled kernel as training (:func:`doppler.policy.decode.run_heads`).

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

from doppler.io_util import atomic_write_bytes, file_sha256
from doppler.policy import LEAK, LEARNED_HEADS
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, PRETRAINED_DIR, checkpoint_method
from doppler.policy.decode import DecodePlan, Rollout, run_heads
from doppler.policy.features import GraphFeatures, op_feature_columns

INFERENCE_WEIGHTS = PRETRAINED_DIR / "weights.npz"
_META_KEYS = ("policy_config", "graphs", "cluster", "checkpoint_sha256")


def _linear(x: np.ndarray, w: dict[str, np.ndarray], name: str) -> np.ndarray:
    y = x @ w[f"{name}.weight"].T
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias


def _leaky(x: np.ndarray) -> np.ndarray:
    return np.where(x >= 0, x, np.float32(LEAK) * x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class NumpyPolicy:
    """DOPPLER's dual policy (``architecture`` doppler) for decoding only: ``heads(gf)`` gives what
    :func:`doppler.policy.rollout.numpy_heads` gives for the torch policy's ``encode(gf)``."""

    def __init__(self, meta: dict[str, Any], weights: dict[str, np.ndarray]) -> None:
        config = meta["policy_config"]
        if config.get("architecture", "doppler") != "doppler":
            raise ValueError(f"only DOPPLER's dual policy runs without torch, not {config['architecture']!r}")
        self.meta, self.w = meta, weights
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
        meta["policy_config"] = json.loads(meta["policy_config"])
        meta["graphs"] = json.loads(meta["graphs"])
        return cls(meta, weights)

    def _conv(self, x: np.ndarray, edges: "_Edges", coeff: np.ndarray) -> np.ndarray:
        """:class:`~doppler.policy.networks.EdgeConditionedConv` (mean aggregation)."""
        n, hidden = x.shape
        xw = (x @ self.w["encoder.conv.basis.weight"].T).reshape(n, -1, hidden)
        msg = np.einsum("ekh,ek->eh", xw[edges.src], coeff)  # edges sorted by destination
        out = np.zeros((n, hidden), dtype=np.float32)
        for ops, rows in edges.by_degree:
            out[ops] = msg[rows].sum(axis=1)
        return out / edges.degree[:, None] + _linear(x, self.w, "encoder.conv.root")

    def _gru(self, m: np.ndarray, h: np.ndarray) -> np.ndarray:
        """``torch.nn.GRUCell``."""
        i_r, i_z, i_n = np.split(m @ self.w["encoder.gru.weight_ih"].T + self.w["encoder.gru.bias_ih"], 3, axis=1)
        h_r, h_z, h_n = np.split(h @ self.w["encoder.gru.weight_hh"].T + self.w["encoder.gru.bias_hh"], 3, axis=1)
        r, z = _sigmoid(i_r + h_r), _sigmoid(i_z + h_z)
        cand = np.tanh(i_n + r * h_n)
        return (1.0 - z) * cand + z * h

    def heads(self, gf: GraphFeatures) -> tuple:
        """The head inputs of one encoder pass (``(sel_score, plc_op, plc_placed, plc_query, plc_dev,
        w_out, b_out, plc_init)``, float64, as :func:`~doppler.policy.rollout.numpy_heads`)."""
        w = self.w
        op_x = np.ascontiguousarray(gf.op_x[:, self.op_columns], dtype=np.float32)
        edges = _Edges.of(gf)
        edge_hidden = _leaky(_linear(gf.edge_attr[edges.perm], w, "encoder.conv.edge_mlp.0"))
        coeff = np.concatenate([_linear(edge_hidden, w, "encoder.conv.edge_mlp.2"),
                                np.ones((edges.src.shape[0], 1), np.float32)], axis=1)  # fmt: skip
        h = _leaky(_linear(op_x, w, "encoder.embed"))
        for _ in range(int(self.config.get("steps", 6))):
            h = self._gru(_leaky(self._conv(h, edges, coeff)), h)
        emb = h
        down = _chain_sum(emb, gf.down_jumps, gf.path_scale)
        up = _chain_sum(emb, gf.up_jumps, gf.path_scale)
        sel_in = np.concatenate([_linear(op_x, w, "sel.op_lin"), emb, down, up], axis=1)
        sel = _linear(_leaky(_linear(sel_in, w, "sel.mlp.0")), w, "sel.mlp.2")[:, 0]
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
    """The message edges sorted by destination, for a sum per receiving op. The ops are grouped by how
    many messages they receive, so that each group is one gather and one sum (``np.add.reduceat``
    over the segments is slower: it loops per segment)."""

    perm: np.ndarray  # int64[2E]: message edge order, by destination
    src: np.ndarray  # int64[2E]: their sources, in that order
    by_degree: tuple  # per message count k: (int64[m] ops that receive k, int64[m, k] their rows in that order)
    degree: np.ndarray  # float32[n]: messages per op (at least 1: the mean's divisor)

    @classmethod
    def of(cls, gf: GraphFeatures) -> "_Edges":
        src, dst = gf.edge_index[0], gf.edge_index[1]
        perm = np.argsort(dst, kind="stable")
        count = np.bincount(dst, minlength=gf.num_ops)
        starts = np.cumsum(count) - count
        groups = []
        degrees = np.flatnonzero(np.bincount(count))  # (np.unique would import numpy.ma: 15 ms)
        for k in degrees[degrees > 0]:
            ops = np.flatnonzero(count == k)
            groups.append((ops, starts[ops][:, None] + np.arange(k)))
        return cls(perm, src[perm], tuple(groups), np.maximum(count, 1).astype(np.float32))


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
