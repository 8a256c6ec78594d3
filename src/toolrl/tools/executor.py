"""Run tool calls on asyncio: the calls of a turn run concurrently; every failure becomes a short observation.

Each call goes through: cache (opt-in) -> rate limit -> per-tool, then global concurrency limit -> attempt
with a timeout -> retries with exponential backoff for transient failures only. `metrics` counts calls,
cache hits and misses, retries and every kind of failure.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from toolrl.tools.cache import ResultCache, cache_key
from toolrl.tools.call import ToolCall, ToolResult, first_line, unknown_tool_error
from toolrl.tools.function import Tool
from toolrl.tools.limits import TRANSIENT, RateLimiter, ToolPolicy


def _to_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class ToolExecutor:
    """Owns a set of tools by name and the policy each is called with."""

    def __init__(
        self,
        tools: Sequence[Tool],
        timeout_s: float = 10.0,
        max_concurrency: int = 64,
        policies: Mapping[str, ToolPolicy] | None = None,
        cache_path: str | Path | None = None,
    ):
        self.tools = {tool.name: tool for tool in tools}
        self.default_policy = ToolPolicy(timeout_s=timeout_s)
        self.policies = dict(policies or {})
        self.max_concurrency = max_concurrency
        # One worker thread per concurrent call: asyncio's default pool has min(32, cores + 4) threads,
        # which would cap slow synchronous tools far below max_concurrency on a small machine.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="toolrl-tool")
        self.cache = ResultCache(path=cache_path)
        self.metrics: Counter[str] = Counter()
        self._limits: dict[tuple[int, str], tuple[asyncio.Semaphore | None, RateLimiter | None]] = {}
        self._global: dict[int, asyncio.Semaphore] = {}

    def policy(self, name: str) -> ToolPolicy:
        return self.policies.get(name, self.default_policy)

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

    async def invoke(self, call: ToolCall, bound: Mapping[str, Tool] | None = None) -> ToolResult:
        """Run one call. `bound` holds one trajectory's own versions of some tools (bound to its database or
        sandbox); they take the place of the shared tools of the same names, under the same policies."""
        self.metrics["calls"] += 1
        tool = (bound or {}).get(call.name) or self.tools.get(call.name)
        if tool is None:
            self.metrics["errors_unknown_tool"] += 1
            return ToolResult(call, unknown_tool_error(call.name, self.tools), error=True)
        policy = self.policy(call.name)
        stateful = bool(bound) and call.name in bound  # its result depends on the trajectory's state
        key = cache_key(call.name, call.arguments) if policy.cache and not stateful else None
        if key is not None:
            cached = self.cache.get(key)
            self.metrics["cache_hits" if cached is not None else "cache_misses"] += 1
            if cached is not None:
                return ToolResult(call, cached)
        result = await self._call_with_retries(tool, call, policy)
        if key is not None and not result.error:
            self.cache.put(key, result.content)
        return result

    async def _call_with_retries(self, tool: Tool, call: ToolCall, policy: ToolPolicy) -> ToolResult:
        global_gate, tool_gate, rate = self._gates(call.name)
        for attempt in range(policy.retries + 1):
            if rate is not None:  # wait for the rate limit before taking a concurrency slot
                await rate.acquire()
            # The tool's own slot first: a call waiting for it must not hold a global slot other tools could use.
            async with tool_gate or nullcontext(), global_gate:
                started = time.monotonic()
                try:
                    value = await asyncio.wait_for(tool(call.arguments, self.pool), timeout=policy.timeout_s)
                    return ToolResult(call, _to_text(value))
                except (asyncio.TimeoutError, TimeoutError) as exc:  # distinct classes before 3.11
                    if time.monotonic() - started >= policy.timeout_s:
                        # Our own deadline: a hung tool is not retried, that would multiply the wait.
                        self.metrics["errors_timeout"] += 1
                        return ToolResult(
                            call, f"Error: {call.name} timed out after {policy.timeout_s:g} s", error=True
                        )
                    failure, message = "errors_transient", f"{call.name} failed: {first_line(exc)}"
                except ValueError as exc:  # arguments off the schema, or a value the tool rejects: final
                    self.metrics["errors_invalid"] += 1
                    return ToolResult(call, f"Error: {exc}", error=True)
                except TRANSIENT as exc:
                    failure, message = "errors_transient", f"{call.name} failed: {first_line(exc)}"
                except Exception as exc:  # a tool's own failure must never end the rollout
                    self.metrics["errors_raised"] += 1
                    return ToolResult(call, f"Error: {call.name} failed: {first_line(exc)}", error=True)
            if attempt < policy.retries:
                self.metrics["retries"] += 1
                await asyncio.sleep(policy.backoff_s * 2**attempt)
        self.metrics[failure] += 1
        return ToolResult(call, f"Error: {message}", error=True)

    async def invoke_all(self, calls: Sequence[ToolCall], bound: Mapping[str, Tool] | None = None) -> list[ToolResult]:
        return list(await asyncio.gather(*(self.invoke(call, bound) for call in calls)))

    def close(self) -> None:
        self.cache.close()
        self.pool.shutdown(wait=False, cancel_futures=True)
