"""An engine on any OpenAI-compatible server (vLLM, SGLang, llama.cpp server), through `/v1/completions`.

The prompt goes as token ids, the rollout's source of truth, and the server is asked for the sampled tokens'
log-probs. vLLM returns each sampled token as `token_id:N` when asked (`return_tokens_as_token_ids`), which
keeps the trajectory token-exact. A server that returns text only is still usable, for evaluation or a
judge: its text is encoded with the tokenizer and `token_exact` turns False (logged once).

The server's weights are its own: training with this engine would sample from a policy that never changes,
so `toolrl train` refuses it (evaluation and judges use it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from toolrl.errors import EngineError
from toolrl.http import HTTPFailure, bearer_header, http_client, request_json
from toolrl.rollout.engine import Engine, Sampled, register_engine
from toolrl.rollout.sampling import SamplingParams, request_seed
from toolrl.text import first_line

log = logging.getLogger(__name__)


class OpenAIEngine(Engine):
    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer,
        stop_ids: Sequence[int],
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
    ):
        self.client = http_client(headers, connect_timeout_s=10.0, read_timeout_s=timeout_s)
        self.url = base_url.rstrip("/") + "/completions"
        self.model, self.tokenizer, self.stop_ids = model, tokenizer, list(stop_ids)
        self.token_exact = True
        # Sync client in worker threads: one connection pool for the run, whatever event loop asks.
        self.pool = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="toolrl-openai")

    def body(self, tokens: list[int], params: SamplingParams) -> dict[str, Any]:
        body = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "stop_token_ids": self.stop_ids,  # vLLM and SGLang extensions; other servers ignore unknown keys
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = request_seed(params, len(tokens))
        return body

    async def generate(self, seq: Hashable, tokens: list[int], params: SamplingParams) -> Sampled:
        loop = asyncio.get_running_loop()
        try:
            reply = await loop.run_in_executor(
                self.pool, request_json, self.client, "POST", self.url, self.body(tokens, params)
            )
            return self.parse(reply)
        except (HTTPFailure, RuntimeError) as exc:  # a down or wrong server ends the run with one line
            raise EngineError(f"rollout.openai.base_url: {first_line(exc)}; is the server up at {self.url}?") from None

    def parse(self, reply: Any) -> Sampled:
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{self.url} did not answer in the completions shape: {str(reply)[:200]}") from None
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        if tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            ids = [int(t.removeprefix("token_id:")) for t in tokens]
            lps = [float(lp if lp is not None else 0.0) for lp in logprobs.get("token_logprobs", [])]
        else:
            if self.token_exact:
                log.warning("%s returns no token ids: encoding its text, so trajectories are not token-exact", self.url)
                self.token_exact = False
            ids = self.tokenizer.encode(choice.get("text", ""), add_special_tokens=False)
            lps = [0.0] * len(ids)
        # Ended only when the stop token itself is among the ids: otherwise the rollout feeds the end of the turn
        # as (untrained) observation tokens, so the sequence stays exactly what the model saw.
        ended = bool(ids) and ids[-1] in self.stop_ids
        return Sampled(ids, lps[: len(ids)] + [0.0] * (len(ids) - len(lps)), ended)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.client.close()


@register_engine("openai")
def openai_engine(chat, config, **_: object) -> OpenAIEngine:
    o = config.rollout.openai
    headers = bearer_header(o.api_key_env, "rollout.openai.api_key_env")
    model = o.model or config.model.name
    return OpenAIEngine(o.base_url, model, chat.tokenizer, chat.stop_ids, headers, o.timeout_s, o.max_concurrency)
