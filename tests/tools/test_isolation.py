"""Tools that hang, spin, crash or block their event loop: stopped (worker processes) or abandoned (threads) at their
deadline, never holding capacity that healthy calls need, never keeping the process from exiting."""

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from tests.fixtures import faulty_tools
from toolrl.errors import ToolError
from toolrl.tools import ToolCall, ToolExecutor, ToolPolicy, tool_from_function


def run(coro):
    return asyncio.run(coro)


def tools(*names, **options):
    return [tool_from_function(getattr(faulty_tools, name), **options) for name in names]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_importable_functions_run_in_worker_processes_and_closures_in_threads():
    def local(x: int) -> int:
        return x

    ex = ToolExecutor([*tools("pid"), tool_from_function(local)])
    try:
        assert ex.isolation(ex.tools["pid"]) == "process" and ex.isolation(ex.tools["local"]) == "thread"
        worker = int(run(ex.invoke(ToolCall("pid", {}))).content)
        assert worker != os.getpid() and int(run(ex.invoke(ToolCall("pid", {}))).content) == worker  # reused
    finally:
        ex.close()
    with pytest.raises(ToolError, match="tool local: isolation process needs a function a worker process can import"):
        ToolExecutor([tool_from_function(local)], policies={"local": ToolPolicy(isolation="process")})


def test_a_hung_blocking_tool_is_killed_at_its_deadline_and_healthy_calls_keep_their_capacity():
    # pid's deadline is long: its calls start new worker processes, which a busy machine may slow past 0.5 s
    ex = ToolExecutor(
        tools("hang", "pid"), timeout_s=30, max_concurrency=2, policies={"hang": ToolPolicy(timeout_s=0.5)}
    )
    try:
        assert [r.outcome for r in run(ex.invoke_all([ToolCall("hang", {"seconds": 0})] * 2))] == ["ok"] * 2
        started = time.monotonic()  # two workers have hang imported: its calls' latency is the deadline's
        calls = [ToolCall("hang", {})] * 2 + [ToolCall("pid", {})] * 6
        results = run(ex.invoke_all(calls))
        assert [r.outcome for r in results] == ["timeout"] * 2 + ["ok"] * 6
        assert all(r.latency_s < 0.5 + 1.5 for r in results[:2])
        assert time.monotonic() - started < 15  # not 3,600 s: the slots came back at the deadline
        assert ex.processes.killed == 2
        assert run(ex.invoke(ToolCall("pid", {}))).outcome == "ok"
    finally:
        ex.close()


def test_a_spinning_tool_is_stopped_not_left_burning_cpu():
    ex = ToolExecutor(tools("spin"), timeout_s=0.3)
    try:
        spun = run(ex.invoke(ToolCall("spin", {})))
        assert spun.outcome == "timeout"
        [spare] = ex.processes._idle  # the worker that ran it was killed, not put back: a spare took its place
        assert ex.processes.killed == 1 and ex.processes.started == 2 and spare.process.poll() is None
    finally:
        ex.close()


def test_a_hung_thread_is_abandoned_without_holding_a_slot():
    ex = ToolExecutor(tools("hang", "pid", isolation="thread"), timeout_s=0.3, max_concurrency=2)
    results = run(ex.invoke_all([ToolCall("hang", {})] * 2 + [ToolCall("pid", {})] * 4))
    assert [r.outcome for r in results] == ["timeout"] * 2 + ["ok"] * 4
    assert all(int(r.content) == os.getpid() for r in results[2:]) and ex.threads.abandoned == 2
    ex.close()


def test_a_worker_that_dies_during_a_call_is_a_crash_and_the_call_runs_once(tmp_path):
    marker = tmp_path / "marker"
    ex = ToolExecutor(tools("die", "pid"), policies={"die": ToolPolicy(retries=3, backoff_s=0.01)})
    try:
        died = run(ex.invoke(ToolCall("die", {"marker": str(marker)})))
        assert died.outcome == "server_crashed" and died.content == (
            "Error: die failed: the tool's worker process died during the call (exit 7)"
        )
        assert marker.read_text() == "ran\n" and ex.metrics["infra_faults"] == 1
        assert run(ex.invoke(ToolCall("pid", {}))).outcome == "ok"
    finally:
        ex.close()


def test_prints_go_to_the_log_and_results_and_errors_cross_the_process_boundary(tmp_path):
    ex = ToolExecutor(tools("chatty", "huge", "reject", "refuse"), log_dir=tmp_path)
    try:
        assert run(ex.invoke(ToolCall("chatty", {"text": "héllo"}))).content == "HÉLLO"
        assert len(run(ex.invoke(ToolCall("huge", {"megabytes": 5}))).content) == 5 * 2**20
        odd = run(ex.invoke(ToolCall("reject", {"value": 3})))
        assert odd.outcome == "invalid_arguments"
        assert odd.content == "Error: invalid arguments: value must be even, got 3"
        refused = run(ex.invoke(ToolCall("refuse", {"value": 3})))
        assert refused.outcome == "tool_error" and refused.content == "Error: refuse failed: ValueError: cannot halve 3"
        off_schema = run(ex.invoke(ToolCall("refuse", {"value": "three"})))
        assert off_schema.outcome == "invalid_arguments" and "value" in off_schema.content
    finally:
        ex.close()
    assert "a line a tool prints" in (tmp_path / "workers.log").read_text()


def test_close_kills_busy_workers_too():
    ex = ToolExecutor(tools("pid", "hang"), timeout_s=30)

    async def start_and_close():
        pid = int((await ex.invoke(ToolCall("pid", {}))).content)
        hung = asyncio.ensure_future(ex.invoke(ToolCall("hang", {})))
        await asyncio.sleep(0.3)
        busy = [w.process.pid for w in ex.processes._busy]
        ex.close()
        result = await hung
        return pid, busy, result

    pid, busy, result = run(start_and_close())
    assert result.outcome == "server_crashed" and busy and not any(alive(p) for p in [pid, *busy])


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_the_tools_command_exits_at_once_after_a_hung_call(tmp_path, isolation):
    config = tmp_path / "tools.json"
    policy = {"timeout_s": 1, "isolation": isolation}
    config.write_text(
        json.dumps({"mcpServers": {"bad": {"python": "tests.fixtures.faulty_tools:hang", "policy": policy}}})
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "toolrl", "tools", "call", str(config), "hang", "{}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (1, "Error: bad.hang timed out after 1 s")
    assert time.monotonic() - started < 10  # start-up, a 1 s deadline, and an exit that waits for nothing


def test_an_async_tool_that_blocks_its_loop_or_ignores_cancellation_holds_only_its_own_call():
    """Async tools run on event loops of their own threads: one that sleeps synchronously, and one that
    swallows the cancellation sent at its deadline, each time out at their deadline while 40 healthy async
    calls beside them succeed, and `asyncio.run` (what a rollout runs in) returns at once after."""

    async def deaf() -> str:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def blocking() -> str:
        time.sleep(3600)
        return "never"

    async def healthy(i: int) -> int:
        await asyncio.sleep(0.05)
        return i

    # The hung tools get a 1 s deadline; the healthy ones a long one, so that a busy machine (42 threads and
    # event loops started at once on 2 shared cores) cannot fail them, while a loop the hung tools held would.
    bad = ToolPolicy(timeout_s=1.0)
    ex = ToolExecutor(
        [tool_from_function(f) for f in (deaf, blocking, healthy)],
        timeout_s=30.0,
        policies={"deaf": bad, "blocking": bad},
    )
    calls = [ToolCall("deaf", {}), ToolCall("blocking", {})] + [ToolCall("healthy", {"i": i}) for i in range(40)]
    started = time.monotonic()
    results = run(ex.invoke_all(calls))
    took = time.monotonic() - started
    assert [r.outcome for r in results[:2]] == ["timeout", "timeout"]
    assert [r.content for r in results[2:]] == [str(i) for i in range(40)]
    assert took < 15, took  # the 1 s deadline plus a busy machine's delays, not the hour the tools would take
    assert ex.coroutines.abandoned == 2
    ex.close()


def test_an_async_tool_bound_to_the_callers_loop_can_stay_on_it():
    loops = []

    async def where() -> str:
        loops.append(asyncio.get_running_loop())
        return "here"

    async def scenario(ex):
        await ex.invoke(ToolCall("where", {}))
        return asyncio.get_running_loop()

    inline = ToolExecutor([tool_from_function(where)], policies={"where": ToolPolicy(isolation="inline")})
    assert run(scenario(inline)) is loops[-1]
    apart = ToolExecutor([tool_from_function(where)])
    assert run(scenario(apart)) is not loops[-1]
    with pytest.raises(ToolError, match="loop or inline, not process"):
        ToolExecutor([tool_from_function(where)], policies={"where": ToolPolicy(isolation="process")})


def test_a_worker_importing_a_builtin_tool_imports_only_its_module():
    """A tool's worker imports the tool's module; the calculator's must not pull in every environment (the
    image one imports torch and transformers: seconds, counted against the first call's deadline)."""
    code = "import sys, toolrl.envs.calculator.tool; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    code = "from toolrl.envs import ENVIRONMENTS; print('calculator' in ENVIRONMENTS, len(ENVIRONMENTS) >= 7)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]


SLOW_MODULE = """
import sys, time
from pathlib import Path

if Path(sys.argv[0]).name == "worker.py":  # slow (or hung) only where a worker process imports it
    time.sleep({seconds})


def ping() -> str:
    \"\"\"Answer at once.\"\"\"
    return "pong"


def hang() -> str:
    \"\"\"Never answer.\"\"\"
    time.sleep(3600)
    return "woke"
"""


def slow_tool(tmp_path, monkeypatch, seconds: float, name: str, function: str = "ping"):
    (tmp_path / f"{name}.py").write_text(SLOW_MODULE.replace("{seconds}", str(seconds)))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(name)
    return tool_from_function(getattr(module, function))


def test_a_module_slow_to_import_is_not_a_tool_that_overran(tmp_path, monkeypatch):
    # torch, a model, a test module: the worker's first call imports it; the call's deadline starts after
    ex = ToolExecutor([slow_tool(tmp_path, monkeypatch, 1.5, "slow_import_tool")], timeout_s=0.5)
    try:
        first = run(ex.invoke(ToolCall("ping", {})))
        assert first.outcome == "ok" and first.content == "pong" and first.latency_s >= first.setup_s >= 1.5
        again = run(ex.invoke(ToolCall("ping", {})))  # the same worker, imported: no wait
        assert again.outcome == "ok" and again.latency_s < 1.0 and ex.processes.started == 1
    finally:
        ex.close()


def test_the_call_after_a_hung_one_finds_a_spare_worker_with_its_module_imported(tmp_path, monkeypatch):
    ping = slow_tool(tmp_path, monkeypatch, 1.5, "spare_tool")
    hang = tool_from_function(sys.modules["spare_tool"].hang)
    ex = ToolExecutor([ping, hang], timeout_s=0.5)
    try:
        assert run(ex.invoke(ToolCall("hang", {}))).outcome == "timeout" and ex.processes.killed == 1
        [spare] = ex.processes._idle  # started as the hung worker was killed, importing while nothing waits
        deadline = time.monotonic() + 60
        while spare.preloaded != {"spare_tool:hang"} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert spare.preloaded == {"spare_tool:hang"}
        assert run(ex.invoke(ToolCall("hang", {}))).latency_s < 0.5 + 0.9  # the deadline alone: no import in it
        assert ex.processes.started == 3  # the first worker, its spare, the spare's spare
    finally:
        ex.close()


def test_an_import_that_hangs_is_the_tools_error_within_its_own_budget(tmp_path, monkeypatch):
    ex = ToolExecutor([slow_tool(tmp_path, monkeypatch, 3600, "hung_import_tool")], timeout_s=30)
    ex.processes.import_timeout_s = 0.5
    try:
        started = time.monotonic()
        result = run(ex.invoke(ToolCall("ping", {})))
        assert result.outcome == "tool_error" and result.content == (
            "Error: ping failed: importing hung_import_tool took over 0.5 s (tools.import_timeout_s)"
        )
        assert time.monotonic() - started < 15 and ex.processes.killed == 1  # its worker killed, not kept
    finally:
        ex.close()


def test_an_import_that_fails_in_the_worker_is_the_tools_error(tmp_path, monkeypatch):
    (tmp_path / "broken_import_tool.py").write_text(
        "import sys\nfrom pathlib import Path\n\nif Path(sys.argv[0]).name == 'worker.py':\n"
        "    raise ImportError('no such library here')\n\n\ndef ping() -> str:\n    return 'pong'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ex = ToolExecutor([tool_from_function(__import__("broken_import_tool").ping)])
    try:
        result = run(ex.invoke(ToolCall("ping", {})))
        assert result.outcome == "tool_error"
        assert result.content == "Error: ping failed: ImportError: no such library here"
    finally:
        ex.close()
