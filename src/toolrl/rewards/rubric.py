"""Rewards as a rubric: weighted plain functions; weight 0 makes a function a logged metric only."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

RewardFn = Callable[[Any, Any], float]
"""(trajectory, task) -> score."""


@dataclass(frozen=True)
class Criterion:
    name: str
    fn: RewardFn
    weight: float = 1.0


class Rubric:
    def __init__(self, criteria: Sequence[Criterion]):
        self.criteria = list(criteria)

    def score(self, trajectory, task) -> tuple[float, dict[str, float]]:
        """Total reward and every component, unweighted, by name."""
        components = {c.name: float(c.fn(trajectory, task)) for c in self.criteria}
        total = sum(c.weight * components[c.name] for c in self.criteria)
        return total, components
