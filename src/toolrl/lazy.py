"""Packages whose names are imported from their modules when first read (PEP 562), so that importing one light
module of a package (a registry, to check a config) does not import the heavy ones beside it (torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of package `package`: each name of `exports` (name -> module) is imported from its
    module at the first read and kept on the package."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
