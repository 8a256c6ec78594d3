"""Nim, the subtraction game: a pile of stones; a move takes 1 to `most` of them; who takes the last stone wins.
The player to move loses against perfect play exactly when the pile is a multiple of most + 1.

A `Table` is one game between two seats (seat 0 moves first). Each seat is an episode of the run (self-play: the
policy plays both, each seat its own trajectory) or a fixed opponent the environment moves for. A seat waits for
its turn (`wait_turn`: the other moved, or the game ended), moves, and so wakes the other; a seat whose trajectory
ends before the game does forfeits it, so the other never waits for nothing."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field


def move_error(pile: int, most: int, n: object) -> str | None:
    """Why taking `n` is not a legal move (None: it is)."""
    if not isinstance(n, int) or isinstance(n, bool):
        return f"n must be a whole number from 1 to {min(most, pile)}"
    if not 1 <= n <= min(most, pile):
        return f"you may take 1 to {min(most, pile)} stones ({pile} left), not {n}"
    return None


def best_move(pile: int, most: int) -> int:
    """Perfect play: leave a multiple of most + 1; from a lost position, take one and hope."""
    return pile % (most + 1) or 1


def random_move(pile: int, most: int, rng: random.Random) -> int:
    return rng.randint(1, min(most, pile))


def winnable(pile: int, most: int, seat: int) -> bool:
    """Whether the player in `seat` wins against any opponent by perfect play."""
    return (pile % (most + 1) != 0) == (seat == 0)


@dataclass
class Table:
    pile: int
    most: int
    start: int = 0
    """The pile before the first move."""
    to_move: int = 0
    winner: int | None = None
    how: str = ""
    """How it ended: 'last stone' or 'forfeit'."""
    moves: list[tuple[int, int]] = field(default_factory=list)
    """(seat, stones taken), in order."""
    seated: int = 1
    """Episodes of the run at this table (2 in self-play; 1 against a fixed opponent)."""
    _turn: tuple[asyncio.Event, asyncio.Event] = field(default_factory=lambda: (asyncio.Event(), asyncio.Event()))

    def __post_init__(self) -> None:
        self.start = self.pile

    @property
    def over(self) -> bool:
        return self.winner is not None

    def move(self, seat: int, n: int) -> None:
        """`seat` takes `n` (legal, on its turn): the other seat's turn comes, or the game ends."""
        assert seat == self.to_move and not self.over and move_error(self.pile, self.most, n) is None
        self.pile -= n
        self.moves.append((seat, n))
        if self.pile == 0:
            self._end(seat, "last stone")
        else:
            self.to_move = 1 - seat
            self._turn[self.to_move].set()

    def forfeit(self, seat: int) -> None:
        """`seat` stopped playing before the game ended: the other seat wins."""
        if not self.over:
            self._end(1 - seat, "forfeit")

    def _end(self, winner: int, how: str) -> None:
        self.winner, self.how = winner, how
        for event in self._turn:
            event.set()

    async def wait_turn(self, seat: int, timeout_s: float) -> None:
        """Until it is `seat`'s turn or the game is over; TimeoutError past `timeout_s`."""
        await asyncio.wait_for(self._turn[seat].wait(), timeout_s)
        if not self.over:
            self._turn[seat].clear()
