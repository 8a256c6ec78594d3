"""The `mix` environment: several environments in one run, each step's prompts drawn by the environments' weights.

```yaml
env:                                   # a list is a mix (or name: mix, options: {environments: [...]})
  - {name: calculator, weight: 2}
  - {name: harbor, weight: 1, options: {tasks: [count-lines, fix-add]}}
  - {name: calculator, label: calc-hard, options: {max_operand: 10000}}   # the same environment twice: labels
```

Each member is an environment as `env` would name it (`options`, `train_file`, `test_file`, `module`,
`reward_weights`, `judge`) plus its `weight` (default 1) and `label` (default its name; metrics and task ids use
it). A task's id is `LABEL/ID` and its meta carries `env: LABEL`; the member plays it as its own (its prompt, its
tools only, its reference, its rubric). Training draws each prompt's environment by weight, then the next task of
that environment's own seeded shuffle (collect.TaskOrder; resumed exactly). Metrics add `env/LABEL/reward`,
`env/LABEL/success` and `env/LABEL/share` per step; evaluation reports success per environment (`by_env`).
A run has one call syntax: members whose prompts are written for different parsers are refused, as are agent
environments (they drive their own samples through the gateway).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolrl.envs.base import (
    Environment,
    EnvOptions,
    Episode,
    Task,
    environment_class,
    environment_options,
    make_env,
    register_env,
    start_episode,
)
from toolrl.errors import ConfigError
from toolrl.tools.function import Tool


class Member(BaseModel):
    """One environment of a mix: what `env` takes, with its weight and label."""

    model_config = ConfigDict(extra="forbid")
    name: str
    weight: float = Field(1.0, gt=0)
    label: str | None = None
    module: str | list[str] | None = None
    train_file: str | None = None
    test_file: str | None = None
    reward_weights: dict[str, float] = {}
    judge: dict[str, Any] | None = None
    options: dict[str, Any] = {}

    @property
    def key(self) -> str:
        return self.label or self.name

    def env_config(self, seed: int):
        from toolrl.config.schema import EnvConfig

        fields = self.model_dump(exclude={"weight", "label"}, exclude_none=True)
        return EnvConfig.model_validate({**fields, "seed": seed})


class MixOptions(EnvOptions):
    environments: list[Member] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct_labels(self) -> MixOptions:
        keys = [m.key for m in self.environments]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"two environments are labelled {twice[0]!r}: give each a label of its own")
        bad = [k for k in keys if not k or "/" in k or k.strip() != k]
        if bad:
            raise ValueError(f"label {bad[0]!r}: a label is a name without '/' or spaces around it")
        if any(m.name == "mix" for m in self.environments):
            raise ValueError("a mix's environments are environments, not mixes")
        return self


class MixRubric:
    """Each trajectory scored by its own environment's rubric (concurrently per environment); `success` is every
    member's success criterion, copied under the one name `success`."""

    success = "success"

    def __init__(self, env: MixEnv):
        self.env = env

    async def score_all(self, trajs: Sequence[Any]) -> None:
        groups: dict[str, list[Any]] = {}
        for traj in trajs:
            groups.setdefault(traj.task.meta["env"], []).append(traj)
        await asyncio.gather(*(self.env.members[key].rubric.score_all(group) for key, group in groups.items()))
        for key, group in groups.items():
            own = self.env.members[key].rubric.success
            for traj in group:
                traj.rewards["success"] = traj.rewards.get(own, 0.0) if own else 0.0

    def stats(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for key, member in self.env.members.items():
            for name, value in member.rubric.stats().items():
                counts[f"{key}/{name}"] = value
        return counts

    def with_weights(self, weights, extra=()):
        raise ConfigError("env.reward_weights / env.judge: give them per environment of the mix (each member's "
                          "reward_weights, judge)")  # fmt: skip


@register_env("mix")
class MixEnv(Environment):
    name = "mix"
    Options = MixOptions

    @classmethod
    def rollout_needs(cls, options: MixOptions) -> dict[str, Any]:
        """Each limit the largest any member needs (its rollout_defaults and rollout_needs), so that every member's
        reference fits the run's limits."""
        needs: dict[str, Any] = {}
        for member in options.environments:
            config = member.env_config(0)
            member_cls = environment_class(config)
            wanted = dict(getattr(member_cls, "rollout_defaults", {}))
            if getattr(member_cls, "rollout_needs", None) is not None:
                wanted.update(member_cls.rollout_needs(environment_options(config)))
            for key, value in wanted.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    needs[key] = max(value, needs.get(key, value))
        return needs

    def __init__(self, config, options: MixOptions):
        super().__init__(config, options)
        self.options: MixOptions = options
        self.draw_weights = {m.key: m.weight for m in options.environments}
        """Label -> weight: how training draws each prompt's environment (collect.TaskOrder)."""
        self.members: dict[str, Environment] = {}
        for i, m in enumerate(options.environments):
            try:
                self.members[m.key] = make_env(m.env_config(config.seed))
            except ConfigError as exc:  # which member: the mix's own place in the config, then the member's line
                raise ConfigError(f"env[{i}] ({m.key}): {exc}") from None
        parsers = {key: type(env).parser for key, env in self.members.items()}
        if len(set(parsers.values())) > 1:
            shown = ", ".join(f"{k}: {v or 'default'}" for k, v in parsers.items())
            raise ConfigError(f"env: the mix's environments write tool calls in different syntaxes ({shown}); a run "
                              "has one rollout.parser")  # fmt: skip
        for key, env in self.members.items():
            if getattr(env, "drives_itself", False):
                raise ConfigError(f"env: {key} runs agents through the gateway; it cannot be mixed with others")
        self.show_tool_schemas = all(env.show_tool_schemas for env in self.members.values())
        self.rubric = MixRubric(self)  # type: ignore[assignment]
        self._tasks: dict[str, dict[str, tuple[str, Task]]] = {}
        self._tools = self._union_tools()

    def _union_tools(self) -> dict[str, Tool]:
        tools: dict[str, Tool] = {}
        owner: dict[str, str] = {}
        for key, env in self.members.items():
            for tool in env.tools():
                if tool.name in tools and tools[tool.name].to_openai() != tool.to_openai():
                    raise ConfigError(f"env: {owner[tool.name]} and {key} both offer a tool named {tool.name!r}, "
                                      "not the same one; one run's tools have distinct names")  # fmt: skip
                tools.setdefault(tool.name, tool)
                owner.setdefault(tool.name, key)
        return tools

    @property
    def syntax(self):
        return self._syntax

    @syntax.setter
    def syntax(self, value) -> None:
        self._syntax = value
        for env in getattr(self, "members", {}).values():
            env.syntax = value

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def member_of(self, task: Task) -> tuple[Environment, Task]:
        """The environment a task of the mix is from, and the task as that environment gave it."""
        key = task.meta.get("env")
        if key not in self.members:
            raise ConfigError(f"env: task {task.id!r} is no task of this mix (its meta names no environment of it)")
        split = self._tasks_by_id()
        return self.members[key], split[task.id][1]

    def _tasks_by_id(self) -> dict[str, tuple[str, Task]]:
        found: dict[str, tuple[str, Task]] = {}
        for by_id in self._tasks.values():
            found.update(by_id)
        return found

    def tasks(self, split: str) -> list[Task]:
        if split not in self._tasks:
            by_id: dict[str, tuple[str, Task]] = {}
            for key, env in self.members.items():
                for inner in env.tasks(split):
                    by_id[f"{key}/{inner.id}"] = (key, inner)
            self._tasks[split] = by_id
        return [self._wrapped(task_id, inner) for task_id, (_, inner) in self._tasks[split].items()]

    @staticmethod
    def _wrapped(task_id: str, inner: Task) -> Task:
        """The mix's task: its id and meta name its environment; its category is qualified by it (`harbor/text`,
        or the label alone), so that samples spread over environments and success by category tells them apart."""
        key = task_id.split("/", 1)[0]
        category = f"{key}/{inner.meta['category']}" if "category" in inner.meta else key
        return Task(task_id, inner.question, inner.answer, {**inner.meta, "env": key, "category": category},
                    inner.images)  # fmt: skip

    def messages(self, task: Task) -> list[dict[str, str]]:
        env, inner = self.member_of(task)
        return env.messages(inner)

    def offered(self, task: Task) -> list[str] | None:
        env, inner = self.member_of(task)
        found = env.offered(inner)
        return found if found is not None else [tool.name for tool in env.tools()]

    def reset(self, task: Task, seed: int | None = None) -> Episode:
        env, inner = self.member_of(task)
        episode = start_episode(env, inner, seed)
        episode.task = task  # the trajectory is the mix's task (its id, its env label); the member played `inner`
        if episode.offered is None:  # its environment's tools and its own, never another member's
            episode.offered = [*(tool.name for tool in env.tools()), *episode.tools]
        return episode

    def reference(self, task: Task):
        env, inner = self.member_of(task)
        return env.reference(inner)

    def reference_summary(self, task: Task, turns: int) -> str | None:
        env, inner = self.member_of(task)
        return env.reference_summary(inner, turns)

    def check_success(self, trajectory, task: Task) -> str | None:
        env, inner = self.member_of(task)
        return env.check_success(trajectory, inner)

    def passes_without_action(self, task: Task) -> bool:
        env, inner = self.member_of(task)
        return env.passes_without_action(inner)

    def limits_for(self, task: Task, limits):
        env, inner = self.member_of(task)
        return env.limits_for(inner, limits)

    max_idle_success: ClassVar[float | None] = None

    def close(self) -> None:
        for env in self.members.values():
            env.close()
