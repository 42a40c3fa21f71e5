"""A damaged checkpoint is refused in one line naming the file and the field, before anything uses it; a
resumed run's damaged training state likewise. Each case was an 'internal error' (exit 1) that
tests/fuzz found: a KeyError, a TypeError deep in torch, or a replay failing in the middle of training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from doppler import workloads
from doppler.policy.architectures import load_policy, read_checkpoint
from doppler.policy.checkpoint import CheckpointError
from doppler.hardware.presets import cluster
from doppler.train import TrainConfig, Trainer, TrainError
from doppler.train.config import config_from_json

from tests.fuzz.checkpoints import rewrite_checkpoint

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
    rewrite_checkpoint(d / "checkpoint.pt", change)
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


@pytest.mark.parametrize("value, words", [
    (torch.full((1,), float("nan")), "weight 'sel.mlp.2.bias' holds values that are not finite numbers (NaN or inf)"),
    (torch.full((1,), 1e300, dtype=torch.float64), "weight 'sel.mlp.2.bias' holds values that are not finite numbers"),
    (torch.complex(torch.tensor([float("nan")]), torch.ones(1)), "weight 'sel.mlp.2.bias' is a torch.complex64 tensor, "
                                                                  "not one of floating-point numbers"),
    (torch.ones(1, dtype=torch.int64), "weight 'sel.mlp.2.bias' is a torch.int64 tensor"),
])  # fmt: skip
def test_weights_that_are_not_finite_floats_are_refused_by_every_reader(run, tmp_path, value, words) -> None:
    """A complex weight was loaded as its real part (NaN), a float64 1e300 as inf: the policy then decoded NaN scores."""
    d = _damaged(run, tmp_path, lambda ck: ck["state_dict"].update({"sel.mlp.2.bias": value}))
    for read in (read_checkpoint, load_policy, lambda d: _resume(run, d)):
        with pytest.raises(CheckpointError) as e:
            read(d)
        assert str(e.value).startswith(f"{d / 'checkpoint.pt'}: {words}"), str(e.value)


def test_a_policy_config_without_newer_settings_gets_their_defaults(run, tmp_path) -> None:
    """An older checkpoint (no list_schedule) still loads; its readers see every setting."""
    d = _damaged(run, tmp_path, lambda ck: ck["policy_config"].pop("list_schedule"))
    assert read_checkpoint(d)["policy_config"]["list_schedule"] == "critical_path"
    policy, _ = load_policy(d)
    assert policy.list_schedule == "critical_path"


def _resume(run, d: Path):
    return Trainer.resume(d, [run[1]], cluster("unit:2"), episodes=12)


def _adam(key, value, param=0):
    """A change that sets the optimizer's ``key`` of parameter ``param`` to ``value`` (a function of the old one)."""
    return lambda ck: ck["optimizer"]["state"][param].update({key: value(ck["optimizer"]["state"][param][key])})


def _group(key, value):
    return lambda ck: ck["optimizer"]["param_groups"][0].update({key: value})


def _config(**changes):
    return lambda ck: ck.update(config=json.dumps({**json.loads(ck["config"]), **changes}))


def _distill_best(change):
    """A checkpoint saved during distillation, its best weights so far changed by ``change(weights)``."""
    def apply(ck):
        weights = {k: v.clone() for k, v in ck["state_dict"].items()}
        change(weights)
        ck["distill_best"] = {"score": 1.5, "state_dict": weights}

    return apply


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("change, words", [
    (lambda ck: ck["graphs"][0].update(best=[list(range(7)) + [70], [0] * 8, [0] * 8]), "does not hold each op once"),
    (lambda ck: ck["graphs"][0].update(best=[ck["graphs"][0]["best"][0], [0] * 8, [5] * 8]), "names a device outside 0..1"),
    (lambda ck: ck["graphs"][0].update(baseline="x"), "graphs[0] baseline is 'x', not a finite number > 0"),
    (lambda ck: ck["graphs"][0].update(baseline=INF), "graphs[0] baseline is inf, not a finite number > 0"),
    (lambda ck: ck["graphs"][0].update(baseline=-1.0), "graphs[0] baseline is -1.0, not a finite number > 0"),
    (lambda ck: ck["graphs"][0].update(best_makespan_s=0.0), "graphs[0] best_makespan_s is 0.0, not a finite number > 0"),
    (lambda ck: ck["graphs"][0].update(oracle_calls=-1), "graphs[0] oracle_calls is -1, not an integer from 0 to"),
    # the optimizer's state: each moment real, finite, of its parameter's shape; the step a count
    (_adam("exp_avg", lambda v: torch.zeros(3)), "the optimizer's exp_avg of parameter 0 is a torch.float32 tensor of "
                                                 "shape [3], not a tensor of real numbers of shape"),
    (_adam("exp_avg", lambda v: None), "the optimizer's exp_avg of parameter 0 is None, not a tensor of real numbers"),
    (_adam("exp_avg", lambda v: torch.full_like(v, NAN)), "the optimizer's exp_avg of parameter 0 holds values that are "
                                                          "not finite numbers (NaN or inf)"),
    (_adam("exp_avg_sq", lambda v: torch.full_like(v, INF)), "exp_avg_sq of parameter 0 holds values that are not finite"),
    (_adam("exp_avg_sq", lambda v: torch.full_like(v, 1e300, dtype=torch.float64)), "exp_avg_sq of parameter 0 holds "
                                                                                     "values that are not finite"),
    (_adam("exp_avg_sq", lambda v: -v - 1), "exp_avg_sq of parameter 0 holds negative values"),
    (_adam("exp_avg", lambda v: v.to(torch.complex64)), "the optimizer's exp_avg is a torch.complex64 tensor of shape"),
    (_adam("exp_avg", lambda v: v.to(torch.int64)), "the optimizer's exp_avg is a torch.int64 tensor"),
    (_adam("step", lambda v: torch.tensor(NAN)), "the optimizer's step of parameter 0 holds values that are not finite"),
    (_adam("step", lambda v: torch.tensor(-1.0)), "the optimizer's step of parameter 0 is -1.0, not a step count"),
    (_adam("step", lambda v: torch.tensor(2.5)), "the optimizer's step of parameter 0 is 2.5, not a step count"),
    (_adam("step", lambda v: torch.tensor(1e12)), "not a step count from 0 to 1,000,000,000"),
    (_adam("step", lambda v: torch.ones(2)), "the optimizer's step of parameter 0 is a torch.float32 tensor of shape [2]"),
    (lambda ck: ck["optimizer"]["state"][0].pop("exp_avg_sq"), "the optimizer's state of a parameter holds ['exp_avg', 'step']"),
    # its settings: numbers in range, flags its own
    (_group("weight_decay", "x"), "the optimizer's weight_decay is 'x', not 0, the optimizer's own"),
    (_group("betas", (0.9,)), "the optimizer's betas is (0.9,), not (0.9, 0.999), the optimizer's own"),
    (_group("betas", (0.9, 1.0)), "the optimizer's betas is (0.9, 1.0), not (0.9, 0.999), the optimizer's own"),
    (_group("lr", NAN), "the optimizer's lr is nan, not a learning rate in [0, 1]"),
    (_group("eps", 0.0), "the optimizer's eps is 0.0, not 1e-08, the optimizer's own"),
    (_group("eps", 1e-300), "the optimizer's eps is 1e-300, not 1e-08, the optimizer's own"),  # (its first step: inf)
    (_group("lr", 2.0), "the optimizer's lr is 2.0, not a learning rate in [0, 1]"),
    (_group("maximize", True), "the optimizer's maximize is True, not False, the optimizer's own"),
    (_group("amsgrad", True), "the optimizer's amsgrad is True, not False, the optimizer's own"),
    # the generators
    (_set("torch_rng", torch.zeros(5056)), "torch_rng is a torch.float32 tensor of shape [5056], not torch's CPU generator"),
    (_set("torch_rng", torch.zeros(16, dtype=torch.uint8)), "torch_rng is a torch.uint8 tensor of shape [16], not torch's"),
    (_set("torch_rng", torch.full((5056,), 255, dtype=torch.uint8)), "Invalid mt19937 state"),
    (_set("numpy_rng", '{"bit_generator": "PCG64", "state": {"inc": null}}'), "numpy_rng is not the state of numpy's PCG64"),
    (lambda ck: ck.update(numpy_rng=ck["numpy_rng"].replace('"has_uint32": 0', '"has_uint32": 5')), "numpy_rng is not the state"),
    (lambda ck: ck.update(numpy_rng=json.dumps({**json.loads(ck["numpy_rng"]), "bit_generator": "MT19937"})),
     "numpy_rng is not the state of numpy's PCG64 generator"),
    # distillation's best weights so far
    (_distill_best(lambda w: w["sel.mlp.2.bias"].fill_(NAN)), "distill_best weight 'sel.mlp.2.bias' holds values that are "
                                                               "not finite"),
    (_distill_best(lambda w: w.pop("sel.mlp.2.bias")), "distill_best.state_dict weight 'sel.mlp.2.bias' is missing"),
    (_distill_best(lambda w: w.update({"sel.mlp.2.bias": torch.zeros(3)})), "distill_best.state_dict weight "
                                                                              "'sel.mlp.2.bias' is of shape [3], not [1]"),
    (_distill_best(lambda w: w.update({"sel.mlp.2.bias": w["sel.mlp.2.bias"].to(torch.complex64)})),
     "distill_best weight 'sel.mlp.2.bias' is a torch.complex64 tensor, not one of floating-point numbers"),
    (lambda ck: ck.update(distill_best={"score": NAN, "state_dict": ck["state_dict"]}), "distill_best score is nan"),
    # the counters, against the configuration they were saved with (8 + 8 episodes, 4 per update)
    (_set("episode", 10**6), "episode is 1000000, not an integer from 0 to 11"),
    (_set("il_episode", 12), "il_episode is 12, not an integer from 0 to 11"),
    (_set("distill_step", 1), "distill_step is 1, not an integer from 0 to 0"),
    # the configuration: every field through TrainConfig.validate, and a doppler train run's lengths
    (_config(stages=None), "its configuration does not hold (--stages must be a list of names, got None)"),
    (_config(episodes=10**15), "its configuration does not hold (--episodes must be at most 1,000,000,000"),
    (_config(episodes=10**9), "its configuration does not hold (--episodes must be at most 1,000,000 (a doppler train run"),
    (_config(episodes=1e15), "its configuration does not hold (--episodes must be a whole number, got 1000000000000000.0)"),
    (_config(il_episodes=10**7), "its configuration does not hold (--il-episodes must be at most 1,000,000"),
    (_config(distill_updates=10**6), "its configuration does not hold (--set distill_updates must be at most 100,000"),
    (_config(search_evals=10**12), "its configuration does not hold (--search-evals must be at most 10,000,000"),
    (_config(real_episodes=10**9), "its configuration does not hold (--real-episodes must be at most 100,000"),
    (_config(checkpoint_every=10**12), "its configuration does not hold (--set checkpoint_every must be at most"),
    (_set("history", "[1, 2]"), "history is not a list of rows of numbers"),
    (_set("history", '[{"stage_il": 1.0, "episode": 4.0}]'), "history row 0 (stage il) has no agree_sel, agree_plc"),
])  # fmt: skip
def test_a_damaged_training_state_is_refused_when_resumed(run, tmp_path, change, words) -> None:
    """Each was met only later: a replay failing in the middle of training (a best order of another graph), a
    TypeError in the next update, or one in drawing the training curve."""
    d = _damaged(run, tmp_path, change)
    with pytest.raises((TrainError, CheckpointError)) as e:  # (CheckpointError: the layout of a policy's weights)
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
    from doppler.util.io import OutputPathError

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
    size before torch reads it (tests/importer/test_files.py covers each bound)."""
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


@pytest.mark.parametrize("where", ["weight", "adam"])
def test_a_tensor_repeating_one_element_ten_billion_times_is_refused_naming_it(run, tmp_path, where) -> None:
    """A weight (or an Adam moment, in float64: the optimizer casts it as it loads) that is a view of one element
    as 100,000 x 100,000: checking it once allocated 40 GB (exit 1); now it is refused as the file loads."""
    def change(ck):
        one = torch.zeros(1, dtype=torch.float64 if where == "adam" else torch.float32)
        if where == "weight":
            ck["state_dict"]["encoder.embed.weight"] = one.expand(100_000, 100_000)
        else:
            ck["optimizer"]["state"][0]["exp_avg"] = one.expand(100_000, 100_000)

    d = _damaged(run, tmp_path, change)
    name = "state_dict/encoder.embed.weight" if where == "weight" else "optimizer/state/0/exp_avg"
    with pytest.raises(CheckpointError, match=rf"not a readable doppler checkpoint \(tensor {name} of shape "
                                             r"\[100000, 100000\] holds 10,000,000,000 elements over"):  # fmt: skip
        read_checkpoint(d)
