"""Policy losses and KL estimators: pure functions on per-token tensors.

They return per-token values; the caller aggregates (token-mean over a whole step: sum / token count), so that
gradient accumulation over micro-batches gives the same gradient as one big batch.
"""

from __future__ import annotations

import torch


def ppo_clip_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss -min(r * A, clip(r, 1 - eps, 1 + eps) * A) with r = exp(logp - old_logp),
    and a mask of the tokens where clipping was active."""
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(q - p) - (q - p) - 1, never negative."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1
