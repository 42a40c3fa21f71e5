"""BasePolicy: what a policy must implement (build, encode), and what it gets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from doppler.policy.base import BasePolicy


class _Tiny(BasePolicy):
    architecture = "tiny"
    methods = ("tiny", "tiny_too")

    def __init__(self, hidden: int = 4, steps: int = 1, mlp_hidden: int = 4) -> None:
        super().__init__()
        self.config = {"architecture": "tiny", "hidden": hidden, "steps": steps, "mlp_hidden": mlp_hidden}
        self.lin = nn.Linear(hidden, mlp_hidden)

    @classmethod
    def build(cls, method, *, num_devices, hidden, steps, mlp_hidden, op_features, list_schedule="critical_path",
              device_identity=False):  # fmt: skip
        return cls(hidden, steps, mlp_hidden)

    def encode(self, gf):
        return self.lin.weight.sum()


def test_a_policy_must_implement_build_and_encode():
    with pytest.raises(TypeError, match="abstract"):
        BasePolicy()

    class NoEncode(BasePolicy):
        @classmethod
        def build(cls, method, **sizes):
            return cls()

    with pytest.raises(TypeError, match="encode"):
        NoEncode()


def test_what_a_policy_gets_from_the_base():
    p = _Tiny.build("tiny", num_devices=2, hidden=6, steps=2, mlp_hidden=3, op_features="full")
    assert isinstance(p, nn.Module) and p.method == "tiny" and p.lr_scale == 1.0 and not p.takes_device_identity
    assert p.device == torch.device("cpu")
    assert _Tiny.asked_sizes(p.config) == {"hidden": 6, "mp_steps": 2, "mlp_hidden": 3}
    with torch.device("meta"):
        assert _Tiny().device.type == "meta"
