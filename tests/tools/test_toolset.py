"""The mcpServers-style tool config: every kind of entry, names, filters, errors, and the tools CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolrl.errors import ConfigError, ToolError
from toolrl.tools.toolset import Toolset

FIXTURES = Path(__file__).parent.parent / "fixtures"


def write(tmp_path, data, suffix=".yaml"):
    path = tmp_path / f"tools{suffix}"
    path.write_text(json.dumps(data))  # JSON is valid YAML too
    return path


@pytest.fixture
def config(tmp_path):
    return write(
        tmp_path,
        {
            "mcpServers": {
                "srv": {
                    "command": sys.executable,
                    "args": [str(FIXTURES / "mcp_server.py")],
                    "allow": ["add", "echo", "fail"],
                },
                "notes": {"python": "tests.fixtures.pytools:Notes"},
                "calc": {"python": "toolrl.envs.calculator.tool:calculator", "allow": ["calculator"]},
            }
        },
        suffix=".json",
    )


def test_every_entry_kind_loads_with_filters_and_server_dot_tool_names(config):
    toolset = Toolset.load(config)
    try:
        names = [t.name for t in toolset.tools]
        assert names == ["srv.add", "srv.echo", "srv.fail", "notes.add_note", "notes.echo", "calc.calculator"]
        assert toolset.status == {"srv": "ok", "notes": "ok", "calc": "ok"}
        assert toolset.resolve("add") == "srv.add" and toolset.resolve("notes.echo") == "notes.echo"
        with pytest.raises(ToolError, match=r"ambiguous: srv\.echo, notes\.echo"):
            toolset.resolve("echo")
        with pytest.raises(ToolError, match="no tool 'big'"):
            toolset.resolve("big")
    finally:
        toolset.close()


def test_a_server_that_is_down_is_reported_and_the_others_load(tmp_path):
    path = write(
        tmp_path,
        {
            "mcpServers": {
                "down": {"url": "http://127.0.0.1:9/mcp", "connect_timeout_s": 1},
                "calc": {"python": "toolrl.envs.calculator.tool:calculator"},
            }
        },
    )
    toolset = Toolset.load(path)
    try:
        assert [t.name for t in toolset.tools] == ["calc.calculator"]
        assert toolset.status["down"].startswith("error: MCP server down failed to start: ")
    finally:
        toolset.close()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"mcpServers": {"a": {"comand": "x"}}},
            "unknown key 'mcpServers.a.comand' (did you mean 'command'?); nearest keys here: command",
        ),
        ({"mcpServers": {"a": {"command": "x", "url": "http://h"}}}, "mcpServers.a: needs exactly one of command"),
        ({"mcpServers": {"a": {"python": "no_such_module:f"}}}, "mcpServers.a.python: cannot import"),
        ({"mcpServers": {"a": {"python": "os.path"}}}, "must look like package.module:function"),
        ({"servers": {}}, "unknown key 'servers'"),
        ({}, "mcpServers is required"),
    ],
)
def test_bad_tool_config_is_one_line_naming_the_field(tmp_path, data, message):
    with pytest.raises(ConfigError) as err:
        Toolset.load(write(tmp_path, data))
    assert message in str(err.value) and "\n" not in str(err.value)


def toolrl(*args):
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=120)


def test_tools_cli_lists_and_calls(config):
    listed = toolrl("tools", "list", str(config))
    assert listed.returncode == 0, listed.stderr
    assert (
        "srv.add" in listed.stdout and "a: integer, b: integer" in listed.stdout and "server srv: ok" in listed.stdout
    )
    called = toolrl("tools", "call", str(config), "add", '{"a": 2, "b": 5}')
    assert (called.returncode, called.stdout.strip()) == (0, "7")
    failed = toolrl("tools", "call", str(config), "calculator", '{"expression": "1/0"}')
    assert (failed.returncode, failed.stdout.strip()) == (
        1,
        "Error: calc.calculator failed: ValueError: division by zero",
    )
    unknown = toolrl("tools", "call", str(config), "nope")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: no tool 'nope';")
    for typo in ("calc.calculater", "calculater"):  # a typo of the full or the short name: the full name offered
        typed = toolrl("tools", "call", str(config), typo)
        assert typed.stderr.startswith(f"error: no tool '{typo}' (did you mean 'calc.calculator'?)"), typed.stderr


def test_tools_list_shows_why_a_server_failed_with_the_tail_of_its_stderr(tmp_path):
    servers = {
        "broken": {"command": sys.executable, "args": [str(FIXTURES / "mcp_server.py"), "--fail-start"]},
        "calc": {"python": "toolrl.envs.calculator.tool:calculator"},
    }
    listed = subprocess.run(
        [sys.executable, "-m", "toolrl", "tools", "list", str(write(tmp_path, {"mcpServers": servers}))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TOOLRL_HOME": str(tmp_path / "home"), "COLUMNS": "400"},
    )
    assert listed.returncode == 1 and "calc.calculator" in listed.stdout and "server calc: ok" in listed.stdout
    status = next(line for line in listed.stdout.splitlines() if line.startswith("server broken:"))
    assert "failed to start: the server exited before answering initialize (exit code 3" in status
    assert "RuntimeError: the config of this server is broken" in status
    assert str(tmp_path / "home" / "logs" / "tools" / "broken.log") in status
    assert "Traceback" not in listed.stderr  # the server's own stderr went to its log, not the terminal
