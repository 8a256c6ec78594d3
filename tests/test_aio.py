"""all_or_none: the results in order, or the first failure after the others were cancelled (asyncio.gather would
leave them running after the caller moved on)."""

import asyncio

import pytest

from toolrl.aio import all_or_none


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
