"""Agent harness programs installed from npm (Codex CLI, Claude Code, opencode), each unchanged but for where its
model is (the sample's base URL, the key), running its own tool loop through the gateway against a policy that
calls its shell tool: the loop's model calls land in one captured segment, continued request by request, with no
token of drift. What else a harness asks (a title for its session) is a segment of its own. Their system prompts
and tools are 8-21k tokens: the default model's 8k context refuses them, in one line a harness understands."""

from __future__ import annotations

import pytest

from tests.gateway import policies
from tests.gateway.clients import PROGRAMS, harness
from tests.gateway.policies import RulePolicy
from tests.gateway.test_clients import run_program
from toolrl.envs.base import Task
from toolrl.gateway import Gateway
from toolrl.parsers import get_parser

HARNESSES = {  # name: (its program, its shell tool and the tool's command argument, the protocol it speaks, the
    # context it needs with the default model's tokenizer: opencode's prompt fits the default model's 8k)
    "codex": ("codex", policies.bash("exec_command", "cmd"), "responses", 32768),
    "claude": ("claude", policies.bash("Bash", "command"), "messages", 32768),
    "opencode": ("opencode", policies.bash("bash", "command"), "chat", 8192),
}


@pytest.mark.parametrize("name", list(HARNESSES))
def test_a_harness_runs_its_tool_loop_through_one_captured_segment(name, chat, tmp_path):
    program, rule, protocol, context = HARNESSES[name]
    harness(program)
    engine = RulePolicy(chat, rule)
    gateway = Gateway(engine, chat, get_parser("hermes"), "policy", context_length=context).start()
    try:
        sample = gateway.open_sample(Task("t", "What is 2 + 2? Compute it with the shell.", "4", {}))
        done = run_program(gateway, sample, [str(PROGRAMS / "harnesses" / f"{program}.sh")], tmp_path, timeout=300)
        record = gateway.close_sample(sample.id)
    finally:
        gateway.stop()
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "4" in done.stdout.strip().splitlines()[-1], done.stdout[-2000:]
    assert record.protocols[protocol] >= 2 and not record.refusals, record
    loop = policies.loop_segment(record)
    assert loop.traj.num_turns == 2 and loop.traj.num_tool_calls == 1, [s.messages for s in record.segments]
    assert policies.drift(engine, loop) == 0
    assert any(policies.NUMBER.search(r.content) for r in loop.traj.results), loop.traj.results
    others = [s for s in record.segments if s is not loop and s.traj.num_turns]
    assert all(s.traj.num_turns == 1 and not s.traj.num_tool_calls for s in others)  # a title, beside the loop
    print(f"{name}: prompt {loop.traj.prompt_length} tokens, {len(loop.traj.token_ids)} in all")


@pytest.mark.parametrize("name", ["codex", "claude"])
def test_a_harness_prompt_past_the_models_context_is_refused_in_a_line_it_understands(name, chat, tmp_path):
    """Served with the default model's 8,192-token context, Codex's and Claude Code's first prompts (about 9k and
    21k tokens with its tokenizer) are refused naming their length and the context; each harness reports it as a
    context overflow and exits (no hang, no retry loop). opencode's (about 7.5k) fits: it is the harness for 8k
    models (test_a_harness_runs_...[opencode] with the same context below)."""
    program, rule, _, _ = HARNESSES[name]
    harness(program)
    gateway = Gateway(RulePolicy(chat, rule), chat, get_parser("hermes"), "policy", context_length=8192).start()
    try:
        sample = gateway.open_sample(Task("t", "What is 2 + 2?", "4", {}))
        done = run_program(gateway, sample, [str(PROGRAMS / "harnesses" / f"{program}.sh")], tmp_path, timeout=300)
        record = gateway.close_sample(sample.id)
    finally:
        gateway.stop()
    assert record.refusals[400] >= 1, (record, done.stderr[-2000:])
    assert "the model's context 8,192" in record.first_refusal and "the prompt is" in record.first_refusal
    assert done.returncode != 0 and not any(s.traj.num_tool_calls for s in record.segments)  # it gave up


def test_a_harness_trains_two_steps_from_the_command_line(tmp_path, tiny_model_dir):
    """opencode, unchanged, as the program each sample runs (env.options.command), on the tiny model (8,192 tokens
    of context, as the default model: opencode's prompt fits). Each sample's turns train; its title request rides
    along as an extra segment."""
    from tests.gateway.test_agent_env import train_command, trained_steps

    harness("opencode")
    agent = ["--set", f"env.options.command=[{PROGRAMS / 'harnesses' / 'opencode.sh'}]"]
    (tmp_path / "tmp").mkdir()
    command = train_command(tmp_path, tiny_model_dir, agent, "--set", "env.options.timeout_s=300")
    steps = trained_steps(tmp_path, command, HOME=str(tmp_path), TMPDIR=str(tmp_path / "tmp"))
    assert all(s.get("reward/requests/chat", 0) >= 4 and not s.get("reward/agent_failures") for s in steps), steps[-1]
