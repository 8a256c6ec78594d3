"""A real stdio MCP server (written with the SDK) behind the executor: schemas, calls, faults, reconnects."""

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from toolrl.errors import ToolError
from toolrl.tools import ToolCall, ToolExecutor, ToolPolicy
from toolrl.tools.mcp import result_text
from toolrl.tools.mcp_stdio import MCPStdioServer

SERVER = Path(__file__).parent.parent / "fixtures" / "mcp_server.py"
TOOLS = {"add", "echo", "big", "fail", "pid", "slow", "freeze", "crash", "square", "note"}


@pytest.fixture
def server(tmp_path):
    srv = MCPStdioServer("srv", sys.executable, [str(SERVER)], log_path=tmp_path / "srv.log")
    yield srv
    srv.close()


def run(coro):
    return asyncio.run(coro)


def test_tools_are_listed_with_their_schemas_as_server_dot_tool(server):
    tools = {t.name: t for t in server.tools()}
    assert set(tools) == {f"srv.{t}" for t in TOOLS}
    assert tools["srv.add"].idempotent and not tools["srv.crash"].idempotent  # from readOnlyHint
    add = tools["srv.add"].to_openai()["function"]
    assert add["description"] == "Add two integers."
    assert set(add["parameters"]["properties"]) == {"a", "b"} and add["parameters"]["required"] == ["a", "b"]


def test_calls_and_errors_through_the_executor(server):
    ex = ToolExecutor(server.tools())
    add, echo, fail = run(
        ex.invoke_all(
            [
                ToolCall("srv.add", {"a": 2, "b": 3}),
                ToolCall("srv.echo", {"text": "héllo"}),
                ToolCall("srv.fail", {"message": "disk on fire"}),
            ]
        )
    )
    assert (add.content, echo.content) == ("5", "héllo")
    assert (add.value, echo.value) == (5, "héllo")  # rewards get the value the text stands for
    assert fail.error and fail.content == "Error: srv.fail failed: disk on fire" and fail.outcome == "tool_error"
    assert ex.metrics["errors_tool_error"] == 1 and ex.metrics["infra_faults"] == 0


def test_arguments_off_the_schema_are_rejected_naming_each_field_before_sending(server):
    ex = ToolExecutor(server.tools())
    bad = run(ex.invoke(ToolCall("srv.add", {"a": "two", "c": 1})))
    assert bad.outcome == "invalid_arguments" and "\n" not in bad.content
    assert "'two' is not of type 'integer'" in bad.content and "'b' is a required property" in bad.content
    assert ex.metrics["model_errors"] == 1


def test_one_session_serves_several_event_loops(server):
    ex = ToolExecutor(server.tools())
    first = run(ex.invoke(ToolCall("srv.pid", {}))).content
    second = run(ex.invoke(ToolCall("srv.pid", {}))).content
    assert first == second and server.connections == 1


def test_server_killed_mid_run_is_reconnected_and_the_rollout_goes_on(server):
    ex = ToolExecutor(server.tools())
    pid = int(run(ex.invoke(ToolCall("srv.pid", {}))).content)
    os.kill(pid, signal.SIGKILL)
    results = run(ex.invoke_all([ToolCall("srv.add", {"a": i, "b": 1}) for i in range(4)]))
    assert [r.content for r in results] == ["1", "2", "3", "4"]
    assert int(run(ex.invoke(ToolCall("srv.pid", {}))).content) != pid
    assert server.connections == 2


def test_ten_megabyte_result_arrives_whole(server):
    ex = ToolExecutor(server.tools(), timeout_s=60)
    result = run(ex.invoke(ToolCall("srv.big", {"megabytes": 10})))
    assert not result.error and len(result.content) == 10 * 1024 * 1024


def test_a_server_that_exits_at_start_fails_fast_with_its_exit_code_and_stderr_and_is_not_relaunched(tmp_path):
    log = tmp_path / "ghost.log"
    srv = MCPStdioServer("ghost", sys.executable, [str(SERVER), "--fail-start"], connect_timeout_s=300, log_path=log)
    try:
        started = time.monotonic()
        with pytest.raises(ToolError) as info:
            srv.tools()
        # the exit is seen when it happens, not after the 300 s connect timeout (a loaded CI machine took 5.1 s
        # to start the server and see it exit)
        assert time.monotonic() - started < 120
        message = str(info.value)
        assert message.startswith("MCP server ghost failed to start: the server exited before answering initialize")
        assert "exit code 3" in message and "RuntimeError: the config of this server is broken" in message
        time.sleep(1.5)
        assert log.read_text().count("starting") == 1  # no relaunch in the background
        # A call soon after is refused with the same cause; it never reached a server: a transport fault (the deadline
        # leaves room for a busy machine: a slow refusal had read as a timeout beside a benchmark).
        ex = ToolExecutor([], timeout_s=30)
        from toolrl.tools.function import Tool

        async def call(**arguments):
            return await srv.call("add", arguments)

        ex.tools["ghost.add"] = Tool("ghost.add", "", {"type": "object"}, call)
        refused = run(ex.invoke(ToolCall("ghost.add", {})))
        assert refused.outcome == "transport" and "exit code 3" in refused.content
    finally:
        srv.close()


def test_a_command_that_does_not_exist_is_named_in_the_error(tmp_path):
    srv = MCPStdioServer("nope", "toolrl-no-such-command", connect_timeout_s=30, log_path=tmp_path / "nope.log")
    try:
        with pytest.raises(ToolError, match="MCP server nope failed to start: cannot run toolrl-no-such-command"):
            srv.tools()
    finally:
        srv.close()


def test_a_hung_call_returns_at_its_deadline_and_the_server_keeps_serving(server):
    ex = ToolExecutor(server.tools(), policies={"srv.slow": ToolPolicy(timeout_s=1.0, retries=3)})
    started = time.monotonic()
    hung, added = run(ex.invoke_all([ToolCall("srv.slow", {"seconds": 60}), ToolCall("srv.add", {"a": 1, "b": 2})]))
    assert hung.outcome == "unknown"  # sent to a server that goes on: it may still run there, not a plain timeout
    assert hung.content == "Error: srv.slow gave no answer within 1 s; it may still run there (outcome unknown)"
    assert time.monotonic() - started < 6 and 1.0 <= hung.latency_s < 4  # the deadline, not the 60 s call
    assert added.content == "3" and ex.metrics["retries"] == 0


def test_a_crash_runs_once_and_healthy_calls_in_flight_are_rerun_on_the_restarted_server(server, tmp_path):
    """One crashing call among 200 healthy ones to a read-only tool: the crash is reported as such and ran once
    (its side effect is written once); every healthy call succeeds on the restarted server."""
    marker = tmp_path / "marker"
    ex = ToolExecutor(server.tools(), timeout_s=20, policies={"srv.slow": ToolPolicy(timeout_s=20, backoff_s=0.1)})

    async def scenario():
        healthy = [ex.invoke(ToolCall("srv.slow", {"seconds": 0.3})) for _ in range(200)]
        crash = asyncio.sleep(0.1, result=None)

        async def crash_later():
            await crash
            return await ex.invoke(ToolCall("srv.crash", {"marker": str(marker)}))

        return await asyncio.gather(crash_later(), *healthy)

    crashed, *healthy = run(scenario())
    assert crashed.outcome == "server_crashed" and "crashed during the call" in crashed.content
    assert "exit code 1" in crashed.content and "about to crash" in crashed.content
    assert marker.read_text() == "ran\n"
    assert [r.content for r in healthy] == ["done"] * 200
    assert server.connections == 2 and ex.metrics["errors_server_crashed"] == 1 and ex.metrics["infra_faults"] == 1


SERIAL = Path(__file__).parent.parent / "fixtures" / "serial_mcp_server.py"


def test_a_crash_fails_only_what_the_server_read_and_the_rest_goes_to_the_restarted_server(tmp_path):
    """A server that reads one request at a time dies on `crash`: the calls written after it were never read
    (still in the pipe, or written once it was gone), so they go to the restarted server, retries 0 and not
    safe to repeat notwithstanding; each runs exactly once, and only the crashing call fails, as a fault of
    the server, never the model's."""
    server = MCPStdioServer("serial", sys.executable, [str(SERIAL)])
    marker = tmp_path / "notes"
    ex = ToolExecutor(server.tools(), timeout_s=20, policies={"serial.note": ToolPolicy(timeout_s=20, retries=0)})
    try:
        go = tmp_path / "go"

        async def scenario():
            crash = asyncio.ensure_future(ex.invoke(ToolCall("serial.crash", {"after": str(go)})))
            delivery = server._live.delivery
            while not delivery.ends:  # the crash is written first: every note is behind it in the pipe
                await asyncio.sleep(0.01)
            notes = [
                asyncio.ensure_future(ex.invoke(ToolCall("serial.note", {"marker": str(marker), "text": f"n{i}"})))
                for i in range(60)
            ]
            while len(delivery.ends) < 61:  # every note written to the stdin of a server busy in `crash`
                await asyncio.sleep(0.01)
            go.touch()
            return await crash, await asyncio.gather(*notes)

        crashed, notes = run(scenario())
        assert crashed.outcome == "server_crashed" and "exit code 1" in crashed.content
        assert [r.content for r in notes] == [f"n{i}" for i in range(60)]
        assert sorted(marker.read_text().split()) == sorted(f"n{i}" for i in range(60))  # each ran once
        assert server.connections == 2
        counts = (ex.metrics["errors_server_crashed"], ex.metrics["infra_faults"], ex.metrics["model_errors"])
        assert counts == (1, 1, 0)
    finally:
        ex.close()
        server.close()


def test_calls_beside_a_crash_are_never_run_twice_and_each_failure_is_the_servers(server, tmp_path):
    """200 calls to a tool that is not safe to repeat, a crash among them, on the SDK's server (which reads
    ahead): a call the server had taken fails as `server_crashed` (it may have run: it is not run again),
    every other one succeeds, and none runs twice."""
    marker = tmp_path / "notes"
    ex = ToolExecutor(server.tools(), timeout_s=20)

    async def scenario():
        calls = [ToolCall("srv.note", {"marker": str(marker), "text": f"n{i}"}) for i in range(200)]
        calls.insert(100, ToolCall("srv.crash", {}))
        return await ex.invoke_all(calls)

    results = run(scenario())
    ran = marker.read_text().split()
    assert len(ran) == len(set(ran))  # none twice
    notes = [r for r in results if r.call.name == "srv.note"]
    assert {r.outcome for r in notes} <= {"ok", "server_crashed"}
    assert all(r.call.arguments["text"] in ran for r in notes if r.outcome == "ok")
    lost = sum(r.outcome != "ok" for r in notes)
    assert ex.metrics["infra_faults"] == lost + 1 and ex.metrics["model_errors"] == 0
    ex.close()


@pytest.mark.parametrize("spares", [0, 1, 2])
def test_a_spare_server_takes_over_a_crash_at_once(tmp_path, spares):
    """A server that takes 2 s to start crashes; a call right behind the crash, with a 1 s deadline, times out
    waiting for the restart, unless a spare was kept started: then it is answered by the spare at once, and
    another spare is started for the next crash. With two, a second crash right after the first (its
    replacement still starting) is covered too."""
    server = MCPStdioServer(
        "slow", sys.executable, [str(SERVER), "--slow-start", "2"], log_path=tmp_path / "slow.log", spare=spares
    )
    ex = ToolExecutor(server.tools(), timeout_s=1.0)

    def wait_for_spares(n):
        deadline = time.monotonic() + 30
        while len(server._spares) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server._spares) >= n

    def crash(k):
        crashed = run(ex.invoke(ToolCall("slow.crash", {"marker": str(tmp_path / f"marker{k}")})))
        assert crashed.outcome == "server_crashed" and "about to crash" in crashed.content

    try:
        wait_for_spares(spares)
        first = run(ex.invoke(ToolCall("slow.pid", {}))).content
        crash(0)
        after = run(ex.invoke(ToolCall("slow.pid", {})))
        if not spares:
            assert after.outcome == "unknown"
            return
        assert after.outcome == "ok" and after.content != first and after.latency_s < 0.5
        if spares == 2:  # at once again: the second spare, while the first one's replacement starts
            crash(1)
            again = run(ex.invoke(ToolCall("slow.pid", {})))
            assert again.outcome == "ok" and again.content not in (first, after.content) and again.latency_s < 0.5
        wait_for_spares(spares)  # replaced
        assert all(str(s.process.pid) not in (first, after.content) for s in server._spares)
    finally:
        ex.close()
        server.close()


def test_result_text_for_structured_and_non_text_content():
    from mcp.types import CallToolResult, ImageContent, TextContent

    image = CallToolResult(
        content=[TextContent(type="text", text="see"), ImageContent(type="image", data="AA==", mime_type="image/png")]
    )
    assert result_text(image) == "see\n[image content (image/png) not shown]"
    structured = CallToolResult(content=[], structured_content={"rows": [[1, "a"]]})
    assert result_text(structured) == '{"rows": [[1, "a"]]}'
    wrapped = CallToolResult(content=[], structured_content={"result": 7})
    assert result_text(wrapped) == "7"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_http_server(port: int, transport: str = "http"):
    import socket
    import subprocess
    import time

    proc = subprocess.Popen([sys.executable, str(SERVER), transport, str(port)], stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("HTTP MCP server did not start")


def test_streamable_http_server_on_localhost_survives_a_restart():
    from toolrl.tools.mcp_http import MCPHttpServer

    port = free_port()
    proc = start_http_server(port)
    srv = MCPHttpServer("web", f"http://127.0.0.1:{port}/mcp", headers={"X-Test": "1"}, connect_timeout_s=30)
    try:
        ex = ToolExecutor(srv.tools(), timeout_s=60)
        assert set(ex.tools) == {f"web.{t}" for t in TOOLS}
        assert run(ex.invoke(ToolCall("web.add", {"a": 40, "b": 2}))).content == "42"
        assert len(run(ex.invoke(ToolCall("web.big", {"megabytes": 10}))).content) == 10 * 1024 * 1024

        proc.kill()
        proc.wait()
        proc = start_http_server(port)
        assert run(ex.invoke(ToolCall("web.echo", {"text": "back"}))).content == "back"
        assert srv.connections == 2
    finally:
        srv.close()
        proc.kill()


def test_legacy_sse_server_on_localhost():
    from toolrl.tools.mcp_http import MCPSseServer

    port = free_port()
    proc = start_http_server(port, "sse")
    srv = MCPSseServer("old", f"http://127.0.0.1:{port}/sse", connect_timeout_s=30)
    try:
        ex = ToolExecutor(srv.tools(), timeout_s=60)
        assert "old.add" in ex.tools
        assert run(ex.invoke(ToolCall("old.add", {"a": 2, "b": 3}))).content == "5"
        failed = run(ex.invoke(ToolCall("old.fail", {"message": "nope"})))
        assert failed.error and "nope" in failed.content
    finally:
        srv.close()
        proc.kill()


def test_third_party_server_from_the_package_index():
    """mcp-server-time, installed from PyPI by the test extra, spoken to over stdio like any user's server."""
    from toolrl.tools.mcp_stdio import MCPStdioServer

    srv = MCPStdioServer("time", sys.executable, ["-m", "mcp_server_time", "--local-timezone", "UTC"])
    try:
        tools = {t.name: t for t in srv.tools()}
        assert {"time.get_current_time", "time.convert_time"} <= set(tools)
        assert "timezone" in tools["time.get_current_time"].parameters["properties"]
        ex = ToolExecutor(list(tools.values()), timeout_s=30)
        args = {"source_timezone": "Asia/Tokyo", "time": "12:00", "target_timezone": "Asia/Kolkata"}  # no DST
        converted = json.loads(run(ex.invoke(ToolCall("time.convert_time", args))).content)
        assert converted["target"]["datetime"].endswith("T08:30:00+05:30") and converted["time_difference"] == "-3.5h"
        bad = run(ex.invoke(ToolCall("time.get_current_time", {"timezone": "Nowhere/Atlantis"})))
        assert bad.error and "Invalid timezone" in bad.content
        assert ex.metrics["errors_tool_error"] == 1
        missing = run(ex.invoke(ToolCall("time.get_current_time", {})))
        assert missing.outcome == "invalid_arguments" and "'timezone' is a required property" in missing.content
    finally:
        srv.close()
