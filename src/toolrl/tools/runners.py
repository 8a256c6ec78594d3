"""Where a synchronous tool runs, stopped or abandoned at its deadline without holding capacity.

`ProcessRunner`: worker processes (tools/worker.py), one call each at a time, started as needed and reused;
a call that overruns its deadline gets its worker's whole process group killed, and a new worker serves the
next call. A worker's first call of a function imports its module under a budget of its own (`import_timeout_s`);
the call's deadline counts from the import's end, so a tool in a slow-to-import module is not a timeout. A killed
worker is replaced at once by a spare that imports the same functions while nothing waits for it, so the call
after a hung one does not pay for a start. A worker that dies during a call (a crash, `os._exit`) is reported as
`ServerCrashed`.

`ThreadRunner`: daemon threads, one per call in flight, started as needed and reused. A thread cannot be
stopped, so a call that overruns is abandoned: its slot is free at once and the next call gets another thread,
but the hung one runs on until its function returns (and never delays the process's exit). Meant for tools
known to return; anything else belongs in a process.

`AsyncRunner`: async tools, each call on an event loop of its own thread (threads reused, one call at a time),
never on the caller's loop: a tool that blocks its loop with a synchronous sleep, or swallows the cancellation
sent at its deadline, holds only its own thread, which is abandoned like a hung one, while the rollout's loop
and every other call go on (and `asyncio.run` of the rollout never waits for it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from toolrl.tools.limits import (
    InvalidArguments,
    ServerCrashed,
    ServerUnavailable,
    ToolFailed,
    TransientToolError,
    exception_text,
)
from toolrl.tools.worker import read_frame, write_frame

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("worker.py")
IMPORT_TIMEOUT_S = 120.0
"""How long a worker may take to import a tool's module, before (and besides) the call's own deadline."""
ABANDONED_WARNING = 16
"""Hung threads past which each new one is logged as a warning (their tool should run in a process)."""


class DeadlineExceeded(Exception):
    """A call ran past its deadline and was stopped (process) or abandoned (thread, coroutine)."""


async def _wait(future: concurrent.futures.Future, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), max(timeout, 0.0))
    except (asyncio.TimeoutError, TimeoutError):  # distinct classes before 3.11
        raise DeadlineExceeded from None


class ThreadRunner:
    def __init__(self, name: str = "toolrl-tool", advice: str = "run such tools with isolation: process"):
        self.name, self.advice = name, advice
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0
        self.abandoned = 0
        """Calls that overran their deadline; their threads may still be running."""

    def _loop(self) -> None:
        while True:
            fn, kwargs, future = self._queue.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(**kwargs))
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1

    def _submit(self, fn: Callable[..., Any], kwargs: dict[str, Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._threads += 1
                threading.Thread(target=self._loop, name=f"{self.name}-{self._threads}", daemon=True).start()
        self._queue.put((fn, kwargs, future))
        return future

    async def run(self, fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
        future = self._submit(fn, kwargs)
        try:
            return await _wait(future, timeout)
        except DeadlineExceeded:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Count a call left running past its deadline; warn at 16, 32, 64..."""
        self.abandoned += 1
        if self.abandoned >= ABANDONED_WARNING and self.abandoned & (self.abandoned - 1) == 0:
            log.warning(
                "%d tool calls overran their deadline in threads, which cannot be stopped; %s",
                self.abandoned,
                self.advice,
            )


_thread_loop = threading.local()


def _run_on_thread_loop(fn: Callable[..., Any], kwargs: dict[str, Any], handle: concurrent.futures.Future) -> Any:
    """Run coroutine function `fn` to completion on this thread's own event loop; `handle` receives the loop
    and the task, so that the caller can cancel it from its own thread."""
    loop = getattr(_thread_loop, "loop", None)
    if loop is None:
        loop = _thread_loop.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    task = loop.create_task(fn(**kwargs))
    handle.set_result((loop, task))
    return loop.run_until_complete(task)


class AsyncRunner:
    def __init__(self) -> None:
        self.threads = ThreadRunner(
            "toolrl-async-tool",
            "an async tool that blocks its loop or ignores cancellation keeps a thread: make it await, or make it "
            "a synchronous tool (isolation: process)",
        )

    @property
    def abandoned(self) -> int:
        """Calls whose coroutine did not end when cancelled at the deadline (or blocked its loop)."""
        return self.threads.abandoned

    async def run(self, fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
        handle: concurrent.futures.Future = concurrent.futures.Future()
        future = self.threads._submit(_run_on_thread_loop, {"fn": fn, "kwargs": kwargs, "handle": handle})
        try:
            return await _wait(future, timeout)
        except DeadlineExceeded:
            self.threads.abandon()
            if handle.done():  # cancel the coroutine; one that ignores it keeps only its own thread
                loop, task = handle.result()
                with contextlib.suppress(RuntimeError):  # its loop already closed
                    loop.call_soon_threadsafe(task.cancel)
            raise
        except asyncio.CancelledError:  # the caller gave up (its own deadline, or the rollout's end)
            if handle.done():
                loop, task = handle.result()
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(task.cancel)
            raise


class _Worker:
    """One worker process and the thread that reads its replies."""

    def __init__(self, log_file: BinaryIO | int):
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,  # its own process group: a kill reaches whatever it started
        )
        self.pending: concurrent.futures.Future | None = None
        self.ready: concurrent.futures.Future | None = None
        self.targets: set[str] = set()
        """Functions this worker was asked to import (for a spare that replaces it)."""
        self.preloaded: set[str] = set()
        """Functions it imported before any call asked for them."""
        self._send(pickle.dumps(sys.path))
        threading.Thread(target=self._read, name=f"toolrl-worker-{self.process.pid}", daemon=True).start()

    def _send(self, data: bytes) -> None:
        write_frame(self.process.stdin, data)

    def _frames(self):
        """The worker's replies until its stdout ends, or is closed under the reader by `kill`."""
        while True:
            try:
                frame = read_frame(self.process.stdout)
            except (ValueError, OSError):  # closed by kill() while read: the end, as an EOF is
                return
            if frame is None:
                return
            yield frame

    def _read(self) -> None:
        for frame in self._frames():
            reply = json.loads(frame.decode("utf-8", "surrogatepass"))
            if "preloaded" in reply:
                self.preloaded.add(reply["preloaded"])
                continue
            if self.ready is not None and not self.ready.done():
                self.ready.set_result(None)  # imported (or an answer without it: an import that failed)
            if reply != {"ready": True} and self.pending is not None and not self.pending.done():
                self.pending.set_result(reply)
        code = self.process.wait()
        crashed = ServerCrashed(f"the tool's worker process died during the call (exit {code})")
        for future in (self.ready, self.pending):
            if future is not None and not future.done():
                future.set_exception(crashed)

    def preload(self, targets: set[str]) -> None:
        """Import `targets` before any call asks (a call sent meanwhile waits behind it, its deadline not begun)."""
        for target in sorted(targets):
            self.targets.add(target)
            self._send(pickle.dumps((target, None)))

    def call(self, target: str, kwargs: dict[str, Any]) -> tuple[concurrent.futures.Future, concurrent.futures.Future]:
        """Send one call: (ready, reply), ready once `target` is imported and the call begins."""
        self.pending, self.ready = concurrent.futures.Future(), concurrent.futures.Future()
        self.targets.add(target)
        try:
            self._send(pickle.dumps((target, kwargs)))
        except (BrokenPipeError, OSError) as exc:
            self.kill()
            raise ServerUnavailable(f"the tool's worker process is gone ({exc})") from None
        return self.ready, self.pending

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        for pipe in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


_ERRORS: dict[str, type[Exception]] = {
    "invalid": InvalidArguments,
    "transient": TransientToolError,
    "unavailable": ServerUnavailable,
    "crashed": ServerCrashed,
    "failed": ToolFailed,
}


class ProcessRunner:
    def __init__(self, log_path: Path | None = None, import_timeout_s: float = IMPORT_TIMEOUT_S):
        self.log_path = log_path
        self.import_timeout_s = import_timeout_s
        self._log_file: BinaryIO | None = None
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.started = 0
        self.killed = 0

    def _log(self) -> BinaryIO | int:
        if self.log_path is None:
            return subprocess.DEVNULL
        if self._log_file is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115  (kept open for every worker's stderr)
        return self._log_file

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                worker = self._idle.pop()
                if worker.process.poll() is None:
                    self._busy.add(worker)
                    return worker
            log_file = self._log()
        worker = _Worker(log_file)
        with self._lock:
            self.started += 1
            self._busy.add(worker)
        return worker

    def _put_back(self, worker: _Worker, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if healthy:
                self._idle.append(worker)
                return
            self.killed += 1
            closed = self._closed
        worker.kill()
        if not closed:
            self._start_spare(worker.targets)

    def _start_spare(self, targets: set[str]) -> None:
        """A worker in place of a killed one, importing what it had, idle until a call takes it."""
        try:
            spare = _Worker(self._log())
            spare.preload(targets)
        except OSError as exc:  # no process to spare now: the next call starts one as usual
            log.warning("could not start a spare tool worker: %s", exc)
            return
        with self._lock:
            self.started += 1
            if self._closed:
                spare.kill()
                return
            self._idle.append(spare)

    async def run(
        self, target: str, kwargs: dict[str, Any], timeout: float, on_ready: Callable[[float], None] | None = None
    ) -> str | list[Any]:
        """Run one call; `timeout` counts from when the worker is ready (started, the function imported), and
        `on_ready` is told how long that took."""
        worker = self._take()
        healthy = False
        try:
            sent = time.monotonic()
            ready, answer = worker.call(target, kwargs)
            try:
                await _wait(ready, self.import_timeout_s)
                if on_ready is not None:
                    on_ready(time.monotonic() - sent)
            except DeadlineExceeded:
                module = target.partition(":")[0]
                raise ToolFailed(
                    f"importing {module} took over {self.import_timeout_s:g} s (tools.import_timeout_s)"
                ) from None
            reply = await _wait(answer, timeout)
            healthy = True
        finally:
            self._put_back(worker, healthy)
        if "parts" in reply:  # text and images (as base64), checked by the executor
            return reply["parts"]
        if "ok" in reply:
            return reply["ok"]
        if reply["error"] == "raised":  # the tool's own exception, named as the worker saw it
            raise ToolFailed(exception_text(reply.get("type", "Exception"), reply["message"]))
        raise _ERRORS.get(reply["error"], RuntimeError)(reply["message"] or reply.get("type", "error"))

    def close(self) -> None:
        """Kill every worker, busy or idle."""
        with self._lock:
            self._closed = True
            workers = [*self._idle, *self._busy]
            self._idle, self._busy = [], set()
        for worker in workers:
            worker.kill()
        for worker in workers:
            try:
                worker.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                log.warning("tool worker %d did not exit after SIGKILL", worker.process.pid)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
