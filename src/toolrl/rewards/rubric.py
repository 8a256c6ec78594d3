"""Rewards as a rubric: weighted functions; weight 0 makes a function a logged metric only.

A criterion scores one trajectory, `fn(trajectory, task) -> float`, or, when `fn` has an async
`score_batch(trajectories) -> list[float]` (a model judge, a verifier running tools), a whole batch at once.
Scoring happens before the episodes close: `trajectory.episode` is there to read the final state of the
episode's backend, and `trajectory.infos` holds each step's info. Every component is kept unweighted in
`trajectory.rewards` and logged as `reward/NAME`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from toolrl.errors import ConfigError
from toolrl.registry import Registry
from toolrl.text import clip

RewardFn = Callable[[Any, Any], float]
"""(trajectory, task) -> score."""

CRITERIA: Registry[RewardFn] = Registry("reward criterion", "env.reward_weights")
"""Criteria any environment's rubric can take by name: `env.reward_weights: {NAME: weight}` adds a registered
criterion the environment does not have (and re-weights one it has)."""
register_criterion = CRITERIA.register


@dataclass(frozen=True)
class Criterion:
    name: str
    fn: Any
    """A RewardFn, or an object with `async score_batch(trajectories) -> list[float]`."""
    weight: float = 1.0

    async def score_all(self, trajs: Sequence[Any]) -> list[float]:
        if hasattr(self.fn, "score_batch"):
            return [float(s) for s in await self.fn.score_batch(trajs)]
        return [float(self.fn(traj, traj.task)) for traj in trajs]


class Rubric:
    """Weighted criteria; `success` names the one whose value (1 or 0) is the task's success, reported as
    `success` in training and evaluation (None: the environment reports no success rate)."""

    def __init__(
        self, criteria: Sequence[Criterion], success: str | None = None, counted: Mapping[str, Mapping[str, int]] = {}
    ):
        self.criteria = list(criteria)
        self.counted = dict(counted)
        """The environment's own running counts, by prefix (nim: games without a partner): `PREFIX/NAME` metrics."""
        names = [c.name for c in self.criteria]
        if len(set(names)) != len(names):
            raise ValueError(f"rubric criteria need distinct names, got {names}")
        if success is not None and success not in names:
            raise ValueError(f"rubric success criterion {clip(str(success), 60)!r} is not one of {names}")
        self.success = success

    def score(self, trajectory, task) -> tuple[float, dict[str, float]]:
        """Total reward and every component, unweighted, by name (per-trajectory criteria only)."""
        components = {c.name: float(c.fn(trajectory, task)) for c in self.criteria}
        self._check_success(components, task)
        return self.total(components), components

    def _check_success(self, components: Mapping[str, float], task: Any) -> None:
        """The success criterion gives 1 or 0: a score between them (a library's scorer: 0.6) had been reported as
        a success rate."""
        if self.success is None or components[self.success] in (0.0, 1.0):
            return
        raise ConfigError(
            f"rubric: the success criterion {self.success!r} gave {components[self.success]:g} for task "
            f"{clip(str(getattr(task, 'id', '?')), 60)}; success is 1 or 0: pay a score between 0 and 1 as a criterion "
            "of its own and name a 0/1 one as success (docs/environments.md, 'A score between 0 and 1')"
        )

    def total(self, components: Mapping[str, float]) -> float:
        return sum(c.weight * components[c.name] for c in self.criteria)

    async def score_all(self, trajs: Sequence[Any]) -> None:
        """Score a batch: batched criteria (judges, verifiers) run concurrently; sets reward and rewards."""
        columns = await asyncio.gather(*(c.score_all(trajs) for c in self.criteria))
        for i, traj in enumerate(trajs):
            traj.rewards = {c.name: column[i] for c, column in zip(self.criteria, columns, strict=True)}
            self._check_success(traj.rewards, traj.task)
            traj.reward = self.total(traj.rewards)
            traj.reward_weights = {c.name: c.weight for c in self.criteria if c.weight != 0}

    def stats(self) -> Counter[str]:
        """Running counts of criteria that keep them (a judge's failures and fallbacks), as `NAME/count`."""
        counts: Counter[str] = Counter()
        for c in self.criteria:
            for key, value in getattr(c.fn, "stats", {}).items():
                counts[f"{c.name}/{key}"] = value
        for prefix, kept in self.counted.items():
            for key, value in kept.items():
                counts[f"{prefix}/{key}"] = value
        return counts

    def with_weights(self, weights: Mapping[str, float], extra: Sequence[Criterion] = ()) -> Rubric:
        """This rubric with some weights changed (by criterion name) and `extra` criteria added."""
        known = {c.name for c in self.criteria} | {c.name for c in extra}
        added = [Criterion(name, CRITERIA[name], 0.0) for name in weights if name not in known and name in CRITERIA]
        unknown = sorted(set(weights) - known - {c.name for c in added})
        if unknown:
            names = ", ".join(sorted(known))
            registered = ", ".join(sorted(CRITERIA)) or "none"
            raise ConfigError(
                f"env.reward_weights: no criterion named {unknown[0]!r}; this environment has {names} "
                f"(registered criteria: {registered})"
            )
        criteria = [*self.criteria, *extra, *added]
        return Rubric([replace(c, weight=weights.get(c.name, c.weight)) for c in criteria], self.success, self.counted)


def process_reward(trajectory, task) -> float:
    """The sum of the per-turn rewards the environment gave (see `StepResult.reward`)."""
    return float(sum(trajectory.turn_rewards))


def mark_suspects(env, trajs: Sequence[Any]) -> None:
    """After scoring: each success (the rubric's success criterion at 1) gets the environment's rule-based
    second opinion (Environment.check_success) as `trajectory.suspect`."""
    success = env.rubric.success
    for traj in trajs:
        traj.suspect = None
        if success is not None and traj.env_fault is None and traj.rewards.get(success, 0.0) >= 1.0:
            traj.suspect = env.check_success(traj, traj.task)
