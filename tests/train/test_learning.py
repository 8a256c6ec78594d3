"""Training on the tiny model: GRPO raises a trivial synthetic reward; updates are exact under micro-batching."""

from statistics import mean

import pytest

from tests.fixtures.even_env import EvenTokensEnv  # noqa: F401  (registers even-tokens)
from toolrl.config import load_config
from toolrl.train import GRPOTrainer, Trainer, Workbench


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
        "train.kl.coef=0.1",
    )
    trainer = GRPOTrainer(Workbench.load(config))
    first = trainer.step(1)
    second = trainer.step(2)
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy equals the reference before any update
    assert second["kl"] > 0.0


@pytest.mark.parametrize(
    "algorithm",
    [
        ("grpo", "ppo_clip", "token_mean"),
        ("dr_grpo", "gspo", "seq_mean_token_sum"),
        ("rloo", "vanilla_pg", "seq_mean_token_mean"),
        ("gae", "ppo_clip", "token_mean"),
    ],
)
def test_micro_batched_update_equals_one_batch(tiny_model_dir, algorithm):
    """Gradient accumulation over micro-batches gives the update of one batch, for every aggregation."""
    import copy

    import torch

    advantage, loss, aggregation = algorithm
    config = tiny_config(
        tiny_model_dir,
        "rollout.max_new_tokens=6",
        "train.group_size=4",
        "train.prompts_per_step=2",
        f"train.advantage={advantage}",
        f"train.loss={loss}",
        f"train.aggregation={aggregation}",
        "train.entropy_coef=0.01",
        "train.kl.coef=0.05",
    )
    bench = Workbench.load(config)
    trainer = Trainer(bench)
    trajs = trainer.rollout.run([task for task in trainer.collector.order.next(2) for _ in range(4)], seed=3)
    initial = copy.deepcopy(bench.model.state_dict())

    results = []
    for budget in (100_000, 20):  # one micro-batch, then one row per micro-batch
        bench.model.load_state_dict(initial)
        config.train.micro_batch_tokens = budget
        torch.manual_seed(0)
        trainer = Trainer(bench)
        stats = trainer.update(trajs).metrics
        # The accumulated (clipped) gradients: Adam's first step turns gradients near 0 into +-lr, so the
        # parameters would magnify float noise; the gradients show exactness.
        grads = {n: p.grad.clone() for n, p in bench.model.named_parameters() if p.grad is not None}
        if trainer.value_head is not None:
            grads.update({f"v.{n}": p.grad.clone() for n, p in trainer.value_head.named_parameters()})
        results.append((stats, grads))
    (one, grads_one), (many, grads_many) = results
    for key in ("loss", "pg_loss", "entropy", "kl"):
        assert one[key] == pytest.approx(many[key], abs=1e-5), key
    assert one["grad_norm"] == pytest.approx(many["grad_norm"], rel=1e-4)
    assert one["grad_norm"] > 0
    assert grads_one.keys() == grads_many.keys() and len(grads_one) > 5
    for name, grad in grads_one.items():  # equal up to float32 summation order
        assert (grad - grads_many[name]).norm() <= 1e-4 * grad.norm() + 1e-9, name
