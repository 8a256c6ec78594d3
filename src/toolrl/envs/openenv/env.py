"""An OpenEnv environment (openenv-core's reset/step/state, over its WebSocket client) played as a toolrl one.

```yaml
env:
  name: openenv
  options:
    base_url: http://127.0.0.1:8000        # a running server, or:
    # command: [python, -m, my_env.server, "{port}"]   # started once for the run, on a free port
    action_field: message                  # the action is {action_field: the model's reply}
    observation_field: prompt              # the observation's text (default: its text fields, joined)
```

Each episode is one WebSocket session: `reset(seed)` opens it (its observation is the first user message), each
model turn is one `step` with the reply as the action, each observation the next user message, until the
server says done or a rollout limit ends the turn. The reward is the sum of the steps' rewards (`reward`);
tasks are seeds (`num_train`, `num_test`: test seeds 0.., train seeds after them). The server's code runs in its
own process: toolrl never imports it (openenv-core's GenericEnvClient speaks dictionaries).
"""

from __future__ import annotations

import atexit
import contextlib
import socket
import subprocess
import time
from typing import Any

import httpx
from pydantic import Field, model_validator

from toolrl.envs.base import Environment, EnvOptions, Episode, StepResult, Task, register_env
from toolrl.errors import ConfigError
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.text import clip, first_line

SKIPPED = ("done", "reward", "metadata")
"""Observation fields that are not its text."""


class OpenEnvOptions(EnvOptions):
    base_url: str | None = None
    command: list[str] | None = None
    """A server started once for the run: "{port}" in it becomes a free port; stopped when toolrl exits."""
    action_field: str = "message"
    observation_field: str | None = None
    system: str | None = None
    """A system message before the first observation."""
    num_train: int = Field(64, ge=1)
    num_test: int = Field(16, ge=1)
    start_timeout_s: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def one_server(self) -> OpenEnvOptions:
        if (self.base_url is None) == (self.command is None):
            raise ValueError("give exactly one of base_url (a running OpenEnv server) and command (one to start)")
        return self


def observation_text(observation: dict[str, Any], field: str | None) -> str:
    if field is not None:
        if field not in observation:
            raise ConfigError(f"env.options.observation_field: the observation has no {field!r} (it has "
                              f"{', '.join(sorted(observation)) or 'no fields'})")  # fmt: skip
        return str(observation[field])
    parts = [
        str(v) for k, v in observation.items() if k not in SKIPPED and isinstance(v, str | int | float) and v != ""
    ]
    return "\n".join(parts)


def total_reward(trajectory, task: Task) -> float:
    return float(sum(trajectory.turn_rewards))


class OpenEnvEpisode(Episode):
    def __init__(self, env: OpenEnvEnv, task: Task, seed: int | None):
        super().__init__(task, env.messages(task))
        self.env, self.seed, self.client = env, seed, None

    async def open(self) -> StepResult:
        from openenv.core import GenericEnvClient

        self.client = GenericEnvClient(base_url=self.env.base_url())
        await self.client.connect()
        result = await self.client.reset(seed=self.task.meta["seed"])
        return StepResult(user_message=observation_text(result.observation, self.env.options.observation_field))

    async def reply(self, text: str) -> StepResult:
        assert self.client is not None
        result = await self.client.step({self.env.options.action_field: text})
        reward = float(result.reward or 0.0)
        if result.done:
            await self._disconnect()
            return StepResult(reward=reward, done=True, stop_reason="env_done")
        return StepResult(
            reward=reward, user_message=observation_text(result.observation, self.env.options.observation_field)
        )

    async def _disconnect(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            with contextlib.suppress(Exception):  # the session is over either way
                await client.close()

    def close(self) -> None:
        if self.client is not None:  # a rollout limit ended it: the server drops the session on disconnect
            import asyncio

            try:
                asyncio.get_running_loop().create_task(self._disconnect())
            except RuntimeError:
                self.client = None


@register_env("openenv")
class OpenEnvEnv(Environment):
    Options = OpenEnvOptions
    show_tool_schemas = False

    def __init__(self, config, options: OpenEnvOptions):
        super().__init__(config, options)
        import importlib.util

        if importlib.util.find_spec("openenv") is None:
            raise ConfigError("env.name openenv: OpenEnv's client is in openenv-core; pip install 'toolrl[openenv]'")
        self.options: OpenEnvOptions = options
        self.rubric = Rubric([Criterion("reward", total_reward, 1.0)])
        self._url = options.base_url.rstrip("/") if options.base_url else None
        self._process: subprocess.Popen | None = None

    def tasks(self, split: str) -> list[Task]:
        o = self.options
        seeds = range(o.num_test) if split == "test" else range(o.num_test, o.num_test + o.num_train)
        return [Task(f"{split}-seed-{s}", "", "", {"seed": s}) for s in seeds]

    def messages(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.options.system}] if self.options.system else []

    def reset(self, task: Task, seed: int | None = None) -> Episode:
        return OpenEnvEpisode(self, task, seed)

    def base_url(self) -> str:
        if self._url is None:
            self._url = self._start()
        return self._url

    def _start(self) -> str:
        """Start env.options.command on a free port and wait for its /health."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [part.replace("{port}", str(port)) for part in self.options.command or []]
        try:
            self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as exc:
            raise ConfigError(
                f"env.options.command: cannot start {clip(command[0], 80)!r} ({first_line(exc)})"
            ) from None
        atexit.register(self._process.kill)
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + self.options.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = (self._process.stderr.read() or b"").decode("utf-8", "replace").strip().splitlines()[-1:]
                raise ConfigError(
                    f"env.options.command exited with {self._process.returncode}: {clip(tail[0] if tail else '', 200)}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self._process.kill()
        raise ConfigError(f"env.options.command: the OpenEnv server did not answer {url}/health within "
                          f"{self.options.start_timeout_s:g} s (env.options.start_timeout_s)")  # fmt: skip
