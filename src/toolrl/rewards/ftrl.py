"""FTRL's verifiable reward (arXiv 2508.08791): R = 2q/(p+1), balancing tool-call precision and completion.

p: tool calls made; q: sub-problems solved by them; t: sub-problems left unsolved. An empty final reply scores
-0.5, a format error -0.3; otherwise R = 2q/(p+1) (0 when no call was made) plus 1/(t+1) when the final answer
is correct. Solve-P = q/p, Solve-R = q/n (n sub-problems) and Solve-F1 = their harmonic mean are the metrics.

A task lists its sub-problems in `meta["subproblems"]`, each `{"name": tool, "arguments": {...}}` and
optionally `"result"`: a call solves one when its tool and arguments match (or, with `result`, when it
returned that result, whatever the arguments). Each sub-problem is solved at most once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from toolrl.rewards.rubric import Criterion

EMPTY_PENALTY = -0.5
FORMAT_PENALTY = -0.3


def ftrl_reward(p: int, q: int, t: int, correct: bool, empty: bool = False, format_error: bool = False) -> float:
    if empty:
        return EMPTY_PENALTY
    if format_error:
        return FORMAT_PENALTY
    reward = 2 * q / (p + 1) if p > 0 else 0.0
    return reward + (1 / (t + 1) if correct else 0.0)


def solve_scores(p: int, q: int, n: int) -> tuple[float, float, float]:
    """(Solve-P, Solve-R, Solve-F1) for p calls solving q of n sub-problems."""
    precision = q / p if p else 0.0
    recall = q / n if n else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def _same(a: Any, b: Any) -> bool:
    return str(a).strip() == str(b).strip()


def solves(result, subproblem: dict[str, Any]) -> bool:
    if result.error or result.call is None or result.call.name != subproblem.get("name"):
        return False
    if "result" in subproblem:
        return _same(result.content, subproblem["result"])
    expected = subproblem.get("arguments", {})
    return set(result.call.arguments) == set(expected) and all(
        _same(result.call.arguments[k], v) for k, v in expected.items()
    )


def solved_count(results: Sequence[Any], subproblems: Sequence[dict[str, Any]]) -> int:
    """How many sub-problems the calls solved, each at most once (a greedy matching in call order)."""
    open_ = list(subproblems)
    q = 0
    for result in results:
        for i, sub in enumerate(open_):
            if solves(result, sub):
                del open_[i]
                q += 1
                break
    return q


def subproblem_counts(trajectory, task) -> tuple[int, int, int]:
    """(calls p, sub-problems solved q, sub-problems n) of a trajectory on a task that carries sub-problems."""
    subproblems = task.meta.get("subproblems") or []
    p = trajectory.num_tool_calls
    q = solved_count(trajectory.results, subproblems)
    return p, q, len(subproblems)


Counts = Callable[[Any, Any], tuple[int, int, int]]


def ftrl_criteria(
    correct: Callable[[Any, Any], float], weight: float = 1.0, counts: Counts = subproblem_counts
) -> list[Criterion]:
    """The FTRL reward as the trained criterion and Solve-P/R/F1 as logged metrics (weight 0). `counts` gives
    (p, q, n) of a trajectory; an environment with its own matching of calls to sub-problems passes its own."""

    def reward(trajectory, task) -> float:
        p, q, n = counts(trajectory, task)
        return ftrl_reward(
            p,
            q,
            n - q,
            bool(correct(trajectory, task)),
            empty=not trajectory.final_text.strip(),
            format_error=trajectory.num_format_errors > 0,
        )

    def metric(index: int):
        return lambda trajectory, task: solve_scores(*counts(trajectory, task))[index]

    return [
        Criterion("ftrl", reward, weight),
        Criterion("solve_p", metric(0), 0.0),
        Criterion("solve_r", metric(1), 0.0),
        Criterion("solve_f1", metric(2), 0.0),
    ]
