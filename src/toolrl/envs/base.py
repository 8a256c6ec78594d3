"""The environment interface (tasks, prompt, tools, reward) and the registry that builds one by name."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolrl.registry import Registry
from toolrl.rewards.rubric import Rubric
from toolrl.tools.function import Tool

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@dataclass(frozen=True)
class Task:
    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


def final_answer(text: str) -> str | None:
    """The content of the last <answer>...</answer> in `text`, stripped, or None."""
    found = ANSWER.findall(text)
    return found[-1].strip() if found else None


class Environment(ABC):
    """Tasks with a checkable outcome, the tools the model may call, and the rubric that scores a trajectory."""

    name: str
    rubric: Rubric

    @abstractmethod
    def tools(self) -> list[Tool]: ...

    @abstractmethod
    def tasks(self, split: str) -> list[Task]: ...

    @abstractmethod
    def messages(self, task: Task) -> list[dict[str, str]]:
        """Prompt messages for a task (system, in-context example, user question)."""


ENVIRONMENTS: Registry[Callable[..., Environment]] = Registry("environment", "env.name")
register_env = ENVIRONMENTS.register


def make_env(config) -> Environment:
    return ENVIRONMENTS.lookup(config.name)(config)
