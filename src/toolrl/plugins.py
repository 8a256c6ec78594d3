"""Plug-ins: modules of the user's that register their own parsers, advantage estimators, losses, engines,
reward criteria or environments (`@register_parser`, `@register_advantage`, ...), imported by name before a
run builds anything (`plugins: [my_package.my_parts]` in a config, `--set plugins=[...]` on the command line)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from toolrl.errors import ConfigError
from toolrl.text import clip, first_line


def _from_here() -> None:
    """Modules in the current folder import whichever way toolrl was started (as `python -m` and `python` do)."""
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())


def import_modules(modules: Sequence[str], key: str) -> None:
    """Import each module, from the current folder too (a package next to the config is found whichever way
    toolrl was started); a module that fails is one line naming `key`."""
    if modules:
        _from_here()
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ConfigError(
                f"{key}: cannot import {module!r} ({type(exc).__name__}: {first_line(exc)}); "
                "is it installed or on PYTHONPATH?"
            ) from None


def import_object(where: str, target: str) -> Any:
    """The object a config names as `package.module:name` (a tool's function, an agent, a reward); a name that
    does not look so or does not import is one line naming `where`."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise ConfigError(f"{where}: {clip(target, 80)!r} must look like package.module:function")
    _from_here()
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where}: cannot import {clip(target, 80)!r} ({first_line(exc)})") from None
    except Exception as exc:  # the module itself fails as it imports
        raise ConfigError(
            f"{where}: importing {clip(module, 80)!r} failed ({type(exc).__name__}: {clip(first_line(exc), 200)})"
        ) from None
