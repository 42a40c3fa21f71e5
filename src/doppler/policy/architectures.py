"""Which network each learned method is, and how a saved configuration rebuilds it.

DOPPLER and its single-head ablations are :class:`~doppler.policy.networks.DopplerPolicy`; the
learned baselines each have their own module (:mod:`~doppler.policy.single`,
:mod:`~doppler.policy.gdp`, :mod:`~doppler.policy.placeto`). Every one of them has ``method``,
``config`` (enough to rebuild it) and ``encode(graph features)``, whose result the rollout and the
re-scoring of :mod:`doppler.policy.rollout` accept: the training loop does not know which it runs.
"""

from __future__ import annotations

from torch import nn

from doppler.policy import LEARNED_HEADS
from doppler.policy.gdp import GdpPolicy
from doppler.policy.networks import DopplerPolicy
from doppler.policy.placeto import PlacetoPolicy
from doppler.policy.single import SinglePolicy

#: the architectures that are not DOPPLER's dual policy, by method name
BASELINE_POLICIES: dict[str, type[nn.Module]] = {"single_policy": SinglePolicy, "gdp": GdpPolicy, "placeto": PlacetoPolicy}
#: architectures whose output layer has one unit per device (they serve that device count only)
FIXED_DEVICE_COUNT = ("gdp", "placeto")
#: the most message-passing steps of a policy (DOPPLER's encoder repeats one layer this many times per encoding:
#: a checkpoint's or a configuration's count past it would stall every decode; the paper uses 6)
MAX_MP_STEPS = 64
#: the widest embedding or hidden layer of a policy (``hidden``, ``mlp_hidden``): a GRU of this width holds
#: 100 M weights; the default is 128
MAX_WIDTH = 4096


def build_policy(method: str, *, num_devices: int, hidden: int = 128, steps: int = 6, mlp_hidden: int = 128,
                 op_features: str = "full", list_schedule: str = "critical_path",
                 device_identity: bool = False) -> nn.Module:  # fmt: skip
    """A fresh policy of ``method`` (DOPPLER's sizes; PLACETO and GDP take at most 3 message-passing
    rounds and PLACETO half the width, since they embed far more often or run a transformer after).
    ``list_schedule`` (DOPPLER's policies only): the list-schedule model of PLC's features and rule.
    ``device_identity`` (DOPPLER's policies only): a learned state for each of the ``num_devices``."""
    heads = {m: h for h, m in LEARNED_HEADS.items()}
    if device_identity and method not in heads:
        raise ValueError(f"device identity is an input of DOPPLER's device head, not of {method}")
    if method in heads:
        return DopplerPolicy(hidden, steps, mlp_hidden, op_features=op_features, learned=heads[method],
                             list_schedule=list_schedule, device_identity=num_devices if device_identity else 0)  # fmt: skip
    if method == "single_policy":
        return SinglePolicy(hidden, steps, mlp_hidden, op_features=op_features)
    if method == "gdp":
        return GdpPolicy(num_devices, hidden, min(steps, 3), mlp_hidden, op_features=op_features)
    if method == "placeto":
        return PlacetoPolicy(num_devices, max(hidden // 2, 8), min(steps, 3), mlp_hidden, op_features=op_features)
    raise ValueError(f"unknown learned method {method!r}")


def config_sizes(policy_config: dict) -> dict[str, int]:
    """The sizes ``(hidden, mp_steps, mlp_hidden)`` of a :class:`~doppler.train.TrainConfig` from which
    :func:`build_policy` builds a policy of ``policy_config`` again (PLACETO's width is half the asked one)."""
    hidden = policy_config["hidden"] * (2 if policy_config.get("architecture") == "placeto" else 1)
    return {"hidden": hidden, "mp_steps": policy_config["steps"], "mlp_hidden": policy_config["mlp_hidden"]}


def policy_from_config(config: dict) -> nn.Module:
    """Rebuild a policy from its ``config`` (as saved in a checkpoint's ``policy_config``)."""
    config = dict(config)
    arch = config.pop("architecture", "doppler")
    if arch == "doppler":
        return DopplerPolicy(**config)
    if arch not in BASELINE_POLICIES:
        raise ValueError(f"unknown architecture {arch!r}")
    return BASELINE_POLICIES[arch](**config)
