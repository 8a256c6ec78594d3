"""A real stdio MCP server (written with the SDK) behind the executor: schemas, calls, faults, reconnects."""

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from toolrl.tools import ToolCall, ToolExecutor
from toolrl.tools.mcp import MCPStdioServer, result_text

SERVER = Path(__file__).parent.parent / "fixtures" / "mcp_server.py"


@pytest.fixture
def server():
    srv = MCPStdioServer("srv", sys.executable, [str(SERVER)])
    yield srv
    srv.close()


def run(coro):
    return asyncio.run(coro)


def test_tools_are_listed_with_their_schemas_as_server_dot_tool(server):
    tools = {t.name: t for t in server.tools()}
    assert set(tools) == {"srv.add", "srv.echo", "srv.big", "srv.fail", "srv.pid"}
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
    assert fail.error and fail.content == "Error: srv.fail failed: disk on fire"
    assert ex.metrics["errors_raised"] == 1


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


def test_server_that_cannot_start_gives_a_short_error():
    srv = MCPStdioServer("ghost", sys.executable, ["-c", "import sys; sys.exit(3)"], connect_timeout_s=1)
    try:
        with pytest.raises(Exception, match="MCP server ghost is not up after 1 s"):
            srv.tools()
    finally:
        srv.close()


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
    from toolrl.tools.mcp import MCPHttpServer

    port = free_port()
    proc = start_http_server(port)
    srv = MCPHttpServer("web", f"http://127.0.0.1:{port}/mcp", headers={"X-Test": "1"}, connect_timeout_s=30)
    try:
        ex = ToolExecutor(srv.tools(), timeout_s=60)
        assert {t for t in ex.tools} == {"web.add", "web.echo", "web.big", "web.fail", "web.pid"}
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
    from toolrl.tools.mcp import MCPSseServer

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
    from toolrl.tools.mcp import MCPStdioServer

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
        assert ex.metrics["errors_raised"] == 1
    finally:
        srv.close()
