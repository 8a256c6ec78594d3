"""The supervised warm start (`toolrl sft`, `train.warm_start`): trajectories from the reference policy, a teacher
endpoint, a file of conversations or the policy's own successes, in the RL format, learned by the policy."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.http_server import LocalHTTPServer
from toolrl.config import load_config
from toolrl.errors import ConfigError, DataError
from toolrl.gateway import Gateway
from toolrl.parsers import get_parser
from toolrl.scoring import score_tokens
from toolrl.tools.call import ToolCall
from toolrl.train import Trainer, Workbench
from toolrl.train.sft import conversation_trajectory

ROOT = Path(__file__).parents[2]


def sft_config(tmp_path, tiny_model_dir, *more):
    return load_config(overrides=[
        "env.name=calculator", f"model.name={tiny_model_dir}", "device=cpu", "rollout.max_new_tokens=32",
        "train.steps=0", "train.warm_start=true", "sft.num_tasks=4", "sft.epochs=3", "sft.batch_size=4",
        "sft.lr=1e-3", "eval.at_start=false", "eval.at_end=false", f"output_dir={tmp_path}", "run_name=sft", *more,
    ])  # fmt: skip


def lines(tmp_path):
    return [json.loads(line) for line in (tmp_path / "sft" / "sft.jsonl").read_text().splitlines()]


def mean_logprob(model, trajs):
    with torch.no_grad():
        return float(score_tokens(model, trajs).logprobs.mean())


def test_a_warm_start_from_the_reference_policy_learns_its_trajectories(tmp_path, tiny_model_dir):
    """The reference plays 4 train tasks (all succeed, all kept); three epochs of one step each lower the loss,
    and the policy gives the reference's tokens a higher likelihood after than before."""
    from toolrl.runs.rundir import RunDir

    config = sft_config(tmp_path, tiny_model_dir)
    bench = Workbench.load(config)
    try:
        run = RunDir.create(config)
        trainer = Trainer(bench, run)
        notes = []
        trainer.on_note = notes.append
        reference = bench.engines  # filled by the warm start: the reference's own engine
        trainer.train()
        played = [line for line in lines(tmp_path) if "played" in line]
        steps = [line for line in lines(tmp_path) if "sft_step" in line]
        assert played == [{**played[0], "sft_round": 1, "source": "reference", "played": 4, "kept": 4}]
        assert [s["sft_step"] for s in steps] == [1, 2, 3] and steps[-1]["loss"] < steps[0]["loss"]
        assert all(s["tokens"] > 0 for s in steps) and "sft-reference" in reference
        assert notes[0] == "warm start (train split): 4 of 2000 tasks, a sample with seed 1234"  # what it took
        assert notes[1].startswith("sft round 1: reference played 4, kept 4") and "loss" in notes[2]
        again = bench.rollout(config.rollout.sampling, seed=7, purpose="sft-reference").run(
            bench.env.tasks("train")[:4]
        )
        tuned = mean_logprob(trainer.model, again)
        base = Workbench.load(config, policy="model")
        try:
            assert tuned > mean_logprob(base.model, again) + 0.5  # the reference's turns are likelier now
        finally:
            base.close()
        assert (tmp_path / "sft" / "final").is_dir()  # a model to train from: model.name: RUN/final
    finally:
        bench.close()


def test_a_conversation_file_renders_as_the_gateway_records_the_same_turns(tmp_path, tiny_model_dir, chat):
    """A JSONL conversation becomes the trajectory the gateway would record for the same exchange: the same ids,
    only the assistant turns in the loss; unreadable records are skipped and counted."""
    import httpx

    from toolrl.envs.base import Task
    from toolrl.rollout.engine import Engine, Sampled

    parameters = {"type": "object", "properties": {"expression": {"type": "string"}}}
    tool = {
        "type": "function",
        "function": {"name": "calculator", "description": "Evaluate.", "parameters": parameters},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}
    conversation = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "assistant", "content": "<answer>4</answer>"},
    ]
    syntax = get_parser("hermes")
    traj = conversation_trajectory(chat, syntax, {"messages": conversation, "tools": [tool]}, [], "t")

    turns = [syntax.render([ToolCall("calculator", {"expression": "2+2"})]), "<answer>4</answer>"]

    class Replay(Engine):
        async def generate(self, seq, tokens, params):
            ids = chat.encode(turns.pop(0)) + [chat.end_of_turn_id]
            return Sampled(ids, [0.0] * len(ids), True)

    gateway = Gateway(Replay(), chat, syntax, "tiny").start()
    try:
        sample = gateway.open_sample(Task("t", "What is 2 + 2?", "4", {}))
        base, headers = gateway.base_url(sample), {"Authorization": f"Bearer {gateway.key}"}
        first = httpx.post(f"{base}/chat/completions", json={"messages": conversation[:1], "tools": [tool]},
                           headers=headers, timeout=30).json()["choices"][0]["message"]  # fmt: skip
        follow = [
            *conversation[:1],
            first,
            {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "4"},
        ]
        httpx.post(f"{base}/chat/completions", json={"messages": follow, "tools": [tool]}, headers=headers, timeout=30)
        (recorded,) = gateway.close_sample(sample.id).trajectories()
    finally:
        gateway.stop()
    assert traj.token_ids == recorded.token_ids and traj.loss_mask == recorded.loss_mask
    trained = chat.tokenizer.decode([i for i, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m])
    assert "<tool_call>" in trained and "<answer>4</answer>" in trained and "What is" not in trained

    path = tmp_path / "conversations.jsonl"
    path.write_text(json.dumps({"messages": conversation, "tools": [tool]}) + "\n" + "not json\n"
                    + json.dumps({"messages": [{"role": "assistant", "content": "no prompt"}]}) + "\n")  # fmt: skip
    bench = Workbench.load(sft_config(tmp_path, tiny_model_dir, "sft.source=file", f"sft.file={path}"))
    try:
        from toolrl.runs.rundir import RunDir

        Trainer(bench, RunDir.create(bench.config)).train()
    finally:
        bench.close()
    (played,) = [line for line in lines(tmp_path) if "played" in line]
    assert (played["played"], played["kept"], played["unreadable"]) == (1, 1, 2)


def test_rejection_sampling_that_keeps_nothing_says_which_limit_cut_it_and_writes_no_model(
    tmp_path, tiny_model_dir, caplog
):
    """The tiny random policy never answers right: each round says it kept nothing, the next samples again, and a
    warm start that kept nothing over all its rounds is a one-line error naming the limit that cut its samples
    (issue 77 item 1): no model is written as if trained."""
    from toolrl.runs.rundir import RunDir

    config = sft_config(tmp_path, tiny_model_dir, "sft.source=self", "sft.samples_per_task=2", "sft.rounds=2",
                        "rollout.max_new_tokens=8")  # fmt: skip
    bench = Workbench.load(config)
    try:
        with pytest.raises(DataError) as raised:
            Trainer(bench, RunDir.create(config)).train()
    finally:
        bench.close()
    played = [line for line in lines(tmp_path) if "played" in line]
    assert [(p["sft_round"], p["played"], p["kept"]) for p in played] == [(1, 8, 0), (2, 8, 0)]
    assert "round 1 kept no trajectory (8 played, none successful)" in caplog.text
    assert not [line for line in lines(tmp_path) if "sft_step" in line]
    message = str(raised.value)
    assert message.startswith("sft: kept none of the 16 trajectories sft.source self played (2 round(s))")
    assert "rollout.max_new_tokens 8 cut" in message and "sft.keep: all" in message and "\n" not in message
    assert not (tmp_path / "sft" / "final").exists()
    assert json.loads((tmp_path / "sft" / "status.json").read_text())["state"] == "failed"


@pytest.mark.parametrize("command", ["sft", "train"])
def test_a_warm_start_whose_reference_a_limit_cut_fails_from_the_command_line(tmp_path, tiny_model_dir, command):
    """`toolrl sft`, and a warm start inside `toolrl train`, whose reference trajectories all stop at max_turns
    (the calculator's reference needs a turn to call and one to answer): exit 1 with the one line that names the
    limit (exit 2), and no final model (issue 77 item 1: it had warned, exited 0 and written an unchanged one)."""
    run = [sys.executable, "-m", "toolrl", command, "--set", "env.name=calculator", "--set", "device=cpu",
           "--set", f"model.name={tiny_model_dir}", "--set", "rollout.max_turns=1", "--set", "sft.num_tasks=4",
           "--set", "eval.num_tasks=2", "--set", f"output_dir={tmp_path}", "--set", "run_name=warm",
           "--set", "train.warm_start=true", "--set", "train.steps=1"]  # fmt: skip
    done = subprocess.run(run, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]  # the CLI's exit for a ToolRLError
    said = [line for line in done.stderr.splitlines() if "kept none" in line]
    assert len(said) == 1 and "rollout.max_turns 1 cut 4 of them" in said[0] and "no model was written" in said[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "warm" / "final").exists()


def test_a_teacher_endpoint_plays_the_tasks_and_its_successes_are_learned(tmp_path, tiny_model_dir, tokenizer):
    """A teacher behind an OpenAI-compatible completions endpoint (here one that answers the calculator's
    questions right half of the time): its replies come back as token ids, and only its right answers are kept."""
    asked = []

    def complete(body):
        prompt = tokenizer.decode(body["prompt"])
        expression = re.findall(r"What is ([^?\n]+)\?", prompt)
        value = eval(expression[-1], {}) if expression else 0  # the test's own arithmetic on the task's numbers
        asked.append(body)
        answer = value if len(asked) % 2 else value + 1
        ids = tokenizer.encode(f"<answer>{answer}</answer>", add_special_tokens=False) + [tokenizer.eos_token_id]
        tokens = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.1] * len(ids)}
        return {"choices": [{"text": "", "logprobs": tokens, "finish_reason": "stop"}]}

    from toolrl.runs.rundir import RunDir

    with LocalHTTPServer(complete=complete) as server:
        config = sft_config(tmp_path, tiny_model_dir, "sft.source=teacher", f"sft.teacher.base_url={server.url}/v1",
                            "sft.teacher.model=teacher", "sft.samples_per_task=2")  # fmt: skip
        bench = Workbench.load(config)
        try:
            env_questions = [t.question for t in bench.env.tasks("train")[:4]]
            Trainer(bench, RunDir.create(config)).train()
        finally:
            bench.close()
    (played,) = [line for line in lines(tmp_path) if "played" in line]
    assert played["played"] == 8 and asked and all(b["model"] == "teacher" for b in asked)
    assert 0 < played["kept"] < 8, (played, env_questions[:2])


DOWN_TEACHER = ["sft.source=teacher", "sft.teacher.base_url=http://127.0.0.1:9/v1"]


@pytest.mark.parametrize(
    ("settings", "message"),
    [(["sft.source=oracle"], "sft.source"), (["sft.source=file"], "sft.file: sft.source is file"),
     (["sft.source=teacher"], "sft.teacher: sft.source is teacher"),
     (DOWN_TEACHER, "sft.teacher.base_url: POST http://127.0.0.1:9/v1")],  # its servers are named by its setting
)  # fmt: skip
def test_a_warm_start_without_what_its_source_needs_is_a_one_line_error(tmp_path, tiny_model_dir, settings, message):
    from toolrl.errors import EngineError
    from toolrl.runs.rundir import RunDir

    config = sft_config(tmp_path, tiny_model_dir, *settings)
    bench = Workbench.load(config)
    try:
        with pytest.raises(ConfigError if settings != DOWN_TEACHER else EngineError) as raised:
            Trainer(bench, RunDir.create(config)).train()
    finally:
        bench.close()
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_toolrl_sft_runs_from_the_command_line_and_rl_trains_from_its_model(tmp_path, tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = ["--set", "env.name=calculator", "--set", "device=cpu", "--set", "rollout.max_new_tokens=16",
              "--set", "eval.num_tasks=2", "--set", f"output_dir={tmp_path}"]  # fmt: skip
    sft = [sys.executable, "-m", "toolrl", "sft", *common, "--set", f"model.name={tiny_model_dir}",
           "--set", "sft.num_tasks=4", "--set", "sft.epochs=1", "--set", "run_name=warm"]  # fmt: skip
    done = subprocess.run(sft, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sft round 1: reference played 4, kept 4" in done.stdout
    progress = (tmp_path / "warm" / "progress.log").read_text()
    assert "sft round 1 step 1/1" in progress
    evals = [json.loads(line) for line in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    assert [e["eval"] for e in evals if "eval" in e] == ["start", "end"]  # before and after the warm start
    rl = [sys.executable, "-m", "toolrl", "train", *common, "--set", f"model.name={tmp_path / 'warm' / 'final'}",
          "--set", "train.steps=1", "--set", "train.prompts_per_step=1", "--set", "train.group_size=2",
          "--set", "eval.at_start=false", "--set", "eval.at_end=false", "--set", "run_name=rl"]  # fmt: skip
    done = subprocess.run(rl, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_source_of_your_own_registers_from_outside_the_package(tmp_path, tiny_model_dir):
    """A source is a function (workbench, sft config, tasks, seed) -> Played; here it plays the reference and
    keeps only the first trajectory."""
    from toolrl.runs.rundir import RunDir
    from toolrl.train.sft import SFT_SOURCES, Played, reference_source, register_sft_source

    @register_sft_source("first-reference", replace=True)
    def first_reference(bench, cfg, tasks, seed):
        return Played(reference_source(bench, cfg, tasks[:1], seed).trajs)

    try:
        config = sft_config(tmp_path, tiny_model_dir, "sft.source=first-reference")
        bench = Workbench.load(config)
        try:
            Trainer(bench, RunDir.create(config)).train()
        finally:
            bench.close()
        (played,) = [line for line in lines(tmp_path) if "played" in line]
        assert (played["source"], played["played"], played["kept"]) == ("first-reference", 1, 1)
    finally:
        SFT_SOURCES.pop("first-reference", None)
