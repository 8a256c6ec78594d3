"""The `agent` environment: your agent program, run per sample against the gateway, scored by your reward.

```yaml
env:
  name: agent
  train_file: tasks.jsonl            # {"id", "question", "answer", "meta"} per line, as every environment
  test_file: tasks-test.jsonl
  options:
    agent: my_agents:answer          # async def answer(task, base_url, api_key) -> result (or a plain def)
    # command: [python, my_agent.py] # or a program: OPENAI_BASE_URL, OPENAI_API_KEY and TOOLRL_TASK (JSON) set;
    #                                  its result is the last line it prints (JSON if it parses)
    reward: my_agents:score          # score(task, result, calls) -> float; calls: what the model called, with results
    timeout_s: 120
```

The agent talks to the policy through the OpenAI API only (any client: the `openai` SDK, the OpenAI Agents SDK,
LangGraph); the gateway records its turns token-exactly (toolrl/gateway). An agent that raises, exits non-zero
or outlives `timeout_s` fails its sample (reward 0, counted in env_faults), never the run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shutil
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from toolrl.envs.base import Environment, EnvOptions, Task, register_env
from toolrl.envs.tasks import TaskSplits
from toolrl.errors import ConfigError
from toolrl.plugins import import_object
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.text import clip, first_line


class AgentRunOptions(EnvOptions):
    """What every environment whose samples are agent runs through the gateway takes (agent, verifiers)."""

    timeout_s: float = Field(120.0, gt=0)
    concurrency: int = Field(64, ge=1)
    """Agents running at once (their requests are batched by the engine)."""
    max_failed_steps: int = Field(3, ge=0)
    """Rollouts in a row in which every agent failed before the run stops with an error (0: never)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """The most tokens an agent's reply may have (its requests' max_tokens are honoured up to it; a reply it cuts
    is logged); None: rollout.max_new_tokens."""


class AgentOptions(AgentRunOptions):
    agent: str | None = None
    """`package.module:function`: async def f(task, base_url, api_key) -> result (or a plain function)."""
    command: list[str] | None = None
    """A program run per sample with OPENAI_BASE_URL, OPENAI_API_KEY, ANTHROPIC_BASE_URL, ANTHROPIC_API_KEY,
    TOOLRL_TASK (JSON) and TOOLRL_QUESTION set; its result is the last line of its output (JSON when it parses)."""
    reward: str
    """`package.module:function`: f(task, result, calls) -> float, calls as [{"name", "arguments", "result"}]."""
    success_at: float = 1.0
    """A sample succeeds (`success`: 1, else 0) when the agent ran to its end and its reward is at least this; the
    reward itself, whatever its scale, is what is trained on."""

    @model_validator(mode="after")
    def one_agent(self) -> AgentOptions:
        """Exactly one agent, found before anything starts: the functions imported, the program on PATH."""
        if (self.agent is None) == (self.command is None):
            raise ValueError("give exactly one of agent (package.module:function) and command (a program)")
        if self.agent is not None:
            import_target("env.options.agent", self.agent)
        elif not self.command or not shutil.which(self.command[0]):
            program = clip(self.command[0], 80) if self.command else "(empty)"
            raise ConfigError(f"env.options.command: the program {program!r} is not found (on PATH, or as a path); "
                              "install it or give its path")  # fmt: skip
        import_target("env.options.reward", self.reward)
        return self


def import_target(where: str, target: str) -> Any:
    """A function the config names (plugins.import_object, from the current folder too), refused when it is not
    one."""
    value = import_object(where, target)
    if not callable(value):
        raise ConfigError(f"{where}: {clip(target, 80)!r} is not a function")
    return value


class AgentFailed(Exception):
    """An agent's run failed: `cause` sorts it (exit 3, timeout, HTTP 404, raised ValueError), `example` is the line
    that shows it (the last line of its stderr, the gateway's refusal)."""

    def __init__(self, message: str, cause: str, example: str = ""):
        super().__init__(message)
        self.cause, self.example = cause, example or message


@dataclass
class AgentOutcome:
    """What one agent run gave: its result, the calls the model made (with the results the agent sent back), or
    why it failed (`error`, its `cause` and an `example` line)."""

    result: Any = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    cause: str = ""
    example: str = ""
    score: float | None = None
    """The user's reward on it, once scored (the success criterion reads it: the reward function runs once)."""

    @classmethod
    def failed(cls, exc: BaseException, timeout_s: float) -> AgentOutcome:
        if isinstance(exc, TimeoutError):
            message = f"the agent ran past env.options.timeout_s ({timeout_s:g} s)"
            return cls(error=message, cause="timeout", example=message)
        if isinstance(exc, AgentFailed):
            return cls(error=str(exc), cause=exc.cause, example=exc.example)
        line = first_line(exc) or type(exc).__name__
        return cls(error=line, cause=f"raised {type(exc).__name__}", example=line)


class AgentReward:
    """The user's reward on a sample's outcome (0 for a failed agent); `stats` are the gateway's counts for the
    step's metrics (reward/segments, reward/extra_segments, reward/requests, reward/continued_requests,
    reward/agent_failures and, by cause, reward/agent_failures/CAUSE: exit_3, timeout, http_404, raised_valueerror;
    reward/requests/PROTOCOL: chat, responses, messages, completions)."""

    def __init__(self, score):
        self.score = score
        self.stats: Counter[str] = Counter()

    def __call__(self, trajectory, task: Task) -> float:
        outcome = trajectory.episode
        if not isinstance(outcome, AgentOutcome) or outcome.error is not None:
            return 0.0
        if outcome.score is None:
            outcome.score = float(self.score(task, outcome.result, outcome.calls))
        return outcome.score


class AgentSuccess:
    """1 where the agent ran to its end and its reward is at least `at` (env.options.success_at), else 0."""

    def __init__(self, reward: AgentReward, at: float):
        self.reward, self.at = reward, at

    def __call__(self, trajectory, task: Task) -> float:
        outcome = trajectory.episode
        if not isinstance(outcome, AgentOutcome) or outcome.error is not None:
            return 0.0
        return float(self.reward(trajectory, task) >= self.at)


@register_env("agent")
class AgentEnv(Environment):
    """Runs your agent per sample; the rollout is rollout/agent.py's (the agent drives, not the loop)."""

    Options = AgentOptions
    drives_itself = True
    """Its samples are agent runs through the gateway (AgentRollout), not the generate-parse-invoke loop."""

    def __init__(self, config, options: AgentOptions):
        super().__init__(config, options)
        self.options: AgentOptions = options
        self.agent = import_target("env.options.agent", options.agent) if options.agent else None
        score = import_target("env.options.reward", options.reward)
        self.counts = AgentReward(score)
        success = Criterion("success", AgentSuccess(self.counts, options.success_at), 0.0)  # 0/1, apart from the reward
        self.rubric = Rubric([Criterion("reward", self.counts, 1.0), success], success="success")
        self.splits = TaskSplits(config)

    def tasks(self, split: str) -> list[Task]:
        return self.splits(split)

    def messages(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "user", "content": task.question}]

    async def run_agent(self, task: Task, base_url: str, api_key: str) -> Any:
        """The agent's result for `task` (raises what the agent raised; TimeoutError past timeout_s)."""
        if self.agent is not None:
            if inspect.iscoroutinefunction(self.agent):
                return await asyncio.wait_for(self.agent(task, base_url, api_key), self.options.timeout_s)
            return await asyncio.wait_for(
                asyncio.to_thread(self.agent, task, base_url, api_key), self.options.timeout_s
            )
        return await self._run_command(task, base_url, api_key)

    async def _run_command(self, task: Task, base_url: str, api_key: str) -> Any:
        assert self.options.command is not None
        return await run_program(self.options.command, program_env(task, base_url, api_key), self.options.timeout_s)


def program_env(task: Task, base_url: str, api_key: str, **more: str) -> dict[str, str]:
    """The environment an agent program runs with: where its model is (OpenAI's and Anthropic's variables), its
    task, and `more`."""
    return {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key,
            "ANTHROPIC_BASE_URL": base_url.removesuffix("/v1"), "ANTHROPIC_API_KEY": api_key,
            "TOOLRL_TASK": json.dumps({"id": task.id, "question": task.question, "meta": task.meta}),
            "TOOLRL_QUESTION": task.question, **more}  # fmt: skip


async def run_program(command: list[str], env: dict[str, str], timeout_s: float) -> Any:
    """Run an agent program to its end: its result is the last line it printed (JSON when it parses); a non-zero
    exit is AgentFailed with its stderr's last line; past `timeout_s` it and all it started are killed
    (TimeoutError)."""
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)  # the agent and whatever it started
        await process.wait()
        raise
    if process.returncode != 0:
        tail = clip((err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["(no output)"])[0], 200)
        raise AgentFailed(f"the agent exited with {process.returncode}: {tail}", f"exit {process.returncode}", tail)
    lines = out.decode("utf-8", "replace").strip().splitlines()
    last = lines[-1] if lines else ""
    try:
        return json.loads(last)
    except ValueError:
        return last
