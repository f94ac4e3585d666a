"""A run's config is parsed once (`run_config.parse`): typed, frozen groups, with errors that say where."""
from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys
import typing

import pytest

from searchrl import run_config, task
from searchrl.configlib import RANGE, ConfigError, Range, to_config
from searchrl.episode import SamplingParams
from searchrl.retrieval import RetrievalConfig
from searchrl.rl.config import OptimConfig, RLConfig
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


# Issue 67, cause 2: every number of a config is range-checked, with one line naming the field and its range.

NAN, INF = float("nan"), float("inf")
NONSENSE = [  # (task, dotted key, value, the range the error names)
    ("search_r1", "rl.actor.lr", NAN, "[0, inf)"),
    ("search_r1", "rl.actor.lr", INF, "[0, inf)"),
    ("search_r1", "rl.critic.lr", -1e-5, "[0, inf)"),
    ("search_r1", "rl.actor.b1", -0.1, "[0, 1)"),
    ("search_r1", "rl.actor.b2", 2.0, "[0, 1)"),
    ("search_r1", "rl.actor.eps", -1.0, "(0, inf)"),
    ("search_r1", "rl.actor.weight_decay", NAN, "[0, inf)"),
    ("search_r1", "rl.actor.clip_grad_norm", -1.0, "[0, inf)"),
    ("search_r1", "rl.gamma", 1.5, "[0, 1]"),
    ("search_r1", "rl.lam", NAN, "[0, 1]"),
    ("search_r1", "rl.kl_coef", -INF, "[0, inf)"),
    ("search_r1", "rl.clip_ratio_c", 0.5, "(1, inf)"),
    ("search_r1", "rl.ppo_epochs", 0, "[1, inf)"),
    ("search_r1", "rl.responses_per_prompt", 0, "[1, inf)"),
    ("search_r1", "rollout.sampling.temperature", NAN, "[0, inf)"),
    ("search_r1", "rollout.sampling.temperature", -1.0, "[0, inf)"),
    ("search_r1", "rollout.sampling.top_p", 0.0, "(0, 1]"),
    ("search_r1", "rollout.max_len", 0, "[1, inf)"),
    ("search_r1", "rollout.obs_buckets", (64, -8), "[1, inf) (each)"),
    ("search_r1", "train.steps", -5, "[1, inf)"),
    ("search_r1", "train.batch_size", 0, "[1, inf)"),
    ("search_r1", "train.keep_checkpoints", 0, "[1, inf)"),
    ("search_r1", "train.checkpoint_every", 0, "[1, inf)"),
    ("search_r1", "train.max_nonfinite_steps", 0, "[1, inf)"),
    ("search_r1", "sft.epochs", NAN, "[0, inf)"),
    ("search_r1", "retrieval.retries", -1, "[0, inf)"),
    ("search_r1", "retrieval.timeout_s", NAN, "(0, inf)"),
    ("search_r1", "retrieval.timeout_s", 0.0, "(0, inf)"),
    ("search_r1", "data.eval_limit", -1, "[0, inf)"),
    ("search_r1", "env.topk", 0, "[1, inf)"),
    ("search_r1", "env.max_turns", -1, "[0, inf)"),
    ("search_r1", "mesh.data", 0, "-1 or [1, inf)"),
    ("search_r1", "distributed.memory_fraction", 1.0, "[0, 1)"),
    ("search_r1", "model.num_layers", 0, "[1, inf)"),
    ("autosearch", "env.autosearch.redundancy_threshold", NAN, "[0, 1]"),
    ("deepretrieval", "env.depth", 0, "[1, inf)"),
    ("deepretrieval", "env.reward.sql_timeout_s", -1.0, "(0, inf)"),
    ("rpl", "env.limits.max_seconds", INF, "(0, inf)"),
]


@pytest.mark.parametrize("name, key, value, allowed", NONSENSE,
                         ids=[f"{key}={value}" for _, key, value, _ in NONSENSE])
def test_every_nonsense_value_is_one_line_naming_the_field_and_its_range(name, key, value, allowed):
    config = run_config.experiment_config(name)
    *groups, field = key.split(".")
    group = config
    for part in groups:
        group = group[part]
    group[field] = value
    with pytest.raises(ConfigError) as error:
        run_config.parse(config)
    message = str(error.value)
    assert message == f"config.{key}={value!r} is out of range: allowed {allowed}", message
    assert "\n" not in message


def number_fields(cls, where: str):
    """(dotted name, field) of every number field (or tuple of numbers) of the config dataclass `cls`,
    nested groups included."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            yield from number_fields(hint, f"{where}.{field.name}")
        elif {int, float} & set(_leaf_types(hint)):
            yield f"{where}.{field.name}", field


def _leaf_types(hint) -> list:
    args = typing.get_args(hint)
    return [leaf for arg in args for leaf in _leaf_types(arg)] if args else [hint]


def every_group() -> list[tuple[type, str]]:
    task.load_all()
    groups = [(kind, f"config.{name}") for name, kind in run_config.GROUPS.items()
              if dataclasses.is_dataclass(kind)]
    for name in task.TASKS:
        spec = task.get(name)
        if not spec.config.__module__.startswith(f"{task.TASK_PACKAGES}."):
            continue  # a task a test registers: not searchrl's to range
        groups.append((spec.config, f"config.env[{name}]"))
        if spec.demo_config is not None:
            groups.append((spec.demo_config, f"config.demo[{name}]"))
    return groups


def test_every_number_of_every_group_states_its_range_and_its_default_is_in_it():
    unranged, outside = [], []
    for cls, where in every_group():
        for name, field in number_fields(cls, where):
            allowed = field.metadata.get(RANGE)
            if allowed is None:
                unranged.append(name)
            elif field.default is not dataclasses.MISSING and field.default is not None \
                    and not allowed.admits(field.default):
                outside.append(f"{name}={field.default!r} not in {allowed}")
    assert not unranged and not outside, unranged + outside


def test_ranges_hold_for_a_config_made_in_code_too():
    """A component built without a config file (a library user, a test) gets the same check: a client can
    never see `retries=-1` (which once crashed it with UnboundLocalError) nor a NaN timeout."""
    with pytest.raises(ConfigError, match=r"^RetrievalConfig.retries=-1 is out of range: allowed \[0, inf\)"):
        RetrievalConfig(url="http://127.0.0.1:1/retrieve", retries=-1)
    with pytest.raises(ConfigError, match=r"^SamplingParams.temperature=nan is out of range"):
        SamplingParams(temperature=NAN)
    with pytest.raises(ConfigError, match=r"^OptimConfig.lr=inf is out of range"):
        OptimConfig(lr=INF)
    assert Range("-1 or [1, inf)").admits(-1) and not Range("-1 or [1, inf)").admits(0)
    assert Range("[0, inf]").admits(INF) and not Range("[0, inf)").admits(INF)
    assert not Range("(-inf, inf)").admits(NAN) and not Range("[0, 1]").admits(True)
    assert Range("[1, inf)").admits(((1, 2), (3,))) and not Range("[1, inf)").admits(((1, 2), (0,)))


def test_a_nonsense_value_on_the_command_line_is_one_line_and_a_nonzero_exit():
    for override, expected in [
            ("--config.rl.actor.lr=nan", "config.rl.actor.lr=nan is out of range: allowed [0, inf)"),
            ("--config.retrieval.retries=-1", "config.retrieval.retries=-1 is out of range: allowed [0, "),
            ("--config.env.name=nope", "config.env.name='nope' is not a known task")]:
        done = subprocess.run([sys.executable, "-m", "searchrl.main", "--config=configs/search_r1.py:tiny",
                               override, "info"], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and done.stdout == "", done.stderr
        assert done.stderr.startswith(f"error: {expected}"), done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
