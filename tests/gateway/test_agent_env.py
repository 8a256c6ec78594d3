"""An agent you already have (tests/fixtures/agents.py, written with the `openai` SDK) trained as it is: the
`agent` environment runs it per sample against the gateway, from a config and the command line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.agents import CALCULATOR
from toolrl.config import load_config
from toolrl.train import Workbench

ROOT = Path(__file__).parents[2]


def tasks_file(tmp_path, n=4):
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def agent_config(tmp_path, tiny_model_dir, agent="calculator_agent", *more):
    path = tasks_file(tmp_path)
    return load_config(overrides=[
        "env.name=agent", f"env.train_file={path}", f"env.test_file={path}",
        f"env.options.agent=tests.fixtures.agents:{agent}", "env.options.reward=tests.fixtures.agents:score",
        f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=24", *more,
    ])  # fmt: skip


def test_an_agent_is_run_per_sample_and_its_failures_fail_its_sample_only(tmp_path, tiny_model_dir):
    bench = Workbench.load(agent_config(tmp_path, tiny_model_dir))
    try:
        trajs = bench.evaluation(num_tasks=4, temperature=1.0)
        assert len(trajs) == 4 and all(t.stop_reason == "agent_done" for t in trajs)
        assert all(sum(t.loss_mask) > 0 and t.num_turns >= 1 for t in trajs)  # the model's turns, to train on
        for t in trajs:  # the turns as sampled: every trained token has its sampling log-prob
            assert len(t.trained_logprobs) == sum(t.loss_mask) and all(lp <= 0 for lp in t.trained_logprobs)
        stats = bench.env.counts.stats
        assert stats["requests"] >= 4 and stats["segments"] == 4 + stats["extra_segments"]

        bench.env.agent = __import__("tests.fixtures.agents", fromlist=["x"]).crashing_agent
        failed = bench.evaluation(num_tasks=2)
        assert [t.stop_reason for t in failed] == ["agent_failed"] * 2
        assert all(t.reward == 0 and "the agent's own bug" in t.env_fault for t in failed)

        bench.env.agent = __import__("tests.fixtures.agents", fromlist=["x"]).hanging_agent
        bench.env.options.timeout_s = 0.5
        hung = bench.evaluation(num_tasks=2)
        assert all("timeout_s (0.5 s)" in t.env_fault for t in hung) and stats["agent_failures"] == 4

        bench.env.agent = __import__("tests.fixtures.agents", fromlist=["x"]).summarising_agent
        bench.env.options.timeout_s = 60
        before = stats["extra_segments"]
        two = bench.evaluation(num_tasks=2)
        assert all(t.infos[-1]["segments"] == 2 for t in two) and stats["extra_segments"] == before + 2
        assert all(len(t.extra) == 1 and sum(t.extra[0].loss_mask) > 0 for t in two)  # the draft, kept beside
    finally:
        bench.close()


def train_command(tmp_path, tiny_model_dir, agent: list[str], *more: str) -> list[str]:
    """`toolrl train` of an agent environment for 2 steps of 2 x 2 samples on the tiny model; `agent`: the --set
    that names the agent."""
    path = tasks_file(tmp_path)
    return [sys.executable, "-m", "toolrl", "train",
            "--set", "env.name=agent", "--set", f"env.train_file={path}", "--set", f"env.test_file={path}", *agent,
            "--set", "env.options.reward=tests.fixtures.agents:varied_score",
            "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
            "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=16",
            "--set", "eval.at_start=false", "--set", "eval.at_end=false",
            "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run", *more]  # fmt: skip


def trained_steps(tmp_path, command: list[str], timeout: int = 900, **env: str) -> list[dict]:
    """Run `command` (as a user does, from its own folder); the steps it wrote, after checking it trained 2."""
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (tmp_path / "runs" / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [s for s in map(json.loads, lines) if "step" in s and "eval" not in s]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["trained_trajectories"] > 0 and s["generated_tokens"] > 0 for s in steps), steps[-1]
    return steps


def test_an_agent_function_trains_two_steps_from_the_command_line(tmp_path, tiny_model_dir):
    """The openai SDK agent of tests/fixtures/agents.py, run in toolrl's process (env.options.agent)."""
    agent = ["--set", "env.options.agent=tests.fixtures.agents:calculator_agent"]
    steps = trained_steps(tmp_path, train_command(tmp_path, tiny_model_dir, agent))
    assert all(s.get("reward/requests", 0) >= 4 and s.get("reward/requests/chat", 0) >= 4 for s in steps), steps[-1]


@pytest.mark.parametrize(("client", "protocol"), [("pydantic-ai-openai", "responses"), ("smolagents", "chat")])
def test_an_agent_library_in_a_venv_of_its_own_trains_two_steps_from_the_command_line(
    tmp_path, tiny_model_dir, client, protocol
):
    """pydantic-ai (its default openai: model speaks the Responses API) and smolagents (stop strings and a forced
    call at every step, which the tiny model samples under the call grammar), unchanged, as programs run per
    sample (env.options.command) in their own venvs."""
    from tests.gateway.clients import PROGRAMS, client_python
    from tests.gateway.test_clients import CLIENTS

    venv, program, _, _ = CLIENTS[client]
    agent = ["--set", f"env.options.command=[{client_python(venv)}, {PROGRAMS / program}]"]
    more = [
        "--set",
        "rollout.max_new_tokens=48",
        "--set",
        "rollout.max_response_tokens=4096",
        "--set",
        "env.options.timeout_s=300",
    ]
    steps = trained_steps(tmp_path, train_command(tmp_path, tiny_model_dir, agent, *more))
    assert all(s.get(f"reward/requests/{protocol}", 0) >= 4 for s in steps), steps[-1]
    assert all(not s.get("reward/agent_failures") for s in steps), steps[-1]


def test_toolrl_serve_serves_a_trained_run_to_an_unpatched_openai_client(tmp_path, tiny_model_dir):
    from openai import OpenAI

    path = tasks_file(tmp_path, 2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TOOLRL_SERVE_KEY": "k" * 32}
    train = [sys.executable, "-m", "toolrl", "train", "--set", "env.name=calculator",
             "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=1",
             "--set", "train.prompts_per_step=1", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=8",
             "--set", "eval.at_start=false", "--set", "eval.at_end=false", "--set", "train.save_every=1",
             "--set", f"output_dir={tmp_path / 'runs'}", "--set", "run_name=run"]  # fmt: skip
    done = subprocess.run(train, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    command = [sys.executable, "-m", "toolrl", "serve", str(tmp_path / "runs" / "run"), "--port", "0",
               "--max-new-tokens", "12"]  # fmt: skip
    server = subprocess.Popen(command, cwd=tmp_path, env={**env, "COLUMNS": "300"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        lines = []
        while not any(line.startswith("OPENAI_API_KEY=") for line in lines):
            line = server.stdout.readline()
            assert line, server.stderr.read()[-3000:]
            lines.append(line.strip())
        base = next(line.split("=", 1)[1] for line in lines if line.startswith("OPENAI_BASE_URL="))
        assert base.startswith("http://127.0.0.1:") and base.endswith("/v1") and f"OPENAI_API_KEY={'k' * 32}" in lines
        assert any("serving" in line and "step" in line for line in lines), lines  # the checkpoint, by its folder
        client = OpenAI(base_url=base, api_key="k" * 32)
        reply = client.chat.completions.create(model="any", messages=[{"role": "user", "content": "2 + 2?"}],
                                               tools=[CALCULATOR], max_tokens=8)  # fmt: skip
        assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls") and reply.usage.completion_tokens
        assert [m.id for m in client.models.list().data] and path.exists()
        # A turn without tools streams as it is sampled: the text arrives in several deltas, not in one at the end.
        ask = {"model": "any", "messages": [{"role": "user", "content": "Count."}], "max_tokens": 12}
        stream = client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert 2 <= len(deltas) <= chunks[-1].usage.completion_tokens <= 12  # each delta: a token or more
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_an_agent_program_runs_with_the_gateway_in_its_environment(tmp_path, tiny_model_dir):
    program = str(ROOT / "tests" / "fixtures" / "agent_program.py")
    config = agent_config(tmp_path, tiny_model_dir, "calculator_agent")
    config = load_config(overrides=[f"{k}={v}" for k, v in {
        "env.name": "agent", "env.train_file": config.env.train_file, "env.test_file": config.env.test_file,
        "env.options.command": f"[{sys.executable}, {program}]", "env.options.reward": "tests.fixtures.agents:score",
        "model.name": tiny_model_dir, "device": "cpu", "rollout.max_new_tokens": 8}.items()])  # fmt: skip
    bench = Workbench.load(config)
    try:
        trajs = bench.evaluation(num_tasks=2)
        assert [t.stop_reason for t in trajs] == ["agent_done"] * 2 and all(t.num_turns == 1 for t in trajs)
        bench.env.options.command = [sys.executable, program, "fail"]
        failed = bench.evaluation(num_tasks=1)
        assert failed[0].env_fault == "the agent exited with 3: the program could not parse its input"
    finally:
        bench.close()
