"""PLACETO (Addanki et al., 2019, "Placeto: Learning Generalizable Device Placement Algorithms"), a
learned baseline.

One placement policy. Ops are visited in a fixed topological order (SEL's rule,
:func:`~doppler.policy.decode.rule_order`). Each op's node features are its static features plus
what the placement so far says about it: a one-hot of the device it was put on (zeros before), a
"placed" flag and a "being placed now" flag. At **every step** the graph embedding is re-run over
those features (``steps`` rounds of message passing that aggregate parents and children separately,
mean-normalised); the op being placed is then described by its own embedding and by the mean
embeddings of its ancestors, its descendants and the ops parallel to it (neither), and an MLP maps
that to one logit per device. The re-embedding at every step is Placeto's design and its cost
(``benchmarks/learned_baselines.py`` prints it). The output layer has one unit per device, so a
PLACETO policy serves clusters of exactly the device count it was built for.

Re-scoring a rollout re-runs the embedding of every (episode, step) state; the states go in chunks
through ``torch.utils.checkpoint``, so only each chunk's inputs and logits stay in memory for the
backward pass (which recomputes the embedding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from doppler.policy.decode import DecodePlan, Rollout, choose_in_order, replay, rule_order
from doppler.policy.features import GraphFeatures
from doppler.policy.fixed_output import FixedOutputPolicy
from doppler.policy.message_passing import propagate
from doppler.policy.networks import LEAK
from doppler.policy.rollout import ActionScores, fixed_order_scores

#: node rows (states x ops) embedded in one piece when re-scoring (bounds the memory of a chunk)
STATE_CHUNK_ROWS = 1 << 16


def reachability(graph, order: np.ndarray) -> np.ndarray:
    """``bool[n, n]``: ``anc[v, u]`` if ``u`` is an ancestor of ``v`` (``order``: a topological order)."""
    n = graph.num_ops
    anc = np.zeros((n, n), dtype=bool)
    for v in order:
        preds = graph.pred_idx[graph.pred_ptr[v] : graph.pred_ptr[v + 1]]
        if preds.size:
            anc[v] = anc[preds].any(axis=0)
            anc[v, preds] = True
    return anc


class PlacetoPolicy(FixedOutputPolicy):
    """Placement-aware message passing re-run per step + parent/child/parallel aggregation + device logits."""

    architecture = "placeto"
    methods = ("placeto",)

    def __init__(self, num_devices: int, hidden: int = 64, steps: int = 3, mlp_hidden: int = 128,
                 op_features: str = "full") -> None:  # fmt: skip
        super().__init__(num_devices, hidden=hidden, steps=steps, mlp_hidden=mlp_hidden, op_features=op_features)
        self.embed = nn.Linear(len(self.op_columns) + num_devices + 2, hidden)
        self.rounds = nn.ModuleList(nn.Linear(3 * hidden, hidden) for _ in range(steps))
        self.out = nn.Sequential(nn.Linear(4 * hidden, mlp_hidden), nn.LeakyReLU(LEAK), nn.Linear(mlp_hidden, num_devices))

    @classmethod
    def build(cls, method: str, *, num_devices: int, hidden: int, steps: int, mlp_hidden: int, op_features: str,
              list_schedule: str = "critical_path", device_identity: bool = False) -> PlacetoPolicy:  # fmt: skip
        """Half the width (at least 8) and at most 3 rounds: the graph is embedded again at every step; the
        op order is SEL's fixed rule, so ``list_schedule`` plays no part."""
        return cls(num_devices, max(hidden // 2, 8), min(steps, 3), mlp_hidden, op_features=op_features)

    @classmethod
    def asked_sizes(cls, config: dict) -> dict[str, int]:
        """Twice the width :meth:`build` made."""
        return {**super().asked_sizes(config), "hidden": 2 * config["hidden"]}

    def encode(self, gf: GraphFeatures) -> "PlacetoDecoder":
        """The static inputs of the per-step embedding (nothing is embedded yet: that happens per step)."""
        self.check_device_outputs(gf)
        dev = self.device
        g = gf.graph
        order = rule_order(gf)
        anc = torch.from_numpy(reachability(g, order)).to(dev)
        indeg = np.bincount(g.dst, minlength=g.num_ops).clip(min=1)
        outdeg = np.bincount(g.src, minlength=g.num_ops).clip(min=1)
        return PlacetoDecoder(
            policy=self,
            op_x=torch.from_numpy(gf.op_x[:, self.op_columns]).to(dev),
            src=torch.from_numpy(g.src.astype(np.int64)).to(dev),
            dst=torch.from_numpy(g.dst.astype(np.int64)).to(dev),
            inv_indeg=torch.from_numpy(1.0 / indeg).float().unsqueeze(1).to(dev),
            inv_outdeg=torch.from_numpy(1.0 / outdeg).float().unsqueeze(1).to(dev),
            ancestors=anc,
            descendants=anc.T.contiguous(),
            order=order,
        )

    def state_logits(self, dec: "PlacetoDecoder", placed: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
        """Device logits ``[S, D]`` of op ``current[s]`` in placement state ``placed[s]`` (``[S, n]``, -1:
        not placed): the whole graph embedded anew for every state."""
        S, n = placed.shape
        onehot = F.one_hot(placed + 1, self.num_devices + 1)[..., 1:].to(dec.op_x.dtype)
        is_current = F.one_hot(current, n).to(dec.op_x.dtype).unsqueeze(-1)
        x = torch.cat([dec.op_x.expand(S, -1, -1), onehot, (placed >= 0).to(dec.op_x.dtype).unsqueeze(-1), is_current], -1)
        h = F.leaky_relu(self.embed(x), LEAK)  # [S, n, H]
        for layer in self.rounds:
            from_parents = propagate(h, (dec.src, dec.dst), dim=1) * dec.inv_indeg
            from_children = propagate(h, (dec.dst, dec.src), dim=1) * dec.inv_outdeg
            h = F.leaky_relu(layer(torch.cat([h, from_parents, from_children], -1)), LEAK)
        anc, desc = dec.ancestors[current], dec.descendants[current]  # [S, n]
        parallel = ~(anc | desc) & (is_current.squeeze(-1) == 0)
        groups = torch.stack([anc, desc, parallel], 1).to(h.dtype)  # [S, 3, n]
        means = (groups @ h) / groups.sum(-1, keepdim=True).clamp(min=1.0)  # [S, 3, H]
        own = h[torch.arange(S, device=h.device), current]
        return self.out(torch.cat([own, means.flatten(1)], -1))


@dataclass
class PlacetoDecoder:
    """One graph's static inputs to PLACETO's per-step embedding (tensors on the policy's device)."""

    policy: PlacetoPolicy
    op_x: torch.Tensor  # [n, F]
    src: torch.Tensor  # [E]
    dst: torch.Tensor  # [E]
    inv_indeg: torch.Tensor  # [n, 1]
    inv_outdeg: torch.Tensor  # [n, 1]
    ancestors: torch.Tensor  # bool[n, n]: row v marks v's ancestors
    descendants: torch.Tensor  # bool[n, n]: row v marks v's descendants
    order: np.ndarray  # the fixed op order

    def head_weights(self) -> tuple[float, float]:
        return 0.0, 1.0  # the op order is a fixed rule: only the device choices are learned

    def decode(self, gf: GraphFeatures, plan: DecodePlan) -> Rollout:
        """Step through the fixed order, re-embedding the B current placements at every step."""
        if plan.teacher:
            return replay(gf, plan.forced_order, plan.forced_dev)
        B = plan.batch
        order = np.tile(self.order, (B, 1))
        placed = torch.full((B, gf.num_ops), -1, dtype=torch.int64, device=self.op_x.device)
        rows = torch.arange(B, device=self.op_x.device)

        def logits_at(h: int, devices: np.ndarray) -> np.ndarray:
            if h > 0:  # the previous step's choices, now placed
                placed[rows, torch.from_numpy(order[:, h - 1]).to(placed.device)] = torch.from_numpy(
                    devices[:, h - 1]).to(placed.device)  # fmt: skip
            v = torch.from_numpy(order[:, h]).to(self.op_x.device)
            return self.policy.state_logits(self, placed, v).to("cpu", torch.float64).numpy()

        with torch.no_grad():
            return choose_in_order(gf, plan, order, logits_at)

    def score(self, ro: Rollout) -> ActionScores:
        """Log PLC of every step: each (episode, step) state embedded again, in checkpointed chunks."""
        B, n = ro.order.shape
        dev = self.op_x.device
        step_of = np.empty_like(ro.order)
        np.put_along_axis(step_of, ro.order, np.broadcast_to(np.arange(n), (B, n)), axis=1)
        step_of_t = torch.from_numpy(step_of).to(dev)
        assignment = torch.from_numpy(ro.assignment).to(dev)
        current = torch.from_numpy(ro.order).to(dev).reshape(-1)  # state s = (b, h): op order[b, h]
        chunk = max(1, STATE_CHUNK_ROWS // max(n, 1))
        out = []
        for s0 in range(0, B * n, chunk):
            s = torch.arange(s0, min(s0 + chunk, B * n), device=dev)
            b, h = s // n, s % n
            placed = torch.where(step_of_t[b] < h.unsqueeze(1), assignment[b], -1)  # [c, n]: placed before step h
            out.append(checkpoint(self.policy.state_logits, self, placed, current[s], use_reentrant=False))
        return fixed_order_scores(ro, torch.cat(out).view(B, n, -1))
