"""The shipped policy without torch (doppler.policy.infer): the numpy encoder computes the torch
policy's heads, its decodes are the torch path's, the shipped weights match the shipped
checkpoint, a stale or missing weights file falls back to torch, and ``assign`` never imports torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from doppler import cluster, workloads
from doppler.policy import infer
from doppler.policy.architectures import load_policy
from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, write_checkpoint
from doppler.policy.decode import make_plan
from doppler.policy.features import graph_features
from doppler.policy.networks import DopplerPolicy
from doppler.policy.rollout import numpy_heads, rollout

CFG = {"hidden": 16, "steps": 2, "mlp_hidden": 12, "basis": 3}


def twin(policy: DopplerPolicy) -> infer.NumpyPolicy:
    weights = {k: v.detach().float().numpy() for k, v in policy.state_dict().items()}
    return infer.NumpyPolicy({"policy_config": policy.config, "graphs": []}, weights)


@pytest.mark.parametrize("op_features,learned,list_schedule,identity", [("full", "both", "critical_path", False),
                                                                         ("structural", "both", "heft", False),
                                                                         ("full", "sel", "heft", False),
                                                                         ("full", "both", "heft", True)])  # fmt: skip
@pytest.mark.parametrize("family,preset", [("random", "p100x4"), ("llama_block", "v100x8"), ("chainmm", "unit:3")])
def test_numpy_heads_match_the_torch_policy(op_features, learned, list_schedule, identity, family, preset):
    g = workloads.build(family, num_ops=60, seed=2) if family == "random" else workloads.build(family)
    gf = graph_features(g, cluster(preset))
    torch.manual_seed(3)
    policy = DopplerPolicy(**CFG, op_features=op_features, learned=learned, list_schedule=list_schedule,
                           device_identity=gf.num_devices if identity else 0)  # fmt: skip
    if identity:
        with torch.no_grad():
            policy.plc.device_init.normal_(0.0, 0.5)
    with torch.no_grad():
        enc = policy.encode(gf)
        want = numpy_heads(enc)
        want_ro = rollout(gf, enc, batch=3, mode="sample", rng=np.random.default_rng(5))
        want_greedy = rollout(gf, enc, batch=1, mode="greedy")
    got = twin(policy).heads(gf)
    arrays = ("sel", "plc_op", "plc_placed", "plc_query", "plc_dev", "w_out", None, "plc_init")
    assert len(got) == len(want) == len(arrays)
    for name, a, b in zip(arrays, got, want):
        if name is None:  # b_out
            assert a == pytest.approx(b, rel=1e-6)
            continue
        assert a.shape == b.shape and a.dtype == np.float64, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())), err_msg=name)
    assert bool(np.abs(got[-1]).max() > 0) == identity
    tw = twin(policy)
    ro = tw.decode(gf, make_plan(gf.num_ops, batch=3, mode="sample", rng=np.random.default_rng(5)))
    greedy = tw.decode(gf, make_plan(gf.num_ops, batch=1, mode="greedy"))
    # greedy ties within GREEDY_TIE_RTOL go to the lowest id, so rounding apart the decodes are the same
    np.testing.assert_array_equal(greedy.assignment, want_greedy.assignment)
    np.testing.assert_array_equal(greedy.order, want_greedy.order)
    assert ro.assignment.shape == want_ro.assignment.shape


def test_export_load_and_staleness(tmp_path, monkeypatch):
    torch.manual_seed(0)
    policy = DopplerPolicy(**CFG, op_features="structural", list_schedule="heft")
    run = tmp_path / "run"
    write_checkpoint(run, {"format": "doppler-checkpoint-1", "policy_config": policy.config,
                           "state_dict": policy.state_dict(), "graphs": [], "cluster": ""}, {})  # fmt: skip
    npz = infer.export_weights(run / "checkpoint.pt", tmp_path / "weights.npz")
    loaded = infer.NumpyPolicy.from_npz(npz)
    assert loaded.meta["policy_config"] == policy.config and loaded.meta["graphs"] == []
    assert loaded.list_schedule == "heft" and loaded.method == "doppler"
    monkeypatch.setattr(infer, "PRETRAINED_CHECKPOINT", run / "checkpoint.pt")
    monkeypatch.setattr(infer, "INFERENCE_WEIGHTS", npz)
    assert infer.load_shipped() is not None
    (run / "checkpoint.pt").write_bytes((run / "checkpoint.pt").read_bytes() + b"\0")  # another checkpoint
    assert infer.load_shipped() is None
    npz.write_bytes(b"not an npz")
    assert infer.load_shipped() is None
    npz.unlink()
    assert infer.load_shipped() is None
    ident = DopplerPolicy(**CFG, device_identity=3)  # learned for one cluster: not for a decoder of every cluster
    write_checkpoint(tmp_path / "ident", {"format": "doppler-checkpoint-1", "policy_config": ident.config,
                                          "state_dict": ident.state_dict(), "graphs": [], "cluster": ""}, {})  # fmt: skip
    with pytest.raises(ValueError, match="device identity serves its training cluster only"):
        infer.export_weights(tmp_path / "ident" / "checkpoint.pt", tmp_path / "w2.npz")
    assert not (tmp_path / "w2.npz").exists()


def test_shipped_weights_are_exported_from_the_shipped_checkpoint():
    shipped = infer.load_shipped()
    assert shipped is not None, "weights.npz is missing or stale: run `python -m doppler.policy.infer`"
    policy, _ = load_policy(PRETRAINED_CHECKPOINT)
    for k, v in policy.state_dict().items():
        np.testing.assert_array_equal(shipped.w[k], v.numpy(), err_msg=k)


def test_assign_with_the_shipped_policy_does_not_import_torch():
    code = ("import sys\n"
            "from doppler import cluster, workloads\n"
            "from doppler.methods import assign\n"
            "g = workloads.build('llama_block')\n"
            "a = assign(g, cluster('v100x8'), 'doppler')\n"
            "b = assign(g, cluster('v100x8'), 'doppler', samples=4, seed=1)\n"
            "assert a.info['zero_shot'] and a.info['pretrained'], a.info\n"
            "print('torch' in sys.modules)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


def test_fast_path_places_like_the_checkpoint_loaded_with_torch():
    from doppler.methods import assign

    g = workloads.build("llama_layer")
    for preset in ("v100x8", "p100x4"):
        fast = assign(g, cluster(preset), "doppler")
        slow = assign(g, cluster(preset), "doppler", checkpoint=PRETRAINED_CHECKPOINT)
        np.testing.assert_array_equal(fast.devices, slow.devices)
