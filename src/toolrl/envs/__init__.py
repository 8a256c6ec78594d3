"""Environments, registered by name."""

from toolrl.envs import calculator  # noqa: F401  (registers the environment)
from toolrl.envs.base import ENVIRONMENTS, Environment, Task, make_env, register_env

__all__ = ["ENVIRONMENTS", "Environment", "Task", "make_env", "register_env"]
