"""fold: context folding (FoldGRPO). The policy opens a branch for a sub-task (`branch`), works on it in the same
context, and folds it back with a short return value (`return`): the branch's segment closes, and the next one
starts from everything before the branch call, then the return value as that call's result. The two segments share
that whole prefix (training computes it once: toolrl/scoring), and the return turn is trained as a summary
(train.summary_weight). A branch that runs out of context is folded back with a note saying so."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from toolrl.context.base import ContextOptions, ContextStrategy, ContextView
from toolrl.context.registry import register_context
from toolrl.envs.reference import Said
from toolrl.rollout.trajectory import Carry, Part, Written
from toolrl.text import clip
from toolrl.tools.call import ToolCall, ToolResult
from toolrl.tools.function import tool_from_function

if TYPE_CHECKING:
    from toolrl.envs.base import Environment, Task
    from toolrl.envs.reference import Turn

BRANCH, RETURN = "branch", "return"
OPENED = (
    "Branch opened for: {description}. Work on it here; when it is done, call return with a short message: it is "
    "all that your main context keeps of this branch."
)
RETURNED = "Branch returned: {message}"
CUT = "The branch ran out of context before it returned."
SCRIPTED_ROUNDS = 3
"""A scripted policy's (the reference's) rounds of calls per branch."""


class FoldOptions(ContextOptions):
    max_return_chars: int = Field(400, ge=1, le=20000)
    """A return value is cut to this many characters in the main context."""


def _not_run(**_: Any) -> str:
    raise RuntimeError("fold's tools are run by the context strategy, never by the executor")


TOOLS = [
    tool_from_function(_not_run, BRANCH, description="Open a branch for a sub-task: its work stays out of your main "
                       "context, which keeps only the message the branch returns.",
                       parameters={"type": "object", "properties": {"description": {
                           "type": "string", "description": "The sub-task."}}, "required": ["description"]}),
    tool_from_function(_not_run, RETURN, description="Close the open branch with a short message for the main context.",
                       parameters={"type": "object", "properties": {"message": {
                           "type": "string", "description": "What the branch found."}}, "required": ["message"]}),
]  # fmt: skip


@register_context("fold", options=FoldOptions)
class Fold(ContextStrategy):
    name = "fold"
    Options = FoldOptions
    options: FoldOptions

    def __init__(self, options: FoldOptions):
        super().__init__(options)
        self.at: int | None = None
        """Where the open branch's call turn ends in the open segment (None: no branch open)."""
        self.ended = True
        """Whether that turn emitted its end-of-turn token."""

    def tools(self) -> list[Any]:
        return TOOLS

    async def call(self, view: ContextView, call: ToolCall, alone: bool) -> ToolResult | None:
        def refused(why: str) -> ToolResult:
            return ToolResult(call, why, "tool_error")

        if not alone:
            return refused(f"{call.name} must be the only call of its turn")
        if call.name == BRANCH:
            if self.at is not None:
                return refused("a branch is open already: call return first")
            self.at, self.ended = len(view.traj.token_ids), view.ended
            return ToolResult(call, OPENED.format(description=clip(str(call.arguments.get("description", "")), 400)))
        if self.at is None:
            return refused("no branch is open: call branch first")
        view.traj.relabel_last_turn()  # the return value is the branch's summary
        message = clip(str(call.arguments.get("message", "")), self.options.max_return_chars)
        view.traj.compact(self._fold(view, RETURNED.format(message=message)), self.name)
        view.traj.results.append(ToolResult(call, message))
        return None

    def _fold(self, view: ContextView, content: str) -> list[Part]:
        at, self.at = self.at, None
        assert at is not None
        return [Carry(0, at), Written(tuple(view.chat.observation_ids([content], model_ended_turn=self.ended)))]

    async def over_budget(self, view: ContextView) -> list[Part] | None:
        """A branch that fills the context is folded back with a note; the main context stops (length)."""
        return self._fold(view, CUT) if self.at is not None else None

    def script(self, turns: list[Turn], env: Environment, task: Task) -> list[Turn]:
        """A scripted policy folds its rounds of calls: every SCRIPTED_ROUNDS of them in a branch, which returns
        the environment's reference summary of the rounds done (Environment.reference_summary). A script that
        branches on its own is played as written."""
        if any(c.name == BRANCH for turn in turns for c in _calls(turn)):
            return turns
        out: list[Turn] = []
        done = opened = 0

        def close() -> None:
            message = env.reference_summary(task, done) or f"{done} rounds of calls done."
            out.append((ToolCall(RETURN, {"message": message}),))

        for turn in turns:
            calls = bool(_calls(turn))
            if opened and (not calls or opened == SCRIPTED_ROUNDS):
                close()
                opened = 0
            if calls:
                if not opened:
                    out.append((ToolCall(BRANCH, {"description": f"the next {SCRIPTED_ROUNDS} rounds of calls"}),))
                opened, done = opened + 1, done + 1
            out.append(turn)
        if opened:
            close()
        return out


def _calls(turn: Turn) -> tuple[ToolCall, ...]:
    return turn if isinstance(turn, tuple) else turn.calls if isinstance(turn, Said) else ()
