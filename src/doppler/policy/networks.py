"""DOPPLER's networks: one MPNN encoder run once per graph and batch, and the SEL and
PLC heads (docs/design.md, The method).

* :class:`EdgeConditionedConv` is PyG's ``NNConv`` (Gilmer et al.'s edge network:
  the message of edge ``j -> i`` is ``x_j @ W(e)`` with ``W(e)`` a learned function
  of the edge's features) for an edge network whose last layer is linear, as in
  PyG's QM9 example. ``NNConv`` materialises one ``H x H`` matrix per edge
  (E * H^2 floats: 4 GB at 10k ops and H = 128); since the last layer is linear,
  ``W(e) = sum_k a_k(e) W_k + W_0`` and the message is ``sum_k a_k(e) (x_j W_k)``,
  which costs E * H * (k + 1); on large graphs one basis matrix at a time (gather,
  scale, scatter-add with :func:`~doppler.policy.message_passing.propagate`), so no
  ``[E, k + 1, H]`` tensor is ever made: PyG's gather of all messages at once is the
  cost that grows fastest with graph size. A test checks both paths equal ``NNConv`` with
  mapped weights.
* :class:`GraphEncoder`: K message-passing steps with shared weights and a GRU
  update (``NNConv`` + ``GRU`` as in Gilmer et al.), over the DAG's edges in both
  directions (the direction is an edge feature).
* :class:`SelHead` scores every op once: MLP over [linear(op features), H[v], the
  sum of H over v's longest path to an exit, the sum over v's longest path from an
  entry] (path sums divided by the graph's depth). Scores depend only on static
  inputs, so a SEL step is a masked softmax over the candidates.
* :class:`PlcHead` scores device d for the op v being placed: MLP over
  [linear(device features of d), linear(op features of v), H[v], sum of H over
  the ops already on d (divided by the op count)], plus (our addition) a bilinear
  affinity ``(Q H[v]) . (K sum of H over the ops on d)``: an additive MLP cannot
  easily tell "v belongs with the ops on d", which co-location needs. Its first
  layer is split so the op-dependent part is one ``[ops, M]`` matrix per batch and
  a step is a gather plus a ``[D, F] x [F, M]`` product.

Activations are LeakyReLU throughout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from doppler.listsched import LIST_SCHEDULES, NUM_DEVICE_FEATURES
from doppler.policy import LEAK, LEARNED_HEADS  # noqa: F401 - LEAK re-exported
from doppler.policy.base import BasePolicy
from doppler.policy.features import NUM_EDGE_FEATURES, OP_FEATURES, GraphFeatures, op_feature_columns
from doppler.policy.message_passing import degree, propagate

#: largest [edges, basis + 1, H] gather the conv makes in one piece (bytes). Above it, one basis
#: matrix at a time, so that memory traffic grows no faster than the graph; below it, the single
#: gather is the faster of the two.
GATHER_ALL_MAX_BYTES = 16 << 20
#: above this many ops the encoder recomputes each message-passing round in the backward pass rather than
#: holding its activations (a 50,000-op graph held 10+ GB of them; GraphEncoder.forward)
CHECKPOINT_MIN_OPS = 5000


class EdgeConditionedConv(nn.Module):
    """``NNConv(channels, channels, nn=Sequential(edge MLP, Linear(basis, channels**2)))`` in factorised form."""

    def __init__(self, channels: int, edge_dim: int, basis: int = 4, edge_hidden: int = 16, aggr: str = "mean") -> None:
        super().__init__()
        if aggr not in ("mean", "add"):
            raise ValueError(f"aggr must be mean or add, got {aggr!r}")
        self.channels, self.num_basis, self.aggr = channels, basis, aggr
        self.edge_mlp = nn.Sequential(nn.Linear(edge_dim, edge_hidden), nn.LeakyReLU(LEAK), nn.Linear(edge_hidden, basis))
        self.basis = nn.Linear(channels, (basis + 1) * channels, bias=False)  # W_1..W_k, then the constant W_0
        self.root = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        xw = self.basis(x).view(-1, self.num_basis + 1, self.channels)
        coeff = F.pad(self.edge_mlp(edge_attr), (0, 1), value=1.0)
        out = x.new_zeros(x.shape[0], self.channels)
        if xw[0].numel() * edge_index.shape[1] * xw.element_size() <= GATHER_ALL_MAX_BYTES:
            # PyG's way: gather every basis product of every edge's source at once
            out = propagate(xw, edge_index, message=lambda xw_j: (xw_j * coeff.unsqueeze(-1)).sum(1), into=out)
        else:  # one [E, H] gather-scale-scatter per basis matrix, never the whole [E, k + 1, H]
            for k in range(self.num_basis + 1):
                out = propagate(xw[:, k], edge_index, message=lambda x_j, k=k: x_j * coeff[:, k : k + 1], into=out)
        if self.aggr == "mean":
            out = out / degree(edge_index[1], x.shape[0], out).unsqueeze(1)
        return out + self.root(x)


class GraphEncoder(nn.Module):
    """Op embeddings ``H[n, hidden]`` after ``steps`` rounds of message passing."""

    def __init__(self, hidden: int = 128, steps: int = 6, basis: int = 4, op_dim: int = len(OP_FEATURES)) -> None:
        super().__init__()
        self.steps = steps
        self.embed = nn.Linear(op_dim, hidden)
        self.conv = EdgeConditionedConv(hidden, NUM_EDGE_FEATURES, basis)
        self.gru = nn.GRUCell(hidden, hidden)

    def forward(self, op_x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        """With gradients on a graph of more than :data:`CHECKPOINT_MIN_OPS` ops, each round keeps only its input
        for the backward pass and recomputes the rest there (``torch.utils.checkpoint``): the same numbers, a
        round's activations held once instead of ``steps`` times."""
        h = F.leaky_relu(self.embed(op_x), LEAK)
        recompute = torch.is_grad_enabled() and op_x.shape[0] > CHECKPOINT_MIN_OPS
        for _ in range(self.steps):
            if recompute:
                h = checkpoint(self._round, h, edge_index, edge_attr, use_reentrant=False)
            else:
                h = self._round(h, edge_index, edge_attr)
        return h

    def _round(self, h: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        return self.gru(F.leaky_relu(self.conv(h, edge_index, edge_attr), LEAK), h)


class SelHead(nn.Module):
    def __init__(self, hidden: int, mlp_hidden: int, op_dim: int = len(OP_FEATURES)) -> None:
        super().__init__()
        self.op_lin = nn.Linear(op_dim, hidden)
        self.mlp = nn.Sequential(nn.Linear(4 * hidden, mlp_hidden), nn.LeakyReLU(LEAK), nn.Linear(mlp_hidden, 1))

    def forward(self, op_x: torch.Tensor, emb: torch.Tensor, down: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.op_lin(op_x), emb, down, up], dim=1)).squeeze(1)


class PlcHead(nn.Module):
    def __init__(self, hidden: int, mlp_hidden: int, affinity: int = 32, op_dim: int = len(OP_FEATURES),
                 device_identity: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.affinity = affinity
        self.dev_lin = nn.Linear(NUM_DEVICE_FEATURES, hidden)
        self.op_lin = nn.Linear(op_dim, hidden)
        # the first MLP layer over [dev_lin(f_d), op_lin(x_v), H[v], placed_d], one block per input
        self.w_dev = nn.Linear(hidden, mlp_hidden, bias=False)
        self.w_op = nn.Linear(hidden, mlp_hidden)
        self.w_emb = nn.Linear(hidden, mlp_hidden, bias=False)
        self.w_placed = nn.Linear(hidden, mlp_hidden, bias=False)
        self.out = nn.Linear(mlp_hidden, 1)
        # bilinear affinity of v with the ops already on d: (Q H[v]) . sum_{u on d} K H[u] / n
        self.aff_q = nn.Linear(hidden, affinity, bias=False)
        self.aff_k = nn.Linear(hidden, affinity, bias=False)
        # device identity (fine-tuning on one cluster): a learned state per device before anything is
        # placed, in the same units as the placed-op sums; zero at first, so the head starts as without it
        if device_identity:
            self.device_init = nn.Parameter(torch.zeros(device_identity, mlp_hidden + affinity))
        else:
            self.register_parameter("device_init", None)

    def initial_placed(self, num_devices: int, like: torch.Tensor) -> torch.Tensor:
        """``[D, M + A]``: what each device holds before anything is placed: zero, or with device
        identity its learned state (for its own device count only: elsewhere the checkpoint is loaded
        without it, :func:`doppler.policy.architectures.load_policy`)."""
        if self.device_init is None:
            return like.new_zeros((num_devices, self.out.in_features + self.affinity))
        if self.device_init.shape[0] != num_devices:
            from doppler.policy.checkpoint import device_identity_mismatch

            raise ValueError(device_identity_mismatch(self.device_init.shape[0], num_devices))
        return self.device_init

    def op_part(self, op_x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        """``[n, M]``: the first layer's op-dependent part, plus both first-layer biases."""
        return self.w_op(self.op_lin(op_x)) + self.w_emb(emb) + self.w_dev(self.dev_lin.bias)

    def placed_part(self, emb: torch.Tensor) -> torch.Tensor:
        """``[n, M + A]``: what placing op u on d adds to d's state (summed over placed ops): first
        its contribution to the pre-activation, then its affinity key."""
        return torch.cat([self.w_placed(emb), self.aff_k(emb)], dim=1) / emb.shape[0]

    def device_matrix(self) -> torch.Tensor:
        """``[F, M]``: device features -> pre-activation (the device linear folded into the first layer)."""
        return (self.w_dev.weight @ self.dev_lin.weight).T


@dataclass
class Encoded:
    """One encoder pass over a graph: everything a batch of rollouts needs, as tensors."""

    sel_score: torch.Tensor  # [n]
    plc_op: torch.Tensor  # [n, M]
    plc_placed: torch.Tensor  # [n, M + A]
    plc_query: torch.Tensor  # [n, A]
    plc_dev: torch.Tensor  # [F, M]
    plc_w_out: torch.Tensor  # [M]: the PLC head's output layer
    plc_b_out: torch.Tensor  # []
    plc_init: torch.Tensor  # [D, M + A]: each device's placed-op sums before the first step (PlcHead.initial_placed)
    learned: str = "both"  # which heads decide: "both", or "sel"/"plc" (the other follows CRITICAL PATH's rule)
    list_schedule: str = "critical_path"  # the list-schedule model of PLC's features and rule (rollout.LIST_SCHEDULES)

    def head_weights(self) -> tuple[float, float]:
        """(SEL, PLC) weights of the log-likelihood terms: a head that follows a fixed rule is not trained."""
        return float(self.learned != "plc"), float(self.learned != "sel")


def _chain_sum(emb: torch.Tensor, jumps: list, scale: float) -> torch.Tensor:
    """Sum of ``emb`` along each op's chain (see ``features.jump_tables``), divided by ``scale``."""
    out = emb
    for table in jumps:
        t = torch.as_tensor(table, device=emb.device)
        out = out + torch.where((t >= 0).unsqueeze(1), out[t.clamp(min=0)], 0.0)
    return out / scale


class DopplerPolicy(BasePolicy):
    """The dual policy: encoder + SEL head + PLC head. ``config`` rebuilds it (:func:`doppler.policy.architectures.load_policy` loads a saved one).

    ``op_features`` names the static op features it reads (``"full"``: all of
    :data:`~doppler.policy.features.OP_FEATURES`; ``"structural"``: the position-free ones a
    transferable policy uses). ``learned`` says which heads decide (:data:`LEARNED_HEADS`): both (DOPPLER),
    or only SEL or only PLC, the other following CRITICAL PATH's rule (the paper's single-head ablations).
    ``device_identity``: the device count of the one cluster it is trained for, whose devices the PLC
    head then tells apart by a learned state each (0: none; it serves any cluster)."""

    architecture = "doppler"
    methods = tuple(LEARNED_HEADS.values())
    takes_device_identity = True

    def __init__(self, hidden: int = 128, steps: int = 6, mlp_hidden: int = 128, basis: int = 4,
                 op_features: str = "full", learned: str = "both", list_schedule: str = "critical_path",
                 device_identity: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.op_columns = op_feature_columns(op_features)
        if learned not in LEARNED_HEADS:
            raise ValueError(f"learned must be one of {', '.join(LEARNED_HEADS)}, got {learned!r}")
        if list_schedule not in LIST_SCHEDULES:
            raise ValueError(f"list_schedule must be one of {', '.join(LIST_SCHEDULES)}, got {list_schedule!r}")
        self.learned = learned
        self.list_schedule = list_schedule
        self.config = {"hidden": hidden, "steps": steps, "mlp_hidden": mlp_hidden, "basis": basis,
                       "op_features": op_features, "learned": learned, "list_schedule": list_schedule}  # fmt: skip
        if device_identity:
            self.config["device_identity"] = int(device_identity)
        self.encoder = GraphEncoder(hidden, steps, basis, len(self.op_columns))
        self.sel = SelHead(hidden, mlp_hidden, len(self.op_columns))
        self.plc = PlcHead(hidden, mlp_hidden, op_dim=len(self.op_columns), device_identity=device_identity)

    @classmethod
    def build(cls, method: str, *, num_devices: int, hidden: int, steps: int, mlp_hidden: int, op_features: str,
              list_schedule: str = "critical_path", device_identity: bool = False) -> DopplerPolicy:  # fmt: skip
        """DOPPLER's sizes as given; ``method`` says which heads are learned (:data:`LEARNED_HEADS`)."""
        learned = next(h for h, m in LEARNED_HEADS.items() if m == method)
        return cls(hidden, steps, mlp_hidden, op_features=op_features, learned=learned, list_schedule=list_schedule,
                   device_identity=num_devices if device_identity else 0)  # fmt: skip

    @property
    def method(self) -> str:
        """The method name this policy makes (:data:`LEARNED_HEADS`)."""
        return LEARNED_HEADS[self.learned]

    def encode(self, gf: GraphFeatures) -> Encoded:
        """Run the encoder once and precompute every op-dependent head input (on the policy's device)."""
        dev = self.device
        op_x = torch.from_numpy(gf.op_x[:, self.op_columns]).to(dev)
        emb = self.encoder(op_x, torch.from_numpy(gf.edge_index).to(dev), torch.from_numpy(gf.edge_attr).to(dev))
        down = _chain_sum(emb, gf.down_jumps, gf.path_scale)
        up = _chain_sum(emb, gf.up_jumps, gf.path_scale)
        return Encoded(
            sel_score=self.sel(op_x, emb, down, up),
            plc_op=self.plc.op_part(op_x, emb),
            plc_placed=self.plc.placed_part(emb),
            plc_query=self.plc.aff_q(emb),
            plc_dev=self.plc.device_matrix(),
            plc_w_out=self.plc.out.weight.squeeze(0),
            plc_b_out=self.plc.out.bias.squeeze(0),
            plc_init=self.plc.initial_placed(gf.num_devices, emb),
            learned=self.learned,
            list_schedule=self.list_schedule,
        )
