"""HTTP JSON endpoints, model tools, agent tools and per-tool policies declared in the tool config file."""

import asyncio
import json
from pathlib import Path

import pytest

from tests.fixtures import mcp_server_entry
from tests.fixtures.http_server import LocalHTTPServer
from toolrl.errors import ConfigError
from toolrl.tools import ToolCall, ToolExecutor, ToolPolicy
from toolrl.tools.toolset import Toolset

FIXTURES = Path(__file__).parent.parent / "fixtures"


def load(tmp_path, servers) -> Toolset:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"mcpServers": servers}))
    return Toolset.load(path)


def executor(toolset: Toolset, **default) -> ToolExecutor:
    return ToolExecutor(toolset.tools, policies=toolset.policies(ToolPolicy(**default)))


def call(ex: ToolExecutor, name: str, **arguments):
    return asyncio.run(ex.invoke(ToolCall(name, arguments)))


@pytest.fixture
def web():
    with LocalHTTPServer(api_key="sk-test") as server:
        yield server


def http_servers(url):
    city = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1}}, "required": ["city"]}
    return {
        "weather": {
            "http": {
                "lookup": {"url": f"{url}/lookup", "description": "Facts about a city.", "parameters": city},
                "forecast": {"url": f"{url}/forecast", "method": "GET", "parameters": city},
                "flaky": {"url": f"{url}/flaky"},
                "missing": {"url": f"{url}/nothing-here"},
            },
            "headers": {"X-Team": "toolrl"},
            "policy": {"backoff_s": 0.01},
        }
    }


def test_http_endpoints_send_arguments_and_check_the_declared_schema(tmp_path, web):
    toolset = load(tmp_path, http_servers(web.url))
    try:
        lookup = next(t for t in toolset.tools if t.name == "weather.lookup")
        assert lookup.description == "Facts about a city." and lookup.parameters["required"] == ["city"]
        ex = executor(toolset)
        assert json.loads(call(ex, "weather.lookup", city="Lyon").content) == {"city": "Lyon", "letters": 4}
        assert call(ex, "weather.forecast", city="Oslo").content == "sunny in Oslo"
        assert web.requests[-1][3] == {"city": ["Oslo"]} and web.requests[-1][2]["X-Team"] == "toolrl"
        sent = len(web.requests)
        off_schema = call(ex, "weather.lookup", city=7)
        assert off_schema.error and off_schema.content == "Error: invalid argument: city: 7 is not of type 'string'"
        assert len(web.requests) == sent, "a call off the schema must not reach the server"
        missing = call(ex, "weather.missing")
        assert missing.error and "HTTP 404" in missing.content and ex.metrics["retries"] == 0
        # 503 twice, then 200: retried with backoff as a transient failure.
        assert call(ex, "weather.flaky").content == '{"ok": true}' and ex.metrics["retries"] == 2
    finally:
        toolset.close()


def test_http_endpoint_that_is_down_is_a_transport_fault_retried_since_nothing_was_sent(tmp_path):
    toolset = load(tmp_path, {"api": {"http": {"get": {"url": "http://127.0.0.1:9/x"}}, "connect_timeout_s": 1}})
    try:
        ex = executor(toolset, retries=1, backoff_s=0.01)
        result = call(ex, "api.get")
        assert result.outcome == "transport" and "ConnectError" in result.content
        assert (ex.metrics["retries"], ex.metrics["errors_transport"], ex.metrics["infra_faults"]) == (1, 1, 1)
    finally:
        toolset.close()


def test_openai_compatible_model_tool_with_key_from_the_environment(tmp_path, web, monkeypatch):
    monkeypatch.setenv("HELPER_KEY", "sk-test")
    servers = {
        "helper": {
            "model": {"base_url": f"{web.url}/v1", "model": "m1", "api_key_env": "HELPER_KEY", "system": "Be brief."}
        }
    }
    toolset = load(tmp_path, servers)
    try:
        (tool,) = toolset.tools
        assert tool.name == "helper.ask" and tool.parameters["required"] == ["prompt"]
        ex = executor(toolset)
        assert call(ex, "helper.ask", prompt="hello there").content == "HELLO THERE"
        _, path, headers, body = web.requests[-1]
        assert (path, body["model"], body["messages"][0]) == (
            "/v1/chat/completions",
            "m1",
            {"role": "system", "content": "Be brief."},
        )
        assert headers["Authorization"] == "Bearer sk-test"
        assert call(ex, "helper.ask", prompt="").error
    finally:
        toolset.close()
    monkeypatch.setenv("HELPER_KEY", "wrong")
    toolset = load(tmp_path, servers)
    try:
        denied = call(executor(toolset), "helper.ask", prompt="hi")
        assert denied.error and "HTTP 401" in denied.content
    finally:
        toolset.close()


def test_model_tool_key_variable_unset_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ConfigError, match="NO_SUCH_KEY_VAR"):
        load(tmp_path, {"h": {"model": {"base_url": "http://x/v1", "model": "m", "api_key_env": "NO_SUCH_KEY_VAR"}}})


def test_local_model_tool_answers_like_generate(tmp_path, tiny_model_dir, tiny_model, tokenizer):
    import torch

    toolset = load(tmp_path, {"local": {"model": {"path": str(tiny_model_dir), "max_tokens": 6, "system": "Hi."}}})
    try:
        ex = executor(toolset, timeout_s=120)
        reply = call(ex, "local.ask", prompt="What is 2 + 2?")
        assert not reply.error
        messages = [{"role": "system", "content": "Hi."}, {"role": "user", "content": "What is 2 + 2?"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        ids = ids["input_ids"]
        with torch.inference_mode():
            out = tiny_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        assert reply.content == tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
        assert call(ex, "local.ask", prompt="What is 2 + 2?").content == reply.content  # greedy by default
    finally:
        toolset.close()


def test_agent_tools_run_a_workflow_of_other_tools(tmp_path, web, monkeypatch):
    monkeypatch.setenv("HELPER_KEY", "sk-test")
    servers = {
        "srv": mcp_server_entry(),
        "notes": {"python": "tests.fixtures.pytools:Notes"},
        "helper": {"model": {"base_url": f"{web.url}/v1", "model": "m", "api_key_env": "HELPER_KEY"}},
        "double": {"agent": "tests.fixtures.pytools:double_then_echo"},
        "research": {"agent": "tests.fixtures.pytools:ask_helper", "policy": {"timeout_s": 30}},
        "broken": {"agent": "tests.fixtures.pytools:broken_flow"},
    }
    toolset = load(tmp_path, servers)
    try:
        double = next(t for t in toolset.tools if t.name == "double.double_then_echo")
        assert list(double.parameters["properties"]) == ["a"], "the ToolBox parameter is hidden from the model"
        assert double.parameters["properties"]["a"]["description"] == "The number to double."
        ex = executor(toolset)
        assert call(ex, "double.double_then_echo", a=21).content == "doubled: 42"
        assert call(ex, "research.ask_helper", question="why?").content == "WHY? (note 1)"
        broken = call(ex, "broken.broken_flow")
        assert broken.content == "Error: broken.broken_flow failed: srv.fail failed: inner failure"
        assert call(ex, "double.double_then_echo", a="x").error  # validated like any Python tool
        assert toolset.policies(ToolPolicy())["research.ask_helper"].timeout_s == 30
    finally:
        toolset.close()


def test_policies_from_the_file_layer_over_the_default(tmp_path):
    servers = {
        "calc": {
            "python": "toolrl.envs.calculator.tool:calculator",
            "policy": {"retries": 5, "max_concurrency": 2},
            "policies": {"calculator": {"cache": True, "timeout_s": 3}},
        },
        "notes": {"python": "tests.fixtures.pytools:Notes"},
    }
    toolset = load(tmp_path, servers)
    try:
        policies = toolset.policies(ToolPolicy(timeout_s=7))
        assert policies["calc.calculator"] == ToolPolicy(timeout_s=3, retries=5, max_concurrency=2, cache=True)
        assert policies["notes.echo"] == ToolPolicy(timeout_s=7)
        ex = ToolExecutor(toolset.tools, policies=policies)
        for _ in range(3):
            assert call(ex, "calc.calculator", expression="6 * 7").content == "42"
        assert (ex.metrics["cache_misses"], ex.metrics["cache_hits"]) == (1, 2)
    finally:
        toolset.close()


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ({"a": {"python": "os:getcwd", "policies": {"nope": {}}}}, "mcpServers.a.policies.nope: server a has no tool"),
        ({"a": {"python": "os:getcwd", "policy": {"timeout": 3}}}, "unknown key 'mcpServers.a.policy.timeout'"),
        (
            {"a": {"python": "os:getcwd", "policy": {"retries": -1}}},
            "mcpServers.a.policy.retries must be greater than or equal to 0, got -1",
        ),
        ({"a": {"http": {"x": {"url": "http://h", "methd": "GET"}}}}, "nearest keys here: method,"),
        ({"a": {"http": {"x": {"url": "http://h", "parameters": {"type": 5}}}}}, "a.http.x.parameters: a.x: not a"),
        ({"a": {"model": {"model": "m"}}}, "mcpServers.a.model: needs exactly one of base_url"),
        ({"a": {"model": {"base_url": "http://h/v1"}}}, "model (the served model's name) is required"),
        ({"a": {"agent": "tests.fixtures.pytools:Notes"}}, "must be an async function"),
        ({"a": {"url": "http://h/mcp", "transport": "ws"}}, "mcpServers.a.transport must be one of"),
    ],
)
def test_bad_entries_are_one_line_naming_the_field(tmp_path, servers, message):
    with pytest.raises(ConfigError) as err:
        load(tmp_path, servers)
    assert message in str(err.value) and "\n" not in str(err.value)
