"""The single-head ablations (doppler_sel, doppler_plc): the other head follows CRITICAL PATH's rule,
is never trained, and checkpoints say which method they are."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from doppler import workloads
from doppler.methods import MethodError, assign
from doppler.methods.critical_path import critical_path_trace
from doppler.policy.features import graph_features
from doppler.policy.networks import DopplerPolicy
from doppler.policy.rollout import rollout
from doppler.hardware.presets import cluster
from doppler.train import Trainer, TrainConfig, TrainError

SMALL = dict(hidden=32, mlp_hidden=32, mp_steps=3)


def _graph():
    return workloads.build("random", num_ops=40, seed=5), cluster("p100x4")


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_a_rule_head_decides_as_critical_path_does(mode):
    g, c = _graph()
    gf = graph_features(g, c)
    trace = critical_path_trace(g, c)
    rng = np.random.default_rng(0)
    with torch.no_grad():
        plc_only = rollout(gf, DopplerPolicy(32, 3, 32, learned="plc").encode(gf), batch=4, mode=mode, rng=rng)
        sel_only = rollout(gf, DopplerPolicy(32, 3, 32, learned="sel").encode(gf), batch=4, mode=mode, rng=rng)
        both = rollout(gf, DopplerPolicy(32, 3, 32).encode(gf), batch=4, mode=mode, rng=rng)
    # learned PLC, rule SEL: every episode visits the ops in CRITICAL PATH's order
    assert (plc_only.order == trace.order[None, :]).all()
    # learned SEL, rule PLC: every op goes to the lowest device tied for the earliest start
    B, n = sel_only.order.shape
    first_tied = sel_only.est_tied.argmax(axis=2)
    assert (sel_only.step_device == first_tied).all()
    # an untrained dual policy does neither (the test can fail)
    assert not (both.order == trace.order[None, :]).all() or not (both.step_device == both.est_tied.argmax(2)).all()


@pytest.mark.parametrize(("method", "frozen"), [("doppler_sel", "plc"), ("doppler_plc", "sel")])
def test_training_leaves_the_rule_head_untouched_and_the_method_assigns(tmp_path, method, frozen):
    g, c = _graph()
    cfg = TrainConfig(method=method, il_episodes=16, il_batch=8, episodes=32, batch=8, search_every=16,
                      search_evals=200, distill_updates=4, **SMALL)  # fmt: skip
    tr = Trainer.create([g], c, cfg)
    before = {k: v.clone() for k, v in getattr(tr.policy, frozen).state_dict().items()}
    learned = {k: v.clone() for k, v in getattr(tr.policy, "sel" if frozen == "plc" else "plc").state_dict().items()}
    tr.run(tmp_path / "run")
    for k, v in getattr(tr.policy, frozen).state_dict().items():
        assert torch.equal(v, before[k]), k  # no gradient ever reached the rule head
    after = getattr(tr.policy, "sel" if frozen == "plc" else "plc").state_dict()
    assert any(not torch.equal(after[k], learned[k]) for k in learned)  # the learned head did train
    ckpt = tmp_path / "run" / "checkpoint.pt"
    a1 = assign(g, c, method, checkpoint=ckpt)
    a2 = assign(g, c, method, checkpoint=ckpt)
    assert a1.devices.shape == (g.num_ops,) and ((a1.devices >= 0) & (a1.devices < 4)).all()
    np.testing.assert_array_equal(a1.devices, a2.devices)  # the same checkpoint decodes the same
    with pytest.raises(MethodError, match=f"is a {method} checkpoint, not doppler: use --method {method}"):
        assign(g, c, "doppler", checkpoint=ckpt)


def test_a_dual_checkpoint_is_refused_by_an_ablation_and_bad_names_are_errors():
    g, c = _graph()
    with pytest.raises(MethodError, match="shipped pretrained policy is a doppler checkpoint, not doppler_sel"):
        assign(g, c, "doppler_sel")
    with pytest.raises(TrainError, match="unknown method 'placetto' .*doppler, doppler_sel, doppler_plc, single_policy, gdp, placeto"):
        TrainConfig(method="placetto").validate()
    with pytest.raises(ValueError, match="learned must be one of"):
        DopplerPolicy(learned="neither")
