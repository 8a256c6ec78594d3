"""Reward functions and how they combine."""

from toolrl.rewards import rules  # noqa: F401  (registers the rule criteria)
from toolrl.rewards.rubric import CRITERIA, Criterion, Rubric, register_criterion

__all__ = ["CRITERIA", "Criterion", "Rubric", "register_criterion"]
