"""A model judge: a prompt template filled from the task and the trajectory, a model's reply parsed to a score.

The judge model is an OpenAI-compatible chat endpoint or a local Hugging Face model (batched `generate`).
Scoring is async over a batch: distinct prompts are asked concurrently (at most `max_concurrency` at once),
the same prompt is asked once and its score cached for the run. A judge that fails (server down, timeout) or
answers something without a score gives `fallback` instead, and the count is kept in `stats` and logged as
`judge/fallbacks` - a broken judge never ends a run.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from toolrl.errors import ConfigError
from toolrl.rewards.text import final_answer
from toolrl.text import first_line

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = """You grade an assistant's answer to a question.
Question: {question}
Reference answer: {answer}
Assistant's final reply: {response}

Is the reply correct and consistent with the reference? Answer with a line "Score: N" where N is an integer
from 0 (wrong) to {max_score} (fully correct)."""

FIELDS = ("question", "answer", "response", "transcript", "max_score")
_SCORE = re.compile(r"score\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_score(reply: str, max_score: float) -> float | None:
    """A reply's score in [0, 1]: the number after "Score:", else the reply's only number; None if neither,
    or if it lies outside 0..max_score."""
    found = _SCORE.findall(reply)
    if not found:
        numbers = _NUMBER.findall(reply)
        found = numbers if len(numbers) == 1 else []
    if not found:
        return None
    value = float(found[-1])
    return value / max_score if 0 <= value <= max_score else None


class ModelJudge:
    """A rubric criterion (`score_batch`) that asks a judge model about each trajectory."""

    def __init__(
        self,
        ask: Callable[[str], str] | None = None,
        ask_batch: Callable[[list[str]], list[str]] | None = None,
        template: str = DEFAULT_TEMPLATE,
        max_score: float = 10.0,
        fallback: float = 0.0,
        max_concurrency: int = 8,
        cache_size: int = 10_000,
    ):
        if ask is None and ask_batch is None:
            raise ValueError("a judge needs ask (one prompt) or ask_batch (a list of prompts)")
        self.ask, self.ask_batch = ask, ask_batch
        self.template, self.max_score, self.fallback = template, max_score, fallback
        self.max_concurrency = max_concurrency
        self.cache: OrderedDict[str, float | None] = OrderedDict()
        self.cache_size = cache_size
        self.stats: Counter[str] = Counter()

    def prompt(self, trajectory) -> str:
        task = trajectory.task
        response = final_answer(trajectory.final_text)
        fields: dict[str, Any] = {
            "question": task.question,
            "answer": task.answer,
            "response": response if response is not None else trajectory.final_text,
            "transcript": "\n\n".join(trajectory.texts),
            "max_score": f"{self.max_score:g}",
        }
        return self.template.format(**fields)

    async def _ask_all(self, prompts: list[str]) -> list[str | None]:
        """Replies, None where the judge failed."""
        if self.ask_batch is not None:
            try:
                return list(await asyncio.to_thread(self.ask_batch, prompts))
            except Exception as exc:
                log.warning("judge failed on a batch of %d: %s", len(prompts), first_line(exc))
                return [None] * len(prompts)
        gate = asyncio.Semaphore(self.max_concurrency)

        async def one(prompt: str) -> str | None:
            async with gate:
                try:
                    return await asyncio.to_thread(self.ask, prompt)
                except Exception as exc:
                    log.warning("judge failed: %s", first_line(exc))
                    return None

        return list(await asyncio.gather(*(one(p) for p in prompts)))

    async def score_batch(self, trajectories: Sequence[Any]) -> list[float]:
        prompts = [self.prompt(traj) for traj in trajectories]
        scores: dict[str, float | None] = {p: self.cache[p] for p in prompts if p in self.cache}
        self.stats["cache_hits"] += sum(p in scores for p in prompts)
        todo = [p for p in dict.fromkeys(prompts) if p not in scores]
        for prompt, reply in zip(todo, await self._ask_all(todo) if todo else [], strict=True):
            self.stats["asked"] += 1
            if reply is None:  # a failure: asked again next time
                self.stats["failures"] += 1
                scores[prompt] = None
                continue
            scores[prompt] = parse_score(reply, self.max_score)
            self.stats["unparsed"] += scores[prompt] is None
            self.cache[prompt] = scores[prompt]
            if len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
        fallbacks = [scores[p] is None for p in prompts]
        self.stats["fallbacks"] += sum(fallbacks)
        return [self.fallback if bad else scores[p] for p, bad in zip(prompts, fallbacks, strict=True)]


def make_judge(config, run_model: str) -> ModelJudge:
    """The judge a `JudgeConfig` describes: its endpoint when base_url is set, else a local model."""
    from toolrl.http import bearer_header, http_client
    from toolrl.tools.model import LocalChat, OpenAIChat

    template = config.template or DEFAULT_TEMPLATE
    try:
        template.format(**dict.fromkeys(FIELDS, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"env.judge.template: cannot fill it ({type(exc).__name__}: {exc}); use the fields {', '.join(FIELDS)} "
            "and double any other braces ({{ }})"
        ) from None
    common = {"template": template, "max_score": config.max_score, "fallback": config.fallback}
    if config.base_url:
        headers = bearer_header(config.api_key_env, "env.judge.api_key_env")
        client = http_client(headers, connect_timeout_s=10.0, read_timeout_s=config.timeout_s)
        chat = OpenAIChat(client, config.base_url, config.model or run_model, max_tokens=config.max_new_tokens)
        return ModelJudge(ask=chat, max_concurrency=config.max_concurrency, **common)
    local = LocalChat(config.model or run_model, max_tokens=config.max_new_tokens)
    return ModelJudge(ask_batch=local.batch, **common)
