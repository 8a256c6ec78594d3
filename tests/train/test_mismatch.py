"""The trainer recomputes log-probs itself: the engine's sampling log-probs are measured against them (the
mismatch metrics) and used only as truncated importance weights (train.tis_cap) or, in one-step off-policy
runs without a cap, as the ratio's denominator."""

import copy
import math

import pytest

from tests.train.test_features import tiny_config
from toolrl.train import Trainer, Workbench


@pytest.fixture
def setup(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path, "train.max_grad_norm=1e9")  # gradients as computed
    bench = Workbench.load(config)
    trajs = Trainer(bench).rollout.run([t for t in bench.env.tasks("train")[:2] for _ in range(4)], seed=5)
    for i, traj in enumerate(trajs):
        traj.reward = float(i % 3)
    return config, bench, trajs, copy.deepcopy(bench.model.state_dict())


def update(config, bench, initial, trajs, shift: float = 0.0, **train):
    """One update from the initial weights with the engine's log-probs shifted by `shift` on every trained
    token; returns the step's metrics and the gradient."""
    bench.model.load_state_dict(initial)
    for key, value in train.items():
        setattr(config.train, key, value)
    trajs = copy.deepcopy(trajs)
    for traj in trajs:
        traj.logprobs = [lp + shift if m else lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True)]
    stats = Trainer(bench).update(trajs).metrics
    grads = {n: p.grad.clone() for n, p in bench.model.named_parameters() if p.grad is not None}
    return stats, grads


def close(a, b, factor=1.0, rtol=1e-3):
    """factor * a == b for every parameter's gradient, to `rtol` in norm."""
    return all(float((a[k] * factor - b[k]).norm()) <= rtol * float(b[k].norm()) + 1e-12 for k in a)


def test_the_update_uses_the_trainer_s_log_probs_and_logs_the_engine_s_mismatch(setup):
    config, bench, trajs, initial = setup
    as_sampled, grads = update(config, bench, initial, trajs)
    assert as_sampled["mismatch/abs_logprob_diff"] < 1e-3  # the hf engine and the trainer agree closely
    assert as_sampled["mismatch/max_ratio"] == pytest.approx(1.0, abs=1e-2)
    shifted, shifted_grads = update(config, bench, initial, trajs, shift=-math.log(3))
    assert shifted["mismatch/max_ratio"] == pytest.approx(3.0, rel=1e-2)
    assert shifted["mismatch/kl"] == pytest.approx(-math.log(3), rel=1e-2)
    assert shifted["clip_frac"] == 0.0  # the ratio is against the trainer's own log-probs
    assert close(grads, shifted_grads, rtol=1e-5)  # wrong engine numbers do not change the on-policy update


def test_tis_cap_weighs_each_token_by_the_capped_ratio(setup):
    config, bench, trajs, initial = setup
    _, plain = update(config, bench, initial, trajs)
    stats, capped = update(config, bench, initial, trajs, shift=-math.log(10), tis_cap=2.0)  # ratio 10 -> 2
    assert stats["mismatch/capped_fraction"] == 1.0
    assert close(plain, capped, factor=2.0)
    _, halved = update(config, bench, initial, trajs, shift=math.log(2), tis_cap=2.0)  # ratio 0.5, under the cap
    assert close(plain, halved, factor=0.5)


def test_off_policy_steps_without_a_cap_clip_the_ratio_against_the_behaviour_log_probs(setup):
    config, bench, trajs, initial = setup
    on_policy, _ = update(config, bench, initial, trajs, shift=-1.0)
    off_policy, _ = update(config, bench, initial, trajs, shift=-1.0, async_steps=1)  # ratio e > 1.2
    assert on_policy["clip_frac"] == 0.0 and off_policy["clip_frac"] > 0.0


def test_a_correction_in_the_update_masks_weighs_and_logs_its_share(setup):
    """train.correction in a real update: icepop's band masks every token whose ratio is 10 (no policy gradient
    left), token_tis at cap 2 is train.tis_cap 2; the default logs no correction/* (the metrics as before)."""
    config, bench, trajs, initial = setup
    plain_stats, plain = update(config, bench, initial, trajs)
    assert not any(k.startswith("correction/") for k in plain_stats)
    stats, masked = update(config, bench, initial, trajs, shift=-math.log(10), correction="icepop")
    assert stats["correction/masked_fraction"] == 1.0
    assert all(float(g.norm()) == 0.0 for g in masked.values())
    tis_stats, tis = update(config, bench, initial, trajs, shift=-math.log(10), correction="token_tis")
    assert tis_stats["correction/capped_fraction"] == 1.0 and tis_stats["correction/mean_weight"] == pytest.approx(2.0)
    assert close(plain, tis, factor=2.0)
