"""A sample an agent sent as several unrelated requests (a draft, then a summary of it in a new history, through the
gateway) is one trajectory of linked segments with one reward: every segment is trained under every estimator."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolrl.envs.base import Task
from toolrl.rollout import Trajectory
from toolrl.rollout.agent import linked

ROOT = Path(__file__).parents[2]


def test_an_agents_segments_link_in_the_order_they_began_with_the_whole_samples_counters():
    task = Task("t", "q", "a")
    first, second = Trajectory.start(task, [1, 2, 3]), Trajectory.start(task, [1, 2, 9])
    first.add_model_turn([4, 5], [-0.1, -0.2], "draft")
    first.num_tool_calls, first.results = 1, []
    second.add_model_turn([6], [-0.3], "summary")
    second.num_tool_calls = 2
    traj = linked([first, second])
    assert [s.token_ids for s in traj.sequences()] == [[1, 2, 3, 4, 5], [1, 2, 9, 6]]
    assert traj.segments[0].ended_by == "agent" and traj.segments[0].carried == 2  # the prompt's shared start
    assert traj.texts == ["draft", "summary"] and traj.num_tool_calls == 3
    assert traj.trained_logprobs == [-0.1, -0.2, -0.3] and traj.trained_count == 3


def train(tmp_path, tiny_model_dir, advantage):
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Say {i}.", "answer": str(i)}) + "\n"
                            for i in range(2)))  # fmt: skip
    command = [sys.executable, "-m", "toolrl", "train", "--set", "env.name=agent",
               "--set", f"env.train_file={path}", "--set", f"env.test_file={path}",
               "--set", "env.options.agent=tests.fixtures.agents:summarising_agent",
               "--set", "env.options.reward=tests.fixtures.agents:varied_score",
               "--set", f"train.advantage={advantage}",
               "--set", f"model.name={tiny_model_dir}", "--set", "device=cpu", "--set", "train.steps=2",
               "--set", "train.prompts_per_step=2", "--set", "train.group_size=2", "--set", "rollout.max_new_tokens=12",
               "--set", "eval.at_start=false", "--set", "eval.at_end=false",
               "--set", f"output_dir={tmp_path / advantage}", "--set", "run_name=run"]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / advantage / "run"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    return [s for s in map(json.loads, lines) if "step" in s and "eval" not in s], samples


@pytest.mark.slow
@pytest.mark.parametrize("advantage", ["grpo", "reinforce_pp", "gae", "gigpo", "igpo"])
def test_an_agents_draft_and_summary_both_train_under_every_estimator(tmp_path, tiny_model_dir, advantage):
    steps, samples = train(tmp_path, tiny_model_dir, advantage)
    assert all(s["segments"] == 4 and s["segments_left_out"] == 0 for s in steps)  # 4 samples, 2 segments each
    linked_records = [r for r in samples if len(r.get("sequences", [])) == 2]
    assert linked_records, samples[:1]
    for record in linked_records:  # each segment's model turn took the sample's advantages
        trained = [s for s in record["segments"] if s.get("loss")]
        assert {s["sequence"] for s in trained} == {0, 1}
        assert all("advantages" in s and len(s["advantages"]) == len(s["ids"]) for s in trained), trained
