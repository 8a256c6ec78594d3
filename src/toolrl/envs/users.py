"""The user in a multi-turn task: scripted (the task's next request, as published multi-turn function-calling
benchmarks have them) or simulated by a model with an instruction per task (as tau-bench does), through the
model-tool machinery: an OpenAI-compatible endpoint or a local Hugging Face model.

A simulated user that fails (its endpoint down, an empty reply) raises; the rollout ends that trajectory with
the stop reason `user_failed`, counted in the step metrics, and the others go on.
"""

from __future__ import annotations

import asyncio
import inspect
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

    async def next_message(
        self, requests: Sequence[str], done: int, reply: str, persona: str = "", seed: int | None = None
    ) -> str:
        return requests[done]


class _Batcher:
    """Gathers the prompts that arrive together (within `window_s`) into one call of a `batch(prompts)`
    function, run in a thread: a local model answers a group's users in one generate, not one by one."""

    def __init__(self, batch: Callable[..., list[str]], window_s: float = 0.01):
        self.batch, self.window_s = batch, window_s
        self.pending: list[tuple[str, int | None, asyncio.Future]] = []
        self.flush: asyncio.Task | None = None

    async def ask(self, prompt: str, seed: int | None = None) -> str:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((prompt, seed, future))
        if self.flush is None or self.flush.done():
            self.flush = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        await asyncio.sleep(self.window_s)
        batch, self.pending = self.pending, []
        prompts, seeds = [prompt for prompt, _, _ in batch], [seed for _, seed, _ in batch]
        try:
            if any(seed is not None for seed in seeds):
                replies = await asyncio.to_thread(self.batch, prompts, seeds)
            else:
                replies = await asyncio.to_thread(self.batch, prompts)
        except Exception as exc:  # every user of the batch failed: each trajectory ends as user_failed
            for _, _, future in batch:
                future.set_exception(exc)
        else:
            for (_, _, future), reply in zip(batch, replies, strict=True):
                future.set_result(reply)


class SimulatedUser:
    """A model playing the user: it knows the task's goals (its requests) and how far the assistant got, and
    asks for the next one in its own words. A backend with `batch(prompts)` (a local model) answers the users
    that ask at the same moment together. `seed` (the episode's stream for this message, seeds.py) reaches a
    backend that takes one (`ask(prompt, seed=)`, `batch(prompts, seeds)`): a sampling user model then says
    the same words in a resumed run, and whatever the batch."""

    def __init__(self, ask: Callable[..., str]):
        self.ask = ask
        self._batcher = _Batcher(ask.batch) if hasattr(ask, "batch") else None
        self._takes_seed = "seed" in inspect.signature(ask).parameters

    async def next_message(
        self, requests: Sequence[str], done: int, reply: str, persona: str = "", seed: int | None = None
    ) -> str:
        prompt = SIMULATOR_PROMPT.format(
            persona=persona,
            goals="\n".join(f"{i + 1}. {r}" for i, r in enumerate(requests)),
            done=", ".join(str(i + 1) for i in range(done)) or "none",
            reply=" ".join(reply.split())[:500],
            next=done + 1,
        )
        if self._batcher is not None:
            message = (await self._batcher.ask(prompt, seed if self._takes_seed else None)).strip()
        elif self._takes_seed:
            message = (await asyncio.to_thread(self.ask, prompt, seed=seed)).strip()
        else:
            message = (await asyncio.to_thread(self.ask, prompt)).strip()
        if not message:
            raise RuntimeError("the simulated user gave an empty reply")
        return message
