"""Who plays the other seat when it is not the policy: a seeded random mover, perfect play, or a model (a frozen
copy of the policy, another model, an endpoint) shown the same prompt and transcript as the policy would be in
that seat, its move read with the run's call syntax. A model that gives no legal move in `tries` samples forfeits
(counted)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Literal

from pydantic import Field

from toolrl.envs.nim.game import Table, best_move, move_error, random_move
from toolrl.parsers.base import CallSyntax
from toolrl.tools.model import Batcher, Completion, ModelBackend, chat_backend


class OpponentModel(ModelBackend):
    """A model in the other seat (`env.options.opponent` or `eval_opponent`: {path: ...} or {base_url, model})."""

    max_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, ge=0)
    tries: int = Field(3, ge=1, le=10)
    """Samples it gets to make a legal move before it forfeits."""


OpponentSpec = Literal["self", "random", "best"] | OpponentModel


class Opponent:
    """Moves for one seat of one table (a new one per episode); `move` returns None when it gives up."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.failures = 0
        """Samples that gave no legal move (a model opponent)."""

    async def move(self, table: Table, messages: list[dict[str, str]]) -> int | None:
        raise NotImplementedError


class RandomOpponent(Opponent):
    async def move(self, table: Table, messages: list[dict[str, str]]) -> int | None:
        return random_move(table.pile, table.most, self.rng)


class BestOpponent(Opponent):
    async def move(self, table: Table, messages: list[dict[str, str]]) -> int | None:
        return best_move(table.pile, table.most)


class ModelOpponent(Opponent):
    def __init__(self, seed: int, ask: Callable[..., Awaitable[Completion]], spec: OpponentModel, syntax: CallSyntax):
        super().__init__(seed)
        self.ask, self.spec, self.syntax = ask, spec, syntax
        self.said: list[str] = []
        """What it wrote for each of its moves (its transcript's assistant turns)."""

    async def move(self, table: Table, messages: list[dict[str, str]]) -> int | None:
        for _ in range(self.spec.tries):
            seed = self.rng.randrange(2**31)
            text = (await self.ask(messages, seed)).text
            calls = [c for c in self.syntax(text, {"take": ["n"]}).calls if c.name == "take"]
            n = calls[0].arguments.get("n") if calls else None
            if move_error(table.pile, table.most, n) is None:
                self.said.append(text)
                return n
            self.failures += 1
        return None


FIXED: dict[str, type[Opponent]] = {"random": RandomOpponent, "best": BestOpponent}


class Opponents:
    """Makes the opponent of an episode from its spec; a model is loaded once and shared: a local one answers the
    opponents that ask together in one batch."""

    def __init__(self, syntax: CallSyntax):
        self.syntax = syntax
        self._asks: dict[str, Callable[..., Awaitable[Completion]]] = {}

    def make(self, spec: OpponentSpec, seed: int, where: str) -> Opponent | None:
        if isinstance(spec, str):
            return FIXED[spec](seed) if spec in FIXED else None  # "self": the other seat is an episode of the run
        key = spec.model_dump_json()
        if key not in self._asks:
            model = chat_backend(spec, where)[0]
            batched = hasattr(model, "complete_batch")
            self._asks[key] = Batcher(model.complete_batch).ask if batched else _threaded(model.complete)
        return ModelOpponent(seed, self._asks[key], spec, self.syntax)


def _threaded(complete: Callable[..., Completion]) -> Callable[..., Awaitable[Completion]]:
    async def ask(messages: list[dict[str, str]], seed: int | None = None) -> Completion:
        return await asyncio.to_thread(complete, messages, seed=seed)

    return ask
