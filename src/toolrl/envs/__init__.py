"""Environments, registered by name. The built-in ones are declared here and each is imported when first asked
for, so that naming one (a config, a tool's worker process importing the calculator) imports only it."""

from toolrl.envs.base import ENVIRONMENTS, Environment, EnvOptions, Episode, StepResult, Task, make_env, register_env
from toolrl.envs.reference import ReferenceRequest

BUILTIN_ENVIRONMENTS = (
    "agent",
    "built",
    "calculator",
    "chain",
    "code",
    "files",
    "harbor",
    "images",
    "mix",
    "nim",
    "nl2sql",
    "openenv",
    "search",
    "support",
    "verifiers",
)

for _name in BUILTIN_ENVIRONMENTS:
    ENVIRONMENTS.declare(_name, f"toolrl.envs.{_name}")

__all__ = [
    "ENVIRONMENTS",
    "EnvOptions",
    "Environment",
    "Episode",
    "ReferenceRequest",
    "StepResult",
    "Task",
    "make_env",
    "register_env",
]
