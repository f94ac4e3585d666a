"""Config groups as dataclasses: every group of an experiment config is one frozen dataclass, whose defaults
are the only ones.

`to_config(dataclass)` turns a group's defaults into an `ml_collections.ConfigDict` (what `configs/*.py` edit
and `--config.x.y=...` overrides), `from_config(cls, group, where)` turns it back, rejecting any key the
dataclass does not have. `searchrl.run_config` assembles a whole experiment config from the groups.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import types
import typing
from types import ModuleType
from typing import Any, Mapping, TypeVar

import ml_collections
from ml_collections import config_dict

T = TypeVar("T")


def _optional_type(hint: Any) -> type | None:
    """X for an `X | None` annotation (None otherwise)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and type(None) in typing.get_args(hint):
            return typing.get_origin(args[0]) or args[0]
    return None


def to_config(value: Any) -> ml_collections.ConfigDict:
    """A ConfigDict of a dataclass instance's fields: nested dataclasses become nested groups, and a None
    whose annotation is `X | None` a placeholder of type X (so that `--config.x=...` can set it)."""
    hints = typing.get_type_hints(type(value))
    group = ml_collections.ConfigDict()
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if dataclasses.is_dataclass(item):
            group[field.name] = to_config(item)
        elif item is None and _optional_type(hints[field.name]) is not None:
            group[field.name] = config_dict.placeholder(_optional_type(hints[field.name]))
        else:
            group[field.name] = item
    return group


def from_config(cls: type[T], group: Mapping[str, Any] | ml_collections.ConfigDict, where: str) -> T:
    """The `cls` of a config group (missing keys take the dataclass defaults); an unknown key, or a value the
    dataclass refuses, is an error naming `where` (e.g. "config.rl")."""
    values = group.to_dict() if isinstance(group, ml_collections.ConfigDict) else dict(group)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        if dataclasses.is_dataclass(hints[name]) and not dataclasses.is_dataclass(value):
            value = from_config(hints[name], value, f"{where}.{name}")
        elif isinstance(value, list):  # tuples come back as lists from some overrides
            value = tuple(value)
        kwargs[name] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def sibling(config_file: str, name: str) -> ModuleType:
    """The config file `name`.py next to `config_file` (a config building on another's presets), loaded from
    its path: config files are not a package, and loading one changes no `sys.path`."""
    path = pathlib.Path(config_file).resolve().with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"searchrl_config_{name}", path)
    if spec is None or not path.is_file():
        raise FileNotFoundError(f"No config file {path} (imported by {config_file})")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def under_workdir(config: ml_collections.ConfigDict, *parts: str) -> config_dict.FieldReference:
    """`<config.workdir>/<parts...>` as a reference that follows the workdir: `--config.workdir=DIR` moves the
    path too, and setting the path itself (`--config.tokenizer=...`) leaves the workdir alone."""
    return config.get_ref("workdir") + "".join(f"/{part}" for part in parts)


def miniature_workdir(config: ml_collections.ConfigDict, workdir: str) -> ml_collections.ConfigDict:
    """`config` with workdir `workdir` and a miniature's world under it, wherever the workdir is moved: its
    datasets (data.dir), index (workdir/index) and tokenizer (workdir/tokenizer)."""
    config.workdir = workdir
    config.data.dir = under_workdir(config)
    config.retrieval.index_dir = under_workdir(config, "index")
    config.tokenizer = under_workdir(config, "tokenizer")
    return config
