"""The in-process engine for vision-language policies (`rollout.engine: hf-vision`, chosen for them by
default): each turn is one `model.generate` over the sequence's ids with its images' patches, one sequence at
a time. The draws are toolrl's own sampler (rollout/sampling.py, per-position seeds), applied as a logits
processor over greedy decoding, so a seeded sequence samples the same tokens as it would in the text engine
and each sampled token's log-prob is the one the trainer recomputes.

It keeps no cache across turns (a turn re-reads its context) and batches nothing: the text engine's
continuous batching and shared-prefix attention assume 1-D positions, while Qwen2-VL's M-RoPE gives image
tokens 3-D ones. For real models at speed, serve them with vLLM (`rollout.engine: vllm`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Hashable, Sequence

import torch

from toolrl.models.vision import VisionImage, model_inputs
from toolrl.rollout.engine import Engine, Sampled, register_engine
from toolrl.rollout.sampling import SamplingParams, sample_tokens


class _Draw:
    """A logits processor that samples with toolrl's sampler and leaves generate nothing else to pick."""

    def __init__(self, params: SamplingParams, generator: torch.Generator) -> None:
        self.params, self.generator = params, generator
        self.logprobs: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens, logprobs = sample_tokens(scores, [self.params], self.generator, positions=[input_ids.shape[1]])
        self.logprobs.append(float(logprobs[0]))
        chosen = torch.full_like(scores, float("-inf"))
        chosen[0, tokens[0]] = 0.0
        return chosen


class VisionEngine(Engine):
    def __init__(self, model, stop_ids: Sequence[int], pad_id: int | None, device: torch.device, seed: int = 0):
        self.model, self.stop_ids, self.device = model, list(stop_ids), device
        self.pad_id = pad_id if pad_id is not None else self.stop_ids[0]
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._lock = threading.Lock()

    async def generate(
        self, seq: Hashable, tokens: list[int], params: SamplingParams, images: Sequence[VisionImage] = ()
    ) -> Sampled:
        return await asyncio.to_thread(self._generate, tokens, params, list(images))

    def _generate(self, tokens: list[int], params: SamplingParams, images: list[VisionImage]) -> Sampled:
        from transformers import LogitsProcessorList

        draw = _Draw(params, self.generator)
        ids = torch.tensor([tokens], device=self.device)
        with self._lock, torch.no_grad():
            self.model.eval()
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                **model_inputs(images, self.device),
                max_new_tokens=params.max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                logits_processor=LogitsProcessorList([draw]),
                eos_token_id=self.stop_ids,
                pad_token_id=self.pad_id,
            )
        new = out[0, len(tokens) :].tolist()
        ended = bool(new) and new[-1] in self.stop_ids
        return Sampled(new, draw.logprobs[: len(new)], ended)


@register_engine("hf-vision", can_train=True)
def vision_engine(model, chat, device, seed: int = 0, **_: object) -> VisionEngine:
    """A vision-language policy's in-process engine, on the run's own model."""
    return VisionEngine(model, chat.stop_ids, chat.tokenizer.pad_token_id, device, seed=seed)
