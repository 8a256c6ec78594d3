"""Named implementations of one concept (parsers, engines, environments, tool entry kinds).

Adding one is a function and a decorator; asking for an unknown name is a one-line config error that lists
the known ones. An entry may declare capabilities (`@register_engine("hf", can_train=True)`) that callers ask
for by key (`ENGINES.capability(name, "can_train")`), so that no caller tests an entry's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from toolrl.errors import ConfigError

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    def __init__(self, what: str, config_key: str):
        super().__init__()
        self.what, self.config_key = what, config_key
        self.capabilities: dict[str, dict[str, Any]] = {}

    def register(self, name: str, **capabilities: Any) -> Callable[[T], T]:
        """A decorator adding an entry under `name`, with the capabilities it declares."""

        def add(item: T) -> T:
            self[name] = item
            self.capabilities[name] = capabilities
            return item

        return add

    def capability(self, name: str, key: str, default: Any = False) -> Any:
        """What entry `name` declares for `key` (`default` when it declares nothing)."""
        self.lookup(name)
        return self.capabilities.get(name, {}).get(key, default)

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            known = ", ".join(sorted(self))
            raise ConfigError(f"{self.config_key}: unknown {self.what} {name!r}; known: {known}") from None
