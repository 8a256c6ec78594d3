"""Per-tool call policy and the rate limiter that enforces calls per second."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


class TransientToolError(Exception):
    """Raised by a tool for a failure worth retrying (a dropped connection, a busy server)."""


TRANSIENT = (TransientToolError, ConnectionError, TimeoutError)
"""Failures retried with backoff; anything else (bad arguments, a tool's own error) is answered at once."""


@dataclass(frozen=True)
class ToolPolicy:
    timeout_s: float = 10.0
    """Per attempt. A call that runs into it is answered at once, not retried."""
    retries: int = 2
    """Extra attempts after a transient failure, with exponential backoff."""
    backoff_s: float = 0.5
    """First backoff; doubles on each retry."""
    max_concurrency: int | None = None
    """Calls of this tool in flight at once; None means only the executor's global limit applies."""
    rate_per_s: float | None = None
    """Calls of this tool started per second; None means unlimited."""
    cache: bool = False
    """Opt-in: only pure tools (same arguments, same result) should be cached."""


class RateLimiter:
    """Spaces call starts at least 1/rate seconds apart; callers wait their turn in order."""

    def __init__(self, rate_per_s: float):
        self.interval = 1.0 / rate_per_s
        self._next = 0.0
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:
            now = time.monotonic()
            wait = self._next - now
            self._next = max(now, self._next) + self.interval
        if wait > 0:
            await asyncio.sleep(wait)
