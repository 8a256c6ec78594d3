"""One way to give a config to every command that takes one (issue 51, item 5): the config file as an argument,
`--config FILE` accepted as the same. The commands are walked from the application, so a command added later
that takes a config is held to it."""

import json

import pytest

from tests.test_cli_usage import COMMANDS, run

TAKES_CONFIG = {path for path, command in COMMANDS.items() if any(p.name == "config" for p in command.params)}


def test_every_command_that_takes_a_config_takes_it_as_an_argument_and_as_config():
    assert {("train",), ("sft",), ("eval",), ("env", "check"), ("config", "show"), ("serve",)} <= TAKES_CONFIG
    for path in TAKES_CONFIG:
        params = {p.name: p for p in COMMANDS[path].params}
        options = {o for p in params.values() for o in getattr(p, "opts", [])}
        assert "--config" in options, f"toolrl {' '.join(path)}: no --config"
        # an argument: CONFIG itself, or (serve) the positional that takes a YAML file as the config
        assert any(p.param_type_name == "argument" for p in params.values()), f"toolrl {' '.join(path)}"


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "calc.yaml"
    path.write_text("env:\n  name: calculator\neval:\n  num_tasks: 2\nseed: 7\n")
    return path


def test_config_show_reads_the_same_file_either_way(config_file, monkeypatch, capsys):
    code, argument, _ = run(["config", "show", str(config_file)], monkeypatch, capsys)
    assert code == 0 and "seed: 7" in argument
    code, option, _ = run(["config", "show", "--config", str(config_file)], monkeypatch, capsys)
    assert code == 0 and option == argument


def test_two_different_configs_are_refused_in_one_line(config_file, tmp_path, monkeypatch, capsys):
    other = tmp_path / "other.yaml"
    other.write_text("seed: 1\n")
    code, out, err = run(["config", "show", str(config_file), "--config", str(other)], monkeypatch, capsys)
    assert code != 0 and out == ""
    assert err.strip().count("\n") == 0 and "config given twice" in err and "give one" in err


def test_eval_and_env_check_take_the_config_as_an_argument(config_file, monkeypatch, capsys):
    """`toolrl eval` had needed --config while `toolrl env check` took the file as an argument."""
    for argv in (["eval", str(config_file), "--policy", "idle", "--json"],
                 ["eval", "--config", str(config_file), "--policy", "idle", "--json"]):  # fmt: skip
        code, out, err = run(argv, monkeypatch, capsys)
        assert code == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1])["tasks"] == 2  # eval.num_tasks from the file
    code, out, err = run(["env", "check", "--config", str(config_file), "--json"], monkeypatch, capsys)
    assert code == 0 and json.loads(out.strip().splitlines()[-1])["env"] == "calculator", err[-2000:]


def test_a_tool_config_is_given_the_same_two_ways(tmp_path, monkeypatch, capsys):
    from tests.fixtures import write_tool_config

    tools = write_tool_config(tmp_path / "tools.json", {"calc": {"python": "toolrl.envs.calculator.tool:calculator"}})
    for argv in (["tools", "call", str(tools), "calc.calculator", '{"expression": "6 * 7"}'],
                 ["tools", "call", "--config", str(tools), "calc.calculator", '{"expression": "6 * 7"}']):  # fmt: skip
        code, out, _ = run(argv, monkeypatch, capsys)
        assert (code, out.strip()) == (0, "42"), argv
    code, out, _ = run(["tools", "list", "--config", str(tools), "--json"], monkeypatch, capsys)
    assert code == 0 and [t["function"]["name"] for t in json.loads(out)["tools"]] == ["calc.calculator"]
    code, _, err = run(["tools", "list"], monkeypatch, capsys)
    assert code == 2 and err.strip().count("\n") == 0 and "--config FILE" in err
