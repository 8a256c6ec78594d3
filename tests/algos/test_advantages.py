import pytest
import torch

from toolrl.algos import group_advantages


def test_grpo_advantages_match_hand_computed_values():
    # group 1: [1, 0, 0, 1] mean 0.5, unbiased std sqrt(1/3) = 0.57735
    # group 2: [2, 2, 2, 2] all equal -> zero advantages
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = group_advantages(rewards, group_size=4, eps=0.0)
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_unscaled_advantages_are_mean_centred_only():
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0]), group_size=3, scale=False)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0])


def test_eps_keeps_near_equal_groups_finite():
    adv = group_advantages(torch.tensor([1.0, 1.0 + 1e-9]), group_size=2, eps=1e-4)
    assert torch.isfinite(adv).all() and adv.abs().max() < 1e-3
