"""Engine/trainer mismatch: the tokens were sampled by the engine (its own kernels, maybe other weights: a
vLLM server, a step-old copy), the trainer recomputes their log-probs itself. Pure functions of the two
per-token log-prob tensors: the mismatch statistics logged each step, and truncated importance sampling
(Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"), which weighs each
token's loss by min(pi_trainer / pi_engine, cap) so that the gradient stays that of the trainer's policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def tis_weights(trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float) -> torch.Tensor:
    """[tokens] min(exp(trainer - engine), cap), without gradient."""
    return torch.exp(trainer_logprobs.detach() - engine_logprobs).clamp(max=cap)


@dataclass
class Mismatch:
    """Running sums over a step's micro-batches of the per-token mismatch between engine and trainer.

    With r = pi_trainer / pi_engine on tokens the engine sampled: `kl` is KL(engine || trainer) estimated by
    mean(-log r) (k1) and `kl_k3` by mean(r - 1 - log r) (never negative); `max_ratio` and `min_ratio` are the
    extremes of r, `abs_diff` the mean |log r|; `capped` the share of tokens whose weight hit the TIS cap."""

    tokens: int = 0
    k1: float = 0.0
    k3: float = 0.0
    abs_diff: float = 0.0
    max_ratio: float = 0.0
    min_ratio: float = float("inf")
    capped: int = 0

    def add(self, trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float | None = None) -> None:
        if not len(trainer_logprobs):
            return
        log_ratio = (trainer_logprobs.detach() - engine_logprobs).double()
        ratio = log_ratio.exp()
        self.tokens += len(log_ratio)
        self.k1 += float((-log_ratio).sum())
        self.k3 += float((ratio - 1 - log_ratio).sum())
        self.abs_diff += float(log_ratio.abs().sum())
        self.max_ratio = max(self.max_ratio, float(ratio.max()))
        self.min_ratio = min(self.min_ratio, float(ratio.min()))
        if cap is not None:
            self.capped += int((ratio > cap).sum())

    def metrics(self, prefix: str = "mismatch/") -> dict[str, float]:
        if not self.tokens:
            return {}
        n = self.tokens
        return {
            f"{prefix}kl": self.k1 / n,
            f"{prefix}kl_k3": self.k3 / n,
            f"{prefix}abs_logprob_diff": self.abs_diff / n,
            f"{prefix}max_ratio": self.max_ratio,
            f"{prefix}min_ratio": self.min_ratio,
            f"{prefix}capped_fraction": self.capped / n,
        }
