"""A harness program works in Harbor tasks' boxes through the gateway: toolrl's bash agent (a separate process that
speaks the OpenAI API to the gateway and runs its calls through the box server) solves a task when its policy
says the right command, is scored by the task's own tests, and trains two steps from the command line."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from tests.envs.test_harbor import ROOT, write_task
from tests.gateway.policies import RulePolicy, answered, call
from tests.gateway.test_agent_env import trained_steps
from toolrl.config.schema import EnvConfig
from toolrl.envs.base import make_env
from toolrl.gateway import Gateway
from toolrl.parsers import get_parser
from toolrl.sandbox import BoxSpec, make_provider
from toolrl.sandbox.serve import BoxServer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and shutil.which("unshare") is None,
                                reason="no sandbox on this machine")  # fmt: skip
AGENT = [sys.executable, "-m", "toolrl.envs.harbor.bash_agent"]


def counting(context: str, params) -> str:
    """Counts the lines as the count-lines task asks, then says it is done."""
    if answered(context):
        return "Done."
    return call("bash", command="wc -l < /app/data.txt > /app/count.txt")


def test_the_bash_agent_solves_a_task_in_its_box_through_the_gateway(chat):
    env = make_env(EnvConfig(name="harbor", options={"agent": AGENT, "tasks": ["count-lines", "uppercase"]}))
    gateway = Gateway(RulePolicy(chat, counting), chat, get_parser("hermes"), "policy").start()

    async def both():
        results = []
        for task in env.tasks("train"):
            sample = gateway.open_sample(task)
            results.append(await env.run_agent(task, gateway.base_url(sample), gateway.key))
            gateway.close_sample(sample.id)
        return results

    try:
        counted, shouted = asyncio.run(both())
    finally:
        gateway.stop()
        env.close()
    assert counted["reward"] == 1.0 and counted["verify_error"] is None and counted["agent"]["calls"] == 1
    assert shouted["reward"] == 0.0  # the same command does not upper-case a file: its tests say so
    assert env.provider.leftovers() == []


def test_the_box_server_refuses_requests_without_the_box_s_token():
    provider = make_provider({"provider": "local"})
    server = BoxServer().start()

    async def run() -> list[int | str]:
        box = await provider.start(BoxSpec())
        url, token = server.register(box, asyncio.get_running_loop())
        other, _ = server.register(box, asyncio.get_running_loop())

        def post(address: str, body: object, key: str) -> int | str:
            request = urllib.request.Request(f"{address}/exec", json.dumps(body).encode(), method="POST",
                                             headers={"Authorization": f"Bearer {key}"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return json.load(response)["output"].strip()
            except urllib.error.HTTPError as exc:
                return exc.code

        try:
            return await asyncio.gather(*(asyncio.to_thread(post, *args) for args in (
                (url, {"command": "echo ok"}, token), (url, {"command": "echo no"}, "guess"),
                (other, {"command": "echo no"}, token), (url, ["echo"], token),
                (url, {"command": "echo", "timeout_s": 10**6}, token),
                (url[:-4] + "0000", {"command": "x"}, token))))  # fmt: skip
        finally:
            await box.stop()

    try:
        assert asyncio.run(run()) == ["ok", 401, 401, 400, 400, 404]
    finally:
        server.stop()
        provider.close()


def train(tmp_path, tiny_model_dir, agent: list[str], *more: str) -> list[str]:
    return [sys.executable, "-m", "toolrl", "train", "--set", "env.name=harbor",
            "--set", f"env.options.agent={json.dumps(agent)}", *more,
            "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
            "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=16",
            "--set", "eval.at_start=false", "--set", "eval.at_end=false",
            "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run"]  # fmt: skip


def test_a_harness_of_ones_own_trains_two_steps_from_the_command_line(tmp_path, tiny_model_dir):
    """A Harbor reward need not be 0 or 1: here the note's first digit over 4. The harness numbers its runs so that
    a step's 4 samples get 4 different rewards (the tiny model's notes alone may tie within a group): both steps
    train, and the rewards are the tests' own."""
    task = write_task(tmp_path / "tasks", "note", test_sh="#!/bin/bash\nd=$(head -c 1 /work/note.txt)\n"
                      "printf '%s\\n' \"0.$(( d * 25 ))\" > /logs/verifier/reward.txt\n")  # fmt: skip
    agent = [sys.executable, str(ROOT / "tests" / "fixtures" / "harbor_harness.py")]
    (tmp_path / "tickets").mkdir()
    command = train(tmp_path, tiny_model_dir, agent, "--set", f"env.options.path={task}")
    steps = trained_steps(tmp_path, command, HARNESS_TICKETS=str(tmp_path / "tickets"))
    assert all(s.get("reward/requests", 0) >= 4 and s["reward/verified"] == 1.0 for s in steps), steps[-1]
    assert [s["reward"] for s in steps] == [0.375, 0.375]  # (0 + 0.25 + 0.5 + 0.75) / 4, each step
    assert len(list((tmp_path / "tickets").iterdir())) == 8


def test_the_bash_agent_runs_two_training_steps_on_the_fixture_tasks(tmp_path, tiny_model_dir):
    """The tiny model writes no command that solves a task: the steps run end to end, verified, without failures."""
    command = train(tmp_path, tiny_model_dir, AGENT, "--set", "env.options.tasks=[count-lines, fix-add]")
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "TOOLRL_AGENT_TURNS": "2"},
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [s for s in map(json.loads, lines) if "step" in s and "eval" not in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["reward/requests"] >= 4 and s["reward/verified"] == 1.0 for s in steps), steps[-1]
    assert all(not s.get("reward/agent_failures") and not s.get("reward/verify_errors") for s in steps), steps[-1]
