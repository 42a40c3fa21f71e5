"""Every learned method (DOPPLER, its ablations and the learned baselines) trains through the same loop,
decodes what it scores, is reproducible from its seed, and keeps its checkpoints to itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from doppler import workloads
from doppler.methods import MethodError, assign
from doppler.policy import BASELINE_METHODS, LEARNED_METHODS
from doppler.policy.architectures import build_policy, policy_from_config
from doppler.policy.features import graph_features
from doppler.policy.rollout import evaluate_actions, rollout
from doppler.hardware.presets import cluster
from doppler.train import Trainer, TrainConfig

SMALL = dict(hidden=16, mlp_hidden=16, mp_steps=2)


def _graph():
    return workloads.build("random", num_ops=24, seed=3), cluster("p100x4")


@pytest.mark.parametrize("method", LEARNED_METHODS)
def test_the_greedy_decode_takes_what_the_scores_rank_first_and_samples_are_valid(method):
    g, c = _graph()
    gf = graph_features(g, c)
    torch.manual_seed(1)
    policy = build_policy(method, num_devices=4, hidden=16, steps=2, mlp_hidden=16)
    with torch.no_grad():
        enc = policy.encode(gf)
        greedy = rollout(gf, enc, batch=1, mode="greedy")
        sc = evaluate_actions(enc, greedy)
        sampled = rollout(gf, enc, batch=6, mode="sample", eps=0.1, rng=np.random.default_rng(0))
        ss = evaluate_actions(enc, sampled)
    w_sel, w_plc = enc.head_weights()
    if w_plc:  # PLC's arg-max is the device taken (ties go to the lowest device)
        np.testing.assert_array_equal(sc.plc_logp[0].argmax(-1).numpy(), greedy.step_device[0])
    for ro in (greedy, sampled):  # every trajectory is a valid ASSIGN: each op once, after its inputs
        for b in range(ro.batch):
            assert sorted(ro.order[b]) == list(range(g.num_ops))
            step_of = np.argsort(ro.order[b])
            assert (step_of[g.src] < step_of[g.dst]).all()
            assert ((ro.assignment[b] >= 0) & (ro.assignment[b] < 4)).all()
    assert torch.isfinite(ss.logp_plc).all() and torch.isfinite(ss.logp_sel).all()
    assert (ss.logp_plc <= 1e-6).all() and (ss.logp_sel <= 1e-6).all()
    assert not w_sel == w_plc == 0.0


@pytest.mark.parametrize("method", BASELINE_METHODS)
def test_a_baseline_trains_in_the_shared_loop_and_assigns_reproducibly(tmp_path, method):
    g, c = _graph()

    def train(run):
        cfg = TrainConfig(method=method, il_episodes=16, il_batch=8, episodes=32, batch=8, search_every=16,
                          search_evals=100, distill_updates=3, seed=4, **{**SMALL, "hidden": 32})  # (PLACETO: 16)
        tr = Trainer.create([g], c, cfg)
        start = {k: v.clone() for k, v in tr.policy.state_dict().items()}
        tr.run(tmp_path / run)
        assert any(not torch.equal(v, start[k]) for k, v in tr.policy.state_dict().items())  # it learned something
        return tr

    a, b = train("a"), train("b")
    for k, v in a.policy.state_dict().items():  # the same seed trains the same weights
        assert torch.equal(v, b.policy.state_dict()[k]), k
    ckpt = tmp_path / "a" / "checkpoint.pt"
    got = assign(g, c, method, checkpoint=ckpt)
    assert got.devices.shape == (g.num_ops,) and ((got.devices >= 0) & (got.devices < 4)).all()
    np.testing.assert_array_equal(got.devices, assign(g, c, method, checkpoint=ckpt).devices)
    other = "gdp" if method != "gdp" else "placeto"
    with pytest.raises(MethodError, match=f"is a {method} checkpoint, not {other}: use --method {method}"):
        assign(g, c, other, checkpoint=ckpt)
    if method in ("gdp", "placeto"):  # one output unit per device: another device count is refused
        with pytest.raises(MethodError, match="4 device outputs cannot serve cluster 'p100x4:2'"):
            assign(g, cluster("p100x4:2"), method, checkpoint=ckpt)
    from doppler.cli.train_cmd import trainer_from_init
    from doppler.policy.checkpoint import CheckpointError

    tuned = TrainConfig(method=method, stages=("sim",), episodes=8, batch=8, search_every=0, distill_updates=0)
    again = trainer_from_init([g], c, tuned, str(ckpt))  # `doppler train --init`: the same network, its weights
    for k, v in again.policy.state_dict().items():
        assert torch.equal(v, a.policy.state_dict()[k]), k
    if method in ("gdp", "placeto"):
        with pytest.raises(CheckpointError, match="one output unit per device: its 4 cannot serve cluster 'p100x4:2'"):
            trainer_from_init([g], cluster("p100x4:2"), tuned, str(ckpt))


@pytest.mark.parametrize("method", LEARNED_METHODS)
def test_a_saved_config_rebuilds_the_same_network(method):
    policy = build_policy(method, num_devices=3, hidden=16, steps=2, mlp_hidden=16)
    again = policy_from_config(policy.config)
    assert type(again) is type(policy) and again.method == method == policy.method
    again.load_state_dict(policy.state_dict())  # same shapes, same names


def test_an_unknown_architecture_is_an_error():
    with pytest.raises(ValueError, match="unknown architecture 'tabu'"):
        policy_from_config({"architecture": "tabu"})
    with pytest.raises(ValueError, match="unknown learned method"):
        build_policy("tabu", num_devices=2)


def test_every_learned_method_has_one_policy_class():
    from doppler.policy.architectures import ARCHITECTURES, POLICY_OF_METHOD
    from doppler.policy.base import BasePolicy

    assert sorted(POLICY_OF_METHOD) == sorted(LEARNED_METHODS)
    assert sum(len(cls.methods) for cls in ARCHITECTURES.values()) == len(LEARNED_METHODS)  # no method twice
    for name, cls in ARCHITECTURES.items():
        assert issubclass(cls, BasePolicy) and cls.architecture == name


@pytest.mark.parametrize("method", LEARNED_METHODS)
def test_a_checkpoints_sizes_build_its_network_again(method):
    """config_sizes inverts each class's scaling of the asked sizes (PLACETO halves the width)."""
    from doppler.policy.architectures import config_sizes

    policy = build_policy(method, num_devices=3, hidden=32, steps=2, mlp_hidden=16)
    sizes = config_sizes({"architecture": "doppler", **policy.config})
    assert sizes == {"hidden": 32, "mp_steps": 2, "mlp_hidden": 16}
    again = build_policy(method, num_devices=3, hidden=sizes["hidden"], steps=sizes["mp_steps"],
                         mlp_hidden=sizes["mlp_hidden"])  # fmt: skip
    assert again.config == policy.config


@pytest.mark.parametrize("method", BASELINE_METHODS)
def test_device_identity_is_refused_by_a_policy_without_it(method):
    with pytest.raises(ValueError, match=f"device identity is an input of DOPPLER's device head, not of {method}"):
        build_policy(method, num_devices=2, device_identity=True)
