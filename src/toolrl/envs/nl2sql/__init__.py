"""NL2SQL: questions about a sqlite database, answered with SQL checked by running it."""

from toolrl.envs.nl2sql.env import NL2SQLEnv

__all__ = ["NL2SQLEnv"]
