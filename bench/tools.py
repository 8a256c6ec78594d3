"""Benchmark: the tool executor under concurrent trajectories, against sequential calls and the ideal.

Workload: `--calls` calls to a tool with `--latency` seconds of latency, issued by `--trajectories` concurrent
trajectories (each makes its calls one after another, as a rollout does), for an async tool and for a
synchronous one run in threads (a closure) and in worker processes (an importable function). Sequential: the
same calls one at a time. Ideal: latency x calls / trajectories. Cache: `--calls` calls over 50 distinct
arguments, cache on vs off. MCP: the extra time per call of a stdio MCP server written with the SDK over an
in-process async tool. Prints a table and writes bench/results/tools.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

from common import machine, write_results
from fault_tools import lookup_in_process

from toolrl.tools import ToolCall, ToolExecutor, ToolPolicy, tool_from_function


def make_tools(latency: float):
    async def lookup(key: int) -> str:
        """Async tool with fixed latency."""
        await asyncio.sleep(latency)
        return f"value-{key}"

    def lookup_sync(key: int) -> str:
        """Blocking tool with fixed latency."""
        time.sleep(latency)
        return f"value-{key}"

    os.environ["TOOLRL_BENCH_LATENCY"] = str(latency)  # read by fault_tools.lookup_in_process in the workers
    return [tool_from_function(lookup), tool_from_function(lookup_sync), tool_from_function(lookup_in_process)]


async def concurrent(executor: ToolExecutor, tool: str, calls: int, trajectories: int, distinct: int) -> float:
    async def trajectory(index: int) -> None:
        for i in range(index, calls, trajectories):
            result = await executor.invoke(ToolCall(tool, {"key": i % distinct}))
            assert not result.error, result.content

    start = time.perf_counter()
    await asyncio.gather(*(trajectory(t) for t in range(trajectories)))
    return time.perf_counter() - start


async def sequential(executor: ToolExecutor, tool: str, calls: int) -> float:
    start = time.perf_counter()
    for i in range(calls):
        await executor.invoke(ToolCall(tool, {"key": i}))
    return time.perf_counter() - start


async def mcp_overhead_ms(calls: int = 300) -> float:
    """Per-call cost of a stdio MCP round trip through the executor, minus the same call to a local tool."""
    import sys

    from toolrl.tools.mcp_stdio import MCPStdioServer

    server = MCPStdioServer(
        "bench", sys.executable, [str(Path(__file__).parent.parent / "tests/fixtures/mcp_server.py")]
    )

    async def echo(text: str) -> str:
        return text

    try:
        ex = ToolExecutor([*server.tools(), tool_from_function(echo)])
        timings = {}
        for name in ("bench.echo", "echo"):
            await ex.invoke(ToolCall(name, {"text": "x"}))  # warm up
            start = time.perf_counter()
            for _ in range(calls):
                await ex.invoke(ToolCall(name, {"text": "x"}))
            timings[name] = (time.perf_counter() - start) / calls
    finally:
        server.close()
    return 1000 * (timings["bench.echo"] - timings["echo"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--out", default="bench/results/tools.json")
    args = parser.parse_args()
    n, lat, traj = args.calls, args.latency, args.trajectories
    ideal = lat * n / traj
    tools = make_tools(lat)
    rows = {}
    for name in ("lookup", "lookup_sync", "lookup_in_process"):
        ex = ToolExecutor(tools, max_concurrency=traj)
        cold = asyncio.run(concurrent(ex, name, n, traj, distinct=n))  # first use: threads or workers start
        conc = asyncio.run(concurrent(ex, name, n, traj, distinct=n))  # as in every later rollout step
        seq = asyncio.run(sequential(ex, name, n))
        ex.close()
        rows[name] = {
            "first_use_concurrent_s": round(cold, 3),
            "concurrent_s": round(conc, 3),
            "sequential_s": round(seq, 3),
            "ideal_s": round(ideal, 3),
            "concurrent_vs_sequential": round(seq / conc, 2),
            "concurrent_vs_ideal": round(conc / ideal, 3),
        }
    cached = {}
    for cache in (False, True):
        ex = ToolExecutor(tools, max_concurrency=traj, policies={"lookup": ToolPolicy(cache=cache)})
        cached[cache] = asyncio.run(concurrent(ex, "lookup", n, traj, distinct=50))
        ex.close()
    result = {
        "machine": machine(),
        "workload": {"calls": n, "latency_s": lat, "trajectories": traj},
        "async_tool": rows["lookup"],
        "sync_tool": rows["lookup_sync"],
        "sync_tool_in_worker_processes": rows["lookup_in_process"],
        "cache": {
            "distinct_arguments": 50,
            "uncached_s": round(cached[False], 3),
            "cached_s": round(cached[True], 3),
            "cache_speedup": round(cached[False] / cached[True], 2),
        },
        "mcp_stdio_overhead_ms": round(asyncio.run(mcp_overhead_ms()), 3),
    }
    print(f"{n} calls x {lat * 1000:.0f} ms from {traj} trajectories (ideal {ideal:.2f} s)")
    print(f"{'tool':<18}{'first use s':>13}{'concurrent s':>14}{'sequential s':>14}{'conc/seq':>10}{'conc/ideal':>12}")
    labels = (("async", "lookup"), ("sync (threads)", "lookup_sync"), ("sync (processes)", "lookup_in_process"))
    for label, row in ((label, rows[name]) for label, name in labels):
        print(
            f"{label:<18}{row['first_use_concurrent_s']:>13.2f}{row['concurrent_s']:>14.2f}{row['sequential_s']:>14.2f}"
            f"{row['concurrent_vs_sequential']:>9.1f}x{row['concurrent_vs_ideal']:>12.3f}"
        )
    print(f"MCP stdio overhead per call: {result['mcp_stdio_overhead_ms']:.2f} ms")
    c = result["cache"]
    print(f"cache (50 distinct of {n}): {c['uncached_s']:.2f} s -> {c['cached_s']:.2f} s, {c['cache_speedup']:.1f}x")
    write_results(args.out, result)


if __name__ == "__main__":
    main()
