"""What the learned baselines GDP and PLACETO share: an output layer of one unit per device, so a
policy serves clusters of exactly the device count it was built for."""

from __future__ import annotations

from typing import Any

from doppler.policy.base import BasePolicy
from doppler.policy.features import GraphFeatures, op_feature_columns


class FixedOutputPolicy(BasePolicy):
    """The base of GDP and PLACETO: ``num_devices`` (checked), ``config`` (what a checkpoint rebuilds
    the policy from: the class's ``architecture``, ``num_devices``, then ``config`` in the order given)
    and ``op_columns`` (the columns of ``config["op_features"]``)."""

    def __init__(self, num_devices: int, **config: Any) -> None:
        super().__init__()
        if num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {num_devices}")
        self.num_devices = num_devices
        self.config = {"architecture": self.architecture, "num_devices": num_devices, **config}
        self.op_columns = op_feature_columns(config["op_features"])

    def check_device_outputs(self, gf: GraphFeatures) -> None:
        """ValueError unless ``gf``'s cluster has this policy's device count."""
        if gf.num_devices != self.num_devices:
            raise ValueError(f"this {self.architecture.upper()} policy has {self.num_devices} device "
                             f"outputs; the cluster has {gf.num_devices}")  # fmt: skip
