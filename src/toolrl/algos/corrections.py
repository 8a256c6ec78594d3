"""Off-policy corrections: how the loss of a token sampled by another policy than the trainer's is weighed.

The behaviour policy sampled the tokens (the engine: its own numerics, maybe a copy of the weights some updates
old); the trainer computes their log-probs with its current weights. With r = pi_trainer / pi_behaviour per token
and R = prod r over a sequence, a correction gives each trained token a weight (0: masked, left out of the loss)
and says which log-probs the policy loss's ratio is taken against:

- `none`: weight 1; the ratio against the trainer's own log-probs (on-policy), or, with train.async_steps, against
  the behaviour's (clipped as PPO does).
- `token_tis` (cap): min(r, cap), truncated importance sampling per token (Yao et al. 2025).
- `seq_tis` (cap): min(R, cap) for every token of the sequence.
- `mis` (cap, level): masked importance sampling: r where r <= cap, else 0 (level token); or R where R <= cap, else
  the whole sequence masked (level sequence).
- `icepop` (low, high): r inside [low, high], else 0: both tails masked (IcePop, Ring-1T).
- `decoupled_ppo` (cap): the ratio against the proximal policy (the trainer's weights before this step's update:
  its log-probs detached, since a step makes one optimizer step), each token weighed by pi_proximal / pi_behaviour
  (truncated at cap when one is given; AReaL's decoupled PPO does not truncate). With one optimizer step a step it
  differs from token_tis by its default of no cap.

Entries are functions (CorrectionInputs, options) -> Corrected, registered in CORRECTIONS (algos/registries.py)
with their options model: `train.correction: NAME`, `train.correction_options: {...}`. `CorrectionStats` sums a
step's share masked, mean weight and share capped, logged as correction/*.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel

from toolrl.algos.correction_options import BandOptions, CapOptions, MaskOptions, ProximalOptions
from toolrl.algos.mismatch import tis_weights
from toolrl.algos.registries import CORRECTIONS


@dataclass(frozen=True)
class CorrectionInputs:
    trainer: torch.Tensor
    """[tokens] the trainer's log-probs (used detached)."""
    behaviour: torch.Tensor
    """[tokens] the log-probs of the policy that sampled the tokens (the engine's)."""
    counts: list[int]
    """Tokens of each sequence, in order."""

    def log_ratio(self) -> torch.Tensor:
        return (self.trainer.detach() - self.behaviour.to(self.trainer.device)).float()

    def per_sequence(self, values: torch.Tensor) -> torch.Tensor:
        """[sequences] -> [tokens]: each sequence's value on each of its tokens."""
        return torch.repeat_interleave(values, torch.tensor(self.counts, device=values.device))

    def sequence_log_ratio(self) -> torch.Tensor:
        """[tokens] log R of each token's sequence."""
        sums = torch.stack([part.sum() for part in self.log_ratio().split(self.counts)])
        return self.per_sequence(sums)


@dataclass
class Corrected:
    weights: torch.Tensor | None
    """[tokens] what each token's loss is multiplied by (0 where masked), without gradient; None: 1 everywhere."""
    masked: torch.Tensor | None = None
    """[tokens] bool: tokens left out of the loss."""
    capped: torch.Tensor | None = None
    """[tokens] bool: tokens whose weight hit a cap."""
    against: Literal["trainer", "behaviour"] | None = None
    """The log-probs the policy loss's ratio is against; None: the trainer's, or the behaviour's with async_steps."""


@CORRECTIONS.register("none")
def no_correction(x: CorrectionInputs, options: BaseModel) -> Corrected:
    return Corrected(None)


@CORRECTIONS.register("token_tis", options=CapOptions)
def token_tis(x: CorrectionInputs, options: CapOptions) -> Corrected:
    weights = tis_weights(x.trainer, x.behaviour, options.cap)
    return Corrected(weights, capped=x.log_ratio().exp() > options.cap, against="trainer")


@CORRECTIONS.register("seq_tis", options=CapOptions)
def seq_tis(x: CorrectionInputs, options: CapOptions) -> Corrected:
    ratio = x.sequence_log_ratio().exp()
    return Corrected(ratio.clamp(max=options.cap), capped=ratio > options.cap, against="trainer")


@CORRECTIONS.register("mis", options=MaskOptions)
def masked_is(x: CorrectionInputs, options: MaskOptions) -> Corrected:
    ratio = (x.log_ratio() if options.level == "token" else x.sequence_log_ratio()).exp()
    masked = ratio > options.cap
    return Corrected(torch.where(masked, torch.zeros_like(ratio), ratio), masked=masked, against="trainer")


@CORRECTIONS.register("icepop", options=BandOptions)
def icepop(x: CorrectionInputs, options: BandOptions) -> Corrected:
    ratio = x.log_ratio().exp()
    masked = (ratio < options.low) | (ratio > options.high)
    return Corrected(torch.where(masked, torch.zeros_like(ratio), ratio), masked=masked, against="trainer")


@CORRECTIONS.register("decoupled_ppo", options=ProximalOptions)
def decoupled_ppo(x: CorrectionInputs, options: ProximalOptions) -> Corrected:
    if options.cap is not None:  # the trainer's log-probs before the step's update are the proximal policy's
        return token_tis(x, CapOptions(cap=options.cap))
    return Corrected(x.log_ratio().exp(), against="trainer")


@dataclass
class CorrectionStats:
    """A step's running sums over its micro-batches: tokens, masked ones, the weights of the others, capped ones."""

    tokens: int = 0
    masked: int = 0
    weight_sum: float = 0.0
    capped: int = 0

    def add(self, corrected: Corrected, tokens: int) -> None:
        self.tokens += tokens
        if corrected.weights is None:
            self.weight_sum += tokens
            return
        kept = ~corrected.masked if corrected.masked is not None else torch.ones(tokens, dtype=torch.bool)
        self.masked += tokens - int(kept.sum())
        self.weight_sum += float(corrected.weights[kept.to(corrected.weights.device)].double().sum())
        if corrected.capped is not None:
            self.capped += int(corrected.capped.sum())

    def metrics(self, prefix: str = "correction/") -> dict[str, float]:
        if not self.tokens:
            return {}
        kept = self.tokens - self.masked
        return {f"{prefix}masked_fraction": self.masked / self.tokens,
                f"{prefix}mean_weight": self.weight_sum / kept if kept else 0.0,
                f"{prefix}capped_fraction": self.capped / self.tokens}  # fmt: skip
