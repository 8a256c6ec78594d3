"""asyncio helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any


async def all_or_none(coroutines: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Their results in order; when one raises, the others are cancelled (and waited for) before it propagates,
    so that nothing of them runs on after the caller has moved on (asyncio.gather leaves them running)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
