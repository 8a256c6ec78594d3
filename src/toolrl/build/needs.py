"""What a built environment's references need of a rollout: recorded by deploy (`deploy.json` `needs`) and taken
by the `built` environment as its rollout defaults, so that no reference is cut by a limit (toolrl env check)."""

from __future__ import annotations

import json

from toolrl.build.artifacts import BuiltTask, rounds

CHARS_PER_TOKEN = 2.5
"""What the limits below assume of a tokenizer: fewer characters per token than any common one on JSON and
names (SmolLM2's: 3.2 on these calls), so a reference is never cut."""


def _tokens(chars: int) -> int:
    return -(-int(chars / CHARS_PER_TOKEN + 16) // 16) * 16


def task_needs(task: BuiltTask) -> dict[str, int]:
    """What the task's reference needs: its turns (a round of calls each, then the answer; one request at a time
    for a multi-turn task), its largest round of calls, the tokens of its largest turn, of its largest tool
    result and of its whole response (its calls rendered as JSON, CHARS_PER_TOKEN)."""
    calls = [len(json.dumps(c, ensure_ascii=False)) + 32 for c in task.calls]  # + the call syntax's tags
    results = [len(s.answer) + 8 for s in task.subproblems]
    answers = [*task.answers, *(a for request in task.request_answers for a in request)]
    reply = max((len(a) for a in answers), default=0) + 32
    if task.requests:  # one sub-problem per request: a call turn and a reply turn each
        groups, turns = [[i] for i in range(len(task.subproblems))], 2 * len(task.subproblems)
    else:
        groups = rounds(task)
        turns = len(groups) + 1
    widest = max((sum(calls[i] for i in group) for group in groups), default=0)
    return {
        "max_turns": turns,
        "max_calls_per_turn": max((len(g) for g in groups), default=1),
        "max_new_tokens": _tokens(max(widest, reply)),
        "max_observation_tokens": _tokens(max(results, default=0)),
        "max_response_tokens": _tokens(sum(calls) + reply * max(1, len(task.requests)) + 16 * turns)
        + _tokens(sum(results)),
    }


def rollout_needs(tasks: list[BuiltTask]) -> dict[str, int]:
    """The largest of each need over the tasks: the built environment's rollout defaults (no reference is cut)."""
    needs: dict[str, int] = {}
    for task in tasks:
        for key, value in task_needs(task).items():
            needs[key] = max(needs.get(key, 1), value)
    return needs
