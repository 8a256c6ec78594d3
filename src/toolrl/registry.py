"""Named implementations of one concept (parsers, engines, environments, tool entry kinds).

Adding one is a function and a decorator; asking for an unknown name is a one-line config error that lists
the known ones. An entry may declare capabilities (`@register_engine("hf", supports_training=True)`) that callers
ask for by key (`ENGINES.capability(name, "supports_training")`), so that no caller tests an entry's name, and
its own options as a pydantic model (`@register_advantage("mine", options=MyOptions)`): the config's options
for it are validated by that model when the config is resolved, and `toolrl list` shows them.

A name is registered once: another definition under a taken name is refused unless it says `replace=True`
(registering the same definition again, a module imported twice, is not a conflict).

Built-in entries are declared by name, module and capabilities (`ENGINES.declare("hf", "toolrl.rollout.hf",
supports_training=True)`): their names, capabilities and options are known without importing anything, and the
module is imported when the entry itself is first asked for. Reading a config, checking its names and listing
them therefore never imports torch; the module's own registration must say what the declaration said.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from toolrl.errors import ConfigError
from toolrl.text import clip, did_you_mean

T = TypeVar("T")


class Registry(dict[str, T], Generic[T]):
    """`options_attribute`: entries carry their options model as this attribute (an environment class's
    `Options`) instead of declaring it on registration."""

    def __init__(self, what: str, config_key: str, options_attribute: str | None = None):
        super().__init__()
        self.what, self.config_key = what, config_key
        self.capabilities: dict[str, dict[str, Any]] = {}
        self.options: dict[str, type[BaseModel]] = {}
        self.declared: dict[str, str] = {}
        """Name -> the module that registers it, for entries declared before they are imported."""
        self.options_attribute = options_attribute

    def declare(self, name: str, module: str, *, options: type[BaseModel] | None = None, **capabilities: Any) -> None:
        """Make `name` known with its capabilities and options model (None: it takes none); `module` registers
        the entry itself and is imported when the entry is first asked for."""
        self.declared[name] = module
        self.capabilities[name] = capabilities
        if options is not None:
            self.options[name] = options

    def _import_declared(self, name: object) -> None:
        module = self.declared.get(name) if isinstance(name, str) else None
        if module is not None and not super().__contains__(name):
            importlib.import_module(module)
            if not super().__contains__(name):
                raise ConfigError(f"{self.what} {name!r} is declared in {module}, which did not register it")

    def _names(self) -> list[str]:
        return list(dict.fromkeys([*self.declared, *super().keys()]))

    def __getitem__(self, name: str) -> T:
        self._import_declared(name)
        return super().__getitem__(name)

    def __contains__(self, name: object) -> bool:
        return name in self.declared or super().__contains__(name)

    def __iter__(self):
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self:
            return default
        return self[name]

    def keys(self):
        return self._names()

    def values(self):
        return [self[name] for name in self._names()]

    def items(self):
        return [(name, self[name]) for name in self._names()]

    def register(
        self, name: str, *, options: type[BaseModel] | None = None, replace: bool = False, **capabilities: Any
    ) -> Callable[[T], T]:
        """A decorator adding an entry under `name`, with the capabilities and the options model it declares;
        a name taken by another definition is a ConfigError unless `replace`."""

        def add(item: T) -> T:
            declared = self.declared.get(name)
            by_declared = declared is not None and _within(getattr(item, "__module__", ""), declared)
            if replace and declared is not None and not by_declared:
                self._import_declared(name)  # the built-in registers first, so that importing it later is no conflict
            taken = super(Registry, self).get(name)
            owner = _where(taken) if taken is not None else None if by_declared else declared
            if owner is not None and not replace and owner != _where(item):
                raise ConfigError(
                    f"{self.what} {clip(name, 60)!r} is registered already (by {owner}); register "
                    f"{_where(item)} under another name, or with replace=True"
                )
            if name in self.declared and not replace:
                self._check_declaration(name, item, options, capabilities)
            elif replace:
                self.declared.pop(name, None)
            self[name] = item
            self.capabilities[name] = capabilities
            if options is not None:
                self.options[name] = options
            else:
                self.options.pop(name, None)
            return item

        return add

    def _check_declaration(self, name: str, item: Any, options: Any, capabilities: dict[str, Any]) -> None:
        said = (self.options.get(name), self.capabilities.get(name, {}))
        if (options, capabilities) != said:
            raise ConfigError(
                f"{self.what} {name!r}: {_where(item)} registers it with options {options} and {capabilities}, "
                f"but it is declared with options {said[0]} and {said[1]}; make the two agree"
            )

    def options_model(self, name: str) -> type[BaseModel] | None:
        """The options model of entry `name`: the entry's own attribute in a registry of `options_attribute`
        (importing it), else the model it declared; None: it takes no options."""
        if self.options_attribute is not None:
            return getattr(self.lookup(name), self.options_attribute, None)
        self.require(name)
        return self.options.get(name)

    def capability(self, name: str, key: str, default: Any = False) -> Any:
        """What entry `name` declares for `key` (`default` when it declares nothing); a declared entry is not
        imported to answer."""
        self.require(name)
        return self.capabilities.get(name, {}).get(key, default)

    def require(self, name: str) -> None:
        """A ConfigError listing the known names unless `name` is one (a declared entry is not imported)."""
        if name not in self:
            self.lookup(name)

    def lookup(self, name: str) -> T:
        try:
            return self[name]
        except KeyError:
            known = clip(", ".join(sorted(self)), 200)
            raise ConfigError(
                f"{self.config_key}: unknown {self.what} {clip(str(name), 60)!r}{did_you_mean(name, self)}; "
                f"known: {known}"
            ) from None


def _where(item: Any) -> str:
    """Where a registered definition comes from: module.qualname (objects without one: their type's)."""
    owner = item if hasattr(item, "__qualname__") else type(item)
    return f"{getattr(owner, '__module__', '?')}.{owner.__qualname__}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")
