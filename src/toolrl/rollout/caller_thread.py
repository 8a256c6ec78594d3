"""A rollout's engine steps on the thread that started it, and its event loop on a helper thread.

PyTorch's CPU threads are GNU OpenMP's, which keeps a pool of threads for each thread that opens a parallel region.
While the process holds more such threads than the machine has cores, an idle pool thread spins ~100 times
instead of ~300,000 before it sleeps (libgomp's throttled spin count), so that every parallel region waits on the
kernel to wake its threads. A trainer held two pools: the main thread's (the update, the optimizer, loading) and
the engine's worker thread's (each decode step). On the 2-core machine a decode step of 16 rows then took 79-83
ms instead of 55-57, and a flash-attention call of decode size 106 us instead of 39 (bench/kernels/caller_thread.py).

So while `CallerThread.run` lasts, the engine's steps run on the calling thread, the one that already does the
process's compute, and the coroutine (the rollout: tool calls, rewards, parsing) on an event loop of its own on a
helper thread. Steps asked for after it ends, or by another caller meanwhile, go to the engine's own worker as
before.

Not on a busy machine: with one pool its threads spin ~3 ms at each barrier, and when another process holds one
of the cores, a thread spinning for a descheduled sibling burns the time that sibling needs. Beside a `make test`
(load ~4 on 2 cores) the same GRPO step took 75 s with one pool against 18 s with two. So each `run` first looks
at how much of this process's CPUs other processes used over BUSY_PROBE_S (/proc/stat less this process's own
time; one look serves the runs of the next BUSY_REUSE_S): from BUSY_SHARE on, the steps go to the worker thread,
as before."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

ON_CALLER: bool | None = None
"""None: on the caller unless the machine is busy (`others_share`); True or False: always or never (the
benchmark's A/B)."""
BUSY_PROBE_S = 0.1
BUSY_SHARE = 0.25
"""The share of this process's CPUs that other processes' work must take for the machine to count as busy."""


def _ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(busy ticks of `cpus` from /proc/stat, this process's own ticks), or None where they cannot be read."""
    try:
        busy = 0
        for line in Path("/proc/stat").read_text().splitlines():
            name, *values = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                ticks = [int(v) for v in values[:8]]
                busy += sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return busy, int(own[11]) + int(own[12])  # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def others_share(probe_s: float = BUSY_PROBE_S) -> float | None:
    """The share of this process's CPUs that other processes kept busy over `probe_s` (None: not measurable)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    before = _ticks(cpus)
    if not cpus or before is None:
        return None
    time.sleep(probe_s)
    after = _ticks(cpus)
    if after is None:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others / (hz * probe_s * len(cpus)))


BUSY_REUSE_S = 5.0
"""A look at the machine is reused by the rollouts that start within this many seconds of it (an evaluation's
batches, a test's rollouts), rather than each waiting BUSY_PROBE_S."""
_looked: list[tuple[float, bool]] = []


def on_caller() -> bool:
    """Whether a rollout's steps run on its caller: ON_CALLER, else whether PyTorch runs more than one thread and
    the machine is quiet."""
    if ON_CALLER is not None:
        return ON_CALLER
    import torch

    if torch.get_num_threads() < 2:  # one OpenMP thread (torchrun's ranks): no pool to share, nothing to gain
        return False
    if _looked and time.monotonic() - _looked[0][0] < BUSY_REUSE_S:
        return _looked[0][1]
    share = others_share()
    quiet = share is None or share < BUSY_SHARE
    if not quiet:
        log.debug("other processes used %.0f%% of this process's CPUs: the steps go to the worker", 100 * share)
    _looked[:] = [(time.monotonic(), quiet)]
    return quiet


class CallerThread(Executor):
    """An executor whose calls run on the thread inside `run`; outside it, on `fallback`."""

    def __init__(self, fallback: Executor):
        self.fallback = fallback
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._serving = False
        self.served = 0
        """Calls taken up by the calling thread so far."""
        self.on_worker = 0
        """Rollouts whose steps went to the worker because the machine was busy (or ON_CALLER said so)."""

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
        if not on_caller():  # a busy machine: the worker thread, as before
            self.on_worker += 1
            return asyncio.run(coro)
        with self._lock:
            plain = self._serving  # another thread serves: this rollout's steps go there
            self._serving = True
        if plain:
            return asyncio.run(coro)
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

        helper = threading.Thread(target=on_helper, name="toolrl-rollout-loop", daemon=True)
        helper.start()
        try:
            while (job := self._jobs.get()) is not None:
                self.served += 1
                self._run(job)
        except BaseException:
            started.wait()
            if "task" in outcome:  # the interrupt may have ended the coroutine, and closed its loop, already
                with contextlib.suppress(RuntimeError):
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
                self.fallback.submit(self._run, job)
