"""Data parallel under torchrun (FSDP2, gloo on CPU): one step on 2 processes gives the weights one process
gives for the same groups, for full weights and for LoRA; metrics are reduced and written once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
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


def command(tmp_path, tiny_model_dir, name, processes, *extra, resume=False):
    """`toolrl train` in 1 process or under torchrun; with `resume`, `--resume` of the run `name`."""
    overrides = [
        f"model.name={tiny_model_dir}", "device=cpu", "train.steps=1", "train.prompts_per_step=2",
        "train.group_size=3", "rollout.max_new_tokens=12", "train.lr=0.001", "eval.at_start=false",
        "eval.at_end=false", f"output_dir={tmp_path}", f"run_name={name}", "plugins=[length_reward]",
        "env.reward_weights={chars: 1.0}", *extra,
    ]  # fmt: skip
    args = [a for o in overrides for a in ("--set", o)]
    if resume:
        args = ["--resume", str(tmp_path / name), *[a for o in extra for a in ("--set", o)]]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes)]
    argv = [*(launcher if processes > 1 else [sys.executable]), "-m", "toolrl", "train", *args]
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT), str(tmp_path)])  # ROOT: tests.fixtures environments
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    return argv, env


def train(tmp_path, tiny_model_dir, name, processes, *extra, resume=False):
    argv, env = command(tmp_path, tiny_model_dir, name, processes, *extra, resume=resume)
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
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


@pytest.mark.slow
def test_two_ranks_train_a_vision_policy_as_one_process_does(tmp_path):
    """A tiny Qwen2.5-VL on the images environment (each task's image in its prompt), its decoder layers and
    vision blocks sharded: one step on 2 ranks updates the language model as one process does and leaves the
    vision tower as it was."""
    from tests.harness.tiny_vlm import make_tiny_vlm

    model = make_tiny_vlm(tmp_path / "vlm", "qwen2_5_vl")
    (tmp_path / "length_reward.py").write_text(PLUGIN)
    extra = [
        "env.name=images-even", "env.module=tests.fixtures.vision_env", "env.reward_weights={even: 1.0}",
        "env.options.num_train=8", "env.options.num_test=2", "env.options.size=112", "train.group_size=2",
    ]  # fmt: skip
    one, one_metrics, _ = train(tmp_path, model, "one", 1, *extra)
    two, two_metrics, _ = train(tmp_path, model, "two", 2, *extra)
    before = load_file(str(model / "model.safetensors"))
    moved = {k for k in before if not torch.equal(before[k], one[k])}
    assert moved and not any("visual" in k for k in moved)
    assert all(torch.equal(before[k], two[k]) for k in before if "visual" in k)
    relative = updates_differ(before, one, two)
    print(f"relative difference of the updates: {relative:.2e}")
    assert relative < 2e-3
    assert one_metrics["reward"] == pytest.approx(two_metrics["reward"], abs=1e-6)
    assert one_metrics["grad_norm"] == pytest.approx(two_metrics["grad_norm"], rel=1e-4)


def updates_differ(before, a, b) -> float:
    """Relative difference of two runs' weight updates from `before`."""
    d_a = torch.cat([(a[k] - before[k]).flatten() for k in sorted(a)])
    d_b = torch.cat([(b[k] - before[k]).flatten() for k in sorted(a)])
    return float((d_a - d_b).norm() / d_a.norm())


def steps_logged(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "eval" not in r]


@pytest.mark.slow
def test_a_sharded_run_killed_with_sigkill_resumes_in_one_process(tmp_path, tiny_model_dir):
    """2 ranks write sharded checkpoints (torch.distributed.checkpoint); the job is killed with SIGKILL after
    step 2's; one process resumes from it (2 -> 1) and ends where the uninterrupted 2-rank run ends."""
    (tmp_path / "length_reward.py").write_text(PLUGIN)
    extra = ["train.steps=4", "train.save_every=1"]
    whole, _, _ = train(tmp_path, tiny_model_dir, "whole", 2, *extra)
    assert (tmp_path / "whole" / "last" / "dcp" / ".metadata").is_file()

    argv, env = command(tmp_path, tiny_model_dir, "killed", 2, *extra)
    job = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed = tmp_path / "killed"
    deadline = time.time() + 300
    while time.time() < deadline:
        last = killed / "last"
        if last.is_symlink() and last.resolve().name == "step-000002":
            for process in [*psutil.Process(job.pid).children(recursive=True), psutil.Process(job.pid)]:
                process.send_signal(signal.SIGKILL)  # both ranks and torchrun
            break
        if job.poll() is not None:
            pytest.fail(f"the job ended before it could be killed: {job.stderr.read()[-2000:]}")
        time.sleep(0.01)
    job.wait()
    time.sleep(1)
    assert job.returncode == -signal.SIGKILL and not (killed / "final").exists()
    assert killed.joinpath("last").resolve().name == "step-000002"

    pieced, _, _ = train(tmp_path, tiny_model_dir, "killed", 1, resume=True)
    assert [m["step"] for m in steps_logged(killed)] == [1, 2, 3, 4]  # none lost, none repeated
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    relative = updates_differ(before, whole, pieced)
    print(f"relative difference of the updates, 2 ranks vs 2 -> 1: {relative:.2e}")
    assert relative < 5e-3
    for a, b in zip(steps_logged(tmp_path / "whole"), steps_logged(killed), strict=True):
        assert b["reward"] == pytest.approx(a["reward"], abs=1e-4), a["step"]


@pytest.mark.slow
def test_a_one_process_checkpoint_resumes_on_two_ranks_and_exports(tmp_path, tiny_model_dir):
    (tmp_path / "length_reward.py").write_text(PLUGIN)
    whole, _, _ = train(tmp_path, tiny_model_dir, "whole", 1, "train.steps=3", "train.save_every=1")
    train(tmp_path, tiny_model_dir, "grown", 1, "train.steps=2", "train.save_every=1")
    grown, _, _ = train(tmp_path, tiny_model_dir, "grown", 2, "train.steps=3", resume=True)  # 1 -> 2
    assert [m["step"] for m in steps_logged(tmp_path / "grown")] == [1, 2, 3]
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    assert updates_differ(before, whole, grown) < 5e-3
    sharded = tmp_path / "grown" / "last"
    assert (sharded / "dcp" / ".metadata").is_file()

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = tmp_path / "exported"
    done = subprocess.run([sys.executable, "-m", "toolrl", "export", str(tmp_path / "grown"), str(out)],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name, tensor in grown.items():  # final/ of the 2-rank run: the same weights
        assert torch.equal(exported[name], tensor), name


FAILING = """
import os

from toolrl.rewards import register_criterion

@register_criterion("chars")
def chars(trajectory, task):
    if os.environ.get("RANK") == "1":
        raise RuntimeError("the reward broke on this rank")
    return len(trajectory.final_text) / 100
"""


@pytest.mark.slow
def test_a_rank_that_fails_ends_the_job_with_one_line_naming_it(tmp_path, tiny_model_dir):
    (tmp_path / "length_reward.py").write_text(FAILING)
    argv, env = command(tmp_path, tiny_model_dir, "broken", 2)
    env["TOOLRL_DIST_TIMEOUT_S"] = "60"
    started = time.time()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode != 0 and time.time() - started < 120  # no hang
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: rank 1 of 2:")]
    assert lines == [line for line in lines if "the reward broke on this rank" in line] and len(lines) == 1


@pytest.mark.slow
def test_one_step_off_policy_on_two_ranks_updates_the_weights_as_one_process_does(tmp_path, tiny_model_dir):
    (tmp_path / "length_reward.py").write_text(PLUGIN)
    extra = ["train.steps=3", "train.async_steps=1"]
    one, _, _ = train(tmp_path, tiny_model_dir, "one", 1, *extra)
    two, _, _ = train(tmp_path, tiny_model_dir, "two", 2, *extra)
    assert [m["offpolicy/staleness"] for m in steps_logged(tmp_path / "two")] == [0, 1, 1]
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    assert updates_differ(before, one, two) < 5e-3
