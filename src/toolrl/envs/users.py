"""The user in a multi-turn task: scripted (the task's next request, as published multi-turn function-calling
benchmarks have them) or simulated by a model with an instruction per task (as tau-bench does), through the
model-tool machinery: an OpenAI-compatible endpoint or a local Hugging Face model.

A simulated user that fails (its endpoint down, an empty reply) raises; the rollout ends that trajectory with
the stop reason `user_failed`, counted in the step metrics, and the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from pydantic import Field, model_validator

from toolrl.envs.base import EnvOptions

SIMULATOR_PROMPT = """You are a user talking to an assistant. {persona}
Your goals, in order:
{goals}
Goals done so far: {done}.
The assistant just said: "{reply}"
Write your next message to the assistant: ask for goal {next} in your own words, in one or two sentences.
Do not do it yourself and do not mention the other goals."""


class UserModel(EnvOptions):
    """The model behind a simulated user: an OpenAI-compatible endpoint, or a local model."""

    base_url: str | None = None
    """An OpenAI-compatible API root, such as http://127.0.0.1:8000/v1 (needs `model`)."""
    model: str | None = None
    api_key_env: str | None = None
    """Name of the environment variable holding the API key."""
    path: str | None = None
    """Instead of base_url: a local Hugging Face model (embedded name, folder, or cached hub id)."""
    max_tokens: int = Field(64, ge=1)
    temperature: float = Field(0.0, ge=0)

    @model_validator(mode="after")
    def one_backend(self) -> UserModel:
        if bool(self.base_url) == bool(self.path):
            raise ValueError("needs exactly one of base_url (OpenAI-compatible endpoint) or path (local model)")
        if self.base_url and not self.model:
            raise ValueError("with base_url, model (the served model's name) is required")
        return self


def user_model(options: UserModel) -> Callable[[str], str]:
    """A function asking the user's model one prompt (blocking: call it in a thread)."""
    from toolrl.tools.model import LocalChat, OpenAIChat

    if options.base_url:
        from toolrl.tools.http import bearer_header, http_client

        headers = bearer_header(options.api_key_env, "env.options.user_model.api_key_env")
        client = http_client(headers, 10.0, read_timeout_s=120)
        return OpenAIChat(client, options.base_url, options.model, None, options.max_tokens, options.temperature)
    return LocalChat(options.path, None, options.max_tokens, options.temperature)


class ScriptedUser:
    """Says the task's requests in order."""

    async def next_message(self, requests: Sequence[str], done: int, reply: str, persona: str = "") -> str:
        return requests[done]


class SimulatedUser:
    """A model playing the user: it knows the task's goals (its requests) and how far the assistant got, and
    asks for the next one in its own words."""

    def __init__(self, ask: Callable[[str], str]):
        self.ask = ask

    async def next_message(self, requests: Sequence[str], done: int, reply: str, persona: str = "") -> str:
        prompt = SIMULATOR_PROMPT.format(
            persona=persona,
            goals="\n".join(f"{i + 1}. {r}" for i, r in enumerate(requests)),
            done=", ".join(str(i + 1) for i in range(done)) or "none",
            reply=" ".join(reply.split())[:500],
            next=done + 1,
        )
        message = (await asyncio.to_thread(self.ask, prompt)).strip()
        if not message:
            raise RuntimeError("the simulated user gave an empty reply")
        return message
