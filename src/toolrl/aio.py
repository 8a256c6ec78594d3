"""asyncio helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from toolrl.errors import ConfigError
from toolrl.text import first_line

RECANCEL_S = 0.05
"""How often all_or_none cancels again a task that is still running after it was cancelled."""


async def all_or_none(coroutines: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Their results in order; when one raises, the others are cancelled (and waited for) before it propagates,
    so that nothing of them runs on after the caller has moved on (asyncio.gather leaves them running).

    A task may lose a cancellation: on Python 3.11, `asyncio.wait_for` returns the inner result and drops the
    cancellation when both arrive at once (a tool's thread that finishes as the rollout fails; CPython
    gh-86296). Such a task would run on to its next wait (a seat waiting minutes for a partner that is gone), so
    a task still running is cancelled again until it ends."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        running = set(tasks)
        while running:
            for task in running:
                task.cancel()
            _, running = await asyncio.wait(running, timeout=RECANCEL_S)
        for task in tasks:  # retrieved: no "exception was never retrieved" for the others' failures
            if not task.cancelled():
                task.exception()
        raise


async def result_or_line(awaitable: Any) -> Any:
    """The awaitable's result, or the one line of its failure as a str (a user whose model is down fails its own
    trajectory); a ConfigError propagates (the run's configuration is wrong, not this call)."""
    try:
        return await awaitable
    except ConfigError:
        raise
    except Exception as exc:
        return first_line(exc) or type(exc).__name__
