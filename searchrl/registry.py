"""The one way searchrl names its extension points: a `Registry` maps a config string to what it selects.

Tasks, retrievers, local index kinds, decoder families, data formats, rewards, advantage estimators, policy
losses and KL estimators and controllers are each a `Registry`; an entry is added where it is defined, with the
decorator:

    ADVANTAGES = Registry("advantage estimator", "config.rl.advantage")

    @ADVANTAGES.register("gae")
    def gae(...): ...

and looked up by the name a config holds (`ADVANTAGES.get(rl.advantage)`); an unknown name is an error naming
the config field and listing the known names. A task's entries (its data formats, retrievers, rewards) are
registered when its package is imported, which `searchrl.task.get` does.
"""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Named entries of one kind; `field` is the config field that selects one (for error messages)."""

    def __init__(self, kind: str, field: str):
        self.kind, self.field = kind, field
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A decorator adding its target under `name`; a name registered twice is an error."""
        def add(entry: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = entry
            return entry
        return add

    def get(self, name: str, field: str | None = None) -> T:
        """The entry named `name`; an unknown name is an error naming the field (`field`, where several
        select from this registry) and the known names."""
        if name not in self._entries:
            raise ValueError(f"{field or self.field}={name!r} is not a known {self.kind}; "
                             f"known: {self.names()}")
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
