"""The `files` multi-turn environment: a file system backend, seeded tasks of several requests, scripted or
simulated users."""

from toolrl.envs.files.env import FilesEnv

__all__ = ["FilesEnv"]
