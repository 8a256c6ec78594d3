"""Per-tool call policy, the failures a tool may signal, and the rate limiter that enforces calls per second."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Literal

Isolation = Literal["process", "thread", "loop", "inline"]


class TransientToolError(Exception):
    """Raised by a tool for a failure worth retrying (a dropped connection, a busy server). It is retried only
    when the tool is safe to repeat (its policy's `retry`), since the failed attempt may have had effects."""


class ServerUnavailable(TransientToolError):
    """The call never reached the tool (its server is down or refused the connection): always safe to retry."""


class NotDelivered(ServerUnavailable):
    """The server ended without reading the call: it never ran, and goes to the restarted server at once."""


class ServerCrashed(TransientToolError):
    """The tool's server (or worker process) died while the call was in flight: it may or may not have run."""


def exception_text(kind: str, message: str) -> str:
    """An exception as the last line of Python's traceback shows it: 'Type: message', or the type alone."""
    return f"{kind}: {message}" if message else kind


class ToolFailed(Exception):
    """A tool's failure in words meant for the model, as they are: its server's error text, a worker's exception
    already named by its type, the code sandbox's traceback. (Any other exception a tool raises is shown as its
    type and message, as Python shows it.)"""


class InvalidArguments(ValueError):
    """The arguments do not fit the tool's schema; the message names each field and what is wrong with it."""


TRANSIENT = (TransientToolError, ConnectionError, TimeoutError)
"""Failures retried with backoff when the tool is safe to repeat; anything else (bad arguments, a tool's own
error) is answered at once."""


@dataclass(frozen=True)
class ToolPolicy:
    timeout_s: float = 10.0
    """The call's deadline, counted from when it starts (its concurrency slot taken): attempts, retries, backoff
    and reconnects all fit inside it. A call that runs into it is answered at once."""
    retries: int = 2
    """Extra attempts after a transient failure, with exponential backoff, for tools that are safe to repeat."""
    backoff_s: float = 0.5
    """First backoff; doubles on each retry."""
    retry: bool | None = None
    """Whether the tool is safe to repeat after a failure that may have reached it; None: the tool's own
    declaration (MCP readOnlyHint/idempotentHint, the HTTP method, `tool_from_function(idempotent=...)`)."""
    isolation: Isolation | None = None
    """Where a synchronous tool runs: process (a worker process, killed on timeout) or thread (for tools known to
    return); an async one: loop (an event loop on a thread of its own, so that blocking it or ignoring the
    cancellation holds nothing else) or inline (the caller's loop, for a tool bound to it). None: the tool's
    own setting."""
    max_concurrency: int | None = None
    """Calls of this tool in flight at once; None means only the executor's global limit applies."""
    rate_per_s: float | None = None
    """Calls of this tool started per second; None means unlimited."""
    cache: bool = False
    """Opt-in: only pure tools (same arguments, same result) should be cached."""


class RateLimiter:
    """Spaces call starts at least 1/rate seconds apart; callers wait their turn in order. Each turn counts from
    the moment the one before it woke, not from when it was due: a caller woken late (a busy machine) had let the
    next start a few ms after it, a burst over the rate at the API (CI: 5 starts at 20/s spanned 188 ms)."""

    def __init__(self, rate_per_s: float):
        self.interval = 1.0 / rate_per_s
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            wait = self._next - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._next = time.monotonic() + self.interval
