"""all_or_none: the results in order, or the first failure after the others were cancelled (asyncio.gather would
leave them running after the caller moved on)."""

import asyncio

import pytest

from toolrl.aio import all_or_none, result_or_line
from toolrl.errors import ConfigError


def test_results_in_order_or_the_failure_with_the_others_cancelled():
    cancelled = []

    async def value(v, delay):
        await asyncio.sleep(delay)
        return v

    async def forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def broken():
        await asyncio.sleep(0)
        raise ValueError("broken")

    assert asyncio.run(all_or_none([value(1, 0.02), value(2, 0)])) == [1, 2]
    with pytest.raises(ValueError, match="broken"):
        asyncio.run(all_or_none([forever(), broken()]))
    assert cancelled == [True]


def test_a_task_that_loses_its_cancellation_is_cancelled_again():
    """As asyncio.wait_for on Python 3.11 can (its inner result and the cancellation at once): the task swallows
    the first cancellation and waits on; it is cancelled again, and the failure propagates at once."""
    swallowed = []

    async def deaf():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed.append(True)
        await asyncio.sleep(600)  # a partner that will never come

    async def broken():
        await asyncio.sleep(0)
        raise ValueError("broken")

    async def timed():
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ValueError, match="broken"):
            await all_or_none([deaf(), broken()])
        return loop.time() - started

    assert asyncio.run(timed()) < 60 and swallowed == [True]


def test_a_failure_is_its_line_and_a_config_error_propagates():
    async def fails():
        raise ConnectionError("user model unreachable\nat http://127.0.0.1:9")

    async def misconfigured():
        raise ConfigError("env.options.wait_s: too short")

    async def fine():
        return 7

    assert asyncio.run(result_or_line(fine())) == 7
    assert asyncio.run(result_or_line(fails())) == "user model unreachable"
    with pytest.raises(ConfigError, match="wait_s"):
        asyncio.run(result_or_line(misconfigured()))
