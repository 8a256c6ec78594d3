"""Scores of the trained tokens of a batch of trajectories (log-probs, entropy, values), with their shared
prefix computed once.

The prefix (system prompt, tool schemas, examples) runs through the model once; every row's suffix attends to
its keys and values (a read-only cache, so gradient checkpointing can replay the suffix pass), so the gradient
of every sample flows back through one prefix. Logits are computed only at positions that predict a trained
token, never for the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from toolrl.algos import entropy_from_logits
from toolrl.models.vision import is_vision_config
from toolrl.rollout.engine import common_prefix_length
from toolrl.rollout.trajectory import Trajectory


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices into `lengths` grouped so that rows x longest length <= max_tokens, shortest first.

    `lengths` are the tokens each trajectory has beyond the prefix shared by all; sorting keeps padding small.
    A trajectory longer than the budget gets a batch of its own.
    """
    batches: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if batches and (len(batches[-1]) + 1) * lengths[i] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


class _PrefixLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, rows: int):
        super().__init__()
        self.keys, self.values, self.rows = keys, values, rows
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # always initialized
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """The prefix's keys and values, then the new ones; nothing is stored, so a replay gives the same."""
        shape = (self.rows, -1, -1, -1)
        keys = torch.cat([self.keys.expand(shape), key_states], dim=2)
        return keys, torch.cat([self.values.expand(shape), value_states], dim=2)

    def get_seq_length(self) -> int:
        return self.keys.shape[2]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2] + query_length, 0

    def get_max_length(self) -> int:
        return -1


class PrefixCache(Cache):
    """A one-row prefix's keys and values that every row of a batch reads; never written to."""

    def __init__(self, prefix_layers: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: int):
        super().__init__(layers=[_PrefixLayer(k, v, rows) for k, v in prefix_layers])


@dataclass
class TokenScores:
    logprobs: torch.Tensor
    """[tokens] log-probs of the trained tokens (flat, in trajectory order)."""
    counts: list[int]
    """Trained tokens per trajectory."""
    entropy: torch.Tensor | None = None
    """[tokens] entropy of the (tempered) next-token distribution at each trained token."""
    values: torch.Tensor | None = None
    """[tokens] the value head's estimate at each trained token's state."""


def _decoder_layers(model) -> list:
    return [m for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache")]


def hidden_and_logits(model, ids, attention, positions, prefix, rows_idx, cols_idx):
    """The decoder over the shared prefix once and every row's suffix, then the hidden states and logits at
    the selected positions only. Under FSDP2 it is registered as a forward method of the sharded model
    (distributed.shard), so that calling it gathers the weights as `forward` would."""
    device, rows, prefix_len = ids.device, ids.shape[0], len(prefix)
    decoder = model.get_decoder()
    layers = _decoder_layers(decoder)
    saved = [(layer.gradient_checkpointing, layer._can_checkpoint_with_cache) for layer in layers]
    try:
        cache = None
        if prefix_len:
            for layer in layers:  # the prefix pass keeps its cache: one row, small, not replayed
                layer.gradient_checkpointing = False
            once = DynamicCache()  # given, not asked for: under checkpointing the model drops use_cache
            decoder(input_ids=torch.tensor([prefix], device=device), past_key_values=once, use_cache=True)
            cache = PrefixCache([(layer.keys, layer.values) for layer in once.layers], rows)
            for layer, (replays, _) in zip(layers, saved, strict=True):
                layer.gradient_checkpointing = replays
                layer._can_checkpoint_with_cache = True  # the suffix pass only reads the prefix cache
        hidden = decoder(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=cache is not None,
        ).last_hidden_state
    finally:
        for layer, (replays, with_cache) in zip(layers, saved, strict=True):
            layer.gradient_checkpointing, layer._can_checkpoint_with_cache = replays, with_cache

    selected = hidden[torch.tensor(rows_idx, device=device), torch.tensor(cols_idx, device=device)]
    return selected, model.get_output_embeddings()(selected).float()


def score_tokens(
    model, trajs: Sequence[Trajectory], temperature: float = 1.0, entropy: bool | str = False, value_head=None
) -> TokenScores:
    """Log-probs of the tokens with loss_mask 1 (and, when asked, entropy and values at them). `entropy`:
    True for a differentiable entropy (a loss term), "measure" for its value only (logged; no activations
    kept for a backward pass)."""
    if is_vision_config(model.config):
        return score_vision_tokens(model, trajs, temperature, entropy, value_head)
    device = next(model.parameters()).device
    first_trained = min(t.loss_mask.index(1) for t in trajs)
    # Every scored position (first_trained - 1 onward) must lie in the suffix, after the shared prefix.
    prefix_len = min(common_prefix_length([t.token_ids for t in trajs]), first_trained - 1)
    if getattr(model, "toolrl_hidden_and_logits", None) is not None:
        prefix_len = 0  # sharded (FSDP2): each layer runs once per pass, as its gradient hooks expect
    prefix = trajs[0].token_ids[:prefix_len]
    suffixes = [t.token_ids[prefix_len:] for t in trajs]
    width = max(len(s) for s in suffixes)
    rows = len(trajs)
    ids = torch.zeros(rows, width, dtype=torch.long)
    suffix_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, : len(s)] = torch.tensor(s)
        suffix_mask[i, : len(s)] = 1
    ids, suffix_mask = ids.to(device), suffix_mask.to(device)

    attention = torch.cat([torch.ones(rows, prefix_len, dtype=torch.long, device=device), suffix_mask], dim=1)
    positions = torch.arange(prefix_len, prefix_len + width, device=device).expand(rows, -1)
    rows_idx, cols_idx, targets, counts = [], [], [], []
    for i, t in enumerate(trajs):
        trained = [p for p, m in enumerate(t.loss_mask) if m]
        rows_idx += [i] * len(trained)
        cols_idx += [p - 1 - prefix_len for p in trained]
        targets += [t.token_ids[p] for p in trained]
        counts.append(len(trained))
    forward = getattr(model, "toolrl_hidden_and_logits", None) or partial(hidden_and_logits, model)
    selected, logits = forward(ids, attention, positions, prefix, rows_idx, cols_idx)
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return TokenScores(
        logp.gather(1, torch.tensor(targets, device=device)[:, None]).squeeze(1),
        counts,
        measured_entropy(logp) if entropy == "measure" else entropy_from_logits(logits) if entropy else None,
        value_head(selected).squeeze(-1).float() if value_head is not None else None,
    )


def score_vision_tokens(model, trajs: Sequence[Trajectory], temperature, entropy, value_head) -> TokenScores:
    """score_tokens for a vision-language policy: the trajectories' whole sequences in one forward (padded on
    the right; the model computes M-RoPE positions from the ids, the images and the mask), with all their
    images' inputs in row order. No shared prefix is taken out (image tokens have 3-D positions)."""
    from toolrl.models.vision import model_inputs

    device = next(model.parameters()).device
    width = max(len(t.token_ids) for t in trajs)
    ids = torch.zeros(len(trajs), width, dtype=torch.long)
    mask = torch.zeros(len(trajs), width, dtype=torch.long)
    rows, cols, counts = [], [], []
    for i, traj in enumerate(trajs):
        ids[i, : len(traj.token_ids)] = torch.tensor(traj.token_ids)
        mask[i, : len(traj.token_ids)] = 1
        trained = [p for p, m in enumerate(traj.loss_mask) if m]
        rows += [i] * len(trained)
        cols += trained
        counts.append(len(trained))
    ids, mask = ids.to(device), mask.to(device)
    images = model_inputs([im for traj in trajs for im in traj.images], device)
    out = model(input_ids=ids, attention_mask=mask, **images, output_hidden_states=value_head is not None)
    rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
    logits = out.logits[rows_t, cols_t - 1].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    measured = None
    if entropy:
        measured = measured_entropy(logp) if entropy == "measure" else entropy_from_logits(logits)
    values = None
    if value_head is not None:
        values = value_head(out.hidden_states[-1][rows_t, cols_t - 1]).squeeze(-1).float()
    return TokenScores(logp.gather(1, ids[rows_t, cols_t][:, None]).squeeze(1), counts, measured, values)


def measured_entropy(logp: torch.Tensor, rows: int = 1024) -> torch.Tensor:
    """[tokens] entropy of each row of log-probs, without gradient, a block of rows at a time (no second
    vocabulary-sized tensor of all rows at once)."""
    with torch.no_grad():
        return torch.cat([-(part.exp() * part).sum(-1) for part in logp.detach().split(rows)])


def trained_token_logprobs(
    model, trajs: Sequence[Trajectory], temperature: float = 1.0
) -> tuple[torch.Tensor, list[int]]:
    """Log-probs (flat, in trajectory order) of the tokens with loss_mask 1, and the count per trajectory."""
    scores = score_tokens(model, trajs, temperature)
    return scores.logprobs, scores.counts
