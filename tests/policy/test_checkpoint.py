"""A damaged checkpoint is refused in one line naming the file and the field, before anything uses it; a
resumed run's damaged training state likewise. Each case was an 'internal error' (exit 1) that
tests/fuzz found: a KeyError, a TypeError deep in torch, or a replay failing in the middle of training."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from doppler import workloads
from doppler.policy.architectures import load_policy, read_checkpoint
from doppler.policy.checkpoint import CheckpointError
from doppler.presets import cluster
from doppler.torch_files import load_plain
from doppler.train import TrainConfig, Trainer, TrainError
from doppler.train.config import config_from_json

TINY = dict(hidden=8, mlp_hidden=8, mp_steps=1, torch_threads=1)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, object]:
    """A finished tiny training run (its directory) and its graph."""
    d = tmp_path_factory.mktemp("ck") / "RUN"
    g = workloads.build("random", size="tiny", num_ops=8)
    cfg = TrainConfig(stages=("il", "sim"), il_episodes=8, il_batch=4, episodes=8, batch=4, search_every=0,
                      sim_seed_methods=(), distill_updates=0, **TINY)  # fmt: skip
    Trainer.create([g], cluster("unit:2"), cfg).run(d)
    return d, g


def _damaged(run, tmp_path: Path, change) -> Path:
    """A copy of the run whose checkpoint ``change(ck)`` altered."""
    d = tmp_path / "RUN"
    shutil.copytree(run[0], d)
    ck = load_plain(d / "checkpoint.pt")
    change(ck)
    buf = io.BytesIO()
    torch.save(ck, buf)
    (d / "checkpoint.pt").write_bytes(buf.getvalue())
    return d


def _set(key, value):
    def change(ck):
        ck[key] = value

    return change


def _delete(key):
    return lambda ck: ck.pop(key)


@pytest.mark.parametrize("change, words", [
    (_delete("cluster"), "it has no 'cluster'"),
    (_delete("graphs"), "it has no 'graphs'"),
    (_delete("state_dict"), "it has no 'state_dict'"),
    (_set("cluster", None), "cluster is NoneType None, not the JSON text of an object"),
    (_set("config", '{"stages": '), "config is str"),
    (_set("history", {"a": 1}), "history is dict"),
    (_set("state_dict", "M"), "state_dict is str 'M', not a dict"),
    (_set("graphs", [3, 4]), "graphs[0] is int 3, not an object with a name"),
    (_set("graphs", torch.zeros(0)), "graphs is Tensor tensor([]), not a list"),
    (_set("il_episode", -1), "il_episode is int -1, not an integer >= 0"),
    (_set("policy_config", {"q": 396}), "its policy_config builds no policy (TypeError"),
    (_set("policy_config", {"hidden": 16, "steps": 1, "mlp_hidden": 8}), "weight 'encoder.conv.basis.weight' is of shape"),
    (lambda ck: ck["policy_config"].update(steps=10**9), "steps is 1000000000, not a message-passing step count"),
    (lambda ck: ck["state_dict"].pop("sel.mlp.2.bias"), "state_dict weight 'sel.mlp.2.bias' is missing"),
    (lambda ck: ck["state_dict"].update({"extra": torch.zeros(2)}), "'extra' is not a weight of this policy"),
    (lambda ck: ck["state_dict"].update({"sel.mlp.2.bias": 0.5}), "entry str 'sel.mlp.2.bias' is float 0.5, not a tensor"),
    (_set("config", '{"episodes": 8, "episodes": 9}'), "the JSON text of config is not valid (key 'episodes' appears twice"),
    (_set("cluster", '{"devices": [{"name": "a", "name": "b"}]}'), "of cluster is not valid (key 'name' appears twice"),
])  # fmt: skip
def test_a_damaged_checkpoint_is_refused_naming_the_field(run, tmp_path, change, words) -> None:
    d = _damaged(run, tmp_path, change)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(d)
    assert str(e.value).startswith(f"{d / 'checkpoint.pt'}: a damaged checkpoint: ") and words in str(e.value), str(e.value)


def test_a_policy_config_without_newer_settings_gets_their_defaults(run, tmp_path) -> None:
    """An older checkpoint (no list_schedule) still loads; its readers see every setting."""
    d = _damaged(run, tmp_path, lambda ck: ck["policy_config"].pop("list_schedule"))
    assert read_checkpoint(d)["policy_config"]["list_schedule"] == "critical_path"
    policy, _ = load_policy(d)
    assert policy.list_schedule == "critical_path"


def _resume(run, d: Path):
    return Trainer.resume(d, [run[1]], cluster("unit:2"), episodes=12)


@pytest.mark.parametrize("change, words", [
    (lambda ck: ck["graphs"][0].update(best=[list(range(7)) + [70], [0] * 8, [0] * 8]), "does not hold each op once"),
    (lambda ck: ck["graphs"][0].update(best=[ck["graphs"][0]["best"][0], [0] * 8, [5] * 8]), "names a device outside 0..1"),
    (lambda ck: ck["graphs"][0].update(baseline="x"), "baseline is 'x', not a finite number"),
    (lambda ck: ck["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)), "the optimizer's exp_avg is a torch.float32 "
                                                                             "tensor of shape [3] for a parameter of shape"),
    (lambda ck: ck["optimizer"]["state"][0].update(exp_avg=None), "the optimizer's exp_avg is None for a parameter"),
    (lambda ck: ck["optimizer"]["state"][0].pop("exp_avg_sq"), "the optimizer's state of a parameter holds ['exp_avg', 'step']"),
    (lambda ck: ck["optimizer"]["param_groups"][0].update(weight_decay="x"), "the optimizer's weight_decay is 'x', not like 0"),
    (lambda ck: ck["optimizer"]["param_groups"][0].update(betas=(0.9,)), "the optimizer's betas is (0.9,)"),
    (lambda ck: ck.update(config=json.dumps({**json.loads(ck["config"]), "stages": None})),
     "its configuration does not hold (--stages must be a list of names, got None)"),
    (_set("history", "[1, 2]"), "history is not a list of rows of numbers"),
    (_set("history", '[{"stage_il": 1.0, "episode": 4.0}]'), "history row 0 (stage il) has no agree_sel, agree_plc"),
    (_set("numpy_rng", '{"bit_generator": "PCG64", "state": {"inc": null}}'), "its training state does not load"),
])  # fmt: skip
def test_a_damaged_training_state_is_refused_when_resumed(run, tmp_path, change, words) -> None:
    """Each was met only later: a replay failing in the middle of training (a best order of another graph), a
    TypeError in the next update, or one in drawing the training curve."""
    d = _damaged(run, tmp_path, change)
    with pytest.raises(TrainError) as e:
        _resume(run, d)
    assert str(e.value).startswith(f"{d / 'checkpoint.pt'}: a damaged checkpoint: ") and words in str(e.value), str(e.value)


def test_a_policy_only_checkpoint_serves_but_does_not_resume(run, tmp_path) -> None:
    """Without its training state (the pretrained policy's form, as tests/policy/test_infer.py writes one) a
    checkpoint loads as a policy; resumed, it is one line."""
    d = _damaged(run, tmp_path, _delete("optimizer"))
    load_policy(d)
    with pytest.raises(CheckpointError, match=r"holds a policy but not the state of a run to continue \(no 'optimizer'\)"):
        _resume(run, d)


def test_a_damaged_configuration_is_a_train_error() -> None:
    with pytest.raises(TrainError, match="must be a JSON object"):
        config_from_json([1])
    with pytest.raises(TrainError, match="--stages must be a list of names, got None"):
        config_from_json({"stages": None}).validate()
    with pytest.raises(TrainError, match="mp_steps must be at most 64"):
        config_from_json({"mp_steps": 10**6}).validate()


def test_a_file_where_the_tensorboard_directory_goes_is_an_output_error(run, tmp_path) -> None:
    """It was FileExistsError from TensorBoard's writer (exit 1) when a resumed run started."""
    from doppler.io_util import OutputPathError

    d = tmp_path / "RUN"
    shutil.copytree(run[0], d)
    shutil.rmtree(d / "tensorboard")
    (d / "tensorboard").write_text("")
    trainer = _resume(run, d)
    with pytest.raises(OutputPathError, match="tensorboard is a file, not a directory"):
        trainer.run(d)
    assert json.loads((d / "config.json").read_text())["episodes"] == 8  # nothing was trained or written


def test_a_checkpoint_with_a_deflated_huge_tensor_is_refused_naming_the_member(run, tmp_path) -> None:
    """A storage replaced by 600 MB of deflated zeros (a file of a few hundred kB) is refused by its declared
    size before torch reads it (tests/test_torch_files.py covers each bound)."""
    import zipfile

    from tests.fuzz.zips import write_zip

    with zipfile.ZipFile(run[0] / "checkpoint.pt") as z:
        entries = [(i.filename, z.read(i)) for i in z.infolist()]
    storage = next(n for n, _ in entries if "/data/" in n and not n.endswith(".pkl"))
    bomb = tmp_path / "bomb.pt"
    write_zip(bomb, [(n, c) for n, c in entries if n != storage] + [(storage, 600 << 20)])
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(bomb)
    assert str(e.value).startswith(f"{bomb}: not a readable doppler checkpoint (member {storage} declares 629,145,600 "
                                   "bytes"), str(e.value)  # fmt: skip
