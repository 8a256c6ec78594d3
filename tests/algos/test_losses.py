"""Policy losses, aggregations, KL estimators, entropy and the value loss against hand-computed values."""

import math

import pytest
import torch

from toolrl.algos import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    PolicyInputs,
    StepTotals,
    entropy_from_logits,
    kl_k1,
    kl_k3,
    value_loss,
)
from toolrl.errors import ConfigError


def inputs(logp, old, adv, counts=None, low=0.2, high=0.2):
    return PolicyInputs(logp, old, adv, counts or [len(logp)], low, high)


def test_ppo_clip_hand_computed():
    # ratios: e^0 = 1, e^0.5 = 1.6487 (clipped to 1.2 for A > 0), e^-0.5 = 0.6065 (clipped to 0.8 for A < 0)
    logp = torch.tensor([0.0, 0.5, -0.5, 0.5])
    adv = torch.tensor([2.0, 1.0, -1.0, -1.0])
    loss, clipped = POLICY_LOSSES["ppo_clip"](inputs(logp, torch.zeros(4), adv))
    # token 0: -1 * 2 = -2; token 1: -min(1.6487, 1.2) = -1.2; token 2: -min(-0.6065, -0.8) = 0.8
    # token 3: -min(-1.6487, -1.2) = 1.6487 (pessimistic side is unclipped)
    assert torch.allclose(loss, torch.tensor([-2.0, -1.2, 0.8, math.exp(0.5)]), atol=1e-4)
    assert clipped.tolist() == [False, True, True, False]


def test_clip_higher_raises_only_the_upper_bound():
    logp = torch.tensor([0.5, -0.5])  # ratios 1.6487 and 0.6065
    adv = torch.tensor([1.0, -1.0])
    loss, _ = POLICY_LOSSES["ppo_clip"](inputs(logp, torch.zeros(2), adv, low=0.2, high=0.28))
    assert torch.allclose(loss, torch.tensor([-1.28, 0.8]), atol=1e-5)


def test_ppo_clip_gradient_is_zero_where_clipped():
    logp = torch.tensor([0.5, 0.0], requires_grad=True)
    loss, _ = POLICY_LOSSES["ppo_clip"](inputs(logp, torch.zeros(2), torch.tensor([1.0, 1.0])))
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -1.0])


def test_gspo_uses_the_sequence_ratio_and_each_tokens_own_gradient():
    # sequence 0: log-ratios 0.1, 0.3 -> s = e^0.2 = 1.2214 (not clipped at high 0.3); sequence 1: log-ratio
    # -0.4 -> s = e^-0.4 = 0.6703, A < 0 so the clipped 0.8 * -1 = -0.8 is the min: loss 0.8, no gradient.
    logp = torch.tensor([0.1, 0.3, -0.4], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, clipped = POLICY_LOSSES["gspo"](inputs(logp, torch.zeros(3), adv, [2, 1], low=0.2, high=0.3))
    s = math.exp(0.2)
    assert torch.allclose(loss, torch.tensor([-s, -s, 0.8]), atol=1e-5)
    assert clipped.tolist() == [False, False, True]
    loss.sum().backward()
    # d(-s * e^(logp_t - sg(logp_t)))/d logp_t = -s for each token of sequence 0
    assert logp.grad.tolist() == pytest.approx([-s, -s, 0.0], abs=1e-5)


def test_vanilla_pg_is_minus_advantage_times_logprob():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, clipped = POLICY_LOSSES["vanilla_pg"](inputs(logp, logp.detach(), torch.tensor([0.5, -1.0])))
    assert loss.tolist() == pytest.approx([0.5, -2.0]) and not clipped.any()
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([-0.5, 1.0])


def test_aggregations_hand_computed_and_additive_over_micro_batches():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0])
    counts = [2, 3]  # sequence 0: 1 + 2, sequence 1: 3 + 4 + 6
    totals = StepTotals(tokens=5, sequences=2)
    assert float(AGGREGATIONS["token_mean"](values, counts, totals)) == pytest.approx(16 / 5)
    assert float(AGGREGATIONS["seq_mean_token_sum"](values, counts, totals)) == pytest.approx((3 + 13) / 2)
    assert float(AGGREGATIONS["seq_mean_token_mean"](values, counts, totals)) == pytest.approx((1.5 + 13 / 3) / 2)
    for name, aggregate in AGGREGATIONS.items():  # two micro-batches of one sequence each sum to the whole
        split = aggregate(values[:2], [2], totals) + aggregate(values[2:], [3], totals)
        assert float(split) == pytest.approx(float(aggregate(values, counts, totals))), name


def test_kl_estimators_hand_computed():
    logp = torch.tensor([0.0, -1.0])
    ref = torch.tensor([0.0, -2.0])
    # delta = ref - logp = [0, -1]; k3 = e^delta - delta - 1 = [0, e^-1]; k1 = logp - ref = [0, 1]
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([0.0, math.exp(-1)]), atol=1e-6)
    assert kl_k1(logp, ref).tolist() == [0.0, 1.0]
    assert set(KL_ESTIMATORS) >= {"k1", "k3"}


def test_entropy_of_uniform_and_of_certain():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    assert entropy_from_logits(logits).tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)


def test_value_loss_takes_the_larger_of_clipped_and_unclipped():
    values, old, returns = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.0, 1.0])
    # token 0: unclipped (1-0)^2 = 1, clipped V = 0.2 -> 0.04: max 1 -> 0.5; token 1: both (0-1)^2 = 1 -> 0.5
    assert value_loss(values, old, returns, clip=0.2).tolist() == pytest.approx([0.5, 0.5])
    values = torch.tensor([0.5])  # towards the return 1 from old 0: clipped 0.2 is further, (0.8)^2 = 0.64
    assert value_loss(values, torch.zeros(1), torch.ones(1), clip=0.2).tolist() == pytest.approx([0.32])


def test_an_unknown_loss_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"train\.loss"):
        POLICY_LOSSES.lookup("nope")
