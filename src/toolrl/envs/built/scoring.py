"""How a built environment scores a trajectory: sub-problem accounting (a call solves a sub-problem when it went
through and its arguments match the expected ones), FTRL's counts, and success that rests on evidence (the right
answer and every sub-problem solved by the trajectory's own calls)."""

from __future__ import annotations

import re
from typing import Any

from toolrl.build.answers import contains
from toolrl.envs.base import Task, final_answer
from toolrl.envs.built.notes import notes
from toolrl.envs.reference import ReferenceRequest
from toolrl.tools.call import ToolCall, ToolResult


def _norm(value: Any) -> str:
    text = " ".join(str(value).split()).lower()
    return re.sub(r"(?<=\d),(?=\d{3})", "", text)


def arguments_match(given: Any, expected: Any) -> bool:
    """The call's value answers the expected one: equal after normalising, a list containing it, an object
    whose keys match recursively."""
    if isinstance(expected, dict):
        return isinstance(given, dict) and all(k in given and arguments_match(given[k], v) for k, v in expected.items())
    if isinstance(expected, list):
        return isinstance(given, list) and all(any(arguments_match(g, e) for g in given) for e in expected)
    return not isinstance(given, dict | list) and _norm(given) == _norm(expected)


def solved_subproblems(results: list[ToolResult], calls: list[dict[str, Any]]) -> int:
    """Sub-problems solved, each at most once; one call may solve several (a list argument)."""
    open_ = list(range(len(calls)))
    for result in results:
        if result.error or result.call is None:
            continue
        for i in list(open_):
            if calls[i]["name"] == result.call.name and arguments_match(result.call.arguments, calls[i]["arguments"]):
                open_.remove(i)
    return len(calls) - len(open_)


def _real(trajectory) -> list[ToolResult]:
    injected = getattr(trajectory.episode, "injected", set())
    return [r for r in trajectory.results if id(r) not in injected]


def counts(trajectory, task: Task) -> tuple[int, int, int]:
    """(p calls the model made, q sub-problems solved, n sub-problems); injected faults are not the model's."""
    results = _real(trajectory)
    calls = task.meta["subproblems"]
    return len(results), solved_subproblems(results, calls), len(calls)


def contains_all(text: str | None, answers: list[str]) -> bool:
    """The text states every answer (answers.contains: numbers in any form, lists in any order)."""
    return text is not None and all(contains(text, a) for a in answers)


def answer_correct(trajectory, task: Task) -> float:
    """Multi-turn: every request answered right; else the final <answer> holds every answer."""
    if task.meta.get("requests"):
        solved = getattr(trajectory.episode, "solved", [])
        return float(len(solved) == len(task.meta["requests"]) and all(solved))
    return float(contains_all(final_answer(trajectory.final_text), task.meta["answers"]))


def evidence(trajectory, task: Task) -> float:
    """The share of the task's sub-problems its own calls solved with an ok result (injected faults aside)."""
    _, q, n = counts(trajectory, task)
    return q / n if n else 1.0


def correct(trajectory, task: Task) -> float:
    """A success: the answer is right (answer_correct) and it rests on evidence: every sub-problem the reference
    needs was solved by a call of the trajectory's own with an ok result. An answer stated without the calls (a
    guess, a memorised fact, half the calls) is not one; the `answer` and `evidence` components say which."""
    return float(answer_correct(trajectory, task) == 1.0 and evidence(trajectory, task) == 1.0)


def reference_requests(task: Task, style: str | None = None) -> list[ReferenceRequest]:
    """What a perfect model does: each sub-problem's call, then the answer; per request for multi-turn tasks.
    With a note style (`env.options.countdown`), each turn opens with its note (notes.NOTE_STYLES)."""
    calls = [ToolCall(c["name"], c["arguments"]) for c in task.meta["subproblems"]]
    if task.meta.get("requests"):
        answers = task.meta["request_answers"]
        return [
            ReferenceRequest(((call,),), f"<answer>{'; '.join(a)}</answer>", notes(style, [[(f, 0)]]) if style else ())
            for call, a, f in zip(calls, answers, task.meta["facts"], strict=True)
        ]
    rounds = task.meta.get("rounds") or [list(range(len(calls)))]
    reply = f"<answer>{'; '.join(task.meta['answers'])}</answer>"
    opened = notes(style, task.meta["plan"]) if style else ()
    return [ReferenceRequest(tuple(tuple(calls[i] for i in r) for r in rounds), reply, opened)]


def injected_faults(trajectory, task: Task) -> float:
    return float(len(getattr(trajectory.episode, "injected", ())))
