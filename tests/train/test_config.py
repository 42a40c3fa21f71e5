"""The training configuration: every field checked, set from the command line and documented."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from doppler.util.io import write_json
from doppler.train.config import (MAX_DISTILL_UPDATES, MAX_EPISODES, MAX_REAL_EPISODES, MAX_RUN_COUNT, MAX_SEARCH_EVALS,
                                  TrainConfig, TrainError, check_config_file, command_options, config_from_json,
                                  config_to_json, set_fields)  # fmt: skip

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
        (dict(episodes=10**9 + 1), "--episodes must be at most 1,000,000,000"),
        (dict(il_episodes=10**15), "--il-episodes must be at most 1,000,000,000"),
        (dict(episodes=1e15), "--episodes must be a whole number"),
        (dict(real_episodes=100_001), "--real-episodes must be at most 100,000"),
        (dict(distill_updates=100_001), "--set distill_updates must be at most 100,000"),
        (dict(search_evals=10**7 + 1), "--search-evals must be at most 10,000,000"),
        (dict(search_every=10**30), "--search-every must be at most 1,000,000,000"),
        (dict(checkpoint_every=10**9 + 1), "--set checkpoint_every must be at most 1,000,000,000"),
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
    own = {o.name for o in command_options("train", TrainConfig())}
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


def test_every_count_is_bounded_by_its_constant_and_the_bound_itself_holds():
    """Each bound is the largest value accepted: a count one past it is refused (a run of 1e15 episodes once ran
    until it was killed, with no message)."""
    for name, cap in (("episodes", MAX_RUN_COUNT), ("il_episodes", MAX_RUN_COUNT), ("real_episodes", MAX_REAL_EPISODES),
                      ("distill_updates", MAX_DISTILL_UPDATES), ("search_evals", MAX_SEARCH_EVALS),
                      ("search_every", MAX_RUN_COUNT), ("checkpoint_every", MAX_RUN_COUNT)):  # fmt: skip
        TrainConfig(**{name: cap}).validate()
        with pytest.raises(TrainError, match=f"must be at most {cap:,}"):
            TrainConfig(**{name: cap + 1}).validate()


def test_a_train_run_is_bounded_by_max_episodes_and_pretrainings_counts_by_its_budget():
    """MAX_EPISODES bounds the stages of doppler train (check_lengths); pretraining's counts stand for its whole
    time budget (MAX_RUN_COUNT), so its configuration validates but is no train run."""
    from doppler.train.pretrain import pretrain_config

    TrainConfig(episodes=MAX_EPISODES, il_episodes=MAX_EPISODES).check_lengths()
    for name in ("episodes", "il_episodes"):
        cfg = TrainConfig(**{name: MAX_EPISODES + 1})
        cfg.validate()
        with pytest.raises(TrainError, match=f"must be at most {MAX_EPISODES:,} \\(a doppler train run"):
            cfg.check_lengths()
    pre = pretrain_config()
    pre.validate()
    assert pre.episodes == pre.il_episodes == MAX_RUN_COUNT > MAX_EPISODES
    with pytest.raises(TrainError):
        pre.check_lengths()


def test_a_run_directorys_config_json_must_say_what_its_checkpoint_says(tmp_path):
    cfg = TrainConfig(episodes=8, il_episodes=8)
    check_config_file(tmp_path, cfg)  # none: the next checkpoint writes it
    write_json(tmp_path / "config.json", config_to_json(cfg))
    check_config_file(tmp_path, cfg)
    for change, words in (({"episodes": 9}, "config.json: episodes is 9, but the run's checkpoint says 8"),
                          ({"episodes": 10**15}, "config.json: the run's configuration does not hold (--episodes must be "
                                                 "at most 1,000,000,000"),
                          ({"lr": float("nan")}, "config.json: the run's configuration does not hold (--set lr must be"),
                          ({"stages": "il"}, "--stages must be a list of names")):  # fmt: skip
        write_json(tmp_path / "config.json", {**config_to_json(cfg), **change})
        with pytest.raises(TrainError) as e:
            check_config_file(tmp_path, cfg)
        assert str(e.value).startswith(str(tmp_path / "config.json")) and words in str(e.value), str(e.value)
    for text, words in (("[1]", "must be a JSON object"), ('{"episodes": ', "not valid JSON")):
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(TrainError, match=words):
            check_config_file(tmp_path, cfg)
