"""A run's config is parsed once (`run_config.parse`): typed, frozen groups, with errors that say where."""
from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest

from searchrl import run_config
from searchrl.configlib import to_config
from searchrl.rl.config import RLConfig
from searchrl.tasks.autosearch.config import DemoConfig
from searchrl.tasks.autosearch.env import Config as AutoSearchConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_group_becomes_its_dataclass_and_the_env_its_tasks_config():
    config = run_config.experiment_config("autosearch")
    config.rl.kl_coef = 0.25
    config.env.max_turns = 3
    config.demo = to_config(DemoConfig())
    config.demo.entities = 12
    run = run_config.parse(config)
    assert run.task == "autosearch" and isinstance(run.env, AutoSearchConfig) and run.env.max_turns == 3
    assert isinstance(run.rl, RLConfig) and run.rl.kl_coef == 0.25 and run.rl.actor == RLConfig().actor
    assert isinstance(run.demo, DemoConfig) and run.demo.entities == 12
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 1  # type: ignore[misc]


def test_a_config_without_demo_has_none():
    assert run_config.parse(run_config.experiment_config("search_r1")).demo is None


@pytest.mark.parametrize("change, message", [
    (lambda c: delattr(c, "rollout"), r"no \['rollout'\] group"),
    (lambda c: setattr(c, "rollouts", 1), r"config: unknown key\(s\) \['rollouts'\]"),
    (lambda c: delattr(c.env, "name"), r"config.env: no name"),
    (lambda c: setattr(c.env, "name", "no_such_task"), r"no_such_task"),
    (lambda c: setattr(c.env, "topk_", 2), r"config.env: unknown key\(s\) \['topk_'\]"),
    (lambda c: setattr(c, "demo", {"entities": 3}), r"config.demo: task 'search_r1' has no demo"),
])
def test_a_bad_config_is_an_error_naming_where(change, message):
    config = run_config.experiment_config("search_r1")
    change(config)
    with pytest.raises(ValueError, match=message):
        run_config.parse(config)


def test_only_the_parser_turns_config_groups_into_dataclasses():
    """Below the entry points nothing parses a config: `from_config` is defined in configlib and called by
    run_config.parse alone."""
    call = re.compile(r"(?<![\w.])from_config\(")  # not transformers' AutoModel...from_config
    users = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "searchrl").rglob("*.py")
                   if call.search(p.read_text()))
    assert users == ["searchrl/configlib.py", "searchrl/run_config.py"]
