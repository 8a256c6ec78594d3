"""Named implementations of one concept (parsers, engines, environments, tool entry kinds).

Adding one is a function and a decorator; asking for an unknown name is a one-line config error that lists
the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from toolrl.errors import ConfigError

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    def __init__(self, what: str, config_key: str):
        super().__init__()
        self.what, self.config_key = what, config_key

    def register(self, name: str) -> Callable[[T], T]:
        def add(item: T) -> T:
            self[name] = item
            return item

        return add

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            known = ", ".join(sorted(self))
            raise ConfigError(f"{self.config_key}: unknown {self.what} {name!r}; known: {known}") from None
