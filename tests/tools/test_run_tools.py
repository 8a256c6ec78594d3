"""A tool config file wired into a run: its tools join the environment's, in the prompt and in rollouts."""

import json
import sys
from pathlib import Path

import pytest

from tests.fixtures import mcp_server_entry, write_tool_config
from tests.rollout.test_loop import ScriptedEngine
from toolrl.config import load_config
from toolrl.config.schema import EnvConfig, ToolsConfig
from toolrl.envs import make_env
from toolrl.errors import ConfigError
from toolrl.parsers import get_parser
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.tools.toolset import run_executor
from toolrl.train import Workbench

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture
def tools_file(tmp_path):
    servers = {
        "srv": mcp_server_entry("add"),
        "notes": {"python": "tests.fixtures.pytools:Notes", "policy": {"timeout_s": 2.5}},
    }
    return write_tool_config(tmp_path / "tools.yaml", servers)


def test_file_tools_join_the_environment_tools_with_their_policies(tools_file):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 1}))
    executor, toolset = run_executor(env.tools(), ToolsConfig(file=str(tools_file), timeout_s=4))
    try:
        assert list(executor.tools) == ["calculator", "srv.add", "notes.add_note", "notes.echo"]
        assert executor.policy("calculator").timeout_s == 4 and executor.policy("srv.add").timeout_s == 4
        assert executor.policy("notes.echo").timeout_s == 2.5
    finally:
        executor.close()
        toolset.close()


def test_a_file_tool_clashing_with_an_environment_tool_is_refused(tmp_path):
    path = tmp_path / "tools.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"python": "toolrl.envs.calculator.tool:calculator"}}}))
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 1}))
    env_tool = env.tools()[0]
    env_tool.name = "x.calculator"
    with pytest.raises(ConfigError, match=r"tools.file: tool 'x.calculator' clashes"):
        run_executor([env_tool], ToolsConfig(file=str(path)))


def test_a_rollout_calls_an_mcp_tool_from_the_file(chat, tools_file):
    env = make_env(EnvConfig(options={"num_train": 1, "num_test": 1}))
    executor, toolset = run_executor(env.tools(), ToolsConfig(file=str(tools_file)))
    try:
        call = {"name": "srv.add", "arguments": {"a": 40, "b": 2}}
        first = chat.encode(f"<tool_call>\n{json.dumps(call)}\n</tool_call>") + [chat.end_of_turn_id]
        second = chat.encode("<answer>42</answer>") + [chat.end_of_turn_id]
        engine = ScriptedEngine([[first, second]])
        limits = RolloutLimits(3, 64, 400, 50)
        rollout = Rollout(env, engine, chat, get_parser("hermes"), executor, limits)
        assert "srv.add" in {s["function"]["name"] for s in rollout.tool_schemas}
        [traj] = rollout.run(env.tasks("test"))
        assert engine.fed[0] == [chat.observation_ids(["42"], model_ended_turn=True)]
        assert (traj.num_tool_calls, traj.stop_reason) == (1, "answer")
    finally:
        executor.close()
        toolset.close()


def test_workbench_offers_the_file_tools_in_the_prompt_and_logs_servers_in_the_run(
    tiny_model_dir, tools_file, tokenizer, tmp_path
):
    config = load_config(overrides=[f"model.name={tiny_model_dir}", "device=cpu", f"tools.file={tools_file}"])
    bench = Workbench.load(config, log_dir=tmp_path / "run" / "tools")
    try:
        rollout = bench.rollout(config.rollout.sampling, seed=0)
        prompt = tokenizer.decode(rollout.prompt_ids(bench.env.tasks("test")[0]))
        assert '"name": "srv.add"' in prompt and '"name": "calculator"' in prompt
    finally:
        bench.close()
    assert f"starting {sys.executable}" in (tmp_path / "run" / "tools" / "srv.log").read_text()
