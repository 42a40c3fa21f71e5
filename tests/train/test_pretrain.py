"""Pretraining on the corpus: fresh pairs per update, checkpoints that resume the same stream,
a policy that serves any graph and cluster; `doppler pretrain` and `train --init` end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import doppler.train as train_module
import doppler.train.tasks as tasks_module
import doppler.train.trainer as trainer_module
from doppler import cluster, workloads
from doppler.hardware.files import cluster_from_json
from doppler.methods import assign
from doppler.cli import app
from doppler.util.io import write_json
from doppler.train.pretrain import MAX_BUDGET_H, Pretrainer, pretrain_config, thin_history
from doppler.policy.architectures import read_checkpoint
from doppler.train import TrainError

TINY = dict(hidden=16, mlp_hidden=16, mp_steps=2, il_episodes=16, batch=4, search_evals=50, torch_threads=1)


def _updates(pt: Pretrainer, k: int) -> list[tuple[str, int, int]]:
    out = []
    for _ in range(k):
        st = pt.update()
        out.append((st["stage"], st["num_ops"], st["num_devices"]))
    return out


def test_every_update_draws_a_fresh_pair_and_both_stages_run():
    pt = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    seen = _updates(pt, 6)
    assert [s for s, _, _ in seen] == ["il", "il", "sim", "sim", "sim", "sim"]
    assert len({(n, d) for _, n, d in seen}) > 1
    assert pt.trainer.il_episode == 16 and pt.trainer.episode == 4 * 4


def test_defaults_imitate_heft_for_the_whole_budget():
    cfg = pretrain_config(**{**TINY, "il_episodes": 1000})
    assert cfg.list_schedule == "heft" and pretrain_config().il_episodes > 10**6  # Stage I for the whole budget
    pt = Pretrainer.create(cfg, budget_s=100.0)
    assert pt.trainer.policy.list_schedule == "heft"
    pt.elapsed_s = 99.0
    assert pt.update()["stage"] == "il" and pt.trainer.optimizer.param_groups[0]["lr"] == cfg.il_lr


def test_checkpoint_resumes_the_same_corpus_stream(tmp_path):
    full = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    first = _updates(full, 3)
    rest = _updates(full, 3)
    part = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    assert _updates(part, 3) == first
    part.save(tmp_path)
    resumed = Pretrainer.resume(tmp_path)
    assert resumed.updates == 3 and resumed.trainer.il_episode == part.trainer.il_episode
    assert _updates(resumed, 3) == rest


def test_a_run_resumed_with_its_budget_spent_leaves_its_checkpoint_as_it_was(tmp_path):
    """Killed after its last checkpoint (or resumed once done), a run that has no budget left makes no update and
    rewrites nothing: it once saved again with its first pair's cluster in place of the last one's."""
    pt = Pretrainer.create(pretrain_config(**TINY), budget_s=1e-9)  # one update spends it
    pt.run(tmp_path)
    before = (tmp_path / "checkpoint.pt").read_bytes()
    resumed = Pretrainer.resume(tmp_path)
    resumed.run(tmp_path)
    assert resumed.updates == pt.updates == 1
    assert (tmp_path / "checkpoint.pt").read_bytes() == before


def test_a_pretrained_checkpoint_serves_any_graph_and_cluster_zero_shot(tmp_path):
    pt = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    _updates(pt, 3)
    pt.save(tmp_path)
    assert read_checkpoint(tmp_path)["graphs"] == []
    for g, cl in [(workloads.build("chainmm", size="tiny"), cluster("unit:3")), (workloads.build("ffnn"), cluster("v100x8"))]:
        a = assign(g, cl, "doppler", checkpoint=tmp_path / "checkpoint.pt")
        assert a.info["zero_shot"] and not a.info["pretrained"]
        assert a.devices.shape == (g.num_ops,) and a.devices.max() < cl.num_devices


def test_resume_refuses_a_checkpoint_of_train(tmp_path):
    from doppler.train import Trainer, TrainConfig

    tr = Trainer.create([workloads.build("random", num_ops=20)], cluster("unit:2"),
                        TrainConfig(il_episodes=8, episodes=8, hidden=8, mlp_hidden=8, mp_steps=1))  # fmt: skip
    tr.save(tmp_path)
    with pytest.raises(TrainError, match="not a pretraining checkpoint"):
        Pretrainer.resume(tmp_path)


def test_train_resume_refuses_a_pretraining_run(tmp_path):
    from doppler.train import Trainer

    pt = Pretrainer.create(pretrain_config(**TINY), 3600)
    pt.save(tmp_path)
    with pytest.raises(TrainError, match="a pretraining run .*doppler pretrain -o DIR --resume"):
        Trainer.resume(tmp_path, [workloads.build("random", num_ops=20)], cluster("unit:2"))


def test_zero_or_negative_budget_is_refused():
    with pytest.raises(TrainError, match="budget"):
        Pretrainer.create(pretrain_config(**TINY), budget_s=0)
    with pytest.raises(TrainError, match=r"--budget-h must be in \(0, 1000\] hours"):
        Pretrainer.create(pretrain_config(**TINY), budget_s=MAX_BUDGET_H * 3600 * 1.001)


def _meta(**changes):
    return lambda ck: ck.update(pretrain=json.dumps({**json.loads(ck["pretrain"]), **changes}))


@pytest.mark.parametrize("change, words", [
    (_meta(budget_s=1e30), "budget_s is 1e+30, more than 1000 hours"),
    (_meta(budget_s=float("nan")), "budget_s is nan, not a finite number > 0"),
    (_meta(elapsed_s=-1.0), "elapsed_s is -1, not a training time >= 0"),
    (_meta(elapsed_s="x"), "elapsed_s is 'x', not a finite number"),
    (_meta(updates=-1), "updates is -1, not an integer from 0 to 1,000,000,000"),
    (_meta(corpus_rng={"bit_generator": "PCG64", "state": {"state": 1.5, "inc": 3}, "has_uint32": 0, "uinteger": 0}),
     "corpus_rng is not the state of numpy's PCG64 generator"),
    (_meta(workers=3), "workers is 3, but the checkpoint holds the streams of 1"),
    (_meta(workers=2, worker_streams=[{"corpus_rng": None, "numpy_rng": None}]), "worker 1's corpus_rng is not the state"),
    (_meta(worker_streams={}), "worker_streams is not a list"),
    (_meta(init=5), "init is int, not an object or null"),
    (lambda ck: ck.update(torch_rng=ck["torch_rng"][:-1]), "torch_rng is a torch.uint8 tensor of shape [5055]"),
    (lambda ck: ck["optimizer"]["state"][0].update(exp_avg=ck["optimizer"]["state"][0]["exp_avg"] * float("nan")),
     "the optimizer's exp_avg of parameter 0 holds values that are not finite"),
    (lambda ck: ck.update(episode=10**9 + 1), "episode is 1000000001, not an integer from 0 to 1,000,000,000"),
])  # fmt: skip
def test_a_damaged_pretraining_state_is_refused_when_resumed(tmp_path, change, words):
    """Each was taken as it was: a budget of 1e30 s (a run without end), a float in a generator's state, a NaN
    moment that the next update made NaN weights of."""
    from tests.fuzz.checkpoints import rewrite_checkpoint

    pt = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    _updates(pt, 3)
    pt.save(tmp_path)
    rewrite_checkpoint(tmp_path / "checkpoint.pt", change)
    with pytest.raises(TrainError) as e:
        Pretrainer.resume(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / 'checkpoint.pt'}: a damaged checkpoint: ") and words in str(e.value), str(e.value)


def test_a_pretraining_runs_config_json_must_say_what_its_checkpoint_says(tmp_path):
    pt = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    _updates(pt, 1)
    pt.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    write_json(tmp_path / "config.json", {**config, "il_lr": 0.5})
    with pytest.raises(TrainError, match="config.json: il_lr is 0.5, but the run's checkpoint says 0.002"):
        Pretrainer.resume(tmp_path)


# ---------------------------------------------------------------- the CLI
runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _usage_error(res, *words):
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_pretrain_cli_runs_resumes_and_feeds_train_init(tmp_path):
    out = tmp_path / "PT"
    res = _run("pretrain", "-o", out, "--budget-h", "0.001", "--il-lr", "5e-4", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["updates"] >= 1 and (out / "checkpoint.pt").is_file()
    assert json.loads((out / "config.json").read_text())["il_lr"] == 5e-4
    _usage_error(_run("pretrain", "-o", out, "--budget-h", "0.001"), "--resume")
    _usage_error(_run("pretrain", "-o", out, "--budget-h", "0.002", "--resume", "--il-lr", "1e-3"), "--il-lr", "--resume")
    res = _run("pretrain", "-o", out, "--budget-h", "0.002", "--resume", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["updates"] > s["updates"]
    g = tmp_path / "g.json"
    assert _run("graph", "build", "random", "--set", "num_ops=24", "-o", g).exit_code == 0
    res = _run("train", g, "-c", "unit:2", "--init", out / "checkpoint.pt", "--episodes", "16", "--batch", "8",
               "--search-every", "0", "--op-features", "structural", "-o", tmp_path / "FT", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    ck = read_checkpoint(tmp_path / "FT")
    assert ck["il_episode"] == 0 and ck["episode"] == 16  # fine-tuning skips Stage I
    assert ck["policy_config"]["op_features"] == "structural"  # kept as asked (by default: widened to full)
    assert json.loads(ck["config"])["search_evals"] == train_module.INIT_SEARCH_EVALS  # fine-tuning searches more
    res = _run("train", g, "-c", "unit:2", "--init", out / "checkpoint.pt", "--episodes", "8", "--batch", "8",
               "--search-evals", "300", "-o", tmp_path / "FT2", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(read_checkpoint(tmp_path / "FT2")["config"])["search_evals"] == 300  # unless told otherwise
    # a fine-tuned structural policy transfers to another cluster (zero-shot), not refused
    res = _run("assign", g, "-c", "unit:3", "-m", "doppler", "--checkpoint", tmp_path / "FT" / "checkpoint.pt",
               "-o", tmp_path / "a.json", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)
    assert row["zero_shot"] is True and row["plc_ties_only"] is True  # zero-shot, the device head breaks ties
    for cl, flag, ties in (("unit:3", "--plc-free", False), ("unit:2", None, False), ("unit:2", "--plc-ties", True)):
        res = _run("assign", g, "-c", cl, "-m", "doppler", "--checkpoint", tmp_path / "FT" / "checkpoint.pt",
                   "-o", tmp_path / "a.json", "--json", *([flag] if flag else []))  # fmt: skip
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["plc_ties_only"] is ties, (cl, flag)


def test_pretrain_resume_keeps_the_runs_own_budget_unless_given(tmp_path, monkeypatch):
    """`--resume` continues a killed run to the end it was started for: without --budget-h, its own budget
    (once the option's default of one hour, so a 1-minute run resumed for an hour); --budget-h sets a new one."""
    Pretrainer.create(pretrain_config(**TINY), budget_s=1e-9).run(tmp_path)
    budgets = []
    monkeypatch.setattr(Pretrainer, "run", lambda self, *a, **k: budgets.append(self.budget_s))
    assert _run("pretrain", "-o", tmp_path, "--resume", "--json").exit_code == 0
    assert _run("pretrain", "-o", tmp_path, "--resume", "--budget-h", "0.5", "--json").exit_code == 0
    assert budgets == [1e-9, 1800.0]


def test_init_widens_structural_to_full_features_without_changing_the_policy(tmp_path):
    """``train --init pretrained`` widens the shipped policy to ``full`` op features by default: the new
    inputs start at zero weight, so the widened policy decodes exactly as the shipped one did; it then
    trains and serves its graph."""
    import numpy as np
    import torch

    from doppler.policy.architectures import load_policy
    from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, widen_op_features
    from doppler.policy.features import graph_features
    from doppler.policy.networks import DopplerPolicy

    shipped, _ = load_policy(PRETRAINED_CHECKPOINT)
    wide = DopplerPolicy(**{**shipped.config, "op_features": "full"})
    wide.load_state_dict(widen_op_features(shipped.state_dict(), wide, "structural"))
    gf = graph_features(workloads.build("chainmm", size="tiny"), cluster("p100x4"))
    with torch.no_grad():
        a, b = shipped.encode(gf), wide.encode(gf)
    for name in ("sel_score", "plc_op", "plc_placed"):
        np.testing.assert_allclose(getattr(a, name).numpy(), getattr(b, name).numpy(), rtol=1e-5, atol=1e-6)
    g = tmp_path / "g.json"
    assert _run("graph", "build", "random", "--set", "num_ops=24", "-o", g).exit_code == 0
    res = _run("train", g, "-c", "unit:2", "--init", "pretrained", "--episodes", "16",
               "--batch", "8", "--search-every", "0", "-o", tmp_path / "FT", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    ck = read_checkpoint(tmp_path / "FT")
    assert ck["policy_config"]["op_features"] == "full" and ck["policy_config"]["list_schedule"] == "heft"
    _usage_error(_run("train", g, "-c", "unit:2", "--init", tmp_path / "FT" / "checkpoint.pt", "--op-features",
                      "structural", "-o", tmp_path / "r"), "cannot be narrowed")  # fmt: skip
    _usage_error(_run("train", g, "-c", "unit:2", "--init", "pretrained", "--op-features", "ids", "-o", tmp_path / "r"),
                 "ids")


def test_device_identity_starts_at_zero_trains_and_applies_on_its_own_cluster_only(tmp_path):
    """``train --init pretrained`` (device identity: the default): each device's learned state
    starts at zero, so the policy decodes exactly as the shipped one did; after training the
    state is not zero, resume and a second --init keep it. On another cluster (another device count,
    or the same count with other devices) the states are left out, by ``assign`` (which says so) and
    by ``train --init`` (which starts them again at zero), as by ``--no-device-identity``.
    ``--device-identity`` with a learned baseline exits 2."""
    import numpy as np
    import torch

    from doppler.policy.architectures import load_policy
    from doppler.policy.checkpoint import PRETRAINED_CHECKPOINT, add_device_identity
    from doppler.policy.features import graph_features
    from doppler.policy.networks import DopplerPolicy
    from doppler.policy.rollout import rollout

    shipped, _ = load_policy(PRETRAINED_CHECKPOINT)
    gf = graph_features(workloads.build("llama_block", size="tiny"), cluster("v100x8"))
    ident = DopplerPolicy(**{**shipped.config, "device_identity": 8})
    ident.load_state_dict(add_device_identity(shipped.state_dict(), ident))
    with torch.no_grad():
        a, b = shipped.encode(gf), ident.encode(gf)
        ra, rb = (rollout(gf, e, batch=1, mode="greedy") for e in (a, b))
    np.testing.assert_array_equal(ra.assignment, rb.assignment)
    np.testing.assert_array_equal(ra.order, rb.order)
    with pytest.raises(ValueError, match="8 devices by identity"):
        ident.encode(graph_features(workloads.build("llama_block", size="tiny"), cluster("p100x4")))
    g = tmp_path / "g.json"
    assert _run("graph", "build", "random", "--set", "num_ops=24", "-o", g).exit_code == 0
    res = _run("train", g, "-c", "unit:3", "--init", "pretrained", "--op-features", "structural",
               "--episodes", "16", "--batch", "8", "--search-every", "0", "-o", tmp_path / "FT", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    ck = read_checkpoint(tmp_path / "FT")
    assert ck["policy_config"]["device_identity"] == 3 and ck["policy_config"]["op_features"] == "structural"
    assert float(ck["state_dict"]["plc.device_init"].abs().max()) > 0  # it learned something
    from doppler.cli.train_cmd import _init_config
    from doppler.train import TrainConfig

    ft = str(tmp_path / "FT" / "checkpoint.pt")
    cfg, weights, _, left_out = _init_config(TrainConfig(stages=("sim",)), ft, "full", cluster("unit:3"))
    assert cfg.device_identity and cfg.op_features == "full" and left_out is None  # widening keeps the learned state
    torch.testing.assert_close(weights["plc.device_init"], ck["state_dict"]["plc.device_init"])
    slower = cluster("unit:3").scaled_links(2.0)  # the same devices, slower links
    for cl, want in ((cluster("unit:3"), None), (slower, None), (cluster("unit:3"), False), (cluster("unit:2"), None)):
        cfg, weights, _, left_out = _init_config(TrainConfig(stages=("sim",), device_identity=want), ft, None, cl)
        kept = cl.to_json() == cluster("unit:3").to_json() and want is not False
        assert ("plc.device_init" in weights) == kept and left_out == (None if kept else 3), (cl.name, want)
        assert cfg.device_identity is (True if kept else want)  # None: on by default for a new identity
    res = _run("train", g, "-c", "unit:3", "--episodes", "24", "-o", tmp_path / "FT", "--resume", "--json")
    assert res.exit_code == 0, res.output
    res = _run("train", g, "-c", "unit:3", "--init", tmp_path / "FT" / "checkpoint.pt", "--episodes", "8", "--batch",
               "8", "--search-every", "0", "-o", tmp_path / "FT2", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["device_identity_left_out"] is None  # its own cluster: kept
    assert read_checkpoint(tmp_path / "FT2")["policy_config"]["device_identity"] == 3
    res = _run("train", g, "-c", "unit:2", "--init", ft, "--episodes", "8", "--batch", "8", "--search-every", "0",
               "--distill-on-policy", "0", "-o", tmp_path / "FT3", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["device_identity"] is True and summary["device_identity_left_out"] == 3  # a new one, at zero
    assert read_checkpoint(tmp_path / "FT3")["policy_config"]["device_identity"] == 2
    res = _run("train", g, "-c", "unit:3", "--init", ft, "--no-device-identity", "--episodes", "8", "--batch", "8",
               "--search-every", "0", "-o", tmp_path / "FT4")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "device identity (3 devices) is left out" in res.output
    assert "device_identity" not in read_checkpoint(tmp_path / "FT4")["policy_config"]
    res = _run("assign", g, "-c", "unit:3", "-m", "doppler", "--checkpoint", ft, "-o", tmp_path / "a.json", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["device_identity_left_out"] is False
    write_json(tmp_path / "slow3.json", slower.to_json())
    for cl in ("unit:2", str(tmp_path / "slow3.json")):
        res = _run("assign", g, "-c", cl, "-m", "doppler", "--checkpoint", ft, "-o", tmp_path / "b.json")
        assert res.exit_code == 0, res.output
        assert "device identity left out" in res.output and "3 devices of the cluster it was trained on" in res.output
        assert "zero-shot: the policy was trained on this graph, but on another cluster" in res.output
    g2 = tmp_path / "g2.json"
    assert _run("graph", "build", "random", "--set", "num_ops=20", "--set", "seed=5", "-o", g2).exit_code == 0
    res = _run("assign", g2, "-c", "unit:3", "-m", "doppler", "--checkpoint", ft, "-o", tmp_path / "c.json")
    assert res.exit_code == 0, res.output  # structural op features: any graph
    assert "zero-shot: the policy was not trained on this graph" in res.output and "left out" not in res.output
    from doppler.policy.checkpoint import identity_serves

    assert identity_serves(ck, cluster("unit:3")) and not identity_serves(ck, slower)
    renamed = cluster_from_json({**cluster("unit:3").to_json(), "name": "my-3", "meta": {"site": "lab"}})
    assert identity_serves(ck, renamed)  # the same devices and links under another name
    assert not identity_serves(read_checkpoint(PRETRAINED_CHECKPOINT), cluster("unit:3"))  # it has none
    _usage_error(_run("train", g, "-c", "unit:2", "--method", "gdp", "--device-identity", "-o", tmp_path / "r"),
                 "--device-identity", "gdp")


def test_pretrain_and_init_bad_input_exit_2(tmp_path):
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--budget-h", "0"), "--budget-h")
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--budget-h", "1e30"), "--budget-h must be in (0, 1000] hours")
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--resume"), "no checkpoint")
    for bad in ("0", "-1e-3", "nan", "2"):
        _usage_error(_run("pretrain", "-o", tmp_path / "x", "--il-lr", bad), "--il-lr")
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--seed", "-5"), "--seed")
    assert not (tmp_path / "x").exists()
    (tmp_path / "file").write_text("")
    _usage_error(_run("pretrain", "-o", tmp_path / "file", "--budget-h", "0.001"), "file", "not a directory")
    g = tmp_path / "g.json"
    assert _run("graph", "build", "random", "--set", "num_ops=24", "-o", g).exit_code == 0
    _usage_error(_run("train", g, "-c", "unit:2", "--init", g, "-o", tmp_path / "r"), "not a readable doppler checkpoint")
    _usage_error(_run("train", g, "-c", "unit:2", "--init", tmp_path / "missing.pt", "-o", tmp_path / "r"), "no such")
    _usage_error(_run("train", g, "-c", "unit:2", "--init", g, "--resume", "-o", tmp_path / "r"), "--init")
    _usage_error(_run("train", g, "-c", "unit:2", "--episodes", "4", "--il-episodes", "2", "-o", tmp_path / "file"),
                 "file", "not a directory")  # fmt: skip


def test_init_continues_a_pretrained_policy_in_the_zero_shot_action_space(tmp_path):
    """``Pretrainer.from_init``: the checkpoint's weights and configuration, Stage II from the first
    update, its episodes restricted to the rule's tied devices; it saves, resumes and records its origin."""
    import torch

    base = Pretrainer.create(pretrain_config(**{**TINY, "il_episodes": 4}), budget_s=3600)
    _updates(base, 1)
    base.save(tmp_path / "base")
    pt = Pretrainer.from_init(tmp_path / "base", budget_s=3600, seed=5)
    assert pt.cfg.plc_ties_only and pt.trainer.il_episode >= pt.cfg.il_episodes and pt.cfg.search_evals == 0 and pt.cfg.seed == 5
    assert pt.cfg.hidden == 16 and pt.init["checkpoint"].endswith("checkpoint.pt") and len(pt.init["sha256"]) == 64
    for a, b in zip(pt.trainer.policy.state_dict().values(), base.trainer.policy.state_dict().values()):
        assert torch.equal(a, b)
    assert [s for s, _, _ in _updates(pt, 2)] == ["sim", "sim"]
    pt.save(tmp_path / "rl")
    resumed = Pretrainer.resume(tmp_path / "rl")
    assert resumed.cfg.plc_ties_only and resumed.init == pt.init and resumed.updates == 2
    with pytest.raises(TrainError, match="pretraining checkpoint"):
        from doppler.train import TrainConfig, Trainer

        tr = Trainer.create([workloads.build("ffnn", size="tiny")], cluster("unit:2"),
                            TrainConfig(episodes=8, il_episodes=8, hidden=16, mlp_hidden=16, mp_steps=2))  # fmt: skip
        tr.run(tmp_path / "train")
        Pretrainer.from_init(tmp_path / "train", budget_s=60)


def test_pretrain_init_cli(tmp_path):
    res = _run("pretrain", "-o", tmp_path / "RL", "--init", "pretrained", "--budget-h", "0.0005", "--seed", "3", "--json")
    assert res.exit_code == 0, res.output
    ck = read_checkpoint(tmp_path / "RL")
    assert json.loads(ck["config"])["plc_ties_only"] is True and json.loads(ck["pretrain"])["init"]["sha256"]
    assert ck["graphs"] == [] and ck["episode"] > 0
    summary = json.loads(res.stdout)  # this run's episodes apart from the --init policy's own
    assert 0 < summary["episodes_this_run"] < summary["episodes"] == ck["episode"]
    _usage_error(_run("pretrain", "-o", tmp_path / "RL", "--init", "pretrained", "--resume"), "--init", "--resume")
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--init", "pretrained", "--il-lr", "1e-3"), "--init", "--il-lr")
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--init", tmp_path / "missing.pt"), "no such checkpoint")
    _usage_error(_run("pretrain", "-o", tmp_path / "x", "--init", tmp_path), "without checkpoint.pt")
    assert not (tmp_path / "x").exists()


def test_init_runs_decode_only_the_rules_tied_devices(tmp_path, monkeypatch):
    """Every sampled and greedy episode of a ``from_init`` run chooses devices among the rule's ties."""
    seen = []
    real_rollout = trainer_module.rollout

    def spy(gf, enc, **kw):
        ro = real_rollout(gf, enc, **kw)
        if kw.get("mode") in ("sample", "greedy"):
            seen.append(ro)
        return ro

    base = Pretrainer.create(pretrain_config(**{**TINY, "il_episodes": 4}), budget_s=3600)
    _updates(base, 1)
    base.save(tmp_path)
    monkeypatch.setattr(trainer_module, "rollout", spy)  # the sampled episodes
    monkeypatch.setattr(tasks_module, "rollout", spy)  # the greedy decodes
    _updates(Pretrainer.from_init(tmp_path, budget_s=3600), 2)
    assert len(seen) >= 4
    for ro in seen:
        B, n = ro.order.shape
        assert ro.plc_ties_only and ro.est_tied[np.arange(B)[:, None], np.arange(n), ro.step_device].all()


def test_pairs_per_update_draws_that_many_fresh_pairs_from_the_same_stream():
    """``pairs_per_update=k``: one update trains on the next k pairs of the corpus stream (those that k
    updates of one pair each would see), in both stages, and counts k pairs' episodes."""
    one = Pretrainer.create(pretrain_config(**TINY), budget_s=3600)
    singles = [(st, [(t.graph.num_ops, t.cluster.num_devices) for t in one.trainer.tasks])
               for st in (one.update() for _ in range(6))]  # fmt: skip
    three = Pretrainer.create(pretrain_config(**{**TINY, "pairs_per_update": 3}), budget_s=3600)
    for u in range(2):
        st = three.update()
        pairs = [(t.graph.num_ops, t.cluster.num_devices) for t in three.trainer.tasks]
        assert pairs == [p for _, (p,) in singles[3 * u: 3 * u + 3]]
        assert st["stage"] == ("il", "sim")[u]  # Stage I: 3 pairs x 8 episodes >= 16 in one update
        assert st["num_ops"] == sum(n for n, _ in pairs) and st["num_devices"] == max(d for _, d in pairs)
    assert three.updates == 2 and three.trainer.episode == 3 * TINY["batch"]


def _gradients_per_update(k: int, updates: int, monkeypatch, stage: str) -> tuple[list, list[dict]]:
    """The summed-up gradient of each of ``updates`` updates with ``k`` pairs each, the weights held
    fixed (the optimizer step is replaced by a copy of the gradients), and each update's stats."""
    cfg = pretrain_config(**{**TINY, "pairs_per_update": k, "il_episodes": 10**6 if stage == "il" else 1,
                             "search_evals": 0})  # fmt: skip
    pt = Pretrainer.create(cfg, budget_s=3600)
    if stage == "sim":
        pt.trainer.il_episode = cfg.il_episodes
    grads = []

    def keep() -> bool:
        grads.append(torch.cat([p.grad.flatten() for p in pt.trainer.policy.parameters() if p.grad is not None]))
        return True

    monkeypatch.setattr(pt.trainer, "_step", keep)
    stats = [pt.update() for _ in range(updates)]
    return grads, stats


@pytest.mark.parametrize("stage", ["il", "sim"])
def test_pairs_per_update_averages_the_gradients_of_its_pairs(monkeypatch, stage):
    """Two pairs in one update: the mean of the gradients (and of the greedy and search ratios) that
    two one-pair updates at the same weights give on the same two pairs."""
    g1, s1 = _gradients_per_update(1, 2, monkeypatch, stage)
    g2, s2 = _gradients_per_update(2, 1, monkeypatch, stage)
    assert len(g1) == 2 and len(g2) == 1 and g1[0].abs().sum() > 0 and not torch.allclose(g1[0], g1[1])
    torch.testing.assert_close(g2[0], (g1[0] + g1[1]) / 2, rtol=1e-4, atol=1e-6)
    if stage == "sim":
        for key in ("greedy_vs_cheap", "search_vs_cheap", "greedy_ratio"):
            assert s2[0][key] == pytest.approx((s1[0][key] + s1[1][key]) / 2, rel=1e-9)


def test_pairs_per_update_cli(tmp_path):
    res = _run("pretrain", "-o", tmp_path / "RL", "--init", "pretrained", "--budget-h", "0.0005",
               "--pairs-per-update", "2", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    ck = read_checkpoint(tmp_path / "RL")
    from doppler.policy.checkpoint import resolve_checkpoint

    start = read_checkpoint(resolve_checkpoint(None)[0])["episode"]  # the shipped policy's episodes
    cfg, updates = json.loads(ck["config"]), json.loads(ck["pretrain"])["updates"]
    assert cfg["pairs_per_update"] == 2 and updates >= 1
    assert ck["episode"] - start == 2 * cfg["batch"] * updates
    before = (tmp_path / "RL" / "checkpoint.pt").read_bytes()
    for bad in ("0", "-2"):
        _usage_error(_run("pretrain", "-o", tmp_path / "x", "--pairs-per-update", bad), "--pairs-per-update")
    _usage_error(_run("pretrain", "-o", tmp_path / "RL", "--resume", "--pairs-per-update", "3"), "--pairs-per-update",
                 "--resume")  # fmt: skip
    assert not (tmp_path / "x").exists() and (tmp_path / "RL" / "checkpoint.pt").read_bytes() == before


def test_the_history_a_checkpoint_carries_stays_bounded_and_spans_the_run(tmp_path, monkeypatch):
    history: list[dict[str, float]] = []
    for k in range(1000):
        history = thin_history(history + [{"update": float(k)}], rows=8)
        assert len(history) <= 16 and history[-1]["update"] == k  # bounded, and the latest is kept
    updates = [h["update"] for h in history]
    assert updates == sorted(set(updates)) and updates[0] < 1000 / 8  # increasing, from early in the run on
    assert thin_history(history[:5], rows=8) == history[:5]  # below the bound: untouched
    even = [{"update": float(k)} for k in range(18)]
    assert thin_history(even, rows=8)[-1]["update"] == 17 and len(thin_history(even, rows=8)) == 9

    import doppler.train.pretrain as pretrain

    monkeypatch.setattr(pretrain, "HISTORY_ROWS", 1)
    pt = Pretrainer.create(pretrain_config(**TINY), budget_s=3.0)  # a few updates on any machine (14 in 1.5 s here)
    pt.run(tmp_path)
    hist = json.loads(read_checkpoint(tmp_path)["history"])
    assert pt.updates > 2 and len(hist) <= 2 and hist[-1]["update"] == pt.updates
