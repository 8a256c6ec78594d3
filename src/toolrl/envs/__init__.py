"""Environments, registered by name."""

from toolrl.envs import built, calculator, code, files, images, nl2sql, search  # noqa: F401  (register the environments)
from toolrl.envs.base import ENVIRONMENTS, Environment, Task, make_env, register_env

__all__ = ["ENVIRONMENTS", "Environment", "Task", "make_env", "register_env"]
