"""Reward functions and how they combine."""

from toolrl.rewards.rubric import Criterion, Rubric

__all__ = ["Criterion", "Rubric"]
