"""Code: numeric questions answered by running Python in a sandboxed subprocess."""

from toolrl.envs.code.env import CodeEnv

__all__ = ["CodeEnv"]
