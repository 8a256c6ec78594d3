"""The `harbor` environment: Harbor-format tasks (task.py), each episode in a box of a sandbox provider.

```yaml
env:
  name: harbor
  options:
    path: my-tasks/          # a folder of Harbor task folders; default: toolrl's 13 fixture tasks
    test_tasks: [fix-add]    # held out for evaluation; default: evaluation plays the training tasks
    sandbox: {provider: local}   # or container (podman/docker), or one of your own
```

The agent works in the task's box through three tools: `bash` (a command in the working folder), `read_file` and
`write_file`. When the episode ends its box is verified as Harbor does: /logs/verifier and /tests emptied (nothing
the agent left there counts), the task's tests/ copied to /tests, `bash /tests/test.sh` run within the task's
verifier timeout, and the reward read from /logs/verifier/reward.txt (or reward.json's `reward`). Rewards:
`reward` (the tests' number, weight 1), `success` (the reward is at least `success_at`), `verified` (1 when the
tests ran and wrote a reward: a box that failed to start or a test that hung is 0 there, logged, never a pass).
The reference (`toolrl env check`) runs solution/solve.sh as its one bash call.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, model_validator

from toolrl.envs.agent.env import AgentRunOptions, program_env, run_program
from toolrl.envs.base import Environment, Episode, Task, register_env
from toolrl.envs.harbor.task import SHIPPED, HarborTask, load_tasks
from toolrl.envs.harbor.verify import HarborVerifier, Verdict, verify
from toolrl.envs.reference import ReferenceRequest, answered
from toolrl.errors import ConfigError
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.sandbox import Box, BoxSpec, make_provider
from toolrl.sandbox.serve import BoxServer
from toolrl.text import clip
from toolrl.tools.call import ToolCall
from toolrl.tools.function import Tool, tool_from_function
from toolrl.tools.limits import ToolFailed

log = logging.getLogger(__name__)

SYSTEM = (
    "You are an agent working in a Linux shell; your working folder is {workdir}. Use the tools to do the task: "
    "bash runs a command, read_file and write_file read and write a file. When the task is done, reply with one "
    "short sentence without a tool call."
)


class HarborOptions(AgentRunOptions):
    path: str | None = None
    """A folder of Harbor task folders (or one task folder); None: toolrl's fixture tasks."""
    tasks: list[str] | None = None
    """The task names to play (None: all of the folder's)."""
    test_tasks: list[str] | None = None
    """Task names held out for evaluation (not trained on); None: evaluation plays the training tasks."""
    sandbox: dict[str, Any] = Field(default_factory=lambda: {"provider": "local"})
    """The sandbox provider and its options (toolrl/sandbox: local, container, or yours)."""
    command_timeout_s: float = Field(30.0, gt=0)
    """One bash call's limit (the task's agent timeout bounds the whole episode's calls too)."""
    max_output_chars: int = Field(2000, ge=100)
    success_at: float = 1.0
    """A trajectory succeeds when the tests' reward is at least this."""
    agent: list[str] | None = None
    """A harness program that works in each task's box instead of toolrl's tool loop, its model the gateway:
    `[python, -m, toolrl.envs.harbor.bash_agent]` or your own (OPENAI_BASE_URL, OPENAI_API_KEY, TOOLRL_TASK,
    TOOLRL_BOX_URL and TOOLRL_BOX_TOKEN set: sandbox/serve.py). timeout_s (or the task's agent timeout, the smaller)
    bounds its run."""

    @model_validator(mode="after")
    def _agent_found(self) -> HarborOptions:
        if self.agent is not None and (not self.agent or not shutil.which(self.agent[0])):
            program = clip(self.agent[0], 80) if self.agent else "(empty)"
            raise ConfigError(f"env.options.agent: the program {program!r} is not found (on PATH, or as a path)")
        return self


class Shell:
    """The episode's tools, bound to its box (started when the episode opens)."""

    def __init__(self, episode: HarborEpisode):
        self.episode = episode

    def _box(self) -> Box:
        if self.episode.box is None:
            raise ToolFailed("the task's box is not running")
        return self.episode.box

    async def bash(self, command: str) -> str:
        """Run a bash command in the task's working folder and return its output.

        Args:
            command: The command line, as you would type it in a terminal.
        """
        result = await self._box().exec(command, timeout_s=self.episode.command_timeout_s)
        if result.status is None:
            raise ToolFailed(f"the command ran longer than {self.episode.command_timeout_s:g} s and was stopped")
        output = result.output.rstrip() or "(no output)"
        return output if result.ok else f"{output}\n[exit {result.status}]"

    async def read_file(self, path: str) -> str:
        """Read a text file.

        Args:
            path: The file's path (relative to the working folder, or absolute).
        """
        result = await self._box().exec(["cat", "--", path])
        if not result.ok:
            raise ToolFailed(result.output.strip() or f"cannot read {path}")
        return result.output

    async def write_file(self, path: str, content: str) -> str:
        """Write a text file, replacing it if it exists (its folder is made if missing).

        Args:
            path: The file's path (relative to the working folder, or absolute).
            content: The whole text of the file.
        """
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        result = await self._box().exec(["bash", "-c", script, "write", path], stdin=content.encode())
        if not result.ok:
            raise ToolFailed(result.output.strip() or f"cannot write {path}")
        return f"wrote {len(content.encode())} bytes to {path}"


TOOL_NAMES = ("bash", "read_file", "write_file")


class HarborEpisode(Episode):
    def __init__(self, env: HarborEnv, task: Task, messages):
        shell = Shell(self)
        super().__init__(task, messages, [tool_from_function(getattr(shell, n)) for n in TOOL_NAMES])
        self.env, self.harbor = env, env.by_name[task.id]
        self.box: Box | None = None
        self.command_timeout_s = env.options.command_timeout_s
        self.verdict: Verdict | None = None

    async def open(self) -> None:
        self.box = await self.env.start_box(self.harbor)
        return None

    def close(self) -> None:
        if self.box is not None:
            self.env.stop_box(self.box)
            self.box = None


@register_env("harbor")
class HarborEnv(Environment):
    name = "harbor"
    Options = HarborOptions
    rollout_defaults: ClassVar[dict[str, Any]] = {
        "max_turns": 8,
        "max_new_tokens": 384,
        "max_response_tokens": 2048,
        "max_observation_tokens": 512,
    }
    """Its references (one bash call with solve.sh) fit these (toolrl env check)."""

    def __init__(self, config, options: HarborOptions):
        super().__init__(config, options)
        self.options: HarborOptions = options
        folder = Path(options.path).expanduser() if options.path else SHIPPED
        found = load_tasks(folder)
        self.by_name = {t.name: t for t in found}
        for key in ("tasks", "test_tasks"):
            unknown = [n for n in getattr(options, key) or () if n not in self.by_name]
            if unknown:
                raise ConfigError(f"env.options.{key}: no task {unknown[0]!r} in {folder}; known: "
                                  f"{', '.join(sorted(self.by_name))}")  # fmt: skip
        chosen = [t for t in found if options.tasks is None or t.name in options.tasks]
        held = set(options.test_tasks or ())
        self.train = [t for t in chosen if t.name not in held] if held else chosen
        self.test = [t for t in chosen if t.name in held] if held else chosen
        if not self.train:
            raise ConfigError("env.options.test_tasks holds every task: none is left to train on")
        self.provider = make_provider(options.sandbox)
        self.verifier = HarborVerifier(options.success_at)
        self.counts = self.verifier  # its stats: the gateway's counts of a harness's runs (rollout/agent.py)
        self.rubric = Rubric(
            [
                Criterion("reward", self.verifier, 1.0),
                Criterion("success", self.verifier.view("success"), 0.0),
                Criterion("verified", self.verifier.view("verified"), 0.0),
            ],
            success="success",
        )
        self.live: set[Box] = set()
        self.drives_itself = options.agent is not None  # a harness through the gateway (rollout/agent.py)
        self._boxes: BoxServer | None = None

    def spec(self, task: HarborTask) -> BoxSpec:
        return BoxSpec(
            workdir=task.workdir, image=task.image, build=task.build, memory_mb=task.memory_mb, cpus=task.cpus,
            timeout_s=self.options.command_timeout_s, max_output_chars=self.options.max_output_chars,
            network=task.network and self.options.sandbox.get("provider", "local") != "local",
        )  # fmt: skip

    async def start_box(self, task: HarborTask) -> Box:
        box = await self.provider.start(self.spec(task))
        self.live.add(box)
        return box

    def stop_box(self, box: Box) -> None:
        self.live.discard(box)
        box.close()

    def tools(self) -> list[Tool]:
        shell = Shell(None)  # type: ignore[arg-type] - for the prompt's schemas only
        return [tool_from_function(getattr(shell, n)) for n in TOOL_NAMES]

    def _task(self, harbor: HarborTask) -> Task:
        meta = {"harbor": str(harbor.folder), "category": harbor.category or "harbor"}
        return Task(harbor.name, harbor.instruction, "", meta)

    def tasks(self, split: str) -> list[Task]:
        return [self._task(t) for t in (self.train if split == "train" else self.test)]

    def messages(self, task: Task) -> list[dict[str, str]]:
        workdir = self.by_name[task.id].workdir
        return [
            {"role": "system", "content": SYSTEM.format(workdir=workdir)},
            {"role": "user", "content": task.question},
        ]

    def reset(self, task: Task) -> HarborEpisode:
        return HarborEpisode(self, task, self.messages(task))

    def reference(self, task: Task) -> list[ReferenceRequest] | None:
        """solution/solve.sh as one bash call (a task without one has no reference: counted by env check)."""
        solve = self.by_name[task.id].solve
        if not solve.is_file():
            return None
        return answered("done", ToolCall("bash", {"command": solve.read_text(encoding="utf-8")}))

    async def run_agent(self, task: Task, base_url: str, api_key: str) -> dict[str, Any]:
        """The harness's run in the task's box, then the box verified: {"reward", "verify_error", "agent": what the
        harness printed last}. The harness's own failure (exit, timeout) is the rollout's AgentFailed."""
        assert self.options.agent is not None
        harbor = self.by_name[task.id]
        if self._boxes is None:
            self._boxes = BoxServer().start()
        box = await self.start_box(harbor)
        url = ""
        try:
            url, token = self._boxes.register(box, asyncio.get_running_loop())
            variables = program_env(task, base_url, api_key, TOOLRL_BOX_URL=url, TOOLRL_BOX_TOKEN=token,
                                    TOOLRL_WORKDIR=harbor.workdir)  # fmt: skip
            timeout = min(self.options.timeout_s, harbor.agent_timeout_s)
            result = await run_program(self.options.agent, variables, timeout)
            verdict = await verify(box, harbor)
        finally:
            self._boxes.unregister(url)
            self.stop_box(box)
        if verdict.error:
            log.warning("env harbor: task %s: %s", harbor.name, verdict.error)
            self.verifier.stats["verify_errors"] += 1
        return {"reward": verdict.reward, "verify_error": verdict.error, "agent": result}

    def close(self) -> None:
        for box in list(self.live):
            self.stop_box(box)
        if self._boxes is not None:
            self._boxes.stop()
        self.provider.close()


__all__ = ["HarborEnv", "HarborOptions", "Verdict", "verify"]
