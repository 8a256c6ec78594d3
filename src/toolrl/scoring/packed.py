"""Packed rows: a micro-batch's suffixes as one sequence of their real tokens, so that no linear layer computes a
padding position.

A micro-batch of trajectories of different lengths, padded to the longest, spends the padding's share of every
projection and MLP on nothing (27% of the update's linear FLOPs in bench/train_vs_trl.py's GRPO step). Only
attention needs the rows apart: the embeddings, projections, MLPs and norms act on each token alone. Here the rows'
tokens after the shared prefix are concatenated into one row of N tokens (with each row's own positions), and
attention gathers them into the padded [rows, width] layout, attends there (each row reading the shared prefix's
keys and values and its own earlier tokens), and scatters the result back: the padding costs only attention's
share, a few percent.

Rows that start alike beyond the shared prefix (the samples of one GRPO group: the same task after the step's
common system prompt and tools) go through the layers once for that part: a row may borrow its first tokens from
another row's packed tokens, and attention gathers them into the borrowing row's padded layout. The borrowed
tokens' outputs are the lender's; their gradients add up over every row that reads them, as the duplicated rows'
gradients would.

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

from toolrl.models.native import attention as long_prompt
from toolrl.models.vision import is_vision_config
from toolrl.rollout.cascade import supports_cascade
from toolrl.scoring.cascade_grad import cascade_with_grad

KEYWORD = "toolrl_packed"
CASCADE = True
"""On CPU, rows read the shared prefix through scoring/cascade_grad.py; False: each row attends over its own copy of
the prefix (the layout before it; bench/kernels/cascade_grad.py compares the two)."""


class PackedRows:
    """Where each row's tokens lie in the packed sequence and in the padded layout attention uses.

    `lengths`: each row's tokens after the shared prefix. `borrows` (optional, one per row): (lender, n) where the
    row's first n tokens are the same as row `lender`'s and are computed once, in the lender's packed tokens (or in
    its lender's, where the lender borrowed them in turn: a prefix tree, scoring/plan.py); each row packs its tokens
    after its n."""

    def __init__(self, lengths: Sequence[int], device: torch.device, borrows: Sequence[tuple[int, int]] = ()):
        self.lengths = list(lengths)
        self.rows, self.width = len(self.lengths), max(self.lengths)
        borrows = list(borrows) or [(row, 0) for row in range(self.rows)]
        own_lengths = [length - n for length, (_, n) in zip(self.lengths, borrows, strict=True)]
        self.tokens = sum(own_lengths)
        starts = [0]
        for length in own_lengths[:-1]:
            starts.append(starts[-1] + length)
        where: list[list[int] | None] = [None] * self.rows  # each row's packed position of each of its columns

        def resolve(row: int, seen: tuple[int, ...] = ()) -> list[int]:
            if where[row] is None:
                lender, n = borrows[row]
                if n and (lender == row or lender in seen or n >= self.lengths[row] or n > self.lengths[lender]):
                    raise ValueError(f"packed rows: row {row} borrows {n} tokens from row {lender}, which cannot "
                                     "lend them")  # fmt: skip
                lent = resolve(lender, (*seen, row))[:n] if n else []
                where[row] = lent + list(range(starts[row], starts[row] + own_lengths[row]))
            return where[row]  # type: ignore[return-value]

        table = torch.zeros(self.rows, self.width, dtype=torch.long)
        for row in range(self.rows):
            table[row, : self.lengths[row]] = torch.tensor(resolve(row), dtype=torch.long)
        self.table = table.to(device)
        """[rows, width] the packed position of each (row, column after the prefix); 0 in padding."""
        self.borrowed = torch.tensor([n for _, n in borrows], device=device)
        cols = torch.arange(self.width, device=device)
        lengths_ = torch.tensor(self.lengths, device=device)
        self.valid = cols[None, :] < lengths_[:, None]  # [rows, width]
        self.own = self.valid & (cols[None, :] >= self.borrowed[:, None])  # the slots whose token a row packs
        # each padded slot's packed token: its own, or its lender's for a borrowed column (a padding slot reads
        # token 0: its output is never read back)
        self.gather = self.table
        self.scatter = self.own.flatten().nonzero().squeeze(1)  # packed token k -> its slot in rows x width
        self.calls = 0
        self._masks: dict[int, torch.Tensor] = {}
        self._own: dict[torch.dtype, torch.Tensor] = {}

    def pack(self, offset: int, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Each [rows, width] tensor's columns after `offset` (ids, position ids), as [1, N] packed tokens."""
        width = tensors[0].shape[1] - offset
        rows = torch.arange(self.rows, device=self.table.device)[:, None]
        index = (rows * width + torch.arange(self.width, device=self.table.device)[None, :])[self.own]
        return [t[:, offset:].flatten()[index][None] for t in tensors]

    def index(self, rows_idx: Sequence[int], cols_idx: Sequence[int]) -> torch.Tensor:
        """Packed positions of (row, column after the prefix) pairs."""
        device = self.table.device
        return self.table[torch.tensor(rows_idx, device=device), torch.tensor(cols_idx, device=device)]

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

    def own_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """[rows, 1, width, width] additive mask of each row's own tokens (mask()'s part after the prefix)."""
        if dtype not in self._own:
            allowed = self.mask(0)
            self._own[dtype] = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
                ~allowed, float("-inf")
            )
        return self._own[dtype]

    def check(self, layers: int) -> None:
        if self.calls < layers:
            raise RuntimeError(
                f"packed rows: {self.calls} of {layers} attention layers read the packed layout; this model's "
                "attention does not pass keyword arguments on to the attention function (toolrl/scoring/packed.py): "
                "report the model family"
            )


def lend_alike(suffixes: Sequence[Sequence[int]], caps: Sequence[int]) -> list[tuple[int, int]]:
    """PackedRows' borrows: each row whose first `caps[row]` tokens (at most: the tokens before its first scored
    position) are the same as an earlier row's borrows them from the first such row. The samples of a group share
    their task's prompt this way; a row with a cap of 0 lends and borrows nothing."""
    first: dict[tuple[int, ...], int] = {}
    borrows = []
    for row, (tokens, cap) in enumerate(zip(suffixes, caps, strict=True)):
        lender = first.setdefault(tuple(tokens[:cap]), row) if cap > 0 else row
        borrows.append((lender, cap if lender != row else 0))
    return borrows


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
    """SDPA (a long prompt's causal self-attention on the native kernel: models/native/attention.py); given
    `toolrl_packed` (PackedRows), `query` [1, heads, N, d] is the packed tokens' and `key`/`value`
    [1, kv_heads, prefix + N, d] the shared prefix's then the packed tokens'. Returns [1, N, heads, d]."""
    packed: PackedRows | None = kwargs.pop(KEYWORD, None)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if packed is None:
        if long_prompt.takes(module, query, key, value, attention_mask, dropout, kwargs):
            return long_prompt.causal_attention(query, key, value, scale), None
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    packed.calls += 1
    kwargs.pop("is_causal", None)
    prefix = key.shape[2] - packed.tokens
    rows, width = packed.rows, packed.width

    def padded(states: torch.Tensor) -> torch.Tensor:  # [1, h, N, d] -> [rows, h, width, d]
        return states[0].transpose(0, 1)[packed.gather].transpose(1, 2)

    keys, values = padded(key[:, :, prefix:]), padded(value[:, :, prefix:])
    if prefix and CASCADE and query.device.type == "cpu" and not dropout:  # the prefix read once (cascade_grad.py)
        prefix_kv = key[:, :, :prefix], value[:, :, :prefix]
        out = cascade_with_grad(padded(query), keys, values, packed.own_mask(query.dtype), scale, *prefix_kv)
        return out.reshape(rows * width, *out.shape[2:])[packed.scatter][None], None
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
