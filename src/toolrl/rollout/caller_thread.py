"""A rollout's engine steps on the thread that started it, and its event loop on a helper thread.

PyTorch's CPU threads are GNU OpenMP's, which keeps a pool of threads for each thread that opens a parallel region.
While the process holds more such threads than the machine has cores, an idle pool thread spins ~100 times
instead of ~300,000 before it sleeps (libgomp's throttled spin count), so that every parallel region waits on the
kernel to wake its threads. A trainer held two pools: the main thread's (the update, the optimizer, loading) and
the engine's worker thread's (each decode step). On the 2-core machine a decode step of 16 rows then took 79-83
ms instead of 55-57, and a flash-attention call of decode size 106 us instead of 39 (bench/caller_thread.py).

So while `CallerThread.run` lasts, the engine's steps run on the calling thread, the one that already does the
process's compute, and the coroutine (the rollout: tool calls, rewards, parsing) on an event loop of its own on a
helper thread. Steps asked for after it ends, or by another caller meanwhile, go to the engine's own worker as
before."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Coroutine
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")

ON_CALLER = True
"""False: the steps run on the engine's worker thread even within `run` (the layout before; the benchmark's A/B)."""


class CallerThread(Executor):
    """An executor whose calls run on the thread inside `run`; outside it, on `fallback`."""

    def __init__(self, fallback: Executor):
        self.fallback = fallback
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._serving = False
        self.served = 0
        """Calls run on the calling thread so far."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        with self._lock:
            if not self._serving:
                return self.fallback.submit(fn, *args, **kwargs)
            future: Future = Future()
            self._jobs.put((future, fn, args, kwargs))
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.fallback.shutdown(wait=wait, cancel_futures=cancel_futures)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """`asyncio.run(coro)` on a helper thread while this thread runs the calls submitted meanwhile; its result,
        or its exception raised here. While another thread serves, plain `asyncio.run(coro)`. An interrupt here
        (Ctrl-C) cancels the coroutine and is raised again once the helper thread has ended."""
        outcome: dict[str, Any] = {}
        started = threading.Event()

        async def main() -> T:
            outcome["loop"], outcome["task"] = asyncio.get_running_loop(), asyncio.current_task()
            started.set()
            return await coro

        def on_helper() -> None:
            try:
                outcome["value"] = asyncio.run(main())
            except BaseException as exc:  # raised again on the calling thread
                outcome["error"] = exc
            finally:
                started.set()
                self._jobs.put(None)

        with self._lock:
            plain = self._serving or not ON_CALLER  # another thread serves: this rollout's steps go there
            self._serving = True if not plain else self._serving
        if plain:
            return asyncio.run(coro)
        helper = threading.Thread(target=on_helper, name="toolrl-rollout-loop", daemon=True)
        helper.start()
        try:
            while (job := self._jobs.get()) is not None:
                self._run(job)
        except BaseException:
            started.wait()
            if "task" in outcome:
                outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
            raise
        finally:
            self._stop_serving()
            helper.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def _run(self, job) -> None:
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            return
        self.served += 1
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
            if not isinstance(exc, Exception):  # an interrupt: `run` stops the coroutine
                raise

    def _stop_serving(self) -> None:
        """Calls queued and not begun go to the fallback, as do later ones."""
        with self._lock:
            self._serving = False
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                future, fn, args, kwargs = job
                if future.set_running_or_notify_cancel():
                    _chain(self.fallback.submit(fn, *args, **kwargs), future)


def _chain(source: Future, target: Future) -> None:
    def copy(done: Future) -> None:
        if done.exception() is not None:
            target.set_exception(done.exception())
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)
