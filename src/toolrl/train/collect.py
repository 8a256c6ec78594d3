"""Collecting a step's rollouts: the next prompts (TaskOrder), each repeated group_size times, this rank's share
rolled out with the step's seed (seeds.sampling) and scored by the rubric. With train.async_steps the next
step's rollout runs in the background while this step trains (one step off-policy)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from toolrl import seeds
from toolrl.distributed import Dist
from toolrl.envs import Task
from toolrl.rollout import Rollout, Trajectory


@dataclass
class TaskOrder:
    """The train split drawn without replacement in a seeded shuffle (seeds.task_order), reshuffled each epoch."""

    tasks: list[Task]
    run_seed: int
    order: list[int] = field(default_factory=list)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(seeds.task_order(self.run_seed))

    def next(self, n: int) -> list[Task]:
        chosen = []
        for _ in range(n):
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)
            chosen.append(self.tasks[self.order.pop()])
        return chosen

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the rest of the epoch's order and the generator's state."""
        return {"order": list(self.order), "rng": self.rng.getstate()}

    def load(self, state: dict[str, Any]) -> None:
        self.order = list(state["order"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


@dataclass
class RolloutPart:
    """A step's rollout: its trajectories, what its tools and rubric counted, and the policy version (optimizer
    steps taken) of the weights that sampled it."""

    trajs: list[Trajectory]
    tool_counts: Any
    reward_counts: Any
    rollout_s: float
    version: int


class Collector:
    """Rolls out the steps' groups. `refresh`: brings the generation weights up to date (called before a
    rollout starts); `version`: the optimizer steps in those weights."""

    def __init__(
        self,
        rollout: Rollout,
        order: TaskOrder,
        t,
        run_seed: int,
        dist: Dist,
        refresh: Callable[[], None],
        version: Callable[[], int],
    ) -> None:
        self.rollout, self.order, self.t, self.run_seed, self.dist = rollout, order, t, run_seed, dist
        self.refresh, self.version = refresh, version
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if t.async_steps else None
        self.pending: tuple[int, Future[RolloutPart], dict[str, Any]] | None = None

    def roll_out(self, step: int) -> RolloutPart:
        """The step's groups (this rank's share), scored by the rubric, sampled by the generator's weights."""
        started, version = time.perf_counter(), self.version()
        tasks = [task for task in self.order.next(self.t.prompts_per_step) for _ in range(self.t.group_size)]
        share = len(tasks) // self.dist.world  # whole groups: prompts_per_step splits over the ranks
        first = self.dist.rank * share
        executor, rubric = self.rollout.executor, self.rollout.env.rubric
        tool_counts, reward_counts = executor.metrics.copy(), rubric.stats()
        trajs = self.rollout.run(tasks[first : first + share], seed=seeds.sampling(self.run_seed, step), first=first)
        tool_counts, reward_counts = executor.metrics - tool_counts, rubric.stats() - reward_counts
        return RolloutPart(trajs, tool_counts, reward_counts, time.perf_counter() - started, version)

    def for_step(self, step: int, last_step: int) -> RolloutPart:
        """This step's rollout: made now, or (train.async_steps) the one that ran during the last update; then
        the next step's rollout starts, on the weights as they are before this step's update."""
        part = None
        if self.pending is not None and self.pending[0] == step:
            part = self.pending[1].result()
        self.pending = None
        if part is None:
            self.refresh()
            part = self.roll_out(step)
        if self.pool is not None and step < last_step:
            self.refresh()
            mark = self.order.state()
            self.pending = (step + 1, self.pool.submit(self.roll_out, step + 1), mark)
        return part

    def order_state(self) -> dict[str, Any]:
        """Where the task order stands for the next step to train (before a pending rollout drew its tasks)."""
        return self.pending[2] if self.pending is not None else self.order.state()

    def settle(self) -> None:
        """Wait for a rollout running in the background."""
        if self.pending is not None:
            self.pending[1].result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
