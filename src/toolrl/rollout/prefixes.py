"""The hf engine's shared prompt prefixes: computed once, read once per step, held once.

Fresh sequences that start alike get their common prefix from one forward pass, and a sequence that starts like
one already cached copies that slot's keys and values. While every sequence fed to a step starts with the
prefix computed once, attention reads its keys and values once for the whole batch (`cascade.py`), and each slot
holds only what follows it: a slot's column c holds position len(prefix) + c. The prefix is written into a slot
(`_materialize`) only when the slot must be read without it: beside a sequence that does not share it, or when
a newer prefix takes its place.

`PrefixSharing` is the part of `HFEngine` (hf.py) that keeps this bookkeeping and prefills a step's new tokens
(a long prompt in passes of `prefill_tokens`); the engine owns the slots, the cache and the model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch

from toolrl.models.cache_arg import cache_arg
from toolrl.models.linear import weights_key
from toolrl.rollout.cascade import SharedPrefix
from toolrl.rollout.engine import common_prefix_length
from toolrl.rollout.slots import SlotCache

MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are simply prefilled per sequence."""
PAD_POSITION = -1
"""The position given to a padding token of a forward pass."""


@dataclass
class Slot:
    index: int
    ids: list[int] = field(default_factory=list)
    """Token ids whose keys and values the slot holds (or, the shared prefix, reads from elsewhere)."""
    logits: torch.Tensor | None = None
    """Next-token logits after `ids`."""
    shared: bool = False
    """Whether `ids` start with the engine's shared prefix, which the slot then does not hold: its column c
    holds position len(shared) + c."""


class PrefixSharing:
    """Shared-prefix bookkeeping over the engine's slots, cache and model (HFEngine sets these)."""

    slots: dict[Hashable, Slot]
    shared: SharedPrefix | None
    """The prefix that attention reads once per step, or None."""
    _shared_weights: frozenset = frozenset()
    """`_weights_key()` when `shared` was computed."""
    cascade: bool
    """Whether the model's attention can read a shared prefix once (cascade.supports_cascade)."""
    model: torch.nn.Module
    device: torch.device
    stats: Counter[str]
    _ensure: Callable[[int], SlotCache]
    """The engine's cache, grown to at least this many columns per slot."""
    _forward: Callable[..., torch.Tensor]
    """One pass of the model over ids at positions of slots (HFEngine._forward): the logits of each row's last."""
    prefill_tokens: int
    pad_id: int
    prefix_pass: Callable[[list[int]], tuple[list[torch.Tensor], list[torch.Tensor]]] | None = None
    """Computes the shared prefix's keys and values (per layer, [1, kv_heads, n, dim]) from its ids in place of the
    engine's own forward pass, or returns None (the engine computes them): a trainer's (scoring/rollout_prefix.py),
    which keeps the pass's graph for its update. Called on the engine's worker thread with the current weights."""

    def _offset(self, slot: Slot) -> int:
        """Positions of the slot's ids that it does not hold (the shared prefix it reads from elsewhere)."""
        return len(self.shared) if slot.shared else 0

    def _columns(self, slot: Slot) -> int:
        """Columns of the slot in use."""
        return len(slot.ids) - self._offset(slot)

    def _diverged(self, slot: Slot, tokens: list[int]) -> int:
        """A slot whose ids the caller's context no longer starts with (a compacted trajectory) keeps their common
        part (what follows is written over), or starts over where they part inside the shared prefix. Returns the
        ids it keeps."""
        n = common_prefix_length([tokens, slot.ids]) if tokens and slot.ids else 0
        if n < max(self._offset(slot), 1):
            slot.shared, n = False, 0
        slot.ids, slot.logits = slot.ids[:n], None
        return n

    def _share_prefixes(self, pending: dict[Hashable, list[int]]) -> None:
        """Give fresh slots their common prompt prefix without recomputing it per sequence."""
        fresh = [seq for seq in pending if not self.slots[seq].ids]
        if not fresh:
            return
        cached = [s for s in self.slots.values() if s.ids]
        shared = self._current_shared()
        remaining = []
        for seq in fresh:  # the shared prefix, or a prefix already in another slot: copy it
            tokens = pending[seq]
            n, best = max(
                ((common_prefix_length([s.ids, tokens]), s) for s in cached), default=(0, None), key=lambda x: x[0]
            )
            if shared is not None and n <= len(shared) < len(tokens) and tokens[: len(shared)] == shared.ids:
                slot = self.slots[seq]  # reads the prefix computed before, holds nothing of it: no copy
                slot.ids, slot.logits, slot.shared = list(shared.ids), None, True
                self.stats["reused_prefix_tokens"] += len(shared)
                pending[seq] = tokens[len(shared) :]
            elif n >= MIN_SHARED_PREFIX:
                self._copy_slot_prefix(best, self.slots[seq], n)
                self.stats["reused_prefix_tokens"] += n
                pending[seq] = tokens[n:]
            else:
                remaining.append(seq)
        groups: dict[tuple[int, ...], list[Hashable]] = {}
        for seq in remaining:  # sequences that start alike, each group's prefix computed once
            groups.setdefault(tuple(pending[seq][:MIN_SHARED_PREFIX]), []).append(seq)
        largest = True
        for group in sorted(groups.values(), key=len, reverse=True):
            n = common_prefix_length([pending[s] for s in group]) if len(group) > 1 else 0
            if n >= MIN_SHARED_PREFIX:
                self._compute_prefix_once(group, pending, n, read_once=largest and self.cascade)
                largest = False

    def _compute_prefix_once(
        self, group: list[Hashable], pending: dict[Hashable, list[int]], n: int, read_once: bool
    ) -> None:
        """One forward pass over the group's common prefix. With `read_once` it becomes the shared prefix that
        attention reads once per step and the group's slots hold none of it (the newest replaces the one before,
        whose readers get it written into their slots first); otherwise it is copied into each slot."""
        from transformers import DynamicCache

        prefix = pending[group[0]][:n]
        given = self._given_prefix(list(prefix)) if read_once and self.prefix_pass is not None else None
        if given is not None:
            keys, values = given
        else:
            once = DynamicCache()
            prompt = torch.tensor([prefix], device=self.device)
            self.model(input_ids=prompt, **cache_arg(self.model, once), logits_to_keep=1)
            keys, values = [layer.keys for layer in once.layers], [layer.values for layer in once.layers]
        self.stats["prefill_tokens"] += n
        self.stats["reused_prefix_tokens"] += n * (len(group) - 1)
        if read_once:
            for slot in self.slots.values():
                if slot.shared:
                    self._materialize(slot)
            self.shared = SharedPrefix(list(prefix), list(keys), list(values))
            self._shared_weights = self._weights_key()
        else:
            cache = self._ensure(max(len(pending[s]) for s in group) + 1)
            slots = torch.tensor([self.slots[s].index for s in group], device=self.device)
            for layer, pair in zip(cache.layers, zip(keys, values, strict=True), strict=True):
                layer.copy_prefix(pair, slots)
        for seq in group:
            self.slots[seq].ids = list(prefix)
            self.slots[seq].shared = read_once
            pending[seq] = pending[seq][n:]

    def _given_prefix(self, ids: list[int]) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """`prefix_pass(ids)`, checked: a pair [1, kv_heads, len(ids), head_dim] per layer, on the engine's device;
        None where it gave none."""
        given = self.prefix_pass(ids)
        if given is None:
            return None
        keys, values = given
        config = self.model.config
        layers, heads = config.num_hidden_layers, getattr(config, "num_key_value_heads", config.num_attention_heads)
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        want = (1, heads, len(ids), dim)
        pairs = list(zip(keys, values, strict=False))
        if (
            len(keys) != layers
            or len(values) != layers
            or any(tuple(t.shape) != want or t.device.type != self.device.type for pair in pairs for t in pair)
        ):
            got = sorted({(tuple(t.shape), t.device.type) for pair in pairs for t in pair})
            raise ValueError(
                f"hf engine: prefix_pass gave {len(keys)} keys and {len(values)} values {got} for a {len(ids)}-token "
                f"prefix; it must give {layers} of each, shaped {list(want)}, on {self.device.type}"
            )
        self.stats["prefix_passes_given"] += 1
        return list(keys), list(values)

    def _weights_key(self) -> frozenset:
        """Changes whenever a parameter does."""
        return weights_key(self.model)

    def _current_shared(self) -> SharedPrefix | None:
        """The shared prefix, if it was computed with the current weights. It outlives the sequences that read
        it, so a later group starting with it (the next tasks' prompts, an evaluation's next batch) reads it
        without computing it again; one computed with earlier weights is not given to new sequences, and is
        dropped once none reads it."""
        if self.shared is None:
            return None
        if self._weights_key() == self._shared_weights:
            return self.shared
        if not any(slot.shared for slot in self.slots.values()):
            self.shared = None
        return None

    def _copy_slot_prefix(self, source: Slot, target: Slot, n: int) -> None:
        """Give `target` the first n ids of `source`: it reads the shared prefix too when they cover it, and
        otherwise holds them all (from the shared prefix's keys and values where the source reads them)."""
        offset = self._offset(source)
        target.shared = source.shared and n >= offset
        skip = offset if target.shared else 0
        cache = self._ensure(n - skip + 1)
        rows = torch.tensor([target.index], device=self.device)
        for index, layer in enumerate(cache.layers):
            if not source.shared or target.shared:  # the source's columns, as they are
                if layer.is_initialized:
                    layer.keys[target.index, :, : n - skip] = layer.keys[source.index, :, : n - skip]
                    layer.values[target.index, :, : n - skip] = layer.values[source.index, :, : n - skip]
            else:  # n < offset: all n are in the shared prefix
                keys, values = self.shared.keys[index], self.shared.values[index]
                layer.copy_prefix((keys[:, :, :n], values[:, :, :n]), rows)
        target.ids, target.logits = source.ids[:n], None

    def _materialize(self, slot: Slot) -> None:
        """Write the shared prefix into the slot, its own columns moved past it: the slot then holds its whole
        context and reads it without the shared prefix."""
        n, held = len(self.shared), self._columns(slot)
        cache = self._ensure(len(slot.ids) + 1)
        for layer, keys, values in zip(cache.layers, self.shared.keys, self.shared.values, strict=True):
            if not layer.is_initialized:
                layer.lazy_initialization(keys, values)
            for buffer, prefix in ((layer.keys, keys), (layer.values, values)):
                buffer[slot.index, :, n : n + held] = buffer[slot.index, :, :held].clone()
                buffer[slot.index, :, :n] = prefix[0]
        slot.shared = False
        self.stats["prefix_writes"] += 1

    def _shared_by(self, seqs) -> SharedPrefix | None:
        """The shared prefix, when every one of `seqs` starts with it (their new tokens all come after it);
        otherwise None, and those of `seqs` that read it get it written into their slots."""
        if self.shared is not None and all(self.slots[s].shared for s in seqs):
            return self.shared
        for seq in seqs:
            if self.slots[seq].shared:
                self._materialize(self.slots[seq])
        return None

    # ---- prefill: the new tokens of the sequences of a step, prefixes shared ------------------------------

    def _prefill(self, pending: dict[Hashable, list[int]]) -> None:
        self._share_prefixes(pending)
        pending = {seq: ids for seq, ids in pending.items() if ids}
        alike = self._alike(pending)  # a group's samples of one task: its tokens computed once, then copied
        self.stats["reused_prefix_tokens"] += sum(len(pending[seq]) for seq in alike)
        pending = {seq: ids for seq, ids in pending.items() if seq not in alike}
        self._ensure(max(self._columns(self.slots[s]) + len(p) for s, p in pending.items()) + 1)
        # Rows of similar length together, at most prefill_tokens per pass; those that read the shared prefix
        # apart from those that do not (a pass mixing them would have to write the prefix into the slots).
        for seq in [s for s, ids in pending.items() if len(ids) > self.prefill_tokens]:
            while len(pending[seq]) > self.prefill_tokens:  # a long prompt in passes of prefill_tokens: one pass's
                head, pending[seq] = pending[seq][: self.prefill_tokens], pending[seq][self.prefill_tokens :]
                self._prefill_rows([seq], {seq: head})  # activations, not the whole prompt's, at once
        order = sorted(pending, key=lambda s: (self.slots[s].shared, len(pending[s])))
        start = 0
        while start < len(order):
            end = start + 1
            while (
                end < len(order)
                and (end + 1 - start) * len(pending[order[end]]) <= self.prefill_tokens
                and self.slots[order[end]].shared == self.slots[order[start]].shared
            ):
                end += 1
            self._prefill_rows(order[start:end], pending)
            start = end
        for seq, source in alike.items():
            self._copy_slot_prefix(self.slots[source], self.slots[seq], len(self.slots[source].ids))
            self.slots[seq].logits = self.slots[source].logits

    def _prefill_rows(self, group: list[Hashable], pending: dict[Hashable, list[int]]) -> None:
        """One prefill pass: each sequence of `group` fed its pending tokens (rows ordered by length)."""
        shared = self._shared_by(group)
        width = len(pending[group[-1]])
        ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)
        positions = torch.full((len(group), width), PAD_POSITION, dtype=torch.long)
        for row, seq in enumerate(group):
            slot, new = self.slots[seq], pending[seq]
            ids[row, width - len(new) :] = torch.tensor(new)  # left padding: the last column is real
            positions[row, width - len(new) :] = torch.arange(len(slot.ids), len(slot.ids) + len(new))
        slots = torch.tensor([self.slots[s].index for s in group])
        logits = self._forward(ids, positions, slots, shared)
        self.stats["prefill_tokens"] += sum(len(pending[s]) for s in group)
        for row, seq in enumerate(group):
            slot = self.slots[seq]
            slot.ids += pending[seq]
            slot.logits = logits[row]

    def _alike(self, pending: dict[Hashable, list[int]]) -> dict[Hashable, Hashable]:
        """The sequences whose context and new tokens are those of an earlier one in `pending`: each to that one."""
        first: dict[tuple, Hashable] = {}
        alike = {}
        for seq, ids in pending.items():
            slot = self.slots[seq]
            source = first.setdefault((slot.shared, tuple(slot.ids), tuple(ids)), seq)
            if source != seq:
                alike[seq] = source
        return alike
