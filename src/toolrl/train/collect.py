"""Collecting a step's rollouts: the next prompts (TaskOrder), each repeated group_size times, this rank's share
rolled out with the step's seed (seeds.sampling) and scored by the rubric. With train.async_steps N the rollouts of
the next N steps run in the background while this step trains (at most N updates off-policy)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrl import distributed, seeds
from toolrl.distributed import Dist
from toolrl.envs import Task
from toolrl.loop_thread import LoopThread
from toolrl.rollout import Rollout, Trajectory

if TYPE_CHECKING:
    from toolrl.scoring.rollout_prefix import RolloutPrefix

log = logging.getLogger(__name__)


@dataclass
class TaskOrder:
    """The train split drawn without replacement in a seeded shuffle (seeds.task_order), reshuffled each epoch;
    with a pass-rate curriculum (`train.curriculum`), drawn by each task's recent pass rate instead."""

    tasks: list[Task]
    run_seed: int
    order: list[int] = field(default_factory=list)
    rng: random.Random = field(init=False)
    curriculum: Any = None
    """A CurriculumConfig; None or mode shuffle: the seeded shuffle."""
    history: dict[str, list[int]] = field(default_factory=dict)
    """Task id -> its last `curriculum.window` outcomes (1: a success), oldest first."""
    mix: dict[str, float] | None = None
    """Several environments (envs/mix): label -> weight. Each prompt's environment is drawn by weight, then its
    task from that environment's own seeded shuffle (or by pass rate within it)."""
    orders: dict[str, list[int]] = field(default_factory=dict)
    """With `mix`: each environment's rest of its epoch."""

    def __post_init__(self) -> None:
        self.rng = random.Random(seeds.task_order(self.run_seed))
        self.groups: dict[str, list[int]] = {}
        for i, task in enumerate(self.tasks if self.mix else ()):
            self.groups.setdefault(str(task.meta.get("env")), []).append(i)
        if self.mix and (missing := [k for k in self.mix if k not in self.groups]):
            from toolrl.errors import ConfigError

            raise ConfigError(f"env: the mix's environment {missing[0]} has no train tasks")

    @property
    def by_pass_rate(self) -> bool:
        return self.curriculum is not None and self.curriculum.mode == "pass_rate"

    def next(self, n: int) -> list[Task]:
        if self.mix:
            return [self._from(self._environment()) for _ in range(n)]
        if self.by_pass_rate:
            return self._weighted(n)
        chosen = []
        for _ in range(n):
            if not self.order:
                self.order = list(range(len(self.tasks)))
                self.rng.shuffle(self.order)
            chosen.append(self.tasks[self.order.pop()])
        return chosen

    def _environment(self) -> str:
        keys = list(self.mix or ())
        return self.rng.choices(keys, weights=[self.mix[k] for k in keys])[0] if len(keys) > 1 else keys[0]

    def _from(self, key: str) -> Task:
        """The next task of one environment of a mix: its shuffle's next, or one drawn by pass rate."""
        indices = self.groups[key]
        if self.by_pass_rate:
            return self.tasks[self.rng.choices(indices, weights=[self.weight(self.tasks[i]) for i in indices])[0]]
        order = self.orders.setdefault(key, [])
        if not order:
            order.extend(indices)
            self.rng.shuffle(order)
        return self.tasks[order.pop()]

    def _weighted(self, n: int) -> list[Task]:
        """n tasks, distinct while the split lasts, each drawn with its weight (curriculum_weight)."""
        chosen: list[Task] = []
        pool: list[int] = []
        for _ in range(n):
            if not pool:
                pool = list(range(len(self.tasks)))
            weights = [self.weight(self.tasks[i]) for i in pool]
            chosen.append(self.tasks[pool.pop(self.rng.choices(range(len(pool)), weights=weights)[0])])
        return chosen

    def weight(self, task: Task) -> float:
        """4 p (1 - p) for a recent pass rate p (1 at one half, where a group's rewards differ most), at least
        curriculum.floor (a solved or hopeless task comes back now and then); a task never tried: 1."""
        outcomes = self.history.get(task.id)
        if not outcomes:
            return 1.0
        p = sum(outcomes) / len(outcomes)
        return max(4 * p * (1 - p), self.curriculum.floor)

    def record(self, outcomes: list[tuple[str, int]]) -> None:
        """A step's outcomes, (task id, 1 for a success), into each task's window."""
        if not self.by_pass_rate:
            return
        for task_id, ok in outcomes:
            window = self.history.setdefault(task_id, [])
            window.append(int(ok))
            del window[: -self.curriculum.window]

    def pass_rates(self) -> dict[str, dict[str, float]]:
        """Per task tried: its recent pass rate, attempts remembered and weight (RUN/pass_rates.json)."""
        by_id = {t.id: t for t in self.tasks}
        return {tid: {"pass_rate": round(sum(h) / len(h), 4), "attempts": len(h),
                      "weight": round(self.weight(by_id[tid]), 4) if tid in by_id else 0.0}
                for tid, h in self.history.items() if h}  # fmt: skip

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the rest of the epoch's order, the generator's state, the pass-rate windows."""
        state = {
            "order": list(self.order),
            "rng": self.rng.getstate(),
            "history": {k: list(v) for k, v in self.history.items()},
        }
        return state | ({"orders": {k: list(v) for k, v in self.orders.items()}} if self.mix else {})

    def load(self, state: dict[str, Any]) -> None:
        self.order = list(state["order"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.history = {str(k): [int(x) for x in v] for k, v in (state.get("history") or {}).items()}
        self.orders = {str(k): [int(x) for x in v] for k, v in (state.get("orders") or {}).items()}


@dataclass
class RolloutPart:
    """A step's rollout: its trajectories, what its tools and rubric counted, and the policy version (optimizer
    steps taken) of the weights that sampled it as it started (partial rollouts tag each token: Trajectory.versions)."""

    trajs: list[Trajectory]
    tool_counts: Any
    reward_counts: Any
    rollout_s: float
    version: int


@dataclass
class _Ahead:
    """A rollout started before its step: its result to come, and the task order as it stood before its draw."""

    step: int
    future: Future[RolloutPart]
    mark: dict[str, Any]


class Collector:
    """Rolls out the steps' groups. `refresh`: brings the generation weights up to date (called before a
    rollout starts); `version`: the optimizer steps in those weights.

    With train.async_steps N, when step k's rollout is taken the rollouts of steps k+1..k+N are started (their tasks
    drawn now, in order): the trainer's weights are then k-1 updates old, so no rollout is trained more than N
    updates after the weights it started with. Without partial rollouts they run one after another, each on the
    weights as they are when it starts; with them (the engine takes new weights as it samples) they run at once on
    one event loop, and the engine batches the episodes of several steps together: a slow episode holds up no
    other step's."""

    def __init__(
        self,
        rollout: Rollout,
        order: TaskOrder,
        t,
        run_seed: int,
        dist: Dist,
        refresh: Callable[[], None],
        version: Callable[[], int],
        kept: RolloutPrefix | None = None,
    ) -> None:
        self.rollout, self.order, self.t, self.run_seed, self.dist = rollout, order, t, run_seed, dist
        self.refresh, self.version = refresh, version
        self.kept = kept
        """Computes and keeps the rollouts' shared prompt passes for the updates (scoring/rollout_prefix.py)."""
        self.ahead = t.async_steps
        self.together = bool(t.async_steps) and t.partial_rollouts != "off"
        """Whether rollouts ahead run at once on one event loop (partial rollouts) rather than one after another."""
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="rollout") if t.async_steps and not self.together else None
        self.loop = LoopThread("rollout") if self.together else None
        self.pending: dict[int, _Ahead] = {}
        self._counted: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        """(tool, rubric) counters when the last rollout running at once ended, or when the first of them started."""

    @property
    def asynchronous(self) -> bool:
        return self.ahead > 0

    def draw(self) -> list[Task]:
        """The next step's groups: prompts_per_step tasks, each group_size times."""
        return [task for task in self.order.next(self.t.prompts_per_step) for _ in range(self.t.group_size)]

    def _share(self, tasks: list[Task]) -> tuple[list[Task], int]:
        share = len(tasks) // self.dist.world  # whole groups: prompts_per_step splits over the ranks
        first = self.dist.rank * share
        return tasks[first : first + share], first

    def roll_out(self, step: int, tasks: list[Task] | None = None) -> RolloutPart:
        """The step's groups (this rank's share), scored by the rubric, sampled by the generator's weights."""
        started, version = time.perf_counter(), self.version()
        mine, first = self._share(self.draw() if tasks is None else tasks)
        executor, rubric = self.rollout.executor, self.rollout.env.rubric
        tool_counts, reward_counts = executor.metrics.copy(), rubric.stats()
        with self.kept.for_rollout() if self.kept is not None else nullcontext():
            trajs = self.rollout.run(mine, seed=seeds.sampling(self.run_seed, step), first=first)
        tool_counts, reward_counts = executor.metrics - tool_counts, rubric.stats() - reward_counts
        return RolloutPart(trajs, tool_counts, reward_counts, time.perf_counter() - started, version)

    async def _roll_out_together(self, step: int, tasks: list[Task]) -> RolloutPart:
        """A rollout beside others on the shared loop, on the weights the engine takes between its steps (not
        loaded here: another rollout may be sampling). Its tool and rubric counts are those counted since the last
        rollout running at once ended, or since the first of them started (every count lands in exactly one step)."""
        started, version = time.perf_counter(), self.version()  # the engine takes newer weights as it samples
        mine, first = self._share(tasks)
        trajs = await self.rollout.arun(mine, seed=seeds.sampling(self.run_seed, step), first=first)
        executor, rubric = self.rollout.executor, self.rollout.env.rubric
        before, self._counted = self._counted, (executor.metrics.copy(), rubric.stats())
        if not self.pending_or_running(step):
            await asyncio.to_thread(self.rollout.engine.free_memory)
        return RolloutPart(trajs, self._counted[0] - before[0], self._counted[1] - before[1],
                           time.perf_counter() - started, version)  # fmt: skip

    def pending_or_running(self, step: int) -> bool:
        """Whether a rollout other than `step`'s is started and not taken yet."""
        return any(k != step and not a.future.done() for k, a in list(self.pending.items()))  # (another thread's)

    def _start(self, step: int) -> None:
        mark, tasks = self.order.state(), self.draw()
        idle = all(ahead.future.done() for ahead in self.pending.values())  # no rollout ahead is running
        if self.loop is not None:
            if idle:  # what was counted before (this step's own rollout, made now) is no rollout ahead's
                self._counted = (self.rollout.executor.metrics.copy(), self.rollout.env.rubric.stats())
            future = self.loop.submit(self._roll_out_together(step, tasks))
        else:  # one after another: one that starts at once takes the weights here, before this step's update
            if idle:  # (deterministic); a later one takes the newest as it starts
                self.refresh()
            future = self.pool.submit(self._refreshed, step, tasks, not idle)
        self.pending[step] = _Ahead(step, future, mark)

    def _refreshed(self, step: int, tasks: list[Task], refresh: bool) -> RolloutPart:
        if refresh:
            self.refresh()
        return self.roll_out(step, tasks)

    def for_step(self, step: int, last_step: int) -> RolloutPart:
        """This step's rollout: started ahead (train.async_steps), or made now; then the rollouts of the steps up
        to N ahead are started."""
        ahead = self.pending.pop(step, None)
        if ahead is not None:
            part = ahead.future.result()
        else:
            self.refresh()
            part = self.roll_out(step)
        if self.order.by_pass_rate:  # before the next draw: a resumed run draws as the uninterrupted one did
            success = self.rollout.env.rubric.success
            mine = [(t.task.id, int(_succeeded(t, success))) for t in part.trajs]
            self.order.record([o for rank in distributed.gather(self.dist, mine) for o in rank])
        for k in range(step + 1, min(step + self.ahead, last_step) + 1):
            if k not in self.pending:
                self._start(k)
        return part

    def order_state(self) -> dict[str, Any]:
        """Where the task order stands for the next step to train (before the rollouts ahead drew their tasks)."""
        return self.pending[min(self.pending)].mark if self.pending else self.order.state()

    def settle(self) -> None:
        """Wait for the rollouts running ahead."""
        for ahead in list(self.pending.values()):
            ahead.future.result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        if self.loop is not None:
            self.settle_quietly()
            self.loop.stop()

    def settle_quietly(self) -> None:
        """Wait for the rollouts ahead, whatever became of them (closing: their failures were or will be raised)."""
        for ahead in list(self.pending.values()):
            try:
                ahead.future.result()
            except Exception:  # closing after a failure: the failure itself is the one raised
                log.debug("a rollout ahead ended with an error while closing", exc_info=True)


def _succeeded(traj: Trajectory, success: str | None) -> bool:
    """A success for the curriculum: the rubric's success criterion at 1, else a positive reward."""
    if traj.env_fault is not None:
        return False
    return traj.rewards.get(success, 0.0) >= 1.0 if success is not None else traj.reward > 0


def curriculum_metrics(rates: dict[str, dict[str, float]]) -> dict[str, float]:
    """The pass-rate curriculum at a glance: tasks tried, and the shares of them solved (recent pass rate 1),
    unsolved (0) and in between (the ones with signal)."""
    n = max(len(rates), 1)
    solved = sum(r["pass_rate"] == 1.0 for r in rates.values())
    unsolved = sum(r["pass_rate"] == 0.0 for r in rates.values())
    return {"curriculum_tasks_tried": len(rates), "curriculum/solved": solved / n, "curriculum/unsolved": unsolved / n,
            "curriculum/learnable": (len(rates) - solved - unsolved) / n}  # fmt: skip
