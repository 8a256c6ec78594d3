"""The `nim` environment: two-player Nim played with a `take(n)` tool, for self-play.

With `opponent: self` (the default) the episodes of a task are seated in pairs as they start: the first of a pair
moves first (role `first`), the second answers (role `second`), both are the policy, and each seat is a trajectory
of its own trained on its own result (win 1, loss 0) with advantages taken among the group's trajectories of its
role. A seat's observation after its move carries the other seat's answer, so each waits for the other (this needs
rollout.schedule async, the default); a seat whose trajectory ends (no move, out of turns) forfeits. An episode left
without a partner (an odd number of a task's samples) plays `unpaired` (counted: nim/unpaired).

With a fixed opponent (`random`, `best`, or a model: `{path: ...}`, such as the policy's own step-0 checkpoint), the
policy takes the task's seat and the environment moves for the other. The test split (`num_test` games, both seats
over every pile) plays `eval_opponent`. The reference plays perfectly and is given on the games it wins whatever
its opponent does (the others have no reference); a fixed opponent is seeded by the task, so the reference
knows its answers.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from toolrl.envs.base import Environment, EnvOptions, Episode, StepResult, Task, register_env
from toolrl.envs.nim.game import Table, best_move, move_error, winnable
from toolrl.envs.nim.opponents import Opponent, OpponentModel, Opponents, OpponentSpec
from toolrl.envs.reference import ReferenceRequest
from toolrl.errors import ConfigError
from toolrl.rewards.rubric import Criterion, Rubric
from toolrl.tools.call import ToolCall
from toolrl.tools.function import tool_from_function
from toolrl.tools.limits import InvalidArguments

SEATS = ("first", "second")
SYSTEM = (
    "You play Nim against an opponent. There is a pile of stones; the players take turns, and each turn a player "
    "takes 1 to {most} stones with the take tool. Whoever takes the last stone wins. Make exactly one move per turn, "
    "as a call of take with n, the number of stones you take; taking 2 is written:\n{example}"
)


class NimOptions(EnvOptions):
    min_stones: int = Field(5, ge=1)
    max_stones: int = Field(15, ge=1, le=1000)
    most: int = Field(3, ge=1, le=100)
    """The most stones one move may take."""
    opponent: OpponentSpec = "self"
    """Who plays the other seat in the train split: self (the policy, each seat a trajectory), random, best, or a
    model ({path: ...} or {base_url, model})."""
    eval_opponent: Literal["random", "best"] | OpponentModel = "random"
    """Who plays the other seat in the test split."""
    unpaired: Literal["random", "best"] = "random"
    """Who plays an episode that found no partner under opponent: self."""
    num_test: int = Field(200, ge=1)
    in_context: bool = True
    """Show one short game (two moves and a win) before the game, as a worked example."""
    played_weight: float = Field(0.25, ge=0)
    """Weight of `played` (the seat did not give its game up), beside `win` (1): the
    base model often answers in words, which gives the game up at once; this tells playing on from that."""
    nudges: int = Field(2, ge=0)
    """Turns in a row a seat may answer in words (no move) before it gives its game up; each is answered with a
    reminder to move (the base model often answers in words at first: a game given up at once teaches nothing)."""
    wait_s: float = Field(600.0, gt=0)
    """How long a seat waits for the other seat's move before the run stops with an error."""

    @model_validator(mode="after")
    def _piles(self) -> NimOptions:
        if self.min_stones > self.max_stones:
            raise ValueError("min_stones must be at most max_stones")
        return self


def seat_message(table: Table, seat: int, since: int, upto: int | None = None, opening: bool = False) -> str:
    """What `seat` is told of moves `since` to `upto` (None: the last), then the end or that it is its move."""
    upto = len(table.moves) if upto is None else upto
    pile = table.start - sum(n for _, n in table.moves[:since])
    lines = [f"New game: {pile} stones. You move {SEATS[seat]}."] if opening else []
    for who, n in table.moves[since:upto]:
        pile -= n
        lines.append(f"{'You' if who == seat else 'Your opponent'} took {n}, leaving {pile}.")
    if upto == len(table.moves) and table.over:
        won = "you win" if table.winner == seat else "you lose"
        lines.append(f"{'The last stone was taken' if table.how == 'last stone' else 'A player gave up'}: {won}.")
    elif upto < len(table.moves) or table.to_move == seat:
        lines.append("Your move.")
    return " ".join(lines)


class NimEpisode(Episode):
    def __init__(self, env: NimEnv, task: Task, table: Table, seat: int, opponent: Opponent | None):
        take = tool_from_function(self._take, name="take", isolation="inline")
        super().__init__(task, env.preamble(), [take], offered=["take"])
        self.env, self.table, self.seat, self.opponent = env, table, seat, opponent
        self.role = SEATS[seat]
        self.seen = 0
        """Moves this seat has been told of."""
        self.words = 0
        """Turns in a row this seat answered without a move."""

    async def _take(self, n: int) -> str:
        """Take n stones from the pile (1 to the most a move may take, and at most what is left)."""
        table = self.table
        if table.over:
            raise InvalidArguments("the game is over")
        if table.to_move != self.seat:
            raise InvalidArguments("it is not your turn: one move per turn")
        if error := move_error(table.pile, table.most, n):
            raise InvalidArguments(f"invalid argument: n: {error}")
        table.move(self.seat, n)
        return ""

    async def _other_moves(self) -> None:
        """Until the other seat has moved (or the game is over)."""
        table, other = self.table, 1 - self.seat
        if self.opponent is None:
            try:
                await table.wait_turn(self.seat, self.env.options.wait_s)
            except TimeoutError:
                raise ConfigError(
                    f"env nim: a seat waited env.options.wait_s ({self.env.options.wait_s:g} s) for the other seat's "
                    "move; self-play needs rollout.schedule: async and both seats in one rollout"
                ) from None
            return
        view = self.env.opponent_view(table, other, self.opponent)
        n = None if table.over else await self.opponent.move(table, view)
        if table.over:
            return
        if n is None:
            self.env.counts["opponent_gave_up"] += 1
            table.forfeit(other)
        else:
            table.move(other, n)

    async def open(self) -> StepResult:
        if self.seat == 1:
            await self._other_moves()
        message, self.seen = seat_message(self.table, self.seat, 0, opening=True), len(self.table.moves)
        return StepResult(user_message=message, done=self.table.over)

    async def step(self, calls, executor) -> StepResult:
        moved, self.words = len(self.table.moves), 0
        result = await super().step(calls, executor)
        if len(self.table.moves) > moved:  # this seat moved: the answer comes back with its move
            if not self.table.over:
                await self._other_moves()
            last = max(i for i, r in enumerate(result.observations) if r.outcome == "ok")
            told = seat_message(self.table, self.seat, self.seen)
            result.observations[last] = dataclasses.replace(result.observations[last], content=told)
            self.seen = len(self.table.moves)
        result.done = self.table.over
        result.info = {"pile": self.table.pile, "moves": len(self.table.moves)}
        return result

    async def reply(self, text: str) -> StepResult:
        """A turn without a move: a reminder, `nudges` times in a row; then the seat gives its game up."""
        self.words += 1
        if self.words > self.env.options.nudges:
            self.table.forfeit(self.seat)
            return StepResult(done=True, info={"forfeit": True})
        pile = self.table.pile
        return StepResult(user_message=f"Your move: {pile} stones are left; take 1 to {min(self.table.most, pile)}.")

    def finish(self, stop_reason: str) -> None:
        self.table.forfeit(self.seat)  # no-op once the game is over

    def won(self) -> bool:
        return self.table.winner == self.seat


def win(trajectory, task: Task) -> float:
    episode = trajectory.episode
    return float(isinstance(episode, NimEpisode) and episode.won())


def _played(trajectory, task: Task) -> float:
    """The seat did not give its game up (it played to the last stone, whoever took it, or its opponent gave up)."""
    episode = trajectory.episode
    return float(isinstance(episode, NimEpisode) and (episode.table.how == "last stone" or episode.won()))


@register_env("nim")
class NimEnv(Environment):
    name = "nim"
    Options = NimOptions
    show_tool_schemas = False
    """The system prompt says how to call take, so that a model opponent (shown messages, not schemas) sees what
    the policy sees."""
    rollout_defaults: ClassVar[dict[str, Any]] = {"max_turns": 12, "max_new_tokens": 48}

    def __init__(self, config, options: NimOptions):
        super().__init__(config, options)
        played = Criterion("played", _played, options.played_weight)
        self.counts = {"unpaired": 0, "opponent_gave_up": 0}
        """Episodes that found no partner; games a fixed opponent gave up (no legal move in its tries): metrics
        nim/unpaired, nim/opponent_gave_up."""
        self.rubric = Rubric([Criterion("win", win, 1.0), played], success="win", counted={"nim": self.counts})
        self.opponents = Opponents(self.syntax)
        self.waiting: dict[str, Table] = {}
        """Self-play tables with one seat taken, by task id."""

    def tasks(self, split: str) -> list[Task]:
        o = self.options
        piles = range(o.min_stones, o.max_stones + 1)
        if split == "train":
            seats = (None,) if o.opponent == "self" else (0, 1)
            return [self._task(f"nim-{p}" + ("" if s is None else f"-{SEATS[s]}"), p, s) for p in piles for s in seats]
        games = [(p, s) for p in piles for s in (0, 1)]
        return [self._task(f"nim-test-{i}", *games[i % len(games)], test=True) for i in range(o.num_test)]

    @staticmethod
    def _task(task_id: str, pile: int, seat: int | None, test: bool = False) -> Task:
        where = "" if seat is None else f", moving {SEATS[seat]}"
        return Task(task_id, f"Nim: {pile} stones{where}.", "win", {"pile": pile, "seat": seat, "test": test})

    def preamble(self) -> list[dict[str, str]]:
        """The system prompt and, with in_context, one short game won by perfect play."""
        example = self.syntax.render([ToolCall("take", {"n": 2})])
        messages = [{"role": "system", "content": SYSTEM.format(most=self.options.most, example=example)}]
        if self.options.in_context:
            game = Table(6, 3)
            messages.append({"role": "user", "content": seat_message(game, 0, 0, opening=True)})
            for mine, theirs in ((2, 1), (3, None)):
                seen = len(game.moves)
                game.move(0, mine)
                if theirs:
                    game.move(1, theirs)
                messages.append({"role": "assistant", "content": self.syntax.render([ToolCall("take", {"n": mine})])})
                messages.append({"role": "tool", "content": seat_message(game, 0, seen)})
        return messages

    def messages(self, task: Task) -> list[dict[str, str]]:
        return [*self.preamble(), {"role": "user", "content": f"New game: {task.meta['pile']} stones."}]

    def _opponent_seed(self, task: Task) -> int:
        return zlib.crc32(task.id.encode())

    def reset(self, task: Task, seed: int | None = None) -> NimEpisode:
        o, pile = self.options, task.meta["pile"]
        spec = o.eval_opponent if task.meta["test"] else o.opponent
        where = "env.options." + ("eval_opponent" if task.meta["test"] else "opponent")
        if spec != "self":
            table = Table(pile, o.most)
            opponent = self.opponents.make(spec, self._opponent_seed(task), where)
            return NimEpisode(self, task, table, task.meta["seat"], opponent)
        if (table := self.waiting.pop(task.id, None)) is not None:
            table.seated = 2
            return NimEpisode(self, task, table, 1, None)
        self.waiting[task.id] = table = Table(pile, o.most)
        return _FirstSeat(self, task, table, 0, None)

    def opponent_view(self, table: Table, seat: int, opponent: Opponent) -> list[dict[str, str]]:
        """The prompt and transcript the other seat's model is shown: the policy's in its place (its own calls as
        it wrote them, each answered as a take call is)."""
        said = getattr(opponent, "said", [])
        mine = [k for k, (who, _) in enumerate(table.moves) if who == seat]
        ends = [*mine, len(table.moves)]
        messages = [*self.preamble(), {"role": "user", "content": seat_message(table, seat, 0, ends[0], opening=True)}]
        for j, k in enumerate(mine):
            messages.append({"role": "assistant", "content": said[j] if j < len(said) else ""})
            messages.append({"role": "tool", "content": seat_message(table, seat, k, ends[j + 1])})
        return messages

    def reference(self, task: Task) -> list[ReferenceRequest] | None:
        """Perfect play on a game it wins against any opponent, answered as this task's seeded opponent answers."""
        o, pile, seat = self.options, task.meta["pile"], task.meta["seat"]
        spec = o.eval_opponent if task.meta["test"] else o.opponent
        if seat is None or not isinstance(spec, str) or not winnable(pile, o.most, seat):
            return None
        rng, rounds = random.Random(self._opponent_seed(task)), []
        mover = 0
        while pile:
            if mover == seat:
                n = best_move(pile, o.most)
                rounds.append((ToolCall("take", {"n": n}),))
            else:
                n = best_move(pile, o.most) if spec == "best" else rng.randint(1, min(o.most, pile))
            pile, mover = pile - n, 1 - mover
        return [ReferenceRequest(tuple(rounds))]

    def close(self) -> None:
        self.waiting.clear()


class _FirstSeat(NimEpisode):
    """Seat 0 of a self-play table: at its opening, a table still without a second seat gets the `unpaired`
    opponent (every episode of a rollout is reset before any opens)."""

    async def open(self) -> StepResult:
        if self.env.waiting.get(self.task.id) is self.table:
            del self.env.waiting[self.task.id]
            self.env.counts["unpaired"] += 1
            self.opponent = self.env.opponents.make(self.env.options.unpaired, self.env._opponent_seed(self.task), "")
        return await super().open()
