"""`toolrl env new NAME`: a minimal environment package a user edits, with its own passing test and a run config.

The package registers its environment on import; `env.module: NAME` in a config (or `--set env.module=NAME`)
makes `toolrl train` and `toolrl eval` find it. Everything in it is meant to be replaced: the tasks, the tool,
the prompt and the reward.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from toolrl.errors import ConfigError

INIT = '''"""The {name} environment for toolrl; importing this package registers it (env.module: {name})."""

from {name}.env import {cls}

__all__ = ["{cls}"]
'''

ENV = '''"""{cls}: questions about words, answered with a letter-counting tool. Replace the tasks, the tool, the
prompt and the rubric with your own; keep the shape."""

from __future__ import annotations

import random

from pydantic import Field

from toolrl.envs import Environment, EnvOptions, ReferenceRequest, Task, register_env
from toolrl.envs.base import tool_call_example
from toolrl.envs.tasks import TaskSplits
from toolrl.rewards import Criterion, Rubric
from toolrl.rewards.rules import common_criteria
from toolrl.rewards.text import final_answer
from toolrl.tools import ToolCall, tool_from_function

WORDS = ["apple", "river", "mountain", "keyboard", "window", "garden", "pencil", "harbour", "lantern", "meadow"]
SYSTEM = "Use the count_letters tool, then give the final answer as <answer>NUMBER</answer>."


def count_letters(word: str) -> int:
    """Count the letters of a word.

    Args:
        word: The word.
    """
    return sum(ch.isalpha() for ch in word)


def correct(trajectory, task: Task) -> float:
    """1 when the final <answer> is the task's answer."""
    return float(final_answer(trajectory.final_text) == task.answer)


class {cls}Options(EnvOptions):
    """This environment's own settings, given as env.options in a run config."""

    num_test: int = Field(4, ge=1)
    """Words held out for evaluation."""


@register_env("{name}")
class {cls}(Environment):
    name = "{name}"
    Options = {cls}Options

    def __init__(self, config, options: {cls}Options):
        super().__init__(config, options)
        words = list(WORDS)
        random.Random(config.seed).shuffle(words)
        tasks = [
            Task(f"{name}-{{i}}", f"How many letters are in the word {{w}}?", str(len(w)), {{"word": w}})
            for i, w in enumerate(words)
        ]
        # its own splits, each replaced by env.train_file / env.test_file when a run gives one
        self.splits = TaskSplits(config, {{"test": tasks[: options.num_test], "train": tasks[options.num_test :]}})
        self.rubric = Rubric([Criterion("correct", correct, 1.0), *common_criteria()], success="correct")

    def tools(self):
        return [tool_from_function(count_letters, idempotent=True, isolation="thread")]

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def reference(self, task: Task) -> list[ReferenceRequest]:
        """What a perfect agent does (toolrl env check): count the letters, then answer."""
        count = ToolCall("count_letters", {{"word": task.meta["word"]}})
        return [ReferenceRequest.of([count], f"<answer>{{task.answer}}</answer>")]

    def messages(self, task: Task) -> list[dict[str, str]]:
        question = "How many letters are in the word cat?"
        example = tool_call_example(question, "count_letters", {{"word": "cat"}}, "3", "3", self.syntax)
        return [{{"role": "system", "content": SYSTEM}}, *example, {{"role": "user", "content": task.question}}]
'''

TEST = '''"""The {name} environment's own tests: `pytest {name}`."""

import asyncio

from toolrl.config import resolve_config
from toolrl.envs import make_env
from toolrl.rollout.trajectory import Trajectory
from toolrl.tools import ToolCall, ToolExecutor


def config(**options):
    overrides = ["env.name={name}", "env.module={name}", *(f"env.options.{{k}}={{v}}" for k, v in options.items())]
    return resolve_config(overrides=overrides)


def test_tasks_tools_and_options():
    env = make_env(config(num_test=3).env)
    assert len(env.tasks("test")) == 3 and len(env.tasks("train")) == 7
    assert [t.name for t in env.tools()] == ["count_letters"]
    assert env.messages(env.tasks("test")[0])[-1]["role"] == "user"


def test_the_tool_runs_and_the_reward_checks_the_answer():
    env = make_env(config().env)
    task = env.tasks("test")[0]
    word = task.question.rsplit(" ", 1)[1].rstrip("?")
    with env.reset(task) as episode:
        step = asyncio.run(episode.step([ToolCall("count_letters", {{"word": word}})], ToolExecutor(env.tools())))
    assert step.observations[0].content == task.answer
    right, wrong = Trajectory.start(task, [1]), Trajectory.start(task, [1])
    right.add_model_turn([2], [0.0], f"<answer>{{task.answer}}</answer>")
    wrong.add_model_turn([2], [0.0], "<answer>0</answer>")
    asyncio.run(env.rubric.score_all([right, wrong]))
    assert (right.rewards["correct"], wrong.rewards["correct"]) == (1.0, 0.0)
'''

CONFIG = """# A run on the {name} environment: `toolrl train {name}/config.yaml` from the folder that holds {name}/.
run_name: {name}
env:
  name: {name}
  module: {name}
  options:
    num_test: 4
rollout:
  max_turns: 2
train:
  steps: 5
  prompts_per_step: 2
  group_size: 4
eval:
  num_tasks: 4
"""


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Env"


def write_package(name: str, parent: Path) -> Path:
    """Write `parent/name/` (package, environment, test, run config); refuse to overwrite anything."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(f"env new: {name!r} is not a Python package name; use lower case, digits and _")
    folder = parent / name
    if folder.exists():
        raise ConfigError(f"env new: {folder} already exists; choose another name or remove it")
    cls = class_name(name)
    folder.mkdir(parents=True)
    files = {"__init__.py": INIT, "env.py": ENV, "test_env.py": TEST, "config.yaml": CONFIG}
    for filename, template in files.items():
        (folder / filename).write_text(template.format(name=name, cls=cls))
    return folder
