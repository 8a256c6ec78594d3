"""Engine/trainer mismatch statistics and truncated importance sampling against hand-computed values."""

import math

import pytest
import torch

from toolrl.algos.mismatch import Mismatch, tis_weights


def test_tis_weights_are_the_ratio_capped_and_carry_no_gradient():
    trainer = torch.tensor([0.0, math.log(2), math.log(0.5), math.log(10)], requires_grad=True)
    weights = tis_weights(trainer, torch.zeros(4), cap=3.0)
    assert weights.tolist() == pytest.approx([1.0, 2.0, 0.5, 3.0])
    assert not weights.requires_grad


def test_mismatch_statistics_over_micro_batches():
    stats = Mismatch()
    # ratios pi_trainer / pi_engine of 1, 2 and 0.5 in two micro-batches, cap 1.5
    stats.add(torch.tensor([0.0, math.log(2)]), torch.zeros(2), cap=1.5)
    stats.add(torch.tensor([-1.0]), torch.tensor([-1.0 - math.log(0.5)]), cap=1.5)
    out = stats.metrics()
    log2 = math.log(2)
    assert out["mismatch/kl"] == pytest.approx(0.0, abs=1e-12)  # mean of -log r: 0, -log 2, +log 2
    assert out["mismatch/kl_k3"] == pytest.approx((0 + (1 - log2) + (-0.5 + log2)) / 3)
    assert out["mismatch/abs_logprob_diff"] == pytest.approx(2 * log2 / 3)
    assert out["mismatch/max_ratio"] == pytest.approx(2.0) and out["mismatch/min_ratio"] == pytest.approx(0.5)
    assert out["mismatch/capped_fraction"] == pytest.approx(1 / 3)


def test_no_tokens_no_metrics():
    stats = Mismatch()
    stats.add(torch.zeros(0), torch.zeros(0))
    assert stats.metrics() == {}
