"""searchrl.envs: one module per task, chosen by `config.env.name`.

A task module `searchrl.envs.<name>` defines `Config` (the dataclass of its `config.env` group) and
`make(config, retrieval) -> Env` (its env over the retriever that `config.retrieval` describes). Adding a task
is adding such a module (and a config file); nothing else names it.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Mapping

import ml_collections

from searchrl.configlib import from_config, to_config
from searchrl.episode import Env


def known() -> list[str]:
    """The task modules of this package."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__))


def env_module(name: str) -> ModuleType:
    """`searchrl.envs.<name>`; an unknown name is an error listing the known ones."""
    if name not in known():
        raise ValueError(f"config.env.name={name!r} is not a known environment; known: {known()}")
    return importlib.import_module(f"{__name__}.{name}")


def default_config(name: str) -> ml_collections.ConfigDict:
    """`config.env` of task `name`: its name and its `Config` defaults."""
    group = to_config(env_module(name).Config())
    group.name = name
    return group


def build(group: Mapping[str, Any] | ml_collections.ConfigDict, retrieval: Mapping[str, Any]) -> Env:
    """The env that `config.env` names, from its group (unknown keys are errors) and `config.retrieval`."""
    values = dict(group.to_dict() if isinstance(group, ml_collections.ConfigDict) else group)
    module = env_module(values.pop("name"))
    return module.make(from_config(module.Config, values, "config.env"), retrieval)
