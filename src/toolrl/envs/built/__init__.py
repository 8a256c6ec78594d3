"""The environment `toolrl env build` deploys."""

from toolrl.envs.built.env import BuiltEnv

__all__ = ["BuiltEnv"]
