"""Sampling settings and the batched sampler: temperature, top-k and top-p, per row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus: sample among the most likely tokens whose probabilities sum to top_p; 1 turns it off."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 turns it off."""
    max_new_tokens: int = 64


def sample_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` [rows, vocab] and its log-prob.

    The log-prob is under softmax(logits / temperature) over the whole vocabulary (the untempered softmax for
    greedy rows): the quantity the trainer recomputes for its importance ratio, whatever top-k or top-p cut
    from the distribution that was actually sampled."""
    logits = logits.float()
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    if not greedy.any():  # the usual case: every row sampled, no row copies
        tokens = _categorical(torch.softmax(_truncate(scaled, params), dim=-1), generator)
    else:
        tokens = logits.argmax(-1)
        sampled_rows = (~greedy).nonzero().squeeze(1)
        if len(sampled_rows):
            cut = _truncate(scaled[sampled_rows], [params[i] for i in sampled_rows.tolist()])
            tokens[sampled_rows] = _categorical(torch.softmax(cut, dim=-1), generator)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def _categorical(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row by inverting the cumulative distribution: exact, and 20x faster than
    torch.multinomial over a 49k vocabulary on CPU (3 ms against 61 ms for 64 rows)."""
    cdf = probs.double().cumsum(-1)  # float64: the tail of a 49k vocabulary keeps its mass
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64) * cdf[:, -1:]
    # right=True: the first token whose cumulative mass exceeds u, so a token with no mass is never drawn.
    return torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[-1] - 1).squeeze(1)


def _truncate(scaled: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p set to -inf (the most likely token always stays)."""
    top_k = [p.top_k for p in params]
    top_p = [p.top_p for p in params]
    if not any(top_k) and all(p >= 1.0 for p in top_p):
        return scaled
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(scaled.shape[-1], device=scaled.device)[None, :]
    k = torch.tensor([k if k > 0 else scaled.shape[-1] for k in top_k], device=scaled.device)
    drop = rank >= k[:, None]
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(-1) - probs  # mass of the more likely tokens
    drop |= before >= torch.tensor(top_p, device=scaled.device)[:, None]
    drop[:, 0] = False
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, ordered)
