"""Packed rows: a micro-batch's suffixes as one sequence of their real tokens, so that no linear layer computes a
padding position.

A micro-batch of trajectories of different lengths, padded to the longest, spends the padding's share of every
projection and MLP on nothing (27% of the update's linear FLOPs in bench/train_vs_trl.py's GRPO step). Only
attention needs the rows apart: the embeddings, projections, MLPs and norms act on each token alone. Here the rows'
tokens after the shared prefix are concatenated into one row of N tokens (with each row's own positions), and
attention gathers them into the padded [rows, width] layout, attends there (each row reading the shared prefix's
keys and values and its own earlier tokens), and scatters the result back: the padding costs only attention's
share, a few percent.

Attention is found by `config._attn_implementation`, read again when gradient checkpointing replays a layer in the
backward pass; the packed layout is passed as a keyword argument, which the replay keeps. So the function is
registered as "sdpa" itself (AttentionInterface): without the keyword it is transformers' SDPA unchanged; with it,
the packed path. `packable` says which models take it (SDPA attention, full causal attention in every layer, no
logit soft-capping, text only); `PackedRows.check` fails loudly if a model's layers never called it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from toolrl.models.vision import is_vision_config
from toolrl.rollout.cascade import supports_cascade

KEYWORD = "toolrl_packed"


class PackedRows:
    """Where each row's tokens lie in the packed sequence and in the padded layout attention uses."""

    def __init__(self, lengths: Sequence[int], device: torch.device):
        self.lengths = list(lengths)
        self.rows, self.width, self.tokens = len(self.lengths), max(self.lengths), sum(self.lengths)
        starts = torch.tensor([0, *self.lengths[:-1]], device=device).cumsum(0)
        self.starts = starts
        cols = torch.arange(self.width, device=device)
        lengths_ = torch.tensor(self.lengths, device=device)
        self.valid = cols[None, :] < lengths_[:, None]  # [rows, width]
        # each padded slot's packed token (a padding slot reads token 0: its output is never read back)
        self.gather = torch.where(self.valid, starts[:, None] + cols[None, :], 0)
        self.scatter = self.valid.flatten().nonzero().squeeze(1)  # packed token k -> its slot in rows x width
        self.calls = 0
        self._masks: dict[int, torch.Tensor] = {}

    def pack(self, offset: int, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Each [rows, width] tensor's columns after `offset` (ids, position ids), as [1, N] packed tokens."""
        width = tensors[0].shape[1] - offset
        rows = torch.arange(self.rows, device=self.starts.device)[:, None]
        index = (rows * width + torch.arange(self.width, device=self.starts.device)[None, :])[self.valid]
        return [t[:, offset:].flatten()[index][None] for t in tensors]

    def index(self, rows_idx: Sequence[int], cols_idx: Sequence[int]) -> torch.Tensor:
        """Packed positions of (row, column after the prefix) pairs."""
        device = self.starts.device
        return self.starts[torch.tensor(rows_idx, device=device)] + torch.tensor(cols_idx, device=device)

    def mask(self, prefix: int) -> torch.Tensor:
        """[rows, 1, width, prefix + width], True where a query may attend: the whole prefix and, in its own
        row, itself and earlier real tokens. A padding query attends as a causal one does (never to nothing)."""
        if prefix not in self._masks:
            device = self.valid.device
            causal = torch.ones(self.width, self.width, dtype=torch.bool, device=device).tril()
            own = causal[None] & self.valid[:, None, :]
            seen = torch.ones(self.rows, self.width, prefix, dtype=torch.bool, device=device)
            self._masks[prefix] = torch.cat([seen, own], dim=2)[:, None]
        return self._masks[prefix]

    def check(self, layers: int) -> None:
        if self.calls < layers:
            raise RuntimeError(
                f"packed rows: {self.calls} of {layers} attention layers read the packed layout; this model's "
                "attention does not pass keyword arguments on to the attention function (toolrl/train/packed.py): "
                "report the model family"
            )


def packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """SDPA; given `toolrl_packed` (PackedRows), `query` [1, heads, N, d] is the packed tokens' and `key`/`value`
    [1, kv_heads, prefix + N, d] the shared prefix's then the packed tokens'. Returns [1, N, heads, d]."""
    packed: PackedRows | None = kwargs.pop(KEYWORD, None)
    if packed is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    packed.calls += 1
    kwargs.pop("is_causal", None)
    prefix = key.shape[2] - packed.tokens
    rows, width = packed.rows, packed.width

    def padded(states: torch.Tensor) -> torch.Tensor:  # [1, h, N, d] -> [rows, h, width, d]
        return states[0].transpose(0, 1)[packed.gather].transpose(1, 2)

    keys, values = padded(key[:, :, prefix:]), padded(value[:, :, prefix:])
    if prefix:
        keys = torch.cat([key[:, :, :prefix].expand(rows, -1, -1, -1), keys], dim=2)
        values = torch.cat([value[:, :, :prefix].expand(rows, -1, -1, -1), values], dim=2)
    out, _ = sdpa_attention_forward(
        module, padded(query), keys, values, packed.mask(prefix), dropout, scaling, is_causal=False, **kwargs
    )  # [rows, width, heads, d]
    return out.reshape(rows * width, *out.shape[2:])[packed.scatter][None], None


AttentionInterface.register("sdpa", packed_attention)


def packable(model) -> bool:
    """Whether `model`'s layers take packed rows: SDPA attention (the function above), full causal attention in
    every layer, no soft-capping, text only (a vision-language policy's positions are its own)."""
    config = model.config
    return (
        getattr(config, "_attn_implementation", None) == "sdpa"
        and supports_cascade(config)
        and not is_vision_config(config)
    )
