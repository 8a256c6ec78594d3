"""Policy losses, loss aggregations, KL estimators, entropy and the value loss: pure functions on flat per-token
tensors (the trained tokens of trajectories one after another, `counts[i]` of them for trajectory i).

Losses return per-token values; an aggregation turns them into the scalar of one micro-batch with the whole
step's denominators, so that gradients accumulated over micro-batches equal the gradient of one big batch.
Each family is a registry: adding one is a function and a decorator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from toolrl.algos.registries import KL_ESTIMATORS, register_aggregation, register_policy_loss


@dataclass
class PolicyInputs:
    logprobs: torch.Tensor
    """[tokens] under the current policy (with gradient)."""
    old_logprobs: torch.Tensor
    """[tokens] under the policy that sampled them."""
    advantages: torch.Tensor
    counts: list[int]
    clip_low: float = 0.2
    clip_high: float = 0.2
    """DAPO's clip-higher: a larger upper bound leaves room to raise unlikely tokens."""


PolicyLoss = Callable[[PolicyInputs], tuple[torch.Tensor, torch.Tensor]]
"""What POLICY_LOSSES (registries.py) holds; likewise Aggregation and KLEstimator below."""


def _clipped_objective(ratio: torch.Tensor, x: PolicyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    unclipped = ratio * x.advantages
    clipped = ratio.clamp(1 - x.clip_low, 1 + x.clip_high) * x.advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


@register_policy_loss("ppo_clip")
def ppo_clip(x: PolicyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """-min(r A, clip(r, 1 - low, 1 + high) A) with the token ratio r = exp(logp - old_logp); also the mask of
    tokens where the clip was active."""
    return _clipped_objective(torch.exp(x.logprobs - x.old_logprobs), x)


@register_policy_loss("gspo")
def gspo(x: PolicyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO: the ratio of a whole sequence, s = exp(mean over its tokens of logp - old_logp), clipped per
    sequence (GSPO uses small bounds, e.g. 3e-4 / 4e-4). In the token form each token carries the value s with
    the gradient of its own log-prob: s_t = sg(s) * exp(logp_t - sg(logp_t))."""
    counts = torch.tensor(x.counts, device=x.logprobs.device)
    owner = torch.repeat_interleave(torch.arange(len(x.counts), device=x.logprobs.device), counts)
    log_ratio = (x.logprobs - x.old_logprobs).detach()
    seq_log_ratio = torch.zeros(len(x.counts), device=log_ratio.device).index_add_(0, owner, log_ratio) / counts
    ratio = torch.exp(seq_log_ratio[owner] + x.logprobs - x.logprobs.detach())
    return _clipped_objective(ratio, x)


@register_policy_loss("vanilla_pg")
def vanilla_pg(x: PolicyInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE: -A logp (on-policy; no ratio, no clip)."""
    return -x.advantages * x.logprobs, torch.zeros_like(x.logprobs, dtype=torch.bool)


@dataclass
class StepTotals:
    """Denominators of the whole step (every micro-batch of it)."""

    tokens: int
    sequences: int


Aggregation = Callable[[torch.Tensor, list[int], StepTotals], torch.Tensor]
KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@register_aggregation("token_mean")
def token_mean(values: torch.Tensor, counts: list[int], totals: StepTotals) -> torch.Tensor:
    """Every trained token of the step weighs the same (DAPO)."""
    return values.sum() / totals.tokens


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(values: torch.Tensor, counts: list[int], totals: StepTotals) -> torch.Tensor:
    """Sum over a sequence's tokens, mean over sequences (Dr. GRPO, without its constant)."""
    return values.sum() / totals.sequences


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(values: torch.Tensor, counts: list[int], totals: StepTotals) -> torch.Tensor:
    """Mean over a sequence's tokens, then mean over sequences (the original GRPO)."""
    n = torch.tensor(counts, device=values.device, dtype=values.dtype)
    return (values / torch.repeat_interleave(n, n.long())).sum() / totals.sequences


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """logp - ref_logp: unbiased, high variance, can be negative."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """exp(q - p) - (q - p) - 1 with q = ref_logp, p = logp: unbiased, low variance, never negative."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per row."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """PPO's clipped value loss per token: 0.5 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
