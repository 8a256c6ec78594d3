"""A context strategy: what a trajectory does when its context fills up, as a small object with a method per event.

The rollout (rollout/loop.py) and the gateway make one strategy object per trajectory and tell it:
- `turn_added(view)`: a round is complete (a model turn and what answered it: tool results, the user's message);
- `over_budget(view)`: the next round does not fit the open segment's budget (`due(view)`: by default
  `view.room` < `view.need` + the strategy's `reserve`): return what the next segment starts from (a list of
  parts: `Carry` ids of the closing segment as they were, `Written` ids), or None (the trajectory stops, stop
  reason length);
- `call(view, call)`: a call of one of its own `tools()` (fold's branch and return), run instead of the
  environment's: a ToolResult to show the model, or None where it compacted the trajectory itself.

A strategy that asks the policy (summarize) does it with `view.ask(text, max_tokens)`: the request is written into
the open segment (not trained) and the policy's answer is sampled there and trained (kind summary).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from toolrl.envs.base import StepResult
from toolrl.errors import ConfigError
from toolrl.rollout.trajectory import MODEL, Part, Trajectory
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.validation import BoundedModel

if TYPE_CHECKING:
    from toolrl.envs.base import Environment, Task
    from toolrl.envs.reference import Turn


class ContextOptions(BoundedModel, BaseModel):
    """A strategy's own settings (`rollout.context.options`); each strategy subclasses it."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


@dataclass
class ContextView:
    """What a strategy sees of one trajectory and what it may do to it."""

    traj: Trajectory
    chat: Any
    """The run's ChatFormat: ids for the messages a strategy writes."""
    limit: int
    """The most tokens the open segment may hold: the least of rollout.max_context_tokens, its prompt and
    rollout.max_response_tokens (and, through the gateway, the model's context)."""
    need: int
    """Tokens the next round may take, which a compaction must leave room for: a turn's rollout.max_new_tokens and a
    result's max_observation_tokens in a rollout; a turn through the gateway (the agent's messages come with the next
    request, checked again)."""
    sample: Callable[[int], Awaitable[Any]]
    """Samples the policy's next turn after the open segment, at most this many tokens (a Sampled)."""
    ended: bool = True
    """Whether the last model turn ended with its end-of-turn token."""
    ahead: int = 0
    """Tokens the next round may add beyond `need` that no check sees coming (the gateway's: an agent's next messages,
    guessed from its last ones): compaction is due that much earlier; what it leaves need only hold `need`."""

    @property
    def room(self) -> int:
        """Tokens left in the open segment."""
        return self.limit - len(self.traj.token_ids)

    def rounds(self) -> list[tuple[int, int]]:
        """(start, end) of each round of the open segment: a model turn and what answered it, up to the next."""
        starts = [a for kind, a, _ in self.traj.spans if kind == MODEL]
        return list(zip(starts, [*starts[1:], len(self.traj.token_ids)], strict=True))

    def header(self) -> list[int]:
        """The ids the open segment ends with when the next assistant turn is due (its header), checked."""
        header = self.chat.generation_header
        if not header or self.traj.token_ids[-len(header) :] != header:
            raise ConfigError(
                "rollout.context: this chat template's prompt does not end with the header of the assistant's "
                "turn; use rollout.context.name none, or sliding_window without notes"
            )
        return header

    def before_header(self) -> int:
        """Where the open segment's prompt ends, less the assistant turn's header where it ends with one: where a
        message a strategy writes after the task goes (ending with the header again). A segment whose prompt a
        compaction carried that way has none to take off."""
        header, prompt = self.header(), self.traj.prompt_length
        return prompt - len(header) if self.traj.token_ids[prompt - len(header) : prompt] == header else prompt

    def message(self, role: str, text: str, ended: bool = True) -> tuple[int, ...]:
        """Ids of one message after an assistant turn (`ended`: that turn emitted its end-of-turn token), up to
        the next assistant turn's header."""
        return tuple(self.chat.continuation_ids([{"role": role, "content": text}], ended))

    async def ask(self, text: str, max_tokens: int) -> tuple[int, int]:
        """Write `text` as a user message into the open segment (not trained) and sample the policy's answer, at
        most `max_tokens` (trained, kind summary). Returns the answer's (start, end); `self.ended` says whether
        it ended its turn."""
        traj = self.traj
        traj.drop_tail(len(self.header()))  # the request goes where the next assistant turn would have begun
        traj.add_context(list(self.message("user", text)))
        sampled = await self.sample(max_tokens)
        start = len(traj.token_ids)
        text = self.chat.tokenizer.decode(sampled.ids, skip_special_tokens=True)
        traj.add_summary(sampled.ids, sampled.logprobs, text, sampled.versions)
        self.ended = sampled.ended
        return start, len(traj.token_ids)


class ContextStrategy:
    """The base strategy: nothing to do (the trajectory stops at its budget). Subclasses override the events."""

    name: ClassVar[str] = ""
    Options: ClassVar[type[ContextOptions]] = ContextOptions

    def __init__(self, options: ContextOptions):
        self.options = options

    def tools(self) -> list[Any]:
        """Tools it offers the policy (Tool objects, shown in the prompt) and runs itself (`call`)."""
        return []

    def script(self, turns: list[Turn], env: Environment, task: Task) -> list[Turn]:
        """How a scripted policy (the reference, rollout/scripted.py) plays `turns` under this strategy: the same
        turns by default; a strategy with tools of its own has it use them (fold: branches)."""
        return turns

    def reserve(self, view: ContextView) -> int:
        """Tokens of the open segment kept free for the strategy's own compaction (summarize's request and
        answer): the budget of rounds is the segment's limit less this."""
        return 0

    def due(self, view: ContextView) -> bool:
        """Whether to compact before the next round: by default when the round does not fit beside the reserve."""
        return view.room < view.need + view.ahead + self.reserve(view)

    def turn_added(self, view: ContextView) -> None:
        """A round is complete: the last model turn and what answered it are in the open segment."""

    async def over_budget(self, view: ContextView) -> list[Part] | None:
        """The next round does not fit: the next segment's parts, or None (the trajectory stops: length)."""
        return None

    async def before_round(self, view: ContextView, new_round: bool) -> bool:
        """What the rollout calls before each turn: `turn_added` after a new round, then `over_budget` when `due`,
        compacting the trajectory with the parts it returns. False: no room is left for a turn."""
        if new_round:
            self.turn_added(view)
        if self.due(view):
            parts = await self.over_budget(view)
            if parts is not None:
                view.traj.compact(parts, self.name)
        return view.room > 0

    async def run_calls(
        self, view: ContextView, calls: list[ToolCall], theirs: Callable[[list[ToolCall]], Awaitable[StepResult]]
    ) -> StepResult | None:
        """A turn's calls: the environment's through `theirs`, the strategy's own tools' through `call` (results in
        the calls' order); None where the strategy compacted the trajectory in the turn's place."""
        own = {tool.name for tool in self.tools()}
        if not any(c.name in own for c in calls):
            return await theirs(calls)
        rest = [c for c in calls if c.name not in own]
        step = await theirs(rest) if rest else StepResult(info={"context": self.name})
        answered = iter(step.observations)
        results = []
        for c in calls:
            if c.name not in own:
                results.append(next(answered))
                continue
            result = await self.call(view, c, alone=len(calls) == 1)
            if result is None:
                return None
            results.append(result)
        step.observations = results
        return step

    async def call(self, view: ContextView, call: ToolCall, alone: bool) -> ToolResult | None:
        """A call of one of its tools (`alone`: the only call of its turn); a result to show, or None where the
        strategy compacted the trajectory in its place."""
        raise NotImplementedError(f"context strategy {self.name} offers no tools")
