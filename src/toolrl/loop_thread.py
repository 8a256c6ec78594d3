"""An event loop of its own on a daemon thread, for clients that must live on one loop for their whole life
(an MCP session, vLLM's AsyncLLM) while the rollouts calling them each run on a loop of their own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule `coro` on this loop, from any thread; wait with `.result()` or `await wrap_future(...)`."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro` run on this loop, from a coroutine running on another loop."""
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout_s: float = 5.0) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
