"""A rollout's limits and the small named rules that say whether (and why) a trajectory stops at a point."""

from __future__ import annotations

from dataclasses import dataclass, field

from toolrl.envs.base import final_answer
from toolrl.rollout.sampling import SamplingParams
from toolrl.rollout.trajectory import Trajectory

STOP_REASONS = (
    "answer", "no_tool_call", "max_turns", "length", "tool_error", "env_done", "user_ended", "user_failed",
    "agent_done", "agent_failed",
)  # fmt: skip


ROUND_FRAMING = 32
"""Tokens a round may take beyond its turn and result budgets (the template's framing of the result)."""


@dataclass
class RolloutLimits:
    max_turns: int
    """Model turns per trajectory, over all of its user requests."""
    max_new_tokens: int
    """Per model turn."""
    max_response_tokens: int
    """Per trajectory after its prompt: generated, observation and user tokens."""
    max_observation_tokens: int
    """Per tool result."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_on_tool_error: bool = False
    """End a trajectory (stop reason tool_error) when a tool call fails, instead of showing the model the error."""
    last_turn_tools: bool = False
    """Run the calls of the last allowed turn too (their results end the trajectory, masked out of the loss):
    for rewards that look at the final tool result, such as the rows a final SQL query returns."""
    max_images: int = 16
    """Images per trajectory a vision-language policy is shown; further ones are named in text."""
    max_image_tokens: int = 8192
    """Image tokens per trajectory (the task's images and the tools'); images past it are named in text."""
    max_calls_per_turn: int = 16
    """Calls run from one model turn (ParseResult.within): the rest are reported to the model and counted."""
    max_context_tokens: int | None = None
    """Tokens one segment holds at most, its prompt included (None: max_response_tokens alone bounds it)."""

    def round_tokens(self) -> int:
        """The most tokens a round (a turn and its results) may add: what a segment keeps room for."""
        return self.max_new_tokens + self.max_observation_tokens + ROUND_FRAMING

    def segment_limit(self, traj: Trajectory) -> int:
        """The most tokens the trajectory's open segment may hold."""
        limit = traj.prompt_length + self.max_response_tokens
        return limit if self.max_context_tokens is None else min(limit, self.max_context_tokens)


# ---- stop rules: each says whether (and why) a trajectory ends at this point -------------------------------


def over_token_budget(traj: Trajectory, limits: RolloutLimits, extra: int = 0) -> bool:
    """The trajectory's response (plus `extra` tokens about to be fed) reached max_response_tokens, or its open
    segment max_context_tokens."""
    if limits.max_context_tokens is not None and len(traj.token_ids) + extra >= limits.max_context_tokens:
        return True
    return traj.response_length + extra >= limits.max_response_tokens


def out_of_turns(traj: Trajectory, limits: RolloutLimits) -> bool:
    """The trajectory has had its max_turns model turns."""
    return traj.num_turns >= limits.max_turns


def answer_reason(text: str) -> str:
    """Why a turn without tool calls ended the trajectory: a final <answer>, or none."""
    return "answer" if final_answer(text) is not None else "no_tool_call"


def limits_hit(traj: Trajectory, rollout, observations_cut: int = 0) -> list[str]:
    """The rollout limits that cut `traj`, as its config names them with their values ('rollout.max_turns 2'):
    the turn limit or the token budget that ended it, max_new_tokens where its last turn was cut, and
    max_observation_tokens where `observations_cut` of its tool results were (tools/observation.py `clipped`).
    `rollout`: the run's rollout section (config.rollout)."""
    hit = ["max_turns"] if traj.stop_reason == "max_turns" else []
    if traj.stop_reason == "length":  # a token budget: the segment's context, else the response's
        roomy = traj.response_length < rollout.max_response_tokens - rollout.max_new_tokens - ROUND_FRAMING
        hit.append("max_context_tokens" if rollout.max_context_tokens is not None and roomy else "max_response_tokens")
    elif traj.truncated:
        hit.append("max_new_tokens")
    if observations_cut:
        hit.append("max_observation_tokens")
    return [f"rollout.{name} {getattr(rollout, name)}" for name in hit]
