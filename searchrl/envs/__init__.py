"""searchrl.envs: one module per task, chosen by `config.env.name`.

A task module `searchrl.envs.<name>` defines `Config` (the dataclass of its `config.env` group) and
`make(config, retrieval) -> Env` (its env over the retriever that `config.retrieval` describes). Adding a task
is adding such a module (and a config file); nothing else names it.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Mapping, Sequence

import ml_collections

from searchrl.configlib import from_config, to_config
from searchrl.episode import Action, Env, Turn
from searchrl.text import tags

INVALID = "invalid"  # the action kind of a turn that is not a valid action, in every env


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


def tool_or_answer(turn_text: str, turn_index: int, max_turns: int, tool: str, missing: str,
                   tool_disabled: str) -> Action:
    """The first `<tool>` or `<answer>` block of a turn as its action (kind: the tag). An answer ends the
    episode, and so does the turn after the last tool turn (`turn_index >= max_turns`), whatever it holds: a
    tool call there is invalid (`tool_disabled`), as is a turn with neither block (`missing`)."""
    last_turn = turn_index >= max_turns
    block = tags.first_block(turn_text, tool, tags.ANSWER)
    if block is None:
        return Action(INVALID, missing, done=last_turn)
    kind, content = block
    if kind == tool and last_turn:
        return Action(INVALID, tool_disabled, done=True)
    return Action(kind, content, done=kind == tags.ANSWER or last_turn)


def final_answer(turns: Sequence[Turn]) -> str:
    """The answer of a row's last turn ("" when it did not answer)."""
    last = turns[-1].action if turns else None
    return last.content if last is not None and last.kind == tags.ANSWER else ""
