"""Agent libraries people already have, each unchanged (their own defaults; only the base URL and key come from
the environment), each in a venv of its own, running its own tool loop through the gateway against a policy that
calls tools: every model call of the loop lands in one captured segment, continued request by request, with no
token of drift between what the policy was fed and what was captured."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.gateway import policies
from tests.gateway.clients import PROGRAMS, client_python, node_client
from tests.gateway.policies import RulePolicy
from toolrl.envs.base import Task
from toolrl.gateway import Gateway
from toolrl.parsers import get_parser

CLIENTS = {  # name: (venv, or None for node, program and its arguments, the policy's rule, whether tool results come
    # as tool messages); calculator_said writes text before its call: the Vercel AI SDK's default openai model (the
    # Responses API, store on) sends that text back as an item_reference, which the gateway resolves
    "openai-chat": ("openai", ["openai_chat.py"], policies.calculator, True),
    "openai-responses": ("openai", ["openai_responses.py"], policies.calculator, True),
    "openai-agents": ("openai-agents", ["openai_agents.py"], policies.calculator, True),
    "pydantic-ai-openai": ("pydantic-ai", ["pydantic_ai_agent.py", "openai:policy"], policies.calculator, True),
    "pydantic-ai-anthropic": ("pydantic-ai", ["pydantic_ai_agent.py", "anthropic:policy"], policies.calculator, True),
    "smolagents": ("smolagents", ["smolagents_agent.py"], policies.smolagents, False),
    "langgraph": ("langgraph", ["langgraph_agent.py"], policies.calculator, True),
    "anthropic": ("anthropic", ["anthropic_sdk.py"], policies.calculator, True),
    "agno-openai-chat": ("agno", ["agno_agent.py", "openai-chat"], policies.calculator, True),
    "agno-openai-responses": ("agno", ["agno_agent.py", "openai-responses"], policies.calculator, True),
    "agno-anthropic": ("agno", ["agno_agent.py", "anthropic"], policies.calculator, True),
    "crewai": ("crewai", ["crewai_agent.py"], policies.calculator, True),
    "vercel-ai-openai": (None, ["vercel_ai.mjs", "openai"], policies.calculator_said, True),
    "vercel-ai-openai-chat": (None, ["vercel_ai.mjs", "openai-chat"], policies.calculator_said, True),
    "vercel-ai-anthropic": (None, ["vercel_ai.mjs", "anthropic"], policies.calculator_said, True),
    "mini-swe-agent": ("mini-swe-agent", ["mini_swe_agent.py"],
                       policies.bash("bash", "command", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo 4"), True),
}  # fmt: skip


def run_program(gateway, sample, command: list[str], tmp_path, timeout: int = 180) -> subprocess.CompletedProcess:
    """A program run as the agent environment runs one: the sample's base URLs and the key in its environment (a
    home of its own; its temporary files apart from it: Codex will not put its sandbox helper under a temporary
    folder)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "OPENAI_BASE_URL": gateway.base_url(sample), "OPENAI_API_KEY": gateway.key,
           "ANTHROPIC_BASE_URL": gateway.anthropic_base_url(sample), "ANTHROPIC_API_KEY": gateway.key,
           "TOOLRL_QUESTION": sample.task.question, "HOME": str(tmp_path), "TMPDIR": str(tmp_path / "tmp"),
           "NO_COLOR": "1",
           "TOOLRL_TASK": json.dumps({"id": sample.task.id, "question": sample.task.question})}  # fmt: skip
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(name, None)
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", list(CLIENTS))
def test_an_unchanged_client_runs_its_tool_loop_through_one_captured_segment(name, chat, tmp_path):
    venv, program, rule, tool_messages = CLIENTS[name]
    command = [client_python(venv), str(PROGRAMS / program[0])] if venv else node_client(program[0])
    engine = RulePolicy(chat, rule)
    gateway = Gateway(engine, chat, get_parser("hermes"), "policy").start()
    try:
        sample = gateway.open_sample(Task("t", "What is 2 + 2? Use the calculator.", "4", {}))
        done = run_program(gateway, sample, [*command, *program[1:]], tmp_path)
        record = gateway.close_sample(sample.id)
    finally:
        gateway.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "4" in done.stdout.strip().splitlines()[-1], done.stdout[-2000:]
    assert sum(record.protocols.values()) == record.requests >= 2 and not record.refusals, record
    loop = policies.loop_segment(record)
    trained = [s for s in record.segments if s.traj.num_turns]
    assert trained == [loop], f"{name}: {len(trained)} segments ({[s.messages for s in trained]})"
    assert loop.traj.num_turns == record.requests and record.continued == record.requests - 1
    assert policies.drift(engine, loop) == 0
    assert loop.traj.num_tool_calls >= 1 and loop.traj.num_format_errors == 0
    if tool_messages:  # the tool's result, sent back as a tool message, is recorded for the reward
        assert any(policies.NUMBER.search(r.content) for r in loop.traj.results), loop.traj.results
    a, b = loop.traj.model_spans()[0]  # the model's turns as sampled: trained, with their log-probs
    assert loop.traj.loss_mask[a:b] == [1] * (b - a) and sum(loop.traj.loss_mask) == sum(
        end - start for start, end in loop.traj.model_spans()
    )


def test_smolagents_sends_stop_strings_and_a_forced_call_which_the_policy_is_given(chat, tmp_path):
    """smolagents' ToolCallingAgent asks every step for tool_choice "required" and stops at "Observation:": the
    engine samples under the call grammar, with the stop strings."""
    engine = RulePolicy(chat, policies.smolagents)
    gateway = Gateway(engine, chat, get_parser("hermes"), "policy").start()
    try:
        sample = gateway.open_sample(Task("t", "What is 2 + 2?", "4", {}))
        done = run_program(gateway, sample, [client_python("smolagents"), str(PROGRAMS / "smolagents_agent.py")],
                           tmp_path)  # fmt: skip
        gateway.close_sample(sample.id)
    finally:
        gateway.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    params = [p for _, _, p in engine.seen]
    assert params and all(p.grammar and "calls:" in p.grammar and "final_answer" in p.grammar for p in params)
    assert all("Observation:" in p.stop for p in params)


def test_dspy_react_runs_unchanged_each_step_a_prompt_of_its_own_answered_past_the_old_cap(chat, tmp_path):
    """DSPy's ReAct writes its steps as fields of text (its chat adapter), not tool calls, and sends each step as a
    prompt of its own (the trajectory so far in the user message): each request is a one-turn segment, captured
    token-exact. Its replies run past 48 tokens (the rollout's max_new_tokens, which once capped every turn
    silently: DSPy then failed to parse them); `max_tokens` is honoured up to the gateway's stated ceiling."""
    engine = RulePolicy(chat, policies.dspy_react)
    gateway = Gateway(engine, chat, get_parser("hermes"), "policy").start()
    try:
        sample = gateway.open_sample(Task("t", "What is 2 + 2? Use the calculator.", "4", {}))
        done = run_program(gateway, sample, [client_python("dspy"), str(PROGRAMS / "dspy_agent.py")], tmp_path)
        record = gateway.close_sample(sample.id)
    finally:
        gateway.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == '"4"', done.stdout[-2000:]
    assert record.requests == 3 and not record.refusals, record  # calculator, finish, extract
    steps = [s for s in record.segments if s.traj.num_turns]
    assert len(steps) == 3 and all(s.traj.num_turns == 1 for s in steps)
    assert all(policies.drift(engine, s) == 0 for s in steps)
    assert min(len(s.traj.token_ids) - s.traj.prompt_length for s in steps) > 48  # whole replies, not cut
    assert "observation_0" in chat.tokenizer.decode(steps[1].traj.token_ids)  # the tool ran in DSPy, as its text
