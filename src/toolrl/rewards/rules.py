"""Rule rewards every environment can use: answer format, correctness by exact match, efficiency; and the
criteria every environment logs (`common_criteria`)."""

from __future__ import annotations

from toolrl.rewards.rubric import Criterion, register_criterion
from toolrl.rewards.text import exact_match, final_answer, gold_answers


def answer_format(trajectory, task) -> float:
    """Well-formed: the last turn gives an <answer> and no tool call of the trajectory was malformed."""
    return float(final_answer(trajectory.final_text) is not None and trajectory.num_format_errors == 0)


@register_criterion("exact_match")
def exact_match_answer(trajectory, task) -> float:
    """The final <answer> equals a gold answer after SQuAD normalisation."""
    return exact_match(final_answer(trajectory.final_text), gold_answers(task))


def tool_calls(trajectory, task) -> float:
    return float(trajectory.num_tool_calls)


def tool_errors(trajectory, task) -> float:
    """Failed calls the model can answer for: infrastructure faults (timeouts, crashes) are not counted."""
    return float(trajectory.num_tool_errors - trajectory.num_tool_faults)


@register_criterion("efficiency")
def efficiency(trajectory, task) -> float:
    """1 for at most one tool call, then 1/(number of calls): fewer calls for the same outcome score higher."""
    return 1.0 / max(trajectory.num_tool_calls, 1)


def common_criteria(format_weight: float = 0.1) -> list[Criterion]:
    """The criteria every environment has: `format` (weighted), and `tool_calls` and `tool_errors` (logged)."""
    return [
        Criterion("format", answer_format, format_weight),
        Criterion("tool_calls", tool_calls, 0.0),
        Criterion("tool_errors", tool_errors, 0.0),
    ]
