"""Model tools: another language model behind a tool that takes a prompt and answers with the model's reply.

Two backends: any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp server, a hosted API), or a local
Hugging Face model loaded on first use. Both are synchronous and run in the executor's worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx

from toolrl.tools.function import Tool
from toolrl.tools.http import request_json

PROMPT_SCHEMA = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "What to ask the model."}},
    "required": ["prompt"],
}


def chat_messages(system: str | None, prompt: str) -> list[dict[str, str]]:
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]


def model_tool(name: str, description: str, ask: Callable[[str], str]) -> Tool:
    def call(prompt: str) -> str:
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("invalid argument prompt: a non-empty string is required")
        return ask(prompt)

    return Tool(name, description, PROMPT_SCHEMA, call)


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

    def __call__(self, prompt: str) -> str:
        body = {**self.body, "messages": chat_messages(self.system, prompt)}
        reply = request_json(self.client, "POST", self.url, body)
        try:
            return reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            raise RuntimeError(f"{self.url} did not answer in the chat-completions shape: {str(reply)[:200]}") from None


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

    def __call__(self, prompt: str) -> str:
        import torch

        with self._lock:
            if self._model is None:
                self._load()
            tokenizer, model = self._tokenizer, self._model
            ids = tokenizer.apply_chat_template(
                chat_messages(self.system, prompt), add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"].to(model.device)
            with torch.inference_mode():
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
                    **self.generation,
                )
            return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip()
