"""Model tools: another language model behind a tool that takes a prompt and answers with the model's reply.

Two backends: any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp server, a hosted API), or a local
Hugging Face model loaded on first use. Both are synchronous and run in the executor's worker threads.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolrl.http import bearer_header, http_client
from toolrl.tools.function import Tool
from toolrl.tools.http import tool_request
from toolrl.tools.limits import InvalidArguments

PROMPT_SCHEMA = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "What to ask the model."}},
    "required": ["prompt"],
}


class ModelBackend(BaseModel):
    """A chat model to ask: an OpenAI-compatible endpoint (base_url + model) or a local Hugging Face model
    (path). Used by model tools and by simulated users."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    base_url: str | None = None
    """An OpenAI-compatible API root, such as http://127.0.0.1:8000/v1 (needs `model`)."""
    model: str | None = None
    path: str | None = None
    """Instead of base_url: a local Hugging Face model (embedded name, folder, or cached hub id)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key; the key itself never goes in a file."""
    system: str | None = None
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def one_backend(self) -> ModelBackend:
        if bool(self.base_url) == bool(self.path):
            raise ValueError("needs exactly one of base_url (OpenAI-compatible endpoint) or path (local model)")
        if self.base_url and not self.model:
            raise ValueError("with base_url, model (the served model's name) is required")
        return self


def chat_backend(
    spec: ModelBackend, where: str, headers: Mapping[str, str] | None = None, connect_timeout_s: float = 10.0
) -> tuple[Callable[[str], str], httpx.Client | None]:
    """(a blocking prompt -> reply function, the HTTP client to close, if any) for `spec`; `where` names the
    config section in errors (a missing API key variable)."""
    if spec.base_url:
        auth = bearer_header(spec.api_key_env, f"{where}.api_key_env")
        client = http_client({**(headers or {}), **auth}, connect_timeout_s, read_timeout_s=600)
        ask = OpenAIChat(client, spec.base_url, spec.model, spec.system, spec.max_tokens, spec.temperature)
        return ask, client
    return LocalChat(spec.path, spec.system, spec.max_tokens, spec.temperature), None


def chat_messages(system: str | None, prompt: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def _check_prompt(arguments) -> None:
    prompt = arguments.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidArguments("invalid argument: prompt: a non-empty string is required")
    if extra := sorted(set(arguments) - {"prompt"}):
        raise InvalidArguments(f"invalid argument: {extra[0]}: not a parameter of this tool")


def model_tool(name: str, description: str, ask: Callable[[str], str]) -> Tool:
    """Asking a model has no side effects (safe to repeat); it runs in a thread beside the client or model it
    holds, bounded by the client's timeout or the generation length."""

    def call(prompt: str) -> str:
        return ask(prompt)

    return Tool(name, description, PROMPT_SCHEMA, call, check=_check_prompt, idempotent=True, isolation="thread")


@dataclass(frozen=True)
class Completion:
    """A chat model's reply and what it cost in tokens."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


class OpenAIChat:
    """Ask an OpenAI-compatible `/chat/completions` endpoint through `client` (with its auth headers)."""

    def __init__(
        self,
        client: httpx.Client,
        base_url: str,
        model: str,
        system: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
    ):
        self.client, self.url = client, base_url.rstrip("/") + "/chat/completions"
        self.body = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
        self.system = system

    def __call__(self, prompt: str, seed: int | None = None) -> str:
        """The reply to `prompt`; `seed` (sampling only) is sent as the request's `seed`, which servers that
        honour it (vLLM, SGLang, OpenAI's best effort) use for this request alone."""
        return self.complete(chat_messages(self.system, prompt), seed).text

    def complete(self, messages: list[dict[str, str]], seed: int | None = None) -> Completion:
        """The reply to a whole conversation (`messages`, the system message included), with its token counts
        as the server reports them (`usage`; 0 when it reports none)."""
        body = {**self.body, "messages": messages}
        if seed is not None and self.body["temperature"] > 0:
            body["seed"] = seed & 0x7FFFFFFF
        reply = tool_request(self.client, "POST", self.url, body)
        try:
            text = reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{self.url} did not answer in the chat-completions shape: {str(reply)[:200]}") from None
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        return Completion(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))


class LocalChat:
    """Ask a local Hugging Face model (an embedded name, a folder or a cached hub id), loaded on first use.

    One generation at a time: calls queue on a lock, since concurrent generate calls on one small model would
    only share the same cores."""

    def __init__(
        self,
        path: str,
        system: str | None = None,
        max_tokens: int = 256,
        temperature: float = 0.0,
        device: str = "auto",
    ):
        self.path, self.system, self.device = path, system, device
        self.temperature = temperature
        self.generation = {"max_new_tokens": max_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            self.generation["temperature"] = temperature
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None

    def _load(self) -> None:
        from toolrl.models.loading import load_model, load_tokenizer, pick_device

        self._tokenizer = load_tokenizer(self.path)
        self._model = load_model(self.path, pick_device(self.device)).eval()

    def __call__(self, prompt: str, seed: int | None = None) -> str:
        return self.batch([prompt], None if seed is None else [seed])[0]

    def batch(self, prompts: list[str], seeds: list[int | None] | None = None) -> list[str]:
        """Answer several prompts with one batched `generate` (complete_batch)."""
        return [c.text for c in self.complete_batch([chat_messages(self.system, p) for p in prompts], seeds)]

    def complete(self, messages: list[dict[str, str]], seed: int | None = None) -> Completion:
        return self.complete_batch([messages], None if seed is None else [seed])[0]

    def complete_batch(
        self, conversations: list[list[dict[str, str]]], seeds: list[int | None] | None = None
    ) -> list[Completion]:
        """Answer several conversations with one batched `generate` (left padding), with their token counts.
        With `seeds` (one per conversation, when sampling), each reply draws from its own seed's stream
        (rollout/sampling.py), the same whichever conversations it is batched with."""
        import torch

        with self._lock:
            if self._model is None:
                self._load()
            tokenizer, model = self._tokenizer, self._model
            rows = [
                tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                for messages in conversations
            ]
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            encoded = [tokenizer(row, add_special_tokens=False)["input_ids"] for row in rows]
            width = max(len(ids) for ids in encoded)
            ids = torch.tensor([[pad_id] * (width - len(e)) + e for e in encoded], device=model.device)
            mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=model.device)
            generation = dict(self.generation)
            if self.temperature > 0 and seeds is not None and all(seed is not None for seed in seeds):
                generation.update(do_sample=False, logits_processor=[SeededDraw(seeds, self.temperature, width)])
                generation.pop("temperature")
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, pad_token_id=pad_id, **generation)
            stops = {pad_id, tokenizer.eos_token_id}
            return [
                Completion(
                    tokenizer.decode(row[width:], skip_special_tokens=True).strip(),
                    len(e),
                    sum(1 for token in row[width:].tolist() if token not in stops) + 1,
                )
                for row, e in zip(out, encoded, strict=True)
            ]


class SeededDraw:
    """A logits processor for `generate` that samples each row from its own seed (rollout/sampling.py's seeded
    draw at the row's n-th new token) and leaves only that token, so that greedy decoding takes it."""

    def __init__(self, seeds: list[int], temperature: float, prompt_width: int):
        from toolrl.rollout.sampling import SamplingParams

        self.params = [SamplingParams(temperature=temperature, seed=seed) for seed in seeds]
        self.width = prompt_width

    def __call__(self, input_ids, scores):
        import torch

        from toolrl.rollout.sampling import sample_tokens

        drawn = input_ids.shape[1] - self.width
        tokens, _ = sample_tokens(scores, self.params, positions=[drawn] * len(self.params))
        only = torch.full_like(scores, float("-inf"))
        return only.scatter_(1, tokens[:, None], 0.0)


class Batcher:
    """Gathers the conversations that arrive together (within `window_s`) into one call of a
    `complete_batch(conversations, seeds)` function, run in a thread: a local model answers what a rollout's
    simulated users (or a game's model opponents) ask at the same moment in one generate, not one by one. One
    flush task runs while anything is pending: conversations that arrive while a batch is being answered go in
    the next batch (they had waited for a later ask to flush them, and when none came, forever)."""

    def __init__(self, batch: Callable[..., list[Completion]], window_s: float = 0.01):
        self.batch, self.window_s = batch, window_s
        self.pending: list[tuple[list[dict[str, str]], int | None, asyncio.Future]] = []
        self.flush: asyncio.Task | None = None

    async def ask(self, messages: list[dict[str, str]], seed: int | None = None) -> Completion:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((messages, seed, future))
        if self.flush is None or self.flush.done():
            self.flush = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        while self.pending:
            await asyncio.sleep(self.window_s)
            batch, self.pending = self.pending, []
            await self._answer(batch)

    async def _answer(self, batch: list[tuple[list[dict[str, str]], int | None, asyncio.Future]]) -> None:
        conversations, seeds = [m for m, _, _ in batch], [s for _, s, _ in batch]
        try:
            given = any(seed is not None for seed in seeds)
            replies = await asyncio.to_thread(self.batch, conversations, seeds if given else None)
        except Exception as exc:  # every ask of the batch failed (a user's trajectory ends as user_failed)
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (_, _, future), reply in zip(batch, replies, strict=True):
                if not future.done():  # its conversation was cancelled meanwhile
                    future.set_result(reply)
