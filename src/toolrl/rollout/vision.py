"""The in-process engine for vision-language policies (`rollout.engine: hf-vision`, chosen for them by
default): the turns that are waiting at once are generated together, one `model.generate` over their ids
(padded on the left) with all their images' inputs. The draws are toolrl's own sampler (rollout/sampling.py,
per-position seeds), applied as a logits processor over greedy decoding, so a seeded sequence samples the
same tokens alone or in a batch, and each sampled token's log-prob is the one the trainer recomputes.

It keeps no cache across turns (a turn re-reads its context): the text engine's continuous batching and
shared-prefix attention assume 1-D positions, while Qwen2-VL's M-RoPE gives image tokens 3-D ones. For real
models at speed, serve them with vLLM."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from toolrl.models.vision import VisionImage, generation_inputs, model_inputs
from toolrl.rollout.engine import Engine, Sampled, register_engine
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


class _Draw:
    """A logits processor that samples every row with toolrl's sampler (row r's token goes at its own context
    length) and leaves generate nothing else to pick; it keeps each step's log-probs."""

    def __init__(self, params: list[SamplingParams], pads: list[int], generator: torch.Generator) -> None:
        self.params, self.pads, self.generator = params, pads, generator
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        positions = [input_ids.shape[1] - pad for pad in self.pads]
        tokens, logprobs = sample_tokens(scores, self.params, self.generator, positions=positions)
        self.logprobs.append(logprobs.detach().cpu())
        chosen = torch.full_like(scores, float("-inf"))
        chosen[torch.arange(len(tokens)), tokens] = 0.0
        return chosen


class VisionEngine(Engine):
    def __init__(self, model, stop_ids: Sequence[int], pad_id: int | None, device: torch.device, seed: int = 0):
        self.model, self.stop_ids, self.device = model, list(stop_ids), device
        self.pad_id = pad_id if pad_id is not None else self.stop_ids[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="hf-vision")
        self._waiting: dict[int, list[_Request]] = {}
        """Per event loop (a rollout runs on a loop of its own): the turns waiting for the next batch."""
        self._drivers: dict[int, asyncio.Task] = {}

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
        from transformers import LogitsProcessorList

        width = max(len(r.tokens) for r in batch)
        pads = [width - len(r.tokens) for r in batch]
        rows = [[self.pad_id] * p + r.tokens for p, r in zip(pads, batch, strict=True)]
        ids = torch.tensor(rows, device=self.device)
        mask = torch.tensor([[0] * p + [1] * len(r.tokens) for p, r in zip(pads, batch, strict=True)])
        draw = _Draw([r.params for r in batch], pads, self.generator)
        with torch.no_grad():
            self.model.eval()
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask.to(self.device),
                **model_inputs([im for r in batch for im in r.images], self.device),
                **generation_inputs(self.model, ids),
                max_new_tokens=max(r.params.max_new_tokens for r in batch),
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                logits_processor=LogitsProcessorList([draw]),
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
            )
        logprobs = torch.stack(draw.logprobs, dim=1) if draw.logprobs else torch.zeros(len(batch), 0)
        results = []
        for row, request in enumerate(batch):
            new = out[row, width:].tolist()[: request.params.max_new_tokens]
            end = next((i + 1 for i, t in enumerate(new) if t in self.stop_ids), len(new))
            new = new[:end]
            ended = bool(new) and new[-1] in self.stop_ids
            results.append(Sampled(new, logprobs[row, : len(new)].tolist(), ended))
        return results

    def close(self) -> None:
        self._worker.shutdown(wait=False)


@register_engine("hf-vision", can_train=True)
def vision_engine(model, chat, device, seed: int = 0, **_: object) -> VisionEngine:
    """A vision-language policy's in-process engine, on the run's own model."""
    return VisionEngine(model, chat.stop_ids, chat.tokenizer.pad_token_id, device, seed=seed)
