"""Before the first step, `toolrl train` estimates a step's time and peak memory (train/estimate.py) and refuses, in
one line naming the knob that brings it under, a configuration whose peak would not fit."""

import subprocess
import sys
from dataclasses import replace

import pytest

from toolrl.train.estimate import STEP_OVER_BOUND, Estimate, Workload, memory_gb, peak, step_flops


def toolrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolrl", *args], capture_output=True, text=True, timeout=600)


def tiny_run(model_dir, tmp_path, *sets: str) -> subprocess.CompletedProcess:
    base = [f"model.name={model_dir}", f"output_dir={tmp_path}", "run_name=run", "train.steps=1",
            "train.prompts_per_step=2", "train.group_size=2", "rollout.max_new_tokens=8", "eval.at_start=false",
            "eval.at_end=false", *sets]  # fmt: skip
    return toolrl("train", *(arg for s in base for arg in ("--set", s)))


def test_train_prints_the_estimate_before_its_first_step_on_a_long_prompt(tiny_model_dir, tmp_path):
    out = tiny_run(tiny_model_dir, tmp_path, "env.name=support", "env.options.handbook=true", "rollout.max_turns=2",
                   "train.group_size=2", "train.prompts_per_step=1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    log = (tmp_path / "run" / "progress.log").read_text()
    lines = [line for line in log.splitlines() if "estimate:" in line]
    assert lines and "2 trajectories of up to" in lines[0] and "shared), a step ~" in lines[0], log
    assert "if every sample answers in one turn" in lines[0] and "at the limits" in lines[0]
    assert "peak ~" in lines[0] and "resident" in lines[0]
    assert log.index("estimate:") < log.index("step 1")


def test_a_short_prompt_trains_without_the_estimate_line(tiny_model_dir, tmp_path):
    out = tiny_run(tiny_model_dir, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "estimate:" not in (tmp_path / "run" / "progress.log").read_text()


def test_a_step_over_the_memory_limit_is_refused_in_one_line_naming_the_knob(tiny_model_dir, tmp_path):
    out = tiny_run(tiny_model_dir, tmp_path, "train.memory_limit_gb=0.05")
    assert out.returncode != 0
    error = out.stderr.strip().splitlines()[-1]
    assert error.startswith("error: train: a step's estimated peak is") and "train.memory_limit_gb" in error
    assert "train.lora.r=16" in error or "--set train." in error  # the knob that brings it under
    log = tmp_path / "run" / "progress.log"
    assert not log.exists() or "step 1" not in log.read_text()  # refused before its first step


class Shape:
    """The default model's shape (SmolLM2-135M)."""

    num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, head_dim = 30, 576, 9, 3, 64
    intermediate_size, vocab_size = 1536, 49152


LONG = Workload(trajectories=8, groups=1, prompt=4887, shared=4841, length=5463, one_turn=4887 + 64,
                micro_batch_tokens=1024, checkpointing=False, trainable=134_515_008)  # fmt: skip


def test_checkpointing_and_smaller_micro_batches_lower_the_peak_and_checkpointing_costs_time():
    plain = memory_gb(Shape, LONG, 0.4, 0.5)
    checkpointed = memory_gb(Shape, replace(LONG, checkpointing=True), 0.4, 0.5)
    assert checkpointed["activations"] < plain["activations"] / 4
    assert peak(checkpointed) < peak(plain)
    assert step_flops(Shape, replace(LONG, checkpointing=True)) > step_flops(Shape, LONG)
    smaller = memory_gb(Shape, replace(LONG, micro_batch_tokens=256, length=4841 + 200), 0.4, 0.5)
    assert smaller["activations"] < plain["activations"]


@pytest.mark.parametrize("trajectories", [8, 32])
def test_the_shared_prompt_counts_once_in_the_kv_cache_and_the_flops(trajectories):
    w = replace(LONG, trajectories=trajectories)
    single = replace(w, trajectories=1)
    kv, kv_one = memory_gb(Shape, w, 0, 0)["kv_cache"], memory_gb(Shape, single, 0, 0)["kv_cache"]
    kv_token = 2 * Shape.num_hidden_layers * Shape.num_key_value_heads * Shape.head_dim * 4 / 1024**3
    per_own = (LONG.length - LONG.shared) * kv_token  # one trajectory's own tokens
    assert kv == pytest.approx(kv_one + (trajectories - 1) * per_own, rel=1e-6)
    # the shared prompt once, and its keys once more, packed for the decode kernel
    assert kv_one == pytest.approx(per_own + 1.5 * LONG.shared * kv_token, rel=1e-6)
    assert step_flops(Shape, w) < trajectories * step_flops(Shape, single) / 2


def test_a_groups_task_counts_once_per_group_in_the_flops():
    """Each group's task (the prompt after the step's shared part) goes through the model once in the rollout and
    three times in the update (forward, backward), not once per sample."""
    task = LONG.prompt - LONG.shared
    params = 30 * (576 * (9 + 2 * 3) * 64 + 9 * 64 * 576 + 3 * 576 * 1536)  # the default model's body
    one, two = step_flops(Shape, LONG), step_flops(Shape, replace(LONG, groups=2))
    assert two - one == pytest.approx(4 * 2 * params * task, rel=1e-9)


def test_the_resident_part_holds_weights_that_were_mapped_and_not_yet_read(tmp_path):
    """A model loaded from safetensors maps the file: its weights count in the process's memory only once read. The
    estimate reads them first, so its resident part holds them (it came out 0.5 GB under a measured step before)."""
    script = f"""
import gc, torch
from transformers import LlamaConfig, LlamaForCausalLM
from toolrl.memory import rss_gb, trim
from toolrl.models.loading import load_model
from toolrl.train.estimate import resident_gb
config = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
                     num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
LlamaForCausalLM(config).save_pretrained({str(tmp_path / "model")!r})
gc.collect(); trim()
before = rss_gb()
model = load_model({str(tmp_path / "model")!r}, torch.device("cpu"))
weights = sum(p.numel() * p.element_size() for p in model.parameters()) / 1024**3
print(resident_gb(model) - before, weights)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    grown, weights = map(float, done.stdout.split())
    assert grown >= 0.9 * weights, f"the resident part grew {grown:.3f} GB for {weights:.3f} GB of weights"


def test_the_time_is_given_for_one_turn_answers_and_at_the_limits():
    """An untrained model often answers in one turn: its step is far shorter than the limits' (3 turns, each with an
    observation). The line gives both; with one turn allowed, the two are the same and it gives one."""
    one, limits = step_flops(Shape, replace(LONG, length=LONG.one_turn)), step_flops(Shape, LONG)
    assert one < limits
    rate = one * STEP_OVER_BOUND / 60 / 1e9  # the rate at which the one-turn step takes a minute
    guess = Estimate(LONG, 3.2, {"resident": 0.5}, limits, one, rate)
    assert guess.step_s_one_turn == pytest.approx(60.0) and guess.step_s > 60.0
    expected = f"a step ~1.0 min if every sample answers in one turn, ~{guess.step_s / 60:.1f} min at the limits"
    assert expected in guess.line() and f"(at {rate:.0f} GFLOP/s, measured now)" in guess.line(), guess.line()
    single = Estimate(replace(LONG, length=LONG.one_turn), 3.2, {"resident": 0.5}, one, one, rate)
    assert "a step ~1.0 min (at" in single.line()
    with pytest.raises(ValueError, match="no matmul rate"):
        _ = Estimate(LONG, 3.2, {"resident": 0.5}, limits, one).step_s
