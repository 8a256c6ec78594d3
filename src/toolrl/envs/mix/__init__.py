"""Several environments in one run, drawn by weight (env.py)."""

from toolrl.envs.mix.env import MixEnv, MixOptions

__all__ = ["MixEnv", "MixOptions"]
