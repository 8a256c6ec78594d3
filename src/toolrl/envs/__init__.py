"""Environments, registered by name. The built-in ones are imported at the registry's first read, so that
importing one environment's module (a tool's worker process importing the calculator) imports only it."""

from toolrl.envs.base import ENVIRONMENTS, Environment, Task, make_env, register_env

__all__ = ["ENVIRONMENTS", "Environment", "Task", "make_env", "register_env"]
