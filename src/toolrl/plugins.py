"""Plug-ins: modules of the user's that register their own parsers, advantage estimators, losses, engines,
reward criteria or environments (`@register_parser`, `@register_advantage`, ...), imported by name before a
run builds anything (`plugins: [my_package.my_parts]` in a config, `--set plugins=[...]` on the command line)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence

from toolrl.errors import ConfigError
from toolrl.text import first_line


def import_modules(modules: Sequence[str], key: str) -> None:
    """Import each module, from the current folder too (a package next to the config is found whichever way
    toolrl was started); a module that fails is one line naming `key`."""
    if modules and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ConfigError(
                f"{key}: cannot import {module!r} ({type(exc).__name__}: {first_line(exc)}); "
                "is it installed or on PYTHONPATH?"
            ) from None
