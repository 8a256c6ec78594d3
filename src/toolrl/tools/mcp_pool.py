"""Several processes of one MCP command server, so that a healthy call never fails because a sibling call hangs,
spins or crashes in the same process.

One server process shares its CPU time among every call when the machine is busy, stops answering anything while
a tool blocks its event loop (an async tool that calls a blocking function), and takes all its calls down when it
dies. The pool (`processes` of a command server entry, 2 by default) gives each call to the member with the
fewest calls in flight among those that are up. A call that is safe to repeat (the tool's `retry` in the config,
else readOnlyHint or idempotentHint), has no answer after `hedge_after_s`, and waits behind an older call of its
member while that member has answered nothing since it was sent (a frozen or starved process) is sent to another
member as well: the first answer is the call's, the other copy is cancelled. A call that is slow by itself is not
copied (a call that hangs or spins its server would take a second one down with it), and a call not safe to
repeat is never sent twice. A member that crashes restarts (or promotes its spare) while the others take the calls; the
executor's deadline bounds every call, copies included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from toolrl.tools.function import Tool
from toolrl.tools.limits import InvalidArguments, ToolFailed
from toolrl.tools.mcp import MCPServerConnection

ANSWERED = (ToolFailed, InvalidArguments)
"""Failures that are answers: the member is alive and serving."""


def _taken(task: asyncio.Future) -> None:
    """Take a finished copy's exception, so that asyncio does not print it as never retrieved."""
    if not task.cancelled():
        task.exception()


class MCPServerPool:
    """`size` connections to processes of one server, made by `make(index)`; lists and calls like one."""

    def __init__(
        self,
        name: str,
        make: Callable[[int], MCPServerConnection],
        size: int,
        hedge_after_s: float | None,
        retry: Callable[[str], bool | None] = lambda tool: None,
    ):
        self.name = name
        self.retry = retry
        """A tool's `retry` in the user's config (None: unset): it wins over the server's hints for copies too."""
        self.members = [make(i) for i in range(size)]
        self.hedge_after_s = hedge_after_s
        self.sent: list[dict[int, float]] = [{} for _ in range(size)]
        """Per member: the calls in flight (a number each) and when each was sent."""
        self.answered_at = [time.monotonic()] * size
        self._numbers = itertools.count()
        self.hedged = 0
        """Calls sent to a second member because the first had not answered in time."""
        self.hedge_wins = 0
        """Of those, the calls the second member answered first."""
        self._safe: dict[str, bool] = {}

    @property
    def connections(self) -> int:
        """Server processes started so far, restarts included, over all members."""
        return sum(m.connections for m in self.members)

    def tools(self) -> list[Tool]:
        """The server's tools (listed by the first member), each call going through the pool; the other members
        start in the background."""
        listed = self.members[0].tools()
        for member in self.members[1:]:
            member.warm()
        hints = {t.name.split(".", 1)[1]: t.idempotent for t in listed}
        self._safe = {short: hint if (said := self.retry(short)) is None else said for short, hint in hints.items()}
        return [dataclasses.replace(t, fn=self._caller(t.name.split(".", 1)[1])) for t in listed]

    def _caller(self, short: str):
        async def call(**arguments: Any) -> Any:
            return await self.call(short, arguments)

        return call

    def _order(self, exclude: int | None = None) -> list[int]:
        """Members by preference: up before down (restarting), then fewest calls in flight."""
        ranked = [i for i in range(len(self.members)) if i != exclude]
        return sorted(ranked, key=lambda i: (not self.members[i].up, len(self.sent[i]), -self.answered_at[i]))

    def _stuck_behind(self, i: int, number: int) -> bool:
        """Whether call `number` waits in member `i` behind an older call, with no answer from `i` since it was
        sent: what a copy to another member can overtake."""
        sent = self.sent[i].get(number)
        return sent is not None and self.answered_at[i] < sent and any(n < number for n in self.sent[i])

    async def _one(self, i: int, tool: str, arguments: dict[str, Any], number: int) -> Any:
        self.sent[i][number] = time.monotonic()
        try:
            value = await self.members[i].call(tool, arguments)
            self.answered_at[i] = time.monotonic()
            return value
        except ANSWERED:
            self.answered_at[i] = time.monotonic()
            raise
        finally:
            del self.sent[i][number]

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        first, number = self._order()[0], next(self._numbers)
        if len(self.members) == 1 or self.hedge_after_s is None or not self._safe.get(tool, False):
            return await self._one(first, tool, arguments, number)
        tasks = [asyncio.ensure_future(self._one(first, tool, arguments, number))]
        try:
            while True:
                done, _ = await asyncio.wait(tasks, timeout=self.hedge_after_s)
                if done:
                    return tasks[0].result()
                if self._stuck_behind(first, number):
                    break
            second = self._order(exclude=first)[0]
            self.hedged += 1
            tasks.append(asyncio.ensure_future(self._one(second, tool, arguments, next(self._numbers))))
            pending = set(tasks)
            failure: BaseException | None = None
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task.exception() is None:
                        self.hedge_wins += task is tasks[1]
                        return task.result()
                    if isinstance(task.exception(), ANSWERED):  # the tool's own answer: no other copy will differ
                        raise task.exception()
                    failure = failure or task.exception()
            assert failure is not None
            raise failure
        finally:
            for task in tasks:  # the copy not used: stopped, and its failure (a crash that came after) taken
                task.cancel()
                task.add_done_callback(_taken)

    def close(self) -> None:
        """Close every member at once (each bounded by its shutdown grace periods)."""
        closing = [threading.Thread(target=m.close, name=f"close-{self.name}", daemon=True) for m in self.members]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join()
