"""Evaluation: run a split through the model and its tools, and summarise it: success, tool calls and turns,
and, where the tasks say more, success per category, per request of a multi-turn task (and per kind of request),
and Solve-P/R/F1 over tasks that carry sub-problems."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from toolrl.envs.base import Task
from toolrl.rollout.limits import STOP_REASONS
from toolrl.rollout.loop import Rollout
from toolrl.rollout.trajectory import Trajectory
from toolrl.text import clip


def summarize(trajs: Sequence[Trajectory], success: str | None) -> dict[str, float]:
    """Means over `trajs`; `success` is the rubric's success criterion (None: no success rate)."""
    n = max(len(trajs), 1)
    stats = {
        "reward": sum(t.reward for t in trajs) / n,
        "tool_calls": sum(t.num_tool_calls for t in trajs) / n,
        "turns": sum(t.num_turns for t in trajs) / n,
        "format_errors": sum(t.num_format_errors for t in trajs) / n,
        "tool_errors": sum(t.num_tool_errors - t.num_tool_faults for t in trajs) / n,
        "tool_faults": sum(t.num_tool_faults for t in trajs) / n,
        "faulted": sum(t.num_tool_faults > 0 for t in trajs) / n,
        "response_tokens": sum(t.response_length for t in trajs) / n,
        "segments": sum(len(t.segments) + 1 for t in trajs) / n,
        "summaries": sum(len(t.summaries) for t in trajs) / n,
        "env_faults": sum(t.env_fault is not None for t in trajs) / n,
        "user_tokens": sum(t.user_tokens for t in trajs) / n,
        "user_s": sum(t.timings.get("user_s", 0.0) for t in trajs) / n,
    }
    if success is not None:
        stats = {"success": sum(t.rewards.get(success, 0.0) for t in trajs) / n, **stats}
        successes = sum(t.rewards.get(success, 0.0) >= 1.0 for t in trajs)
        stats["suspect_successes"] = sum(t.suspect is not None for t in trajs) / max(successes, 1)
        stats |= category_success(trajs, success)
    for name in dict.fromkeys(name for t in trajs for name in t.rewards):  # a mix's environments name their own
        having = [t.rewards[name] for t in trajs if name in t.rewards]
        stats[f"reward/{name}"] = sum(having) / len(having)
    stats |= environment_stats(trajs, success)
    if success is not None:
        stats |= pass_at_k(trajs, success)
    reasons = Counter(t.stop_reason for t in trajs)
    for reason in (*STOP_REASONS, *(r for r in reasons if r not in STOP_REASONS)):
        stats[f"stop/{reason}"] = reasons[reason] / n  # every reason, so each step has the same columns
    outcomes = Counter(user_outcome(t) for t in trajs if t.stop_reason == "user_ended")
    for outcome, count in sorted(outcomes.items()):  # how a simulated user ended (users.UserPrompt.stop)
        stats[f"user_outcome/{outcome}"] = count / n
    return stats


def environment_stats(trajs: Sequence[Trajectory], success: str | None) -> dict[str, float]:
    """`env/LABEL/share`, `/reward` and `/success` of each environment of a mix (tasks' meta["env"], envs/mix), and
    `role/NAME/...` of each role the policy played (trajectories' `role`, where an environment gives roles)."""
    stats: dict[str, float] = {}
    for prefix, name_of in (("env", lambda t: t.task.meta.get("env")), ("role", lambda t: t.role)):
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for t in trajs:
            if name_of(t) is not None:
                groups[str(name_of(t))].append(t)
        for key, group in sorted(groups.items()):
            stats[f"{prefix}/{key}/share"] = len(group) / len(trajs)
            stats[f"{prefix}/{key}/reward"] = sum(t.reward for t in group) / len(group)
            if success is not None:
                stats[f"{prefix}/{key}/success"] = sum(t.rewards.get(success, 0.0) for t in group) / len(group)
    return stats


def pass_counts(trajs: Sequence[Trajectory], success: str) -> list[tuple[int, int]]:
    """(trials, successes) of each task that `trajs` sampled (several trajectories of one task: eval.trials), in
    the order first seen; a trajectory succeeds when its success criterion is 1."""
    counts: dict[str, list[int]] = {}
    for t in trajs:
        seen = counts.setdefault(t.task.id, [0, 0])
        seen[0] += 1
        seen[1] += t.rewards.get(success, 0.0) >= 1.0
    return [(n, c) for n, c in counts.values()]


def pass_ks(trials: int) -> list[int]:
    """The k reported for `trials` samples per task: every k up to 8, then powers of 2, and `trials` itself."""
    ks = [k for k in range(1, min(trials, 8) + 1)] + [2**p for p in range(4, trials.bit_length()) if 2**p < trials]
    return sorted({*ks, trials})


def pass_at_k(trajs: Sequence[Trajectory], success: str) -> dict[str, float]:
    """`pass@k` (at least one of k samples of a task succeeds) and `pass^k` (all k do: tau-bench's reliability)
    for every k the fewest trials of a task allow, each the unbiased estimate from a task's n trials with c
    successes, averaged over tasks: pass@k = 1 - C(n - c, k) / C(n, k), pass^k = C(c, k) / C(n, k) (Chen et al.
    2021; Yao et al. 2024). Empty where a task has one trial (pass@1 = pass^1 = success)."""
    counts = pass_counts(trajs, success)
    least = min((n for n, _ in counts), default=0)
    if least < 2:
        return {}
    stats: dict[str, float] = {}
    for k in pass_ks(least):
        stats[f"pass@{k}"] = sum(1 - math.comb(n - c, k) / math.comb(n, k) for n, c in counts) / len(counts)
        stats[f"pass^{k}"] = sum(math.comb(c, k) / math.comb(n, k) for n, c in counts) / len(counts)
    return stats


def user_outcome(traj: Trajectory) -> str:
    """How the user ended `traj`: its stop marker's outcome (done, transfer, out_of_scope, ...), or `done` for a
    scripted user's last line."""
    found = next(
        (i.get("user_outcome") for i in reversed(traj.infos) if isinstance(i, dict) and i.get("user_outcome")), None
    )
    return clip(str(found), 40) if found else "done"


MAX_CATEGORIES = 32
"""Categories logged by name per step or evaluation; a data set with more (its own ids as categories) has the
smallest ones pooled as `success/(other categories)`, so a metrics file stays readable and nothing is dropped."""


def category_success(trajs: Sequence[Trajectory], success: str) -> dict[str, float]:
    """`success/<category>`: the success rate of the trajectories whose task has that meta["category"] (a built
    environment's scenario, the files environment's number of requests; a task's text, so names are clipped). A
    step's mean success moves with the mix of tasks it drew; these say whether each kind of task is learned."""
    categories: dict[str, list[float]] = defaultdict(list)
    for name, group in by_category(trajs).items():
        categories[clip(name, 60)] += [t.rewards.get(success, 0.0) for t in group]
    if len(categories) > MAX_CATEGORIES:
        kept = sorted(categories, key=lambda name: (-len(categories[name]), name))[: MAX_CATEGORIES - 1]
        other = [v for name, values in categories.items() if name not in kept for v in values]
        categories = {name: categories[name] for name in kept} | {"(other categories)": other}
    return {f"success/{name}": sum(v) / len(v) for name, v in sorted(categories.items())}


def by_category(trajs: Sequence[Trajectory]) -> dict[str, list[Trajectory]]:
    """The trajectories whose task has a meta["category"], grouped by it (in the order first seen)."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        if "category" in t.task.meta:
            groups[str(t.task.meta["category"])].append(t)
    return groups


def run_tasks(
    rollout: Rollout,
    tasks: Sequence[Task],
    batch_size: int,
    seed: int | None = None,
    on_finished: Callable[[], None] | None = None,
) -> list[Trajectory]:
    """One trajectory per task, `batch_size` at a time; with `seed`, task i samples with seeds.derive(seed, i)
    (the same draws whatever the batch size or timing). `on_finished` is told as each trajectory ends."""
    trajs: list[Trajectory] = []
    rollout.on_finished = on_finished
    try:
        for start in range(0, len(tasks), batch_size):
            trajs += rollout.run(tasks[start : start + batch_size], seed, first=start)
    finally:
        rollout.on_finished = None
    return trajs


def evaluate(rollout: Rollout, tasks: Sequence[Task], batch_size: int, seed: int | None = None) -> dict[str, float]:
    """Success and the other summaries over `tasks` (see run_tasks)."""
    return summarize(run_tasks(rollout, tasks, batch_size, seed), rollout.env.rubric.success)


def _rate(values: Sequence[float]) -> dict[str, float]:
    return {"tasks": len(values), "success": sum(values) / max(len(values), 1)}


def _solve(t: Trajectory) -> tuple[float, float, float]:
    """Solve-P/R/F1 of a trajectory: the rubric's own (an environment that matches calls its way), else FTRL's
    matching of tool names and arguments."""
    from toolrl.rewards.ftrl import solve_scores, subproblem_counts

    if "solve_f1" in t.rewards:
        return t.rewards.get("solve_p", 0.0), t.rewards.get("solve_r", 0.0), t.rewards["solve_f1"]
    return solve_scores(*subproblem_counts(t, t.task))


def _category(group: Sequence[Trajectory], success: str) -> dict[str, float]:
    rate = _rate([t.rewards.get(success, 0.0) for t in group])
    scored = [_solve(t)[2] for t in group if t.task.meta.get("subproblems")]
    return {**rate, "solve_f1": sum(scored) / len(scored)} if scored else rate


def breakdown(trajs: Sequence[Trajectory], success: str | None) -> dict[str, Any]:
    """What the tasks allow beyond the means: `by_category` (tasks' meta["category"]), `by_request` (the k-th
    request of multi-turn tasks, from the steps' info["solved"]) and `by_kind` (info["kind"]), and `solve`
    (Solve-P/R/F1, means over tasks with meta["subproblems"])."""
    report: dict[str, Any] = {}
    if success is not None:
        categories = by_category(trajs)
        if categories:
            report["by_category"] = {name: _category(group, success) for name, group in sorted(categories.items())}
        environments = Counter(str(t.task.meta["env"]) for t in trajs if "env" in t.task.meta)
        if environments:  # a mix: each environment's success
            report["by_env"] = {key: _category([t for t in trajs if t.task.meta.get("env") == key], success)
                                for key in sorted(environments)}  # fmt: skip
    requests: dict[str, list[float]] = defaultdict(list)
    kinds: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        answered = {info["request"]: info for info in t.infos if "solved" in info and "request" in info}
        for k in range(len(t.task.meta.get("requests", answered))):
            info = answered.get(k, {})  # a request the trajectory never got to counts as not solved
            requests[str(k + 1)].append(float(info.get("solved", False)))
            kind = info.get("kind") or (t.task.meta.get("kinds") or [None] * (k + 1))[k]
            if kind is not None:
                kinds[str(kind)].append(float(info.get("solved", False)))
    if requests:
        report["by_request"] = {k: _rate(v) for k, v in sorted(requests.items(), key=lambda kv: int(kv[0]))}
        report["by_kind"] = {k: _rate(v) for k, v in sorted(kinds.items())}
    scored = [_solve(t) for t in trajs if t.task.meta.get("subproblems")]
    if scored:
        report["solve"] = {
            name: sum(s[i] for s in scored) / len(scored) for i, name in enumerate(("precision", "recall", "f1"))
        }
    return report
