"""The training configuration: every field checked, set from the command line and documented."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from doppler.train.config import RUN_OPTIONS, TrainConfig, TrainError, config_from_json, config_to_json, set_fields

DOC = Path(__file__).resolve().parents[2] / "docs" / "doppler.md"
FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(stages=("il", "foo")), "unknown stage"),
        (dict(teacher="oracle"), "unknown teacher"),
        (dict(teacher="lookahead"), "unknown teacher"),
        (dict(episodes=0), "--episodes"),
        (dict(baseline="median"), "unknown baseline"),
        (dict(seed=-1), "--seed must be an integer >= 0"),
        (dict(search_every=-1), "--search-every must be >= 0"),
        (dict(batch=100_000, episodes=200_000), "--batch must be at most 1024"),
        (dict(pairs_per_update=65), "--pairs-per-update must be at most 64"),
        (dict(max_grad_norm=float("nan")), "--set max_grad_norm must be a finite number"),
        (dict(max_grad_norm=0.0), "--set max_grad_norm must be a finite number > 0"),
        (dict(stages="il"), "--stages must be a list of names"),
        (dict(episodes="abc"), "--episodes must be a whole number"),
        (dict(hidden=0), "--set hidden must be >= 1"),
        (dict(eps_start=2.0), r"--set eps_start must be in \[0, 1\]"),
        (dict(lr=0.0), r"--set lr must be a learning rate in \(0, 1\]"),
    ],
)
def test_bad_config_is_rejected(bad, match):
    with pytest.raises(TrainError, match=match):
        TrainConfig(**bad).validate()


def test_set_reads_each_value_by_its_fields_type():
    cfg = set_fields(TrainConfig(), ["lr=1e-3", "hidden = 64", "real_seed_methods=heft, metis", "plc_ties_only=true",
                                     "lr_final=0", "distill_updates=0"])  # fmt: skip
    assert (cfg.lr, cfg.hidden, cfg.real_seed_methods, cfg.plc_ties_only) == (1e-3, 64, ("heft", "metis"), True)
    assert cfg.lr_final == 0.0 and cfg.distill_updates == 0
    cfg.validate()
    assert TrainConfig().lr == 3e-3  # (a new config: the default is not changed)


@pytest.mark.parametrize("item, match", [
    ("lr", "expected FIELD=VALUE"),
    ("=3", "expected FIELD=VALUE"),
    ("learning_rate=1", "no field 'learning_rate'"),
    ("batch=4", "has an option of its own: --batch"),
    ("torch_threads=1", "has an option of its own: --threads"),
    ("hidden=6.5", "'6.5' is not a whole number"),
    ("plc_ties_only=yes", "is not true or false"),
    ("lr=fast", "'fast' is not a number"),
])  # fmt: skip
def test_a_bad_set_item_is_one_train_error_naming_it(item, match):
    with pytest.raises(TrainError, match=match):
        set_fields(TrainConfig(), [item])


def test_a_field_set_twice_is_refused():
    with pytest.raises(TrainError, match="lr is set twice"):
        set_fields(TrainConfig(), ["lr=1e-3", "lr=2e-3"])


def test_every_field_has_an_option_of_its_own_or_is_set_by_set():
    own = set(RUN_OPTIONS.values())
    assert own <= set(FIELDS), own - set(FIELDS)
    for name in FIELDS:
        default = getattr(TrainConfig(), name)
        if name in own:
            continue
        text, want = {bool: ("true", True), int: ("3", 3), float: ("0.5", 0.5), tuple: ("heft", ("heft",)),
                      type(None): ("none", None), str: ("x", "x")}[type(default)]  # fmt: skip
        assert getattr(set_fields(TrainConfig(), [f"{name}={text}"]), name) == want, name


def test_every_field_is_in_the_docs_table_with_its_default():
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", DOC.read_text(), flags=re.M))
    assert set(rows) == set(FIELDS), (set(FIELDS) - set(rows), set(rows) - set(FIELDS))
    for name in FIELDS:
        value = getattr(TrainConfig(), name)
        shown = ",".join(value) if isinstance(value, tuple) else str(value)
        assert rows[name] == shown, (name, rows[name], shown)


def test_a_checkpoints_config_round_trips_and_drops_fields_a_run_no_longer_has():
    cfg = set_fields(TrainConfig(method="gdp"), ["lr=1e-3"])
    assert config_from_json(config_to_json(cfg)) == cfg
    old = {**config_to_json(cfg), "update_epochs": 4, "sample_sel": False, "lookahead_steps": 16}
    assert config_from_json(old) == cfg
