"""Batched sampling from a Hugging Face causal LM with one KV cache kept across turns.

The prompt prefix that all rows share (system prompt, tool schemas, example) is computed once and its cache
repeated for every row. Rows are padded inside the cache; padding is masked and each row keeps its own
positions, so appending observations or new turns never recomputes what is already cached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest prefix shared by all sequences, leaving at least one token in each."""
    shortest = min(len(s) for s in sequences)
    n = 0
    while n < shortest - 1 and all(s[n] == sequences[0][n] for s in sequences):
        n += 1
    return n


@dataclass
class Sampled:
    ids: list[int]
    logprobs: list[float]
    ended: bool
    """True when the row emitted a stop token (which is the last id)."""


class SamplingSession:
    """The cached state of a batch of rows; created by HFEngine.start."""

    def __init__(self, engine: HFEngine, prefix: list[int], prompts: Sequence[list[int]]):
        self.engine = engine
        self.model = engine.model
        self.device = engine.device
        rows = len(prompts)
        self.rows = list(range(rows))  # caller's row ids, in cache order
        with torch.no_grad():
            if prefix:
                out = self.model(input_ids=torch.tensor([prefix], device=self.device), use_cache=True, logits_to_keep=1)
                self.cache = out.past_key_values
                self.cache.batch_repeat_interleave(rows)
            else:
                from transformers import DynamicCache

                self.cache = DynamicCache()
        self.mask = torch.ones(rows, len(prefix), dtype=torch.long, device=self.device)
        self.next_pos = torch.full((rows,), len(prefix), dtype=torch.long, device=self.device)
        self.last_logits = torch.zeros(rows, 0, device=self.device)
        self.extend(dict(enumerate(p[len(prefix) :] for p in prompts)))

    def _index(self, row: int) -> int:
        return self.rows.index(row)

    def keep(self, rows: Sequence[int]) -> None:
        """Drop every row not in `rows` from the cache (finished trajectories)."""
        keep = [i for i, r in enumerate(self.rows) if r in set(rows)]
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos, self.last_logits = self.mask[index], self.next_pos[index], self.last_logits[index]
        self.rows = [self.rows[i] for i in keep]

    @torch.no_grad()
    def extend(self, tokens: dict[int, list[int]]) -> None:
        """Feed tokens to some rows (left-padded into one chunk); other rows get masked padding."""
        width = max((len(t) for t in tokens.values()), default=0)
        if width == 0:
            return
        n = len(self.rows)
        ids = torch.full((n, width), self.engine.pad_id, dtype=torch.long)
        chunk_mask = torch.zeros(n, width, dtype=torch.long)
        for row, toks in tokens.items():
            i = self._index(row)
            if toks:
                ids[i, width - len(toks) :] = torch.tensor(toks)
                chunk_mask[i, width - len(toks) :] = 1
        ids, chunk_mask = ids.to(self.device), chunk_mask.to(self.device)
        positions = self.next_pos[:, None] + (chunk_mask.cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, chunk_mask], dim=1)
        out = self.model(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.cache = out.past_key_values
        fed = chunk_mask.sum(1)
        self.next_pos = self.next_pos + fed
        logits = out.logits[:, -1].float()
        if self.last_logits.shape[-1] == 0:
            self.last_logits = logits
        else:
            self.last_logits = torch.where((fed > 0)[:, None], logits, self.last_logits)

    @torch.no_grad()
    def sample(self, rows: Sequence[int], max_new_tokens: Sequence[int], temperature: float) -> dict[int, Sampled]:
        """Sample up to max_new_tokens[i] tokens for each row, stopping a row at a stop token."""
        budget = dict(zip(rows, max_new_tokens, strict=True))
        out = {row: Sampled([], [], False) for row in rows}
        active = {row for row in rows if budget[row] > 0}
        stop = torch.tensor(self.engine.stop_ids, device=self.device)
        generator = self.engine.generator
        while active:
            index = torch.tensor([self._index(r) for r in sorted(active)], device=self.device)
            logits = self.last_logits[index]
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                token = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
            else:
                logp = torch.log_softmax(logits, dim=-1)
                token = logits.argmax(-1)
            token_logp = logp.gather(1, token[:, None]).squeeze(1)
            ended = torch.isin(token, stop)
            feed: dict[int, list[int]] = {}
            for j, row in enumerate(sorted(active)):
                sampled = out[row]
                sampled.ids.append(int(token[j]))
                sampled.logprobs.append(float(token_logp[j]))
                sampled.ended = bool(ended[j])
                feed[row] = [int(token[j])]
            self.extend(feed)
            active = {r for r in active if not out[r].ended and len(out[r].ids) < budget[r]}
        return out


class HFEngine:
    """Generation with a Hugging Face model on CPU or CUDA, returning token ids and sampling log-probs."""

    def __init__(self, model, stop_ids: Sequence[int], pad_id: int, device: torch.device, seed: int = 0):
        self.model = model
        self.stop_ids = list(stop_ids)
        self.pad_id = pad_id
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def start(self, prompts: Sequence[list[int]]) -> SamplingSession:
        self.model.eval()
        return SamplingSession(self, list(prompts[0][: common_prefix_length(prompts)]), prompts)
