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
from toolrl.text import clip, first_line

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
        fields: dict[str, Any] = {
            "question": task.question,
            "answer": task.answer,
            "response": trajectory_reply(trajectory),
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


DEFAULT_GROUP_TEMPLATE = """You compare {n} attempts by an assistant at the same task and score each against the others.
Question: {question}
Reference answer: {answer}

{attempts}

Score every attempt from 0 (worst) to {max_score} (best), the better attempts higher. Answer with one line per
attempt, "Attempt K: N", for K from 1 to {n}."""

GROUP_FIELDS = ("question", "answer", "attempts", "n", "max_score")
_ATTEMPT = re.compile(r"attempt\s*#?(\d+)\s*[:=-]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_group_scores(reply: str, n: int, max_score: float) -> list[float] | None:
    """The reply's score of each of `n` attempts in [0, 1] ("Attempt K: N" lines); None unless every attempt has
    exactly one score in 0..max_score and no attempt outside 1..n is scored."""
    found: dict[int, list[float]] = {}
    for number, value in _ATTEMPT.findall(reply):
        found.setdefault(int(number), []).append(float(value))
    if set(found) != set(range(1, n + 1)) or any(len(v) != 1 for v in found.values()):
        return None
    scores = [found[k][0] for k in range(1, n + 1)]
    return [v / max_score for v in scores] if all(0 <= v <= max_score for v in scores) else None


class GroupJudge(ModelJudge):
    """A judge that ranks a group at once (ART's RULER): the trajectories of one task in a batch (a training
    group, an evaluation's trials) go to the judge in one prompt, each scored against the others. A group whose
    reply does not score every attempt in range is a judge failure: its trajectories get `fallback` and an
    `env_fault` naming it, so that training leaves them out of the loss (train.infra_faults: mask) and no
    judged reward is made up; counted as judge/group_failures. A group of one is scored alone in the same way."""

    def __init__(self, *args, max_attempt_chars: int = 2000, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_attempt_chars = max_attempt_chars

    def group_prompt(self, group: Sequence[Any]) -> str:
        task = group[0].task
        attempts = []
        for k, traj in enumerate(group, 1):
            text = "\n\n".join(traj.texts) or trajectory_reply(traj)
            # a policy that writes the judge's answer format ("Attempt 2: 10") into its own text is not shown it
            text, removed = _ATTEMPT.subn("[a score line the attempt wrote, removed]", text)
            self.stats["score_lines_removed"] += removed
            attempts.append(f"Attempt {k}:\n{clip(text, self.max_attempt_chars)}")
        return self.template.format(question=task.question, answer=task.answer, attempts="\n\n".join(attempts),
                                    n=len(group), max_score=f"{self.max_score:g}")  # fmt: skip

    async def score_batch(self, trajectories: Sequence[Any]) -> list[float]:
        groups: dict[str, list[int]] = {}
        for i, traj in enumerate(trajectories):
            groups.setdefault(traj.task.id, []).append(i)
        prompts = {key: self.group_prompt([trajectories[i] for i in members]) for key, members in groups.items()}
        todo = [p for p in dict.fromkeys(prompts.values()) if p not in self.cache]
        self.stats["cache_hits"] += len(prompts) - len(todo)
        replies = dict(zip(todo, await self._ask_all(todo) if todo else [], strict=True))
        out = [self.fallback] * len(trajectories)
        for key, members in groups.items():
            prompt = prompts[key]
            if prompt in self.cache:
                scores = self.cache[prompt]
            else:
                self.stats["asked"] += 1
                reply = replies[prompt]
                self.stats["failures"] += reply is None
                scores = parse_group_scores(reply, len(members), self.max_score) if reply is not None else None
                if reply is not None:
                    self.stats["unparsed"] += scores is None
                    self.cache[prompt] = scores
                    if len(self.cache) > self.cache_size:
                        self.cache.popitem(last=False)
            if scores is None:
                self.stats["group_failures"] += 1
                self.stats["fallbacks"] += len(members)
                why = "no reply" if replies.get(prompt, "") is None else "no score in range for every attempt"
                for i in members:
                    trajectories[i].env_fault = f"judge: the group judge gave {why} for this task's group"
                continue
            for i, score in zip(members, scores, strict=True):
                out[i] = score
        return out


def trajectory_reply(trajectory) -> str:
    response = final_answer(trajectory.final_text)
    return response if response is not None else trajectory.final_text


def make_judge(config, run_model: str) -> ModelJudge:
    """The judge a `JudgeConfig` describes: its endpoint when base_url is set, else a local model; with
    `mode: group`, one that ranks each group at once."""
    from toolrl.http import bearer_header, http_client
    from toolrl.tools.model import LocalChat, OpenAIChat

    group = config.mode == "group"
    template = config.template or (DEFAULT_GROUP_TEMPLATE if group else DEFAULT_TEMPLATE)
    fields = GROUP_FIELDS if group else FIELDS
    try:
        template.format(**dict.fromkeys(fields, ""))
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"env.judge.template: cannot fill it ({type(exc).__name__}: {exc}); use the fields {', '.join(fields)} "
            "and double any other braces ({{ }})"
        ) from None
    if group and "{attempts}" not in template:
        raise ConfigError("env.judge.template: a group judge's template needs {attempts} (the group's trajectories)")
    common = {"template": template, "max_score": config.max_score, "fallback": config.fallback}
    kind = GroupJudge if group else ModelJudge
    if config.base_url:
        headers = bearer_header(config.api_key_env, "env.judge.api_key_env")
        client = http_client(headers, connect_timeout_s=10.0, read_timeout_s=config.timeout_s)
        chat = OpenAIChat(client, config.base_url, config.model or run_model, max_tokens=config.max_new_tokens)
        return kind(ask=chat, max_concurrency=config.max_concurrency, **common)
    local = LocalChat(config.model or run_model, max_tokens=config.max_new_tokens)
    return kind(ask_batch=local.batch, **common)
