"""A sample with several sequences (an agent's sub-agent or retry, through the gateway): each trained with its
sample's advantage by a sequence-level estimator, counted where an estimator cannot give it one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from toolrl.algos import ADVANTAGES, Advantages
from toolrl.envs.base import Task
from toolrl.rollout import Trajectory
from toolrl.train.update import extend_advantages, with_extras

ROOT = Path(__file__).parents[2]


def test_an_extra_sequence_takes_its_owners_advantage_and_only_from_a_sequence_level_estimator():
    task = Task("t", "q", "a")
    trajs = [Trajectory.start(task, [1, 2]) for _ in range(3)]
    trajs[0].extra = [Trajectory.start(task, [3])]
    trajs[2].extra = [Trajectory.start(task, [4]), Trajectory.start(task, [5])]
    everything, owners = with_extras(trajs, sequence_level=True)
    assert everything[3:] == [trajs[0].extra[0], *trajs[2].extra] and owners == [0, 2, 2]
    assert with_extras(trajs, sequence_level=False) == (trajs, [])
    est = Advantages(torch.tensor([0.5, 0.5, -1.0, -1.0, -1.0]))  # owners' tokens: 2, 0 and 3
    out = extend_advantages(est, [2, 0, 3], owners, [2, 1, 1]).advantages
    assert out.tolist() == [0.5, 0.5, -1.0, -1.0, -1.0, 0.5, 0.5, -1.0, -1.0]
    assert all(ADVANTAGES.capability(n, "sequence_level") for n in ("grpo", "dr_grpo", "rloo"))
    assert not any(ADVANTAGES.capability(n, "sequence_level") for n in ("gae", "gigpo", "reinforce_pp"))


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
    lines = (tmp_path / advantage / "run" / "metrics.jsonl").read_text().splitlines()
    return [s for s in map(json.loads, lines) if "step" in s and "eval" not in s]


def test_an_agents_draft_and_summary_both_train_and_a_per_token_estimator_counts_the_draft_out(
    tmp_path, tiny_model_dir
):
    steps = train(tmp_path, tiny_model_dir, "grpo")
    assert all(s["extra_sequences"] == 4 and s["extra_sequences_left_out"] == 0 for s in steps)
    assert any(s["trained_trajectories"] > 4 for s in steps), steps  # the summaries and their drafts
    steps = train(tmp_path, tiny_model_dir, "reinforce_pp")
    assert all(s["extra_sequences"] == 0 and s["extra_sequences_left_out"] == 4 for s in steps)
