"""Named implementations of one concept (parsers, engines, environments, tool entry kinds).

Adding one is a function and a decorator; asking for an unknown name is a one-line config error that lists
the known ones. An entry may declare capabilities (`@register_engine("hf", supports_training=True)`) that callers
ask for by key (`ENGINES.capability(name, "supports_training")`), so that no caller tests an entry's name, and
its own options as a pydantic model (`@register_advantage("mine", options=MyOptions)`): the config's options
for it are validated by that model when the config is resolved, and `toolrl list` shows them.

A name is registered once: another definition under a taken name is refused unless it says `replace=True`
(registering the same definition again, a module imported twice, is not a conflict).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from toolrl.errors import ConfigError
from toolrl.text import clip

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """`load`: imports the modules whose entries register themselves, run once at the first read (so that
    importing one entry's module, say in a tool's worker process, does not import every other one)."""

    def __init__(self, what: str, config_key: str, load: Callable[[], Any] | None = None):
        super().__init__()
        self.what, self.config_key = what, config_key
        self.capabilities: dict[str, dict[str, Any]] = {}
        self.options: dict[str, type[BaseModel]] = {}
        self._load = load

    def load_with(self, load: Callable[[], Any]) -> None:
        """Run `load` at the first read (see the class)."""
        self._load = load

    def _loaded(self) -> None:
        if self._load is not None:
            load, self._load = self._load, None
            load()

    def __getitem__(self, name: str) -> T:
        self._loaded()
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        self._loaded()
        return super().__contains__(name)

    def __iter__(self):
        self._loaded()
        return super().__iter__()

    def __len__(self) -> int:
        self._loaded()
        return super().__len__()

    def get(self, name: str, default: Any = None) -> Any:
        self._loaded()
        return super().get(name, default)

    def keys(self):
        self._loaded()
        return super().keys()

    def values(self):
        self._loaded()
        return super().values()

    def items(self):
        self._loaded()
        return super().items()

    def register(
        self, name: str, *, options: type[BaseModel] | None = None, replace: bool = False, **capabilities: Any
    ) -> Callable[[T], T]:
        """A decorator adding an entry under `name`, with the capabilities and the options model it declares;
        a name taken by another definition is a ConfigError unless `replace`."""

        def add(item: T) -> T:
            taken = super(Registry, self).get(name)
            if taken is not None and not replace and _where(taken) != _where(item):
                raise ConfigError(
                    f"{self.what} {clip(name, 60)!r} is registered already (by {_where(taken)}); register "
                    f"{_where(item)} under another name, or with replace=True"
                )
            self[name] = item
            self.capabilities[name] = capabilities
            if options is not None:
                self.options[name] = options
            else:
                self.options.pop(name, None)
            return item

        return add

    def options_model(self, name: str) -> type[BaseModel] | None:
        """The options model entry `name` declared on its registration, else its own `Options` attribute (an
        environment class's); None: it takes no options."""
        entry = self.lookup(name)
        return self.options.get(name) or getattr(entry, "Options", None)

    def capability(self, name: str, key: str, default: Any = False) -> Any:
        """What entry `name` declares for `key` (`default` when it declares nothing)."""
        self.lookup(name)
        return self.capabilities.get(name, {}).get(key, default)

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            known = clip(", ".join(sorted(self)), 200)
            raise ConfigError(
                f"{self.config_key}: unknown {self.what} {clip(str(name), 60)!r}; known: {known}"
            ) from None


def _where(item: Any) -> str:
    """Where a registered definition comes from: module.qualname (objects without one: their type's)."""
    owner = item if hasattr(item, "__qualname__") else type(item)
    return f"{getattr(owner, '__module__', '?')}.{owner.__qualname__}"
