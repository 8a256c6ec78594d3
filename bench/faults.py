"""Benchmark: tool faults under rollout-like concurrency. 64 trajectories make >= 10,000 calls, one after
another each, to healthy tools and, for 20% of the calls, to faulty ones: Python tools that hang blocking (in
a worker process, and declared thread), hang async, swallow the cancellation, block their event loop with a
synchronous sleep, raise, return 5 MB (from a process and from an async tool) or are slow; an MCP server's
tools that hang, crash the server, return 5 MB or are slow, served by a pool of 2 server processes (the default,
tools/mcp_pool.py). Deadline 3 s per call. The load average at the start and end is recorded: run it beside
`make test` (TOOLRL_BENCH_BESIDE says what ran beside it), as the committed result was.

Keys (goal): calls, hung (calls past their deadline + 0.5 s: 0; the deadline counts the tool's own time, after a
worker process started and imported it, which setup_max_s reports; apart from hung_starved, those that overran while
some task waited for a CPU half their time or more, each with that share), uncounted (calls whose outcome the
metrics miss: 0), healthy_failed (calls to healthy tools that did not succeed: 0; apart from healthy_starved, those
that failed while some task waited for a CPU half their time or more, each with that share), leaked_processes (left
after close: 0), crash_executions_per_call (how often a call that crashes its server ran, over those that ran: 1.0;
with crash_max_executions and crash_calls_never_run beside it), exit_s (from the end of the work to the process's
exit, hung tools and all: <= 5, or exit_starved: the CPU pressure over it when half its time or more; exit_parts_s:
the executor's and toolset's close), mcp_5mb_alone_max_s (a 5 MB result over MCP stdio, alone: < 1 s).
Then beside_a_crash: rounds of 200 calls to a tool with a side effect (not safe to repeat) with one call
that crashes the server among them: none runs twice, every one answered ok ran once, every one lost failed
as server_crashed (lost_ran: how many of those the server ran before dying). The work runs in a child
process so that its exit can be timed. Prints a table and writes bench/results/faults.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine, write_results

ROOT = Path(__file__).resolve().parents[1]
MCP_SERVER = ROOT / "tests" / "fixtures" / "mcp_server.py"
TIMEOUT_S = float(os.environ.get("TOOLRL_FAULTS_TIMEOUT_S", "3"))
"""Every call's deadline (--timeout; the child process reads it from the environment the parent sets)."""
TRAJECTORIES = 64
STARVED_SHARE = 0.5
"""A healthy call that failed while some task waited for a CPU at least this share of its time (Linux's pressure
stall information, /proc/pressure/cpu) was late because the machine was starved: counted apart, with the share."""


def cpu_stall_us() -> int | None:
    """Microseconds in which some task waited for a CPU, since boot (None where the kernel does not say)."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(line.rsplit("total=", 1)[1])


def starved_reason(stall_us: int | None, latency_s: float) -> str | None:
    """Why a failed healthy call counts as starved (the CPU pressure over its own time), or None."""
    if stall_us is None or latency_s <= 0:
        return None
    share = stall_us / 1e6 / latency_s
    return f"CPU pressure {min(share, 1.0):.0%} of its {latency_s:.1f} s" if share >= STARVED_SHARE else None


MCP_PROCESSES = int(os.environ.get("TOOLRL_FAULTS_MCP_PROCESSES", "2"))
"""The MCP server's pool size (--mcp-processes; 2 is the default of a command server)."""

# (tool, arguments, share of all calls, outcome expected)
MIX = [
    ("py.lookup", {}, 0.30, "ok"),
    ("py.fetch", {}, 0.20, "ok"),
    ("mcp.add", {"a": 1, "b": 2}, 0.15, "ok"),
    ("mcp.echo", {"text": "hi"}, 0.15, "ok"),
    ("py.block_hang", {}, 0.02, "timeout"),
    ("pythread.block_hang_thread", {}, 0.01, "timeout"),
    ("py.async_hang", {}, 0.02, "timeout"),
    ("py.async_deaf", {}, 0.01, "timeout"),
    ("py.async_block", {}, 0.01, "timeout"),
    ("py.broken", {}, 0.03, "tool_error"),
    ("py.big", {}, 0.015, "ok"),
    ("py.async_big", {}, 0.01, "ok"),
    ("py.slow", {}, 0.02, "ok"),
    ("mcp.slow", {"seconds": 3600}, 0.02, "unknown"),  # past its deadline in a server that goes on: may still run
    ("mcp.crash", {}, 0.002, "server_crashed"),
    ("mcp.big", {"megabytes": 5}, 0.013, "ok"),
    ("mcp.slow", {"seconds": 0.8}, 0.02, "ok"),
]
BIG = {"py.big", "py.async_big", "mcp.big"}
HEALTHY = {"py.lookup", "py.fetch", "mcp.add", "mcp.echo"}


def tool_config(folder: Path) -> Path:
    py = [
        ("lookup", None),
        ("fetch", None),
        ("block_hang", None),
        ("async_hang", None),
        ("async_deaf", None),
        ("async_block", None),
        ("broken", None),
        ("big", None),
        ("async_big", None),
        ("slow", None),
    ]
    servers = {
        "mcp": {
            "command": sys.executable,
            "args": [str(MCP_SERVER)],
            "spare": True,
            "processes": MCP_PROCESSES,
            "env": {"TOOLRL_FAULTS_RUN": str(folder)},
        },
        "pythread": {"python": "fault_tools:block_hang_thread", "policy": {"isolation": "thread"}},
    }
    for name, _ in py:
        servers[f"py_{name}"] = {"python": f"fault_tools:{name}"}
    path = folder / "tools.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def run_child(calls: int, seed: int, folder: Path) -> None:
    """The workload; prints one JSON line of results, then 'DONE <time>' when the work is over."""
    from toolrl.config.schema import ToolsConfig
    from toolrl.tools import ToolCall
    from toolrl.tools.toolset import run_executor

    executor, toolset = run_executor(
        [], ToolsConfig(file=str(tool_config(folder)), timeout_s=TIMEOUT_S, max_concurrency=TRAJECTORIES), folder
    )
    rng = random.Random(seed)
    names, weights = list(range(len(MIX))), [m[2] for m in MIX]
    plan = [rng.choices(names, weights)[0] for _ in range(calls)]

    def full_name(tool: str) -> str:
        server, short = tool.split(".")
        return f"py_{short}.{short}" if server == "py" else tool

    async def trajectory(index: int) -> list[tuple[int, float, str, str, int | None, float]]:
        done = []
        for i in range(index, calls, TRAJECTORIES):
            tool, arguments, _, _ = MIX[plan[i]]
            if tool == "mcp.crash":  # each call its own marker file: one line per execution
                arguments = {"marker": str(folder / f"crash-{i}")}
            elif tool.startswith("py"):
                arguments = {"key": i}
            result, stall = await stalled(executor.invoke(ToolCall(full_name(tool), arguments)))
            done.append((plan[i], result.latency_s, result.outcome, result.content[:120], stall, result.setup_s))
        return done

    async def everything():
        return [r for part in await asyncio.gather(*(trajectory(t) for t in range(TRAJECTORIES))) for r in part]

    started = time.monotonic()
    timed = asyncio.run(everything())  # each call with the CPU stall over its own time
    results, stalls, setups = [r[:4] for r in timed], [r[4] for r in timed], [r[5] for r in timed]
    wall = time.monotonic() - started
    metrics = collections.Counter(executor.metrics)  # the mix's, before the phases below add theirs
    crash_rounds = asyncio.run(beside_a_crash(executor, folder))
    big_alone = asyncio.run(five_megabytes_alone(executor))
    outcomes = collections.Counter(outcome for _, _, outcome, _ in results)
    counted = metrics["calls"]
    metric_outcomes = {k.removeprefix("errors_"): v for k, v in metrics.items() if k.startswith("errors_")}
    mismatched = sum(abs(outcomes[k] - metric_outcomes.get(k, 0)) for k in outcomes if k != "ok")
    by_kind = collections.defaultdict(collections.Counter)
    failures, starved = collections.Counter(), collections.Counter()
    for (kind, latency, outcome, content), stall in zip(results, stalls, strict=True):
        tool, arguments, _, _ = MIX[kind]
        by_kind[f"{tool}{'(hang)' if arguments.get('seconds') == 3600 else ''}"][outcome] += 1
        if tool in HEALTHY and outcome != "ok":
            reason = starved_reason(stall, latency)
            if reason is None:
                failures[content] += 1
            else:  # late only because the machine was starved: apart from failures, with why
                starved[f"{content[:60]} ({reason})"] += 1
    crash_calls = [i for i, kind in enumerate(plan) if MIX[kind][0] == "mcp.crash"]
    runs = [
        len((folder / f"crash-{i}").read_text().splitlines()) if (folder / f"crash-{i}").is_file() else 0
        for i in crash_calls
    ]
    ran = [n for n in runs if n]
    latencies = [latency for _, latency, _, _ in results]
    hung, hung_starved = collections.Counter(), collections.Counter()
    for (kind, latency, _, _), stall, setup in zip(results, stalls, setups, strict=True):
        if latency - setup > TIMEOUT_S + 0.5:  # its deadline fired late: starved of CPU, or not stopped in time
            reason = starved_reason(stall, latency)
            (hung if reason is None else hung_starved)[MIX[kind][0] if reason is None else reason] += 1
    summary = {
        "calls": len(results),
        "faulty_share": round(sum(1 for k in plan if MIX[k][0] not in HEALTHY) / len(plan), 3),
        "hung": sum(hung.values()),
        "hung_by_tool": dict(hung),
        "hung_starved": sum(hung_starved.values()),
        "hung_starved_reasons": dict(hung_starved.most_common(5)),
        "max_latency_s": round(max(latencies), 3),
        "setup_max_s": round(max(setups), 3),
        "uncounted": abs(counted - len(results)) + mismatched,
        "healthy_failed": sum(failures.values()),
        "healthy_failures": dict(failures.most_common(5)),
        "healthy_starved": sum(starved.values()),
        "healthy_starved_reasons": dict(starved.most_common(5)),
        "cpu_pressure_known": all(s is not None for s in stalls),
        "unexpected": sum(
            1 for kind, _, outcome, _ in results if outcome != MIX[kind][3] and MIX[kind][0] not in HEALTHY
        ),
        "crash_calls": len(crash_calls),
        "crash_executions_per_call": round(sum(ran) / len(ran), 3) if ran else None,
        "crash_max_executions": max(runs, default=0),
        "crash_calls_never_run": runs.count(0),
        "crash_calls_never_run_note": "sent as the server was dying; reported as crashed (it may have run)",
        "mcp_processes": len(getattr(toolset.servers["mcp"], "members", [None])),
        "server_restarts": toolset.servers["mcp"].connections - len(getattr(toolset.servers["mcp"], "members", [None])),
        "hedged": getattr(toolset.servers["mcp"], "hedged", 0),
        "hedge_wins": getattr(toolset.servers["mcp"], "hedge_wins", 0),
        "workers_started": executor.processes.started,
        "workers_killed": executor.processes.killed,
        "threads_abandoned": executor.threads.abandoned,
        "async_abandoned": executor.coroutines.abandoned,
        "big_max_latency_s": round(max(lat for k, lat, _, _ in results if MIX[k][0] in BIG), 3),
        "mcp_5mb_alone_max_s": round(max(big_alone), 3),
        "beside_a_crash": crash_rounds,
        "beside_a_crash_note": (
            f"{CRASH_ROUNDS} rounds of {NOTES} calls to a tool not safe to repeat with one crash among them: "
            "lost = failed as server_crashed (the server had read them: lost_ran ran, their answer died with "
            "it); the calls it never read went to the restarted server; lost_starved: a deadline passed while the "
            "machine was starved (lost_timeout, lost_unknown name such outcomes)"
        ),
        "outcomes": dict(outcomes),
        "by_tool": {k: dict(v) for k, v in sorted(by_kind.items())},
        "wall_s": round(wall, 1),
        "calls_per_s": round(len(results) / wall, 1),
    }
    print(json.dumps(summary), flush=True)
    print(f"DONE {time.time()}", flush=True)
    closing = time.monotonic()
    executor.close()
    closed_executor = time.monotonic()
    toolset.close()
    print(f"CLOSED {closed_executor - closing:.2f} {time.monotonic() - closed_executor:.2f}", flush=True)


CRASH_ROUNDS, NOTES = 5, 200


DEADLINE = frozenset({"timeout", "unknown"})
"""A call's deadline passed: beside a crash, a call queued for the restarted server may wait past it when the machine
is starved (seen once under a CI machine's load); counted as lost_starved, apart, with every other outcome named."""


async def stalled(call) -> tuple:
    """A call's result with the CPU stall over its own time."""
    before = cpu_stall_us()
    result = await call
    after = cpu_stall_us()
    return result, (after - before if before is not None and after is not None else None)


async def beside_a_crash(executor, folder: Path) -> dict[str, int]:
    """Calls to a tool with a side effect (not safe to repeat) beside one call that crashes the MCP server."""
    from toolrl.tools import ToolCall

    totals = collections.Counter({"lost_not_server_crashed": 0, "lost_starved": 0})
    for round_ in range(CRASH_ROUNDS):
        marker = folder / f"notes-{round_}"
        calls = [ToolCall("mcp.note", {"marker": str(marker), "text": f"n{i}"}) for i in range(NOTES)]
        calls.insert(NOTES // 2, ToolCall("mcp.crash", {}))
        timed = await asyncio.gather(*(stalled(executor.invoke(call)) for call in calls))
        ran = collections.Counter(marker.read_text().split()) if marker.is_file() else collections.Counter()
        notes = [(r, stall) for r, stall in timed if r.call.name == "mcp.note"]
        lost = [(r, stall) for r, stall in notes if r.outcome != "ok"]
        totals["calls"] += NOTES
        totals["lost"] += len(lost)
        totals["lost_ran"] += sum(1 for r, _ in lost if ran[r.call.arguments["text"]])
        for r, stall in lost:
            if r.outcome == "server_crashed":
                continue
            starved = r.outcome in DEADLINE and starved_reason(stall, r.latency_s) is not None
            totals["lost_starved" if starved else "lost_not_server_crashed"] += 1
            totals[f"lost_{r.outcome}"] += 1
        answered = [r for r, _ in notes if r.outcome == "ok"]
        totals["ok_not_run_once"] += sum(1 for r in answered if ran[r.call.arguments["text"]] != 1)
        totals["run_twice"] += sum(1 for n in ran.values() if n > 1)
    return dict(totals)


async def five_megabytes_alone(executor) -> list[float]:
    from toolrl.tools import ToolCall

    return [(await executor.invoke(ToolCall("mcp.big", {"megabytes": 5}))).latency_s for _ in range(5)]


def leaked(folder: Path) -> list[str]:
    """Processes left of the child's work: tool workers and MCP servers, by their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (entry / "status").read_text()
        except OSError:
            continue
        if "State:\tZ" in status:
            continue
        if "toolrl/tools/worker.py" not in command and str(MCP_SERVER) not in command:
            continue
        try:  # this run's only: a test suite beside it starts workers and this MCP server too
            ours = f"TOOLRL_FAULTS_RUN={folder}".encode() in (entry / "environ").read_bytes()
        except OSError:
            continue
        if ours:
            found.append(f"{entry.name}: {command[:100]}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench/results/faults.json")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="each call's deadline in seconds")
    parser.add_argument("--mcp-processes", type=int, default=MCP_PROCESSES, help="the MCP server's pool size")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ["TOOLRL_FAULTS_TIMEOUT_S"] = str(args.timeout)
    os.environ["TOOLRL_FAULTS_MCP_PROCESSES"] = str(args.mcp_processes)
    globals()["MCP_PROCESSES"] = args.mcp_processes
    globals()["TIMEOUT_S"] = args.timeout
    if args.child:
        run_child(args.calls, args.seed, Path(args.child))
        return
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="toolrl-faults-") as tmp:
        before = set(leaked(Path(tmp)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(ROOT)]),
               "TOOLRL_FAULTS_RUN": tmp}  # fmt: skip
        child = subprocess.Popen(
            [sys.executable, __file__, "--calls", str(args.calls), "--seed", str(args.seed), "--child", tmp],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        summary, done_at, closing, stall_at_done = None, None, [None, None], None
        for line in child.stdout:
            if line.startswith("{"):
                summary = json.loads(line)
            elif line.startswith("DONE "):
                done_at, stall_at_done = float(line.split()[1]), cpu_stall_us()
            elif line.startswith("CLOSED "):
                closing = [float(x) for x in line.split()[1:]]
        child.wait()
        exited, stall_at_exit = time.time(), cpu_stall_us()
        time.sleep(1.0)
        left = [p for p in leaked(Path(tmp)) if p not in before]
    if summary is None:
        raise SystemExit(f"the workload failed (exit {child.returncode})")
    summary["exit_s"] = round(exited - done_at, 2)
    summary["exit_parts_s"] = {"executor_close": closing[0], "toolset_close": closing[1]}
    # its closing and the interpreter's teardown are under a second of CPU; at load 10 they took 7-90 s of wall time
    exit_stall = stall_at_exit - stall_at_done if stall_at_done is not None and stall_at_exit is not None else None
    summary["exit_starved"] = starved_reason(exit_stall, exited - done_at)
    summary["load_average"] = {
        "start": [round(x, 2) for x in load_start],
        "end": [round(x, 2) for x in os.getloadavg()],
    }
    summary["beside"] = os.environ.get("TOOLRL_BENCH_BESIDE", "nothing said (set TOOLRL_BENCH_BESIDE)")
    summary["leaked_processes"] = len(left)
    summary["leaked"] = left[:5]
    goals = {
        "hung": 0,
        "uncounted": 0,
        "healthy_failed": 0,
        "leaked_processes": 0,
        "crash_executions_per_call": 1.0,
    }
    crash = summary["beside_a_crash"]
    met = (
        all(summary[k] == v for k, v in goals.items())
        and (summary["exit_s"] <= 5 or summary["exit_starved"] is not None)
        and summary["mcp_5mb_alone_max_s"] < 1
        and crash["run_twice"] == crash["ok_not_run_once"] == crash["lost_not_server_crashed"] == 0
    )
    print(
        f"{summary['calls']} calls ({summary['faulty_share']:.0%} to faulty tools), deadline {TIMEOUT_S:g} s, "
        f"{TRAJECTORIES} trajectories, {summary['wall_s']} s"
    )
    extra = ("exit_s", "mcp_5mb_alone_max_s", "crash_max_executions", "crash_calls_never_run", "max_latency_s")
    more = (
        "hung_starved",
        "healthy_starved",
        "setup_max_s",
        "big_max_latency_s",
        "unexpected",
        "server_restarts",
        "workers_killed",
        "threads_abandoned",
    )
    for key in (*goals, *extra, *more, "async_abandoned"):
        goal = goals.get(key, {"exit_s": "<= 5", "mcp_5mb_alone_max_s": "< 1"}.get(key, ""))
        print(f"  {key:<28}{summary[key]!s:>10}   {goal}")
    print(f"  beside a crash ({CRASH_ROUNDS} x {NOTES} calls not safe to repeat): {crash}")
    print("    goal: run_twice, ok_not_run_once, lost_not_server_crashed all 0")
    print(f"goals {'met' if met else 'NOT met'}")
    write_results(
        args.out,
        {
            "machine": machine(),
            "workload": {
                "calls": args.calls,
                "trajectories": TRAJECTORIES,
                "timeout_s": TIMEOUT_S,
                "seed": args.seed,
                "mix": [{"tool": t, "arguments": a, "share": s, "expected": e} for t, a, s, e in MIX],
            },
            "goals_met": met,
            **summary,
        },
    )


if __name__ == "__main__":
    main()
