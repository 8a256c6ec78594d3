"""verifiers 0.4 (verifiers.v1) both ways, with the real package in a venv of its own (`make test-verifiers`
makes .venv-verifiers-v1 and sets TOOLRL_VERIFIERS_V1_PYTHON; verifiers pins openai and mcp versions toolrl's do
not meet). A v1 environment (a taskset and a harness) plays in toolrl and trains: `env.options.taskset`. A toolrl
environment plays in verifiers 0.4: served by `toolrl env serve-openenv`, played through verifiers' own `openenv`
taskset by its harness. Without the package, the options' checks run in `make test`."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fixtures.openenv_server import served_openenv
from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.errors import ConfigError
from toolrl.gateway import Gateway
from toolrl.parsers import get_parser
from toolrl.rollout.agent import AgentRollout
from toolrl.rollout.engine import Engine, Sampled

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "verifiers_v1"
V1_PYTHON = os.environ.get("TOOLRL_VERIFIERS_V1_PYTHON")
real = pytest.mark.skipif(
    not V1_PYTHON, reason="needs verifiers 0.4 in its own venv: make test-verifiers (TOOLRL_VERIFIERS_V1_PYTHON)"
)


class Adder(Engine):
    """Plays the adder: calls the offered add tool (verifiers names it after its toolset) on the question's
    numbers, then states the sum; `wrong` states one more than the sum."""

    def __init__(self, chat, wrong: bool = False):
        self.chat, self.wrong = chat, wrong

    async def generate(self, seq, tokens, params):
        text = self.chat.tokenizer.decode(tokens)
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
        if "<|im_start|>tool\n" in text:
            reply = f"The sum is {a + b + self.wrong}."
        else:
            name = re.findall(r'"name": "(\w*add)"', text)[0]
            reply = f'<tool_call>\n{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
        ids = self.chat.encode(reply)
        return Sampled(ids + [self.chat.end_of_turn_id], [-0.5] * (len(ids) + 1), True)


def v1_env(*more):
    config = load_config(overrides=["env.name=verifiers", "env.options.taskset=toolrl_v1_adder",
                                    f"env.options.python={V1_PYTHON}", "env.options.harness={id: 'null'}",
                                    "env.options.args={num_tasks: 8}", "env.options.num_test=2", *more])  # fmt: skip
    return make_env(config.env)


@pytest.fixture
def on_path(monkeypatch):
    """The fixture taskset's folder on the path, as a user's own module in the run's folder would be."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FIXTURES), os.environ.get("PYTHONPATH", "")]))


@real
def test_a_verifiers_v1_taskset_plays_through_the_gateway_with_its_harness_and_its_tasks_rewards(on_path, chat):
    """tests/fixtures/verifiers_v1/toolrl_v1_adder.py: tasks offering an MCP toolset, played by verifiers' own
    `null` harness (its chat program, run by uv) in the subprocess runtime. Its tools reach the model's prompt
    through the harness's request, the call runs in verifiers' tool server, and the task's @vf.reward is the
    sample's reward (0 where the reply states a wrong sum)."""
    env = v1_env()
    try:
        assert [t.id for t in env.tasks("test")] == ["test-6", "test-7"]
        assert len(env.tasks("train")) == 6 and env.tasks("train")[0].question.startswith("What is ")
        for wrong in (False, True):
            gateway = Gateway(Adder(chat, wrong), chat, get_parser("hermes"), "tiny").start()
            try:
                trajs = AgentRollout(env, gateway, None, chat).run(env.tasks("test"))
            finally:
                gateway.stop()
            for traj in trajs:
                assert traj.env_fault is None and traj.num_turns == 2 and traj.num_tool_calls == 1
                assert traj.reward == (0.0 if wrong else 1.0) and traj.rewards["vf/correct"] == traj.reward
                (result,) = traj.results
                assert result.call.name.endswith("add") and int(result.content) == int(traj.task.answer)
                prompt = chat.tokenizer.decode(traj.token_ids[: traj.prompt_length])
                assert "Add two integers." in prompt  # its schema, from the request's tools
    finally:
        env.close()


@real
@pytest.mark.parametrize(
    ("taskset", "message"),
    [("no_such_taskset", "not found"), ("json", "exports no Taskset subclass")],
)
def test_a_taskset_that_does_not_load_is_a_one_line_error_naming_the_option(on_path, taskset, message):
    with pytest.raises(ConfigError) as raised:
        v1_env(f"env.options.taskset={taskset}").tasks("train")
    text = str(raised.value)
    assert text.startswith("env.options.taskset:") and message in text and "\n" not in text


@real
def test_a_verifiers_v1_taskset_trains_two_steps_from_the_command_line(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(FIXTURES)])}
    command = [sys.executable, "-m", "toolrl", "train", "--set", "env.name=verifiers",
               "--set", "env.options.taskset=toolrl_v1_adder", "--set", "env.options.harness={id: 'null'}",
               "--set", f"env.options.python={V1_PYTHON}",
               "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
               "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=16",
               "--set", "eval.at_start=false", "--set", "eval.at_end=false",
               "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "step" in s and "eval" not in s]
    assert [s["step"] for s in trained] == [1, 2]
    assert all("reward/vf/correct" in s and s["env_faults"] == 0 for s in trained)


# verifiers 0.4 playing a toolrl environment: its `openenv` taskset against `toolrl env serve-openenv`.

PLAY = textwrap.dedent("""
    import asyncio, json, os, sys
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    url, gateway, key, resets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    os.environ["GATEWAY_KEY"] = key
    config = resolve_env_config({"taskset": {"id": "openenv", "base_url": url, "resets": resets},
                                 "player": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}})
    env = load_environment(config)

    async def main():
        ctx = vf.ModelContext(model="tiny", client=vf.EvalClientConfig(base_url=gateway, api_key_var="GATEWAY_KEY"))
        async with env.serving():
            episodes = await asyncio.gather(*(env.run_episode(task, ctx) for task in env.taskset))
        for episode in episodes:
            if not episode.traces:
                print(json.dumps({"ok": False, "reward": None, "turns": 0,
                                  "errors": [e.message[:300] for e in episode.errors]}))
                continue
            trace = episode.traces[0]
            print(json.dumps({"ok": episode.ok, "reward": trace.reward, "turns": trace.num_turns,
                              "errors": [e.message[:300] for e in [*episode.errors, *trace.errors]]}))

    asyncio.run(main())
""")


class Calculator(Engine):
    """Plays the served calculator from what verifiers' openenv taskset shows it (the observation as JSON): the
    question gets a call in the environment's syntax, the tool's result the answer (`wrong`: a wrong one)."""

    def __init__(self, chat, wrong: bool = False):
        self.chat, self.wrong = chat, wrong

    async def generate(self, seq, tokens, params):
        text = self.chat.tokenizer.decode(tokens)
        shown = text.rsplit("<|im_start|>user\n", 1)[-1].split("<|im_end|>")[0]
        prompt = json.loads(shown)["observation"]["prompt"]
        if prompt.startswith("What is "):
            arguments = json.dumps({"expression": prompt.removeprefix("What is ").removesuffix("?")})
            reply = f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>'
        else:
            reply = f"<answer>{'-1' if self.wrong else prompt}</answer>"
        ids = self.chat.encode(reply)
        return Sampled(ids + [self.chat.end_of_turn_id], [-0.5] * (len(ids) + 1), True)


@real
def test_a_toolrl_environment_plays_in_verifiers_v1_through_its_openenv_taskset(tmp_path, chat):
    """The calculator behind `toolrl env serve-openenv`; verifiers 0.4 loads it as a taskset (one task per reset:
    toolrl's test tasks by id) and plays it with its `null` harness against a gateway. toolrl's rubric scores each
    episode: the reward verifiers records is the served environment's (correct answers score more than wrong)."""
    calculator = make_env(load_config(overrides=["env.name=calculator"]).env)
    resets = [{"seed": 0, "split": "test", "task_id": task.id} for task in calculator.tasks("test")[:2]]
    with served_openenv(tmp_path) as url:
        rewards = {}
        for wrong in (False, True):
            gateway = Gateway(Calculator(chat, wrong), chat, get_parser("hermes"), "tiny").start()
            try:
                path = f"{Path(V1_PYTHON).parent}:{os.environ['PATH']}"  # uv, for the harness's program
                done = subprocess.run([V1_PYTHON, "-c", PLAY, url, gateway.base_url(), gateway.key, json.dumps(resets)],
                                      capture_output=True, text=True, timeout=600, cwd=tmp_path,
                                      env={**os.environ, "PATH": path})  # fmt: skip
            finally:
                gateway.stop()
            assert done.returncode == 0, done.stderr[-3000:]
            episodes = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            assert len(episodes) == 2, done.stderr[-3000:]
            assert all(e["ok"] and not e["errors"] and e["turns"] == 2 for e in episodes), episodes
            rewards[wrong] = [e["reward"] for e in episodes]
        assert all(r > 1.0 for r in rewards[False])
        assert all(w < r for w, r in zip(rewards[True], rewards[False], strict=True))


# Without verifiers: the options.


@pytest.mark.parametrize("both", [True, False])
def test_a_verifiers_run_names_an_environment_or_a_taskset_one_of_them(both):
    extra = ["env.options.environment=some-env", "env.options.taskset=some_taskset"] if both else []
    with pytest.raises(ConfigError, match=r"env.options.environment .* or env.options.taskset"):
        make_env(load_config(overrides=["env.name=verifiers", *extra]).env)


STANDIN = str(ROOT / "tests" / "fixtures" / "standin_verifiers")


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([STANDIN, os.environ.get("PYTHONPATH", "")]))


def test_the_bridge_plays_a_v1_taskset_inside_its_serving_resources_and_reports_its_failed_episodes(standin, chat):
    """Through the real bridge process, against a stand-in of verifiers.v1: each sample is one episode run inside
    the env's serving() (entered once for the run), against the sample's base URL with the gateway's key; its
    reward is the sum of the trace's rewards, each kept as vf/NAME with the metrics; an episode verifiers reports
    as failed fails its sample with verifiers' error; an unknown taskset names env.options.taskset."""

    class Doubler(Engine):
        async def generate(self, seq, tokens, params):
            k = int(re.findall(r"What is (\d+) \+", chat.tokenizer.decode(tokens))[-1])
            ids = chat.encode(f"It is {2 * k}.")
            return Sampled(ids + [chat.end_of_turn_id], [-0.5] * (len(ids) + 1), True)

    def standin_env(*more):
        config = load_config(overrides=["env.name=verifiers", "env.options.taskset=standin",
                                        f"env.options.python={sys.executable}", *more])  # fmt: skip
        return make_env(config.env)

    env, failing = standin_env("env.options.args={n: 8}"), standin_env("env.options.args={n: 8, fault: fail}")
    gateway = Gateway(Doubler(), chat, get_parser("hermes"), "tiny").start()
    bridge = env.bridge
    try:
        assert len(env.tasks("train")) == 6 and [t.answer for t in env.tasks("test")] == ["12", "14"]
        trajs = AgentRollout(env, gateway, None, chat).run(env.tasks("test"))
        assert [t.reward for t in trajs] == [1.5, 1.5] and all(t.env_fault is None for t in trajs)
        assert all(t.rewards["vf/said"] == 1.0 and t.rewards["vf/chars"] == len("It is 12.") for t in trajs[:1])
        failed = AgentRollout(failing, gateway, None, chat).run(failing.tasks("test"))
        assert all(t.reward == 0 and "ToolsetError: server did not report its port" in t.env_fault for t in failed)
    finally:
        gateway.stop()
        env.close()
        failing.close()
    assert bridge.process.returncode == 0  # serving() left as the run closed
    with pytest.raises(ConfigError, match=r"^env.options.taskset: 'nothing' did not load: ModuleNotFoundError"):
        standin_env("env.options.taskset=nothing").tasks("train")


def test_a_taskset_without_end_is_cut_and_the_run_says_so(standin, caplog):
    config = load_config(overrides=["env.name=verifiers", "env.options.taskset=standin", "env.options.num_test=2",
                                    f"env.options.python={sys.executable}",
                                    "env.options.args={endless: true}"])  # fmt: skip
    env = make_env(config.env)
    try:
        with caplog.at_level("WARNING"):
            assert len(env.tasks("train")) + len(env.tasks("test")) == 10_000
        assert "the taskset has no end: its first 10000 tasks are taken" in caplog.text
    finally:
        env.close()
