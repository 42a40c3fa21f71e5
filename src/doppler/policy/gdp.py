"""GDP (Zhou et al., 2019, "GDP: Generalized Device Placement for Dataflow Graphs"), a learned baseline.

GraphSAGE op embeddings (:class:`SageConv`, PyG's ``SAGEConv``, over the DAG's edges in both directions), then a
transformer over the ops in topological order (SEL's fixed rule, :func:`~doppler.policy.decode.rule_order`,
with each op's rank as a learned positional input), then one output layer that gives every op a
distribution over the cluster's devices, **in one shot**: no decision sees another's outcome, and
no dynamic device features (there is no state to read them from). The output layer has one unit per
device, so a GDP policy serves clusters of exactly the device count it was built for.

It trains through the same loop as DOPPLER (:mod:`doppler.train`): a rollout samples every op's
device at once, :func:`~doppler.policy.decode.replay` list-schedules the result (the device
features and EST ties that Stage I's teacher labels read), and the scores are the per-op log-softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from doppler.policy.decode import DecodePlan, Rollout, choose_in_order, replay, rule_order
from doppler.policy.features import GraphFeatures
from doppler.policy.fixed_output import FixedOutputPolicy
from doppler.policy.message_passing import propagate
from doppler.policy.networks import LEAK
from doppler.policy.rollout import ActionScores, fixed_order_scores


class SageConv(nn.Module):
    """GraphSAGE with mean aggregation (Hamilton et al., 2017), as PyG's ``SAGEConv(channels, channels)``:
    ``lin_l(mean of x_j over the edges j -> i) + lin_r(x_i)``, with PyG's weight names, initial weights
    and random draws (a checkpoint of either loads into the other; a test compares the two)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.lin_l = nn.Linear(channels, channels)
        self.lin_r = nn.Linear(channels, channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyG's initialisation: weights uniform within ``sqrt(6 / ((1 + a^2) fan_in))``, ``a = sqrt(5)``, and
        the bias within ``1 / sqrt(fan_in)`` (torch's own bounds, computed as PyG computes them)."""
        a = math.sqrt(5)
        for lin in (self.lin_l, self.lin_r):
            bound = math.sqrt(6 / ((1 + a**2) * lin.in_features))
            lin.weight.data.uniform_(-bound, bound)
            if lin.bias is not None:
                bound = 1.0 / math.sqrt(lin.in_features)
                lin.bias.data.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.lin_l(propagate(x, edge_index, aggr="mean")) + self.lin_r(x)


class GdpPolicy(FixedOutputPolicy):
    """SAGEConv encoder (``steps`` layers) + transformer (``layers`` x ``heads``) + per-op device logits."""

    architecture = "gdp"
    methods = ("gdp",)
    #: the training loop's learning rates are multiplied by this: at DOPPLER's (5e-3 imitation, 3e-3 RL) the
    #: transformer does not fit (distilling a 68-op assignment stalled at loss 1.24 with 5e-3; at 1e-3 it
    #: matched in 100 updates)
    lr_scale = 0.2

    def __init__(self, num_devices: int, hidden: int = 128, steps: int = 3, mlp_hidden: int = 128,
                 op_features: str = "full", layers: int = 2, heads: int = 4) -> None:  # fmt: skip
        super().__init__(num_devices, hidden=hidden, steps=steps, mlp_hidden=mlp_hidden, op_features=op_features,
                         layers=layers, heads=heads)  # fmt: skip
        self.embed = nn.Linear(len(self.op_columns), hidden)
        self.sage = nn.ModuleList(SageConv(hidden) for _ in range(steps))
        self.position = nn.Linear(1, hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, dim_feedforward=2 * hidden, dropout=0.0, batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.LeakyReLU(LEAK), nn.Linear(mlp_hidden, num_devices))

    @classmethod
    def build(cls, method: str, *, num_devices: int, hidden: int, steps: int, mlp_hidden: int, op_features: str,
              list_schedule: str = "critical_path", device_identity: bool = False) -> GdpPolicy:  # fmt: skip
        """At most 3 GraphSAGE layers (a transformer follows them); the op order is SEL's fixed rule, so
        ``list_schedule`` plays no part."""
        return cls(num_devices, hidden, min(steps, 3), mlp_hidden, op_features=op_features)

    def encode(self, gf: GraphFeatures) -> "GdpDecoder":
        """Every op's device logits ``[n, D]``, in one pass."""
        self.check_device_outputs(gf)
        dev = self.device
        n = gf.num_ops
        order = rule_order(gf)
        x = torch.from_numpy(gf.op_x[:, self.op_columns]).to(dev)
        edge_index = torch.from_numpy(gf.edge_index).to(dev)
        h = F.leaky_relu(self.embed(x), LEAK)
        for conv in self.sage:
            h = F.leaky_relu(conv(h, edge_index), LEAK)
        rank = torch.arange(n, dtype=h.dtype, device=dev).unsqueeze(1) / max(n, 1)
        seq = h[torch.from_numpy(order).to(dev)] + self.position(rank)
        by_rank = self.out(self.transformer(seq.unsqueeze(0)).squeeze(0))
        logits = torch.empty_like(by_rank).index_copy(0, torch.from_numpy(order).to(dev), by_rank)
        return GdpDecoder(logits, order)


@dataclass
class GdpDecoder:
    """One graph's GDP output: ``logits[n, D]`` and the fixed op order its trajectories follow."""

    logits: torch.Tensor
    order: np.ndarray

    def head_weights(self) -> tuple[float, float]:
        return 0.0, 1.0  # the op order is a fixed rule: only the device choices are learned

    def decode(self, gf: GraphFeatures, plan: DecodePlan) -> Rollout:
        """Every op's device drawn at once (greedy: arg-max), then list-scheduled along the fixed order."""
        if plan.teacher:
            return replay(gf, plan.forced_order, plan.forced_dev)
        order = np.tile(self.order, (plan.batch, 1))
        weights = self.logits.detach().to("cpu", torch.float64).numpy()[order]  # [B, n, D] in step order
        if plan.memory_budget_bytes is None:
            return replay(gf, order, plan.choose_devices(weights))
        return choose_in_order(gf, plan, order, lambda h, _: weights[:, h])  # one op at a time: memory

    def score(self, ro: Rollout) -> ActionScores:
        return fixed_order_scores(ro, self.logits[torch.from_numpy(ro.order).to(self.logits.device)])
