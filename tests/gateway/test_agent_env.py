"""An agent you already have (tests/fixtures/agents.py, written with the `openai` SDK) trained as it is: the
`agent` environment runs it per sample against the gateway, from a config and the command line."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

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
        assert all(t.trained_count > 0 and t.num_turns >= 1 for t in trajs)  # the model's turns, to train on
        for t in trajs:  # the turns as sampled: every trained token has its sampling log-prob
            assert len(t.trained_logprobs) == t.trained_count and all(lp <= 0 for lp in t.trained_logprobs)
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
        assert all(len(t.segments) == 1 and sum(t.segments[0].loss_mask) > 0 for t in two)  # the draft, linked
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


@pytest.mark.parametrize(
    ("client", "protocol"),
    [("pydantic-ai-openai", "responses"), ("smolagents", "chat"), ("vercel-ai-anthropic", "messages")],
)
def test_an_agent_library_in_a_venv_of_its_own_trains_two_steps_from_the_command_line(
    tmp_path, tiny_model_dir, client, protocol
):
    """pydantic-ai (its default openai: model speaks the Responses API), smolagents (stop strings and a forced
    call at every step, which the tiny model samples under the call grammar) and the Vercel AI SDK's anthropic
    provider (ANTHROPIC_BASE_URL as printed, without /v1), unchanged, as programs run per sample
    (env.options.command) in their own venvs or node folder."""
    from tests.gateway.clients import PROGRAMS, client_python, node_client
    from tests.gateway.test_clients import CLIENTS

    venv, program, _, _ = CLIENTS[client]
    command = [client_python(venv), str(PROGRAMS / program[0])] if venv else node_client(program[0])
    agent = ["--set", f"env.options.command=[{', '.join([*command, *program[1:]])}]"]
    more = ["--set", "rollout.max_new_tokens=48", "--set", "rollout.max_response_tokens=4096",
            "--set", "env.options.timeout_s=300"]  # fmt: skip
    steps = trained_steps(tmp_path, train_command(tmp_path, tiny_model_dir, agent, *more))
    assert all(s.get(f"reward/requests/{protocol}", 0) >= 4 for s in steps), steps[-1]
    assert all(not s.get("reward/agent_failures") for s in steps), steps[-1]
    # the engine's log-probs of forced calls are under the grammar's mask; the trainer's, the policy's own: the
    # mismatch check sees the mass the grammar took away (KL(engine || trainer) > 0), never the other way round
    kl = [s["mismatch/kl"] for s in steps]
    if client == "smolagents":
        assert all(k > 0.05 for k in kl) and all(s["mismatch/max_ratio"] <= 1.0 + 1e-3 for s in steps), kl
    else:
        assert all(abs(k) < 1e-3 for k in kl), kl


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
        assert any("a reply has at most 12 tokens" in line and "MB a request" in line for line in lines), lines
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
    logged = server.stderr.read()  # a line per request, without the key or a body
    assert "POST /v1/chat/completions chat 200 in " in logged and "GET /v1/models chat 200" in logged, logged[-2000:]
    assert "k" * 32 not in logged and "2 + 2?" not in logged


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


def command_config(tmp_path, tiny_model_dir, *arguments: str, **options):
    program = str(ROOT / "tests" / "fixtures" / "agent_program.py")
    path = tasks_file(tmp_path)
    overrides = {"env.name": "agent", "env.train_file": path, "env.test_file": path, "model.name": tiny_model_dir,
                 "env.options.command": f"[{sys.executable}, {program}{''.join(', ' + a for a in arguments)}]",
                 "env.options.reward": "tests.fixtures.agents:score", "device": "cpu", "rollout.max_new_tokens": 8,
                 **{f"env.options.{k}": v for k, v in options.items()}}  # fmt: skip
    return load_config(overrides=[f"{k}={v}" for k, v in overrides.items()])


def test_agent_failures_are_counted_by_cause_and_a_rollout_where_all_failed_is_one_warning(
    tmp_path, tiny_model_dir, caplog
):
    """Each failed sample's cause: its exit code (its last stderr line the example), a refusal of the gateway (an
    agent that dies of a 404, or one that swallows it and exits 0 without a served request), its timeout."""
    bench = Workbench.load(command_config(tmp_path, tiny_model_dir, "fail", max_failed_steps=0))
    stats = bench.env.counts.stats
    try:
        with caplog.at_level("WARNING", logger="toolrl.rollout.agent"):
            failed = bench.evaluation(num_tasks=2)
        assert [t.env_fault for t in failed] == ["the agent exited with 3: the program could not parse its input"] * 2
        assert stats["agent_failures/exit_3"] == 2
        warnings = [r.getMessage() for r in caplog.records if "every agent failed" in r.getMessage()]
        assert warnings == ["env agent: every agent failed (2 of 2: 2 exit 3); e.g. the program could not parse "
                            "its input"]  # fmt: skip
        bench.env.options.command[-1] = "typo"
        refused = bench.evaluation(num_tasks=2)
        assert stats["agent_failures/http_404"] == 2 and all("exited with 1" in t.env_fault for t in refused)
        bench.env.options.command[-1] = "typo-quiet"
        quiet = bench.evaluation(num_tasks=2)
        assert stats["agent_failures/http_404"] == 4
        assert all(t.env_fault.startswith("every request was refused by the gateway: HTTP 404 POST "
                                          "/v1/chat/completion: no such endpoint") for t in quiet)  # fmt: skip
        bench.env.options.command = [sys.executable, "-c", "import time; time.sleep(60)"]
        bench.env.options.timeout_s = 0.5
        bench.evaluation(num_tasks=1)
        assert stats["agent_failures/timeout"] == 1 and stats["agent_failures"] == 7
    finally:
        bench.close()


def test_a_run_whose_agents_all_fail_stops_after_max_failed_steps_with_one_line(tmp_path, tiny_model_dir):
    """The 404 run of the issue: each step line counts the failures by cause; the second step in a row in which
    every agent failed stops the run, exit 2, one line naming the cause and an example."""
    program = str(ROOT / "tests" / "fixtures" / "agent_program.py")
    agent = ["--set", f"env.options.command=[{sys.executable}, {program}, typo]",
             "--set", "env.options.max_failed_steps=2", "--set", "train.steps=5"]  # fmt: skip
    done = subprocess.run(train_command(tmp_path, tiny_model_dir, agent), cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)  # fmt: skip
    assert done.returncode == 2
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: env.options.max_failed_steps: every agent failed (4 of 4: 4 HTTP 404); e.g. HTTP "
                           "404 POST /v1/chat/completion: no such endpoint")  # fmt: skip
    assert "in 2 rollouts in a row" in line
    progress = (tmp_path / "runs" / "run" / "progress.log").read_text().splitlines()
    assert len(progress) == 1 and progress[0].endswith("agent failures 4/4: 4 http 404")
    status = json.loads((tmp_path / "runs" / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "max_failed_steps" in status["error"]


@pytest.mark.parametrize(
    ("setting", "said"),
    [("env.options.agent=no_such_module:answer", "env.options.agent: cannot import 'no_such_module:answer'"),
     ("env.options.command=[no-such-program, --flag]", "env.options.command: the program 'no-such-program' is not "
                                                        "found")],
)  # fmt: skip
def test_a_wrong_agent_is_one_line_exit_2_and_no_run_folder(tmp_path, tiny_model_dir, setting, said):
    command = train_command(tmp_path, tiny_model_dir, ["--set", setting])
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stderr.strip().startswith(f"error: {said}"), done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
    wrong_reward = [*command, "--set", "env.options.reward=my_rewards:nothing"]
    done = subprocess.run(wrong_reward, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and not (tmp_path / "runs").exists()


def test_the_docs_example_runs_as_written_from_a_fresh_folder(tmp_path, tiny_model_dir):
    """docs/agents.md: its agent module and task file written to an empty folder, its command run there with no
    PYTHONPATH (the module is found in the current folder), on the tiny model for one short step."""
    from tests.docs.test_docs import blocks, tiny_overrides

    page = blocks(ROOT / "docs" / "agents.md")
    module = next(body for language, body in page if language == "python" and body.startswith("# file: my_agents.py"))
    (tmp_path / "my_agents.py").write_text(module)
    tasks = next(body for language, body in page if language == "python" and "tasks.jsonl" in body)
    subprocess.run([sys.executable, "-c", tasks], cwd=tmp_path, check=True, timeout=60)
    line = next(body for language, body in page if language == "bash" and "env.name=agent" in body).strip()
    assert line.startswith("toolrl train ")
    extra = [f"--set={o}" for o in tiny_overrides(tiny_model_dir, tmp_path)]
    command = [sys.executable, "-m", "toolrl", *shlex.split(line)[1:], *extra, f"--set=output_dir={tmp_path / 'runs'}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_an_agent_s_replies_are_capped_by_the_env_s_option_else_by_rollout_max_new_tokens(tmp_path, tiny_model_dir):
    from toolrl.rollout.sampling import SamplingParams

    for more, ceiling in (((), 24), (("env.options.max_new_tokens=300",), 300)):
        bench = Workbench.load(agent_config(tmp_path, tiny_model_dir, "calculator_agent", *more))
        try:
            assert bench.gateway(bench.engine("eval", 0), SamplingParams()).max_new_tokens == ceiling
        finally:
            bench.close()


def test_success_is_the_env_s_0_or_1_apart_from_a_reward_on_its_own_scale(tmp_path, tiny_model_dir):
    """Issue 72: `success` was the raw reward (1.1 seen). It is 1 where the agent ran to its end with a reward of
    at least env.options.success_at (default 1), else 0; the reward is trained on as the user's function gave it."""
    from toolrl.envs.agent.env import AgentOutcome

    config = agent_config(
        tmp_path, tiny_model_dir, "calculator_agent", "env.options.reward=tests.fixtures.agents:bonus_score"
    )
    bench = Workbench.load(config)
    try:
        trajs = bench.evaluation(num_tasks=4, temperature=0.0)
        assert all(t.rewards["success"] in (0.0, 1.0) for t in trajs)
        assert all(t.rewards["success"] == float(t.rewards["reward"] >= 1.0) for t in trajs)
        assert all(t.reward == t.rewards["reward"] for t in trajs)  # success weighs nothing in the reward
        task = bench.env.tasks("test")[0]
        rubric, outcome = bench.env.rubric, AgentOutcome(result=f"it is {task.answer}", calls=[
            {"name": "calculator", "arguments": {}, "result": "ok"}])  # fmt: skip
        reward, parts = rubric.score(SimpleNamespace(episode=outcome), task)
        assert parts == {"reward": 1.1, "success": 1.0} and reward == 1.1
        failed = AgentOutcome(error="the agent exited with 3", cause="exit_3")
        assert rubric.score(SimpleNamespace(episode=failed), task)[1] == {"reward": 0.0, "success": 0.0}
    finally:
        bench.close()
    higher = Workbench.load(agent_config(tmp_path, tiny_model_dir, "calculator_agent", "env.options.success_at=2",
                                         "env.options.reward=tests.fixtures.agents:bonus_score"))  # fmt: skip
    try:
        outcome = AgentOutcome(result=f"it is {task.answer}", calls=[{"name": "calculator", "result": "ok"}])
        assert higher.env.rubric.score(SimpleNamespace(episode=outcome), task)[1] == {"reward": 1.1, "success": 0.0}
    finally:
        higher.close()


def test_a_run_in_which_every_agent_failed_in_every_step_exits_2_without_a_final_model(tmp_path, tiny_model_dir):
    """Issue 72: with fewer steps than max_failed_steps, such a run exited 0 and wrote `final` as if it had trained."""
    program = str(ROOT / "tests" / "fixtures" / "agent_program.py")
    agent = ["--set", f"env.options.command=[{sys.executable}, {program}, typo]", "--set", "train.steps=2"]
    done = subprocess.run(train_command(tmp_path, tiny_model_dir, agent), cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=600)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert line.startswith("error: env agent: every agent failed in each of the run's 2 rollouts (the last: every "
                           "agent failed (4 of 4: 4 HTTP 404)")  # fmt: skip
    assert "no final model is written" in line
    run = tmp_path / "runs" / "run"
    assert not (run / "final").exists()
    assert json.loads((run / "status.json").read_text())["state"] == "failed"
