"""Engines that play an environment's tasks without a model, for its checks and benchmarks: the reference engine
writes each request's reference calls (in the run's call syntax), then the reply, and must score 100%; the idle
engine only replies, and must score 0%. A task's script is `script(task)`: per request, (calls, reply); by
default the `files` shape, `meta["reference"]` and a one-line reply."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from toolrl.envs.base import Task
from toolrl.rollout.engine import Engine, Sampled
from toolrl.rollout.sampling import SamplingParams
from toolrl.tools.call import ToolCall

REPLY = "Done."
Script = Callable[[Task], list[tuple[list[ToolCall], str]]]


def reference_script(task: Task) -> list[tuple[list[ToolCall], str]]:
    return [([ToolCall(c["name"], c["arguments"]) for c in calls], REPLY) for calls in task.meta["reference"]]


class ReferenceEngine(Engine):
    """Knows each task by its prompt ids; for request k of a task, first its reference calls, then a reply."""

    def __init__(self, rollout, tasks: Sequence[Task], idle: bool = False, script: Script = reference_script):
        self.chat, self.syntax, self.idle, self.script = rollout.chat, rollout.parser, idle, script
        self.tasks = {}
        for task in tasks:  # the prompt as the rollout makes it: with the tools this task's episode offers
            with rollout.env.reset(task) as episode:
                tools = episode.available(rollout.executor.tools)
                self.tasks[tuple(rollout.prompt_ids(task, episode.messages, tools))] = task
        self.progress: dict[Hashable, tuple[Task, int, bool]] = {}
        """seq -> (task, request, whether its calls were written)."""

    def _turn(self, text: str) -> Sampled:
        ids = self.chat.encode(text) + [self.chat.end_of_turn_id]
        return Sampled(ids, [0.0] * len(ids), ended=True)

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        if seq not in self.progress:
            self.progress[seq] = (self.tasks[tuple(tokens)], 0, False)
        task, request, called = self.progress[seq]
        calls, reply = self.script(task)[request]
        if self.idle or called:
            self.progress[seq] = (task, request + 1, False)
            return self._turn(REPLY if self.idle else reply)
        self.progress[seq] = (task, request, True)
        return self._turn(self.syntax.render(calls))

    def release(self, seq: Hashable) -> None:
        self.progress.pop(seq, None)
