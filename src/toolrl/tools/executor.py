"""Run tool calls on asyncio: the calls of a turn run concurrently; every failure becomes a short observation.

Each call goes through: cache (opt-in) -> rate limit -> per-tool, then global concurrency limit -> attempts
under one deadline (the policy's timeout, counted from the call's start: retries, backoff and reconnects fit
inside it) -> a retry with exponential backoff only for a transient failure of a tool that is safe to repeat,
or one that never reached the tool. Synchronous tools run in worker processes or threads, async ones on event
loops of their own threads (runners.py; `isolation: inline` keeps one on the caller's loop); none holds a slot
past its deadline, whatever the tool does. Every result carries its outcome; `metrics` counts
calls, outcomes (`errors_<outcome>`, with the `infra_faults` and `model_errors` families), retries and the
cache.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolrl.errors import ToolError
from toolrl.text import clip, clip_head, first_line, from_text, one_line, well_formed_text
from toolrl.tools.cache import ResultCache, cache_key
from toolrl.tools.call import INFRA_FAULTS, MODEL_ERRORS, Outcome, ToolCall, ToolResult, unknown_tool_error
from toolrl.tools.function import Tool
from toolrl.tools.images import ImageLimits, ToolOutput, to_output
from toolrl.tools.limits import (
    TRANSIENT,
    InvalidArguments,
    NotDelivered,
    RateLimiter,
    ServerCrashed,
    ServerUnavailable,
    ToolFailed,
    ToolPolicy,
    exception_text,
)
from toolrl.tools.runners import IMPORT_TIMEOUT_S, AsyncRunner, DeadlineExceeded, ProcessRunner, ThreadRunner

TOOL_ERROR_CHARS = 1500
"""The longest failure a tool's observation tells (the end of a traceback: the type and message of what failed
and the lines that led to it)."""


def failure(exc: Exception) -> str:
    """What a tool's own failure tells the model: its words as they are for a ToolFailed, else its type and
    message as Python shows them; multi-line (a traceback's tail), at most TOOL_ERROR_CHARS."""
    text = str(exc) if isinstance(exc, ToolFailed) else exception_text(type(exc).__name__, str(exc))
    return clip_head(well_formed_text(text.strip()), TOOL_ERROR_CHARS)


@dataclass
class _Clock:
    """One call's time. A worker process's start and import before the tool runs (`setup_s`) move its deadline
    on: the deadline counts the tool's own time, and a slow import has a budget of its own
    (tools.import_timeout_s)."""

    started: float
    timeout_s: float
    setup_s: float = 0.0

    @property
    def deadline(self) -> float:
        return self.started + self.timeout_s + self.setup_s

    def worker_ready(self, waited: float) -> None:
        self.setup_s += waited


class ToolExecutor:
    """Owns a set of tools by name, the policy each is called with, and the workers that run them."""

    def __init__(
        self,
        tools: Sequence[Tool],
        timeout_s: float = 10.0,
        max_concurrency: int = 64,
        policies: Mapping[str, ToolPolicy] | None = None,
        cache_path: str | Path | None = None,
        log_dir: str | Path | None = None,
        image_limits: ImageLimits | None = None,
        import_timeout_s: float = IMPORT_TIMEOUT_S,
    ):
        self.tools = {tool.name: tool for tool in tools}
        self.default_policy = ToolPolicy(timeout_s=timeout_s)
        self.policies = dict(policies or {})
        self.max_concurrency = max_concurrency
        self.image_limits = image_limits or ImageLimits()
        self.threads = ThreadRunner()
        self.coroutines = AsyncRunner()
        self.processes = ProcessRunner(Path(log_dir) / "workers.log" if log_dir else None, import_timeout_s)
        self.cache = ResultCache(path=cache_path)
        self.metrics: Counter[str] = Counter()
        self._limits: dict[tuple[int, str], tuple[asyncio.Semaphore | None, RateLimiter | None]] = {}
        self._global: dict[int, asyncio.Semaphore] = {}
        self._abandoned: set[asyncio.Task] = set()
        for tool in self.tools.values():
            self.isolation(tool)  # a tool that cannot run where its policy says is a config error, now

    def policy(self, name: str) -> ToolPolicy:
        return self.policies.get(name, self.default_policy)

    def isolation(self, tool: Tool) -> str:
        """Where `tool` runs: for an async tool, loop (an event loop on a thread of its own, the default) or
        inline (the caller's loop, for a tool bound to it); for a synchronous one, process or thread."""
        chosen = self.policy(tool.name).isolation or tool.isolation
        if tool.is_async:
            if chosen not in (None, "loop", "inline"):
                raise ToolError(f"tool {tool.name}: an async tool runs with isolation loop or inline, not {chosen}")
            return chosen or "loop"
        if chosen in ("loop", "inline"):
            raise ToolError(f"tool {tool.name}: isolation {chosen} is for async tools; use process or thread")
        chosen = chosen or ("process" if tool.target else "thread")
        if chosen == "process" and tool.target is None:
            raise ToolError(
                f"tool {tool.name}: isolation process needs a function a worker process can import "
                "(module-level, not a closure, bound method or partial); use isolation: thread"
            )
        return chosen

    def _gates(self, name: str) -> tuple[asyncio.Semaphore, asyncio.Semaphore | None, RateLimiter | None]:
        # asyncio primitives belong to one event loop; each `asyncio.run` of a rollout gets its own.
        loop = id(asyncio.get_running_loop())
        if loop not in self._global:
            self._global = {loop: asyncio.Semaphore(self.max_concurrency)}
            self._limits = {}
        if (loop, name) not in self._limits:
            policy = self.policy(name)
            per_tool = asyncio.Semaphore(policy.max_concurrency) if policy.max_concurrency else None
            rate = RateLimiter(policy.rate_per_s) if policy.rate_per_s else None
            self._limits[(loop, name)] = (per_tool, rate)
        return (self._global[loop], *self._limits[(loop, name)])

    def _result(
        self,
        call: ToolCall,
        outcome: Outcome,
        content: str | ToolOutput,
        clock: _Clock | None = None,
    ) -> ToolResult:
        if outcome != "ok":
            self.metrics[f"errors_{outcome}"] += 1
            if outcome in INFRA_FAULTS:
                self.metrics["infra_faults"] += 1
            elif outcome in MODEL_ERRORS:
                self.metrics["model_errors"] += 1
        latency = time.monotonic() - clock.started if clock is not None else 0.0
        setup = clock.setup_s if clock is not None else 0.0
        if isinstance(content, ToolOutput):
            return ToolResult(call, content.text, outcome, latency, setup, tuple(content.images), content.value)
        return ToolResult(call, content, outcome, latency, setup)

    def count_unknown(self, calls: int) -> None:
        """Count `calls` a parser found to name a tool not offered (never invoked) as invoke counts them."""
        self.metrics["calls"] += calls
        self.metrics["errors_unknown_tool"] += calls
        self.metrics["model_errors"] += calls  # unknown_tool is the model's error (MODEL_ERRORS)

    async def invoke(self, call: ToolCall, offered: Mapping[str, Tool] | None = None) -> ToolResult:
        """Run one call. `offered` is the whole set of tools the caller may use, by name (an episode's: its own,
        bound to its state, and some of the run's); a name outside it is an unknown tool, whatever the run has.
        None: the run's tools. Policies apply by name."""
        self.metrics["calls"] += 1
        available = self.tools if offered is None else offered
        tool = available.get(call.name)
        if tool is None:
            return self._result(call, "unknown_tool", unknown_tool_error(call.name, available))
        policy = self.policy(call.name)
        stateful = tool is not self.tools.get(call.name)  # an episode's own: its result depends on its state
        key = cache_key(call.name, call.arguments) if policy.cache and not stateful else None
        if key is not None:
            cached = self.cache.get(key)
            self.metrics["cache_hits" if cached is not None else "cache_misses"] += 1
            if cached is not None:
                return ToolResult(call, cached, value=from_text(cached))
        result = await self._call(tool, call, policy)
        if key is not None and not result.error and not result.images:  # the cache keeps text only
            self.cache.put(key, result.content)
        return result

    async def _call(self, tool: Tool, call: ToolCall, policy: ToolPolicy) -> ToolResult:
        global_gate, tool_gate, rate = self._gates(call.name)
        if rate is not None:  # wait for the rate limit before taking a concurrency slot
            await rate.acquire()
        # The tool's own slot first: a call waiting for it must not hold a global slot other tools could use.
        async with tool_gate or nullcontext(), global_gate:
            clock = _Clock(time.monotonic(), policy.timeout_s)
            try:
                arguments = tool.validate(call.arguments)
            except InvalidArguments as exc:
                return self._result(call, "invalid_arguments", f"Error: {exc}", clock)
            safe_to_repeat = tool.idempotent if policy.retry is None else policy.retry
            attempt, unsent = 0, False
            while True:
                try:
                    value = await self._attempt(tool, arguments, clock)
                    return self._result(call, "ok", value, clock)
                except DeadlineExceeded:
                    if tool.runs_elsewhere:  # sent to a process that goes on: it may yet run there
                        text = (f"Error: {call.name} gave no answer within {policy.timeout_s:g} s; it may still run "
                                "there (outcome unknown)")  # fmt: skip
                        return self._result(call, "unknown", text, clock)
                    text = f"Error: {call.name} timed out after {policy.timeout_s:g} s"
                    return self._result(call, "timeout", text, clock)
                except InvalidArguments as exc:  # the tool (or its server) judged the arguments wrong: final
                    text = f"Error: invalid arguments: {clip(str(exc))}"
                    return self._result(call, "invalid_arguments", text, clock)
                except NotDelivered as exc:  # its server ended before reading it: to the restarted one, at once
                    outcome, message, repeatable, unsent = "transport", one_line(str(exc)), True, True
                except ServerUnavailable as exc:  # never reached the tool: safe to send again
                    outcome, message, repeatable = "transport", one_line(str(exc)), True
                except ServerCrashed as exc:
                    outcome, message, repeatable = "server_crashed", one_line(str(exc)), safe_to_repeat
                except TRANSIENT as exc:
                    outcome, message, repeatable = "transport", first_line(exc), safe_to_repeat
                except Exception as exc:  # a tool's own failure (ValueError too) must never end the rollout
                    text = f"Error: {call.name} failed: {failure(exc)}"
                    return self._result(call, "tool_error", text, clock)
                # After a crash the restart is the wait (the next attempt waits for it within the deadline). A call
                # the crash kept from the server is sent again whatever `retries` says: only the deadline bounds it.
                backoff = 0.0 if outcome == "server_crashed" or unsent else policy.backoff_s * 2**attempt
                spent = attempt >= policy.retries and not unsent
                if not repeatable or spent or time.monotonic() + backoff >= clock.deadline:
                    return self._result(call, outcome, f"Error: {call.name} failed: {message}", clock)
                attempt, unsent = attempt + 1, False
                self.metrics["retries"] += 1
                await asyncio.sleep(backoff)

    async def _attempt(self, tool: Tool, arguments: dict[str, Any], clock: _Clock) -> ToolOutput:
        """The tool's value as text and checked images (an unreadable image is the tool's error)."""
        where, timeout = self.isolation(tool), clock.deadline - time.monotonic()
        if where == "loop":
            value = await self.coroutines.run(tool.fn, arguments, timeout)
        elif where == "inline":
            value = await self._run_async(tool.fn(**arguments), timeout)
        elif where == "process":
            value = await self.processes.run(tool.target, arguments, timeout, clock.worker_ready)
        else:
            value = await self.threads.run(tool.fn, arguments, timeout)
        output = to_output(value, self.image_limits)
        if (where == "process" or tool.text_only) and not output.images:  # only text crossed: what it stands for
            output.value = from_text(output.text)
        return output

    async def _run_async(self, coro: Any, timeout: float) -> Any:
        """Await `coro` until `timeout`; past it, cancel it and go on without waiting for it (a coroutine may
        ignore the cancellation): it is kept referenced until it ends, or until asyncio.run's teardown."""
        task = asyncio.ensure_future(coro)
        try:
            done, _ = await asyncio.wait({task}, timeout=max(timeout, 0.0))
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task in done:
            return task.result()
        task.cancel()
        self._abandoned.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._abandoned.discard)
        raise DeadlineExceeded

    async def invoke_all(
        self, calls: Sequence[ToolCall], offered: Mapping[str, Tool] | None = None
    ) -> list[ToolResult]:
        return list(await asyncio.gather(*(self.invoke(call, offered) for call in calls)))

    def close(self) -> None:
        """Kill the worker processes (hung ones too) and close the cache; hung threads are daemons and never
        delay the process's exit."""
        self.processes.close()
        self.cache.close()
