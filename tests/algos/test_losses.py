import math

import pytest
import torch

from toolrl.algos import kl_k3, ppo_clip_loss


def test_ppo_clip_loss_hand_computed():
    # ratios: e^0 = 1, e^0.5 = 1.6487 (clipped to 1.2 for A > 0), e^-0.5 = 0.6065 (clipped to 0.8 for A < 0)
    logp = torch.tensor([0.0, 0.5, -0.5, 0.5])
    old = torch.zeros(4)
    adv = torch.tensor([2.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_loss(logp, old, adv, clip_eps=0.2)
    # token 0: -1 * 2 = -2; token 1: -min(1.6487, 1.2) = -1.2; token 2: -min(-0.6065, -0.8) = 0.8
    # token 3: -min(-1.6487, -1.2) = 1.6487 (pessimistic side is unclipped)
    expected = torch.tensor([-2.0, -1.2, 0.8, math.exp(0.5)])
    assert torch.allclose(loss, expected, atol=1e-4)
    assert clipped.tolist() == [False, True, True, False]


def test_ppo_clip_gradient_is_zero_where_clipped():
    logp = torch.tensor([0.5, 0.0], requires_grad=True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(2), torch.tensor([1.0, 1.0]), clip_eps=0.2)
    loss.sum().backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -1.0])


def test_k3_kl_hand_computed_and_zero_at_equality():
    logp = torch.tensor([0.0, -1.0])
    ref = torch.tensor([0.0, -2.0])
    # delta = ref - logp = [0, -1]; k3 = e^delta - delta - 1 = [0, e^-1]
    assert torch.allclose(kl_k3(logp, ref), torch.tensor([0.0, math.exp(-1)]), atol=1e-6)
