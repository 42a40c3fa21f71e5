"""What every learned policy is: DOPPLER's dual policy, its ablations and the learned baselines.

A policy is a torch module that encodes a graph once (:meth:`BasePolicy.encode`); what it returns
decodes a batch of episodes and re-scores their actions (:func:`doppler.policy.rollout.run_plan`,
:func:`doppler.policy.rollout.evaluate_actions`), so the training loop and ``doppler assign`` run any
of them alike. Each class names the ``architecture`` a checkpoint records and the learned ``methods``
it makes; :data:`doppler.policy.architectures.ARCHITECTURES` is the table of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from torch import nn

from doppler.policy.features import GraphFeatures


class BasePolicy(nn.Module, ABC):
    """A learned policy. ``config`` holds its constructor's arguments (what a checkpoint's
    ``policy_config`` rebuilds it from, with ``architecture`` unless it is DOPPLER's) and
    ``op_columns`` the columns of the static op features it reads."""

    #: the name a checkpoint's ``policy_config`` records (``architecture``)
    architecture: ClassVar[str]
    #: the learned methods this class makes (``doppler train --method``, ``doppler assign --method``)
    methods: ClassVar[tuple[str, ...]]
    #: the training loop multiplies its learning rates by this
    lr_scale: ClassVar[float] = 1.0
    #: whether its device head can learn a state for each device of its training cluster (``device_identity``)
    takes_device_identity: ClassVar[bool] = False

    config: dict[str, Any]
    op_columns: list[int]

    @classmethod
    @abstractmethod
    def build(cls, method: str, *, num_devices: int, hidden: int, steps: int, mlp_hidden: int, op_features: str,
              list_schedule: str = "critical_path", device_identity: bool = False) -> BasePolicy:  # fmt: skip
        """A fresh policy of ``method`` (one of :attr:`methods`) for ``num_devices`` devices, from a training
        run's sizes: the embedding width ``hidden``, ``steps`` rounds of message passing, the heads' width
        ``mlp_hidden`` (a class may scale them; :meth:`asked_sizes` inverts that), reading the op features
        ``op_features``. DOPPLER's policies only: ``list_schedule``, the list-schedule model of the device
        head, and ``device_identity`` (where :attr:`takes_device_identity`)."""

    @classmethod
    def asked_sizes(cls, config: dict[str, Any]) -> dict[str, int]:
        """The sizes ``(hidden, mp_steps, mlp_hidden)`` of a :class:`~doppler.train.TrainConfig` whose
        :meth:`build` gives a policy of ``config`` again."""
        return {"hidden": config["hidden"], "mp_steps": config["steps"], "mlp_hidden": config["mlp_hidden"]}

    @property
    def method(self) -> str:
        """The learned method this policy makes."""
        return self.methods[0]

    @property
    def device(self) -> torch.device:
        """Where its weights are (and its encodings will be)."""
        return next(self.parameters()).device

    @abstractmethod
    def encode(self, gf: GraphFeatures) -> Any:
        """One pass over a graph's features (on :attr:`device`), which every episode of a batch shares:
        DOPPLER's :class:`~doppler.policy.networks.Encoded`, or a baseline's
        :class:`~doppler.policy.rollout.Decoder`."""
