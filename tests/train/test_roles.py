"""Several roles of one policy in a step (an environment that sets each trajectory's `role`): each role's advantages
from its own members of the group, and each role's metrics."""

import asyncio

import pytest

from toolrl.config import load_config
from toolrl.train import Trainer, Workbench
from toolrl.train.evaluate import summarize


def test_a_proposer_and_its_solvers_train_on_their_own_baselines(tiny_model_dir, tmp_path):
    config = load_config(overrides=[f"model.name={tiny_model_dir}", "device=cpu", "env.name=calculator",
                                    "rollout.max_new_tokens=6", "train.group_size=4", "train.prompts_per_step=1",
                                    "train.advantage=dr_grpo", f"output_dir={tmp_path}"])  # fmt: skip
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    trajs = trainer.rollout.run([bench.env.tasks("train")[0]] * 4, seed=3)
    asyncio.run(bench.env.rubric.score_all(trajs))
    for traj, role, reward in zip(trajs, ["proposer", "solver", "solver", "solver"], [0.5, 1, 1, 0], strict=True):
        traj.role, traj.reward = role, float(reward)
        traj.rewards["correct"] = float(reward >= 1)
    first = [v.advantages[0] if v is not None else 0.0 for v in trainer.update(trajs).values]
    assert first == pytest.approx([0.0, 1 / 3, 1 / 3, -2 / 3])
    stats = summarize(trajs, "correct")
    assert stats["role/solver/share"] == 0.75 and stats["role/solver/reward"] == pytest.approx(2 / 3)
    assert stats["role/proposer/success"] == 0.0 and stats["role/solver/success"] == pytest.approx(2 / 3)
