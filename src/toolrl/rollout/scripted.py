"""Policies played without a model, turn by turn: the checks an environment must pass.

`reference` plays the environment's reference (`Environment.reference(task)`, envs/reference.py): each round
of calls written in the run's call syntax, then each request's reply; `idle` makes no call and replies
"Done." to everything. A correct environment scores about 100% under the first and about 0 under the second
(`toolrl env check`); `toolrl eval --policy NAME` plays one. `register_policy(name)` adds one from outside:
a function `(env, task) -> turns`, each turn a tuple of calls, a `Said` (text, then calls) or a reply
text, or None when the policy cannot
play that task (the task is left out and counted).

The engine knows each sequence's task from `Engine.begin` and keeps its own count of the turns played, so
two tasks with the same prompt never mix and a request without calls is a reply alone.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolrl.envs.reference import REPLY, Said, Turn
from toolrl.errors import ConfigError
from toolrl.registry import Registry
from toolrl.rollout.engine import Engine, Sampled

if TYPE_CHECKING:
    from toolrl.chat import ChatFormat
    from toolrl.context.base import ContextStrategy
    from toolrl.envs.base import Environment, Task
    from toolrl.parsers import CallSyntax
    from toolrl.rollout.sampling import SamplingParams

Script = Callable[["Environment", "Task"], "Sequence[Turn] | None"]

POLICIES: Registry[Script] = Registry("policy", "--policy")
"""Name -> script of a policy played without a model; `model` (the configured model) is not one of them."""
register_policy = POLICIES.register
MODEL = "model"
"""The policy of a run's model: every other name is a scripted one."""


@register_policy("reference")
def reference_policy(env: Environment, task: Task) -> list[Turn] | None:
    """The environment's reference, request by request: its rounds of calls, then its reply."""
    requests = env.reference(task)
    return None if requests is None else [turn for request in requests for turn in request.turns()]


@register_policy("idle")
def idle_policy(env: Environment, task: Task) -> list[Turn]:
    """No call at all: every turn is the reply "Done."."""
    return []


def playable(env: Environment, tasks: Sequence[Task], policy: str) -> tuple[list[Task], list[Task]]:
    """(the tasks `policy` can play, those it cannot); every task for the model's own policy."""
    if policy == MODEL:
        return list(tasks), []
    script = POLICIES.lookup(policy)
    played, left = [], []
    for task in tasks:
        (left if script(env, task) is None else played).append(task)
    return played, left


SUMMARY = "Summary: I am working through the task; my next step follows from the last result."
"""A scripted policy's summary where the environment writes none (Environment.reference_summary)."""


@dataclass
class _Play:
    task: Task
    turns: Sequence[Turn]
    played: int = 0


class ScriptedEngine(Engine):
    """Writes a scripted policy's turns as token ids: turn k of a sequence is its script's k-th turn (then
    "Done." for every turn past the script). Calls that do not fit a turn's token budget
    (rollout.max_new_tokens) are split over as many turns as they need; a single call or reply past it is
    cut, as a model's turn would be."""

    def __init__(
        self, chat: ChatFormat, syntax: CallSyntax, env: Environment, script: Script, context: ContextStrategy | None
    ):
        self.chat, self.syntax, self.env, self.script, self.context = chat, syntax, env, script, context
        self.plays: dict[Hashable, _Play] = {}

    def begin(self, seq: Hashable, task: Task) -> None:
        turns = self.script(self.env, task)
        if turns is None:
            raise ConfigError(f"env {self.env.name}: task {task.id} has no reference to play; leave it out")
        turns = list(turns) if self.context is None else self.context.script(list(turns), self.env, task)
        self.plays[seq] = _Play(task, turns)

    def _ids(self, turn: str | Said) -> list[int]:
        text = turn if isinstance(turn, str) else turn.text + self.syntax.render(list(turn.calls))
        return self.chat.encode(text) + [self.chat.end_of_turn_id]

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        play = self.plays.get(seq)
        if play is None:
            raise RuntimeError("a scripted policy was asked for a turn of a sequence that never began")
        if params.purpose == "summary":  # a context strategy's request: no turn of the script
            text = self.env.reference_summary(play.task, play.played) or SUMMARY
            ids = self._ids(text)[: params.max_new_tokens]
            return Sampled(ids, [0.0] * len(ids), ended=ids[-1:] == [self.chat.end_of_turn_id])
        turn: Turn = play.turns[play.played] if play.played < len(play.turns) else REPLY
        if isinstance(turn, tuple):  # calls alone: calls after no text
            turn = Said("", turn)
        ids, budget = self._ids(turn), params.max_new_tokens
        if len(ids) > budget and isinstance(turn, Said) and len(turn.calls) > 1:
            # calls that do not fit one turn's budget go in as many turns as they need, in order (the text
            # before them opens the first)
            calls = turn.calls
            fits = max((k for k in range(1, len(calls)) if len(self._ids(Said(turn.text, calls[:k]))) <= budget),
                       default=1)  # fmt: skip
            first = Said(turn.text, calls[:fits])
            play.turns = [*play.turns[: play.played], first, calls[fits:], *play.turns[play.played + 1 :]]
            ids = self._ids(first)
        play.played += 1
        if len(ids) > budget:  # one call or a reply longer than the budget is cut, as a model's would be
            return Sampled(ids[:budget], [0.0] * budget, ended=False)
        return Sampled(ids, [0.0] * len(ids), ended=True)

    def release(self, seq: Hashable) -> None:
        self.plays.pop(seq, None)


def scripted_engine(
    policy: str, chat: ChatFormat, syntax: CallSyntax, env: Environment, context: ContextStrategy | None = None
) -> ScriptedEngine:
    """The engine that plays `policy` (a name in POLICIES), under the run's context strategy (`context`: how the
    script uses the strategy's tools; None: as written)."""
    return ScriptedEngine(chat, syntax, env, POLICIES.lookup(policy), context)
