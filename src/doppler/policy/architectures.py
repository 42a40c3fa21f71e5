"""Which network each learned method is, and how a saved configuration or checkpoint rebuilds it.

Every learned policy is a :class:`~doppler.policy.base.BasePolicy`: DOPPLER and its single-head
ablations are :class:`~doppler.policy.networks.DopplerPolicy`; the learned baselines each have their
own module (:mod:`~doppler.policy.single`, :mod:`~doppler.policy.gdp`, :mod:`~doppler.policy.placeto`).
:data:`ARCHITECTURES` lists them by the name a checkpoint records; each class says which methods it
makes and builds itself from a training run's sizes. Whatever ``encode`` returns, the rollout and the
re-scoring of :mod:`doppler.policy.rollout` accept: the training loop does not know which it runs.

A checkpoint (:mod:`doppler.policy.checkpoint`, the file format) is read here, where its
``policy_config`` can be checked against the network it builds: :func:`read_checkpoint`, and
:func:`load_policy` for the policy itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from doppler.hardware.cluster import Cluster
from doppler.policy.base import BasePolicy
from doppler.policy.checkpoint import (
    CheckpointError, checkpoint_file, identity_left_out, read_archive, shown_value, strip_device_identity,
)  # fmt: skip
from doppler.policy.gdp import GdpPolicy
from doppler.policy.networks import DopplerPolicy
from doppler.policy.placeto import PlacetoPolicy
from doppler.policy.single import SinglePolicy

#: every policy class, by the ``architecture`` its checkpoints record (DOPPLER's own config names none)
ARCHITECTURES: dict[str, type[BasePolicy]] = {cls.architecture: cls for cls in (DopplerPolicy, SinglePolicy, GdpPolicy,
                                                                                PlacetoPolicy)}  # fmt: skip
#: the policy class of every learned method
POLICY_OF_METHOD: dict[str, type[BasePolicy]] = {m: cls for cls in ARCHITECTURES.values() for m in cls.methods}
#: the most message-passing steps of a policy (DOPPLER's encoder repeats one layer this many times per encoding:
#: a checkpoint's or a configuration's count past it would stall every decode; the paper uses 6)
MAX_MP_STEPS = 64
#: the widest embedding or hidden layer of a policy (``hidden``, ``mlp_hidden``): a policy of this width holds
#: at most 100 MB of weights, so that its checkpoint (the weights, the optimizer's two moments and a best copy:
#: about 400 MB) stays within what a checkpoint may hold (:data:`doppler.importer.files.MAX_ZIP_TOTAL_BYTES`);
#: the default is 128
MAX_WIDTH = 1024


def build_policy(method: str, *, num_devices: int, hidden: int = 128, steps: int = 6, mlp_hidden: int = 128,
                 op_features: str = "full", list_schedule: str = "critical_path",
                 device_identity: bool = False) -> BasePolicy:  # fmt: skip
    """A fresh policy of ``method`` from a training run's sizes (DOPPLER's as given; each class's
    :meth:`~doppler.policy.base.BasePolicy.build` says how it scales them). ``list_schedule`` (DOPPLER's
    policies only): the list-schedule model of PLC's features and rule. ``device_identity`` (DOPPLER's
    policies only): a learned state for each of the ``num_devices``."""
    cls = POLICY_OF_METHOD.get(method)
    if cls is None:
        raise ValueError(f"unknown learned method {method!r}")
    if device_identity and not cls.takes_device_identity:
        raise ValueError(f"device identity is an input of DOPPLER's device head, not of {method}")
    return cls.build(method, num_devices=num_devices, hidden=hidden, steps=steps, mlp_hidden=mlp_hidden,
                     op_features=op_features, list_schedule=list_schedule, device_identity=device_identity)  # fmt: skip


def config_sizes(policy_config: dict) -> dict[str, int]:
    """The sizes ``(hidden, mp_steps, mlp_hidden)`` of a :class:`~doppler.train.TrainConfig` from which
    :func:`build_policy` builds a policy of ``policy_config`` again."""
    return ARCHITECTURES[policy_config.get("architecture", "doppler")].asked_sizes(policy_config)


def policy_from_config(config: dict) -> BasePolicy:
    """Rebuild a policy from its ``config`` (as saved in a checkpoint's ``policy_config``)."""
    config = dict(config)
    arch = config.pop("architecture", "doppler")
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}")
    return ARCHITECTURES[arch](**config)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint (a file, or a run directory holding ``checkpoint.pt``) with ``weights_only=True``:
    a file of the format (:func:`~doppler.policy.checkpoint.read_archive`) whose ``policy_config`` builds
    exactly the network of its ``state_dict`` (checked on the meta device: nothing is allocated for sizes
    the file made up). The ``policy_config`` then holds every setting, its defaults filled in, so that
    readers need not know them."""
    p = checkpoint_file(path)
    ck = read_archive(p)
    ck["policy_config"] = _built_config(ck["policy_config"], ck["state_dict"], p, "state_dict")
    best = ck.get("distill_best")
    if best is not None:  # (the weights distillation may restore: the same network's)
        if not (isinstance(best.get("score"), (int, float)) and isinstance(best.get("state_dict"), dict)):
            raise CheckpointError(f"{p}: a damaged checkpoint: distill_best is {shown_value(best)}, not a score and a "
                                  "state_dict")  # fmt: skip
        _built_config(ck["policy_config"], best["state_dict"], p, "distill_best.state_dict")
    return ck


def _built_config(config: dict[str, Any], weights: dict[str, Any], p: Path, where: str) -> dict[str, Any]:
    """The config of the policy ``config`` builds (the same values, and the defaults of those it leaves out), if
    that policy's weights have exactly the names and shapes of ``weights``; else CheckpointError."""
    steps = config.get("steps", 0)  # (a loop count, not a weight: DOPPLER's encoder repeats one layer)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_MP_STEPS:
        raise CheckpointError(f"{p}: a damaged checkpoint: policy_config steps is {steps!r}, not a message-passing "
                              f"step count from 0 to {MAX_MP_STEPS}")  # fmt: skip
    bad_weight = next((k for k, w in weights.items() if not (isinstance(k, str) and torch.is_tensor(w))), None)
    if bad_weight is not None:
        raise CheckpointError(f"{p}: a damaged checkpoint: {where} entry {shown_value(bad_weight)} is "
                              f"{shown_value(weights[bad_weight])}, not a tensor")  # fmt: skip
    try:
        with torch.device("meta"):
            policy = policy_from_config(config)
    except Exception as e:  # noqa: BLE001 - a constructor fed the file's values: any failure means a bad file
        raise CheckpointError(f"{p}: a damaged checkpoint: its policy_config builds no policy ({type(e).__name__}: "
                              f"{str(e).splitlines()[0][:100] if str(e) else 'no message'})") from None  # fmt: skip
    built = dict(policy.config)
    kept = {**built, "architecture": built.get("architecture", "doppler")}  # (DOPPLER's own config names none)
    changed = [k for k, v in config.items() if kept.get(k) != v or type(kept.get(k)) is not type(v)]
    if changed:
        k = changed[0]
        raise CheckpointError(f"{p}: a damaged checkpoint: policy_config {k} is {shown_value(config[k])}, which the "
                              f"policy does not keep as it is ({shown_value(kept.get(k))})")  # fmt: skip
    expected = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    saved = {k: tuple(w.shape) for k, w in weights.items()}
    if saved != expected:
        k = next(k for k in sorted(set(saved) | set(expected)) if saved.get(k) != expected.get(k))
        what = ("missing" if k not in saved else "not a weight of this policy" if k not in expected else
                f"of shape {list(saved[k])}, not {list(expected[k])}")  # fmt: skip
        raise CheckpointError(f"{p}: a damaged checkpoint: {where} weight {k!r} is {what} (its policy_config "
                              f"says {shown_value(config)})")  # fmt: skip
    return built


def load_policy(path: str | Path, cluster: Cluster | None = None) -> tuple[BasePolicy, dict[str, Any]]:
    """The trained policy of a checkpoint (in eval mode; any learned method's) and the checkpoint's metadata.
    ``cluster``: where it will decode; a policy with device identity leaves it out on any cluster but
    its training one (:func:`~doppler.policy.checkpoint.identity_serves`). Without ``cluster`` the
    identity is kept: decode such a policy on its training cluster only."""
    ck = read_checkpoint(path)
    try:
        config, weights = ck["policy_config"], ck["state_dict"]
        if cluster is not None and identity_left_out(ck, cluster):
            config, weights = strip_device_identity(config, weights)
        policy = policy_from_config(config)
        policy.load_state_dict(weights)
    except (KeyError, RuntimeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: checkpoint weights do not match the policy ({str(e).splitlines()[0][:120]})") from None
    policy.eval()
    return policy, ck
