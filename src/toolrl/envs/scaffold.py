"""`toolrl env new NAME`: a minimal environment package a user edits, with its own passing test and a run config.

The package registers its environment on import; `env.module: NAME` in a config (or `--set env.module=NAME`)
makes `toolrl train` and `toolrl eval` find it. Everything in it is meant to be replaced: the tasks, the tool,
the prompt and the reward.
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import sys
from pathlib import Path

from toolrl.errors import ConfigError
from toolrl.text import clip_path

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
    """1 when the final <answer> is the task's answer, else 0: the task's success."""
    return float(final_answer(trajectory.final_text) == task.answer)


def closeness(trajectory, task: Task) -> float:
    """Between 0 and 1: 1 for the answer, less the further off it is (0 for no number)."""
    answer = final_answer(trajectory.final_text) or ""
    if not answer.strip().isdigit():
        return 0.0
    return max(0.0, 1.0 - abs(int(answer) - int(task.answer)) / int(task.answer))


class {cls}Options(EnvOptions):
    """This environment's own settings, given as env.options in a run config."""

    num_test: int = Field(4, ge=1)
    """Words held out for evaluation."""


@register_env("{name}")
class {cls}(Environment):
    name = "{name}"
    Options = {cls}Options
    # The rollout limits these tasks need, any `rollout.*` key: each is used where a run's config does not set it
    # (`toolrl config show` prints the result; `toolrl env check` says where each value came from).
    rollout_defaults = {{"max_turns": 3, "max_new_tokens": 64}}

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
        # The reward is the weighted sum of the criteria; each is logged unweighted as reward/NAME. A score between
        # 0 and 1 (partial credit, a library's own scorer) is paid as a criterion of its own; success is 1 or 0 and
        # names what counts as solved, at weight 0 here so that it is reported (`success`) without being paid twice.
        # common_criteria(format_weight=0.1): `format` (0.1: an <answer> in the last turn and no malformed call),
        # `tool_calls` and `tool_errors` (weight 0: logged only). `env.reward_weights` re-weights any of them.
        self.rubric = Rubric(
            [Criterion("closeness", closeness, 1.0), Criterion("correct", correct, 0.0), *common_criteria()],
            success="correct",
        )

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

TEST = '''"""The {name} environment's own tests: `python -m {name}.test_env` (or `pytest {name}`)."""

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
    right, near, wrong = (Trajectory.start(task, [1]) for _ in range(3))
    right.add_model_turn([2], [0.0], f"<answer>{{task.answer}}</answer>")
    near.add_model_turn([2], [0.0], f"<answer>{{int(task.answer) + 1}}</answer>")
    wrong.add_model_turn([2], [0.0], "<answer>none</answer>")
    asyncio.run(env.rubric.score_all([right, near, wrong]))
    assert [t.rewards["correct"] for t in (right, near, wrong)] == [1.0, 0.0, 0.0]  # success: 1 or 0
    assert right.rewards["closeness"] == 1.0 and 0.0 < near.rewards["closeness"] < 1.0  # partial credit, paid
    assert wrong.rewards["closeness"] == 0.0


if __name__ == "__main__":  # without pytest: python -m {name}.test_env
    for test in (test_tasks_tools_and_options, test_the_tool_runs_and_the_reward_checks_the_answer):
        test()
        print("passed:", test.__name__)
'''

CONFIG = """# A run on the {name} environment: `toolrl train {name}/config.yaml` from the folder that holds {name}/.
run_name: {name}
env:
  name: {name}
  module: {name}
  options:
    num_test: 4
train:
  steps: 5
  prompts_per_step: 2
  group_size: 4
eval:
  num_tasks: 4
"""


def installed_module(name: str) -> str | None:
    """Where the top-level module `name` is found already (the standard library, an installed package), or None;
    found without importing it. A user's first environment had been named after the very library it ports."""
    if name in sys.stdlib_module_names:
        return "the standard library"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return clip_path(spec.origin or next(iter(spec.submodule_search_locations or []), name))


def class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Env"


def write_package(name: str, parent: Path) -> Path:
    """Write `parent/name/` (package, environment, test, run config); refuse to overwrite anything."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ConfigError(f"env new: {name!r} is not a Python package name; use lower case, digits and _")
    folder = parent / name
    if folder.exists():
        raise ConfigError(f"env new: {folder} already exists; choose another name or remove it")
    shadowed = installed_module(name)
    if shadowed:
        raise ConfigError(f"env new: {name!r} is the name of an installed module ({shadowed}); a package of that name "
                          f"would hide it or be hidden by it: choose another, e.g. {name}_env")  # fmt: skip
    cls = class_name(name)
    folder.mkdir(parents=True)
    files = {"__init__.py": INIT, "env.py": ENV, "test_env.py": TEST, "config.yaml": CONFIG}
    for filename, template in files.items():
        (folder / filename).write_text(template.format(name=name, cls=cls))
    return folder
