"""Search-R1-style question answering with a search tool over a local retriever."""

from toolrl.envs.search.env import SearchEnv

__all__ = ["SearchEnv"]
