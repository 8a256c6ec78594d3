"""The `nim` environment: two-player Nim with a `take` tool, played against itself (self-play, each seat a
trajectory with its role) or a fixed opponent (random, perfect, or a model such as the policy's step-0 copy)."""

from toolrl.envs.nim.env import NimEnv

__all__ = ["NimEnv"]
