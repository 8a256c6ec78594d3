"""A KV cache of fixed slots, one per sequence, each written at its own position.

Transformers' caches grow all rows of a batch together: feeding 30 observation tokens to one row pads every
other row by 30 columns and runs them through the model. Here each sequence owns a slot (a row of
preallocated key/value buffers) with its own length. A forward pass names the slots it feeds and the slot
columns its tokens go to: a decode step feeds one token to every slot in use (a slot with nothing to do writes
to a scratch column that nobody attends to), a prefill feeds only the slots that have new tokens. Attention
uses a 4-D mask built here, so each token sees exactly its own slot's columns up to itself. A slot's column is
its token's position, or, when the engine reads a shared prefix from elsewhere, the position past that prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


@dataclass
class Feed:
    """What one forward pass writes: `slots` (None = every slot in use, in order) and, per fed row, the
    slot position of each token (`positions`, [rows, width]); the scratch column marks padding."""

    slots: torch.Tensor | None
    positions: torch.Tensor
    kv_len: int
    """Columns the attention reads: one past the furthest position written in this pass."""
    _rows: torch.Tensor | None = None

    def rows(self, count: int) -> torch.Tensor:
        """[rows, width] the slot of each token fed: `slots`, or the first `count` slots in order."""
        if self._rows is None:
            slots = self.slots if self.slots is not None else torch.arange(count, device=self.positions.device)
            self._rows = slots[:, None].expand_as(self.positions)
        return self._rows


class SlotLayer(CacheLayerMixin):
    is_sliding = False
    is_compileable = False

    def __init__(self, owner: SlotCache):
        super().__init__()
        self.owner = owner
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        o = self.owner
        _, heads, _, dim = key_states.shape
        shape = (o.num_slots, heads, o.capacity + 1, dim)  # + 1: the scratch column
        self.keys = key_states.new_zeros(shape)
        self.values = value_states.new_zeros(shape)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        feed = self.owner.feed
        rows = feed.rows(key_states.shape[0])
        # [rows, heads, width, dim] -> [rows, width, heads, dim], the layout advanced indexing writes.
        self.keys[rows, :, feed.positions] = key_states.transpose(1, 2)
        self.values[rows, :, feed.positions] = value_states.transpose(1, 2)
        columns = slice(0, feed.kv_len)
        if feed.slots is None:  # every slot in use: views, no copy
            return self.keys[: rows.shape[0], :, columns], self.values[: rows.shape[0], :, columns]
        return self.keys[feed.slots, :, columns], self.values[feed.slots, :, columns]

    def get_seq_length(self) -> int:
        return 0  # positions and masks are always given explicitly

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.feed.kv_len, 0

    def get_max_length(self) -> int:
        return self.owner.capacity

    def resize(self, num_slots: int, capacity: int) -> None:
        if not self.is_initialized:
            return
        old_slots, heads, old_len, dim = self.keys.shape
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((num_slots, heads, capacity + 1, dim))
            kept = min(old_slots, num_slots)  # fewer: the slots past those in use are left behind
            new[:kept, :, : old_len - 1] = old[:kept, :, : old_len - 1]
            setattr(self, name, new)

    def copy_prefix(self, source: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor) -> None:
        """Write a [1, heads, n, dim] prefix into positions 0..n-1 of `slots`."""
        keys, values = source
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        n = keys.shape[2]
        self.keys[slots, :, :n] = keys
        self.values[slots, :, :n] = values


GROWTH_BLOCK = 64
"""A slot's capacity is a multiple of this many positions."""


class SlotCache(Cache):
    """`num_slots` sequences of at most `capacity` tokens each; grows (by copying) when either runs out."""

    def __init__(self, num_layers: int, num_slots: int, capacity: int):
        self.num_slots, self.capacity = num_slots, capacity
        self.feed: Feed | None = None
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])

    def ensure(self, num_slots: int, capacity: int) -> None:
        """Room for slots 0..num_slots-1 (those in use) of `capacity` positions each."""
        if num_slots <= self.num_slots and capacity <= self.capacity:
            return
        if num_slots > self.num_slots:  # grow by at least doubling, so that growth copies are rare
            self.num_slots = max(num_slots, 2 * self.num_slots)
        elif capacity > self.capacity:  # copied anyway: only the slots in use come along, so a long sequence costs
            self.num_slots = num_slots  # its length in the slots that hold sequences, not in every slot ever made
            # (a served 5k-token request beside 7 idle slots took 2.4 GB of keys and values, 8 x 6,400 positions)
        if capacity > self.capacity:  # by a quarter, in whole blocks: doubling left up to half of it unused (a
            # demo rollout's 24 slots x 1,024 positions were 1.1 GB for sequences of ~550 tokens); the engine
            # starts the next rollout at the size this one reached, so the copies are paid once
            grown = max(capacity, self.capacity + self.capacity // 4)
            self.capacity = -(-grown // GROWTH_BLOCK) * GROWTH_BLOCK
        for layer in self.layers:
            layer.resize(self.num_slots, self.capacity)

    def clear(self) -> None:
        """Free the buffers now."""
        for layer in self.layers:
            layer.keys = layer.values = None
            layer.is_initialized = False

    @property
    def scratch(self) -> int:
        return self.capacity

    def bytes_per_position(self) -> int:
        """Bytes of keys and values one slot's position holds over every layer (0 before the first write)."""
        return sum(2 * layer.keys[0, :, 0].numel() * layer.keys.element_size() for layer in self.layers
                   if layer.is_initialized)  # fmt: skip

    def nbytes(self) -> int:
        return self.num_slots * (self.capacity + 1) * self.bytes_per_position()


def attention_mask(positions: torch.Tensor, kv_len: int, scratch: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [rows, 1, width, kv_len] over slot columns 0..kv_len-1: a token at slot position p sees
    positions up to p of its slot. Padding tokens (at the scratch column) see position 0 only (their rows stay
    finite)."""
    columns = torch.arange(kv_len, device=positions.device)
    query = torch.where(positions == scratch, torch.zeros_like(positions), positions)
    allowed = columns[None, None, :] <= query[:, :, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values a token takes in a cache of `model` (every layer, at the weights' dtype)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * heads * dim * next(model.parameters()).element_size()
