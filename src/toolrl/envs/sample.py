"""Which N tasks of a split a run takes (`sft.num_tasks`, `eval.num_tasks`, `--num-tasks`): a seeded sample spread
over the tasks' categories (`task.meta["category"]`) in proportion to their sizes, at least one of each where N
allows, kept in the split's order. The split's first N had been taken: a split written category by category (as
task generators emit it) warm-started a run on one category and evaluated it on another.

The seed is the environment's (`env.seed`), not the run's: runs of several seeds on the same tasks are evaluated on
the same sample, and the warm start and the evaluation of a run take the same sample in every process."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from toolrl.envs.base import Task


@dataclass(frozen=True)
class Taken:
    """A split's sample: the tasks and what was taken (`line()`, for the log)."""

    tasks: list[Task]
    total: int
    seed: int
    counts: dict[str, int]
    """Category -> tasks taken of it (empty where the tasks have no categories)."""

    def line(self, what: str) -> str:
        if len(self.tasks) == self.total:
            return f"{what}: all {self.total} tasks"
        kinds = f" over {len(self.counts)} categories ({', '.join(f'{k} {n}' for k, n in self.counts.items())})"
        return (f"{what}: {len(self.tasks)} of {self.total} tasks, a sample with seed {self.seed}"
                f"{kinds if self.counts else ''}")  # fmt: skip


def _quotas(sizes: dict[str, int], n: int, rng: random.Random) -> dict[str, int]:
    """n split over the groups in proportion to their sizes (largest remainders first, ties in a seeded order),
    then at least one for each group while n has room: from the group with the most."""
    total = sum(sizes.values())
    exact = {k: n * size / total for k, size in sizes.items()}
    quotas = {k: int(x) for k, x in exact.items()}
    order = list(sizes)
    rng.shuffle(order)
    by_remainder = sorted(order, key=lambda k: quotas[k] - exact[k])
    for k in by_remainder[: n - sum(quotas.values())]:
        quotas[k] += 1
    for k in sizes:
        if quotas[k] == 0 and n >= len(sizes):
            quotas[max(quotas, key=quotas.get)] -= 1
            quotas[k] = 1
    return quotas


def spread_sample(tasks: Sequence[Task], n: int | None, seed: int) -> Taken:
    """`n` of `tasks` (all of them where n is None or not less than their count), spread over their categories."""
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(str(task.meta.get("category", "")), []).append(i)
    named = {k: len(v) for k, v in groups.items()} if set(groups) != {""} else {}
    if n is None or n >= len(tasks):
        return Taken(list(tasks), len(tasks), seed, named)
    rng = random.Random(seed)
    quotas = _quotas({k: len(v) for k, v in groups.items()}, n, rng)
    picked = sorted(i for k, rows in groups.items() for i in rng.sample(rows, quotas[k]))
    counts = {k: quotas[k] for k in groups if quotas[k]} if named else {}
    return Taken([tasks[i] for i in picked], len(tasks), seed, counts)
