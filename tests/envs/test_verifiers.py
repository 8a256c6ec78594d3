"""verifiers environments as toolrl environments (`env.name: verifiers`): the environment's own rollout loop and
rubric run in the interpreter that has verifiers, through toolrl's bridge; its model calls go to the gateway.

The tests marked `real` need verifiers itself: `make test-verifiers` makes .venv-verifiers and runs them with
TOOLRL_VERIFIERS_PYTHON set (verifiers pins openai and mcp versions toolrl's do not meet, so it cannot share
toolrl's environment). The others run in `make test`: the bridge's protocol and faults, against a stand-in of the
package's surface (tests/fixtures/standin_verifiers) and against an interpreter without verifiers."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.errors import ConfigError
from toolrl.gateway import Gateway
from toolrl.parsers import get_parser
from toolrl.rollout.agent import AgentRollout
from toolrl.rollout.engine import Engine, Sampled

ROOT = Path(__file__).parents[2]
VERIFIERS_PYTHON = os.environ.get("TOOLRL_VERIFIERS_PYTHON")
real = pytest.mark.skipif(
    not VERIFIERS_PYTHON, reason="needs verifiers in its own venv: make test-verifiers (TOOLRL_VERIFIERS_PYTHON)"
)
STANDIN = str(ROOT / "tests" / "fixtures" / "standin_verifiers")


class Solver(Engine):
    """Plays the adder: calls `add` on the question's numbers, then states the tool's result."""

    def __init__(self, chat):
        self.chat = chat

    async def generate(self, seq, tokens, params):
        text = self.chat.tokenizer.decode(tokens)
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", text)[-1])
        results = re.findall(r"<\|im_start\|>tool\n(\d+)<\|im_end\|>", text)
        if results:
            reply = f"The sum is {results[-1]}."
        else:
            reply = f'<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
        ids = self.chat.encode(reply)
        return Sampled(ids + [self.chat.end_of_turn_id], [-0.5] * (len(ids) + 1), True)


def verifiers_env(environment, python, *more):
    config = load_config(overrides=["env.name=verifiers", f"env.options.environment={environment}",
                                    f"env.options.python={python}", *more])  # fmt: skip
    return make_env(config.env)


@pytest.fixture
def run_with(chat):
    """(env, engine) -> the test split's trajectories through a gateway over `engine`."""
    made = []

    def run(env, engine=None, tasks=None):
        gateway = Gateway(engine or Solver(chat), chat, get_parser("hermes"), "tiny").start()
        made.append((env, gateway))
        return AgentRollout(env, gateway, None, chat).run(tasks if tasks is not None else env.tasks("test"))

    yield run
    for env, gateway in made:
        env.close()
        gateway.stop()


@real
def test_a_verifiers_tool_environment_runs_its_tool_loop_through_the_gateway_and_scores_with_its_rubric(run_with, chat):
    """tests/fixtures/verifiers_envs.py's adder (a vf.ToolEnv) loads, its tools reach the model's prompt, the call
    the model writes is run by verifiers and its result comes back as an observation; the rubric's reward and
    metrics are the sample's."""
    env = verifiers_env("tests.fixtures.verifiers_envs:adder", VERIFIERS_PYTHON, "env.options.args={num_examples: 8}")
    assert [t.id for t in env.tasks("test")] == ["test-6", "test-7"]  # no eval dataset: the last ones held out
    assert len(env.tasks("train")) == 6 and env.tasks("train")[0].question == "What is 0 + 3? Use the add tool."
    trajs = run_with(env)
    for traj in trajs:
        assert traj.stop_reason == "agent_done" and traj.env_fault is None
        assert traj.num_turns == 2 and traj.num_tool_calls == 1
        assert traj.reward == 1.0 and traj.rewards["vf/sum_in_reply"] == 1.0
        assert traj.rewards["vf/add_calls"] == 1.0  # ToolEnv's own metric, logged beside (weight 0)
        (result,) = traj.results
        assert result.call.name == "add" and result.content == traj.task.answer  # verifiers ran the tool
        prompt = chat.tokenizer.decode(traj.token_ids[: traj.prompt_length])
        assert '"name": "add"' in prompt and "Add two integers." in prompt  # its schema, from the tools field
    assert env.counts.stats["requests"] == 4 and env.counts.stats["continued_requests"] == 2


@real
def test_a_verifiers_environments_eval_dataset_is_the_test_split():
    env = verifiers_env("tests.fixtures.verifiers_envs:echo", VERIFIERS_PYTHON)
    try:
        assert [t.answer for t in env.tasks("test")] == ["203", "205", "207"]
        assert len(env.tasks("train")) == 6
    finally:
        env.close()


@real
def test_a_verifiers_rollout_that_hangs_or_raises_fails_its_sample_only(run_with, chat):
    sleepy = verifiers_env("tests.fixtures.verifiers_envs:sleepy", VERIFIERS_PYTHON, "env.options.timeout_s=3")
    hung = run_with(sleepy, tasks=sleepy.tasks("train")[:2])
    assert all("timeout_s (3 s)" in t.env_fault and t.reward == 0 for t in hung)
    assert sleepy.bridge.alive  # the rollout was cancelled, the bridge serves on
    broken = verifiers_env("tests.fixtures.verifiers_envs:broken", VERIFIERS_PYTHON)
    failed = run_with(broken, tasks=broken.tasks("train")[:2])
    assert all(t.reward == 0 for t in failed)
    for t in failed:  # verifiers' rubric catches its function's error and scores 0, or toolrl reports it
        assert t.env_fault is None or "broken on purpose" in t.env_fault


@real
@pytest.mark.parametrize(
    ("environment", "message"),
    [("tests.fixtures.verifiers_envs:not_an_environment", "gave a dict, not a verifiers Environment"),
     ("no-such-environment", "did not load"), ("tests.fixtures.verifiers_envs:nothing_here", "did not load")],
)  # fmt: skip
def test_an_environment_that_does_not_load_is_a_one_line_error_naming_the_option(environment, message):
    with pytest.raises(ConfigError) as raised:
        verifiers_env(environment, VERIFIERS_PYTHON).tasks("train")
    text = str(raised.value)
    assert text.startswith("env.options.environment:") and message in text and "\n" not in text


@real
def test_a_verifiers_environment_trains_two_steps_from_the_command_line(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "toolrl", "train", "--set", "env.name=verifiers",
               "--set", "env.options.environment=tests.fixtures.verifiers_envs:adder",
               "--set", f"env.options.python={VERIFIERS_PYTHON}",
               "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
               "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=16",
               "--set", "eval.at_start=false", "--set", "eval.at_end=false",
               "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "step" in s and "eval" not in s]
    assert [s["step"] for s in trained] == [1, 2]
    assert all("reward/vf/said_something" in s and s["env_faults"] == 0 for s in trained)


# Without verifiers: the bridge's protocol and faults (stand-in package), an interpreter that lacks it.


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([STANDIN, os.environ.get("PYTHONPATH", "")]))


def test_the_bridge_runs_rollouts_against_the_gateway_and_survives_what_its_environment_does(standin, run_with, chat):
    """Through the real bridge process: rollouts run against per-sample base URLs; one past its
    deadline is cancelled and fails alone; an environment printing to stdout does not break the protocol; a
    reward that is not a finite number fails its sample; a bridge that dies fails the samples it was running and
    is started again for the next ones."""

    class Echo(Engine):
        async def generate(self, seq, tokens, params):
            question = re.findall(r"What is (\d+) \+ (\d+)\?", chat.tokenizer.decode(tokens))[-1]
            ids = chat.encode(f"It is {int(question[0]) * 2}.")
            return Sampled(ids + [chat.end_of_turn_id], [-0.5] * (len(ids) + 1), True)

    env = verifiers_env("standin", sys.executable, "env.options.args={n: 8}")
    assert len(env.tasks("train")) == 6 and len(env.tasks("test")) == 2
    trajs = run_with(env, Echo())
    assert [t.reward for t in trajs] == [1.0, 1.0] and all(t.rewards["vf/replied"] == 1.0 for t in trajs)
    assert all(t.stop_reason == "agent_done" and t.num_turns == 1 and sum(t.loss_mask) > 0 for t in trajs)

    faults = [("hang", "timeout_s (2 s)"), ("print", None), ("nan", "gave no finite reward"),
              ("die", "the verifiers bridge exited")]  # fmt: skip
    for fault, expected in faults:  # only the hang waits for its timeout; the others have room on a busy machine
        timeout = 2 if fault == "hang" else 120
        other = verifiers_env("standin", sys.executable, f"env.options.args={{n: 8, fault: {fault}}}",
                              f"env.options.timeout_s={timeout}")  # fmt: skip
        trajs = run_with(other, Echo())
        if expected is None:
            assert [t.reward for t in trajs] == [1.0, 1.0]
        else:
            assert all(t.reward == 0 and expected in t.env_fault for t in trajs), [t.env_fault for t in trajs]
    assert other.counts.stats["agent_failures"] == 2 and other.counts.stats["bridge_unreadable_lines"] == 0
    other.options.args = {"n": 8}  # the next bridge is started with a healthy environment
    again = run_with(other, Echo())
    assert [t.reward for t in again] == [1.0, 1.0] and other.counts.stats["bridge_restarts"] == 1


def test_an_interpreter_without_verifiers_is_a_one_line_error_naming_the_option():
    with pytest.raises(ConfigError) as raised:
        verifiers_env("standin", sys.executable).tasks("train")  # toolrl's own interpreter: no verifiers in it
    text = str(raised.value)
    assert text.startswith("env.options.python:") and "cannot import verifiers" in text and "\n" not in text
    with pytest.raises(ConfigError, match=r"^env.options.python: cannot run '/no/such/python'"):
        verifiers_env("standin", "/no/such/python").tasks("train")


def test_the_bridge_exits_when_the_run_closes(standin):
    env = verifiers_env("standin", sys.executable)
    env.tasks("train")
    bridge = env.bridge
    env.close()
    assert bridge.process.poll() is not None  # it ended on its own when its input closed, not killed
    assert bridge.process.returncode == 0
