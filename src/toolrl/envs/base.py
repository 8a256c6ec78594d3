"""The environment interface, Gymnasium-like, and the registry that builds one by name.

An environment owns tasks (with a way to check success), the tools the model may call and the rubric that
scores a trajectory. `reset(task)` starts an episode, one per trajectory: the prompt messages and the tools,
which may be bound to state of that trajectory alone (a fresh sqlite database, a sandbox directory).
`await episode.step(calls, executor)` runs the parsed calls of a turn and returns the observations, a
per-step (process) reward, whether the episode is done, and info. `episode.close()` frees its state.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolrl.registry import Registry
from toolrl.rewards.rubric import Rubric
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.function import Tool

if TYPE_CHECKING:
    from toolrl.tools.executor import ToolExecutor

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Task:
    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)
    """Anything else the task carries: all gold answers, gold SQL, sub-problems, the source record's fields."""


def final_answer(text: str) -> str | None:
    """The content of the last <answer>...</answer> in `text`, stripped, or None."""
    found = ANSWER.findall(text)
    return found[-1].strip() if found else None


def tool_call_example(question: str, tool: str, arguments: dict[str, Any], result: str, answer: str):
    """An in-context exchange: the question, a Hermes-style call of `tool`, its result, the <answer>."""
    call = json.dumps({"name": tool, "arguments": arguments})
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": f"<answer>{answer}</answer>"},
    ]


@dataclass
class StepResult:
    observations: list[ToolResult]
    """One per call, in order."""
    reward: float = 0.0
    """Process reward of this step; the rubric's `process` criterion sums them over the trajectory."""
    done: bool = False
    """The environment ends the episode (stop reason env_done) after these observations."""
    info: dict[str, Any] = field(default_factory=dict)


class Episode:
    """One trajectory in an environment. `tools`, when given, replace the environment's tools of the same names
    for this trajectory only (bound to its own state); the executor's policies still apply by name."""

    def __init__(self, task: Task, messages: list[dict[str, str]], tools: Sequence[Tool] | None = None):
        self.task = task
        self.messages = messages
        self.tools = {tool.name: tool for tool in tools} if tools is not None else None

    async def step(self, calls: Sequence[ToolCall], executor: ToolExecutor, sequential: bool = False) -> StepResult:
        if sequential:
            results = [await executor.invoke(call, self.tools) for call in calls]
        else:
            results = await executor.invoke_all(calls, self.tools)
        return StepResult(results, self.process_reward(results))

    def process_reward(self, results: Sequence[ToolResult]) -> float:
        """Reward of one step from its results; 0 unless an environment says otherwise."""
        return 0.0

    def close(self) -> None:
        """Free per-trajectory state (databases, directories)."""


class Environment(ABC):
    """Tasks with a checkable outcome, the tools the model may call, and the rubric that scores a trajectory."""

    name: str
    rubric: Rubric
    show_tool_schemas: bool = True
    """Put the tools' JSON schemas into the prompt; False for prompt formats that describe their own tags
    (Search-R1's `<search>`)."""

    @abstractmethod
    def tools(self) -> list[Tool]:
        """The tools as the prompt shows them (and as shared by episodes that bind no state of their own)."""

    @abstractmethod
    def tasks(self, split: str) -> list[Task]: ...

    @abstractmethod
    def messages(self, task: Task) -> list[dict[str, str]]:
        """Prompt messages for a task (system, in-context example, user question)."""

    def reset(self, task: Task) -> Episode:
        """Start one trajectory on `task`; environments with per-trajectory state override this."""
        return Episode(task, self.messages(task))


ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment", "env.name")
register_env = ENVIRONMENTS.register


def make_env(config, model_name: str | None = None) -> Environment:
    """The environment `config` (an EnvConfig) names, its rubric adjusted by `reward_weights` and joined by
    the model judge when `judge` is set (a local judge defaults to `model_name`, the run's model)."""
    env = ENVIRONMENTS.lookup(config.name)(config)
    weights = getattr(config, "reward_weights", None) or {}
    judge = getattr(config, "judge", None)
    if judge is not None or weights:
        from toolrl.rewards.judge import make_judge
        from toolrl.rewards.rubric import Criterion

        extra = [Criterion("judge", make_judge(judge, model_name or ""), judge.weight)] if judge else []
        env.rubric = env.rubric.with_weights(weights, extra)
    return env
