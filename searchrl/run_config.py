"""The config of a run: every group an experiment config has, with its defaults from the group's dataclass, and
`parse`, the one place a ConfigDict becomes the typed `RunConfig` the library reads.

`configs/*.py` start from `experiment_config()` and change what their preset needs; each entry point (`searchrl.main`,
`searchrl.eval`, `searchrl.demo`, the benchmarks and the tasks' own CLIs) calls `parse` once, and every component
below it receives the typed group it needs. Nothing here (nor in the dataclasses) imports JAX, transformers or
orbax, so building and parsing a config is instant.
"""
from __future__ import annotations

import dataclasses
import os
import typing
from typing import Any

import ml_collections

from searchrl import task
from searchrl.configlib import ConfigError, from_config, to_config
from searchrl.data.config import DataConfig
from searchrl.models.config import DistributedConfig, MeshConfig, ModelSource
from searchrl.retrieval import RetrievalConfig, options_group
from searchrl.rl.config import RLConfig, SFTConfig, TrainConfig
from searchrl.rollout.config import RolloutConfig


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """A whole run's config, parsed: `task` is `config.env.name`, `env` that task's `Config`, and `demo` its
    miniature's config (`Task.demo_config`) when the preset has a `config.demo` group."""

    task: str
    env: Any
    seed: int = 0
    workdir: str = "runs/default"
    resume: str = ""  # "force": resume a checkpoint saved under another config (see searchrl.rl.trainer)
    tokenizer: str = ""  # a local HF tokenizer directory; empty: model.path
    model: ModelSource = ModelSource()
    mesh: MeshConfig = MeshConfig()
    distributed: DistributedConfig = DistributedConfig()
    data: DataConfig = DataConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    rl: RLConfig = RLConfig()
    sft: SFTConfig = SFTConfig()
    demo: Any = None


GROUPS: dict[str, Any] = typing.get_type_hints(RunConfig)  # group name -> its dataclass (or plain type)
DEFAULT_WORKDIR = RunConfig.workdir
RESUME_MODES = ("", "force")


def base_config() -> ml_collections.ConfigDict:
    """The fields every run has: seed, workdir, resume, model, mesh and distributed."""
    config = ml_collections.ConfigDict()
    config.seed = RunConfig.seed
    config.workdir = DEFAULT_WORKDIR
    config.resume = RunConfig.resume
    config.model = to_config(ModelSource())
    config.mesh = to_config(MeshConfig())
    config.distributed = to_config(DistributedConfig())
    return config


def experiment_config(name: str) -> ml_collections.ConfigDict:
    """Every group a training run reads: base, tokenizer, data, retrieval, the env group of task `name`, rollout,
    train, rl and sft."""
    config = base_config()
    config.tokenizer = RunConfig.tokenizer
    config.data = to_config(DataConfig())
    config.retrieval = to_config(RetrievalConfig())
    config.env = task.default_config(name)
    config.rollout = to_config(RolloutConfig())
    config.train = to_config(TrainConfig())
    config.rl = to_config(RLConfig())
    config.sft = to_config(SFTConfig())
    return config


def preset_workdir(config: ml_collections.ConfigDict, config_file: str, preset: str
                   ) -> ml_collections.ConfigDict:
    """`config` with its workdir named after its config file and preset (`runs/<file stem>_<preset>`, a
    variant's commas as underscores) unless the preset chose its own: two presets never share a workdir by
    default (`--config.workdir` still overrides it)."""
    if config.workdir == DEFAULT_WORKDIR:
        stem = os.path.splitext(os.path.basename(config_file))[0]
        config.workdir = os.path.join("runs", f"{stem}_{preset.replace(',', '_')}")
    return config


def retriever_options(retrieval: dict[str, Any]) -> dict[str, Any]:
    """`config.retrieval`'s values with its `options` made into the group its kind declares
    (`searchrl.retrieval.options_group`; the task, imported first, has registered its kinds), where it declares
    one: an unknown key or a value out of range is a ConfigError naming `config.retrieval.options`."""
    declared = options_group(retrieval.get("kind", RetrievalConfig.kind))
    if declared is None:
        return retrieval
    return retrieval | {"options": from_config(declared, retrieval.get("options", {}),
                                               "config.retrieval.options")}


def parse(config: ml_collections.ConfigDict) -> RunConfig:
    """The `RunConfig` of an experiment config: every group becomes its dataclass, the env group its task's
    `Config`, `config.demo` the task's `demo_config` and `config.retrieval.options` the group its retriever
    kind declares. A missing group of `experiment_config`, an unknown key, a value out of its field's range
    (`searchrl.configlib.ranged`) or one a dataclass refuses is a ConfigError, one line naming where it is
    (e.g. "config.rl.actor.lr=nan is out of range: allowed [0, inf)"); the entry points end on it with that
    line."""
    values = config.to_dict()
    missing = [name for name in ("env", "data", "retrieval", "rollout", "train", "rl", "model")
               if name not in values]
    if missing:
        raise ConfigError(f"The config has no {missing} group(s): start experiment configs from "
                          "searchrl.run_config.experiment_config().")
    unknown = sorted(set(values) - set(GROUPS))
    if unknown:
        raise ConfigError(f"config: unknown key(s) {unknown}; known: {sorted(set(GROUPS) - {'task'})}")
    env = dict(values.pop("env"))
    if "name" not in env:
        raise ConfigError("config.env: no name (the task it configures)")
    name = env.pop("name")
    try:
        spec = task.get(name)
    except ValueError as e:  # an unknown name: the registry's message lists the tasks
        raise ConfigError(str(e)) from None
    fields: dict[str, Any] = {"task": name, "env": from_config(spec.config, env, "config.env")}
    demo = values.pop("demo", None)
    if demo is not None:
        if spec.demo_config is None:
            raise ConfigError(f"config.demo: task {name!r} has no demo")
        fields["demo"] = from_config(spec.demo_config, demo, "config.demo")
    values["retrieval"] = retriever_options(values["retrieval"])
    for group, value in values.items():
        kind = GROUPS[group]
        is_group = dataclasses.is_dataclass(kind)
        fields[group] = from_config(kind, value, f"config.{group}") if is_group else value
    if fields.get("resume", "") not in RESUME_MODES:
        raise ConfigError(f"config.resume must be one of {RESUME_MODES}, got {fields['resume']!r}")
    return RunConfig(**fields)
