"""Environments, registered by name. The built-in ones are imported at the registry's first read, so that
importing one environment's module (a tool's worker process importing the calculator) imports only it."""

import importlib

from toolrl.envs.base import ENVIRONMENTS, Environment, Task, make_env, register_env

BUILTIN_ENVIRONMENTS = ("built", "calculator", "code", "files", "images", "nl2sql", "search")


def _import_builtin() -> None:
    for name in BUILTIN_ENVIRONMENTS:
        importlib.import_module(f"toolrl.envs.{name}")


ENVIRONMENTS.load_with(_import_builtin)

__all__ = ["ENVIRONMENTS", "Environment", "Task", "make_env", "register_env"]
