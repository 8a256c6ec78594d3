import asyncio
import threading

import pytest

from toolrl.errors import ToolError
from toolrl.tools import ToolCall, ToolExecutor, tool_from_function


def search(query: str, top_k: int = 3, exact: bool = False) -> list[str]:
    """Search the corpus.

    Args:
        query: What to look for.
        top_k: How many results
            to return.
    """
    return [query] * top_k


def test_schema_from_type_hints_and_docstring():
    spec = tool_from_function(search).to_openai()
    assert spec["type"] == "function"
    fn = spec["function"]
    assert fn["name"] == "search" and fn["description"] == "Search the corpus."
    props = fn["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "What to look for."}
    assert props["top_k"] == {"type": "integer", "default": 3, "description": "How many results to return."}
    assert props["exact"]["type"] == "boolean"
    assert fn["parameters"]["required"] == ["query"]


def test_untyped_parameter_is_a_clear_error():
    def bad(x):
        return x

    with pytest.raises(ToolError, match="parameter 'x' needs a type hint"):
        tool_from_function(bad)


def run(coro):
    return asyncio.run(coro)


def test_executor_validates_and_runs():
    ex = ToolExecutor([tool_from_function(search)])
    assert run(ex.invoke(ToolCall("search", {"query": "a", "top_k": "2"}))).content == '["a", "a"]'
    bad = run(ex.invoke(ToolCall("search", {"top_k": 2})))
    assert bad.outcome == "invalid_arguments" and bad.content == "Error: invalid argument: query: Field required"


def test_failures_become_observations_and_metrics():
    def boom(x: int) -> int:
        raise RuntimeError("disk on fire\ntraceback lines")

    async def slow(x: int) -> int:
        await asyncio.sleep(5)
        return x

    ex = ToolExecutor([tool_from_function(boom), tool_from_function(slow)], timeout_s=0.05)
    results = run(ex.invoke_all([ToolCall("boom", {"x": 1}), ToolCall("slow", {"x": 1}), ToolCall("nope", {})]))
    assert [r.content for r in results] == [
        "Error: boom failed: RuntimeError: disk on fire\ntraceback lines",  # its type, its whole message
        "Error: slow timed out after 0.05 s",
        "Error: unknown tool 'nope'; available tools: boom, slow",
    ]
    assert [r.outcome for r in results] == ["tool_error", "timeout", "unknown_tool"]
    assert ex.metrics["errors_tool_error"] == ex.metrics["errors_timeout"] == ex.metrics["errors_unknown_tool"] == 1
    assert (ex.metrics["infra_faults"], ex.metrics["model_errors"]) == (1, 1)


def test_calls_of_a_turn_run_concurrently_and_sync_tools_do_not_block_the_loop():
    # Each synchronous call waits at a barrier that opens only when both calls are inside it at once, and the
    # async call finishes only if the event loop keeps running while the threads wait.
    barrier = threading.Barrier(2, timeout=5)

    def meet(x: int) -> int:
        barrier.wait()
        return x

    async def tick(x: int) -> int:
        for _ in range(3):
            await asyncio.sleep(0.01)
        return x

    ex = ToolExecutor([tool_from_function(meet), tool_from_function(tick)])
    calls = [ToolCall("meet", {"x": 1}), ToolCall("tick", {"x": 2}), ToolCall("meet", {"x": 3})]
    assert [r.content for r in run(ex.invoke_all(calls))] == ["1", "2", "3"]
