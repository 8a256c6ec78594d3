"""The environment interface (tasks, prompt, tools, reward) and the registry that builds one by name."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolrl.errors import ConfigError
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


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}


def register_env(name: str):
    def add(factory):
        ENVIRONMENTS[name] = factory
        return factory

    return add


def make_env(config) -> Environment:
    try:
        factory = ENVIRONMENTS[config.name]
    except KeyError:
        known = ", ".join(sorted(ENVIRONMENTS))
        raise ConfigError(f"env.name: unknown environment {config.name!r}; known: {known}") from None
    return factory(config)
