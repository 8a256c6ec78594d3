"""GRPO on the tiny model raises the mean of a trivial synthetic reward within a fixed number of steps."""

from statistics import mean

import pytest

from toolrl.config import load_config
from toolrl.envs import Environment, Task, register_env
from toolrl.rewards import Criterion, Rubric
from toolrl.train import GRPOTrainer, Workbench


def share_of_even_tokens(trajectory, task) -> float:
    generated = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    return sum(t % 2 == 0 for t in generated) / max(len(generated), 1)


@register_env("even-tokens")
class EvenTokensEnv(Environment):
    """Reward: the share of generated token ids that are even. About 0.5 for a random model."""

    name = "even-tokens"

    def __init__(self, config):
        self.rubric = Rubric([Criterion("even", share_of_even_tokens)])

    def tools(self):
        return []

    def tasks(self, split):
        return [Task(f"t{i}", f"Say something, {i}.", "") for i in range(8)]

    def messages(self, task):
        return [{"role": "system", "content": "You are a test."}, {"role": "user", "content": task.question}]


def tiny_config(model_dir, *overrides: str):
    base = [f"model.name={model_dir}", "env.name=even-tokens", "device=cpu", "rollout.max_turns=1"]
    return load_config(overrides=base + list(overrides))


def test_grpo_raises_mean_reward(tiny_model_dir):
    config = tiny_config(
        tiny_model_dir,
        "rollout.max_new_tokens=8",
        "train.steps=20",
        "train.prompts_per_step=2",
        "train.group_size=8",
        "train.lr=0.03",
    )
    trainer = GRPOTrainer(Workbench.load(config))
    rewards = [trainer.step(step)["reward"] for step in range(1, config.train.steps + 1)]
    first, last = mean(rewards[:3]), mean(rewards[-3:])
    assert last > first + 0.2, rewards


@pytest.mark.slow
def test_kl_penalty_to_reference_is_measured_and_grows_from_zero(tiny_model_dir):
    config = tiny_config(
        tiny_model_dir,
        "rollout.max_new_tokens=6",
        "train.prompts_per_step=1",
        "train.group_size=4",
        "train.lr=0.003",
        "train.kl_coef=0.1",
    )
    trainer = GRPOTrainer(Workbench.load(config))
    first = trainer.step(1)
    second = trainer.step(2)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy equals the reference before any update
    assert second["kl"] > 0.0


def test_micro_batched_update_equals_one_batch(tiny_model_dir):
    import copy

    import torch

    from toolrl.algos import group_advantages

    config = tiny_config(tiny_model_dir, "rollout.max_new_tokens=6", "train.group_size=4", "train.prompts_per_step=2")
    bench = Workbench.load(config)
    trainer = GRPOTrainer(bench)
    trajs = trainer.rollout.run([task for task in trainer.next_tasks() for _ in range(4)])
    advantages = group_advantages(torch.tensor([t.reward for t in trajs]), 4)
    initial = copy.deepcopy(bench.model.state_dict())

    results = []
    for budget in (100_000, 20):  # one micro-batch, then one row per micro-batch
        bench.model.load_state_dict(initial)
        config.train.micro_batch_tokens = budget
        trainer = GRPOTrainer(bench)
        stats = trainer.update(trajs, advantages)
        results.append((stats, {k: v.clone() for k, v in bench.model.state_dict().items()}))
    (one, params_one), (many, params_many) = results
    assert one["loss"] == pytest.approx(many["loss"], abs=1e-5)  # ~0 on-policy: ratio 1, advantages sum to 0
    assert one["grad_norm"] == pytest.approx(many["grad_norm"], rel=1e-4)
    for name, value in params_one.items():
        assert torch.allclose(value, params_many[name], atol=1e-6), name
