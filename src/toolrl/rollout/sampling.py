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
    seed: int | None = None
    """The sequence's own seed: the draw for the token at context position p depends only on (seed, p), so a
    sequence samples the same tokens whatever else shares its batch (reproducible runs, exact resume).
    None: draws come from the engine's generator in batch order."""


def position_uniform(seed: int, position: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, position): splitmix64 of the pair."""
    x = (seed * 0x9E3779B97F4A7C15 + position + 1) & 0xFFFFFFFFFFFFFFFF
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mult) & 0xFFFFFFFFFFFFFFFF
    return ((x ^ (x >> 31)) >> 11) * 2.0**-53


def request_seed(params: SamplingParams, position: int) -> int | None:
    """A 31-bit seed for one server request of a seeded sequence, from (seed, context length)."""
    if params.seed is None:
        return None
    return int(position_uniform(params.seed, position) * 2**31)


def sample_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generator: torch.Generator | None = None,
    positions: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of `logits` [rows, vocab] and its log-prob. `positions`: each row's context length
    (where its token goes), used by rows whose params have a seed.

    The log-prob is under softmax(logits / temperature) over the whole vocabulary (the untempered softmax for
    greedy rows): the quantity the trainer recomputes for its importance ratio, whatever top-k or top-p cut
    from the distribution that was actually sampled."""
    logits = logits.float()
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    greedy = temps == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    u = _uniforms(params, positions, generator, logits.device)
    if not greedy.any():  # the usual case: every row sampled, no row copies
        cut = _truncate(scaled, params)
        tokens = _categorical(logp.exp() if cut is scaled else torch.softmax(cut, dim=-1), u)
    else:
        tokens = logits.argmax(-1)
        sampled_rows = (~greedy).nonzero().squeeze(1)
        if len(sampled_rows):
            cut = _truncate(scaled[sampled_rows], [params[i] for i in sampled_rows.tolist()])
            tokens[sampled_rows] = _categorical(torch.softmax(cut, dim=-1), u[sampled_rows])
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


def _uniforms(params, positions, generator, device) -> torch.Tensor:
    """[rows, 1] float64 uniforms: from the generator (one per row, in row order), or from the row's seed."""
    u = torch.rand(len(params), 1, generator=generator, device=device, dtype=torch.float64)
    seeded = [i for i, p in enumerate(params) if p.seed is not None]
    if seeded:
        if positions is None:
            raise ValueError("sampling with per-sequence seeds needs each row's position")
        values = [position_uniform(params[i].seed, positions[i]) for i in seeded]
        u[seeded, 0] = torch.tensor(values, dtype=torch.float64, device=device)
    return u


BLOCK = 256


def _categorical(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row by inverting the cumulative distribution in two levels: pick a block of BLOCK tokens
    by the blocks' masses, then a token inside it by its cumulative mass. Exact, with one uniform per row.
    `sample_tokens` for 64 rows of a 49k vocabulary on this CPU: 3.7 ms, against 22 ms with one cumsum over
    each full row and 72 ms with torch.multinomial. Cumulative sums in float64, so the tail of a large
    vocabulary keeps its mass."""
    rows, vocab = probs.shape
    blocks = -(-vocab // BLOCK)
    if blocks * BLOCK != vocab:
        probs = torch.nn.functional.pad(probs, (0, blocks * BLOCK - vocab))
    padded = probs.view(rows, blocks, BLOCK)
    block_cdf = padded.sum(-1).double().cumsum(-1)
    u = u * block_cdf[:, -1:]
    # right=True: the first block (then token) whose cumulative mass exceeds u, so no empty one is drawn.
    block = torch.searchsorted(block_cdf, u, right=True).clamp(max=blocks - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(u))
    mass = block_cdf.gather(1, block) - before
    inside = padded.gather(1, block[:, :, None].expand(rows, 1, BLOCK)).squeeze(1).double().cumsum(-1)
    # The block's mass summed two ways can differ in the last bits: rescale u into this cumsum's total and
    # never step past the block's last token with mass.
    v = (u - before) / mass * inside[:, -1:]
    token = torch.searchsorted(inside, v, right=True)
    last = (inside < inside[:, -1:]).sum(-1, keepdim=True)
    return (block * BLOCK + torch.minimum(token, last)).squeeze(1)


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
