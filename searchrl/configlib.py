"""Config groups as dataclasses: every group of an experiment config is one frozen dataclass, whose defaults
are the only ones, and whose number fields state the values they allow.

`to_config(dataclass)` turns a group's defaults into an `ml_collections.ConfigDict` (what `configs/*.py` edit
and `--config.x.y=...` overrides), `from_config(cls, group, where)` turns it back, rejecting any key the
dataclass does not have and any value outside its field's range. `searchrl.run_config` assembles a whole
experiment config from the groups.

A group is declared with `group` (a frozen dataclass that checks its ranges whenever one is made), and each
number field with `ranged(default, allowed)`, its allowed values written as intervals ("[1, inf)", "(0, 1]")
or single values, joined by "or" ("-1 or [1, inf)"); a tuple field's range holds for each of its numbers. NaN
is in no range, and an infinite value only in one closed at that end ("[0, inf]"). A value outside its range
is a `ConfigError` of one line naming the field and its range.
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
RANGE = "range"  # the metadata key of a field's `Range`


class ConfigError(ValueError):
    """A config that cannot be run (an unknown key, a value out of its range, a missing group): its message is
    one line naming where; the entry points end on it with that line (`searchrl.cli`)."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a number field allows, as written: intervals ("[0, 1)", "(0, inf)") and single values
    ("-1"), joined by " or "."""

    text: str
    # (low, high, low closed, high closed) of each part, a single value v as [v, v]; parsed from `text` when
    # the field is declared, so that a malformed range fails there
    parts: tuple[tuple[float, float, bool, bool], ...] = dataclasses.field(init=False, repr=False,
                                                                            compare=False)

    def __post_init__(self):
        parts = []
        for part in self.text.split(" or "):
            part = part.strip()
            if part[:1] in "[(" and part[-1:] in "])":
                low, high = (float(end) for end in part[1:-1].split(","))
                parts.append((low, high, part[0] == "[", part[-1] == "]"))
            else:
                parts.append((float(part), float(part), True, True))
        object.__setattr__(self, "parts", tuple(parts))

    def admits(self, value: Any) -> bool:
        """Whether `value` (a number, or a tuple of them, each checked) is allowed; NaN never is."""
        if isinstance(value, (tuple, list)):
            return all(self.admits(v) for v in value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return any((low < value or (closed_low and low == value)) and
                   (value < high or (closed_high and value == high))
                   for low, high, closed_low, closed_high in self.parts)

    def __str__(self) -> str:
        return self.text


def ranged(default: Any = dataclasses.MISSING, allowed: str = "") -> Any:
    """A number field of a config group (a tuple of numbers: each) and the values it allows (`Range`); None
    passes when the field is optional (`int | None`)."""
    return dataclasses.field(default=default, metadata={RANGE: Range(allowed)})


def range_problem(cls: type, values: Mapping[str, Any]) -> str | None:
    """"name=value is out of range: allowed RANGE" for the first of `values` (by field name of the dataclass
    `cls`) outside its field's range; None when every one is in."""
    for field in dataclasses.fields(cls):
        allowed = field.metadata.get(RANGE)
        if allowed is None or field.name not in values or values[field.name] is None:
            continue
        value = values[field.name]
        if not allowed.admits(value):
            each = " (each)" if isinstance(value, (tuple, list)) else ""
            return f"{field.name}={value!r} is out of range: allowed {allowed}{each}"
    return None


def check_ranges(config: Any) -> None:
    """Raises ConfigError when a field of the dataclass instance `config` is outside its range."""
    values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    if problem := range_problem(type(config), values):
        raise ConfigError(f"{type(config).__qualname__}.{problem}")


def group(cls: type[T]) -> type[T]:
    """`cls` as a config group: a frozen dataclass whose ranges (`ranged`) are checked whenever one is made,
    before its own `__post_init__` (checks across fields)."""
    own = getattr(cls, "__post_init__", None)

    def __post_init__(self) -> None:
        check_ranges(self)
        if own is not None:
            own(self)

    cls.__post_init__ = __post_init__
    return dataclasses.dataclass(frozen=True)(cls)


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
    config = ml_collections.ConfigDict()
    for field in dataclasses.fields(value):
        item = getattr(value, field.name)
        if dataclasses.is_dataclass(item):
            config[field.name] = to_config(item)
        elif item is None and _optional_type(hints[field.name]) is not None:
            config[field.name] = config_dict.placeholder(_optional_type(hints[field.name]))
        else:
            config[field.name] = item
    return config


def from_config(cls: type[T], values: Mapping[str, Any] | ml_collections.ConfigDict, where: str) -> T:
    """The `cls` of a config group (missing keys take the dataclass defaults); an unknown key, a value out of
    its field's range, or one the dataclass refuses, is a ConfigError naming `where` (e.g. "config.rl")."""
    values = values.to_dict() if isinstance(values, ml_collections.ConfigDict) else dict(values)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; known: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in values.items():
        if dataclasses.is_dataclass(hints[name]) and not dataclasses.is_dataclass(value):
            value = from_config(hints[name], value, f"{where}.{name}")
        elif isinstance(value, list):  # tuples come back as lists from some overrides
            value = tuple(value)
        kwargs[name] = value
    if problem := range_problem(cls, kwargs):
        raise ConfigError(f"{where}.{problem}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


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
