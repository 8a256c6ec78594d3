"""OpenEnv environments as toolrl environments (tests/fixtures/openenv_guess.py, written with openenv-core and
served in its own process), and a toolrl environment served as an OpenEnv server."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from toolrl.config import load_config
from toolrl.envs import make_env
from toolrl.rollout import Rollout, RolloutLimits
from toolrl.rollout.engine import Engine, Sampled
from toolrl.tools import ToolExecutor

ROOT = Path(__file__).parents[2]
SERVER = f"env.options.command=[{sys.executable}, -m, tests.fixtures.openenv_guess, '{{port}}']"


class Says(Engine):
    """Replies `text` every turn."""

    def __init__(self, chat, text):
        self.ids = [*chat.encode(text), chat.end_of_turn_id]

    async def generate(self, seq, tokens, params):
        return Sampled(list(self.ids), [-0.2] * len(self.ids), True)


def test_an_openenv_server_is_played_episode_by_episode_over_its_websocket(chat):
    env = make_env(load_config(overrides=["env.name=openenv", SERVER, "env.options.num_test=8"]).env)
    tasks = env.tasks("test")
    rollout = Rollout(env, Says(chat, "I guess 5."), chat, env.syntax, ToolExecutor([]), RolloutLimits(6, 16, 2000, 64))
    trajs = rollout.run(tasks)
    for traj, task in zip(trajs, tasks, strict=True):
        secret = random.Random(task.meta["seed"]).randint(1, 10)
        assert traj.stop_reason == "env_done"
        if secret == 5:
            assert traj.reward == 1.0 and traj.num_turns == 1
        else:  # three tries, each told the same hint, then the server ends it
            hint = "Higher." if secret > 5 else "Lower."
            assert traj.reward == 0.0 and traj.num_turns == 3 and traj.user_messages == [hint, hint]
    prompt = chat.tokenizer.decode(trajs[0].token_ids[: trajs[0].prompt_length])
    assert "Guess my number from 1 to 10" in prompt  # the reset observation is the first user message


def test_an_openenv_environment_trains_two_steps_from_the_command_line(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "toolrl", "train", "--set", "env.name=openenv", "--set", SERVER,
               "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
               "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=8",
               "--set", "rollout.max_turns=3", "--set", "eval.at_start=false", "--set", "eval.at_end=false",
               "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "step" in s and "eval" not in s] == [1, 2]


def test_a_toolrl_environment_served_as_openenv_is_played_by_openenv_cores_client(tmp_path):
    """The calculator environment behind `toolrl env serve-openenv`, played by openenv-core's own client: a call
    runs the tool, the answer ends the episode with the rubric's reward; a wrong answer scores less."""
    import asyncio

    from openenv.core import GenericEnvClient

    from tests.fixtures.openenv_server import served_openenv

    with served_openenv(tmp_path) as url:
        calculator = make_env(load_config(overrides=["env.name=calculator"]).env)
        task = calculator.tasks("test")[0]
        expression = task.question.removeprefix("What is ").removesuffix("?")

        async def play(answer: str | None):
            async with GenericEnvClient(base_url=url) as client:
                first = await client.reset(seed=0, split="test", task_id=task.id)
                arguments = json.dumps({"expression": expression})
                call = f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>'
                result = await client.step({"message": call})
                final = await client.step({"message": f"<answer>{answer or result.observation['prompt']}</answer>"})
                return first, result, final

        first, result, final = asyncio.run(play(None))
        assert first.observation["prompt"] == task.question and first.observation["tools"][0]["function"]["name"] == (
            "calculator"
        )
        assert result.observation["prompt"] == task.answer and not result.done
        assert final.done and final.observation["rewards"]["correct"] == 1.0 and final.reward > 1.0
        wrong = asyncio.run(play("-1"))[2]
        assert wrong.done and wrong.observation["rewards"]["correct"] == 0.0 and wrong.reward < final.reward
