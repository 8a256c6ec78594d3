"""Python tools for bench/faults.py, importable by tool worker processes (bench/ is on their import path)."""

import asyncio
import contextlib
import os
import random
import time


def lookup(key: int) -> str:
    """A healthy synchronous tool (runs in a worker process)."""
    return f"value-{key}"


async def fetch(key: int) -> str:
    """A healthy async tool."""
    await asyncio.sleep(0.001)
    return f"fetched-{key}"


def block_hang(key: int) -> str:
    """A blocking call that never returns in time (in a worker process: killed at the deadline)."""
    time.sleep(3600)
    return "never"


def block_hang_thread(key: int) -> str:
    """The same, declared isolation: thread (abandoned at the deadline)."""
    time.sleep(3600)
    return "never"


async def async_hang(key: int) -> str:
    """An async call that never returns in time (cancelled at the deadline)."""
    await asyncio.sleep(3600)
    return "never"


def broken(key: int) -> str:
    """A tool that raises."""
    raise RuntimeError(f"broken on {key}")


def big(key: int) -> str:
    """A 5 MB result."""
    return "z" * (5 * 2**20)


def slow(key: int) -> str:
    """Slow but within the deadline."""
    time.sleep(random.uniform(0.3, 1.5))
    return f"slow-{key}"


def lookup_in_process(key: int) -> str:
    """A healthy blocking tool with the latency bench/tools.py sets in TOOLRL_BENCH_LATENCY (the worker
    processes inherit it), for its worker-process row."""
    time.sleep(float(os.environ.get("TOOLRL_BENCH_LATENCY", "0.2")))
    return f"value-{key}"


async def async_deaf(key: int) -> str:
    """An async call that swallows the cancellation sent at its deadline and carries on."""
    while True:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)


async def async_block(key: int) -> str:
    """An async call that blocks its event loop with a synchronous sleep."""
    time.sleep(3600)
    return "never"


async def async_big(key: int) -> str:
    """A 5 MB result from an async tool."""
    return "a" * (5 * 2**20)
