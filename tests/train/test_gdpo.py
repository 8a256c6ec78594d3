"""GDPO through the trainer, configured as a user would (`train.advantage: gdpo`, `train.advantage_options`): the
rubric's paid components reach the estimator, and rollouts of equal reward made of different components train with
different advantages (under GRPO, with one)."""

import asyncio

import pytest

from toolrl.config import load_config
from toolrl.errors import ConfigError
from toolrl.train import Trainer, Workbench


def rollouts(trainer, bench):
    """A group of four calculator episodes, scored by the rubric, then given equal totals from different parts:
    `correct` (weight 1) on the first, `tool_calls` (weight 1 here) on the next two, nothing on the last."""
    task = bench.env.tasks("train")[0]
    trajs = trainer.rollout.run([task] * 4, seed=3)
    asyncio.run(bench.env.rubric.score_all(trajs))
    assert all(t.reward_weights == {"correct": 1.0, "format": 0.1, "tool_calls": 1.0} for t in trajs)  # not weight 0
    for traj, (correct, calls) in zip(trajs, [(1, 0), (0, 1), (0, 1), (0, 0)], strict=True):
        traj.rewards |= {"correct": float(correct), "format": 1.0, "tool_calls": float(calls)}
        traj.reward = float(correct + calls) + 0.1
    return trajs


@pytest.mark.parametrize("advantage", ["gdpo", "grpo"])
def test_equal_totals_of_different_components_train_apart_under_gdpo(tiny_model_dir, tmp_path, advantage):
    sets = [f"model.name={tiny_model_dir}", "device=cpu", "env.name=calculator", "env.reward_weights={tool_calls: 1.0}",
            "rollout.max_new_tokens=6", "train.group_size=4", "train.prompts_per_step=1",
            f"train.advantage={advantage}", f"output_dir={tmp_path}"]  # fmt: skip
    if advantage == "gdpo":
        sets.append("train.advantage_options={batch_norm: false}")
    config = load_config(overrides=sets)
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    trajs = rollouts(trainer, bench)
    values = trainer.update(trajs).values
    first = [v.advantages[0] for v in values]
    if advantage == "grpo":
        assert first[0] == pytest.approx(first[1]) == pytest.approx(first[2]) and first[3] < 0
    else:  # by hand (test_advantages): 1.5 - 0.5/s, -0.5 + 0.5/s, -0.5 + 0.5/s, -0.5 - 0.5/s; s = sqrt(1/3)
        assert first == pytest.approx([0.634, 0.366, 0.366, -1.366], abs=2e-3)


def test_gdpo_options_are_checked_when_the_config_is_read():
    with pytest.raises(ConfigError, match=r"train\.advantage_options"):
        load_config(overrides=["train.advantage=gdpo", "train.advantage_options={batch_norm: maybe}"])
