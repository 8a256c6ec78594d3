"""Evaluation: run a split through the model and its tools, and summarise success, tool calls and turns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from toolrl.envs.base import Task
from toolrl.rollout.loop import STOP_REASONS, Rollout
from toolrl.rollout.trajectory import Trajectory


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
    }
    if success is not None:
        stats = {"success": sum(t.rewards.get(success, 0.0) for t in trajs) / n, **stats}
    for name in trajs[0].rewards if trajs else []:
        stats[f"reward/{name}"] = sum(t.rewards[name] for t in trajs) / n
    reasons = Counter(t.stop_reason for t in trajs)
    for reason in (*STOP_REASONS, *(r for r in reasons if r not in STOP_REASONS)):
        stats[f"stop/{reason}"] = reasons[reason] / n  # every reason, so each step has the same columns
    return stats


def evaluate(rollout: Rollout, tasks: Sequence[Task], batch_size: int, seed: int | None = None) -> dict[str, float]:
    """Success and the other summaries over `tasks`; with `seed`, task i samples with its own seed (the same
    draws whatever the batch size or timing)."""
    trajs: list[Trajectory] = []
    for start in range(0, len(tasks), batch_size):
        trajs += rollout.run(tasks[start : start + batch_size], None if seed is None else seed + start)
    return summarize(trajs, rollout.env.rubric.success)
