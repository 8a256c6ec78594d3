"""The user in a multi-turn task: scripted (the task's next request, as published multi-turn function-calling
benchmarks have them) or simulated by a model with an instruction per task (as tau-bench does), through the
model-tool machinery: an OpenAI-compatible endpoint or a local Hugging Face model.

A simulated user that fails (its endpoint down, an empty reply) raises; the rollout ends that trajectory with
the stop reason `user_failed`, counted in the step metrics, and the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from pydantic import Field

from toolrl.tools.model import ModelBackend, chat_backend

SIMULATOR_PROMPT = """You are a user talking to an assistant. {persona}
Your goals, in order:
{goals}
Goals done so far: {done}.
The assistant just said: "{reply}"
Write your next message to the assistant: ask for goal {next} in your own words, in one or two sentences.
Do not do it yourself and do not mention the other goals."""


class UserModel(ModelBackend):
    """The model behind a simulated user: an OpenAI-compatible endpoint (base_url + model), or a local model
    (path); replies are short."""

    max_tokens: int = Field(64, ge=1)


def user_model(options: UserModel) -> Callable[[str], str]:
    """A function asking the user's model one prompt (blocking: call it in a thread)."""
    return chat_backend(options, "env.options.user_model")[0]


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
