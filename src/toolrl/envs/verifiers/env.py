"""A verifiers environment (its `vf.Environment`: dataset, rollout loop, tools, rubric) trained as a toolrl one.

```yaml
env:
  name: verifiers
  options:
    environment: my-math-env            # an installed verifiers environment (its load_environment), or
    # environment: my_envs:load         # package.module:function returning a vf.Environment
    args: {num_examples: 200}           # keyword arguments of load_environment
    python: .venv-verifiers/bin/python  # the interpreter that has verifiers (default: toolrl's own)
    timeout_s: 300
```

A verifiers 0.4 (v1) environment names its taskset in place of `environment` (`taskset: ID`, `args`: its config,
`harness: {id: "null"}`, `runtime: {type: subprocess}`); the bridge runs each sample as one of its episodes.

verifiers pins versions of openai and mcp that toolrl's do not meet, so it lives in a virtual environment of its
own: toolrl starts `python bridge.py` there once for the run (toolrl/envs/verifiers/bridge.py, which imports
nothing of toolrl) and the two speak JSON lines. The environment's dataset gives the tasks (its eval dataset the
test split); each sample is one `run_rollout` of the environment, its model calls made with an OpenAI client on
the sample's own base URL of the gateway (recorded token-exactly, toolrl/gateway), its reward the environment's
rubric. A rollout that fails, errs or outlives `timeout_s` fails its sample (reward 0, counted in env faults);
a bridge that dies fails the samples it was running and is started again for the next ones.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from toolrl.envs.agent.env import AgentReward, AgentRunOptions
from toolrl.envs.base import Environment, Task, register_env
from toolrl.errors import ConfigError
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.text import clip

log = logging.getLogger(__name__)

BRIDGE = Path(__file__).with_name("bridge.py")
CLOSE_GRACE_S = 30.0
"""How long the bridge has to exit once its input closes before it is killed (a loaded machine has taken over 10 s)."""


class VerifiersOptions(AgentRunOptions):
    environment: str | None = Field(None, min_length=1)
    """An installed verifiers environment's id (verifiers.load_environment), or package.module:function."""
    taskset: str | None = Field(None, min_length=1)
    """A verifiers 0.4 (v1) taskset's id, in place of `environment`: a built-in one, an installed package, or a
    module in the run's folder (or on PYTHONPATH) exporting its Taskset in `__all__`."""
    harness: dict[str, Any] = Field(default_factory=dict)
    """With `taskset`: the harness config that plays it ({id: null}, {id: bash, edit: false}, ...); the taskset's
    default harness when empty."""
    runtime: dict[str, Any] = Field(default_factory=lambda: {"type": "subprocess"})
    """With `taskset`: where the harness and the tasks' tool servers run (verifiers' runtime config)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's load_environment (with `taskset`: the taskset's config fields)."""
    python: str = sys.executable
    """The interpreter whose packages include verifiers (and the environment)."""
    sampling_args: dict[str, Any] = Field(default_factory=dict)
    """Passed to the environment's rollouts (the gateway samples with the run's temperature unless a request
    says otherwise)."""
    num_train: int | None = Field(None, ge=1)
    """Use at most this many examples of the environment's dataset (all by default)."""
    num_test: int | None = Field(None, ge=1)
    """At most this many of its eval dataset; an environment without one holds out the last num_test (default
    8) of its dataset."""
    timeout_s: float = Field(300.0, gt=0)
    start_timeout_s: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> VerifiersOptions:
        if (self.environment is None) == (self.taskset is None):
            raise ValueError("give env.options.environment (a verifiers environment) or env.options.taskset (a "
                             "verifiers 0.4 taskset), one of them")  # fmt: skip
        return self

    @property
    def field(self) -> str:
        """The option naming what is played, as errors name it."""
        return "taskset" if self.taskset is not None else "environment"

    @property
    def target(self) -> str:
        return str(self.taskset or self.environment)


class BridgeFailed(RuntimeError):
    """The bridge process exited or said something that is not the protocol."""


class Bridge:
    """The bridge process: one writer (any event loop, any thread), one reader thread resolving each request's
    future on the loop that made it."""

    def __init__(self, options: VerifiersOptions, stats: Counter[str]):
        self.options, self.stats = options, stats
        self.lock = threading.Lock()
        self.pending: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self.process = self._spawn()
        self.ready = self._handshake()
        threading.Thread(target=self._read, daemon=True, name="verifiers-bridge").start()

    def _spawn(self) -> subprocess.Popen:
        # A v1 taskset's tool servers run as `python -m MODULE` and its harness's programs through uv: the run's
        # folder on their path, the interpreter's own scripts (uv) on PATH.
        path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
        scripts = os.pathsep.join(p for p in (str(Path(self.options.python).parent), os.environ.get("PATH")) if p)
        try:
            process = subprocess.Popen(
                [self.options.python, str(BRIDGE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, encoding="utf-8", errors="replace", bufsize=1,
                env={**os.environ, "PYTHONPATH": path, "PATH": scripts},
            )  # fmt: skip
        except OSError as exc:
            raise ConfigError(
                f"env.options.python: cannot run {clip(self.options.python, 120)!r} ({exc.strerror})"
            ) from None
        atexit.register(process.kill)
        threading.Thread(target=self._drain_stderr, args=(process,), daemon=True).start()
        return process

    def _drain_stderr(self, process: subprocess.Popen) -> None:
        for line in process.stderr:
            self.stderr_tail.append(line.rstrip())
            log.debug("verifiers: %s", line.rstrip())

    def _last_words(self) -> str:
        lines = [line for line in self.stderr_tail if line.strip()]
        return clip(lines[-1], 300) if lines else "(nothing on stderr)"

    def _handshake(self) -> dict[str, Any]:
        options = self.options
        spec = {"environment": options.environment, "taskset": options.taskset, "harness": options.harness,
                "runtime": options.runtime, "args": options.args}  # fmt: skip
        self.process.stdin.write(json.dumps(spec) + "\n")
        self.process.stdin.flush()
        reply: list[str] = []
        reader = threading.Thread(target=lambda: reply.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.options.start_timeout_s)
        if not reply:
            self.process.kill()
            raise ConfigError(f"env.options.{self.options.field}: {self.options.target!r} did not load within "
                              f"env.options.start_timeout_s ({self.options.start_timeout_s:g} s)")  # fmt: skip
        try:
            message = json.loads(reply[0])
        except ValueError:
            message = {}
        if message.get("field") == "python":
            raise ConfigError(f"env.options.python: {clip(self.options.python, 120)!r} cannot import verifiers "
                              f"({clip(str(message['fatal']), 200)}); give the interpreter of the virtual environment "
                              "that has it (pip install verifiers there)")  # fmt: skip
        if "fatal" in message:
            raise ConfigError(f"env.options.{self.options.field}: {self.options.target!r} did not load: "
                              f"{clip(str(message['fatal']), 300)}")  # fmt: skip
        if "ready" not in message:
            time.sleep(0.2)  # let stderr arrive: the likeliest reason is an interpreter without verifiers
            raise ConfigError(f"env.options.python: {clip(self.options.python, 120)!r} did not start the verifiers "
                              f"bridge: {self._last_words()} (is verifiers installed for it?)")  # fmt: skip
        return message["ready"]

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                message = json.loads(line)
                future = self.pending.pop(message["id"])
            except (ValueError, KeyError, TypeError):
                self.stats["bridge_unreadable_lines"] += 1
                log.warning("env verifiers: the bridge said something that is not the protocol: %s", clip(line, 200))
                continue
            if not future.done():
                future.get_loop().call_soon_threadsafe(_settle, future, message)
        self.process.wait()
        reason = BridgeFailed(f"the verifiers bridge exited with {self.process.returncode}: {self._last_words()}")
        with self.lock:
            pending, self.pending = self.pending, {}
        for future in pending.values():
            future.get_loop().call_soon_threadsafe(_fail, future, reason)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        with self.lock:
            if not self.alive:
                raise BridgeFailed(f"the verifiers bridge exited with {self.process.returncode}: {self._last_words()}")
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()

    async def rollout(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        with self.lock:
            rid, self.next_id = self.next_id, self.next_id + 1
            self.pending[rid] = future
        try:
            self.send({"id": rid, **request})
            return await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            self.pending.pop(rid, None)
            if self.alive:
                self.send({"cancel": rid})
            raise

    def close(self) -> None:
        if self.alive:
            self.process.stdin.close()
            try:
                self.process.wait(CLOSE_GRACE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _settle(future: asyncio.Future, message: dict[str, Any]) -> None:
    if not future.done():
        future.set_result(message)


def _fail(future: asyncio.Future, reason: Exception) -> None:
    if not future.done():
        future.set_exception(reason)


def rubric_reward(task: Task, result: dict[str, Any], calls) -> float:
    """The environment's rubric, as the bridge reported it."""
    return float(result["reward"])


class VerifiersRubric(Rubric):
    """The environment's rubric as the bridge reported it: its reward, and each of its metrics (its reward
    functions, unweighted) kept as `vf/NAME` beside it (logged as reward/vf/NAME; 0 for a failed sample), the
    same names at every step once seen."""

    def __init__(self, criteria):
        super().__init__(criteria)
        self.metric_names: list[str] = []

    async def score_all(self, trajs) -> None:
        await super().score_all(trajs)
        reported = [_metrics(traj.episode) for traj in trajs]
        for metrics in reported:
            self.metric_names += [name for name in metrics if name not in self.metric_names]
        for traj, metrics in zip(trajs, reported, strict=True):
            for name in self.metric_names:
                traj.rewards[f"vf/{name}"] = metrics.get(name, 0.0)


def _metrics(outcome) -> dict[str, float]:
    result = getattr(outcome, "result", None)
    if getattr(outcome, "error", None) is not None or not isinstance(result, dict):
        return {}
    metrics = result.get("metrics") if isinstance(result.get("metrics"), dict) else {}
    return {clip(str(k), 60): float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}  # fmt: skip


@register_env("verifiers")
class VerifiersEnv(Environment):
    """A verifiers environment run by its own rollout loop; toolrl's gateway answers its model calls."""

    Options = VerifiersOptions
    drives_itself = True

    def __init__(self, config, options: VerifiersOptions):
        super().__init__(config, options)
        self.options: VerifiersOptions = options
        self.counts = AgentReward(rubric_reward)
        self.rubric = VerifiersRubric([Criterion("reward", self.counts, 1.0)])
        self._bridge: Bridge | None = None
        self._splits: dict[str, list[Task]] | None = None
        self.model_name = "policy"

    @property
    def bridge(self) -> Bridge:
        if self._bridge is None or not self._bridge.alive:
            if self._bridge is not None:
                self.counts.stats["bridge_restarts"] += 1
                log.warning("env verifiers: the bridge had exited (%s); starting it again", self._bridge._last_words())
            self._bridge = Bridge(self.options, self.counts.stats)
        return self._bridge

    def tasks(self, split: str) -> list[Task]:
        if self._splits is None:
            self._splits = self._make_splits(self.bridge.ready)
        return self._splits["test" if split == "test" else "train"]

    def _make_splits(self, ready: dict[str, Any]) -> dict[str, list[Task]]:
        for note in ready.get("notes") or []:  # what the bridge did not take as given (an endless taskset cut)
            log.warning("env verifiers: %s: %s", self.options.target, clip(str(note), 200))
        train, test = list(ready.get("train") or []), list(ready.get("test") or [])
        if not train and not test:
            raise ConfigError(f"env.options.{self.options.field}: {self.options.target!r} has no dataset and no eval "
                              "dataset: there is nothing to train on")  # fmt: skip
        if not test:
            held = min(self.options.num_test or 8, max(len(train) // 4, 1))
            train, test = train[:-held], train[-held:]
            log.info("env verifiers: %s has no eval dataset; the last %d examples of its dataset are the test split",
                     self.options.target, held)  # fmt: skip
        elif not train:
            raise ConfigError(f"env.options.{self.options.field}: {self.options.target!r} has only an eval dataset; "
                              "give it a training dataset (its `dataset`)")  # fmt: skip
        if self.options.num_train is not None:
            train = train[: self.options.num_train]
        if self.options.num_test is not None:
            test = test[: self.options.num_test]
        log.info("env verifiers: %s (verifiers %s): %d training and %d test examples",
                 self.options.target, ready.get("version"), len(train), len(test))  # fmt: skip
        return {"train": [_task("train", row) for row in train], "test": [_task("test", row) for row in test]}

    def messages(self, task: Task) -> list[dict[str, Any]]:
        prompt = task.meta["verifiers"].get("prompt")
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        return [{"role": m.get("role", "user"), "content": m.get("content") or ""} for m in prompt or []]

    async def run_agent(self, task: Task, base_url: str, api_key: str) -> dict[str, Any]:
        """One rollout of the verifiers environment on `task` against the sample's base URL; raises its error."""
        request = {"input": task.meta["verifiers"], "base_url": base_url, "api_key": api_key,
                   "model": self.model_name, "sampling_args": self.options.sampling_args}  # fmt: skip
        result = await self.bridge.rollout(request, self.options.timeout_s)
        if result.get("error"):
            raise RuntimeError(f"the verifiers rollout failed: {clip(str(result['error']), 300)}")
        reward = result.get("reward")
        if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
            raise RuntimeError(f"the verifiers rubric gave no finite reward ({clip(repr(reward), 80)})")
        return result

    def close(self) -> None:
        if self._bridge is not None:
            self._bridge.close()


def _task(split: str, row: dict[str, Any]) -> Task:
    prompt = row.get("prompt")
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        question = users[-1] if users and isinstance(users[-1], str) else json.dumps(prompt)[:2000]
    else:
        question = str(prompt or "")
    return Task(
        f"{split}-{clip(str(row.get('example_id')), 80)}", question, str(row.get("answer") or ""), {"verifiers": row}
    )
