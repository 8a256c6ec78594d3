"""The in-process engine for vision-language policies (`rollout.engine: hf-vision`, chosen for them by
default): the turns that are waiting at once are generated together. The batch's shared prefix (system prompt,
tool schemas, and a group's task image when every row has the same one) runs once and its keys and values are
copied to every row; each row's own tokens follow, padded in the middle so that all rows end at the same
column; then one token per row per step. Positions are each row's own as the model gives them (Qwen2-VL's
M-RoPE: an image's tokens take its grid's 3-D positions, text after it counts on from the largest). The draws
are toolrl's own sampler (rollout/sampling.py, per-position seeds), so a seeded sequence samples the same
tokens alone or in a batch, and each sampled token's log-prob is the one the trainer recomputes.

It keeps no cache across turns (a turn re-reads its context beyond the shared prefix): the text engine's
slots assume 1-D positions. For real models at speed, serve them with vLLM."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from toolrl.models.cache_arg import cache_arg
from toolrl.models.vision import (
    VisionImage,
    image_safe_prefix,
    model_inputs,
    multimodal_base,
    sequence_positions,
)
from toolrl.rollout.caller_thread import CallerThread
from toolrl.rollout.engine import Engine, Sampled, common_prefix_length, register_engine
from toolrl.rollout.sampling import SamplingParams, sample_tokens

SETTLE_S = 0.01
"""Wait this long after the first waiting turn for others to join its batch."""
MAX_BATCH = 16


@dataclass
class _Request:
    tokens: list[int]
    params: SamplingParams
    images: list[VisionImage]
    future: asyncio.Future


@dataclass
class _Batch:
    """A batch's decoding state: the keys and values of every row, which columns each row attends to, the
    position its next token takes, and the next-token logits."""

    cache: DynamicCache
    attention: torch.Tensor
    following: torch.Tensor
    logits: torch.Tensor


class VisionEngine(Engine):
    def __init__(self, model, stop_ids: Sequence[int], pad_id: int | None, device: torch.device, seed: int = 0):
        self.model, self.stop_ids, self.device = model, list(stop_ids), device
        self.pad_id = pad_id if pad_id is not None else self.stop_ids[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._worker = CallerThread(ThreadPoolExecutor(1, thread_name_prefix="hf-vision"))
        """Within `run` (a rollout), batches run on its caller's thread (rollout/caller_thread.py)."""
        self._waiting: dict[int, list[_Request]] = {}
        """Per event loop (a rollout runs on a loop of its own): the turns waiting for the next batch."""
        self._drivers: dict[int, asyncio.Task] = {}

    def run(self, coro):
        return self._worker.run(coro)

    async def generate(
        self, seq: Hashable, tokens: list[int], params: SamplingParams, images: Sequence[VisionImage] = ()
    ) -> Sampled:
        loop = asyncio.get_running_loop()
        request = _Request(list(tokens), params, list(images), loop.create_future())
        self._waiting.setdefault(id(loop), []).append(request)
        driver = self._drivers.get(id(loop))
        if driver is None or driver.done():
            self._drivers[id(loop)] = loop.create_task(self._drive(id(loop)))
        return await request.future

    async def _drive(self, key: int) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting.get(key):
            await asyncio.sleep(SETTLE_S)
            waiting = self._waiting[key]
            batch, self._waiting[key] = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
            try:
                results = await loop.run_in_executor(self._worker, self._generate, batch)
            except Exception as exc:
                for request in batch:
                    request.future.set_exception(exc)
                continue
            for request, result in zip(batch, results, strict=True):
                request.future.set_result(result)
        self._waiting.pop(key, None)
        self._drivers.pop(key, None)

    def _generate(self, batch: list[_Request]) -> list[Sampled]:
        with torch.no_grad():
            self.model.eval()
            return self._decode(batch, self._prefill(batch))

    def _prefill(self, batch: list[_Request]) -> _Batch:
        """The batch's shared prefix once (its images encoded once), its keys and values copied to every row,
        then each row's rest; rows are padded in the middle (prefix, pads, the row's own tokens) so that all
        end at the same column. Positions are each row's own, as the model gives them (M-RoPE for Qwen2-VL)."""
        rows, device = len(batch), self.device
        lengths = [len(r.tokens) for r in batch]
        shared = common_prefix_length([r.tokens for r in batch]) if rows > 1 else lengths[0] - 1
        shared = image_safe_prefix([r.images for r in batch], shared)
        whole = torch.full((rows, max(lengths)), self.pad_id, dtype=torch.long)
        mask = torch.zeros(rows, max(lengths), dtype=torch.long)
        for i, request in enumerate(batch):
            whole[i, : lengths[i]] = torch.tensor(request.tokens)
            mask[i, : lengths[i]] = 1
        whole, mask = whole.to(device), mask.to(device)
        positions = sequence_positions(self.model, whole, mask, [im for r in batch for im in r.images])

        width = max(lengths) - shared  # the rows' own tokens, right-aligned after the shared prefix
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long, device=device)
        placed = torch.zeros(*positions.shape[:-1], width, dtype=positions.dtype, device=device)
        attention = torch.zeros(rows, shared + width, dtype=torch.long, device=device)
        attention[:, :shared] = 1
        for i, n in enumerate(lengths):
            ids[i, width - (n - shared) :] = whole[i, shared:n]
            placed[..., i, width - (n - shared) :] = positions[..., i, shared:n]
            attention[i, shared + width - (n - shared) :] = 1
        body, cache = multimodal_base(self.model), DynamicCache()
        if shared:
            prefix = [im for im in batch[0].images if im.start < shared]
            body(input_ids=whole[:1, :shared], position_ids=positions[..., :1, :shared], **cache_arg(body, cache),
                 use_cache=True, **model_inputs(prefix, device))  # fmt: skip
            cache.batch_repeat_interleave(rows)
        rest = [im for r in batch for im in r.images if im.start >= shared]
        hidden = body(input_ids=ids, attention_mask=attention, position_ids=placed, **cache_arg(body, cache),
                      use_cache=True, **model_inputs(rest, device)).last_hidden_state  # fmt: skip
        following = torch.stack([positions[..., i, :n].max() + 1 for i, n in enumerate(lengths)])
        return _Batch(cache, attention, following, self._logits(hidden[:, -1]))

    def _decode(self, batch: list[_Request], state: _Batch) -> list[Sampled]:
        """Sample a token for every row, feed them all, until every row has stopped."""
        rows, device = len(batch), self.device
        params = [r.params for r in batch]
        new: list[list[int]] = [[] for _ in batch]
        logprobs: list[list[float]] = [[] for _ in batch]
        done = [r.params.max_new_tokens <= 0 for r in batch]
        body, logits = multimodal_base(self.model), state.logits
        for step in range(max(r.params.max_new_tokens for r in batch)):
            contexts = [len(r.tokens) + step for r in batch]
            tokens, lps = sample_tokens(logits, params, self.generator, positions=contexts)
            for i, (token, lp) in enumerate(zip(tokens.tolist(), lps.tolist(), strict=True)):
                if not done[i]:
                    new[i].append(token)
                    logprobs[i].append(lp)
                    done[i] = token in self.stop_ids or len(new[i]) >= batch[i].params.max_new_tokens
            if all(done):
                break
            fed = torch.tensor([new[i][-1] if new[i] else self.pad_id for i in range(rows)], device=device)
            state.attention = torch.cat([state.attention, torch.ones(rows, 1, dtype=torch.long, device=device)], 1)
            at = (state.following + step)[:, None]  # a text token: the same in M-RoPE's three dimensions
            hidden = body(input_ids=fed[:, None], attention_mask=state.attention, position_ids=at,
                          **cache_arg(body, state.cache), use_cache=True).last_hidden_state  # fmt: skip
            logits = self._logits(hidden[:, -1])
        return [
            Sampled(ids, lps, ended=bool(ids) and ids[-1] in self.stop_ids)
            for ids, lps in zip(new, logprobs, strict=True)
        ]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(hidden).float()

    def close(self) -> None:
        self._worker.shutdown(wait=False)


@register_engine("hf-vision", supports_training=True, supports_images=True)
def vision_engine(model, chat, device, seed: int = 0, **_: object) -> VisionEngine:
    """A vision-language policy's in-process engine, on the run's own model."""
    return VisionEngine(model, chat.stop_ids, chat.tokenizer.pad_token_id, device, seed=seed)
