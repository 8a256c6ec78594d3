"""A command server runs as a pool of processes (tools/mcp_pool.py): a healthy call never fails because a sibling
call froze or crashed its server process. Shown against one process, where the same calls fail: a call that
blocks the server's event loop holds up every call in that process, and a crash holds them up for a restart."""

import asyncio
import gc
import time

import pytest

from tests.fixtures import mcp_server_entry, write_tool_config
from toolrl.config.schema import ToolsConfig
from toolrl.tools import ToolCall
from toolrl.tools.toolset import run_executor


def executor_for(tmp_path, processes: int, *extra_args: str, hedge: float | None = 0.3, **more):
    entry = mcp_server_entry("add", "freeze", "crash", "note", processes=processes, hedge_after_s=hedge, **more)
    entry["args"] += list(extra_args)
    config = write_tool_config(tmp_path / f"tools-{processes}.json", {"srv": entry})
    return run_executor([], ToolsConfig(file=str(config), timeout_s=2.0, max_concurrency=32), tmp_path)


def healthy_beside(executor, fault: ToolCall, calls: int = 12) -> list[str]:
    async def scenario():
        blocker = asyncio.ensure_future(executor.invoke(fault))
        await asyncio.sleep(0.3)
        results = await asyncio.gather(*(executor.invoke(ToolCall("srv.add", {"a": i, "b": 1})) for i in range(calls)))
        await blocker
        return [r.outcome for r in results]

    return asyncio.run(scenario())


def wait_until_up(toolset, seconds: float = 60.0) -> None:
    server = toolset.servers["srv"]
    members = getattr(server, "members", [server])
    deadline = time.monotonic() + seconds
    while not all(m.up for m in members) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(m.up for m in members)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_frozen_sibling_fails_the_healthy_calls_of_one_process_and_none_of_a_pool(tmp_path, processes):
    executor, toolset = executor_for(tmp_path, processes)
    try:
        wait_until_up(toolset)
        outcomes = healthy_beside(executor, ToolCall("srv.freeze", {"seconds": 4}))
        if processes == 1:
            assert outcomes.count("unknown") == len(outcomes)  # why the pool is the default (sent: may yet run)
        else:
            assert outcomes == ["ok"] * len(outcomes), outcomes
    finally:
        toolset.close()


@pytest.mark.parametrize("processes", [1, 2])
def test_a_crashing_sibling_fails_no_healthy_call_of_a_pool(tmp_path, processes):
    executor, toolset = executor_for(tmp_path, processes, "--slow-start", "3")  # a restart outlasts the deadline
    try:
        wait_until_up(toolset)
        outcomes = healthy_beside(executor, ToolCall("srv.crash", {"marker": str(tmp_path / "crashed")}))
        assert (tmp_path / "crashed").read_text() == "ran\n"
        if processes == 1:
            assert "ok" not in outcomes
        else:
            assert outcomes == ["ok"] * len(outcomes), outcomes
    finally:
        toolset.close()


def test_a_call_not_safe_to_repeat_is_never_sent_twice(tmp_path):
    executor, toolset = executor_for(tmp_path, 2, hedge=0.05)
    marker = tmp_path / "notes"
    try:
        wait_until_up(toolset)

        async def notes():
            return await asyncio.gather(
                *(executor.invoke(ToolCall("srv.note", {"marker": str(marker), "text": f"n{i}"})) for i in range(20))
            )

        assert all(r.outcome == "ok" for r in asyncio.run(notes()))
        assert sorted(marker.read_text().split()) == sorted(f"n{i}" for i in range(20))  # each ran once
        assert toolset.servers["srv"].hedged == 0
    finally:
        toolset.close()


@pytest.mark.parametrize("where", ["tool", "server", "hints"])
def test_the_user_s_retry_false_wins_over_the_server_s_hints_for_copies_too(tmp_path, where):
    """Issue 72: `retry: false` in the config (on a tool or on its server) was ignored by the pool in favour of the
    server's readOnlyHint/idempotentHint (58 of 72 appends ran twice). `add` claims readOnlyHint here; a frozen
    sibling makes its calls wait: copied to the other process only where the config leaves it to the hints."""
    more = {"tool": {"policies": {"add": {"retry": False}}}, "server": {"policy": {"retry": False}}, "hints": {}}
    executor, toolset = executor_for(tmp_path, 2, hedge=0.05, **more[where])
    try:
        wait_until_up(toolset)
        pool = toolset.servers["srv"]
        assert pool._safe["add"] is (where == "hints")
        outcomes = healthy_beside(executor, ToolCall("srv.freeze", {"seconds": 3}))
        if where == "hints":
            assert pool.hedged > 0 and outcomes == ["ok"] * len(outcomes)
        else:
            assert pool.hedged == 0  # never sent twice: the calls behind the frozen one wait, then are unknown
            assert set(outcomes) <= {"ok", "unknown"}
    finally:
        toolset.close()


class _Member:
    """A stand-in server process: answers after `delay` s with `value`; stopped meanwhile, raises `fails` (as a
    client that finds its server gone while it cancels the request)."""

    def __init__(self, delay: float, value: str = "", fails: BaseException | None = None):
        self.delay, self.value, self.fails, self.up, self.connections = delay, value, fails, True, 1

    async def call(self, tool, arguments):
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            if self.fails is not None:
                raise self.fails from None
            raise
        return self.value


def test_a_copy_that_crashes_after_the_other_answered_is_not_an_unretrieved_exception():
    """A hedged call: the first process stuck behind an older call, the copy answers, and the first, stopped, fails
    (its server crashed). The answer is the copy's and asyncio never prints a 'Task exception was never
    retrieved' (seen once in a 10,000-call faults run)."""
    from toolrl.tools.limits import ServerCrashed
    from toolrl.tools.mcp_pool import MCPServerPool

    members = [_Member(30, fails=ServerCrashed("crashed")), _Member(0.0, "copy")]
    pool = MCPServerPool("m", lambda i: members[i], 2, hedge_after_s=0.05)
    pool._safe = {"t": True}
    unretrieved = []

    async def run():
        gc.collect()  # what earlier tests in this worker left (an MCP client's httpx2 task) is theirs, not the pool's
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        pool.sent[0][-1] = time.monotonic()  # an older call in flight on the first, with no answer since
        pool.answered_at[0] = time.monotonic() - 1
        pool.sent[1].update({-2: 0.0, -3: 0.0})  # the other with more in flight: the first is tried first
        answer = await pool.call("t", {})
        await asyncio.sleep(0.1)  # the first copy, stopped, fails meanwhile
        gc.collect()
        return answer

    assert asyncio.run(run()) == "copy" and pool.hedge_wins == 1
    assert not unretrieved, unretrieved
