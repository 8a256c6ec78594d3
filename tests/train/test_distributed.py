"""Data parallel under torchrun (FSDP2, gloo on CPU): one step on 2 processes gives the weights one process
gives for the same groups, for full weights and for LoRA; metrics are reduced and written once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).parents[2]
PLUGIN = '''
from toolrl.rewards import register_criterion

@register_criterion("chars")
def chars(trajectory, task):
    """A reward that differs between samples of a random model: its reply's length."""
    return len(trajectory.final_text) / 100
'''


def train(tmp_path, tiny_model_dir, name, processes, *extra):
    overrides = [
        f"model.name={tiny_model_dir}", "device=cpu", "train.steps=1", "train.prompts_per_step=2",
        "train.group_size=3", "rollout.max_new_tokens=12", "train.lr=0.001", "eval.at_start=false",
        "eval.at_end=false", f"output_dir={tmp_path}", f"run_name={name}", "plugins=[length_reward]",
        "env.reward_weights={chars: 1.0}", *extra,
    ]  # fmt: skip
    args = [a for o in overrides for a in ("--set", o)]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    command = [*(launcher if processes > 1 else [sys.executable]), "-m", "toolrl", "train", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(tmp_path)]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return load_file(str(tmp_path / name / "final" / "model.safetensors")), metrics[-1], done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_ranks_update_the_weights_as_one_process_does(tmp_path, tiny_model_dir, lora):
    (tmp_path / "length_reward.py").write_text(PLUGIN)
    extra = ["train.lora.r=4"] if lora else []
    one, one_metrics, _ = train(tmp_path, tiny_model_dir, "one", 1, *extra)
    two, two_metrics, stdout = train(tmp_path, tiny_model_dir, "two", 2, *extra)
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = [k for k in before if not torch.allclose(before[k], one[k])]
    assert moved, "the step changed nothing: the test would not see a difference"
    # Adam's first step is about lr * sign(gradient), so parameters whose gradient is near 0 can move either way
    # on rounding: the updates are compared as a whole (the gradients themselves agree to ~1e-5, grad_norm below)
    d_one = torch.cat([(one[k] - before[k]).flatten() for k in sorted(one)])
    d_two = torch.cat([(two[k] - before[k]).flatten() for k in sorted(one)])
    relative = float((d_one - d_two).norm() / d_one.norm())
    print(f"relative difference of the updates: {relative:.2e}")
    assert relative < 2e-3
    assert one_metrics["reward"] == pytest.approx(two_metrics["reward"], abs=1e-6)
    assert one_metrics["loss"] == pytest.approx(two_metrics["loss"], abs=1e-6)  # on-policy: 0 up to rounding
    assert one_metrics["grad_norm"] == pytest.approx(two_metrics["grad_norm"], rel=1e-4)  # the summed gradient
    assert two_metrics["trained_trajectories"] == one_metrics["trained_trajectories"] == 6
    assert stdout.count("checkpoint: ") == 1  # rank 0 reports; the other rank is silent
